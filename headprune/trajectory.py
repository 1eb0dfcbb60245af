"""Pruning trajectories: remove heads in a criterion's order and measure the model after every step.

``run_trajectory`` prunes ``step`` heads at a time (ALBERT: tied heads, one grid position = all layers) in the
order of a criterion -- lowest score first, highest first with ``inverse`` -- scoring a static criterion once
on the starting model and re-scoring a dynamic one (Greedy-Gnorm) on the pruned model after every step; the
re-scoring runs on a private copy cut physically (``surgery.prune_model``), so every later pass is cheaper.
Evaluation runs incrementally (``live.LiveEvaluator``: only the layers from the first changed one are
recomputed), on the caller's model under the mask, which is never touched. After each step it records the
heads removed, the metrics on the evaluation split, stability if asked (see ``stability``), the parameters
left and the elapsed time. It stops at a budget (a ratio of the grid, or a head count), at a tolerance (after
the first step whose metric falls below τ × the dense metric -- or, for a lower-is-better metric such as
perplexity, rises above the dense metric / τ), or when every head is gone.

Summaries (``Trajectory.summary``):
    auc              (1/r_end) ∫_0^{r_end} m(r) dr, trapezoid over the recorded points (r = pruned ratio, m the
                     metric; the dense model is r = 0): the mean metric over the range pruned, so a curve flat at
                     the dense metric scores the dense metric.
    tolerance_ratio  the largest ratio reached before m first falls below τ × m(0) (τ = the run's tolerance).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .errors import HeadpruneError
from .evaluation.live import LiveEvaluator
from .evaluation.metrics import HIGHER_IS_BETTER, gather_labels, headline_metric
from .evaluation.stability import DEFAULT_DROP, agreement, perturb_batches, same_answers
from .limits import Interval
from .model.arch import adapt
from .model.mask import HeadMask
from .model.sizes import parameters_left
from .model.surgery import prune_model
from .provenance import versions
from .scoring import Criterion, ScoreMap, ScoringContext

# metrics a tolerance can read: any with a direction (higher-is-better: stop once m < τ × m(0); lower-is-better,
# e.g. perplexity: stop once m > m(0) / τ -- the same factor of degradation read the other way)
TOLERANCE_METRICS = tuple(HIGHER_IS_BETTER)


def degraded(value: float, dense: float, tau: float, higher_is_better: bool) -> bool:
    """Whether ``value`` is worse than the tolerance τ allows relative to the dense ``dense`` value."""
    return value < tau * dense if higher_is_better else value > dense / tau


class TrajectoryError(HeadpruneError):
    pass


@dataclass
class Trajectory:
    criterion: str
    params: dict
    inverse: bool
    step: int
    seed: int
    shape: list[int]
    unit: str                    # "head", or "tied head (all layers)" for ALBERT
    metric: str                  # the metric the tolerance and summaries read
    dense: dict                  # metrics of the starting model (+ "stability", "params")
    steps: list[dict] = field(default_factory=list)  # removed, n_pruned, ratio, metrics, stability, params, seconds
    stop: str = "end"            # "budget" | "tolerance" | "end"
    budget: float | None = None
    count: int | None = None
    tolerance: float | None = None
    model: str = ""
    data: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)

    @property
    def n_units(self) -> int:
        return self.shape[0] * self.shape[1]

    def ratios(self) -> np.ndarray:
        return np.array([self.dense.get("ratio", 0.0)] + [s["ratio"] for s in self.steps])

    def values(self, metric: str | None = None) -> np.ndarray:
        metric = metric or self.metric
        return np.array([self.dense[metric]] + [s["metrics"][metric] for s in self.steps], dtype=float)

    def order(self) -> list[tuple[int, int]]:
        return [tuple(h) for s in self.steps for h in s["removed"]]

    def auc(self, metric: str | None = None) -> float:
        r, v = self.ratios(), self.values(metric)
        return float(np.trapezoid(v, r) / (r[-1] - r[0])) if r[-1] > r[0] else float(v[0])

    def tolerance_ratio(self, tau: float | None = None) -> float | None:
        tau = self.tolerance if tau is None else tau
        if tau is None:
            return None
        r, v = self.ratios(), self.values()
        below = np.flatnonzero([degraded(x, v[0], tau, self.higher_is_better) for x in v])
        return float(r[below[0] - 1] if below.size else r[-1])

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER.get(self.metric, True)

    def summary(self) -> dict:
        return {"auc": self.auc(), "tolerance_ratio": self.tolerance_ratio(), "final_ratio": float(self.ratios()[-1]),
                "final_metric": float(self.values()[-1]), "n_steps": len(self.steps)}

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.summary()}

    @classmethod
    def from_json(cls, obj: dict) -> Trajectory:
        return cls(**{k: v for k, v in obj.items() if k != "summary"})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")


RATIO = Interval(0, 1, closed="right")
STEPS = Interval(1, None, integer=True)
DROP = Interval(0, 1, closed="left")


@dataclass(frozen=True, kw_only=True)
class TrajectorySpec:
    """What a trajectory prunes, how, and when it stops; validated once, on construction.

    criterion   the Criterion object whose order is followed (``headprune.criteria.get(name)``)
    params      its parameters as the user gave them (checked against the criterion's declared limits)
    inverse     prune the most important heads first
    step        heads removed per step
    budget      stop at this pruned ratio of the grid, in (0, 1]; ``count``: after this many heads
    tolerance   stop after the first step whose metric is worse than τ × dense (dense / τ when lower is better)
    metric      the metric the tolerance and summaries read (default: the task's headline metric)
    seed        seed of the criterion (random order) and of the stability word drop
    stability   also record stability under a seeded word drop of probability ``drop``
    model_name, data_info   provenance written into the run file
    """

    criterion: Criterion
    params: Mapping = field(default_factory=dict)
    inverse: bool = False
    step: int = 1
    budget: float | None = None
    count: int | None = None
    tolerance: float | None = None
    metric: str | None = None
    seed: int = 0
    stability: bool = False
    drop: float = DEFAULT_DROP
    model_name: str = ""
    data_info: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.criterion, Criterion):
            raise TrajectoryError(f"A trajectory follows a Criterion (headprune.criteria.get(name)), not "
                                  f"{type(self.criterion).__name__}.")
        if STEPS(self.step):
            raise TrajectoryError(f"Step {self.step!r} must be a positive integer (heads removed per step).")
        if self.budget is not None and RATIO(self.budget):
            raise TrajectoryError(f"Budget {self.budget!r} is not a ratio in (0, 1] (e.g. 0.5 prunes half the heads).")
        if self.count is not None and STEPS(self.count):
            raise TrajectoryError(f"Head count {self.count!r} must be a positive integer.")
        if self.tolerance is not None and RATIO(self.tolerance):
            raise TrajectoryError(f"Tolerance {self.tolerance!r} {RATIO(self.tolerance)}: stop once the metric is "
                                  "worse than τ × the dense metric (1/τ × for a lower-is-better metric such as "
                                  "perplexity).")
        if self.metric is not None and self.metric not in TOLERANCE_METRICS:
            raise TrajectoryError(f"Metric '{self.metric}' is unknown; accepted: {', '.join(TOLERANCE_METRICS)}.")
        if DROP(self.drop):
            raise TrajectoryError(f"Word-drop probability {DROP(self.drop)}; got {self.drop!r}.")
        self.criterion.resolve_params(dict(self.params))  # a bad parameter is refused here, before any work

    def seeded(self, seed: int) -> TrajectorySpec:
        """The same spec with another seed (random orders: one trajectory per seed)."""
        return dataclasses.replace(self, seed=seed)

    def target(self, n_units: int, already: int) -> int:
        """How many units are pruned when the run ends."""
        limits = [n_units] + ([round(self.budget * n_units)] if self.budget is not None else []) + \
            ([self.count] if self.count else [])
        return max(min(limits), already)


def _metric_of(spec: TrajectorySpec, dense: dict) -> str:
    metric = spec.metric or headline_metric(dense)[0]
    if metric not in dense:
        accepted = [m for m in TOLERANCE_METRICS if m in dense]
        raise TrajectoryError(f"Metric '{metric}' is not available here; accepted: {', '.join(accepted)}.")
    return metric


def run_trajectory(spec: TrajectorySpec, model, calib: list[dict], eval_batches: list[dict], *, tokenizer=None,
                   texts: list | None = None, device=None, scores: ScoreMap | None = None,
                   evaluator: LiveEvaluator | None = None, perturbed: list[dict] | None = None,
                   progress=None, memory_budget: int | str | None = None) -> Trajectory:
    """Prune ``model`` step by step as ``spec`` says (see module doc) and return the Trajectory.

    ``calib``: calibration batches the criterion scores on (``texts``: their raw texts, for criteria that parse
    them; without them SAP decodes the batches). ``eval_batches``: where the metrics are measured.
    ``scores``: a precomputed ScoreMap of the starting model to use as a static criterion's order (skips its
    scoring). ``evaluator``: a LiveEvaluator on ``eval_batches`` at the starting model to fork instead of
    running a first full pass (runs that share a start share it). ``perturbed``: ready word-dropped copies of
    ``eval_batches`` for stability (default: made from ``spec.drop`` and ``spec.seed``). ``model`` is never
    hooked or changed: scoring and evaluation run on private copies. ``memory_budget``: what scoring may hold
    beyond the weights (``headprune.model.memory``). ``progress`` is called after every step; an exception it
    raises (``errors.Cancelled``) stops the run and nothing of it is returned.
    """
    crit = spec.criterion
    resolved = crit.prepare(ScoringContext(model, calib, seed=spec.seed), dict(spec.params))
    if scores is not None and crit.dynamic:
        raise TrajectoryError(f"'{crit.name}' is re-scored after every step; precomputed scores apply only to "
                              "static criteria.")
    gather_labels(eval_batches)  # a clear error for unlabelled evaluation data
    start = time.perf_counter()
    mask = HeadMask(adapt(model).live_grid().float())
    n_units = mask.values.numel()
    target = spec.target(n_units, mask.n_pruned)
    clean = evaluator.fork() if evaluator is not None else LiveEvaluator(model, eval_batches, mask)
    if spec.stability and clean.task.is_lm and not clean.task.is_choice:
        raise TrajectoryError("Stability compares the answers a model gives before and after a word drop (a "
                              "classifier's labels, or the picked choice of multiple-choice data); a language "
                              "model on plain text gives none. Run the trajectory without stability.")
    if spec.stability:
        noisy = LiveEvaluator(model, perturbed if perturbed is not None else
                              perturb_batches(eval_batches, tokenizer, spec.drop, spec.seed), mask)

    def measure() -> tuple[dict, float | None]:
        metrics = clean.set_mask(mask).to_dict()
        if not spec.stability:
            return metrics, None
        noisy.set_mask(mask)
        if clean.task.is_choice:
            return metrics, same_answers(clean.predictions(), noisy.predictions())
        return metrics, agreement(clean.logits, noisy.logits)

    dense, dense_stability = measure()
    metric = _metric_of(spec, dense)
    traj = Trajectory(crit.name, resolved, spec.inverse, spec.step, spec.seed, list(mask.shape),
                      adapt(model).unit_name, metric,
                      {**dense, "stability": dense_stability, "params": parameters_left(model, mask),
                       "ratio": mask.n_pruned / n_units},
                      budget=spec.budget, count=spec.count, tolerance=spec.tolerance, model=spec.model_name,
                      data=dict(spec.data_info), versions=versions())
    work = copy.deepcopy(model) if crit.dynamic else model  # re-scored on a physically cut (faster) copy
    queue: list[tuple[int, int]] | None = None
    while mask.n_pruned < target:
        if queue is None or crit.dynamic:
            ctx = ScoringContext(work, calib, mask, device, tokenizer, texts, seed=spec.seed,
                                 memory_budget=memory_budget)
            scored = scores if scores is not None else crit.score(ctx, **resolved)
            traj.params = {**traj.params, **scored.params}   # what scoring chose, e.g. HIES's α under alpha=auto
            queue = scored.order(spec.inverse)
        removed = [h for h in queue if mask.values[h] != 0][:min(spec.step, target - mask.n_pruned)]
        queue = [h for h in queue if h not in removed]
        for layer, head in removed:
            mask = mask.prune(layer, head)
        if crit.dynamic:
            prune_model(work, mask, inplace=True)
        metrics, kept = measure()
        traj.steps.append({"removed": [list(h) for h in removed], "n_pruned": mask.n_pruned,
                           "ratio": mask.n_pruned / n_units, "metrics": metrics, "stability": kept,
                           "params": parameters_left(model, mask), "seconds": time.perf_counter() - start})
        if progress is not None:
            progress(mask.n_pruned / target, f"{mask.n_pruned}/{n_units} pruned, {metric} {metrics[metric]:.4f}")
        if spec.tolerance is not None and \
                degraded(metrics[metric], dense[metric], spec.tolerance, HIGHER_IS_BETTER[metric]):
            traj.stop = "tolerance"
            return traj
    traj.stop = "end" if mask.n_pruned == n_units else "budget"
    return traj


def run_seeds(spec: TrajectorySpec, model, calib, eval_batches, seeds: int = 5, progress=None,
              **kwargs) -> list[Trajectory]:
    """``seeds`` trajectories with seeds spec.seed, spec.seed+1, ... (random order: the spread of Figure 4).

    The runs share one first pass over ``eval_batches`` (a LiveEvaluator forked for each) and, with stability,
    one set of word-dropped batches. ``kwargs`` go to :func:`run_trajectory`.
    """
    if STEPS(seeds):
        raise TrajectoryError(f"Number of seeds {seeds!r} must be a positive integer.")
    if "evaluator" not in kwargs:
        kwargs["evaluator"] = LiveEvaluator(model, eval_batches, HeadMask(adapt(model).live_grid().float()))
    if spec.stability and kwargs.get("perturbed") is None:
        kwargs["perturbed"] = perturb_batches(eval_batches, kwargs.get("tokenizer"), spec.drop, spec.seed)
    runs = []
    for i in range(seeds):
        report = None if progress is None else (lambda f, m, _i=i: progress((_i + f) / seeds, f"seed {_i}: {m}"))
        runs.append(run_trajectory(spec.seeded(spec.seed + i), model, calib, eval_batches, progress=report,
                                   **kwargs))
    return runs


def spread(runs: list[Trajectory], metric: str | None = None) -> dict:
    """Per ratio, the min / quartiles / max of the metric over ``runs`` (boxplot data), on the common steps."""
    n = min(len(t.steps) for t in runs) + 1
    values = np.stack([t.values(metric)[:n] for t in runs])
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
    return {"ratios": runs[0].ratios()[:n].tolist(), "metric": metric or runs[0].metric,
            **{name: row.tolist() for name, row in zip(("min", "q1", "median", "q3", "max"), q)}}


RUN_FILE_HELP = ("Accepted: a run file from `python -m headprune trajectory --out FILE` or from the dashboard's "
                 "download.")


def read_run_file(data: bytes, name: str) -> tuple[list[Trajectory], list[dict]]:
    """Trajectories and random-seed spreads from the bytes of a run file called ``name``.

    Accepted: one trajectory (``Trajectory.to_json``), a list of them, a CLI multi-seed file
    ``{"runs": [...], "spread": {...}}``, or the dashboard's export ``{"trajectories": [...], "spreads": [...]}``.

    Returns
    -------
    (trajectories, spreads); a spread is a ``spread()`` dict with its "name".

    Raises
    ------
    TrajectoryError naming ``name`` and what is accepted.
    """
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrajectoryError(f"{name} is not UTF-8 JSON ({exc}). {RUN_FILE_HELP}") from None
    spreads: list[dict] = []
    if isinstance(obj, dict) and "trajectories" in obj:
        items, spreads = obj["trajectories"], list(obj.get("spreads") or [])
    elif isinstance(obj, dict) and "runs" in obj:
        items = obj["runs"]
        if obj.get("spread"):
            spreads = [{**obj["spread"], "name": f"{obj.get('criterion', 'random')} ({len(items)} seeds)"}]
    elif isinstance(obj, dict) and "steps" in obj:
        items = [obj]
    elif isinstance(obj, list):
        items = obj
    else:
        raise TrajectoryError(f"{name} holds no trajectories. {RUN_FILE_HELP}")
    try:
        trajs = [Trajectory.from_json(item) for item in items]
        for t in trajs:  # reading every value now: a broken step fails here, not later inside a plot
            t.values(), t.ratios()
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise TrajectoryError(f"{name} is not a headprune run file ({type(exc).__name__}: {exc}). "
                              f"{RUN_FILE_HELP}") from None
    for s in spreads:
        if not isinstance(s, dict) or not all(k in s for k in ("ratios", "min", "q1", "median", "q3", "max")):
            raise TrajectoryError(f"{name}: a random-seed spread lacks its quartiles. {RUN_FILE_HELP}")
    return trajs, spreads
