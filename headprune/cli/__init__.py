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
import textwrap

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

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):
        # No abbreviated options: `prune --device cuda` was read as --device-map (prune has no --device) and refused
        # as "not JSON"; an option a command lacks is named as unrecognised instead.
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def error(self, message: str):
        self.exit(2, f"error: {message}\n{self.format_usage()}")


# `headprune --help` lists the commands by what they do, each with one example (issue 38): a newcomer reads the
# group, not twenty names in one line. A command missing here is listed under OTHER (tests/test_docs_reference.py
# fails on that, so a new command gets its place and example).
GROUPS = (
    ("look: the demos, the dashboard, what heads do", (
        ("demo", "python -m headprune demo --lm"),
        ("dashboard", "python -m headprune dashboard --port 8501"),
        ("roles", "python -m headprune roles --model demo --data demo --out roles.json"),
        ("syntax", "python -m headprune syntax --model demo --data demo --out profile.json"),
        ("docs", "python -m headprune docs --port 8000"),
        ("lessons", "python -m headprune lessons check ~/my-lessons"),
    )),
    ("score: how much each head matters", (
        ("criteria", "python -m headprune criteria"),
        ("score", "python -m headprune score --model demo --data demo --criterion his --out scores.json"),
        ("select-alpha", "python -m headprune select-alpha --model demo --data demo --out alpha.json"),
    )),
    ("prune: masks, step-by-step pruning, smaller models", (
        ("mask", "python -m headprune mask --scores scores.json --ratio 0.5 --out mask.json"),
        ("trajectory", "python -m headprune trajectory --model demo --data demo --criterion his --out run.json"),
        ("prune", "python -m headprune prune --model demo --mask mask.json --out pruned/"),
    )),
    ("evaluate: metrics of a model, dense, masked or cut", (
        ("evaluate", "python -m headprune evaluate --model demo --data demo --mask mask.json"),
    )),
    ("protocols: a results table from one TOML file", (
        ("run", "python -m headprune run protocols/demo.toml --out runs/demo"),
    )),
    ("recover: train a pruned model back", (
        ("recover", "python -m headprune recover --model demo --mask mask.json --epochs 1 --out recovered/"),
    )),
    ("KV cache: which heads keep the whole cache", (
        ("kvplan", "python -m headprune kvplan --model demo-lm --data demo-lm --rule duo --out plan.json"),
        ("generate", "python -m headprune generate --model demo-lm --prompt 'the film is' --kv-plan plan.json"),
    )),
)
OTHER = "other commands"


def command_groups(commands: dict[str, str]) -> list[tuple[str, list[tuple[str, str, str]]]]:
    """``commands`` (name -> one-line help) grouped as GROUPS says: [(group, [(name, help, example), ...])]; a
    command GROUPS does not name comes last, under OTHER, without an example."""
    grouped, placed = [], set()
    for title, members in GROUPS:
        rows = [(name, commands[name], example) for name, example in members if name in commands]
        placed.update(name for name, _ in members)
        if rows:
            grouped.append((title, rows))
    rest = [(name, text, "") for name, text in commands.items() if name not in placed]
    return grouped + ([(OTHER, rest)] if rest else [])


def grouped_help(commands: dict[str, str], width: int = 100) -> str:
    """The command list of ``headprune --help``: each group's commands with their help and one example."""
    lines = []
    for title, rows in command_groups(commands):
        lines += ["", f"{title}:"]
        for name, text, example in rows:
            lines += textwrap.wrap(text, width, initial_indent=f"  {name:<13} ", subsequent_indent=" " * 16)
            if example:
                lines.append(f"{'':16}e.g. {example}")
    return "\n".join(lines[1:])


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m headprune", usage="%(prog)s [-h] COMMAND ...",
                    formatter_class=argparse.RawDescriptionHelpFormatter,
                    description="Score, look at and prune the attention heads of transformers.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", prog=parser.prog)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name in HELPERS:
            continue
        importlib.import_module(f"{__name__}.{info.name}").add_commands(sub)
    # argparse would list every command in one flat block; the grouped list replaces it (same names, same help)
    sub.help = argparse.SUPPRESS
    parser.epilog = (f"commands, by what they do:\n\n{grouped_help(command_help(sub))}\n\n"
                     "`python -m headprune COMMAND --help` tells a command's options; the manual (offline): "
                     "`python -m headprune docs`.")
    return parser


def command_help(sub) -> dict[str, str]:
    """name -> one-line help of every command of the subparsers action ``sub``, in the order they were added."""
    return {action.dest: action.help or "" for action in sub._choices_actions}


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

