"""Running a protocol: every cell computed once, written atomically, then the table, masks, plots and run file.

The :class:`Runner` schedules within one process: it picks the cells not finished, loads each model once and its
rows per repeat, asks its :class:`Gate` (the scheduler's claims) before each cell, hands the cell to that repeat's
``compute.CellComputer`` (which turns a cell into its result, mask and dropped layers), writes the cell's files and
reports progress; :func:`merge` builds the table. Shards, claims and executors are ``schedule``'s.

Layout of ``OUT``::

    cells/<key>.json     one finished cell: its metrics (or trajectory), mask, seeds, role hashes, fingerprint
    scores/<key>.json    a criterion's ScoreMap of one repeat (shared by the sparsities of that repeat)
    recovery/<key>/      a recovered cell's training checkpoints while it runs ([recovery]; deleted once written)
    masks/<key>.json     the mask of a cell (``HeadMask`` file format: {"pruned": {...}, "shape": [L, H]})
    plans/<key>.json     a [kv] cell's cache plan (``kvcache.KVPlan`` file format, as ``headprune kvplan`` writes)
    results.csv, results.md   the table: mean ± sd over repeats per (model, criterion, sparsity, order or full
                         share of a [kv] rule), metric;
                         with [recovery] a "stage" column: dense, pruned, or recovered (the pruned cell's mask
                         trained back on data.train, evaluated on the same evaluation rows)
    plots/<model>.html|png    metric vs sparsity (or the trajectories), when plotly (and kaleido) are installed
    run.json             the protocol text and its sha256, models, data roles with the hashes of their rows,
                         parameters, versions and every cell's result
    .headprune-run.json  the run marker (``outdir.MARKER``): the folder is this protocol's (its name and sha256)

The folder is the run's own (``headprune.outdir``): ``OUT`` is created, or must be empty, or hold the marker of a
run of the same protocol (same file or same name), unless ``force``; a refused folder is left as it was. The run
deletes only files it names: temporary files of its own writes (``.<file>.<random>.headprune.tmp`` of a file it
writes) and a recovered cell's checkpoint folder holding its fingerprint.

Resuming: a cell whose file exists with the same fingerprint (sha256 of everything that decides its result: model,
roles, criterion and parameters, sparsity or order, repeat, seeds, batching) is read, not recomputed; so an
interrupted run (``errors.Cancelled`` from the progress callback, a kill) loses at most the cell it was in. Files
are written to a temporary name in their folder and renamed into place (``os.replace``), so none is ever half
written. The standard deviation is the sample one (n − 1) over repeats.
"""

from __future__ import annotations

import csv
import importlib
import importlib.util
import io
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .. import outdir
from ..criteria.sap import layer_rule_json, pool_rule
from ..estimate import TimeEstimate
from ..evaluation.stability import STABILITY_METRICS
from ..model.mask import HeadMask
from ..model.task import KINDS as TASKS
from ..model.task import Task
from ..outdir import OutError
from ..provenance import versions
from ..trajectory import Trajectory, spread
from ..userinput import shown
from . import cells as adapter
from .claims import check_record, not_written, number, read_failure, read_folder_json, text
from .compute import CellComputer, RunError, as_json, fingerprint, read_json, write_atomic
from .plan import DENSE, KV, RECOVERED, TOLERANCE, Cell, expand, slug
from .spec import ModelEntry, Protocol

Progress = Callable[[float, str], None]
Say = Callable[[str], None]


# -- files -----------------------------------------------------------------------------------------------------

OWN = ("cells", "scores", "masks", "plans", "recovery", "plots", "results.csv", "results.md", "run.json",
       outdir.MARKER)


def identity(protocol: Protocol) -> dict:
    """What a results folder's run marker records (``outdir.MARKER``): the command and the protocol."""
    return {"command": "run", "name": protocol.name, "sha256": protocol.hash, "source": protocol.source}


def same_protocol(protocol: Protocol) -> Callable[[dict], bool]:
    """Whether a marked folder is this protocol's to continue: the same file, or one of the same name (an edited
    protocol: its unchanged cells are read back by their fingerprints)."""
    return lambda marker: marker.get("sha256") == protocol.hash or marker.get("name") == protocol.name


def earlier_run(protocol: Protocol) -> Callable[[Path], bool]:
    """A folder written before run markers existed: only names a run writes at its top, and a run file or
    cells of a protocol of this name."""
    def check(path: Path) -> bool:
        if any(entry.name not in OWN for entry in path.iterdir()):
            return False
        run = read_json(path / "run.json")
        return ((run or {}).get("protocol") or {}).get("parameters", {}).get("name") == protocol.name or (
            run is None and (path / "cells").is_dir())
    return check


def check_out(out: str | Path, protocol: Protocol, force: bool = False) -> Path:
    """``--out`` as this protocol's results folder (``outdir.check_results_folder``), checked before any model
    loads and without creating anything: new, empty, marked by a run of this protocol, or ``force``."""
    try:
        return outdir.check_results_folder(out, "--out", identity(protocol), same_protocol(protocol), force=force,
                                           legacy=earlier_run(protocol))
    except OutError as exc:
        raise RunError(str(exc)) from None


