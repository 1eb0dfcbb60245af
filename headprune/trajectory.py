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
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .arch import adapt
from .criteria import Criterion, ScoreMap, ScoringContext, get
from .errors import HeadpruneError
from .evaluate import HIGHER_IS_BETTER, headline_metric
from .mask import HeadMask
from .surgery import prune_model

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
        import json

        Path(path).write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")


def versions() -> dict:
    from importlib import metadata

    import torch
    import transformers

    try:
        own = metadata.version("headprune")
    except metadata.PackageNotFoundError:  # running from a source checkout
        own = "source"
    return {"headprune": own, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def _target(n_units: int, already: int, budget, count) -> int:
    """How many units are pruned when the run ends."""
    if budget is not None and not (isinstance(budget, (int, float)) and 0 < budget <= 1):
        raise TrajectoryError(f"Budget {budget!r} is not a ratio in (0, 1] (e.g. 0.5 prunes half the heads).")
    if count is not None and not (isinstance(count, int) and count >= 1):
        raise TrajectoryError(f"Head count {count!r} must be a positive integer.")
    limits = [n_units] + ([round(budget * n_units)] if budget is not None else []) + ([count] if count else [])
    return max(min(limits), already)


def _check(step, tolerance, metric, dense) -> str:
    if not (isinstance(step, int) and step >= 1):
        raise TrajectoryError(f"Step {step!r} must be a positive integer (heads removed per step).")
    if tolerance is not None and not 0 < tolerance <= 1:
        raise TrajectoryError(f"Tolerance {tolerance!r} must lie in (0, 1]: stop once the metric is worse than "
                              "τ × the dense metric (1/τ × for a lower-is-better metric such as perplexity).")
    metric = metric or headline_metric(dense)[0]
    if metric not in TOLERANCE_METRICS or metric not in dense:
        accepted = [m for m in TOLERANCE_METRICS if m in dense]
        raise TrajectoryError(f"Metric '{metric}' is not available here; accepted: {', '.join(accepted)}.")
    return metric


def run_trajectory(model, calib: list[dict], eval_batches: list[dict], criterion: str | Criterion,
                   params: dict | None = None, inverse: bool = False, step: int = 1, budget: float | None = None,
                   count: int | None = None, tolerance: float | None = None, seed: int = 0,
                   stability: bool | list[dict] = False, metric: str | None = None, device=None, tokenizer=None,
                   scores: ScoreMap | None = None, progress=None, model_name: str = "",
                   data_info: dict | None = None, texts: list[str] | None = None) -> Trajectory:
    """Prune ``model`` step by step in ``criterion``'s order (see module doc) and return the Trajectory.

    ``stability``: True perturbs ``eval_batches`` (``stability.perturb_batches``, word drop 0.1, ``seed``,
    word-level when ``tokenizer`` is given), or pass ready perturbed batches. ``scores``: a precomputed ScoreMap
    of the starting model to use as a static criterion's order (skips its scoring). ``texts``: the raw
    calibration texts, for criteria that parse them (SAP); without them SAP decodes the batches.
    """
    from .evaluate import gather_labels
    from .live import LiveEvaluator, parameters_left
    from .stability import agreement, perturb_batches

    crit = get(criterion) if isinstance(criterion, str) else criterion
    resolved = crit.prepare(ScoringContext(model, calib, seed=seed), params)
    if scores is not None and crit.dynamic:
        raise TrajectoryError(f"'{crit.name}' is re-scored after every step; precomputed scores apply only to "
                              "static criteria.")
    gather_labels(eval_batches)  # a clear error for unlabelled evaluation data
    start = time.perf_counter()
    mask = HeadMask(adapt(model).live_grid().float())
    n_units = mask.values.numel()
    target = _target(n_units, mask.n_pruned, budget, count)
    clean = LiveEvaluator(model, eval_batches, mask)
    if stability and clean.task.is_lm:
        raise TrajectoryError("Stability compares the labels a classifier predicts before and after a word drop; a "
                              "language model predicts no labels. Run the trajectory without stability.")
    if stability:
        perturbed = stability if isinstance(stability, list) else perturb_batches(eval_batches, tokenizer, seed=seed)
        noisy = LiveEvaluator(model, perturbed, mask)

    def measure() -> tuple[dict, float | None]:
        metrics = clean.set_mask(mask).to_dict()
        if not stability:
            return metrics, None
        noisy.set_mask(mask)
        return metrics, agreement(clean.logits, noisy.logits)

    dense, dense_stability = measure()
    metric = _check(step, tolerance, metric, dense)
    traj = Trajectory(crit.name, resolved, inverse, step, seed, list(mask.shape), adapt(model).unit_name, metric,
                      {**dense, "stability": dense_stability, "params": parameters_left(model, mask),
                       "ratio": mask.n_pruned / n_units},
                      budget=budget, count=count, tolerance=tolerance, model=model_name, data=data_info or {},
                      versions=versions())
    work = copy.deepcopy(model) if crit.dynamic else model  # re-scored on a physically cut (faster) copy
    queue: list[tuple[int, int]] | None = None
    while mask.n_pruned < target:
        if queue is None or crit.dynamic:
            ctx = ScoringContext(work, calib, mask, device, tokenizer, texts, seed=seed)
            scored = scores if scores is not None else crit.score(ctx, **resolved)
            traj.params = {**traj.params, **scored.params}   # what scoring chose, e.g. HIES's α under alpha=auto
            queue = scored.order(inverse)
        removed = [h for h in queue if mask.values[h] != 0][:min(step, target - mask.n_pruned)]
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
        if tolerance is not None and degraded(metrics[metric], dense[metric], tolerance, HIGHER_IS_BETTER[metric]):
            traj.stop = "tolerance"
            return traj
    traj.stop = "end" if mask.n_pruned == n_units else "budget"
    return traj


def run_seeds(model, calib, eval_batches, criterion, seeds: int = 5, seed: int = 0, progress=None,
              **kwargs) -> list[Trajectory]:
    """``seeds`` trajectories with seeds seed, seed+1, ... (random order: the spread of Figure 4)."""
    if not (isinstance(seeds, int) and seeds >= 1):
        raise TrajectoryError(f"Number of seeds {seeds!r} must be a positive integer.")
    runs = []
    for i in range(seeds):
        report = None if progress is None else (lambda f, m, _i=i: progress((_i + f) / seeds, f"seed {_i}: {m}"))
        runs.append(run_trajectory(model, calib, eval_batches, criterion, seed=seed + i, progress=report, **kwargs))
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
