"""A protocol expanded into cells, each with the work it costs, without the network and without loading weights.

Cells (one result each, resumable one by one):
    sparsities    per model: one ``dense`` cell (the model as loaded, sparsity 0), then
                  criterion x sparsity (> 0) x repeat; a criterion in its tolerance mode (sap-cf with
                  ``sparsity = 0``: ``CriterionEntry.tolerance_cells``) one ``tolerance`` cell per repeat instead
    trajectory    per model: criterion x order (inverse or not) x repeat; the random criterion runs one order
                  ``max(repeats, random_boxes)`` times (independent random orders: the boxes per ratio)
    kv            per model: one ``dense`` cell (every head keeps its whole cache), then rule x full share x repeat
                  ([kv]: the task's metrics under the rule's cache plan at that share)

Work is counted in row-passes: one forward pass over one row (``Criterion.work`` passes over the calibration rows
for scoring, ``Criterion.selection_work`` over the selection rows -- the calibration rows without a ``select`` role
-- for the choices made there: SAP's k sweep, candidate filtering's evaluations; one pass over the evaluation rows
per evaluation; a trajectory step re-evaluates about half the model,
``estimate.LIVE_STEP``). A cell scored once for several sparsities counts its scoring in the first of them. Where
a model's config is on this machine (a folder, a built demo, a hub id in the local cache) the grid is known and
a random-initialised copy of the model (no weights read) times one forward pass (``estimate.forward_rate``),
turning row-passes into seconds: an upper bound, each row counted at ``max_length`` tokens (or the model's
context when shorter).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, AutoModelForCausalLM

from ..criteria import get
from ..estimate import LIVE_STEP, forward_rate, human_duration
from ..evaluation.harness import metric_tasks
from ..kvcache.duo import DEFAULTS as DUO_DEFAULTS
from ..model.arch import adapt
from ..model.loading import NAMED_MODELS, auto_class, folder_config, model_source_kind, shell_model
from ..model.memory import plan_for
from ..scoring import ScoringContext
from .cells import check_roles, harness_tasks, scored_params
from .spec import ModelEntry, Protocol, slug

DENSE = "dense"
RECOVERED = "recovered"
TOLERANCE = "tolerance"   # a criterion's own stop (sap-cf's tolerance mode): the sparsity is its result
KV = "kv"          # a cache plan's cell ([kv]): a rule at a share of key/value heads kept full
TRAIN_PASS = 3   # a training step's row-pass: forward + backward, about three forwards
TEACHER_PASS = 1   # distillation adds the frozen teacher's forward to every training row
TIMED_PARAMETERS = 600_000_000   # larger local models are not instantiated to time a pass (memory)


@dataclass(frozen=True)
class Cell:
    """One result: a model's dense metrics, a criterion at a sparsity, or one trajectory; for one repeat."""

    model: str                       # ModelEntry.name
    criterion: str                   # CriterionEntry.label, or "dense"
    repeat: int = 0
    sparsity: float | None = None    # sparsity cells
    inverse: bool | None = None      # trajectory cells
    recovered: bool = False          # the sparsity cell's model trained back ([recovery]): its own cell
    tolerance: bool = False          # a criterion's tolerance mode (sap-cf, sparsity = 0): its own sparsity
    full_share: float | None = None  # kv cells: the share of key/value heads keeping the whole cache

    @property
    def kind(self) -> str:
        if self.recovered:
            return RECOVERED
        if self.full_share is not None:
            return KV
        if self.tolerance:
            return TOLERANCE
        return DENSE if self.criterion == DENSE else ("trajectory" if self.inverse is not None else "sparsity")

    @property
    def pruned(self) -> Cell:
        """The sparsity (or tolerance) cell a recovered cell starts from (its mask)."""
        return Cell(self.model, self.criterion, self.repeat, sparsity=self.sparsity, tolerance=self.tolerance)

    @property
    def key(self) -> str:
        """A stable file name: ``demo__his__s0.25__r1`` (a tolerance cell: ``demo__sap-cf__tol__r0``)."""
        what = f"s{self.sparsity:g}" if self.sparsity is not None else "tol" if self.tolerance else \
            f"f{self.full_share:g}" if self.full_share is not None else \
            ("inverse" if self.inverse else "order") if self.inverse is not None else ""
        parts = [self.model, self.criterion] + ([what] if what else []) + [f"r{self.repeat}"]
        return "__".join(slug(p) for p in parts + (["recovered"] if self.recovered else []))

    def to_json(self) -> dict:
        out = {**asdict(self), "kind": self.kind, "key": self.key}
        for flag in ("recovered", "tolerance", "full_share"):   # a cell's record (and fingerprint) as before the
            if out[flag] is None or out[flag] is False:             # field existed (full share 0 is kept)
                del out[flag]
        return out


