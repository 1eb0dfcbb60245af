"""The one place a protocol run calls the data, metric and scoring APIs.

Every call a protocol run (``headprune.protocol.run``'s runner and ``compute``'s cell computer) makes into data
roles, metric sets and criteria goes through the functions below:

    build_workspace_for   the calibration, selection and evaluation rows of one model and repeat: one
                          ``Workspace.build`` per model with the protocol's seed (roles sharing a source are
                          disjoint subsets of one permutation of it), then ``ws.calibration_draw(repeat)``: the
                          evaluation and selection rows stay, the calibration rows are re-drawn per repeat outside
                          the evaluation rows. ``ws.roles()`` is recorded, with the repeat's calibration hash.
    task_metrics          the metrics a table reports (``metric_set(task, eval source)``: GLUE's for a GLUE name;
                          the protocol's list, where "task" stands for that set and "agreement" / "stability"
                          are the stability measures of ``evaluation.stability``, evaluated by ``evaluate_cell``)
    headline_of           the headline metric (``headline(task, metric, eval source)``)
    scoring_context       the criteria's context: calibration batches, choices (HIES's α, SAP's k) made on the
                          selection batches
    score_cell            a criterion's ScoreMap (a criterion with a ``sparsity`` parameter, SAP, is scored at the
                          cell's sparsity unless the protocol fixed it)
    cell_seed             the seed of a cell's scoring (random: independent masks per sparsity)
    mask_at               the mask of a ScoreMap at a sparsity (``kept_at``; for SAP and SAP+CF their own
                          selection at that sparsity with SAP's best k there, and the layers the layer rule drops;
                          for a sap-cf tolerance cell the mask CF's tolerance reached; for Kwon et al. its
                          rearranged mask with the tuned scales)
    evaluate_cell         the metrics of the model under a mask (those layers skipped) on the evaluation rows,
                          with the model's lm-eval numbers ("lm-eval:TASK/METRIC") from one lm-eval run
    harness_tasks         a model's lm-eval tasks checked against lm-eval's index, with their data, before any
                          model loads (``evaluation.harness.resolve_tasks``); ``check_data=False``: the names only
                          (``run --plan``, offline)
    check_roles           every role's source read and its size fitted as ``workspace_for`` fits it, before any
                          model loads (``run --plan``: the sizes a run refuses, refused by the plan)
    harness_at            a trajectory's lm-eval numbers at its reported ratios (``trajectory.measure_points``)
    train_rows            recovery's training rows (``[data.train]``): a seeded draw with the protocol's seed of the
                          rows of its source that are not evaluation rows (compared by content hash)
    recover               ``recovery.recover_cell`` on a cell's mask: the pruned model trained on the train rows,
                          evaluated dense / pruned / recovered on the cell's evaluation rows
    kv_scores             a [kv] rule's query-head scores for one repeat (``kvcache.scores.head_scores``: duo and
                          criteria on the repeat's calibration rows, razor on probes and random by the repeat's seed)
    kv_plan               the cache plan keeping a share of the key/value groups full (``plan_from_scores``)
    evaluate_under_plan   the task's metrics on the evaluation rows with the plan's streaming heads restricted to
                          sink + window (a private copy: ``kvcache.restricted``), and the plan's KV bytes counted
                          at the protocol's ``max_length`` against the full cache's (``kvcache.tasks.bytes_at``)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..criteria.kwon import kwon_mask
from ..criteria.sap import OWN_SELECTION
from ..data import (
    TextDataset,
    align_labels,
    calibration_texts,
    check_source,
    content_hash,
    load_data,
    parse_hf_spec,
    row_hashes,
)
from ..errors import DataError
from ..evaluation.harness import Tasks, harness_metrics, is_harness_metric, resolve_tasks
from ..evaluation.metrics import evaluate, headline, metric_set
from ..evaluation.stability import (
    DEFAULT_DROP,
    STABILITY_METRICS,
    answers,
    dense_agreement,
    perturb_batches,
    stability,
)
from ..kvcache.plan import KVPlan, check_decoder
from ..kvcache.restrict import restricted
from ..kvcache.scores import head_scores, plan_from_scores
from ..kvcache.tasks import bytes_at
from ..model.layers import skip_layers
from ..model.loading import LoadedModel, load_model
from ..model.mask import HeadMask
from ..model.task import Task
from ..recovery import recover_cell
from ..scoring import ScoreMap, ScoringContext
from ..trajectory import Trajectory, measure_points
from ..workspace import DEFAULT_CALIB_SIZE, DEFAULT_SELECT_SIZE, DefaultSize, Workspace, fit_role_sizes
from .spec import TASK_SET, ModelEntry, Protocol

Progress = Callable[[float, str], None]


@dataclass
class CellData:
    """What one (model, repeat) computes on: the rows of each role, their batches, and the task."""

    calib: TextDataset
    eval: TextDataset
    calib_batches: list[dict]
    eval_batches: list[dict]
    task: Task
    roles: dict = field(default_factory=dict)   # role -> {source, split, size, seed, hash, used}
    select_batches: list[dict] = field(default_factory=list)   # where choices are made; []: the calibration rows
    eval_source: str | None = None              # the evaluation role's data spec (GLUE names pick GLUE's metrics)
    n_classes: int | None = None                # the classifier's outputs (f1 applies to two only)
    dense_answers: np.ndarray | None = None     # the loaded model's answers on the evaluation rows (agreement)
    perturbed: list | None = None               # the evaluation batches with words dropped (stability)

    def calib_texts(self) -> list:
        return calibration_texts(self.calib, self.calib_batches)


def load_model_for(entry: ModelEntry, protocol: Protocol) -> LoadedModel:
    """The model of ``entry`` on the protocol's device and dtype."""
    return load_model(entry.model, protocol.device, dtype=protocol.dtype)


