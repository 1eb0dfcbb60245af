"""``headprune dashboard``: start the Streamlit dashboard shipped with the package (the ``dashboard`` package).

The app is found by import machinery (``importlib.util.find_spec("dashboard.app")``, never imported here: no
streamlit import inside headprune), so the same command works from a checkout and from an installed wheel. The
theme and server settings of the repository's ``.streamlit/config.toml`` travel inside the package as
``headprune/resources/streamlit_config.toml`` (a link to that file in the checkout, a copy in a wheel) and are
passed to ``streamlit run`` as ``--section.option=value`` flags, because Streamlit only reads a config file from
the working directory or the home folder. Among them ``server.fileWatcherType = "none"``: Streamlit's default
watcher walks the app's folder recursively, a virtualenv inside a checkout with it (issue 25; the file says more).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

from ..errors import HeadpruneError
from ..protocol.spec import parse_toml

CONFIG_FILE = Path(__file__).resolve().parents[1] / "resources" / "streamlit_config.toml"
EXTRA_HINT = "pip install 'headprune[dashboard]'"


class DashboardError(HeadpruneError):
    """The dashboard cannot start: Streamlit or the dashboard package is not installed."""


def app_path() -> Path:
    """The dashboard's entry script, ``dashboard/app.py``, wherever the ``dashboard`` package is installed."""
    try:
        spec = importlib.util.find_spec("dashboard.app")
    except ModuleNotFoundError:
        spec = None
    if spec is None or not spec.origin:
        raise DashboardError(f"The dashboard package is not installed; install it with {EXTRA_HINT}.")
    return Path(spec.origin)


def _load_toml(path: Path) -> dict:
    return parse_toml(path.read_text(encoding="utf-8"))


def _flatten(table: dict, prefix: str = "") -> list[tuple[str, object]]:
    """``{"theme": {"light": {"primaryColor": "#2a9d8f"}}}`` -> ``[("theme.light.primaryColor", "#2a9d8f")]``."""
    items = []
    for key, value in table.items():
        name = f"{prefix}{key}"
        items.extend(_flatten(value, f"{name}.") if isinstance(value, dict) else [(name, value)])
    return items


def config_flags(path: Path = CONFIG_FILE) -> list[str]:
    """``streamlit run`` flags setting every option of the shipped config file (none when it is missing)."""
    if not path.is_file():
        return []
    flags = []
    for name, value in _flatten(_load_toml(path)):
        text = str(value).lower() if isinstance(value, bool) else str(value)  # TOML booleans, as Streamlit spells them
        flags.append(f"--{name}={text}")
    return flags


def dashboard_command(port: int | None = None, headless: bool = False) -> list[str]:
    """The argv that starts the dashboard: ``python -m streamlit run <dashboard/app.py> <config flags>``."""
    if importlib.util.find_spec("streamlit") is None:
        raise DashboardError(f"The dashboard needs Streamlit, which is not installed; install it with {EXTRA_HINT}.")
    argv = [sys.executable, "-m", "streamlit", "run", str(app_path()), *config_flags()]
    if port is not None:
        argv.append(f"--server.port={port}")
    if headless:
        argv.append("--server.headless=true")
    return argv


def cmd_dashboard(args) -> dict:
    argv = dashboard_command(args.port, args.headless)
    try:
        code = subprocess.call(argv)
    except KeyboardInterrupt:  # Ctrl+C stops Streamlit too; that is how a user ends the dashboard
        code = 0
    return {"dashboard": str(app_path()), "exit_code": code}


def add_commands(sub) -> None:
    p = sub.add_parser("dashboard", help="start the Streamlit dashboard (needs the dashboard extra); Ctrl+C stops it")
    p.add_argument("--port", type=int, help="port to serve on (default: Streamlit's, 8501)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.set_defaults(handler=cmd_dashboard)
