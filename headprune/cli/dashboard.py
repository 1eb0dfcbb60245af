"""``headprune dashboard``: start the Streamlit dashboard shipped with the package (the ``dashboard`` package).

The app is found by import machinery (``importlib.util.find_spec("dashboard.app")``, never imported here: no
streamlit import inside headprune), so the same command works from a checkout and from an installed wheel. The
theme and server settings of the repository's ``.streamlit/config.toml`` travel inside the package as
``headprune/resources/streamlit_config.toml`` (a link to that file in the checkout, a copy in a wheel) and are
passed to ``streamlit run`` as ``--section.option=value`` flags, because Streamlit only reads a config file from
the working directory or the home folder. Among them ``server.fileWatcherType = "none"``: Streamlit's default
watcher walks the app's folder recursively, a virtualenv inside a checkout with it (issue 25; the file says more);
and the options that keep a start offline (issue 46): ``browser.serverAddress`` set, so Streamlit does not look up
the machine's addresses (a UDP socket "connected" to 8.8.8.8, an HTTP request to checkip.amazonaws.com) to print
them, no usage statistics, no e-mail prompt. ``OFFLINE`` are passed even without the file.

A ``--port`` is checked before Streamlit starts: outside 1-65535, or taken by another server, it is an ``error:``
line and exit 2 (Streamlit printed a traceback, or its own message, and exited 0).
"""

from __future__ import annotations

import errno
import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

from ..errors import HeadpruneError
from ..protocol.spec import parse_toml
from .docs import PORT

CONFIG_FILE = Path(__file__).resolve().parents[1] / "resources" / "streamlit_config.toml"
EXTRA_HINT = "pip install 'headprune[dashboard]'"
# the options that keep the start offline, whatever the config file says (Streamlit's names and values)
OFFLINE = {"browser.serverAddress": "localhost", "browser.gatherUsageStats": "false",
           "server.showEmailPrompt": "false"}


class DashboardError(HeadpruneError):
    """The dashboard cannot start: Streamlit or the dashboard package is not installed, or the port is not free."""


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


def offline_flags(flags: list[str]) -> list[str]:
    """The OFFLINE options ``flags`` does not set already."""
    named = {flag.split("=", 1)[0] for flag in flags}
    return [f"--{name}={value}" for name, value in OFFLINE.items() if f"--{name}" not in named]


def check_port(port: int) -> None:
    """DashboardError unless ``port`` is a TCP port (PORT) this machine can serve on now: bound as Streamlit
    binds it (all interfaces, address reuse on), then let go at once."""
    problem = PORT(port)
    if problem:
        raise DashboardError(f"--port {port} {problem}. Accepted: a free port, e.g. --port 8501.")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as exc:
            why = "another program serves on it" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise DashboardError(f"--port {port} cannot be used: {why}. Accepted: a free port (leave out --port: "
                                 "Streamlit then takes 8501 or the next free one).") from None


def dashboard_command(port: int | None = None, headless: bool = False) -> list[str]:
    """The argv that starts the dashboard: ``python -m streamlit run <dashboard/app.py> <config flags>``."""
    if importlib.util.find_spec("streamlit") is None:
        raise DashboardError(f"The dashboard needs Streamlit, which is not installed; install it with {EXTRA_HINT}.")
    flags = config_flags()
    argv = [sys.executable, "-m", "streamlit", "run", str(app_path()), *flags, *offline_flags(flags)]
    if port is not None:
        argv.append(f"--server.port={port}")
    if headless:
        argv.append("--server.headless=true")
    return argv


def cmd_dashboard(args) -> dict:
    if args.port is not None:
        check_port(args.port)
    argv = dashboard_command(args.port, args.headless)
    try:
        code = subprocess.call(argv)
    except KeyboardInterrupt:  # Ctrl+C stops Streamlit too; that is how a user ends the dashboard
        code = 0
    if code != 0:
        raise DashboardError(f"Streamlit stopped with exit code {code} (its messages are above).")
    return {"dashboard": str(app_path()), "exit_code": code}


def add_commands(sub) -> None:
    p = sub.add_parser("dashboard", help="start the Streamlit dashboard (needs the dashboard extra); Ctrl+C stops it")
    p.add_argument("--port", type=int, help="port to serve on (default: Streamlit's, 8501)")
    p.add_argument("--headless", action="store_true", help="do not open a browser")
    p.set_defaults(handler=cmd_dashboard)