def workspace_for(loaded: LoadedModel, entry: ModelEntry, protocol: Protocol) -> Workspace:
    """The model's workspace: every role read once, split with the protocol's seed (roles on one source disjoint).

    A role's ``size`` is kept exactly; no size ("all") is every row left for evaluation and the workspace's
    default (shrinking to fit) for calibration and selection; no ``[data.select]`` role carves no selection rows
    (choices are then made on the calibration rows)."""
    roles = entry.data
    calib, evals, select = roles["calib"], roles["eval"], roles.get("select")
    sizes = wanted_sizes(entry)
    return Workspace.build(
        entry.model, evals.source, calib_data=calib.source, eval_data=evals.source,
        select_data=select.source if select else None, calib_size=sizes["calib"], eval_size=sizes["eval"],
        select_size=sizes.get("select", 0), seed=protocol.seed, loaded=loaded, batch_size=protocol.batch_size,
        max_length=protocol.max_length, **entry.columns(), label_map=entry.label_map,
        labels_by_position=entry.labels_by_position, allow_untrained_head=entry.allow_untrained_head)


def wanted_sizes(entry: ModelEntry) -> dict:
    """The size the workspace is asked for each role of ``entry`` (module doc of ``workspace_for``): a role's
    ``size`` exactly; none is every row left for evaluation and a default shrinking to fit for calibration and
    selection; no selection role, no key "select"."""
    roles = entry.data
    wanted = {"calib": roles["calib"].size if roles["calib"].size is not None else DefaultSize(DEFAULT_CALIB_SIZE),
              "eval": roles["eval"].size}
    if "select" in roles:
        wanted["select"] = roles["select"].size if roles["select"].size is not None else \
            DefaultSize(DEFAULT_SELECT_SIZE)
    return wanted