def expand(protocol: Protocol) -> list[Cell]:
    """Every cell of ``protocol`` in run order (model by model; repeats outer, so a repeat's scoring is shared)."""
    cells = []
    for entry in protocol.models:
        if protocol.kv is not None:
            cells.append(Cell(entry.name, DENSE))
            cells += [Cell(entry.name, rule, r, full_share=share) for r in range(protocol.repeats)
                      for rule in protocol.kv.rules for share in protocol.kv.full_shares]
            continue
        if protocol.trajectory is None:
            cells.append(Cell(entry.name, DENSE))
            stages = (False, True) if protocol.recovery is not None else (False,)
            cells += [Cell(entry.name, c.label, r, sparsity=s, recovered=rec) for r in range(protocol.repeats)
                      for c in protocol.criteria if not c.tolerance_cells
                      for s in protocol.sparsities if s > 0 for rec in stages]
            cells += [Cell(entry.name, c.label, r, recovered=rec, tolerance=True) for r in range(protocol.repeats)
                      for c in protocol.criteria if c.tolerance_cells for rec in stages]
            continue
        traj = protocol.trajectory
        for c in protocol.criteria:
            if c.name == "random":
                cells += [Cell(entry.name, c.label, r, inverse=False)
                          for r in range(max(protocol.repeats, traj.random_boxes))]
            else:
                cells += [Cell(entry.name, c.label, r, inverse=inv) for r in range(protocol.repeats)
                          for inv in traj.inverse]
        if traj.random_boxes and not any(c.name == "random" for c in protocol.criteria):
            cells += [Cell(entry.name, "random", r, inverse=False) for r in range(traj.random_boxes)]
    return cells


# -- what a model is, offline ------------------------------------------------------------------------------------

def local_config(spec: str):
    """The model's config if it is on this machine (no network, no weights), else None.

    A named model (a demo) is located by its build function, which returns at once when it is built (and builds
    it offline otherwise); a hub id is looked up in the local Hugging Face cache only.
    """
    kind = model_source_kind(spec)
    try:
        if kind == "named":
            return AutoConfig.from_pretrained(str(NAMED_MODELS[spec].build()))
        if kind == "folder":   # read by the one safe reader first: a FIFO, /dev/zero, a list model_type refused
            folder_config(Path(spec).expanduser())
            return AutoConfig.from_pretrained(str(Path(spec).expanduser()))
        return AutoConfig.from_pretrained(spec, local_files_only=True)
    except (OSError, ValueError, StrictDataclassError):   # an invalid config.json: load_model names it
        return None


