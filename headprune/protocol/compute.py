"""One cell of a protocol computed from its inputs: the runner (``headprune.protocol.run``) schedules, this computes.

A :class:`CellComputer` is built once per model x repeat with what the runner loaded (the model, the repeat's data
rows, the model's lm-eval tasks) and the run's settings (protocol, results folder, memory budget); it owns the
repeat's caches, and :meth:`CellComputer.compute` turns one cell into ``(result, mask, dropped layers)``:

    dense        the metrics of the model as loaded
    sparsity     the criterion's ScoreMap of the repeat (one per criterion, parameters and seed: read from
                 ``scores/<key>.json`` when an earlier run wrote it, else scored and written there), the mask at the
                 cell's sparsity, its metrics; a tolerance cell also records the sparsity CF's tolerance reached
    recovered    the pruned cell's mask file trained back on the train rows (checkpoints in ``recovery/<key>/``
                 under the cell's fingerprint)
    trajectory   the pruning trajectory and the mask it saves (``saved_step``) with its size (``size_at``)
    kv           a [kv] rule's scores of the repeat (once per rule), the cache plan at the cell's full share
                 (written to ``plans/<key>.json``, the ``headprune kvplan`` format), the metrics under it and its
                 KV bytes at ``max_length`` tokens; no mask

Every call into data roles, metrics and criteria goes through ``cells`` (the adapter); writing the cell's file is
the runner's (``Runner.write_cell``). :func:`fingerprint` is the hash of everything that decides a cell's result,
so the runner's resume and a recovered cell's checkpoints agree on it. :meth:`CellComputer.estimate` is the
expected duration of a list of cells on the same inputs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np

from .. import outdir
from ..criteria import get
from ..errors import HeadpruneError
from ..estimate import (
    TimeEstimate,
    device_name,
    estimate_harness,
    estimate_trajectory,
    forward_rate,
    scoring_tokens,
    tokens,
)
from ..model.mask import HeadMask
from ..outdir import OutError
from ..scoring import ScoreMap
from ..trajectory import Trajectory, run_trajectory
from . import cells as adapter
from .cells import Progress
from .claims import read_folder_value
from .plan import DENSE, KV, RECOVERED, TOLERANCE, TRAIN_PASS, Cell, kv_work, lm_eval_runs, recovery_rows, slug
from .spec import CriterionEntry, ModelEntry, Protocol, TrajectoryPart


class RunError(HeadpruneError):
    pass


def write_atomic(path: Path, text: str | bytes) -> None:
    """``text`` to ``path`` whole or not at all (``outdir.write_atomic``); a failure is a RunError."""
    try:
        outdir.write_atomic(path, text, "--out folder")
    except OutError as exc:
        raise RunError(str(exc)) from exc


def as_json(obj) -> str:
    """The text of a run's JSON files (numpy scalars as numbers, anything else unknown as its str)."""
    return json.dumps(obj, indent=1, default=lambda o: o.item() if isinstance(o, np.generic) else str(o))


def read_json(path: Path) -> dict | None:
    """The JSON object at ``path`` in a results folder, or None when it is missing, not JSON or not an object; read
    through the one safe reader (``claims.read_folder_value``: a FIFO, a device or a file past the size or nesting
    limits is a FolderError naming it)."""
    value = read_folder_value(path, "results folder's file")
    return value if isinstance(value, dict) else None


