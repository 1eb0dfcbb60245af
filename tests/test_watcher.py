"""Streamlit's file watcher never watches a virtualenv (or any big folder) inside the checkout (issue 25).

With a ``.venv`` inside the checkout (the README's layout), Streamlit's default watcher walked its ~6,000 folders
over and over and the dashboard's computations ran 3-8x slower. The fake checkout here has the folders a user's
checkout can hold (``.venv``, ``venv``, ``build``, ``runs``, a cache); ``tests/watch_probe.py`` starts Streamlit's
watcher as a session would, from ``streamlit run app.py`` (the checkout's ``.streamlit/config.toml``) or from the
flags ``headprune dashboard`` passes, and reports every folder inotify watches. A control run with Streamlit's
default watcher shows the check bites: there the same folders are watched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headprune.cli import dashboard

ROOT = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "watch_probe.py"
BIG_FOLDERS = (".venv", "venv", "build", "runs", ".cache")


def checkout(tmp_path: Path, with_config: bool) -> Path:
    """A checkout's layout: app.py, a module, the big folders (each a few sub-folders deep), and the project's
    ``.streamlit/config.toml`` when ``with_config``."""
    root = tmp_path / "checkout"
    root.mkdir()
    (root / "app.py").write_text("import probe_module\n")
    (root / "probe_module.py").write_text("VALUE = 1\n")
    for big in BIG_FOLDERS:
        for i in range(5):
            folder = root / big / "lib" / "python3" / "site-packages" / f"package{i}"
            folder.mkdir(parents=True)
            (folder / "__init__.py").write_text("")
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    if with_config:
        shutil.copytree(ROOT / ".streamlit", root / ".streamlit")
    return root


def big_folder_inodes(root: Path) -> dict[str, set[int]]:
    return {big: {os.stat(d).st_ino for d, _, _ in os.walk(root / big)} for big in BIG_FOLDERS}


def probe(cwd: Path, run_args: list[str]) -> dict:
    """tests/watch_probe.py in ``cwd`` for ``streamlit run <run_args>``: the watcher type and the watched inodes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLIT_")}  # only the config and flags count
    run = subprocess.run([sys.executable, str(PROBE), json.dumps(run_args)], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def watched_big_folders(root: Path, result: dict) -> dict[str, int]:
    watched = set(result["watched"])
    return {big: len(inodes & watched) for big, inodes in big_folder_inodes(root).items() if inodes & watched}


needs_inotify = pytest.mark.skipif(not Path("/proc/self/fdinfo").is_dir() or not sys.platform.startswith("linux"),
                                   reason="reads inotify watches from /proc (Linux)")


@needs_inotify
def test_streamlit_run_app_watches_no_big_folder_of_the_checkout(tmp_path):
    """``streamlit run app.py`` in a checkout: its .streamlit/config.toml keeps every big folder unwatched."""
    root = checkout(tmp_path, with_config=True)
    result = probe(root, ["app.py"])
    assert result["fileWatcherType"] == "none"
    assert watched_big_folders(root, result) == {}
    assert result["watched"] == []


@needs_inotify
def test_headprune_dashboard_flags_watch_no_big_folder(tmp_path):
    """``headprune dashboard`` passes the shipped config as flags (Streamlit reads no config file outside the working
    folder): parsed by Streamlit's own command line, they keep the watcher off too."""
    root = checkout(tmp_path, with_config=False)
    argv = dashboard.dashboard_command(port=8599, headless=True)
    assert argv[3] == "run"
    elsewhere = tmp_path / "elsewhere"  # no .streamlit here: only the flags decide
    elsewhere.mkdir()
    result = probe(elsewhere, [str(root / "app.py"), *argv[5:]])
    assert result["fileWatcherType"] == "none"
    assert watched_big_folders(root, result) == {}


@needs_inotify
def test_streamlits_default_watcher_walks_the_venv_inside_the_checkout(tmp_path):
    """The control: Streamlit's default (``auto``, watchdog) on the same checkout watches every big folder, the
    .venv included. If this stops holding, the two tests above no longer show anything."""
    pytest.importorskip("watchdog", reason="Streamlit's default watcher is watchdog")
    root = checkout(tmp_path, with_config=True)
    result = probe(root, ["app.py", "--server.fileWatcherType=auto"])
    assert result["fileWatcherType"] == "auto"
    counts = watched_big_folders(root, result)
    inodes = big_folder_inodes(root)
    assert counts == {big: len(inodes[big]) for big in BIG_FOLDERS}


@needs_inotify
def test_a_folder_watch_blacklist_does_not_keep_the_venv_unwatched(tmp_path):
    """Why the fix turns the watcher off rather than listing folders in ``server.folderWatchBlacklist``: the
    blacklist filters which modules are registered, while inotify still walks every folder under app.py's."""
    pytest.importorskip("watchdog", reason="Streamlit's default watcher is watchdog")
    root = checkout(tmp_path, with_config=True)
    result = probe(root, ["app.py", "--server.fileWatcherType=auto", "--server.folderWatchBlacklist=.venv"])
    assert watched_big_folders(root, result).get(".venv", 0) == len(big_folder_inodes(root)[".venv"])