@dataclass
class ModelPlan:
    """The work of one model's cells (module doc)."""

    entry: ModelEntry
    kind: str                        # "named" | "folder" | "hub"
    cells: list[Cell]
    grid: tuple[int, int] | None = None
    calib_row_passes: float | None = None
    select_row_passes: float = 0.0   # choices on the selection rows (Criterion.selection_work: SAP's k, CF)
    eval_row_passes: float | None = None
    train_row_passes: float = 0.0    # recovery: rows x epochs x (TRAIN_PASS + TEACHER_PASS if distilled)
    seconds: float | None = None
    note: str = ""
    lm_eval_runs: int = 0            # lm-eval metrics: one run per cell (per reported ratio and start: trajectory)

    def to_json(self) -> dict:
        return {"name": self.entry.name, "model": self.entry.model, "source": self.kind,
                "grid": list(self.grid) if self.grid else None, "cells": len(self.cells),
                "calib_row_passes": self.calib_row_passes, "select_row_passes": self.select_row_passes,
                "eval_row_passes": self.eval_row_passes,
                "train_row_passes": self.train_row_passes, "lm_eval_runs": self.lm_eval_runs,
                "seconds": self.seconds, "estimate": self.text(), "note": self.note}

    def text(self) -> str:
        if not self.lm_eval_runs:
            return self._work()
        tasks = ", ".join(metric_tasks(self.entry.harness_metrics))
        return f"{self._work()}; + {self.lm_eval_runs} lm-eval runs of {tasks} (timed when the run starts)"

    def _work(self) -> str:
        if self.calib_row_passes is None:
            return self.note
        passes = f"{self.calib_row_passes:,.0f} calibration + " + \
            (f"{self.select_row_passes:,.0f} selection + " if self.select_row_passes else "") + \
            f"{self.eval_row_passes:,.0f} evaluation" + \
            (f" + {self.train_row_passes:,.0f} training" if self.train_row_passes else "") + " row-passes"
        if self.seconds is None:
            return f"{passes}{'; ' + self.note if self.note else ''}"
        return f"{passes}: at most {human_duration(self.seconds)} (one random-initialised forward timed)"


def _rows(role) -> int | None:
    return role.size


def recovery_rows(protocol: Protocol, entry: ModelEntry) -> int:
    """Rows one recovered cell trains on: epochs x the train role's rows, or steps x batch size."""
    spec = protocol.recovery
    if spec.steps is not None:
        return spec.steps * spec.batch_size
    return spec.epochs * (entry.data["train"].size or 0)


def lm_eval_runs(protocol: Protocol, entry: ModelEntry, cells: list[Cell]) -> int:
    """lm-eval runs ``cells`` make for ``entry``'s lm-eval metrics (at most: points on one step share a run): one per
    dense or sparsity cell, one per reported ratio and the start for a trajectory; none on recovered cells."""
    if not entry.harness_metrics:
        return 0
    return sum(len(protocol.trajectory.report_at) + 1 if c.kind == "trajectory" else 1
               for c in cells if c.kind != RECOVERED)


