"""``headprune docs``: the manual, offline: build the MkDocs site of this checkout once, then serve it locally.

The site is built (``mkdocs build``, in a subprocess: mkdocs is a dev tool, never imported by headprune) into the
headprune cache, ``<cache>/docs/<key>``, where the key hashes everything the pages are made from (mkdocs.yml,
docs/, README.md and the package's code, which writes the reference pages). A build goes to a temporary folder
renamed into place, so a stopped build leaves nothing half-written. Served on 127.0.0.1 only, port 8000 by default:
the dashboard's help links point there (``HEADPRUNE_DOCS_URL``, default http://localhost:8000/).
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import importlib.util
import shutil
import subprocess
import sys
import tempfile
import webbrowser
from pathlib import Path

from ..demos.build import cache_dir, writable
from ..errors import HeadpruneError
from ..limits import Interval
from .common import checked

CHECKOUT = Path(__file__).resolve().parents[2]
SOURCES = ("mkdocs.yml", "README.md", "docs", "headprune", "assets")   # what the pages are made from
PORT = Interval(1, 65535, integer=True, why="a TCP port")
DEFAULT_PORT = 8000


class DocsError(HeadpruneError):
    """The manual cannot be built here: no checkout with mkdocs.yml, or mkdocs not installed."""


def sources_key(root: Path = CHECKOUT) -> str:
    """sha256 (16 hex digits) over the names and bytes of every file the site is made from."""
    digest = hashlib.sha256()
    for name in SOURCES:
        path = root / name
        files = sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts) \
            if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            digest.update(str(file.relative_to(root)).encode() + b"\0" + file.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def site_dir(root: Path = CHECKOUT) -> Path:
    """Where the site of this checkout's current sources lives (built or not)."""
    return cache_dir() / "docs" / sources_key(root)


def build_site(root: Path = CHECKOUT, rebuild: bool = False) -> tuple[Path, bool]:
    """(the site folder, whether it was built now): built with ``mkdocs build`` unless already there."""
    if not (root / "mkdocs.yml").is_file():
        raise DocsError(f"No mkdocs.yml in {root}: the manual's sources (mkdocs.yml, docs/) come with a headprune "
                        "checkout. Accepted: an editable install of a checkout (bash install.sh --dev).")
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        raise DocsError("Building the manual needs mkdocs and mkdocs-material, which are not installed; install "
                        "them with the dev extra: bash install.sh --dev (or pip install -e '.[dev]').")
    site = site_dir(root)
    if site.is_dir() and not rebuild:
        return site, False
    writable(site.parent)   # CacheError naming it, before mkdocs runs
    staging = Path(tempfile.mkdtemp(prefix=f".{site.name}-", dir=site.parent))
    try:
        run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--quiet", "--clean", "-f",
                              str(root / "mkdocs.yml"), "-d", str(staging)], cwd=root, capture_output=True, text=True)
        if run.returncode != 0:
            raise DocsError(f"mkdocs build failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
        if site.is_dir():
            shutil.rmtree(site)
        staging.rename(site)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return site, True


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the site's files without a log line per request on stderr."""

    def log_message(self, format, *args):   # noqa: A002 - the name http.server calls it with
        pass


def make_server(site: Path, port: int) -> http.server.ThreadingHTTPServer:
    """An HTTP server of the folder ``site`` on 127.0.0.1:``port`` (port 0: a free one), not started."""
    handler = functools.partial(QuietHandler, directory=str(site))
    try:
        return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    except OSError as exc:
        raise DocsError(f"Cannot serve on port {port}: {exc.strerror}. Accepted: a free port (--port N).") from None


def serve(site: Path, port: int, open_browser: bool) -> str:
    """Serve ``site`` on 127.0.0.1:``port`` until Ctrl+C; returns the address."""
    server = make_server(site, port)
    url = f"http://localhost:{port}/"
    print(f"headprune docs: serving {site} at {url} (Ctrl+C stops)", file=sys.stderr, flush=True)
    if open_browser:
        webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl+C is how a user stops the server
        pass
    finally:
        server.server_close()
    return url


def cmd_docs(args) -> dict:
    site, built = build_site(rebuild=args.rebuild)
    result = {"site": str(site), "built": built, "index": str(site / "index.html")}
    if not args.build_only:
        result["url"] = serve(site, args.port, args.open)
    return result


def add_commands(sub) -> None:
    p = sub.add_parser("docs", help="the manual, offline: build this checkout's documentation site once (mkdocs, "
                                    "the dev extra) and serve it on localhost; Ctrl+C stops it")
    p.add_argument("--port", type=checked(PORT, "a port"), default=DEFAULT_PORT,
                   help=f"port to serve on, on 127.0.0.1 (default {DEFAULT_PORT}: where the dashboard's help links "
                        "point unless HEADPRUNE_DOCS_URL says otherwise)")
    p.add_argument("--open", action="store_true", help="also open the manual in a browser")
    p.add_argument("--build-only", action="store_true", help="build (if needed) and print where the site is; do "
                                                             "not serve")
    p.add_argument("--rebuild", action="store_true", help="build again even if this version's site is cached")
    p.set_defaults(handler=cmd_docs)
