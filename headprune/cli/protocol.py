"""``run``: one command per results table. ``headprune run PROTOCOL.toml --out DIR`` computes every cell of a
protocol file (``headprune.protocol``), resumably, and writes the table, masks, plots and run file;
``--plan`` prints the cells and their work without loading weights, and checks every role's labels, split and
columns against the model's config.json and the data set's features (read from the hub, or from ``HF_ENDPOINT``'s
mirror, when reachable: no weights, no rows; offline it lists the checks it could not make); ``--smoke`` runs the
whole protocol on tiny random stand-ins of its models and data (``headprune.protocol.smoke``) in seconds.

``--out`` is the run's own folder (``headprune.outdir``): new, empty, or one a run of the same protocol marked;
``--force`` writes into another. Ctrl+C (SIGINT) or SIGTERM stops the run between batches: the finished cells stay,
a line says how many and the command that resumes, and the exit status is 130 (SIGINT) or 143 (SIGTERM).

Parallel runs (``headprune.protocol.executors``): ``--executor pool --workers N`` (this machine's GPUs or cores),
``--executor slurm`` (a submitit job array), ``--shard I/N`` (one shard, for any scheduler); ``--status DIR``
shows which cells are done, running, failed or pending; ``--merge DIR`` builds the table from the cells.
"""

from __future__ import annotations

import shlex
import signal
import sys
import threading