def clear_stale(out: Path, protocol: Protocol) -> None:
    """Delete the temporary files that writes cut short by a kill left (``outdir.stale_temps``), by the names of
    the files this protocol writes: never a file the run did not write."""
    cells = expand(protocol)
    keys = {f"{c.key}.json" for c in cells}
    scored = tuple(f"{slug(c.model)}__{slug(c.criterion)}__r{c.repeat}__" for c in cells)
    plots = {f"{slug(m.name)}{suffix}" for m in protocol.models for suffix in (".html", ".png")}
    owners = {out: set(OWN), out / "cells": keys, out / "masks": keys, out / "plans": keys, out / "plots": plots}
    for folder, names in owners.items():
        for stale in list(outdir.stale_temps(folder, names.__contains__)):
            stale.unlink()
    for stale in list(outdir.stale_temps(out / "scores", lambda name: name.startswith(scored))):
        stale.unlink()


def finished(out: Path, protocol: Protocol, entry: ModelEntry, cell: Cell) -> dict | None:
    """The cell's record when ``out`` holds it for this protocol's settings, else None (another settings'
    fingerprint: computed again). A record of these settings is read as untrusted input (``claims`` module doc):
    it names this cell, and holds what the table, plots and run file read of it, or it is a FolderError."""
    path = out / "cells" / f"{cell.key}.json"
    record = read_folder_json(path, "cell record", {"fingerprint": (text, "a sha256")})
    if record is None or record["fingerprint"] != fingerprint(protocol, entry, cell):
        return None
    check_record(record, path, "cell record", cell_fields(protocol, cell),
                 {"seconds": (number, "seconds"), "saved_mask": (lambda v: isinstance(v, dict), "an object"),
                  "n_classes": (lambda v: v is None or isinstance(v, int), "a number of classes")})
    if "metrics" in record:   # every metric the table reports of this cell (the model's metric set)
        names = adapter.task_metrics(Task(record["task"]), entry, *eval_of(record))
        missing = [m for m in names if m not in record["metrics"]]
        if missing:
            raise not_written(path, f"its 'metrics' lack {', '.join(missing)} (of {', '.join(names)})",
                              "cell record")
    if "trajectory" in record:
        traj = checked_trajectory(record["trajectory"], path)
        if "saved_mask" in record:
            problem = saved_mask_problem(record["saved_mask"], traj)
            if problem:
                raise not_written(path, problem, "cell record")
    return record


def checked_trajectory(obj: dict, path: Path) -> Trajectory:
    """A cell record's trajectory as the table and plots read it (every point's ratio and metric read now), or the
    FolderError naming the file: an edited step fails here, not inside a table or a plot."""
    try:
        traj = Trajectory.from_json(obj)
        ratios, values = traj.ratios().astype(float), traj.values()
    except (TypeError, KeyError, ValueError, AttributeError, IndexError) as exc:
        raise not_written(path, f"its 'trajectory' is not one headprune writes ({type(exc).__name__}: "
                          f"{str(exc)[:80]})", "cell record") from None
    if not (np.isfinite(ratios).all() and ((ratios >= 0) & (ratios <= 1)).all()):
        raise not_written(path, "its 'trajectory' has a pruned ratio outside [0, 1]", "cell record")
    if len(values) != len(ratios):
        raise not_written(path, "its 'trajectory' has steps without a metric", "cell record")
    return traj


SIZE_KEYS = ("params_before", "params_after", "mb_before", "mb_after", "reduction_pct")   # ``compute.size_at``


def saved_mask_problem(saved: dict, traj: Trajectory) -> str | None:
    """Why a cell record's ``saved_mask`` (``compute.saved_step``: step, ratio, rule, size, points) cannot be what
    the run wrote for ``traj``, naming the field; None when it can. The step indexes the trajectory's points (0 =
    dense .. its last step) and its ratio is the trajectory's at that step, so the table's ratio and metric are
    one step's."""
    ratios = traj.ratios()
    last = len(ratios) - 1

    def step_problem(name: str, step) -> str | None:
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= last:
            return (f"its '{name}' is {shown(repr(step))}, not a step of its trajectory (a whole number from 0, the "
                    f"dense model, to {last})")
        return None

    def ratio_problem(name: str, value, step: int) -> str | None:
        if not number(value) or abs(value - float(ratios[step])) > 1e-6:
            return (f"its '{name}' is {shown(repr(value))}, not the pruned ratio of its step {step} "
                    f"({float(ratios[step]):.6g})")
        return None

    problem = next((f"its 'saved_mask' has no '{k}'" for k in ("step", "ratio", "rule", "size") if k not in saved),
                   None) or step_problem("saved_mask.step", saved["step"])
    if problem:
        return problem
    problem = ratio_problem("saved_mask.ratio", saved["ratio"], saved["step"])
    if problem:
        return problem
    if not isinstance(saved["rule"], str):
        return f"its 'saved_mask.rule' is {shown(repr(saved['rule']))}, not a text"
    size = saved["size"]
    if not isinstance(size, dict) or any(not number(size.get(k)) for k in SIZE_KEYS):
        return (f"its 'saved_mask.size' is {shown(repr(size))}, not an object of numbers "
                f"({', '.join(SIZE_KEYS)})")
    points = saved.get("points", {})
    if not isinstance(points, dict):
        return f"its 'saved_mask.points' is {shown(repr(points))}, not an object of points by rule"
    for rule, point in points.items():
        if not isinstance(point, dict) or not {"step", "ratio", "value"} <= point.keys():
            return f"its 'saved_mask.points.{rule}' is {shown(repr(point))}, not a point (step, ratio, value)"
        problem = step_problem(f"saved_mask.points.{rule}.step", point["step"]) or \
            ratio_problem(f"saved_mask.points.{rule}.ratio", point["ratio"], point["step"])
        if problem or not number(point["value"]):
            return problem or f"its 'saved_mask.points.{rule}.value' is {shown(repr(point['value']))}, not a number"
    return None


