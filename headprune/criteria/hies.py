"""HIES: head importance mixed with attention entropy (HIES paper), and its α selection by wAUC."""

from __future__ import annotations

import math

import numpy as np

from ..evaluation.live import LiveEvaluator
from ..limits import UNIT
from ..model.arch import adapt
from ..model.mask import HeadMask
from ..scoring import Param, ScoreMap, ScoringContext, register
from ..trajectory import TrajectoryError, TrajectorySpec, run_trajectory
from .onepass import OnePassCriterion, grid_json

# The paper sweeps α ∈ [0, 1) (hies.txt App. C.3): α = 1 would be HIS alone, a criterion of its own (``his``).
DEFAULT_ALPHAS = tuple(round(0.1 * i, 1) for i in range(10))
AUTO = "auto"
AUTO_BUDGET = 0.5      # the paper's pruning ratios run to 50 % (Tables 1-2: 10 %, 30 %, 50 %)
AUTO_STEP = 0.05       # heads per step of a sweep curve, as a fraction of the live heads (paper: 10 % steps)


def minmax(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """(v − min) / (max − min) over the live heads (HIES §3.1); all zeros when every live value is equal."""
    lo, hi = values[live].min(initial=np.inf), values[live].max(initial=-np.inf)
    return (values - lo) / (hi - lo) if hi > lo else np.zeros_like(values)


def _alpha_value(value):
    """"auto" (any case), or the number a string spells; anything else is left for ``_alpha_check`` to refuse."""
    if isinstance(value, str):
        if value.strip().lower() == AUTO:
            return AUTO
        try:
            return float(value)
        except ValueError:
            return value
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _alpha_check(value) -> str | None:
    if value == AUTO or (isinstance(value, float) and 0.0 <= value <= 1.0):
        return None
    return "accepted: 'auto' (chosen by wAUC on the calibration split) or a number in [0, 1]"


@register
class HIES(OnePassCriterion):
    """HIES_h = α·mm(HIS)_h + (1 − α)·(1 − mm(AE)_h) (HIES paper eq. 1), mm = min-max over all live heads.

    HIS is eq. (2) with the task loss (see ``his``); AE is the paper's token-averaged, length-normalised entropy
    AE_h = E_x[(1/(n log n)) Σ_t H(α_t)] = 1 − AD_h (App. A.2.1). α = 1 is HIS alone, α = 0 keeps low-entropy
    heads alone.

    α = "auto" (default) chooses α as the paper does (App. C.3): ``select_alpha`` on the calibration split over
    the paper's grid α ∈ {0, 0.1, ..., 0.9} ⊂ [0, 1), pruning in HIES order up to 50 % of the heads and keeping
    the α of the best wAUC; the chosen α and every α's wAUC are in the ScoreMap's params and meta. The sweep runs
    on the model as given (heads cut out of it excluded) even when a mask is passed: it is a property of the
    model and task, as the paper fixes one α* per task.

    Measured on the demo (128 calibration reviews; curves on 1,000 held-out reviews, 6 heads per step): the sweep
    picks α = 0.7 (wAUC 0.823; 0.8: 0.821, 0.5: 0.798, 0.0: 0.718), with single-head steps as well. Accuracy at
    25 / 50 / 75 % of heads pruned: HIES α = 0.7 0.826 / 0.813 / 0.737, HIS 0.818 / 0.813 / 0.764, HIES with the
    former fixed α = 0.5 0.821 / 0.783 / 0.700. So auto matches HIS up to 50 % (the range it is selected on, the
    paper's 10-50 %) and is well above α = 0.5; beyond it, at 75 %, HIS stays ahead on this model.
    """

    name = "hies"
    description = ("HIES: α·HIS + (1−α)·(1 − entropy), both min-max normalised; α chosen by wAUC on the "
                   "calibration split unless given.")
    reference = "HIES paper (hies.txt), eq. (1), §3.1; α by wAUC, App. C.3"
    latex = (r"\mathrm{HIES}_h = \alpha\,\widehat{\mathrm{HIS}}_h + (1-\alpha)\,(1-\widehat{\mathrm{AE}}_h),"
             r"\quad \hat v = \frac{v-\min v}{\max v-\min v}")
    needs_labels = True
    needs_gradients = True
    params = {"alpha": Param(AUTO, "weight of HIS against entropy: a number in [0, 1], or 'auto' (chosen by "
                             "wAUC of the pruning curve on the calibration split, as the paper)", str,
                             check=_alpha_check, convert=_alpha_value)}

    def needs(self, params):
        return {("his", "loss"), ("deficit",)}

    def work(self, ctx: ScoringContext, params: dict) -> float:
        """The shared pass, plus with α = auto one sweep curve per α of ⌈budget / step⌉ steps over the calibration
        set, each step re-evaluating about half the layers (``LiveEvaluator``) after one full first pass."""
        base = super().work(ctx, params)
        if self.resolve_params(params)["alpha"] != AUTO:
            return base
        return base + 1.0 + len(DEFAULT_ALPHAS) * math.ceil(AUTO_BUDGET / AUTO_STEP) * 0.5

    def score(self, ctx: ScoringContext, alpha) -> ScoreMap:
        if alpha != AUTO:
            return super().score(ctx, alpha=alpha)
        unmasked = ctx.mask is None or bool(ctx.mask.keep_bool()[adapt(ctx.model).live_grid()].all())
        # The one-pass statistics of the unmasked model are the sweep's too: share them through the cache.
        sweep_ctx = ScoringContext(ctx.model, ctx.calib, device=ctx.device, seed=ctx.seed,
                                   cache=ctx.cache if unmasked else {}, memory_budget=ctx.memory_budget)
        selection = select_alpha(ctx.model, ctx.calib, budget=AUTO_BUDGET, device=ctx.device,
                                 progress=lambda f, m: ctx.report(0.95 * f, m), ctx=sweep_ctx, select=ctx.select)
        result = super().score(ctx, alpha=selection["best_alpha"])
        result.params = {"alpha": selection["best_alpha"], "alpha_selection": AUTO}
        result.meta["alpha_selection"] = {k: v for k, v in selection.items() if k != "trajectories"}
        return result

    def combine(self, stats, live, alpha):
        his, entropy = stats[("his", "loss")], 1.0 - stats[("deficit",)]
        scores = alpha * minmax(his, live) + (1 - alpha) * (1 - minmax(entropy, live))
        return scores, {"his": grid_json(his, live), "entropy": grid_json(entropy, live)}


def wauc(trajectory, metric: str | None = None) -> float:
    """Weighted AUC of a metric-vs-ratio curve: ∫ w(r) m(r) dr / ∫ w(r) dr over the ratios reached, w(r) = r.

    The HIES paper selects α by "weighted AUC" without defining the weights. We weight by the pruning ratio
    itself, so the curve counts most where criteria differ (the paper's specialisation regime, ≥ 30 %) and the
    nearly-dense start, where every α is alike, counts least. Trapezoid rule on the recorded points.
    """
    r, v = trajectory.ratios(), trajectory.values(metric)
    weight = np.trapezoid(r, r)
    return float(np.trapezoid(r * v, r) / weight) if weight > 0 else float(v[-1])


def sweep_step(model) -> int:
    """Heads removed per step of a sweep curve: ``AUTO_STEP`` of the live heads, at least 1 (4 of the demo's 72)."""
    return max(1, math.ceil(AUTO_STEP * int(adapt(model).live_grid().sum())))


def sweep_specs(alphas, budget: float = AUTO_BUDGET, step: int = 1, metric: str | None = None) -> list[TrajectorySpec]:
    """One validated TrajectorySpec per α of a sweep (HIES order, ``step`` heads per step, up to ``budget``).

    Needs no model, so a caller checks a sweep's settings before loading one (the CLI passes ``step`` 1 when the
    model's ``sweep_step`` will choose it). Raises TrajectoryError naming the accepted values.
    """
    try:
        alphas = [float(a) for a in alphas]
    except (TypeError, ValueError):
        raise TrajectoryError(f"α values must be numbers in [0, 1]; got {alphas!r}.") from None
    bad = [a for a in alphas if UNIT(a)]
    if not alphas or bad:
        raise TrajectoryError(f"α values must lie in [0, 1]; got {bad or 'none'}.")
    hies = HIES()
    return [TrajectorySpec(criterion=hies, params={"alpha": alpha}, step=step, budget=budget, metric=metric)
            for alpha in alphas]


def select_alpha(model, calib: list[dict], alphas=DEFAULT_ALPHAS, budget: float = AUTO_BUDGET,
                 step: int | None = None, metric: str | None = None, device=None, progress=None,
                 ctx: ScoringContext | None = None, select: list[dict] | None = None) -> dict:
    """The HIES paper's α selection (App. C.3): for each α, prune in HIES order (scored on ``calib``) up to
    ``budget`` and score the accuracy-vs-ratio curve on the selection batches ``select`` (the paper's "held-out
    validation split"; None: on ``calib`` itself) by ``wauc``; report the best α.

    ``step`` heads go per step (default ``sweep_step``: 5 % of the heads, finer than the paper's 10 % ratio grid
    and a quarter of the cost of single heads on the demo).

    HIS and entropy come from one shared pass (``ctx.cache`` when a context is given); each α costs only its
    evaluations. Used by ``hies`` with α = "auto" and by the ``select-alpha`` command.
    """
    specs = sweep_specs(alphas, budget, sweep_step(model) if step is None else step, metric)
    alphas = [spec.params["alpha"] for spec in specs]
    hies = specs[0].criterion
    ctx = ctx or ScoringContext(model, calib, device=device)
    curves = select or calib
    start = LiveEvaluator(model, curves, HeadMask(adapt(model).live_grid().float()))  # every curve forks it
    runs = []
    for i, (alpha, spec) in enumerate(zip(alphas, specs)):
        report = None if progress is None else (
            lambda f, m, _i=i: progress((_i + f) / len(alphas), f"α = {alphas[_i]}: {m}"))
        runs.append(run_trajectory(spec, model, calib, curves, device=device, scores=hies(ctx, {"alpha": alpha}),
                                   evaluator=start, progress=report))
    values = [wauc(t, metric) for t in runs]
    best = int(np.argmax(values))  # ties: the smallest α
    return {"best_alpha": alphas[best], "wauc": dict(zip(map(str, alphas), values)), "budget": budget,
            "step": step, "metric": runs[best].metric, "weights": "w(r) = r (pruning ratio)",
            "trajectories": [t.to_json() for t in runs]}
