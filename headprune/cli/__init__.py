"""``python -m headprune <command>``: every command prints one JSON object on stdout; progress goes to stderr.

Each module in this package defines ``add_commands(subparsers)``; a command's handler takes the parsed args and
returns the dict to print. User errors (HeadpruneError) print ``error: <message>`` on stderr (on a line of its own,
after any progress bar) and exit 2, and so do arguments the parser refuses (:class:`Parser`): every refusal's first
line on stderr starts with ``error:``. A run stopped by a signal (``errors.Interrupted``) exits 130 (SIGINT) or 143
(SIGTERM).
Every handler checks all its arguments (``common.check_args``) before it loads a model or draws a progress bar.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys

from ..errors import HeadpruneError, Interrupted
from .common import check_path_options, end_bars
from .output import jsonable

HELPERS = ("common", "output")   # modules of this package that define no command


class Parser(argparse.ArgumentParser):
    """argparse with the project's error form: ``error: <message>`` on its own first line, the usage after it.

    Stock argparse prints the usage first and ``prog: error:`` last; a reader (or a script reading the first line
    of stderr) then sees the usage, not the problem. Subparsers inherit this class (``add_subparsers`` uses the
    parent's type).
    """

    def error(self, message: str):
        self.exit(2, f"error: {message}\n{self.format_usage()}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m headprune",
                                     description="Score, look at and prune the attention heads of transformers.")
    sub = parser.add_subparsers(dest="command", required=True)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in HELPERS:
            continue
        importlib.import_module(f"{__name__}.{info.name}").add_commands(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)   # as typed: what a command says to run again
    try:
        check_path_options(args)
        result = args.handler(args)
    except HeadpruneError as exc:
        end_bars()   # the message starts on its own line, never glued to a half-drawn progress bar
        print(f"{'' if isinstance(exc, Interrupted) else 'error: '}{exc}", file=sys.stderr)
        return exc.status if isinstance(exc, Interrupted) else 2   # a stopped run: 128 + the signal
    print(json.dumps(result, default=jsonable))
    return 0