def build_workspace_for(loaded: LoadedModel, entry: ModelEntry, protocol: Protocol, repeat: int,
                        cache: dict | None = None) -> CellData:
    """The rows of ``entry`` for ``repeat`` (module doc): the evaluation and selection rows of the model's
    workspace, the calibration rows of ``ws.calibration_draw(repeat)``. ``cache`` keeps the workspace per model
    (a run reads each source once)."""
    cache = {} if cache is None else cache
    key = (entry.name, entry.model)
    if key not in cache:
        cache[key] = workspace_for(loaded, entry, protocol)
    ws = cache[key]
    calib, calib_batches = ws.calibration_draw(repeat)
    roles = ws.roles()
    roles["calib"] |= {"size": len(calib), "hash": content_hash(calib), "repeat": repeat}
    for role in roles:
        roles[role]["used"] = bool(roles[role]["size"])
    return CellData(calib, ws.eval, calib_batches, ws.eval_batches, ws.task, roles, list(ws.select_batches),
                    ws.sources["eval"], ws.n_classes)


def task_metrics(task: Task, entry: ModelEntry, eval_source: str | None, n_classes: int | None
                 ) -> tuple[str, ...]:
    """The metrics the table reports for ``entry``: the protocol's, else the task's set for the evaluation source
    (``metric_set``: GLUE's for a data spec naming a GLUE task; f1 only for two classes); "task" in the protocol's
    list stands for that set. The stability measures only where the task gives answers (``answering``): a
    regression head's row leaves them out."""
    own = metric_set(task, eval_source, n_classes=n_classes)
    names = [m for name in (entry.metrics or (TASK_SET,)) for m in (own if name == TASK_SET else (name,))]
    return tuple(dict.fromkeys(m for m in names if m not in STABILITY_METRICS or answering(task)))


def answering(task: Task) -> bool:
    """Whether the task's model gives answers the stability measures compare (a class, a picked choice)."""
    return task.kind in ("classification", "multiple_choice")


def headline_of(task: Task, entry: ModelEntry, eval_source: str | None, n_classes: int | None) -> str:
    """The metric plots and trajectories read: the protocol's headline (an lm-eval number only for sparsity cells,
    ``Protocol._check_harness``; a stability measure only when the protocol reports it), else GLUE's or the task's
    (``headline``)."""
    if is_harness_metric(entry.headline or ""):
        return entry.headline
    reported = tuple(m for m in entry.metrics if m in STABILITY_METRICS)
    return headline(task, entry.headline, eval_source, n_classes=n_classes, extra=reported)


def scoring_context(loaded: LoadedModel, data: CellData, seed: int, progress: Progress | None,
                    memory_budget) -> ScoringContext:
    """One context per (model, repeat): criteria sharing a pass (``shares_pass``) share it through its cache;
    choices (HIES's α, SAP's k) are made on the selection batches (the calibration batches when there are none)."""
    return ScoringContext(loaded.model, data.calib_batches, None, loaded.device, loaded.tokenizer,
                          data.calib_texts(), seed=seed, progress=progress, memory_budget=memory_budget,
                          select=data.select_batches or None)


def scored_params(crit, params: dict, sparsity: float | None) -> dict:
    """The parameters a criterion is scored with in a cell: a ``sparsity`` parameter (SAP's target) follows the
    cell's sparsity unless the protocol set it; a ``budget`` (Kwon et al.'s share of heads kept) is 1 − sparsity."""
    if sparsity is not None and "sparsity" in crit.params and "sparsity" not in params:
        return {**params, "sparsity": sparsity}
    if sparsity is not None and "budget" in crit.params and "budget" not in params and sparsity < 1:
        return {**params, "budget": round(1 - sparsity, 12)}
    return dict(params)


def cell_seed(crit, seed: int, sparsity: float | None) -> int:
    """The seed a criterion scores a cell with: the repeat's ``seed``; the random baseline draws an independent
    mask at every sparsity (a seed of its own per (repeat, sparsity)), not nested masks of one order."""
    if crit.name != "random" or sparsity is None:
        return seed
    return int(np.random.SeedSequence([seed, round(sparsity * 1_000_000)]).generate_state(1)[0])


