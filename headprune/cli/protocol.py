"""``run``: one command per results table. ``headprune run PROTOCOL.toml --out DIR`` computes every cell of a
protocol file (``headprune.protocol``), resumably, and writes the table, masks, plots and run file;
``--plan`` prints the cells and their work without the network and without loading weights; ``--smoke`` runs the
whole protocol on tiny random stand-ins of its models and data (``headprune.protocol.smoke``) in seconds.

``--out`` is the run's own folder (``headprune.outdir``): new, empty, or one a run of the same protocol marked;
``--force`` writes into another. Ctrl+C (SIGINT) or SIGTERM stops the run between batches: the finished cells stay,
a line says how many and the command that resumes, and the exit status is 130 (SIGINT) or 143 (SIGTERM).
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading

from ..errors import Interrupted
from ..protocol import Protocol, plan
from ..protocol.plan import expand
from ..protocol.run import RunError, check_out, kept, run_protocol
from ..protocol.smoke import check_labels, hub_reachable, require_labels, run_smoke
from .common import add_memory_arg, end_bars, tqdm_progress, warn_user_code
from .output import add_force_arg


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, as Ctrl+C raises KeyboardInterrupt."""


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _online() -> bool:
    """Whether hub configs and data set features may be read (HF_HUB_OFFLINE=1, or the hub out of reach: never)."""
    return hub_reachable()


def _terminate(signum, frame):
    raise Terminated()


def cmd_run(args) -> dict:
    protocol = Protocol.read(args.protocol)   # every key and value checked here, before any model loads
    for entry in protocol.models:   # said before anything resolves the tasks: that imports their helpers
        spec = protocol.harness_spec(entry)
        if spec is not None:
            warn_user_code(spec)
    if args.plan:
        labels = check_labels(protocol, _online())
        for line in labels.unchecked:
            _say(f"not checked: {line}")
        for line in labels.problems:
            _say(f"problem: {line}")
        plans = plan(protocol, time_it=not args.no_timing)
        for p in plans:
            grid = f", grid {p.grid[0]} x {p.grid[1]}" if p.grid else ""
            _say(f"{p.entry.name}: {p.entry.model} ({p.kind}{grid}), {len(p.cells)} cells; {p.text()}")
            for cell in p.cells:
                _say(f"  {cell.key}")
        if labels.problems:
            require_labels(protocol, False, labels)   # the same problems, as the error (exit 2)
        return {"protocol": protocol.source, "sha256": protocol.hash, "cells": sum(len(p.cells) for p in plans),
                "models": [p.to_json() for p in plans], "labels": labels.to_json()}
    if not args.out:
        raise RunError("--out DIR is needed to run a protocol (the folder its cells and table are written to); "
                       "--plan shows the cells without running them.")
    if not args.smoke:   # labels, splits and columns against configs and features: before any weights load
        require_labels(protocol, _online())
    check_out(args.out, protocol, args.force)   # a refused folder is left as it was, before any model loads
    bar = []

    def progress(fraction: float, message: str) -> None:   # the bar starts after the estimate line
        if not bar:
            bar.append(tqdm_progress(f"protocol {protocol.name}"))
        bar[0](fraction, message)

    main = threading.current_thread() is threading.main_thread()   # signal handlers belong to the main thread
    before = signal.signal(signal.SIGTERM, _terminate) if main else None
    try:
        if args.smoke:
            online = _online()
            _say("smoke run: tiny random stand-ins of every model and data role (" + (
                "hub configs and features where reachable" if online else "offline: families and stated labels")
                + "); the numbers are meaningless")
            return run_smoke(protocol, args.out, online=online, say=_say, plots=not args.no_plots, progress=progress)
        return run_protocol(protocol, args.out, memory_budget=args.memory_budget, say=_say,
                            plots=not args.no_plots, progress=progress, force=args.force)
    except KeyboardInterrupt as exc:
        end_bars()
        status = 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
        again = getattr(args, "argv", None) or ["run", args.protocol, "--out", args.out]
        raise Interrupted(f"interrupted: {kept(args.out, protocol)} of {len(expand(protocol))} cells are kept in "
                          f"{args.out}; to resume, run: headprune {shlex.join(again)}", status) from None
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)


def add_commands(sub) -> None:
    p = sub.add_parser("run", help="run a protocol file (models, data roles, criteria, sparsities or a trajectory, "
                                   "repeats): the results table, masks, plots and run file, resumable")
    p.add_argument("protocol", help="the protocol file (TOML), e.g. protocols/demo.toml")
    p.add_argument("--out", help="results folder: created, or empty, or one a run of this protocol wrote (marked "
                                 "by .headprune-run.json); a rerun into it skips the finished cells")
    p.add_argument("--plan", action="store_true",
                   help="print the cells and their estimated work, offline, without loading any weights")
    p.add_argument("--no-timing", action="store_true",
                   help="with --plan: count the work only (no random-initialised forward is timed)")
    p.add_argument("--smoke", action="store_true",
                   help="run the whole protocol on stand-ins: each model a tiny random model of its family and "
                        "labels, each data role a few synthetic rows with its features; writes a real, meaningless "
                        "table to --out in seconds (HF_HUB_OFFLINE=1: no network at all)")
    p.add_argument("--no-plots", action="store_true", help="write no figures")
    add_force_arg(p, "write into an --out folder that holds other files (a user's, another protocol's results): "
                     "only the files this run names are written, none is deleted")
    add_memory_arg(p)
    p.set_defaults(handler=cmd_run)
