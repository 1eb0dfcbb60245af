"""``run``: one command per results table. ``headprune run PROTOCOL.toml --out DIR`` computes every cell of a
protocol file (``headprune.protocol``), resumably, and writes the table, masks, plots and run file;
``--plan`` prints the cells and their work without the network and without loading weights."""

from __future__ import annotations

import sys

from ..errors import Cancelled
from ..protocol import Protocol, plan
from ..protocol.run import RunError, check_out, run_protocol
from .common import add_memory_arg, tqdm_progress, warn_user_code


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def cmd_run(args) -> dict:
    protocol = Protocol.read(args.protocol)   # every key and value checked here, before any model loads
    for entry in protocol.models:   # said before anything resolves the tasks: that imports their helpers
        spec = protocol.harness_spec(entry)
        if spec is not None:
            warn_user_code(spec)
    if args.plan:
        plans = plan(protocol, time_it=not args.no_timing)
        for p in plans:
            grid = f", grid {p.grid[0]} x {p.grid[1]}" if p.grid else ""
            _say(f"{p.entry.name}: {p.entry.model} ({p.kind}{grid}), {len(p.cells)} cells; {p.text()}")
            for cell in p.cells:
                _say(f"  {cell.key}")
        return {"protocol": protocol.source, "sha256": protocol.hash, "cells": sum(len(p.cells) for p in plans),
                "models": [p.to_json() for p in plans]}
    if not args.out:
        raise RunError("--out DIR is needed to run a protocol (the folder its cells and table are written to); "
                       "--plan shows the cells without running them.")
    check_out(args.out)
    bar = []

    def progress(fraction: float, message: str) -> None:   # the bar starts after the estimate line
        if not bar:
            bar.append(tqdm_progress(f"protocol {protocol.name}"))
        bar[0](fraction, message)

    try:
        return run_protocol(protocol, args.out, memory_budget=args.memory_budget, say=_say, plots=not args.no_plots,
                            progress=progress)
    except KeyboardInterrupt:
        raise Cancelled(f"Interrupted: the finished cells are kept in {args.out}/cells; run the same command again "
                        "to resume from there.") from None


def add_commands(sub) -> None:
    p = sub.add_parser("run", help="run a protocol file (models, data roles, criteria, sparsities or a trajectory, "
                                   "repeats): the results table, masks, plots and run file, resumable")
    p.add_argument("protocol", help="the protocol file (TOML), e.g. protocols/demo.toml")
    p.add_argument("--out", help="results folder (created); a rerun into it skips the finished cells")
    p.add_argument("--plan", action="store_true",
                   help="print the cells and their estimated work, offline, without loading any weights")
    p.add_argument("--no-timing", action="store_true",
                   help="with --plan: count the work only (no random-initialised forward is timed)")
    p.add_argument("--no-plots", action="store_true", help="write no figures")
    add_memory_arg(p)
    p.set_defaults(handler=cmd_run)