def score_cell(ctx: ScoringContext, crit, params: dict, sparsity: float | None) -> ScoreMap:
    return crit(ctx, scored_params(crit, params, sparsity))


def mask_at(scores: ScoreMap, sparsity: float | None) -> tuple[HeadMask, list[int]]:
    """The mask a cell evaluates and the layers it drops whole.

    For ``sap`` scored at the cell's sparsity (``scored_params``): SAP's own selection at that sparsity with its
    best k (chosen on the selection rows) and its layer rule, as ``SAP.per_sparsity(ctx, [sparsity])`` gives it
    (the ScoreMap's ``sap_mask`` / ``sap_dropped_layers`` are that result: one parse and sweep, kept in the score
    file). For ``sap-cf`` likewise CF's own selection (``mask`` / ``dropped_layers``): at the cell's sparsity its
    target mode, and for a tolerance cell (``sparsity`` None: ``sparsity = 0`` in the protocol's params) the mask
    its tolerance reached. For ``kwon`` scored at budget 1 − sparsity: its rearranged mask with the tuned scales
    (``kwon_mask``). Otherwise the heads ``scores`` keeps once ``round(sparsity * N)`` grid heads are pruned
    (``kept_at``)."""
    tuned = kwon_mask(scores, sparsity) if sparsity is not None else None
    if tuned is not None:
        return tuned, []
    keys = OWN_SELECTION.get(scores.criterion)
    own = sparsity if sparsity is not None else 0.0
    if keys and float(scores.params.get("sparsity", -1)) == own and keys[0] in scores.meta:
        mask = HeadMask.from_json(scores.meta[keys[0]], scores.shape)
        return mask, [int(layer) for layer in scores.meta.get(keys[1], [])]
    if sparsity is None:
        raise ValueError(f"'{scores.criterion}' scores hold no selection of their own; a cell without a sparsity "
                         "is a tolerance cell of sap-cf (params sparsity = 0).")
    return HeadMask(torch.from_numpy(scores.kept_at(sparsity)).to(torch.float32)), []


def evaluate_cell(loaded: LoadedModel, data: CellData, mask: HeadMask | None, progress: Progress | None,
                  memory_budget, dropped_layers: list[int] | tuple = (), harness: tuple | None = None,
                  stable: tuple[str, ...] = (), seed: int = 0) -> dict:
    """Every metric of the task on the evaluation rows, the model gated by ``mask`` (None: as loaded) and
    ``dropped_layers`` skipped (SAP's layer rule, as ``headprune evaluate`` reads it from a mask file); with
    ``harness`` = (lm-eval metric names, their ``Tasks``), those numbers too, from one lm-eval run on the same mask
    and layers (lm-eval reads its task's own rows, not the evaluation role's); with ``stable`` (names of
    ``STABILITY_METRICS``), those on the same rows (``stability_metrics``, word drop seeded by ``seed``)."""
    stable = stable if answering(data.task) else ()
    if "agreement" in stable and data.dense_answers is None:   # the model as loaded: no layer skipped
        data.dense_answers = answers(loaded.model, data.eval_batches, None, loaded.device)
    with skip_layers(loaded.adapter, dropped_layers):
        metrics = evaluate(loaded.model, data.eval_batches, mask, progress=progress, task=data.task,
                           memory_budget=memory_budget).to_dict()
        if stable:
            metrics |= stability_metrics(loaded, data, mask, stable, seed)
    if harness:
        names, tasks = harness
        metrics |= harness_metrics(loaded.model, loaded.tokenizer, mask, names, tasks=tasks, progress=progress,
                                   dropped_layers=dropped_layers)
    return metrics