def fingerprint(protocol: Protocol, entry: ModelEntry, cell: Cell) -> str:
    """sha256 of everything that decides ``cell``'s result (``run``'s module doc); not the other cells' settings."""
    crit = next((c.to_json() for c in protocol.criteria if c.label == cell.criterion), {"name": cell.criterion})
    model = entry.to_json()
    if cell.recovered:   # what recovery trains on and how: only a recovered cell's result depends on them
        model["recovery"] = protocol.recovery.to_json()
    else:
        model["data"].pop("train", None)
    what = {"cell": cell.to_json(), "model": model, "criterion": crit, "seed": protocol.seed,
            "batch_size": protocol.batch_size, "max_length": protocol.max_length, "dtype": protocol.dtype,
            "trajectory": protocol.trajectory.to_json() if protocol.trajectory and cell.kind == "trajectory"
            else None}
    if cell.kind == KV:   # what a plan is made of (absent for other cells: their fingerprints stay as they were)
        what["kv"] = protocol.kv.to_json()
    if entry.harness_metrics:   # how lm-eval ran decides those numbers (absent otherwise: older runs still resume)
        what["lm_eval"] = {k: list(v) if isinstance(v, tuple) else v for k, v in protocol.lm_eval.items()}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode("utf-8")).hexdigest()


BYTES_PER_PARAMETER = 4   # the papers' sizes are fp32 checkpoints: Greedy-Gnorm Table 2, 102,269,955 -> 390.13 MB


def saved_step(traj: Trajectory, part: TrajectoryPart) -> tuple[int, str, dict]:
    """(step, rule, points) of the mask a trajectory cell saves: without a mask rule the stopping point
    (``stop_index``); with ``mask_rule = "tolerance"`` the last step before the metric first falls below τ x dense,
    with ``"inflection"`` Greedy-Gnorm's inflection point (``Trajectory.inflection_point``), both read on the
    selection rows when the run recorded them (``Trajectory.stop_values``), else on the evaluation rows. ``points``:
    every rule's point (step, ratio, value on those rows), the saved one and the other, so both are reported."""
    if part.mask_rule is None:
        return traj.stop_index(), "stop", {}
    rows = "selection" if traj.select_dense and all("select_metrics" in s for s in traj.steps) else "evaluation"
    values, ratios = traj.stop_values(), traj.ratios()
    steps = {"inflection": traj.inflection_point(**part.inflection_params())}
    if part.mask_tolerance is not None:
        steps["tolerance"] = traj.point_at_ratio(traj.tolerance_ratio(part.mask_tolerance))
    points = {k: {"step": i, "ratio": float(ratios[i]), "value": float(values[i])} for k, i in steps.items()}
    if part.mask_rule == "inflection":
        p = part.inflection_params()
        rule = (f"inflection point: the last step before a drop of over {p['drop']:g} x dense {traj.metric} within "
                f"{p['window']:g} of the grid, on the {rows} rows")
    else:
        rule = f"last step within {part.mask_tolerance:g} x dense {traj.metric} on the {rows} rows"
    return steps[part.mask_rule], rule, points


def size_at(traj: Trajectory, index: int) -> dict:
    """Parameters and MB (fp32, 2^20 bytes) of the model as loaded and cut to the mask of step ``index``
    (``parameters_left`` as each step recorded it), as Greedy-Gnorm's Tables 1-5 report them."""
    before = int(traj.dense["params"])
    after = int(traj.steps[index - 1]["params"]) if index else before
    mb = [p * BYTES_PER_PARAMETER / 2 ** 20 for p in (before, after)]
    return {"params_before": before, "params_after": after, "mb_before": mb[0], "mb_after": mb[1],
            "reduction_pct": 100.0 * (1 - after / before)}


