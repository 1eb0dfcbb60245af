"""The one place a protocol run calls the data, metric and scoring APIs: switch these functions, nothing else.

Every call the runner (``headprune.protocol.run``) makes into data roles, metric sets and criteria goes through
the functions below, so the APIs being built next to this one (data roles: ``Workspace.build(calib_data=,
select_data=, eval_data=)`` and ``ws.roles()``; metric sets: ``metric_set(task, source)``, ``headline(task,
metric)``; SAP's best k) replace them here in one place:

    build_workspace_for   the calibration and evaluation rows of one model and repeat (today: each role read with
                          ``data.load_data``, drawn with a seed, batched with ``make_batches``; calibration and
                          evaluation drawn disjointly when they name the same source). The selection role is
                          recorded but not used yet.
    rows_hash             sha256 of a role's rows (``data.content_hash`` once it exists)
    task_metrics          the metrics a table reports (today: the task kind's; ``metric_set`` later)
    headline_of           the headline metric (today: ``Task.headline``; ``headline(task, metric)`` later)
    score_cell            a criterion's ScoreMap (a criterion with a ``sparsity`` parameter, SAP, is scored at the
                          cell's sparsity unless the protocol fixed it)
    cell_seed             the seed of a cell's scoring (random: independent masks per sparsity)
    mask_at               the mask of a ScoreMap at a sparsity (``kept_at``; SAP's best k and layer rule later)
    evaluate_cell         the metrics of the model under a mask on the evaluation rows
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data import TextDataset, align_labels, calibration_texts, load_data, make_batches
from ..errors import DataError
from ..evaluation.metrics import evaluate
from ..model.loading import LoadedModel, load_model
from ..model.mask import HeadMask
from ..model.task import Task, task_of
from ..scoring import ScoreMap, ScoringContext
from .spec import ModelEntry, Protocol, Role

Progress = Callable[[float, str], None]

# the metrics of each task kind a table reports when the protocol names none (metric_set(task, source) at merge)
TASK_METRICS = {"classification": ("accuracy", "macro_f1", "mcc"), "regression": ("pearson", "spearman"),
                "lm": ("perplexity", "next_token_accuracy", "loss")}


@dataclass
class CellData:
    """What one (model, repeat) computes on: the rows of each role, their batches, and the task."""

    calib: TextDataset
    eval: TextDataset
    calib_batches: list[dict]
    eval_batches: list[dict]
    task: Task
    roles: dict = field(default_factory=dict)   # role -> {source, size, seed, hash, used}

    def calib_texts(self) -> list:
        return calibration_texts(self.calib, self.calib_batches)


def load_model_for(entry: ModelEntry, protocol: Protocol) -> LoadedModel:
    """The model of ``entry`` on the protocol's device and dtype."""
    return load_model(entry.model, protocol.device, dtype=protocol.dtype)


