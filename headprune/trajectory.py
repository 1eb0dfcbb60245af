"""Pruning trajectories: remove heads in a criterion's order and measure the model after every step.

``run_trajectory`` prunes ``step`` heads at a time (ALBERT: tied heads, one grid position = all layers) in the
order of a criterion -- lowest score first, highest first with ``inverse`` -- scoring a static criterion once
on the starting model and re-scoring a dynamic one (Greedy-Gnorm) on the pruned model after every step; the
re-scoring runs on a private copy cut physically (``surgery.prune_model``), so every later pass is cheaper.
Evaluation runs incrementally (``live.LiveEvaluator``: only the layers from the first changed one are
recomputed), on the caller's model under the mask, which is never touched. After each step it records the
heads removed, the metrics on the evaluation split (with ``agreement``, the % of rows answered as the starting
model answers them, for a classifier or multiple choice), stability if asked (``evaluation.stability``; also
under the step's metrics, so ``metric="stability"`` reads it), the parameters left and the elapsed time. It
stops at a budget (a ratio of the grid, or a head count), at a tolerance (after the first step whose metric falls
below τ × the dense metric -- or, for a lower-is-better metric such as perplexity, rises above the dense metric /
τ), or when every head is gone.

Where the tolerance reads its metric: a stopping rule is a choice, so with selection batches (``select``, the
selection role: ``--select-data`` or a disjoint selection share of ``--data``) it reads the headline metric on
the SELECTION rows, never the evaluation rows it reports: a second LiveEvaluator over the selection batches
follows the same mask, and every step records its metrics under "select_metrics" (the start's in
``Trajectory.select_dense``) beside the evaluation "metrics", so the stop can be audited. Without selection
batches (the data left none) the stop reads the evaluation metric, as it always did: the fallback; the CLI and
the dashboard pass selection batches whenever the data leaves some (the dashboard's runs carry no tolerance: its
τ is applied afterwards, through ``tolerance_ratio``, to what each run recorded, i.e. the evaluation rows).

Summaries (``Trajectory.summary``):
    auc              (1/r_end) ∫_0^{r_end} m(r) dr, trapezoid over the recorded points (r = pruned ratio, m the
                     metric; the dense model is r = 0): the mean metric over the range pruned, so a curve flat at
                     the dense metric scores the dense metric.
    tolerance_ratio  the largest ratio reached before m first falls below τ × m(0) (τ = the run's tolerance; m the
                     metric the stop reads, ``Trajectory.stop_values``: the selection rows' when recorded).
    inflection_ratio Greedy-Gnorm's "inflection point" (greedy-gnorm.txt, §3, after Algorithm 1: "pruning can be
                     stopped earlier when accuracy begins to drop sharply, which marks the empirical 'inflection
                     point'"), on the same values as the tolerance: the ratio of the first point i after which the
                     metric stays more than ``drop`` × |m(0)| below m(i) at every point of the next ``window`` of
                     the grid (at least the next point; a single noisy point that recovers does not count); the
                     last point when no such drop comes. The paper gives no
                     numbers: drop = 0.05 and window = 0.10 (about 14 of BERT-base's 144 heads) are headprune's
                     choice (``inflection_index``), parameters of every caller.

Repeats (``run_repeats``): the same spec run on several calibration draws (``CalibrationDraw``: re-drawn rows,
each with its content hash) with criterion seeds seed, seed+1, ...; ``repeat_summary`` gives, per step, the mean and
the sample standard deviation (ddof 1) of every metric over the runs, as the papers' averages of independent runs.
The random baseline's boxes come from independent draws (``TrajectorySpec(independent=True)``): at each rate a
fresh random set of that many heads, seeded by (seed, step), instead of the prefixes of one random order.

Masks out of a run (Greedy-Gnorm Algorithm 1 returns (F, M)): ``Trajectory.mask_at(i)`` is the mask after step i
(0 = the start), ``point_at_ratio(r)`` the last recorded point that prunes at most r of the grid, and
``stop_index()`` the run's stopping point M: its last step, or after a tolerance stop the last step still within
the tolerance (the point ``tolerance_ratio`` reports).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import time
from collections.abc import Mapping, Sequence
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
from .userinput import MAX_FILE_BYTES, MAX_JSON_DEPTH, json_depth

# metrics a tolerance can read: any with a direction (higher-is-better: stop once m < τ × m(0); lower-is-better,
# e.g. perplexity: stop once m > m(0) / τ -- the same factor of degradation read the other way)
TOLERANCE_METRICS = tuple(HIGHER_IS_BETTER)


def degraded(value: float, dense: float, tau: float, higher_is_better: bool) -> bool:
    """Whether ``value`` is worse than the tolerance τ allows relative to the dense ``dense`` value."""
    return value < tau * dense if higher_is_better else value > dense / tau


def curve_auc(ratios: np.ndarray, values: np.ndarray) -> float:
    """The module doc's auc: (1/r_end) ∫ m(r) dr by trapezoids over the points (the mean metric over the range)."""
    r, v = np.asarray(ratios, dtype=float), np.asarray(values, dtype=float)
    return float(np.trapezoid(v, r) / (r[-1] - r[0])) if r[-1] > r[0] else float(v[0])


