"""Scheduling a protocol's cells: units and shards, a shard's run under claims, and the folder's status.

    unit     the cells that share a model load and a repeat's rows and scores: one model x repeat group (the
             dense cell goes with repeat 0), split by criterion when it holds more than ``MAX_UNIT`` cells (a
             criterion's sparsities, and a recovered cell with its pruned one, always stay together); halved
             by criterion again while there are fewer units than shards
    shard    ``I/N``: units dealt to N shards, largest first, each to the shard with the fewest cells so far (ties:
             the lower shard). A shard is a pure function of the protocol (its sha256: the cells), the results
             folder (what is already there is read, not recomputed) and its id: any scheduler can run it
             (``headprune run P.toml --out D --shard I/N``; a SLURM array passes ``$SLURM_ARRAY_TASK_ID``)
    run      :func:`run_shard` computes a shard's unfinished cells, each claimed first (``claims``: two workers never
             compute one cell); ``steal`` goes on to the other shards' cells once its own are done (a pool's
             workers: a slow or dead worker's cells are picked up). A unit that raises has its failure recorded on
             its cells (``failed/<key>.json``) and the next unit goes on.
    status   :func:`status`: every cell done / running (holder, since) / failed (its error, last lines) / pending,
             and the time left from the measured cell times
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .. import outdir
from ..errors import Cancelled, HeadpruneError
from ..outdir import OutError
from .claims import Claims, read_claim, read_failure, write_failure
from .plan import Cell, expand
from .run import KEYS, Gate, RunError, Runner, check_out, finished, identity, records_of, same_protocol, table_rows
from .spec import Protocol

MAX_UNIT = 16   # cells of one model x repeat group before it is split by criterion (one shard's share stays small)


@dataclass(frozen=True)
class Unit:
    """Cells computed together: one model load, one repeat's rows, shared scores."""

    model: str
    repeat: int
    cells: tuple[Cell, ...]

    @property
    def name(self) -> str:
        criteria = sorted({c.criterion for c in self.cells})
        return f"{self.model} r{self.repeat} ({', '.join(criteria)}: {len(self.cells)} cells)"