class CellComputer:
    """The cells of one model x repeat computed from their inputs (module doc).

    ``loaded`` is the model (``cells.load_model_for``), ``data`` the repeat's rows (``cells.build_workspace_for``),
    ``model_cache`` a dict shared by the model's repeats (its workspace, recovery's train rows: one draw per model),
    ``harness`` the model's lm-eval tasks (``cells.harness_tasks``; None: none), ``budget`` the memory budget."""

    def __init__(self, protocol: Protocol, out: Path, entry: ModelEntry, loaded, data, repeat: int,
                 model_cache: dict, harness, budget):
        self.protocol, self.out, self.entry, self.loaded, self.data = protocol, out, entry, loaded, data
        self.model_cache, self.harness, self.budget = model_cache, harness, budget
        self.seed = protocol.seed + repeat
        self.contexts: dict[int, object] = {}   # one per seed: criteria sharing a pass share it through its cache
        self.scores: dict[tuple, ScoreMap] = {}
        self.kv_scores: dict[str, np.ndarray] = {}   # a [kv] rule's query-head scores of this repeat

    def criterion_of(self, cell: Cell) -> CriterionEntry | None:
        return next((c for c in self.protocol.criteria if c.label == cell.criterion), None)

    def compute(self, cell: Cell, progress: Progress) -> tuple[dict, HeadMask | None, list[int]]:
        """(result fields of the cell's record, its mask or None for a dense cell, the layers its mask skips)."""
        if cell.kind == DENSE:
            return {"metrics": self.evaluate(None, progress)}, None, []
        if cell.kind == RECOVERED:
            return self.recovered(cell, progress)
        if cell.kind in ("sparsity", TOLERANCE):
            return self.sparsity(cell, progress)
        if cell.kind == KV:
            return self.kv(cell, progress)
        return self.trajectory(cell, progress)

    def kv(self, cell: Cell, progress: Progress) -> tuple[dict, None, list[int]]:
        """The rule's plan at the cell's full share (module doc): one scoring per rule and repeat, the plan file
        written under ``plans/``, the metrics under the plan and its bytes."""
        kv = self.protocol.kv
        if cell.criterion not in self.kv_scores:
            self.kv_scores[cell.criterion] = adapter.kv_scores(self.loaded, self.data, kv, cell.criterion, self.seed)
        meta = {"rule": cell.criterion, "full_share": cell.full_share, "model": self.entry.model,
                "repeat": cell.repeat, "seed": self.seed, "calib_hash": self.data.roles["calib"]["hash"]}
        plan = adapter.kv_plan(self.loaded, kv, self.kv_scores[cell.criterion], cell.full_share, meta)
        path = self.out / "plans" / f"{cell.key}.json"
        write_atomic(path, as_json(plan.to_json()))
        metrics, counted = adapter.evaluate_under_plan(self.loaded, self.data, plan, progress, self.budget,
                                                       self.protocol.max_length)
        return {"metrics": metrics, "kv_plan": str(path.relative_to(self.out)), "full_kv_heads": int(plan.full.sum()),
                "kv_heads": plan.full.numel(), "full_kv_head_ids": plan.head_ids()["full_kv_heads"],
                "sink": plan.sink, "window": plan.window, "kv_bytes": {"length": self.protocol.max_length,
                                                                       **counted}}, None, []

    def evaluate(self, mask: HeadMask | None, progress: Progress, dropped: list[int] | tuple = ()) -> dict:
        return adapter.evaluate_cell(self.loaded, self.data, mask, progress, self.budget, dropped,
                                     harness=self.harness, stable=self.entry.metrics, seed=self.protocol.seed)

    def sparsity(self, cell: Cell, progress: Progress) -> tuple[dict, HeadMask, list[int]]:
        c = self.criterion_of(cell)
        params = adapter.scored_params(c.criterion, dict(c.params), cell.sparsity)
        seed = adapter.cell_seed(c.criterion, self.seed, cell.sparsity)
        key = (cell.criterion, json.dumps(params, sort_keys=True, default=str), seed)
        if key not in self.scores:
            if seed not in self.contexts:
                self.contexts[seed] = adapter.scoring_context(self.loaded, self.data, seed, None, self.budget)
            self.scores[key] = self.scores_of(self.contexts[seed], c, params, cell, progress)
        mask, dropped = adapter.mask_at(self.scores[key], cell.sparsity)
        metrics = self.evaluate(mask, progress, dropped)
        reached = {"sparsity_reached": mask.n_pruned / mask.values.numel()} if cell.kind == TOLERANCE else {}
        return {"metrics": metrics, "scores": str(self.score_file(cell, params, seed).relative_to(self.out)),
                "score_params": self.scores[key].params, "score_seed": seed, **reached}, mask, dropped

    def score_file(self, cell: Cell, params: dict, seed: int) -> Path:
        tag = hashlib.sha256(json.dumps([params, seed], sort_keys=True, default=str).encode()).hexdigest()[:10]
        return self.out / "scores" / f"{slug(cell.model)}__{slug(cell.criterion)}__r{cell.repeat}__{tag}.json"

    def scores_of(self, ctx, c: CriterionEntry, params: dict, cell: Cell, progress: Progress) -> ScoreMap:
        """The criterion's ScoreMap for this repeat: read from ``scores/`` when an earlier run wrote it for the
        same model, criterion, parameters, rows, seed and batching, else scored and written."""
        path = self.score_file(cell, params, ctx.seed)
        stamp = {"model": self.entry.model, "criterion": c.name,
                 "params": json.loads(json.dumps(params, default=str)),
                 "calib_hash": self.data.roles["calib"]["hash"], "select_hash": self.data.roles["select"]["hash"],
                 "seed": ctx.seed, "batch_size": self.protocol.batch_size,
                 "max_length": self.protocol.max_length, "dtype": self.protocol.dtype}
        saved = read_json(path)
        if saved and saved.get("stamp") == stamp:
            try:
                return ScoreMap.from_json(saved)
            except (KeyError, TypeError, ValueError, AttributeError):   # an edited file: scored again, replaced
                pass
        ctx.progress = progress
        scores = adapter.score_cell(ctx, c.criterion, params, None)
        ctx.progress = None
        write_atomic(path, as_json({**scores.to_json(), "stamp": stamp}))
        return scores

    def recovered(self, cell: Cell, progress: Progress) -> tuple[dict, HeadMask, list[int]]:
        """The pruned cell's mask (its mask file: written before, or by an earlier run) recovered on the train rows
        (``adapter.recover``); checkpoints in ``recovery/<key>/`` until the cell is written, kept only for a run
        with the same fingerprint (a changed setting starts the training over)."""
        pruned = self.out / "masks" / f"{cell.pruned.key}.json"
        saved = read_json(pruned)
        if saved is None:
            raise RunError(f"{pruned} is missing or unreadable: the recovered cell {cell.key} starts from its pruned "
                           "cell's mask. Delete cells/ entries of that cell to recompute it.")
        mask = HeadMask.from_json(saved, self.loaded.adapter.grid_shape)
        if "train" not in self.model_cache:   # one draw per model: the evaluation rows do not change between repeats
            self.model_cache["train"] = adapter.train_rows(self.loaded, self.entry, self.protocol, self.data)
        work = self.out / "recovery" / cell.key
        stamp = fingerprint(self.protocol, self.entry, cell)
        recorded = read_json(work / "fingerprint.json")
        if work.exists() and recorded is None and any(work.iterdir()):   # not a folder a run made: never deleted
            raise RunError(f"{work} exists but holds no fingerprint.json of a recovered cell; it is left as it is. "
                           "Move it away to recompute the cell.")
        if (recorded or {}).get("fingerprint") != stamp:
            shutil.rmtree(work, ignore_errors=True)
            write_atomic(work / "fingerprint.json", as_json({"fingerprint": stamp}))
        result = adapter.recover(self.loaded, self.data, self.model_cache["train"], mask, self.protocol, work / "run",
                                 progress, self.budget)
        dropped = [int(layer) for layer in saved.get("dropped_layers", [])]
        if cell.tolerance:
            result["sparsity_reached"] = mask.n_pruned / mask.values.numel()
        if dropped:   # SAP's layer rule skips whole layers; recovery trains the heads' mask only
            result["note"] = (f"the pruned cell also skips layers {dropped} (SAP's layer rule); recovery trained "
                              "and evaluated the head mask with those layers kept")
        return result, mask, []

    def trajectory(self, cell: Cell, progress: Progress) -> tuple[dict, HeadMask, list[int]]:
        c, data, loaded = self.criterion_of(cell), self.data, self.loaded
        crit, params = (c.criterion, dict(c.params)) if c else (get("random"), {})
        spec = self.protocol.trajectory.spec(crit, params, bool(cell.inverse), self.seed,
                                             adapter.headline_of(data.task, self.entry, data.eval_source,
                                                                 data.n_classes))
        traj = run_trajectory(spec, loaded.model, data.calib_batches, data.eval_batches, tokenizer=loaded.tokenizer,
                              texts=data.calib_texts(), device=loaded.device, progress=progress,
                              memory_budget=self.budget, select=data.select_batches or None)
        if self.harness:   # lm-eval numbers at the reported ratios only (one lm-eval run each)
            adapter.harness_at(loaded, traj, self.protocol.trajectory.report_at, self.harness, progress)
        # Algorithm 1's M: the heads left at the stopping point (after a tolerance stop, the last step within it,
        # read on the selection rows when there are some), as `trajectory --save-mask stop` writes it; with
        # mask_tolerance the run goes on to the end and the rule picks the step afterwards (saved_step)
        index, rule, points = saved_step(traj, self.protocol.trajectory)
        return {"trajectory": traj.to_json(), "saved_mask": {"step": index, "ratio": float(traj.ratios()[index]),
                                                             "rule": rule, "size": size_at(traj, index),
                                                             **({"points": points} if points else {})}}, \
            traj.mask_at(index), []

    def estimate(self, pending: list[Cell]) -> TimeEstimate:
        """Expected duration of ``pending`` (``headprune.estimate``: one timed forward x counted passes)."""
        loaded, data, protocol, entry = self.loaded, self.data, self.protocol, self.entry
        rate = forward_rate(loaded.model, data.eval_batches, self.budget)
        per_token = rate[0]
        ctx = adapter.scoring_context(loaded, data, protocol.seed, None, self.budget)
        seconds, scored = 0.0, set()
        for cell in pending:
            if cell.kind == "trajectory":
                c = self.criterion_of(cell)
                crit, params = (c.criterion, dict(c.params)) if c else (get("random"), {})
                spec = protocol.trajectory.spec(crit, params, bool(cell.inverse), 0, None)
                seconds += estimate_trajectory(spec, loaded.model, data.calib_batches, data.eval_batches,
                                               rate=rate, memory_budget=self.budget,
                                               select=data.select_batches or None).seconds
                continue
            if cell.kind == KV and (cell.criterion, cell.repeat) not in scored:   # a rule scores once per repeat
                scored.add((cell.criterion, cell.repeat))
                seconds += per_token * tokens(data.calib_batches) * kv_work(ctx, cell.criterion)
            if cell.kind == RECOVERED:   # training (forward + backward) and three evaluations (recover_cell)
                per_row = tokens(data.eval_batches) / max(len(data.eval), 1)
                seconds += per_token * (2 * tokens(data.eval_batches)
                                        + TRAIN_PASS * per_row * recovery_rows(protocol, entry))
            seconds += per_token * tokens(data.eval_batches)
            if cell.kind not in ("sparsity", TOLERANCE):
                continue
            c = self.criterion_of(cell)
            # scored once per repeat, or once per sparsity where the criterion takes it (SAP's per-level choices),
            # as plan.plan_model counts it
            key = (cell.criterion, cell.repeat, cell.sparsity if "sparsity" in c.criterion.params else None)
            if key not in scored:
                scored.add(key)
                params = adapter.scored_params(c.criterion, dict(c.params), cell.sparsity)
                seconds += per_token * scoring_tokens(ctx, [c.name], {c.name: params})
        if self.harness:
            once = estimate_harness(loaded.model, loaded.tokenizer, self.harness[1], data.eval_batches,
                                    rate=rate, memory_budget=self.budget)
            seconds += lm_eval_runs(protocol, entry, pending) * once.seconds
        return TimeEstimate(seconds, f"protocol {protocol.name}, {len(pending)} cells of {entry.name}",
                            device_name(loaded.model), rate[1])