def tolerance_reach(ratios: np.ndarray, values: np.ndarray, tau: float, higher_is_better: bool) -> float:
    """The module doc's tolerance_ratio: the largest ratio before ``values`` first falls below τ × values[0]."""
    below = np.flatnonzero([degraded(x, values[0], tau, higher_is_better) for x in values])
    return float(ratios[below[0] - 1] if below.size else ratios[-1])


class TrajectoryError(HeadpruneError):
    pass


# the inflection detector's defaults (module doc): the paper names the rule, not its numbers
INFLECTION_DROP = 0.05
INFLECTION_WINDOW = 0.10


def inflection_index(ratios: np.ndarray, values: np.ndarray, higher_is_better: bool = True,
                     drop: float = INFLECTION_DROP, window: float = INFLECTION_WINDOW) -> int:
    """The module doc's inflection point: the index of the first point after which the metric stays more than
    ``drop`` × |values[0]| below it at every point within ``window`` of the grid (at least the next point); the last
    index when none. "Stays": one noisy point (a row or two of a small selection set) that the next points recover
    from is not the sharp drop the paper stops at."""
    r, v = np.asarray(ratios, dtype=float), np.asarray(values, dtype=float)
    sign = 1.0 if higher_is_better else -1.0
    margin = drop * abs(v[0])
    for i in range(len(v) - 1):
        ahead = max(int(np.searchsorted(r, r[i] + window + 1e-12, side="right")), i + 2)
        if np.all(sign * (v[i] - v[i + 1:ahead]) > margin):
            return i
    return len(v) - 1