def cell_fields(protocol: Protocol, cell: Cell) -> dict:
    """What ``finished`` checks in ``cell``'s record: the cell it names, and the fields the table reads."""
    fields = {name: (lambda v, want=want: v == want and type(v) is type(want), f"{want!r} (this cell's)")
              for name, want in cell.to_json().items() if name in ("model", "criterion", "repeat", "sparsity",
                                                                     "inverse", "kind", "key")}
    fields |= {"task": (lambda v: v in TASKS, f"one of {', '.join(TASKS)}"),
               "loaded": (lambda v: isinstance(v, dict), "an object (the model as loaded)"),
               "roles": (lambda v: isinstance(v, dict) and isinstance(v.get("eval"), dict) and "source" in v["eval"],
                         "an object with the evaluation role's source")}
    if protocol.trajectory is not None and cell.kind != DENSE:
        fields["trajectory"] = (lambda v: isinstance(v, dict), "an object (the trajectory)")
    else:
        fields["metrics"] = (lambda v: isinstance(v, dict) and all(number(x) for x in v.values()),
                             "an object of numbers by metric")
    if cell.kind == KV:
        fields["kv_bytes"] = (lambda v: isinstance(v, dict) and number(v.get("ratio")), "an object with a ratio")
    if cell.tolerance:
        fields["sparsity_reached"] = (number, "the pruned share reached")
    return fields


def kept(out: str | Path, protocol: Protocol) -> int:
    """How many of ``protocol``'s cells ``out`` holds finished for its current settings (what a rerun reads)."""
    entries = {m.name: m for m in protocol.models}
    return sum(finished(Path(out).expanduser(), protocol, entries[c.model], c) is not None for c in expand(protocol))


# -- running ---------------------------------------------------------------------------------------------------

class Gate:
    """Who computes which cell, asked by the :class:`Runner` around each cell; this one lets every cell through
    (one process owns the folder). The scheduler's ``schedule.ClaimGate`` answers with claims, so workers sharing a
    folder never compute one cell twice."""

    def free(self, cell: Cell) -> bool:
        """Whether ``cell`` may be computed by this process at all (before the model loads)."""
        return True

    def begin(self, entry: ModelEntry, cell: Cell) -> bool:
        """Whether this process computes ``cell`` now (its turn starts when True)."""
        return True

    def written(self, cell: Cell) -> None:
        """``cell``'s file was written."""

    def failed(self, cell: Cell, exc: Exception) -> None:
        """``cell`` raised ``exc`` (re-raised after this)."""

    def end(self, cell: Cell) -> None:
        """``cell``'s turn is over: written, raised or cancelled."""


