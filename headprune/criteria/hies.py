"""HIES: head importance mixed with attention entropy (HIES paper), and its α selection by wAUC."""

from __future__ import annotations

import numpy as np

from .base import Param, ScoringContext, register
from .onepass import OnePassCriterion, grid_json

DEFAULT_ALPHAS = tuple(round(a, 1) for a in np.linspace(0.0, 1.0, 11))


def minmax(values: np.ndarray, live: np.ndarray) -> np.ndarray:
    """(v − min) / (max − min) over the live heads (HIES §3.1); all zeros when every live value is equal."""
    lo, hi = values[live].min(initial=np.inf), values[live].max(initial=-np.inf)
    return (values - lo) / (hi - lo) if hi > lo else np.zeros_like(values)


def _unit_interval(value) -> str | None:
    return None if 0.0 <= value <= 1.0 else "must lie in [0, 1]"


@register
class HIES(OnePassCriterion):
    """HIES_h = α·mm(HIS)_h + (1 − α)·(1 − mm(AE)_h) (HIES paper eq. 1), mm = min-max over all live heads.

    HIS is eq. (2) with the task loss (see ``his``); AE is the paper's token-averaged, length-normalised entropy
    AE_h = E_x[(1/(n log n)) Σ_t H(α_t)] = 1 − AD_h (App. A.2.1). α = 1 is HIS alone, α = 0 keeps low-entropy
    heads alone. ``select_alpha`` picks α by wAUC as the paper does (App. C.3).
    """

    name = "hies"
    description = "HIES: α·HIS + (1−α)·(1 − entropy), both min-max normalised; keeps important, focused heads."
    reference = "HIES paper (hies.txt), eq. (1), §3.1; α by wAUC, App. C.3"
    latex = (r"\mathrm{HIES}_h = \alpha\,\widehat{\mathrm{HIS}}_h + (1-\alpha)\,(1-\widehat{\mathrm{AE}}_h),"
             r"\quad \hat v = \frac{v-\min v}{\max v-\min v}")
    needs_labels = True
    needs_gradients = True
    params = {"alpha": Param(0.5, "weight of HIS against entropy, in [0, 1]", float, check=_unit_interval)}

    def needs(self, params):
        return {("his", "loss"), ("deficit",)}

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


def select_alpha(model, calib: list[dict], alphas=DEFAULT_ALPHAS, budget: float = 0.5, step: int = 1,
                 metric: str | None = None, device=None, progress=None) -> dict:
    """The HIES paper's α selection (App. C.3): for each α, prune in HIES order on the calibration split up to
    ``budget`` and score the accuracy-vs-ratio curve on that same split by ``wauc``; report the best α.

    HIS and entropy come from one shared pass; each α costs only its evaluations.
    """
    from ..trajectory import TrajectoryError, run_trajectory

    alphas = [float(a) for a in alphas]
    bad = [a for a in alphas if _unit_interval(a)]
    if not alphas or bad:
        raise TrajectoryError(f"α values must lie in [0, 1]; got {bad or 'none'}.")
    hies = HIES()
    ctx = ScoringContext(model, calib, device=device)
    runs = []
    for i, alpha in enumerate(alphas):
        scores = hies(ctx, {"alpha": alpha})
        report = None if progress is None else (
            lambda f, m, _i=i: progress((_i + f) / len(alphas), f"α = {alphas[_i]}: {m}"))
        runs.append(run_trajectory(model, calib, calib, hies, {"alpha": alpha}, step=step, budget=budget,
                                   metric=metric, device=device, scores=scores, progress=report))
    values = [wauc(t, metric) for t in runs]
    best = int(np.argmax(values))  # ties: the smallest α
    return {"best_alpha": alphas[best], "wauc": dict(zip(map(str, alphas), values)), "budget": budget,
            "step": step, "metric": runs[best].metric, "weights": "w(r) = r (pruning ratio)",
            "trajectories": [t.to_json() for t in runs]}