def check_inflection(drop, window) -> None:
    """The detector's two parameters: a share of the dense metric and a share of the grid, each in (0, 1]."""
    for name, value in (("drop", drop), ("window", window)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise TrajectoryError(f"Inflection {name} {value!r} is not a share in (0, 1]: drop is the fall (a share "
                                  "of the dense metric) and window the stretch of the grid it happens within, e.g. "
                                  f"drop = {INFLECTION_DROP}, window = {INFLECTION_WINDOW}.")


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
    start_pruned: list = field(default_factory=list)   # [layer, head] already gone at the start (a cut model)
    metric_set: list = field(default_factory=list)     # the metrics the task reports (evaluation.metrics.metric_set)
    repeat: int = 0                                     # which calibration draw (run_repeats); data["calib_hash"]
    select_dense: dict = field(default_factory=dict)   # start metrics on the selection rows the stop read ({}: none)
    points: dict = field(default_factory=dict)   # metrics measured at chosen points only (``measure_points``)

    @property
    def n_units(self) -> int:
        return self.shape[0] * self.shape[1]

    def ratios(self) -> np.ndarray:
        return np.array([self.dense.get("ratio", 0.0)] + [s["ratio"] for s in self.steps])

    def values(self, metric: str | None = None) -> np.ndarray:
        metric = metric or self.metric
        return np.array([self.dense[metric]] + [s["metrics"][metric] for s in self.steps], dtype=float)

    def stop_values(self) -> np.ndarray:
        """The headline metric the tolerance reads, per point: on the selection rows when the run recorded them
        (module doc), else on the evaluation rows (``values``)."""
        if self.select_dense and all("select_metrics" in s for s in self.steps):
            return np.array([self.select_dense[self.metric]] +
                            [s["select_metrics"][self.metric] for s in self.steps], dtype=float)
        return self.values()

    def order(self) -> list[tuple[int, int]]:
        return [tuple(h) for s in self.steps for h in s["removed"]]

    def mask_at(self, index: int) -> HeadMask:
        """The mask after step ``index`` (0 = the start; ``len(steps)`` = the last step): the heads gone at the start
        plus every head removed up to that step, or the step's own ``pruned`` set for independent draws."""
        if not 0 <= index <= len(self.steps):
            raise TrajectoryError(f"Step {index} is not in this run: it has steps 0..{len(self.steps)}.")
        values = np.ones(self.shape, dtype=np.float32)
        step = self.steps[index - 1] if index else {}
        heads = step["pruned"] if "pruned" in step else \
            self.start_pruned + [h for s in self.steps[:index] for h in s["removed"]]
        for layer, head in heads:
            values[layer, head] = 0.0
        return HeadMask(values)

    def point_at_ratio(self, ratio: float) -> int:
        """Index of the last recorded point pruning at most ``ratio`` of the grid (0 = the start)."""
        if RATIO(ratio) and ratio != 0:
            raise TrajectoryError(f"Ratio {ratio!r} is not a pruned share in [0, 1].")
        reached = np.flatnonzero(self.ratios() <= ratio + 1e-9)
        return int(reached[-1])

    def stop_index(self) -> int:
        """The stopping point (module doc): the last step, or after a tolerance stop the last step within it."""
        if self.stop == "tolerance" and self.tolerance is not None:
            values = self.stop_values()
            below = [i for i, v in enumerate(values) if degraded(v, values[0], self.tolerance, self.higher_is_better)]
            return max(below[0] - 1, 0) if below else len(self.steps)
        return len(self.steps)

    def auc(self, metric: str | None = None) -> float:
        return curve_auc(self.ratios(), self.values(metric))

    def tolerance_ratio(self, tau: float | None = None) -> float | None:
        tau = self.tolerance if tau is None else tau
        if tau is None:
            return None
        return tolerance_reach(self.ratios(), self.stop_values(), tau, self.higher_is_better)

    def inflection_point(self, drop: float = INFLECTION_DROP, window: float = INFLECTION_WINDOW) -> int:
        """Index of the inflection point (module doc) on ``stop_values`` (the selection rows when recorded)."""
        return inflection_index(self.ratios(), self.stop_values(), self.higher_is_better, drop, window)

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER.get(self.metric, True)

    def point_values(self, metric: str) -> tuple[np.ndarray, np.ndarray]:
        """(ratios, values) of a metric measured at chosen points only (``measure_points``), the start first."""
        if metric not in self.points:
            raise TrajectoryError(f"Metric '{metric}' was not measured at any point of this run; measured at "
                                  f"points: {', '.join(self.points) or 'none'}.")
        rows = self.points[metric]
        return np.array([r["ratio"] for r in rows], dtype=float), np.array([r["value"] for r in rows], dtype=float)

    def summary(self) -> dict:
        return {"auc": self.auc(), "tolerance_ratio": self.tolerance_ratio(),
                "inflection_ratio": float(self.ratios()[self.inflection_point()]),
                "final_ratio": float(self.ratios()[-1]),
                "final_metric": float(self.values()[-1]), "n_steps": len(self.steps)}

    def to_json(self) -> dict:
        return {**asdict(self), "summary": self.summary()}

    @classmethod
    def from_json(cls, obj: dict) -> Trajectory:
        # a run file's extras (summary, masks written, pruned model) are not part of the run itself
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")


RATIO = Interval(0, 1, closed="right")
STEPS = Interval(1, 1_000_000, integer=True, why="heads of one model's grid; no model has more")
RUNS = Interval(1, 1000, integer=True, why="each run (seed or repeat) is a whole trajectory, run one after another")
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
    independent random only: at each step a fresh random mask with that many heads (seed (seed, step)), not the
                prefix of one random order: the independent draws the random baseline's boxes need
    track_select  record the selection rows' metrics after every step (as a tolerance does) without stopping on
                them: a stopping rule applied afterwards, e.g. a protocol's ``mask_tolerance``
    metric_set  the metrics the task reports, recorded in the run file (``evaluation.metrics.metric_set``)
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
    independent: bool = False
    track_select: bool = False
    metric_set: Sequence[str] = ()
    model_name: str = ""
    data_info: Mapping = field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.criterion, Criterion):
            raise TrajectoryError(f"A trajectory follows a Criterion (headprune.criteria.get(name)), not "
                                  f"{type(self.criterion).__name__}.")
        if STEPS(self.step):
            raise TrajectoryError(f"Step {self.step!r} must be a positive integer, at most {STEPS.high:,} (heads "
                                  f"removed per step; {STEPS.why}).")
        if self.budget is not None and RATIO(self.budget):
            raise TrajectoryError(f"Budget {self.budget!r} is not a ratio in (0, 1] (e.g. 0.5 prunes half the heads).")
        if self.count is not None and STEPS(self.count):
            raise TrajectoryError(f"Head count {self.count!r} must be a positive integer, at most {STEPS.high:,} "
                                  f"({STEPS.why}).")
        if self.tolerance is not None and RATIO(self.tolerance):
            raise TrajectoryError(f"Tolerance {self.tolerance!r} {RATIO(self.tolerance)}: stop once the metric is "
                                  "worse than τ × the dense metric (1/τ × for a lower-is-better metric such as "
                                  "perplexity).")
        if self.metric is not None and self.metric not in TOLERANCE_METRICS:
            raise TrajectoryError(f"Metric '{self.metric}' is unknown; accepted: {', '.join(TOLERANCE_METRICS)}.")
        if self.metric == "stability" and not self.stability:
            raise TrajectoryError("Metric 'stability' is measured under a seeded word drop: ask for it too "
                                  "(stability=True, the CLI's --stability).")
        if DROP(self.drop):
            raise TrajectoryError(f"Word-drop probability {DROP(self.drop)}; got {self.drop!r}.")
        if self.independent and self.criterion.name != "random":
            raise TrajectoryError(f"Independent draws at each rate are the random baseline's; '{self.criterion.name}' "
                                  "follows one order. Accepted: independent=True with criterion random.")
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
                   progress=None, memory_budget: int | str | None = None,
                   select: list[dict] | None = None,
                   select_evaluator: LiveEvaluator | None = None) -> Trajectory:
    """Prune ``model`` step by step as ``spec`` says (see module doc) and return the Trajectory.

    ``calib``: calibration batches the criterion scores on (``texts``: their raw texts, for criteria that parse
    them; without them SAP decodes the batches). ``eval_batches``: where the metrics are measured.
    ``scores``: a precomputed ScoreMap of the starting model to use as a static criterion's order (skips its
    scoring). ``evaluator``: a LiveEvaluator on ``eval_batches`` at the starting model to fork instead of
    running a first full pass (runs that share a start share it). ``perturbed``: ready word-dropped copies of
    ``eval_batches`` for stability (default: made from ``spec.drop`` and ``spec.seed``). ``model`` is never
    hooked or changed: scoring and evaluation run on private copies. ``memory_budget``: what scoring may hold
    beyond the weights (``headprune.model.memory``). ``progress`` is called after every step; an exception it
    raises (``errors.Cancelled``) stops the run and nothing of it is returned. ``select``: the selection batches
    a criterion makes its choices on (HIES's α, SAP's k; ``ScoringContext.select``), never ``eval_batches``;
    with a tolerance the stop is decided on them too (module doc). ``select_evaluator``: a LiveEvaluator on
    ``select`` at the starting model to fork, as ``evaluator``.
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
    # the stop's own evaluator on the selection rows (module doc), moved with the same mask as ``clean``
    chooser = None
    if select and (spec.tolerance is not None or spec.track_select):
        gather_labels(select)
        chooser = select_evaluator.fork() if select_evaluator is not None else LiveEvaluator(model, select, mask)
    if spec.stability and clean.task.is_lm and not clean.task.is_choice:
        raise TrajectoryError("Stability compares the answers a model gives before and after a word drop (a "
                              "classifier's labels, or the picked choice of multiple-choice data); a language "
                              "model on plain text gives none. Run the trajectory without stability.")
    if spec.stability:
        noisy = LiveEvaluator(model, perturbed if perturbed is not None else
                              perturb_batches(eval_batches, tokenizer, spec.drop, spec.seed), mask)

    # agreement (evaluation.stability): % of evaluation rows answered as the starting model answers them, recorded
    # at every step of a task that gives answers (a classifier's class, a picked choice)
    answering = clean.task.is_choice or (not clean.task.is_lm and clean.task.kind != "regression")
    reference: list = []

    def measure() -> tuple[dict, float | None]:
        metrics = clean.set_mask(mask).to_dict()
        if answering:
            answers = clean.predictions()
            reference[:] = reference or [answers]
            metrics["agreement"] = same_answers(reference[0], answers)
        if not spec.stability:
            return metrics, None
        noisy.set_mask(mask)
        if clean.task.is_choice:
            kept = same_answers(clean.predictions(), noisy.predictions())
        else:
            kept = agreement(clean.logits, noisy.logits)
        return {**metrics, "stability": kept}, kept

    dense, dense_stability = measure()
    metric = _metric_of(spec, dense)
    chosen = chooser.set_mask(mask).to_dict() if chooser is not None else {}
    if chooser is not None and metric not in chosen:
        raise TrajectoryError(f"The tolerance reads '{metric}' on the selection rows, which give "
                              f"{', '.join(m for m in chosen if m in TOLERANCE_METRICS)}: choose one of those.")
    stop_dense = (chosen or dense)[metric]   # what the stop compares with: the selection rows' when there are some
    traj = Trajectory(crit.name, resolved, spec.inverse, spec.step, spec.seed, list(mask.shape),
                      adapt(model).unit_name, metric,
                      {**dense, "stability": dense_stability, "params": parameters_left(model, mask),
                       "ratio": mask.n_pruned / n_units},
                      budget=spec.budget, count=spec.count, tolerance=spec.tolerance, model=spec.model_name,
                      data=dict(spec.data_info), versions=versions(),
                      start_pruned=[list(h) for h in (mask.values == 0).nonzero().tolist()],
                      metric_set=list(spec.metric_set), repeat=int(spec.data_info.get("repeat", 0)),
                      select_dense=chosen)
    start_mask = mask
    work = copy.deepcopy(model) if crit.dynamic else model  # re-scored on a physically cut (faster) copy
    queue: list[tuple[int, int]] | None = None
    while mask.n_pruned < target:
        if spec.independent:   # a fresh random set of the next size (module doc), not the prefix of one order
            before = mask
            mask = random_mask(start_mask, min(mask.n_pruned + spec.step, target), (spec.seed, len(traj.steps)))
            removed = [tuple(h) for h in ((before.values != 0) & (mask.values == 0)).nonzero().tolist()]
        elif queue is None or crit.dynamic:
            ctx = ScoringContext(work, calib, mask, device, tokenizer, texts, seed=spec.seed,
                                 memory_budget=memory_budget, select=select)
            scored = scores if scores is not None else crit.score(ctx, **resolved)
            traj.params = {**traj.params, **scored.params}   # what scoring chose, e.g. HIES's α under alpha=auto
            queue = scored.order(spec.inverse)
        if not spec.independent:
            removed = [h for h in queue if mask.values[h] != 0][:min(spec.step, target - mask.n_pruned)]
            queue = [h for h in queue if h not in removed]
            for layer, head in removed:
                mask = mask.prune(layer, head)
        if crit.dynamic:
            prune_model(work, mask, inplace=True)
        metrics, kept = measure()
        chosen = chooser.set_mask(mask).to_dict() if chooser is not None else {}
        traj.steps.append({"removed": [list(h) for h in removed], "n_pruned": mask.n_pruned,
                           "ratio": mask.n_pruned / n_units, "metrics": metrics, "stability": kept,
                           "params": parameters_left(model, mask), "seconds": time.perf_counter() - start,
                           **({"pruned": [list(h) for h in (mask.values == 0).nonzero().tolist()]}
                              if spec.independent else {}),
                           **({"select_metrics": chosen} if chooser is not None else {})})
        if progress is not None:
            progress(mask.n_pruned / target, f"{mask.n_pruned}/{n_units} pruned, {metric} {metrics[metric]:.4f}")
        if spec.tolerance is not None and \
                degraded((chosen or metrics)[metric], stop_dense, spec.tolerance, HIGHER_IS_BETTER[metric]):
            traj.stop = "tolerance"
            return traj
    traj.stop = "end" if mask.n_pruned == n_units else "budget"
    return traj


def point_steps(run: Trajectory, points: Sequence[float | str]) -> list[int]:
    """The steps of ``run`` at ``points`` (ratios: the last step pruning at most that share, ``point_at_ratio``;
    "stop": ``stop_index``), the start (step 0) first, each step once, in order."""
    steps = {0} | {run.stop_index() if p == "stop" else run.point_at_ratio(p) for p in points}
    return sorted(steps)


def measure_points(runs: Sequence[Trajectory], points: Sequence[float | str], names: Sequence[str],
                   measure, progress=None) -> None:
    """Measure metrics too costly for every step (an lm-eval task: ``evaluation.harness.harness_metrics``) at the
    chosen ``points`` of each run, and the start, into ``run.points[name]``: [{"step", "ratio", "value"}, ...].

    ``measure(mask) -> {name: value}`` is called once per distinct mask (repeats share the start; points falling
    on one step share it). ``progress(fraction, message)`` after each call."""
    todo = [(run, step) for run in runs for step in point_steps(run, points)]
    done: dict[bytes, dict] = {}
    for i, (run, step) in enumerate(todo):
        mask = run.mask_at(step)
        key = mask.values.numpy().tobytes()
        if key not in done:
            done[key] = measure(mask)
        for name in names:
            run.points.setdefault(name, []).append({"step": step, "ratio": float(run.ratios()[step]),
                                                    "value": float(done[key][name])})
        if progress is not None:
            progress((i + 1) / len(todo), f"{', '.join(names)} at step {step}: "
                                          f"{', '.join(f'{done[key][n]:.4f}' for n in names)}")


def random_mask(start: HeadMask, n_pruned: int, seed) -> HeadMask:
    """``start`` with random live heads pruned until ``n_pruned`` grid heads are (``seed``: any numpy seed)."""
    live = start.keep_bool().nonzero().tolist()
    pick = np.random.default_rng(seed).choice(len(live), max(n_pruned - start.n_pruned, 0), replace=False)
    mask = start
    for i in sorted(pick.tolist()):
        mask = mask.prune(*live[i])
    return mask


@dataclass(frozen=True)
class CalibrationDraw:
    """One repeat's calibration data: its batches, raw texts (None: decoded when a criterion parses) and the
    sha256 of its rows (``headprune.data.content_hash``)."""

    batches: list
    texts: list | None = None
    hash: str = ""


def run_repeats(spec: TrajectorySpec, model, draws: Sequence[CalibrationDraw], eval_batches, progress=None,
                **kwargs) -> list[Trajectory]:
    """One trajectory per calibration draw, repeat r with criterion seed spec.seed + r (module doc).

    The runs share one first pass over ``eval_batches`` (a LiveEvaluator forked for each), with a tolerance and
    selection batches (``select``) one over them too (the stop's, forked for each), and, with stability, one set
    of word-dropped batches. Each run file records its repeat and calibration hash in ``data``.
    ``kwargs`` go to :func:`run_trajectory`.
    """
    if not draws:
        raise TrajectoryError("Repeats need at least one calibration draw.")
    if "evaluator" not in kwargs:
        kwargs["evaluator"] = LiveEvaluator(model, eval_batches, HeadMask(adapt(model).live_grid().float()))
    if kwargs.get("select") and spec.tolerance is not None and kwargs.get("select_evaluator") is None:
        kwargs["select_evaluator"] = LiveEvaluator(model, kwargs["select"],
                                                   HeadMask(adapt(model).live_grid().float()))
    if spec.stability and kwargs.get("perturbed") is None:
        kwargs["perturbed"] = perturb_batches(eval_batches, kwargs.get("tokenizer"), spec.drop, spec.seed)
    runs, n = [], len(draws)
    for i, draw in enumerate(draws):
        report = None if progress is None else (lambda f, m, _i=i: progress((_i + f) / n, f"run {_i}: {m}"))
        info = {**spec.data_info, **({"repeat": i, "calib_hash": draw.hash} if draw.hash else {})}
        runs.append(run_trajectory(dataclasses.replace(spec.seeded(spec.seed + i), data_info=info), model,
                                   draw.batches, eval_batches, progress=report, texts=draw.texts, **kwargs))
    return runs


def run_seeds(spec: TrajectorySpec, model, calib, eval_batches, seeds: int = 5, progress=None,
              texts: list | None = None, **kwargs) -> list[Trajectory]:
    """``seeds`` trajectories with seeds spec.seed, spec.seed+1, ... on the same calibration data (random order:
    the spread of Figure 4). Only the criterion is re-seeded; ``run_repeats`` re-draws the calibration too."""
    if STEPS(seeds):
        raise TrajectoryError(f"Number of seeds {seeds!r} must be a positive integer.")
    return run_repeats(spec, model, [CalibrationDraw(calib, texts)] * seeds, eval_batches, progress, **kwargs)


def spread(runs: list[Trajectory], metric: str | None = None, band: bool = False) -> dict:
    """Per ratio, the min / quartiles / max (boxplot data) and the mean and sample sd (ddof 1; 0 for one run) of
    the metric over ``runs``, on the common steps. ``band``: plots draw it as mean ± sd (repeats of one
    criterion) rather than as boxes (the random baseline's independent draws)."""
    n = min(len(t.steps) for t in runs) + 1
    values = np.stack([t.values(metric)[:n] for t in runs])
    q = np.quantile(values, [0.0, 0.25, 0.5, 0.75, 1.0], axis=0)
    sd = values.std(axis=0, ddof=1) if len(runs) > 1 else np.zeros(n)
    return {"ratios": runs[0].ratios()[:n].tolist(), "metric": metric or runs[0].metric,
            **{name: row.tolist() for name, row in zip(("min", "q1", "median", "q3", "max"), q)},
            "mean": values.mean(axis=0).tolist(), "sd": sd.tolist(), "band": band}


def repeat_summary(runs: list[Trajectory]) -> dict:
    """Per step (the steps every run reached), mean and sample sd (``spread``) of every metric the runs record:
    {"ratios", "n_runs", "metric", "mean", "sd" (the headline's), "metrics": {name: {"mean", "sd"}},
    "calib_hashes"}."""
    names = [m for m in runs[0].dense if isinstance(runs[0].dense[m], (int, float)) and m in HIGHER_IS_BETTER]
    table = {name: {k: v for k, v in spread(runs, name).items() if k in ("mean", "sd")} for name in names}
    metric = runs[0].metric
    return {"ratios": spread(runs)["ratios"], "n_runs": len(runs), "metric": metric, **table[metric],
            "metrics": table, "calib_hashes": [t.data.get("calib_hash") for t in runs]}


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
    if len(data) > MAX_FILE_BYTES:   # an upload is bytes already: bounded as the one safe reader bounds files
        raise TrajectoryError(f"{name} is {len(data):,} bytes, over the {MAX_FILE_BYTES:,} bytes read. "
                              f"{RUN_FILE_HELP}")
    try:
        text = data.decode("utf-8")
        if json_depth(text) > MAX_JSON_DEPTH:
            raise TrajectoryError(f"{name} nests arrays or objects {json_depth(text)} deep, over the "
                                  f"{MAX_JSON_DEPTH} levels read. {RUN_FILE_HELP}")
        obj = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrajectoryError(f"{name} is not UTF-8 JSON ({exc}). {RUN_FILE_HELP}") from None
    spreads: list[dict] = []
    if isinstance(obj, dict) and "trajectories" in obj:
        items, spreads = obj["trajectories"], list(obj.get("spreads") or [])
    elif isinstance(obj, dict) and "runs" in obj:
        items = obj["runs"]
        if obj.get("spread"):
            runs = "runs" if obj.get("repeats", 1) > 1 else "seeds"
            spreads = [{**obj["spread"], "name": f"{obj.get('criterion', 'random')} ({len(items)} {runs})"}]
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