def plan_model(protocol: Protocol, entry: ModelEntry, cells: list[Cell], time_it: bool = True) -> ModelPlan:
    """The work of ``entry``'s cells; the grid and seconds where its config is on this machine (module doc)."""
    kind = model_source_kind(entry.model)
    plan = ModelPlan(entry, kind, cells)
    plan.lm_eval_runs = lm_eval_runs(protocol, entry, cells)
    config = local_config(entry.model)
    # what a run checks before its first cell, checked here too: lm-eval task names (offline), the data files and
    # the role sizes against their sources' rows
    harness_tasks(protocol, entry, check_data=False)
    notes = check_roles(entry, None if config is None else auto_class(config) is AutoModelForCausalLM)
    plan.note = "; ".join(notes)
    if config is None:
        plan.note = "; ".join([f"the estimate needs the model: {entry.model} is a hub id whose config is not on "
                               "this machine (the run downloads it)"] + notes)
        return plan
    shell = shell_model(config)
    adapter = adapt(shell)
    plan.grid = adapter.grid_shape
    n_calib, n_eval = _rows(entry.data["calib"]), _rows(entry.data["eval"])
    n_select = _rows(entry.data["select"]) if "select" in entry.data else n_calib   # ScoringContext.selection
    if None in (n_calib, n_eval, n_select) or ("train" in entry.data and entry.data["train"].size is None):
        plan.note = "; ".join(["a role of every row ('all'): its size is known once the data is read"] + notes)
        return plan
    ctx = ScoringContext(shell, [], memory_budget=protocol.memory_budget)
    units = plan.grid[0] * plan.grid[1]
    calib = select = evals = 0.0
    scored = set()
    for cell in cells:
        if cell.kind == DENSE:
            evals += n_eval
            continue
        if cell.kind == KV:   # the rule scored once per repeat (``kv_work``), one evaluation under each plan
            calib += 0 if (cell.criterion, cell.repeat) in scored else n_calib * kv_work(ctx, cell.criterion, n_calib)
            scored.add((cell.criterion, cell.repeat))
            evals += n_eval
            continue
        if cell.kind == RECOVERED:   # train, then dense / pruned / recovered evaluated (recover_cell)
            per_row = TRAIN_PASS + (TEACHER_PASS if protocol.recovery.distill else 0)
            plan.train_row_passes += per_row * recovery_rows(protocol, entry)
            evals += 3 * n_eval
            continue
        entry_c = next((c for c in protocol.criteria if c.label == cell.criterion), None)
        crit = entry_c.criterion if entry_c is not None else get("random")   # random boxes
        params = scored_params(crit, dict(entry_c.params) if entry_c else {}, cell.sparsity)
        resolved = crit.resolve_params(params)
        work, select_work = crit.work(ctx, resolved), crit.selection_work(ctx, resolved)
        if cell.kind in ("sparsity", TOLERANCE):
            key = (cell.criterion, cell.repeat, params.get("sparsity") if "sparsity" in crit.params else None)
            if key not in scored:
                calib += n_calib * work
                select += n_select * select_work
            scored.add(key)
            evals += n_eval
            continue
        traj = protocol.trajectory
        steps = math.ceil(traj.spec(crit, params, False, 0, None).target(units, 0) / traj.step)
        rescored = max(steps, 1) / 2 if crit.dynamic else 1
        calib += n_calib * work * rescored
        select += n_select * select_work * rescored
        evals += n_eval * (1 + LIVE_STEP * steps)
    plan.calib_row_passes, plan.select_row_passes, plan.eval_row_passes = calib, select, evals
    n_params = sum(p.numel() for p in shell.parameters())
    if not time_it:
        return plan
    if n_params > TIMED_PARAMETERS:
        plan.note = "; ".join([f"seconds need the model ({n_params / 1e9:.1f} B parameters are not instantiated to "
                               "time a pass)"] + notes)
        return plan
    length = min(protocol.max_length, getattr(config, "max_position_embeddings", None) or protocol.max_length)
    model = _random_init(config)
    # the rows the memory planner lets one forward hold, never batch_size x length tokens built first
    rows = plan_for(model, protocol.memory_budget).rows("forward", length, protocol.batch_size)
    per_token, _ = forward_rate(model, [_synthetic_batch(rows, length)], protocol.memory_budget)
    plan.seconds = per_token * length * (calib + select + evals + plan.train_row_passes)
    return plan


def kv_work(ctx: ScoringContext, rule: str, n_calib: int = 1) -> float:
    """Passes over the calibration rows a KV rule's scores cost: far-mass one (attention captured layer by layer),
    razor about one (its probes, counted as calibration rows), duo its training (``duo.DEFAULTS``: steps x batch
    rows, each a reference forward, a gated forward and a backward, about three passes, over the calibration rows'
    count), random none, a criterion its own ``work``."""
    if rule in ("far-mass", "razor"):
        return 1.0
    if rule == "duo":
        rows = max(1, n_calib)
        return 3.0 * DUO_DEFAULTS["steps"] * DUO_DEFAULTS["batch_size"] / rows
    if rule == "random":
        return 0.0
    crit = get(rule)
    return crit.work(ctx, crit.resolve_params({}))


def _random_init(config):
    torch.manual_seed(0)
    return auto_class(config).from_config(config).eval()


def _synthetic_batch(rows: int, length: int) -> dict:
    """A batch of ``rows`` x ``length`` tokens (token 1 everywhere: the cost of a forward does not depend on ids)."""
    return {"input_ids": torch.ones(rows, length, dtype=torch.long),
            "attention_mask": torch.ones(rows, length, dtype=torch.long)}


def plan(protocol: Protocol, time_it: bool = True) -> list[ModelPlan]:
    """The cells of ``protocol`` grouped by model, each group with its work (module doc)."""
    cells = expand(protocol)
    return [plan_model(protocol, entry, [c for c in cells if c.model == entry.name], time_it)
            for entry in protocol.models]
