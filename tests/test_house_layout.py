"""The house checks read the project's files only (issue 22 item 9): in a copy of the checkout that holds what the
README's layout and everyday work put there -- a ``.venv`` with another package's big5-encoded file and a module
that registers torch hooks, a ``venv`` (not git-ignored), ``build/`` and ``runs/`` with hook-registering files --
tests/test_house.py still passes, from a git checkout (``git ls-files``) and from a plain folder (the walk).
The same files break a scan of every ``*.py`` under the root, which is what the checks did before."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_house import ROOT, project_files

BIG5 = "# 繁體中文的註解\nNAME = '測試'\n".encode("big5")
HOOKS = "def attach(module, fn):\n    return module.register_forward_hook(fn)\n"
JUNK = {".venv/lib/python3.11/site-packages/otherpkg/big5_module.py": BIG5,
        ".venv/lib/python3.11/site-packages/otherpkg/hooks.py": HOOKS.encode(),
        ".venv/pyvenv.cfg": b"home = /usr/bin\n",
        "venv/lib/python3.11/site-packages/otherpkg/big5_module.py": BIG5,
        "venv/pyvenv.cfg": b"home = /usr/bin\n",
        "build/lib/headprune/model/stale_copy.py": HOOKS.encode(),
        "runs/notebook_export.py": HOOKS.encode()}


def copy_with_junk(tmp_path: Path, git: bool) -> Path:
    """The project's files copied to ``tmp_path/checkout`` plus ``JUNK``; ``git``: a git index of everything git
    does not ignore (``git add -A``), as in a clone someone worked in."""
    root = tmp_path / "checkout"
    for path in project_files(ROOT, suffix=""):
        target = root / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    for name, content in JUNK.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(content)
    if git:
        for command in (["git", "init", "-q"], ["git", "add", "-A"]):
            subprocess.run(command, cwd=root, check=True, capture_output=True, timeout=120)
    return root


@pytest.mark.parametrize("git", [True, False], ids=["git checkout", "no git"])
def test_house_checks_pass_with_a_virtualenv_and_build_folders_in_the_checkout(tmp_path, git):
    if git and shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = copy_with_junk(tmp_path, git)
    with pytest.raises(UnicodeDecodeError):  # the trap is real: a scan of every *.py under the root fails on it
        [p.read_text(encoding="utf-8") for p in sorted(root.rglob("*.py"))]
    listed = {p.relative_to(root).as_posix() for p in project_files(root, suffix="")}
    assert not {name for name in JUNK if name in listed}
    assert "headprune/model/hooks.py" in listed and "tests/test_house.py" in listed
    # the house checks of the copy, in the copy (lint-imports reads import graphs, not folders: left out for speed)
    env = {**os.environ, "PYTHONPATH": str(root)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_house.py",
                          "-k", "not import_contract and not upward_import"], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