def stability_metrics(loaded: LoadedModel, data: CellData, mask: HeadMask | None, names: tuple[str, ...],
                      seed: int) -> dict:
    """The stability measures ``names`` of the model under ``mask`` on the evaluation rows (``evaluation.stability``
    module doc, percent): "agreement" with ``data.dense_answers`` (the answers of the model as loaded, which
    ``evaluate_cell`` records once per ``data`` before any layer is skipped), and "stability", answers kept under a
    word drop of ``DEFAULT_DROP`` seeded by ``seed`` (drawn once per ``data``)."""
    out = {}
    if "agreement" in names:
        out["agreement"] = dense_agreement(loaded.model, data.eval_batches, mask, loaded.device, data.dense_answers)
    if "stability" in names:
        if data.perturbed is None:
            data.perturbed = perturb_batches(data.eval_batches, loaded.tokenizer, DEFAULT_DROP, seed)
        out["stability"] = stability(loaded.model, data.eval_batches, data.perturbed, mask, loaded.device)
    return out


def harness_tasks(protocol: Protocol, entry: ModelEntry, check_data: bool = True) -> tuple | None:
    """(lm-eval metric names, resolved ``Tasks``) of ``entry``, checked with their data (``check_data``) before any
    model loads (an unknown task or one whose data cannot load is a HarnessError naming it); None when it reports
    none."""
    spec = protocol.harness_spec(entry)
    return None if spec is None else (entry.harness_metrics, resolve_tasks(spec, check_data=check_data))


def check_roles(entry: ModelEntry, lm: bool | None) -> list[str]:
    """Every data role of ``entry`` checked as a run checks it before its first cell, without a model: the source
    exists, it reads, and the sizes of the roles on it fit its rows (``workspace.fit_role_sizes``, the run's rule;
    the train role's size against its source less nothing: the evaluation rows are taken out once the run reads
    them). ``lm``: whether the model is a language model (None: unknown, read as its data says). A problem is a
    ProtocolError naming the key and its line. Returns notes on what could not be checked offline (hf: sources)."""
    notes = []
    task = None if lm is None else ("lm" if lm else "classification")
    sizes: dict[str, dict] = {}
    for role, size in wanted_sizes(entry).items():   # grouped by source, as the workspace reads them
        sizes.setdefault(entry.data[role].source, {})[role] = size
    if "train" in entry.data:
        sizes.setdefault(entry.data["train"].source, {})
    for source, roles in sizes.items():
        named = [r for r in entry.data if entry.data[r].source == source]
        where = entry.data[(list(roles) or named)[-1]]
        try:
            check_source(source)
            if source.startswith("hf:") and not Path(parse_hf_spec(source)[0]).expanduser().is_dir():
                notes.append(f"{source}: a Hugging Face data set, read (and its rows counted) when the run starts")
                continue
            rows = len(load_data(source, **entry.columns(), task=task, role=named[0]))
        except DataError as exc:
            raise where.fail("source", f"{source}: {exc}") from None
        try:
            if roles:
                fit_role_sizes(rows, roles)
            train = entry.data.get("train")
            if train is not None and train.source == source and train.size is not None and train.size > rows:
                where = train
                raise DataError(f"Train size {train.size} does not fit: its data has only {rows} rows.")
        except DataError as exc:
            raise where.fail("size", f"{source}: {exc}") from None
    return notes


def harness_at(loaded: LoadedModel, traj: Trajectory, ratios, harness: tuple[tuple, Tasks],
               progress: Progress | None) -> None:
    """The lm-eval numbers of ``harness`` at the trajectory's ``ratios`` (the last step at or below each) and at its
    start, into ``traj.points`` (``measure_points``: one lm-eval run per distinct mask)."""
    names, tasks = harness
    measure_points([traj], list(ratios), names,
                   lambda mask: harness_metrics(loaded.model, loaded.tokenizer, mask, names, tasks=tasks),
                   progress=progress)


