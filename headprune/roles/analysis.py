"""Which roles a criterion keeps, and what a task loses without a role.

kept share      for criterion c at pruning ratio r, with K_c(r) its kept set and R_ρ the heads of role ρ:
                    share_ρ(c, r) = |K_c(r) ∩ R_ρ| / |R_ρ|          (None when the model has no head of role ρ)
                and the role make-up of the kept and pruned sets (a head with two roles counts in both).
                K_c(r) is ``ScoreMap.kept_at(r)`` for a score map, and the first round(r·N) heads of a pruning order
                (a ``Trajectory``'s, for criteria that re-score as they prune) otherwise.
role ablation   the live evaluator's metric with every head of a role pruned ("prune") or every other live head
                pruned ("keep"), against the same edit for random sets of the same size drawn from the other live
                heads: mean ± sd over ``seeds`` seeded draws. It runs on a fork of the caller's ``LiveEvaluator``
                (the one evaluation path; the caller's evaluator keeps its mask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from ..evaluation.live import LiveEvaluator
from ..evaluation.metrics import HIGHER_IS_BETTER, headline_metric
from ..limits import UNIT
from ..model.mask import HeadMask
from .base import RoleError
from .report import NO_ROLE, RoleReport


def kept_set(source, shape: tuple[int, int], ratio: float) -> np.ndarray:
    """(L, H) bool: the heads ``source`` keeps at ``ratio`` -- a ScoreMap, or anything with an ``order()`` of heads
    in pruning order (a Trajectory), or that order itself."""
    problem = UNIT(ratio)
    if problem:
        raise RoleError(f"Pruning ratio {ratio!r} {problem}.")
    if hasattr(source, "kept_at"):
        return source.kept_at(ratio)
    order = source.order() if hasattr(source, "order") else list(source)
    kept = np.ones(shape, dtype=bool)
    for layer, head in order[:round(ratio * kept.size)]:
        kept[layer, head] = False
    return kept


def kept_by_role(criteria: Mapping[str, object], report: RoleReport, ratio: float) -> dict[str, dict]:
    """Per criterion at ``ratio``: ``kept_share`` {role: share or None}, ``kept`` / ``pruned`` {role: heads}
    (the make-up of both sets, ``NO_ROLE`` included), and their sizes (module doc)."""
    roles = {role: report.heads_with(role) for role in [*report.scores, NO_ROLE]}
    live = report.live
    out = {}
    for name, source in criteria.items():
        kept = kept_set(source, report.shape, ratio) & live
        pruned = live & ~kept
        out[name] = {
            "ratio": ratio, "n_kept": int(kept.sum()), "n_pruned": int(pruned.sum()),
            "kept_share": {r: (float((kept & h).sum() / h.sum()) if h.any() else None) for r, h in roles.items()},
            "kept": {r: int((kept & h).sum()) for r, h in roles.items()},
            "pruned": {r: int((pruned & h).sum()) for r, h in roles.items()}}
    return out


def kept_curve(criteria: Mapping[str, object], report: RoleReport, ratios: Sequence[float]) -> dict[str, dict]:
    """{criterion: {role: [share kept at each ratio]}} -- ``kept_by_role`` over a grid of ratios, for a curve."""
    tables = [kept_by_role(criteria, report, r) for r in ratios]
    return {name: {role: [t[name]["kept_share"][role] for t in tables] for role in tables[0][name]["kept_share"]}
            for name in criteria} if tables else {}


def role_ablation(evaluator: LiveEvaluator, report: RoleReport, role: str, mode: str = "prune", seeds: int = 10,
                  seed: int = 0, metric: str | None = None, exclude: Sequence[str] = (), progress=None) -> dict:
    """The metric with ``role`` pruned (``mode="prune"``) or alone kept (``"keep"``) vs equal-sized random sets.

    Returns {"role", "mode", "metric", "higher_is_better", "n_heads", "base", "role_value", "random_values",
    "random_mean", "random_sd", "random_pool"}: ``base`` is the metric at the evaluator's current mask, which
    every edit starts from (heads it already prunes stay pruned and are not drawn). Heads of the ``exclude`` roles
    are never drawn (e.g. the previous-token heads that feed an induction circuit, to ask about the circuit's
    other half alone); ``metric`` defaults to the headline metric (``evaluation.metrics.headline_metric``).
    """
    if mode not in ("prune", "keep"):
        raise RoleError(f"Role ablation mode '{mode}' is not one of: prune, keep.")
    live_eval = evaluator.fork()
    base_mask = live_eval.mask
    live = base_mask.keep_bool().numpy() & report.live
    heads = report.heads_with(role) & live
    n = int(heads.sum())
    if n == 0:
        raise RoleError(f"No live head has the role '{role}'; nothing to ablate.")
    barred = heads | np.any([report.heads_with(r) for r in exclude], axis=0) if exclude else heads
    others = np.argwhere(live & ~barred)
    if mode == "prune" and len(others) < n:
        raise RoleError(f"Only {len(others)} live heads are not '{role}'; a random set of {n} cannot be drawn.")

    base = live_eval.metrics()
    name, higher = headline_metric(base)
    metric = metric or name
    if metric not in base.to_dict():
        raise RoleError(f"Metric '{metric}' is not measured here; measured: {', '.join(base.to_dict())}.")
    higher = HIGHER_IS_BETTER.get(metric, higher)

    tell = progress or (lambda fraction, message: None)

    def value_when(chosen: np.ndarray, step: int, what: str) -> float:
        """Metric with ``chosen`` pruned (prune) or with only ``chosen`` kept among the live heads (keep); the
        progress of its batches is told as part ``step`` of seeds + 1 (a bar that moves within each set)."""
        drop = chosen if mode == "prune" else live & ~chosen
        keep = base_mask.keep_bool() & ~torch.from_numpy(drop)
        batches = (lambda f, m: tell((step + f) / (seeds + 1), f"{what}: {m}")) if progress is not None else None
        return float(live_eval.set_mask(HeadMask(keep.float()), batches).to_dict()[metric])

    tell(0.0, f"{mode} {role}")
    role_value = value_when(heads, 0, f"{mode} {role}")
    rng = np.random.default_rng(seed)
    randoms = []
    pool = others
    for s in range(seeds):
        chosen = np.zeros_like(heads)
        pick = pool[rng.choice(len(pool), size=min(n, len(pool)), replace=False)]
        chosen[pick[:, 0], pick[:, 1]] = True
        randoms.append(value_when(chosen, s + 1, f"random set {s + 1}/{seeds}"))
    tell(1.0, "done")
    return {"role": role, "mode": mode, "metric": metric, "higher_is_better": higher, "n_heads": n,
            "base": float(base.to_dict()[metric]), "role_value": role_value, "random_values": randoms,
            "random_mean": float(np.mean(randoms)), "random_sd": float(np.std(randoms, ddof=1)) if seeds > 1 else 0.0,
            "random_pool": int(len(pool)), "excluded_roles": list(exclude), "seed": seed, "seeds": seeds}