def rows_hash(ds: TextDataset) -> str:
    """sha256 over the rows (text, pair, label) in order: the same rows give the same hash."""
    digest = hashlib.sha256()
    for i in range(len(ds)):
        row = [ds.texts[i], None if ds.pairs is None else ds.pairs[i], None if ds.labels is None else ds.labels[i]]
        digest.update(json.dumps(row, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return digest.hexdigest()


def _draw(ds: TextDataset, role: Role, name: str, seed: int, exclude: np.ndarray | None = None) -> np.ndarray:
    """Row indices of ``role``: ``role.size`` rows (all when None) of a seeded permutation, ``exclude`` left out."""
    rows = np.random.default_rng(seed).permutation(len(ds))
    if exclude is not None:
        rows = rows[~np.isin(rows, exclude)]
    if role.size is not None and role.size > len(rows):
        raise DataError(f"data.{name}.size = {role.size}: {role.source} has only {len(rows)} rows for the "
                        f"{name} role{' (the evaluation rows are left out)' if exclude is not None else ''}. "
                        f"Accepted: a size of at most {len(rows)}.")
    return rows if role.size is None else rows[:role.size]


def build_workspace_for(loaded: LoadedModel, entry: ModelEntry, protocol: Protocol, repeat: int,
                        cache: dict | None = None) -> CellData:
    """The calibration and evaluation rows of ``entry`` for ``repeat`` (module doc).

    The evaluation rows are the same in every repeat (seed ``eval.seed``); the calibration rows are re-drawn per
    repeat (seed ``calib.seed + repeat``), disjoint from the evaluation rows when both roles name one source.
    ``cache`` keeps the data sets read (a run reads each source once).
    """
    cache = {} if cache is None else cache
    task = task_of(loaded.model, None)

    def read(role: Role) -> TextDataset:
        key = (role.source, role.text_col, role.pair_col, role.label_col, task.kind)
        if key not in cache:
            ds = load_data(role.source, role.text_col, role.pair_col, role.label_col,
                           task="lm" if task.is_lm else "classification")
            cache[key] = align_labels(ds, loaded.id2label)
        return cache[key]

    calib_role, eval_role = entry.data["calib"], entry.data["eval"]
    evals_all, calib_all = read(eval_role), read(calib_role)
    eval_rows = _draw(evals_all, eval_role, "eval", eval_role.seed)
    same = calib_role.source == eval_role.source
    calib_rows = _draw(calib_all, calib_role, "calib", calib_role.seed + repeat, eval_rows if same else None)
    calib, evals = calib_all.subset(calib_rows), evals_all.subset(eval_rows)
    batches = [make_batches(loaded.tokenizer, part, protocol.batch_size, protocol.max_length)
               for part in (calib, evals)]
    roles = {"calib": {**calib_role.to_json(), "seed": calib_role.seed + repeat, "rows": len(calib),
                       "hash": rows_hash(calib), "used": True},
             "eval": {**eval_role.to_json(), "rows": len(evals), "hash": rows_hash(evals), "used": True}}
    if "select" in entry.data:   # read by the data-roles API (HIES's α, SAP's k, stopping rules); not yet used
        roles["select"] = {**entry.data["select"].to_json(), "used": False}
    return CellData(calib, evals, batches[0], batches[1], task, roles)


def task_metrics(task: Task, entry: ModelEntry) -> tuple[str, ...]:
    """The metrics the table reports for ``entry``: the protocol's, else the task kind's set."""
    return entry.metrics or TASK_METRICS[task.kind]


def headline_of(task: Task, entry: ModelEntry) -> str:
    """The metric plots and trajectories read: the protocol's headline, else the task's."""
    return entry.headline or task.headline


def scoring_context(loaded: LoadedModel, data: CellData, seed: int, progress: Progress | None,
                    memory_budget) -> ScoringContext:
    """One context per (model, repeat): criteria sharing a pass (``shares_pass``) share it through its cache."""
    return ScoringContext(loaded.model, data.calib_batches, None, loaded.device, loaded.tokenizer,
                          data.calib_texts(), seed=seed, progress=progress, memory_budget=memory_budget)


def scored_params(crit, params: dict, sparsity: float | None) -> dict:
    """The parameters a criterion is scored with in a cell: a ``sparsity`` parameter (SAP's target) follows the
    cell's sparsity unless the protocol set it."""
    if sparsity is not None and "sparsity" in crit.params and "sparsity" not in params:
        return {**params, "sparsity": sparsity}
    return dict(params)


def cell_seed(crit, seed: int, sparsity: float | None) -> int:
    """The seed a criterion scores a cell with: the repeat's ``seed``; the random baseline draws an independent
    mask at every sparsity (a seed of its own per (repeat, sparsity)), not nested masks of one order."""
    if crit.name != "random" or sparsity is None:
        return seed
    return int(np.random.SeedSequence([seed, round(sparsity * 1_000_000)]).generate_state(1)[0])


def score_cell(ctx: ScoringContext, crit, params: dict, sparsity: float | None) -> ScoreMap:
    return crit(ctx, scored_params(crit, params, sparsity))


def mask_at(scores: ScoreMap, sparsity: float) -> HeadMask:
    """The mask a cell evaluates: the heads ``scores`` keeps once ``round(sparsity * N)`` grid heads are pruned
    (``ScoreMap.kept_at``; SAP's layer rule joins here when its API gives the mask at a sparsity)."""
    return HeadMask(torch.from_numpy(scores.kept_at(sparsity)).to(torch.float32))


def evaluate_cell(loaded: LoadedModel, data: CellData, mask: HeadMask | None, progress: Progress | None,
                  memory_budget) -> dict:
    """Every metric of the task on the evaluation rows, the model gated by ``mask`` (None: as loaded)."""
    return evaluate(loaded.model, data.eval_batches, mask, progress=progress, task=data.task,
                    memory_budget=memory_budget).to_dict()
