"""Streaming trajectories: "stream the next head" as a step.

Starting from every key/value group full, :func:`run_stream` streams ``step`` groups at a time (sink + window, the
plan's exact restriction: ``restrict.restricted``) in the order of a rule's group scores -- lowest retrieval need
first -- and measures the task's metrics under the plan after every step (``tasks.metric_under_plan``), until at
most ``full_share`` of the live groups keep the whole cache (default 0: every group streams). The order is the
reverse of the one :func:`plan.top_share` keeps full (ties: the higher flat index streams first), so step k's plan
is the plan ``scores.plan_from_scores`` makes at full share (n - k) / n. The random baseline is the same run with
rule ``random`` (a seeded uniform score per query head, so a uniform random order of groups); one run per seed
gives the band (``trajectory.spread``).

Composed with a head mask: the masked heads stay gated off at every step (the metric is the gated model's), and
a group left with no live query head needs no cache at all, so it is neither full nor counted: it streams in
every plan (``no_cache``) and the ratios are shares of the live groups.

Why a sibling of ``trajectory.Trajectory`` and not that record: a pruning trajectory's points are head masks
(``mask_at``, parameters left, live re-evaluation from the first changed layer, re-scoring a cut copy), and its
unit is a query head; a streaming step changes no mask and no weight but the attention of a whole group, and its
point is a cache plan (:meth:`StreamTrajectory.plan_at`). The summaries are the same numbers, computed by the
same functions (``trajectory.curve_auc``, ``trajectory.tolerance_reach``), and a StreamTrajectory offers
``ratios``, ``values``, ``steps`` and ``metric`` as a Trajectory does, so ``trajectory.spread`` summarises the
random band of either.

Run file (:meth:`StreamTrajectory.to_json`): the rule and its parameters (sink, window, group reduction, probe
rows), step, seed, the grid [L, H_kv] and query heads, the group scores, the streaming ``order`` ([layer, group]
pairs: the plan at every step follows from it, :meth:`plan_at`), the groups needing no cache, the dense metrics,
every step (groups streamed, count, streamed ratio, full share, metrics, seconds), model, data, mask, versions and
the summary (auc over the streamed ratio, tolerance ratio, final full share and metric).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from ..evaluation.metrics import HIGHER_IS_BETTER, headline_metric
from ..model.arch import adapt
from ..provenance import versions
from ..trajectory import RATIO, STEPS, TOLERANCE_METRICS, curve_auc, tolerance_reach
from .plan import KVPlan, KVPlanError, check_decoder, check_full_share, check_window
from .scores import REDUCE, check_rule, group_scores, head_scores
from .tasks import metric_under_plan

FORMAT = "headprune-kv-trajectory"


@dataclass(frozen=True, kw_only=True)
class StreamSpec:
    """What a streaming trajectory streams, how, and where it stops; validated on construction (before loading).

    rule        razor, duo, random or a criterion name (``scores.RULES``): the order, lowest score first
    sink, window  what a streaming group keeps (``plan.SINK`` / ``plan.WINDOW``)
    step        groups streamed per step
    full_share  stop once at most this share of the live groups keeps the whole cache (0: every group streams)
    tolerance   optional τ the summary reports ``tolerance_ratio`` at (the run always goes to ``full_share``)
    group       a group's score from its query heads' (max or mean, ``scores.group_scores``)
    probe_rows  razor's repeated-token probes; seed: the rule's (random order, razor's probes)
    metric      the metric the summaries read (default: the task's headline)
    """

    rule: str
    sink: int = 4
    window: int = 64
    step: int = 1
    full_share: float = 0.0
    tolerance: float | None = None
    group: str = "max"
    probe_rows: int = 8
    seed: int = 0
    metric: str | None = None
    model_name: str = ""
    data_info: Mapping = field(default_factory=dict)

    def __post_init__(self):
        check_rule(self.rule)
        check_window(self.sink, self.window)
        check_full_share(self.full_share)
        if STEPS(self.step):
            raise KVPlanError(f"Step {self.step!r} must be a positive integer, at most {STEPS.high:,} (key/value "
                              "groups streamed per step).")
        if self.tolerance is not None and RATIO(self.tolerance):
            raise KVPlanError(f"Tolerance {self.tolerance!r} {RATIO(self.tolerance)}: the summary reports the "
                              "streamed share reached before the metric is worse than τ × dense.")
        if self.group not in REDUCE:
            raise KVPlanError(f"Group reduction {self.group!r} is not known; accepted: {', '.join(REDUCE)}.")
        if STEPS(self.probe_rows):
            raise KVPlanError(f"Probe rows {self.probe_rows!r} must be a positive integer.")
        if self.metric is not None and self.metric not in TOLERANCE_METRICS:
            raise KVPlanError(f"Metric '{self.metric}' is unknown; accepted: {', '.join(TOLERANCE_METRICS)}.")

    def seeded(self, seed: int) -> StreamSpec:
        return dataclasses.replace(self, seed=seed)


@dataclass
class StreamTrajectory:
    """One streaming run (module doc). ``order``: live groups in the order they stream; ``steps``: one dict per
    step with "streamed" ([layer, group] this step), "n_streamed", "ratio" (streamed share of the live groups),
    "full_share", "metrics", "seconds"."""

    rule: str
    params: dict
    step: int
    seed: int
    shape: list[int]
    n_heads: int
    metric: str
    dense: dict
    order: list = field(default_factory=list)
    no_cache: list = field(default_factory=list)
    group_scores: list = field(default_factory=list)
    steps: list = field(default_factory=list)
    tolerance: float | None = None
    model: str = ""
    data: dict = field(default_factory=dict)
    mask: list = field(default_factory=list)     # [layer, head] gated off during the run
    versions: dict = field(default_factory=dict)

    # -- the curve (read by trajectory.spread as a Trajectory's) -------------------------------------------------
    def ratios(self) -> np.ndarray:
        return np.array([0.0] + [s["ratio"] for s in self.steps])

    def full_shares(self) -> np.ndarray:
        return 1.0 - self.ratios()

    def values(self, metric: str | None = None) -> np.ndarray:
        metric = metric or self.metric
        return np.array([self.dense[metric]] + [s["metrics"][metric] for s in self.steps], dtype=float)

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER.get(self.metric, True)

    def auc(self, metric: str | None = None) -> float:
        return curve_auc(self.ratios(), self.values(metric))

    def tolerance_ratio(self, tau: float | None = None) -> float | None:
        tau = self.tolerance if tau is None else tau
        return None if tau is None else tolerance_reach(self.ratios(), self.values(), tau, self.higher_is_better)

    # -- plans ---------------------------------------------------------------------------------------------------
    def plan_at(self, index: int) -> KVPlan:
        """The plan after step ``index`` (0: every live group full): the first groups of ``order`` streamed up to
        that step, and the groups needing no cache."""
        if not 0 <= index <= len(self.steps):
            raise KVPlanError(f"Step {index} is not in this run: it has steps 0..{len(self.steps)}.")
        return self.plan_streaming(self.steps[index - 1]["n_streamed"] if index else 0)

    def plan_streaming(self, n: int) -> KVPlan:
        """The plan with the first ``n`` groups of ``order`` (and the groups needing no cache) streaming."""
        full = torch.ones(self.shape, dtype=torch.bool)
        for layer, group in list(self.no_cache) + list(self.order[:n]):
            full[layer, group] = False
        return KVPlan(full, self.n_heads, self.params["sink"], self.params["window"],
                      {"rule": self.rule, "n_streamed": n, "seed": self.seed})

    # -- files ---------------------------------------------------------------------------------------------------
    def summary(self) -> dict:
        return {"auc": self.auc(), "tolerance_ratio": self.tolerance_ratio(), "final_ratio": float(self.ratios()[-1]),
                "final_full_share": float(self.full_shares()[-1]), "final_metric": float(self.values()[-1]),
                "n_steps": len(self.steps)}

    def to_json(self) -> dict:
        return {"format": FORMAT, **asdict(self), "summary": self.summary()}

    @classmethod
    def from_json(cls, obj: dict) -> StreamTrajectory:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


def stream_order(grouped: np.ndarray, live: np.ndarray) -> list[list[int]]:
    """Live groups of ``grouped`` (L, H_kv) scores in streaming order: the reverse of ``top_share``'s keep order
    (score high first, ties lower flat index first), so the lowest score streams first."""
    flat = np.nan_to_num(grouped, nan=-np.inf).ravel()
    keep_first = sorted(range(flat.size), key=lambda i: (-float(flat[i]), i))
    n_kv = grouped.shape[1]
    return [[i // n_kv, i % n_kv] for i in reversed(keep_first) if live.ravel()[i]]


def live_groups(model, mask=None) -> np.ndarray:
    """Bool (L, H_kv): groups with a query head left (neither cut out nor gated off by ``mask``)."""
    adapter = adapt(model)
    live = adapter.live_grid()
    if mask is not None:
        live = live & mask.keep_bool()
    return live.view(live.shape[0], adapter.n_kv_heads, -1).any(-1).numpy()


def run_stream(spec: StreamSpec, model, calib: list[dict], eval_batches: list[dict], *, tokenizer=None, mask=None,
               scores: np.ndarray | None = None, progress=None) -> StreamTrajectory:
    """Stream ``model``'s groups as ``spec`` says (module doc) and return the run. ``calib``: the rows duo and
    criteria score on; ``eval_batches``: where the metric is measured; ``mask``: heads gated off throughout;
    ``scores``: precomputed (L, H) query-head scores of ``spec.rule`` (skips scoring). ``model`` is never changed
    (each plan runs on a private copy). ``progress(fraction, message)`` after every step."""
    adapter = adapt(model)
    check_decoder(adapter)
    if scores is None:
        scores = head_scores(spec.rule, model, calib=calib, tokenizer=tokenizer, sink=spec.sink, window=spec.window,
                             seed=spec.seed, mask=mask, probe_rows=spec.probe_rows)
    grouped = group_scores(np.asarray(scores, dtype=float), adapter.n_heads // adapter.n_kv_heads, spec.group)
    live = live_groups(model, mask)
    order = stream_order(grouped, live)
    start = time.perf_counter()
    dense = metric_under_plan(model, eval_batches, None, mask).to_dict()
    metric = spec.metric or headline_metric(dense)[0]
    if metric not in dense:
        raise KVPlanError(f"Metric '{metric}' is not available here; accepted: "
                          f"{', '.join(m for m in TOLERANCE_METRICS if m in dense)}.")
    run = StreamTrajectory(spec.rule, {"sink": spec.sink, "window": spec.window, "group": spec.group,
                                       "probe_rows": spec.probe_rows, "full_share": spec.full_share},
                           spec.step, spec.seed, [len(adapter.blocks), adapter.n_kv_heads], adapter.n_heads, metric,
                           dense, order=order, no_cache=np.argwhere(~live).tolist(),
                           group_scores=[[float(v) if np.isfinite(v) else None for v in row] for row in grouped],
                           tolerance=spec.tolerance, model=spec.model_name, data=dict(spec.data_info),
                           mask=[] if mask is None else (mask.values == 0).nonzero().tolist(), versions=versions())
    n_live = len(order)
    target = n_live - int(np.floor(spec.full_share * n_live + 1e-9))   # streamed at the end
    streamed = 0
    while streamed < target:
        now = order[streamed:min(streamed + spec.step, target)]
        streamed += len(now)
        metrics = metric_under_plan(model, eval_batches, run.plan_streaming(streamed), mask).to_dict()
        run.steps.append({"streamed": now, "n_streamed": streamed, "ratio": streamed / n_live,
                          "full_share": 1 - streamed / n_live, "metrics": metrics,
                          "seconds": time.perf_counter() - start})
        if progress is not None:
            progress(streamed / target, f"{streamed}/{n_live} groups streaming, {metric} {metrics[metric]:.4f}")
    return run


def run_stream_seeds(spec: StreamSpec, model, calib, eval_batches, seeds, **kwargs) -> list[StreamTrajectory]:
    """One run per seed (``spec.seeded(s)``): the random band, or a seeded rule's spread."""
    return [run_stream(spec.seeded(int(s)), model, calib, eval_batches, **kwargs) for s in seeds]