from ..errors import Interrupted
from ..limits import Interval
from ..protocol import Protocol, plan
from ..protocol.executors import EXECUTORS, check_slurm, run_pool, shard_count, slurm_executor, submit
from ..protocol.plan import expand
from ..protocol.run import RunError, check_out, kept, merge, run_protocol
from ..protocol.schedule import folder_protocol, own_folder, parse_shard, run_shard, status_text
from ..protocol.schedule import status as folder_status
from ..protocol.smoke import check_labels, hub_address, hub_reachable, require_labels, run_smoke, smoke_protocol
from .common import add_memory_arg, end_bars, tqdm_progress, warn_user_code
from .output import add_force_arg


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is, as Ctrl+C raises KeyboardInterrupt."""

# limits of the parallel-run flags, each checked before any model loads
COUNTS = {"workers": Interval(1, 4096, integer=True), "threads": Interval(1, 4096, integer=True),
          "gpus_per_task": Interval(0, 64, integer=True), "cpus_per_task": Interval(1, 4096, integer=True),
          "time": Interval(1, 525_600, integer=True), "slurm_array_parallelism": Interval(1, 100_000, integer=True),
          "shards": Interval(1, 100_000, integer=True)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def check_flags(args) -> None:
    """The parallel-run flags: counts in their limits, and flags that only go with their executor."""
    for name, limit in COUNTS.items():
        value = getattr(args, name)
        if value is not None and limit(value) is not None:
            raise RunError(f"--{name.replace('_', '-')} {value} {limit(value)}.")
    if args.shard is not None and args.executor != "local":
        raise RunError("--shard I/N runs one shard in this process; it does not go with --executor "
                       f"{args.executor}. Accepted: --shard alone, or --executor pool / slurm alone.")
    if args.workers is not None and args.executor != "pool":
        raise RunError(f"--workers goes with --executor pool (it was --executor {args.executor}). For slurm, "
                       "--shards N sets the array's size.")
    if args.threads is not None and args.executor != "pool":   # refused, never ignored
        raise RunError(f"--threads sets each pool worker's torch threads; it goes with --executor pool (it was "
                       f"--executor {args.executor}). Accepted: --executor pool --threads N, or set "
                       "OMP_NUM_THREADS for a local run.")
    slurm = [a for a in ("slurm_partition", "gpus_per_task", "cpus_per_task", "mem", "time",
                         "slurm_array_parallelism", "shards", "slurm_arg", "wait") if getattr(args, a)]
    if slurm and args.executor != "slurm":
        raise RunError(f"--{slurm[0].replace('_', '-')} goes with --executor slurm (it was --executor "
                       f"{args.executor}).")
    if args.executor == "slurm" and args.time is None:
        # submitit writes its own #SBATCH --time=5 when none is given: five minutes stop most units mid-cell, and a
        # guess of ours could exceed the partition's limit (the array then waits forever): the user says
        raise RunError("--executor slurm needs --time MINUTES, each array task's wall-clock limit (without it "
                       "submitit asks SLURM for 5 minutes, which stops most units mid-cell). `headprune run P.toml "
                       "--plan` estimates the cells' time; a task runs one unit (or 1/--shards of them).")


def slurm_extra(pairs: list[str]) -> dict:
    extra = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise RunError(f"--slurm-arg {pair!r} is not KEY=VALUE. Accepted: e.g. --slurm-arg account=abc123 "
                           "(written as #SBATCH --account=abc123).")
        extra[key.strip().replace("-", "_")] = value
    return extra


def _online() -> bool:
    """Whether hub configs and data set features may be read (HF_HUB_OFFLINE=1, or the hub out of reach: never)."""
    return hub_reachable()


def _terminate(signum, frame):
    raise Terminated()


def cmd_run(args) -> dict:
    if args.status and args.merge:   # one folder per call: the other would be dropped without a word
        raise RunError(f"--status {args.status} and --merge {args.merge} both given; each reads one results "
                       "folder. Accepted: --status DIR or --merge DIR, one per call.")
    if args.status or args.merge:
        folder = args.status or args.merge
        protocol = folder_protocol(folder, Protocol.read(args.protocol) if args.protocol else None)
        protocol = smoke_protocol(protocol, folder) or protocol   # a --smoke run's cells are its stand-ins'
        if args.status:
            report = folder_status(protocol, folder)
            _say(status_text(report))
            return {**report, "states": [vars(s) for s in report["states"]]}
        return merge(protocol, folder, plots=not args.no_plots)
    if not args.protocol:
        raise RunError("a protocol file is needed (headprune run PROTOCOL.toml --out DIR); --status DIR and --merge "
                       "DIR read the protocol from the results folder.")
    check_flags(args)
    shard = parse_shard(args.shard) if args.shard is not None else None
    if args.executor == "slurm":
        check_slurm()
    extra = slurm_extra(args.slurm_arg)
    protocol = Protocol.read(args.protocol)   # every key and value checked here, before any model loads
    for entry in protocol.models:   # said before anything resolves the tasks: that imports their helpers
        spec = protocol.harness_spec(entry)
        if spec is not None:
            warn_user_code(spec)
    if args.plan:
        online = _online()
        labels = check_labels(protocol, online)
        host, port = hub_address()
        _say(f"labels, splits and columns: {len(labels.checked)} role(s) checked, {len(labels.problems)} problem(s), "
             f"{len(labels.unchecked)} check(s) not made (" + (f"hub configs and features read from {host}:{port}"
             if online else f"offline: HF_HUB_OFFLINE is set or {host}:{port} is out of reach") + ")")
        for line in labels.checked:
            _say(f"checked: {line}")
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
    if args.smoke and (args.executor != "local" or shard is not None):
        raise RunError("--smoke runs the stand-ins in this process; it does not go with --executor pool / slurm or "
                       "--shard.")
    out = check_out(args.out, protocol, args.force)   # a refused folder is left as it was, before any model loads
    # labels, splits and columns against configs and features, before any weights load; a smoke run too, so it
    # stops where the real run would, with the protocol's lines named, before building its stand-ins
    online = _online()
    require_labels(protocol, online)
    bar = []

    def progress(fraction: float, message: str) -> None:   # the bar starts after the estimate line
        if not bar:
            bar.append(tqdm_progress(f"protocol {protocol.name}"))
        bar[0](fraction, message)

    main = threading.current_thread() is threading.main_thread()   # signal handlers belong to the main thread
    before = signal.signal(signal.SIGTERM, _terminate) if main else None
    try:
        if shard is not None:
            own_folder(out, protocol, args.force)
            return {"out": str(out), "shard": args.shard,
                    **run_shard(protocol, out, shard, memory_budget=args.memory_budget, say=_say)}
        if args.executor == "pool":
            own_folder(out, protocol, args.force)
            return run_pool(protocol, out, args.workers, threads=args.threads, memory_budget=args.memory_budget,
                            say=_say, plots=not args.no_plots)
        if args.executor == "slurm":
            own_folder(out, protocol, args.force)
            executor = slurm_executor(out, partition=args.slurm_partition, gpus_per_task=args.gpus_per_task,
                                      cpus_per_task=args.cpus_per_task, mem=args.mem, minutes=args.time,
                                      array_parallelism=args.slurm_array_parallelism, extra=extra)
            return submit(protocol, out, executor, args.shards or shard_count(protocol), wait=args.wait,
                          memory_budget=args.memory_budget, say=_say, plots=not args.no_plots)
        if args.smoke:
            _say("smoke run: tiny random stand-ins of every model and data role (" + (
                "hub configs and features where reachable" if online else "offline: families and stated labels")
                + "); the numbers are meaningless")
            return run_smoke(protocol, args.out, online=online, say=_say, plots=not args.no_plots, progress=progress,
                             force=args.force)
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
    p.add_argument("protocol", nargs="?", help="the protocol file (TOML), e.g. protocols/demo.toml")
    p.add_argument("--out", help="results folder: created, or empty, or one a run of this protocol wrote (marked "
                                 "by .headprune-run.json); a rerun into it skips the finished cells")
    p.add_argument("--plan", action="store_true",
                   help="print the cells and their estimated work without loading any weights, and check labels, "
                        "splits and columns against each model's config.json and each data set's features (from "
                        "the hub or HF_ENDPOINT when reachable: no weights, no rows; offline: the checks not made "
                        "are listed)")
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
    g = p.add_argument_group("parallel runs", "cells as shards: one model x repeat group each, split by criterion "
                                              "when large; a claim per cell, so workers never compute one twice")
    g.add_argument("--executor", choices=EXECUTORS, default="local",
                   help="local: one process, cells in order (default); pool: --workers processes on this machine; "
                        "slurm: a submitit job array (pip install 'headprune[cluster]')")
    g.add_argument("--workers", type=int, help="pool: worker processes (default: one per visible GPU, each with its "
                                               "own CUDA_VISIBLE_DEVICES, else one per core)")
    g.add_argument("--threads", type=int, help="pool: torch CPU threads per worker (default: the cores split)")
    g.add_argument("--shard", metavar="I/N", help="run shard I of N (0 <= I < N) in this process and no table: "
                                                  "the building block of any scheduler ($SLURM_ARRAY_TASK_ID/N)")
    g.add_argument("--status", metavar="DIR", help="the cells of a results folder: done, running (by whom, since "
                                                   "when), failed (last lines of the error), pending; time left")
    g.add_argument("--merge", metavar="DIR", help="build the table, plots and run file from the cells in DIR")
    g.add_argument("--shards", type=int, help="slurm: array tasks (default: one per model x repeat unit)")
    g.add_argument("--slurm-partition", help="slurm: the partition")
    g.add_argument("--gpus-per-task", type=int, help="slurm: GPUs per array task")
    g.add_argument("--cpus-per-task", type=int, help="slurm: CPUs per array task")
    g.add_argument("--mem", help="slurm: memory per task, e.g. 32G")
    g.add_argument("--time", type=int, help="slurm: minutes per task (required with --executor slurm)")
    g.add_argument("--slurm-array-parallelism", type=int, help="slurm: tasks running at once")
    g.add_argument("--slurm-arg", action="append", metavar="KEY=VALUE",
                   help="slurm: any other #SBATCH --KEY=VALUE (repeatable)")
    g.add_argument("--wait", action="store_true", help="slurm: follow the jobs to their end, then merge the table")
    p.set_defaults(handler=cmd_run)