def units(protocol: Protocol, at_least: int = 1) -> list[Unit]:
    """The protocol's units in run order (module doc). With fewer than ``at_least`` units (more workers than
    model x repeat groups), the largest unit of several criteria is halved by criterion until there are enough
    or none is left to halve: each half loads the model again, but the workers are not left idle."""
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in expand(protocol):
        groups.setdefault((cell.model, cell.repeat), []).append(cell)
    out = []
    for (model, repeat), cells in groups.items():
        out += [Unit(model, repeat, chunk) for chunk in split(cells, MAX_UNIT)]
    while len(out) < at_least:
        halvable = [i for i, u in enumerate(out) if len(by_criterion(u.cells)) > 1]
        if not halvable:
            break
        i = max(halvable, key=lambda j: (len(out[j].cells), -j))
        unit = out[i]
        out[i:i + 1] = [Unit(unit.model, unit.repeat, chunk)
                        for chunk in split(list(unit.cells), (len(unit.cells) + 1) // 2)]
    return out


def by_criterion(cells) -> list[list[Cell]]:
    """``cells`` grouped by criterion in order of appearance (the dense cell goes with the criterion after it)."""
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.criterion, []).append(cell)
    merged = list(groups.values())
    if len(merged) > 1 and merged[0][0].kind == "dense":   # alone it would load a model for one evaluation
        merged[1] = merged[0] + merged[1]
        del merged[0]
    return merged


def split(cells: list[Cell], most: int) -> list[tuple[Cell, ...]]:
    """``cells`` in chunks of whole criteria, a chunk closed once the next criterion would take it past ``most``."""
    if len(cells) <= most:
        return [tuple(cells)]
    chunks, chunk = [], []
    for same in by_criterion(cells):
        if chunk and len(chunk) + len(same) > most:
            chunks.append(tuple(chunk))
            chunk = []
        chunk += same
    return chunks + [tuple(chunk)]


def deal(protocol: Protocol, n: int) -> list[list[Unit]]:
    """The units of each of ``n`` shards (module doc); a shard may be empty when there are fewer units."""
    all_units = units(protocol, at_least=n)
    order = sorted(range(len(all_units)), key=lambda i: (-len(all_units[i].cells), i))
    shards: list[list[int]] = [[] for _ in range(n)]
    load = [0] * n
    for i in order:
        target = min(range(n), key=lambda s: (load[s], s))
        shards[target].append(i)
        load[target] += len(all_units[i].cells)
    return [[all_units[i] for i in sorted(members)] for members in shards]   # run order within a shard


MAX_SHARDS = 100_000


def parse_shard(text: str) -> tuple[int, int]:
    """``"I/N"`` as (I, N), 0 <= I < N (a SLURM array's task ids run from 0)."""
    accepted = "Accepted: I/N with whole numbers 0 <= I < N, e.g. --shard 0/4 ... --shard 3/4 (a SLURM array " \
               "passes --shard $SLURM_ARRAY_TASK_ID/N)."
    parts = str(text).split("/")
    # ASCII digits only: str.isdigit() admits "²" or "٣", which int() then refuses or reads as another number
    if len(parts) != 2 or not all(re.fullmatch(r"[0-9]{1,9}", p.strip()) for p in parts):
        raise RunError(f"--shard {str(text)[:40]!r} is not I/N. {accepted}")
    i, n = int(parts[0]), int(parts[1])
    if n < 1 or not 0 <= i < n:
        raise RunError(f"--shard {text}: shard {i} of {n} does not exist. {accepted}")
    if n > MAX_SHARDS:   # the deal lists every shard: a bound, as a SLURM array has one (MaxArraySize)
        raise RunError(f"--shard {text}: {n} shards is more than {MAX_SHARDS:,} (a SLURM array's task ids are "
                       f"bounded too). {accepted}")
    return i, n


Progress = Callable[[float, str], None]


class ClaimGate(Gate):
    """The runner's gate (``run.Gate``) when workers share ``out``: a cell is computed by the process that claims it
    (``claims``), only while unfinished; its failure is recorded on it; its claim is given back at its end."""

    def __init__(self, protocol: Protocol, out: Path, claims: Claims):
        self.protocol, self.out, self.claims = protocol, out, claims

    def free(self, cell: Cell) -> bool:
        return self.claims.free(cell.key)

    def begin(self, entry, cell: Cell) -> bool:
        if cell.recovered and finished(self.out, self.protocol, entry, cell.pruned) is None:
            return False   # its pruned cell's mask is not written yet: left to that cell's worker, or a rerun
        if not self.claims.take(cell.key):
            return False
        if finished(self.out, self.protocol, entry, cell) is not None:   # finished while it was unclaimed
            self.claims.release(cell.key)
            return False
        self.claims.started(cell.key)
        return True

    def written(self, cell: Cell) -> None:
        self.claims.succeeded(cell.key)

    def failed(self, cell: Cell, exc: Exception) -> None:
        self.claims.fail(cell.key, exc)

    def end(self, cell: Cell) -> None:
        self.claims.release(cell.key)


def run_shard(protocol: Protocol, out: str | Path, shard: tuple[int, int] = (0, 1), *, steal: bool = False,
              memory_budget=None, progress: Progress | None = None, say: Callable[[str], None] | None = None,
              worker: str = "") -> dict:
    """Compute shard ``I/N`` of ``protocol`` into ``out`` under claims (module doc); no table (:func:`merge`).

    Returns {"computed": keys written by this call, "failed": {unit name: error} of the units that raised}."""
    out = Path(out)
    i, n = shard
    mine = deal(protocol, n)
    order = mine[i] + ([u for s in range(1, n) for u in mine[(i + s) % n]] if steal else [])
    claims = Claims(out, worker)
    runner = Runner(protocol, out, memory_budget, progress, say, gate=ClaimGate(protocol, out, claims))
    entries = {m.name: m for m in protocol.models}
    failed: dict[str, str] = {}
    try:
        for unit in order:
            try:
                runner.run_cells(entries[unit.model], list(unit.cells))
            except (Cancelled, KeyboardInterrupt):
                raise
            except Exception as exc:   # a unit that raises: recorded on its cells; the other units go on
                failed[unit.name] = f"{type(exc).__name__}: {exc}"
                for cell in unit.cells:   # the failing cell has its traceback already; the rest are marked
                    if finished(out, protocol, entries[unit.model], cell) is None and \
                            read_failure(out, cell.key) is None and claims.free(cell.key):
                        write_failure(out, cell.key, {"key": cell.key, "worker": claims.worker, "time": time.time(),
                                                      "error": f"not computed: its unit failed ({failed[unit.name]})",
                                                      "tail": []})
    finally:
        claims.close()
    return {"computed": list(runner.computed), "failed": failed}


# -- status ----------------------------------------------------------------------------------------------------

@dataclass
class CellState:
    key: str
    state: str                 # done | running | failed | pending
    detail: str = ""           # running: holder and since; failed: the error
    seconds: float | None = None   # done: measured; others: None
    tail: tuple[str, ...] = ()  # failed: the last lines of the traceback
    kind: str = ""


def status(protocol: Protocol, out: str | Path, now: float | None = None) -> dict:
    """Every cell of ``protocol`` in ``out``: done / running / failed / pending (module doc), with counts and the
    time left: the mean measured seconds of each kind's done cells x its cells left, divided by the workers
    running now (at least one); None until a cell of that kind is done."""
    out = Path(out)
    now = time.time() if now is None else now
    entries = {m.name: m for m in protocol.models}
    states = []
    for cell in expand(protocol):
        record = finished(out, protocol, entries[cell.model], cell)
        if record is not None:
            states.append(CellState(cell.key, "done", seconds=float(record.get("seconds", 0.0)), kind=cell.kind))
            continue
        holder = read_claim(out, cell.key)
        gone = holder.stale(now) if holder is not None else None
        if holder is not None and gone is None:
            states.append(CellState(cell.key, "running", f"{holder.worker} (pid {holder.pid} on {holder.host}) "
                                    f"since {time.strftime('%H:%M:%S', time.localtime(holder.since))}, "
                                    f"{now - holder.since:.0f} s", kind=cell.kind))
            continue
        failure = read_failure(out, cell.key)
        if gone is not None:
            states.append(CellState(cell.key, "failed", f"its worker is gone: {gone}", kind=cell.kind))
        elif failure is not None:
            states.append(CellState(cell.key, "failed", failure["error"], tail=tuple(failure.get("tail", ())),
                                    kind=cell.kind))
        else:
            states.append(CellState(cell.key, "pending", kind=cell.kind))
    counts = {s: sum(c.state == s for c in states) for s in ("done", "running", "failed", "pending")}
    workers = {c.detail.split(" since ")[0] for c in states if c.state == "running"}
    left = 0.0
    for kind in {c.kind for c in states}:
        times = [c.seconds for c in states if c.kind == kind and c.state == "done"]
        todo = sum(c.kind == kind and c.state != "done" for c in states)
        if todo and not times:
            left = None
            break
        left += todo * (sum(times) / len(times) if times else 0.0)
    return {"out": str(out), "protocol": protocol.source, "cells": len(states), "counts": counts,
            "workers": len(workers), "seconds_left": None if left is None else left / max(len(workers), 1),
            "states": states}


def landed_table(protocol: Protocol, out: str | Path) -> list[dict]:
    """The table of the cells landed in ``out`` so far (``table_rows`` on the finished cells), one dict of display
    strings per row: the key columns, "repeats" landed, and each metric as "mean ± sd" (the dashboard's view)."""
    rows, columns = table_rows(protocol, records_of(protocol, Path(out)))
    shown = []
    for row in rows:
        line = {k: row[k] for k in KEYS if k in row}
        for c in columns:
            mean, sd = row.get(c) or (None, None)
            line[c] = "" if mean is None else f"{mean:.4f}" + ("" if sd is None else f" ± {sd:.4f}")
        shown.append(line)
    return shown


def status_text(report: dict) -> str:
    """The status as lines for a terminal (``headprune run --status``)."""
    c = report["counts"]
    left = report["seconds_left"]
    lines = [f"{report['out']}: {report['cells']} cells of {report['protocol']}: {c['done']} done, "
             f"{c['running']} running, {c['failed']} failed, {c['pending']} pending; time left "
             + ("unknown (no cell of each kind done yet)" if left is None else
                f"about {left:.0f} s with {max(report['workers'], 1)} worker(s)")]
    for state in ("running", "failed", "pending"):
        for s in report["states"]:
            if s.state == state:
                lines.append(f"  {state:8s} {s.key}" + (f": {s.detail}" if s.detail else ""))
                lines += [f"           | {line}" for line in s.tail[-5:]]
    return "\n".join(lines)


def worker_name(shard: tuple[int, int]) -> str:
    return f"shard {shard[0]}/{shard[1]} pid {os.getpid()}"


# -- the folder's protocol -------------------------------------------------------------------------------------

def folder_protocol(out: str | Path, given: Protocol | None = None) -> Protocol:
    """The protocol ``out`` belongs to, by its run marker (``outdir.MARKER``: the protocol's name, source and
    sha256): ``given`` when the marker is its (``run.same_protocol``), else the marker's source file when it is
    still the file that ran. ``--status D`` and ``--merge D`` need no protocol argument while the file is unchanged."""
    out = Path(out)
    marker = outdir.read_marker(out)
    if marker is None or marker.get("command") != "run":
        raise RunError(f"{out} is not a protocol's results folder (no {outdir.MARKER} of `headprune run` in it). "
                       "Accepted: the --out folder of a `headprune run`.")
    if given is not None:
        if not same_protocol(given)(marker):
            raise RunError(f"{out} holds the results of {marker.get('source')} (name {marker.get('name')}), not of "
                           f"{given.source} (name {given.name}).")
        return given
    source = marker.get("source")
    if not isinstance(source, str) or not source.strip():   # a marker is a results folder's file: untrusted
        raise RunError(f"{out}'s run marker ({outdir.MARKER}) names no protocol file (its source is "
                       f"{str(source)[:40]!r}). Accepted: give the protocol file too, e.g. `headprune run "
                       f"PROTOCOL.toml --status {out}`.")
    try:
        protocol = Protocol.read(source)
    except HeadpruneError:
        protocol = None
    if protocol is None or protocol.hash != marker.get("sha256"):
        raise RunError(f"{out} was written by {source}, which is " + ("gone" if protocol is None else "changed since")
                       + f". Accepted: give the protocol file too, e.g. `headprune run {source} --status {out}`.")
    return protocol


def own_folder(out: str | Path, protocol: Protocol, force: bool = False) -> Path:
    """``out`` checked as ``protocol``'s results folder (``run.check_out``: new, empty, or marked by a run of this
    protocol; another protocol's folder is refused before any model loads) and marked as its (the run marker):
    what a pool, a job array or a shard does before its workers start."""
    path = check_out(out, protocol, force)
    try:
        return outdir.claim_results_folder(path, identity(protocol))
    except OutError as exc:
        raise RunError(str(exc)) from None