def train_rows(loaded: LoadedModel, entry: ModelEntry, protocol: Protocol, data: CellData) -> TextDataset:
    """The rows recovery trains on: ``[data.train]``'s source without the evaluation rows (by content hash, so a
    train role on the evaluation source never trains on what is reported), a seeded draw of ``size`` (the protocol's
    seed; None: every row left), labels aligned to the model's as the other roles' are."""
    role = entry.data["train"]
    ds = load_data(role.source, **entry.columns(), task="lm" if data.task.is_lm else "classification", role="train")
    if not data.task.is_lm:
        ds = align_labels(ds, loaded.id2label, label_map=entry.label_map, by_position=entry.labels_by_position)
    held = set(row_hashes(data.eval))
    free = np.flatnonzero([h not in held for h in row_hashes(ds)])
    if role.size is not None and role.size > len(free):
        raise role.fail("size", f"{role.size} training rows asked for, but {role.source} has only {len(free)} rows "
                                f"outside the evaluation rows. Accepted: at most {len(free)}, or \"all\".")
    order = np.random.default_rng(protocol.seed).permutation(free)
    return ds.subset(np.sort(order[:role.size] if role.size is not None else order))


def recover(loaded: LoadedModel, data: CellData, train: TextDataset, mask: HeadMask, protocol: Protocol,
            work_dir, progress: Progress | None, memory_budget) -> dict:
    """A recovered cell's result: ``recover_cell`` (the loaded model is copied, never trained in place) on the
    train rows, then {"metrics": the recovered model's metric set on the cell's evaluation rows, "stages": dense /
    pruned / recovered, "recovery": method, spec, steps, losses, training seconds, the train role}. An interrupted
    run resumes from the last checkpoint in ``work_dir``; ``progress`` may raise ``Cancelled``."""
    role = {"source": train.source, "split": train.split, "size": len(train), "seed": protocol.seed,
            "hash": content_hash(train)}
    result, record = recover_cell(protocol.recovery, loaded.model, loaded.tokenizer, mask, train, data.eval_batches,
                                  work_dir=work_dir, task=data.task, roles={"train": role}, progress=progress,
                                  resume=True, memory_budget=memory_budget)
    return {"metrics": record["metrics"]["recovered"], "stages": record["metrics"],
            "recovery": {k: record[k] for k in ("method", "spec", "mode", "steps", "train_seconds", "losses")}
            | {"train": role}}


def kv_scores(loaded: LoadedModel, data: CellData, kv, rule: str, seed: int) -> np.ndarray:
    """(L, H) query-head scores of the [kv] table ``kv``'s ``rule`` for one repeat (``seed``: seed + repeat)."""
    check_decoder(loaded.adapter)   # a hub id's family is known only once loaded (a named one was refused before)
    return head_scores(rule, loaded.model, calib=data.calib_batches, tokenizer=loaded.tokenizer, sink=kv.sink,
                       window=kv.window, seed=seed, probe_rows=kv.probe_rows)


def kv_plan(loaded: LoadedModel, kv, scores: np.ndarray, share: float, meta: dict) -> KVPlan:
    """The plan keeping ``share`` of the key/value groups full, the highest group scores (``kv.group``: max or mean
    of a group's query heads), the rest streaming at ``kv.sink`` / ``kv.window``."""
    return plan_from_scores(scores, loaded.adapter.n_kv_heads, share, kv.sink, kv.window, kv.group, meta)


def evaluate_under_plan(loaded: LoadedModel, data: CellData, plan: KVPlan, progress: Progress | None,
                        memory_budget, length: int) -> tuple[dict, dict]:
    """(the task's metrics under ``plan`` on the evaluation rows, KV bytes at ``length`` tokens: full cache, plan,
    ratio). The loaded model is never changed (the plan runs on a private copy)."""
    with restricted(loaded.model, plan, loaded.adapter) as model:
        metrics = evaluate(model, data.eval_batches, None, progress=progress, task=data.task,
                           memory_budget=memory_budget).to_dict()
    return metrics, bytes_at(loaded.model, plan, length)