class Runner:
    """Runs the cells of one protocol into ``out`` (module doc); :func:`run_protocol` is the entry point."""

    def __init__(self, protocol: Protocol, out: Path, memory_budget=None, progress: Progress | None = None,
                 say: Say | None = None, gate: Gate | None = None):
        self.protocol, self.out = protocol, out
        self.gate = gate or Gate()   # who computes which cell: the scheduler's (``schedule.ClaimGate``), or all
        self.budget = memory_budget if memory_budget is not None else protocol.memory_budget
        self.progress, self.say, self.tell = progress, say or (lambda text: None), say is not None
        self.cells = expand(protocol)
        self.done = 0
        self.computed: list[str] = []
        self.models: dict[str, dict] = {}
        # every model's lm-eval tasks (and their data) checked now, before any model loads
        self.harness = {entry.name: adapter.harness_tasks(protocol, entry) for entry in protocol.models}

    def report(self, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress((self.done + min(max(fraction, 0.0), 1.0)) / len(self.cells), message)

    def sub(self, cell: Cell) -> Progress:
        return lambda f, m: self.report(f, f"{cell.key}: {m}")

    def run(self) -> None:
        for entry in self.protocol.models:
            self.run_cells(entry, [c for c in self.cells if c.model == entry.name])

    def run_cells(self, entry: ModelEntry, mine: list[Cell]) -> None:
        """The cells of ``mine`` (one model's) not finished in ``out`` nor held by a live claim of another worker;
        the model loads only when one is left."""
        pending = [c for c in mine if finished(self.out, self.protocol, entry, c) is None]
        self.done += len(mine) - len(pending)
        pending = [c for c in pending if self.gate.free(c)]
        if pending:
            self.run_model(entry, pending)

    def run_model(self, entry: ModelEntry, pending: list[Cell]) -> None:
        """Load ``entry``'s model once, its rows per repeat, and compute each pending cell its Gate lets through
        (``compute.CellComputer``: one per repeat, holding that repeat's caches)."""
        loaded = adapter.load_model_for(entry, self.protocol)
        model_cache: dict = {}   # the model's workspace and recovery's train rows, shared by its repeats
        by_repeat: dict[int, list[Cell]] = {}
        for cell in pending:
            by_repeat.setdefault(cell.repeat, []).append(cell)
        self.models[entry.name] = {"model": entry.model, "source": loaded.source, "arch": loaded.adapter.arch,
                                   "grid": list(loaded.adapter.grid_shape), "device": str(loaded.device)}
        told = False
        for repeat, cells in sorted(by_repeat.items()):
            data = adapter.build_workspace_for(loaded, entry, self.protocol, repeat, model_cache)
            computer = CellComputer(self.protocol, self.out, entry, loaded, data, repeat, model_cache,
                                    self.harness[entry.name], self.budget)
            if not told and self.tell:   # the expected duration, on its own line before the bar starts
                self.say(f"estimate: {computer.estimate(pending)}")
                told = True
            for cell in cells:
                if not self.gate.begin(entry, cell):
                    continue
                try:
                    start = time.perf_counter()
                    result, mask, dropped = computer.compute(cell, self.sub(cell))
                    self.write_cell(entry, cell, data, result, mask, computer.seed, time.perf_counter() - start,
                                    dropped)
                    self.gate.written(cell)
                except Exception as exc:   # told to the scheduler (recorded on the cell), then raised to it
                    self.gate.failed(cell, exc)
                    raise
                finally:   # a cancel (KeyboardInterrupt, Cancelled) ends the cell's turn too
                    self.gate.end(cell)

    def write_cell(self, entry: ModelEntry, cell: Cell, data, result: dict, mask: HeadMask | None, seed: int,
                   seconds: float, dropped: list[int]) -> None:
        mask_path = None
        if mask is not None:   # SAP's layer rule travels in the mask file (``headprune evaluate --mask`` reads it)
            mask_path = self.out / "masks" / f"{cell.key}.json"
            write_atomic(mask_path, as_json(layer_rule_json(mask, dropped) if dropped else mask.to_json()))
        record = {**cell.to_json(), "fingerprint": fingerprint(self.protocol, entry, cell), "seed": seed,
                  "loaded": self.models[entry.name], "task": data.task.kind,
                  "roles": {**data.roles, **({"train": result["recovery"]["train"]} if cell.recovered else {})},
                  "n_classes": data.n_classes, **result,
                  "mask": str(mask_path.relative_to(self.out)) if mask_path else None, "dropped_layers": dropped,
                  "seconds": seconds}
        write_atomic(self.out / "cells" / f"{cell.key}.json", as_json(record))   # last: the cell's commit point
        if cell.recovered:   # the cell is whole: its checkpoints are no longer needed
            shutil.rmtree(self.out / "recovery" / cell.key, ignore_errors=True)
        self.computed.append(cell.key)
        self.done += 1
        self.report(0.0, f"{cell.key} done")

    def estimate(self, loaded, entry: ModelEntry, data, pending: list[Cell]) -> TimeEstimate:
        """Expected duration of ``pending`` on ``data`` (``CellComputer.estimate``)."""
        return CellComputer(self.protocol, self.out, entry, loaded, data, 0, {}, self.harness[entry.name],
                            self.budget).estimate(pending)


# -- the table -------------------------------------------------------------------------------------------------

def mean_sd(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n − 1; None for one value)."""
    array = np.asarray(values, dtype=float)
    return float(array.mean()), (float(array.std(ddof=1)) if len(array) > 1 else None)


def value_at(traj: Trajectory, ratio: float, metric: str) -> float:
    """The metric at the last recorded point whose pruned ratio is at most ``ratio`` (the dense model at 0); for a
    metric measured at chosen points only (lm-eval's, ``Trajectory.points``), the last of those."""
    ratios, values = traj.point_values(metric) if metric in traj.points else (traj.ratios(), traj.values(metric))
    return float(values[np.flatnonzero(ratios <= ratio + 1e-9)[-1]])


def eval_of(record: dict) -> tuple[str | None, int | None]:
    """(evaluation source, classes) of a cell record: what picks the metric set and headline of its table."""
    return record["roles"]["eval"]["source"], record.get("n_classes")


def table_rows(protocol: Protocol, records: dict[str, dict | None]) -> tuple[list[dict], list[str]]:
    """(rows, metric columns): one row per (model, criterion, sparsity or order) with (mean, sd, n) per metric.

    A cell without a record (None or absent: not finished yet) is left out, so a folder being filled gives the
    rows of the cells landed so far ("repeats" says how many); a row none of whose cells landed is not shown."""
    rows, columns = [], []
    groups: dict[tuple, list[dict]] = {}
    for cell in expand(protocol):
        if records.get(cell.key) is None:
            continue
        where = TOLERANCE if cell.tolerance else cell.full_share if cell.kind == KV else \
            cell.sparsity if cell.inverse is None else ("inverse" if cell.inverse else "order")
        stage = RECOVERED if cell.recovered else (DENSE if cell.kind == DENSE else "pruned")
        groups.setdefault((cell.model, cell.criterion, where, stage), []).append(records[cell.key])
    entries = {m.name: m for m in protocol.models}
    for (model, criterion, where, stage), recs in groups.items():
        task = Task(recs[0]["task"])
        if protocol.kv is not None:   # a cache plan's row: its share of full key/value heads (dense: all of them)
            names = list(adapter.task_metrics(task, entries[model], *eval_of(recs[0])))
            values = {m: [r["metrics"][m] for r in recs] for m in names}
            values[KV_BYTES] = [r["kv_bytes"]["ratio"] if where is not None else 1.0 for r in recs]
            row = {"model": model, "criterion": criterion, "full_share": 1.0 if where is None else where}
        elif protocol.trajectory is None:
            names = list(adapter.task_metrics(task, entries[model], *eval_of(recs[0])))
            values = {m: [r["metrics"][m] for r in recs] for m in names}
            if where == TOLERANCE:   # the sparsity is the criterion's result (sap-cf's tolerance mode)
                values[REACHED] = [r["sparsity_reached"] for r in recs]
            row = {"model": model, "criterion": criterion, "sparsity": 0.0 if where is None else where}
        else:
            trajs = [Trajectory.from_json(r["trajectory"]) for r in recs]
            metric = trajs[0].metric
            values = {f"auc {metric}": [t.auc() for t in trajs], "pruned at end": [t.ratios()[-1] for t in trajs]}
            values |= {f"{metric} @ {r:g}": [value_at(t, r, metric) for t in trajs]
                       for r in protocol.trajectory.report_at}
            values |= {f"{name} @ {r:g}": [value_at(t, r, name) for t in trajs]
                       for name in entries[model].harness_metrics for r in protocol.trajectory.report_at}
            row = {"model": model, "criterion": criterion, "order": where}
        if protocol.recovery is not None:   # pruned and recovered rows side by side: the stage tells them apart
            row["stage"] = stage
        row["repeats"] = len(recs)
        for name, vals in values.items():
            row[name] = mean_sd(vals)
            columns += [name] if name not in columns else []
        rows.append(row)
    return rows, columns


KEYS = ("model", "criterion", "sparsity", "full_share", "order", "stage", "repeats")   # a row's identifying columns
REACHED = "sparsity reached"   # the column of tolerance rows: the pruned share CF's tolerance stopped at
KV_BYTES = "kv bytes / full"   # a [kv] row's KV bytes at max_length tokens over the full cache's (counted)


def _fmt(value: tuple | None) -> str:
    if value is None:
        return ""
    mean, sd = value
    return f"{mean:.4f}" if sd is None else f"{mean:.4f} ± {sd:.4f}"


def table_csv(rows: list[dict], columns: list[str]) -> str:
    keys = [k for k in KEYS if k in rows[0]]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(keys + [f"{c} {part}" for c in columns for part in ("mean", "sd")])
    for row in rows:
        cells = [row[k] for k in keys]
        for c in columns:
            mean, sd = row.get(c) or (None, None)
            cells += ["" if mean is None else f"{mean:.6g}", "" if sd is None else f"{sd:.6g}"]
        writer.writerow(cells)
    return buffer.getvalue()


def table_markdown(rows: list[dict], columns: list[str]) -> str:
    keys = [k for k in KEYS if k in rows[0]]
    lines = ["| " + " | ".join(keys + columns) + " |", "|" + "---|" * (len(keys) + len(columns))]
    for row in rows:
        shown = [f"{row[k]:g}" if k in ("sparsity", "full_share") and not isinstance(row[k], str) else str(row[k])
                 for k in keys]
        lines.append("| " + " | ".join(shown + [_fmt(row.get(c)) for c in columns]) + " |")
    return "\n".join(lines) + "\n"


def headline_by_model(protocol: Protocol, records: dict[str, dict]) -> dict[str, str]:
    """Each model's headline metric (the one its paper row reports), read from its first cell's task and data."""
    first = {}
    for cell in expand(protocol):
        first.setdefault(cell.model, records[cell.key])
    entries = {m.name: m for m in protocol.models}
    return {name: adapter.headline_of(Task(rec["task"]), entries[name], *eval_of(rec)) for name, rec in first.items()}


def average_rows(protocol: Protocol, records: dict[str, dict], rows: list[dict]) -> list[dict]:
    """The papers' "Average" column: per (criterion, sparsity, stage), the mean over models of each model's headline
    metric (HIES Table 1: SST-2 accuracy, CoLA MCC, ... averaged), and with ``[table] baseline`` the "% vs" column,
    100 x (average / the baseline's average at the same sparsity and stage - 1). Sparsity protocols of several
    models, or with a baseline, only (one model's average is its own table)."""
    if protocol.trajectory is not None or protocol.kv is not None or \
            (len(protocol.models) < 2 and not protocol.table.get("baseline")):
        return []
    headline = headline_by_model(protocol, records)
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        metric = headline[row["model"]]
        if metric in row:
            groups.setdefault((row["criterion"], row["sparsity"], row.get("stage")), []).append(row[metric][0])
    out = [{"criterion": c, "sparsity": s, **({"stage": st} if st else {}), "models": len(v),
            "average": float(np.mean(v))} for (c, s, st), v in groups.items()]
    base = protocol.table.get("baseline")
    if base:
        ref = {(r["sparsity"], r.get("stage")): r["average"] for r in out if r["criterion"] == base}
        for r in out:
            b = ref.get((r["sparsity"], r.get("stage")))
            r[f"% vs {base}"] = None if not b else 100.0 * (r["average"] / b - 1.0)
    return out


def paper_rows(protocol: Protocol, rows: list[dict]) -> list[dict]:
    """The paper's reported values ([[paper]]) beside ours: paper | ours (mean over repeats) | delta = ours - paper."""
    out = []
    for entry in protocol.paper:
        for label, cells in entry.values.items():
            for ratio, value in cells.items():
                mine = next((r for r in rows if r["model"] == entry.model and r["criterion"] == label
                             and abs(r["sparsity"] - ratio) < 1e-9 and r.get("stage", "pruned") != RECOVERED), None)
                ours = mine[entry.metric][0] if mine and entry.metric in mine else None
                out.append({"model": entry.model, "criterion": label, "sparsity": ratio, "metric": entry.metric,
                            "paper": value, "ours": ours, "delta": None if ours is None else ours - value,
                            "cite": entry.cite})
    return out


def _num(value, fmt: str = ".4f") -> str:
    return "" if value is None else format(value, fmt)


def size_rows(protocol: Protocol, records: dict[str, dict]) -> list[dict]:
    """Per (model, criterion, order): the saved mask's step ratio, metric and size (``size_at``), mean over repeats:
    Greedy-Gnorm's Table 1 (accuracy and MB before / after pruning). Trajectory protocols with a mask_tolerance
    only (every trajectory cell's record carries its saved mask's size in run.json)."""
    if protocol.trajectory is None or protocol.trajectory.mask_rule is None:
        return []
    groups: dict[tuple, list[dict]] = {}
    for cell in expand(protocol):
        rec = records[cell.key]
        if "saved_mask" in rec:
            groups.setdefault((cell.model, cell.criterion, "inverse" if cell.inverse else "order"), []).append(rec)
    out = []
    for (model, criterion, order), recs in groups.items():
        trajs = [Trajectory.from_json(r["trajectory"]) for r in recs]
        steps = [r["saved_mask"]["step"] for r in recs]
        sizes = [r["saved_mask"]["size"] for r in recs]
        out.append({"model": model, "criterion": criterion, "order": order, "repeats": len(recs),
                    "rule": recs[0]["saved_mask"]["rule"], "metric": trajs[0].metric,
                    "ratio": float(np.mean([r["saved_mask"]["ratio"] for r in recs])),
                    "before": float(np.mean([t.values()[0] for t in trajs])),
                    "after": float(np.mean([t.values()[i] for t, i in zip(trajs, steps)])),
                    **{k: float(np.mean([s[k] for s in sizes])) for k in SIZE_KEYS},
                    # every rule's point (the saved one and the other), mean ratio over repeats: the rules every
                    # repeat's record names (one protocol's records name the same ones)
                    "points": {k: float(np.mean([r["saved_mask"]["points"][k]["ratio"] for r in recs]))
                               for k in recs[0]["saved_mask"].get("points", {})
                               if all(k in r["saved_mask"].get("points", {}) for r in recs)}})
    return out


def sections_markdown(averages: list[dict], papers: list[dict], sizes: list[dict] = ()) -> str:
    """The Average (and % vs) table, the paper | ours | delta table and the saved masks' sizes, as markdown
    sections (empty: none)."""
    text = ""
    if sizes:
        rules = list(sizes[0].get("points", {}))   # both points' ratios beside the saved one's
        text += (f"\n## The saved masks ({sizes[0]['rule']}): {sizes[0]['metric']} and size (MB, fp32) before / "
                 "after\n\n| model | criterion | order | repeats | pruned ratio | "
                 + "".join(f"{k} point ratio | " for k in rules) + "before | after | params before | "
                 "params after | MB before | MB after | size reduction |\n|" + "---|" * (12 + len(rules)) + "\n")
        for r in sizes:
            text += (f"| {r['model']} | {r['criterion']} | {r['order']} | {r['repeats']} | {r['ratio']:.4f} | "
                     + "".join(f"{r['points'][k]:.4f} | " for k in rules) +
                     f"{r['before']:.4f} | {r['after']:.4f} | {r['params_before']:,.0f} | {r['params_after']:,.0f} | "
                     f"{r['mb_before']:.2f} | {r['mb_after']:.2f} | {r['reduction_pct']:.2f}% |\n")
    if averages:
        extra = [k for k in averages[0] if k.startswith("% vs")]
        keys = ["criterion", "sparsity"] + (["stage"] if "stage" in averages[0] else [])
        text += "\n## Average over models (each model's headline metric)\n\n| " + " | ".join(
            keys + ["models", "average"] + extra) + " |\n|" + "---|" * (len(keys) + 2 + len(extra)) + "\n"
        for r in averages:
            shown = [f"{r[k]:g}" if k == "sparsity" else str(r[k]) for k in keys]
            percent = [_num(r[k], "+.2f") + ("%" if r[k] is not None else "") for k in extra]
            text += "| " + " | ".join(shown + [str(r["models"]), _num(r["average"])] + percent) + " |\n"
    if papers:
        text += ("\n## The paper's values beside ours\n\n| model | criterion | sparsity | metric | paper | ours | Δ | "
                 "cited |\n|---|---|---|---|---|---|---|---|\n")
        for r in papers:
            text += (f"| {r['model']} | {r['criterion']} | {r['sparsity']:g} | {r['metric']} | {_num(r['paper'])} | "
                     f"{_num(r['ours'])} | {_num(r['delta'], '+.4f')} | {r['cite']} |\n")
    return text


# -- plots (optional: plotly is the dashboard extra) -----------------------------------------------------------

def write_plots(protocol: Protocol, records: dict[str, dict], rows: list[dict], out: Path) -> tuple[list[str], list]:
    """One figure per model (HTML, and PNG where kaleido can render); (files written, notes of what was skipped).

    ``headprune.viz`` is imported only here and only when plotly is installed: the library and the CLI run
    without the dashboard extra (pyproject's "only headprune.viz draws" contract), so it is looked up by name."""
    if importlib.util.find_spec("plotly") is None:
        return [], ["plots skipped: plotly is not installed (pip install 'headprune[dashboard]')"]
    viz = importlib.import_module("headprune.viz")
    written, notes = [], []
    for entry in protocol.models:
        mine = [c for c in expand(protocol) if c.model == entry.name]
        if protocol.kv is not None:   # metric vs share of full key/value heads, a curve per rule (random: the band)
            dense = records[mine[0].key]
            metric = adapter.headline_of(Task(dense["task"]), entry, *eval_of(dense))
            points = [{"criterion": r["criterion"], "sparsity": r["full_share"], "mean": r[metric][0],
                       "sd": r[metric][1]} for r in rows if r["model"] == entry.name and r["criterion"] != DENSE]
            fig = viz.sparsity_figure(points, metric, dense["metrics"].get(metric),
                                      x_title="key/value heads keeping the whole cache (%)")
        elif protocol.trajectory is None:
            dense = records[mine[0].key]
            metric = adapter.headline_of(Task(dense["task"]), entry, *eval_of(dense))
            points = [{"criterion": r["criterion"] + (" (recovered)" if r.get("stage") == RECOVERED else ""),
                       "sparsity": r[REACHED][0] if r["sparsity"] == TOLERANCE else r["sparsity"],
                       "mean": r[metric][0],
                       "sd": r[metric][1]} for r in rows if r["model"] == entry.name and r["criterion"] != DENSE
                      and metric in r]
            fig = viz.sparsity_figure(points, metric, dense["metrics"].get(metric))
        else:
            trajs = [Trajectory.from_json(records[c.key]["trajectory"]) for c in mine]
            random = [t for t in trajs if t.criterion == "random"]
            boxes = [{**spread(random), "name": f"random ({len(random)} orders)"}] if len(random) > 1 else []
            fig = viz.trajectory_figure([t for t in trajs if t not in random or not boxes], boxes)
        stem = out / "plots" / slug(entry.name)
        write_atomic(stem.with_suffix(".html"), viz.figure_html(fig))
        written.append(str(stem.with_suffix(".html").relative_to(out)))
        try:
            write_atomic(stem.with_suffix(".png"), viz.figure_png(fig))
            written.append(str(stem.with_suffix(".png").relative_to(out)))
        except RuntimeError as exc:   # kaleido needs a local Chrome: the HTML stands alone
            notes.append(f"{entry.name}: PNG skipped ({exc})")
    return written, notes


# -- the entry point -------------------------------------------------------------------------------------------

def run_protocol(protocol: Protocol, out: str | Path, *, memory_budget=None, progress: Progress | None = None,
                 say: Say | None = None, plots: bool = True, force: bool = False) -> dict:
    """Run every cell of ``protocol`` not yet finished in ``out``, then write the table, plots and run file.

    Parameters
    ----------
    protocol : a validated Protocol (``Protocol.read``).
    out : the results folder (created): new, empty, or one a run of this protocol (its name) wrote, marked by
        ``outdir.MARKER``; cells already there with the same settings are not recomputed.
    memory_budget : overrides the protocol's (``headprune.model.memory.resolve_budget``'s forms).
    progress : ``(fraction, message)`` over the whole run; an exception it raises (``errors.Cancelled``) stops the
        run after the cells finished so far, which stay written.
    say : where lines for the user go (the estimate, before the bar).
    plots : write the figures (skipped with a note without plotly).
    force : write into a folder that is not this protocol's (a user's, another run's): only the files this run
        names are written, none other is deleted.

    Returns
    -------
    The run file's summary: paths written, cells computed and read, the table rows.
    """
    out = check_out(out, protocol, force)
    runner = Runner(protocol, out, memory_budget, progress, say)   # checks the lm-eval tasks: nothing written yet
    try:
        outdir.claim_results_folder(out, identity(protocol))
    except OutError as exc:
        raise RunError(str(exc)) from None
    clear_stale(out, protocol)
    runner.run()
    return merge(protocol, out, computed=runner.computed, memory_budget=runner.budget, plots=plots)


def pool_note(protocol: Protocol) -> str:
    """Said under the table for each sap-cf criterion at target sparsities: which pool CF filtered
    (``sap.pool_rule``), and whose construction it is (criteria/sap.py module doc, §3.4)."""
    if not any(s > 0 for s in protocol.sparsities):
        return ""
    notes = []
    for c in protocol.criteria:
        if c.name != "sap-cf" or c.params.get("sparsity", None) == 0:
            continue
        pool, cf_pool = c.params.get("pool", 0.0), c.params.get("cf_pool", "widened")
        said = f"\n> **{c.label} at a target sparsity s:** CF's candidate pool is {pool_rule(0.5, pool, cf_pool)}"
        if pool > 0:
            notes.append(said + ".\n")
        elif cf_pool == "paper":
            notes.append(said + ", at the R SAP used for s (R lowered from `ratio` until s of the heads qualify, "
                         "§4.1). The paper gives CF a tolerance, not a target: pruning the first s of CF's ranking "
                         "is headprune's reading.\n")
        else:
            notes.append(said + ". The paper's CF (§3.4) filters SAP's own candidates (cnt ≥ S·R) under a "
                         "tolerance and gives no target mode; `cf_pool = \"paper\"` filters SAP's own candidates "
                         "at each target, `params = { sparsity = 0, tolerance = τ }` runs the paper's tolerance "
                         "mode, `pool = P` sets another pool.\n")
    return "".join(notes)


def left_out(protocol: Protocol, records: dict[str, dict | None]) -> list[tuple[str, str]]:
    """(what, why) for each model whose protocol lists a stability measure its task cannot give: a language model or
    a regression head gives no answers to compare (``cells.answering``), so the table leaves the measure out of that
    model's rows -- said under the table and in the run file's notes, not silent (a protocol naming only such
    measures gets rows without a metric, and these words)."""
    said = []
    for entry in protocol.models:
        asked = [m for m in entry.metrics if m in STABILITY_METRICS]
        kinds = sorted({r["task"] for r in records.values() if r is not None and r["model"] == entry.name
                        and not adapter.answering(Task(r["task"]))})
        if asked and kinds:
            said.append((f"{', '.join(asked)} not reported for {entry.name}",
                         f"its task is {' / '.join(kinds)}, which gives no answers to compare; the stability "
                         "measures need a classifier or multiple choice"))
    return said


def left_out_note(protocol: Protocol, records: dict[str, dict | None]) -> str:
    """``left_out`` as Markdown under the table."""
    return "".join(f"\n> **{what}:** {why}.\n" for what, why in left_out(protocol, records))


def records_of(protocol: Protocol, out: Path) -> dict[str, dict | None]:
    """Every cell's record in ``out`` by key (None: not finished for this protocol's settings)."""
    entries = {m.name: m for m in protocol.models}
    return {cell.key: finished(out, protocol, entries[cell.model], cell) for cell in expand(protocol)}


def merge(protocol: Protocol, out: str | Path, *, computed: list[str] = (), memory_budget=None,
          plots: bool = True) -> dict:
    """The table, plots and run file of ``out`` built from its cell files (``headprune run --merge``): the end of
    every run, and a step of its own after shards computed the cells elsewhere. A cell missing is a RunError."""
    out = Path(out)
    if (out / "recovery").is_dir() and not any((out / "recovery").iterdir()):   # every recovered cell written
        (out / "recovery").rmdir()
    records = records_of(protocol, out)
    missing = [key for key, record in records.items() if record is None]
    if missing:
        failures = [f for f in (read_failure(out, key) for key in missing) if f is not None]
        why = f" {len(failures)} of them failed, the first with: {failures[0].get('error', '?')}." if failures else ""
        raise RunError(f"{out} lacks {len(missing)} of the protocol's {len(records)} cells ({', '.join(missing[:3])}"
                       f"{', ...' if len(missing) > 3 else ''}).{why} Run the protocol (or its missing shards) to "
                       f"finish them; `headprune run --status {out}` shows which are running, failed or pending.")
    rows, columns = table_rows(protocol, records)
    write_atomic(out / "results.csv", table_csv(rows, columns))
    averages, papers = average_rows(protocol, records, rows), paper_rows(protocol, rows)
    sizes = size_rows(protocol, records)
    table = (table_markdown(rows, columns) + sections_markdown(averages, papers, sizes) + pool_note(protocol)
             + left_out_note(protocol, records))
    write_atomic(out / "results.md", table)
    plotted, notes = write_plots(protocol, records, rows, out) if plots else ([], ["plots not asked for"])
    notes = notes + [f"{what}: {why}" for what, why in left_out(protocol, records)]
    first = {m.name: next(r for r in records.values() if r["model"] == m.name) for m in protocol.models}
    models = [{**m.to_json(), **first[m.name]["loaded"], "roles": first[m.name]["roles"]} for m in protocol.models]
    run = {"protocol": {"source": protocol.source, "sha256": protocol.hash, "text": protocol.text,
                        "parameters": protocol.to_json()},
           "models": models, "versions": versions(),
           "memory_budget": memory_budget if memory_budget is not None else protocol.memory_budget,
           "computed": list(computed), "reused": [k for k in records if k not in computed],
           "table": {"columns": columns, "rows": [{k: list(v) if isinstance(v, tuple) else v for k, v in r.items()}
                                                   for r in rows], "average": averages, "paper": papers,
                     "sizes": sizes},
           "plots": plotted, "notes": notes, "cells": records}
    write_atomic(out / "run.json", as_json(run))
    return {"out": str(out), "results": ["results.csv", "results.md"], "plots": plotted, "notes": notes,
            "cells": len(records), "computed": len(computed), "reused": len(run["reused"]),
            "table": table}
