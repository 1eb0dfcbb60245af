"""ScoreMap: an L x H array of head scores, and the selection rules that read it.

**Higher = more important = kept longer**; NaN for heads already pruned. A pruning order follows (lowest first);
every score map also has an inverse order (highest first), the stress test of the Greedy-Gnorm paper. Criteria and
head roles (``headprune.roles``) both produce ScoreMaps, so every grid, table and selection below serves both.

The selection rules sit next to the scores they read, as scikit-learn keeps ``_get_support_mask`` beside
``scores_`` (beyond the papers; the dashboard's "do criteria agree?" view):
    kept at ratio r    ``ScoreMap.kept_at(r)``: the heads not yet pruned once round(r N) of the N grid heads are
                       pruned (heads already pruned count towards that number), pruning in ``order()``;
    rank correlation   ``ScoreMap.rank_correlation(other)``: Spearman's rho over the heads live in both
                       (``headprune.evaluation.metrics.spearman``: Pearson correlation of average ranks);
    Jaccard overlap    ``jaccard(a, b)`` = |K_a ∩ K_b| / |K_a ∪ K_b| of two kept sets (1 when both are empty).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import CriterionError
from ..evaluation.metrics import spearman
from ..limits import UNIT


@dataclass
class ScoreMap:
    """L x H importance scores; higher = more important (kept longer); NaN = already pruned."""

    scores: np.ndarray
    criterion: str
    params: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.scores.shape)

    def order(self, inverse: bool = False) -> list[tuple[int, int]]:
        """Live heads in pruning order: lowest score first (highest first when ``inverse``).

        Ties are broken by (layer, head) so an order is deterministic.
        """
        live = [(float(self.scores[l, h]), l, h) for l, h in np.argwhere(~np.isnan(self.scores)).tolist()]
        live.sort(key=lambda t: ((-t[0] if inverse else t[0]), t[1], t[2]))
        return [(l, h) for _, l, h in live]

    def ranks(self) -> np.ndarray:
        """Rank of each head, 1 = most important; NaN where pruned."""
        r = np.full(self.scores.shape, np.nan)
        for i, (l, h) in enumerate(self.order(inverse=True)):
            r[l, h] = i + 1
        return r

    def to_json(self) -> dict:
        return {"criterion": self.criterion, "layers": self.shape[0], "heads": self.shape[1],
                "scores": [[None if np.isnan(v) else float(v) for v in row] for row in self.scores],
                "higher_is_more_important": True, "params": self.params, **self.meta}

    @classmethod
    def from_json(cls, obj: dict) -> ScoreMap:
        scores = np.array([[np.nan if v is None else v for v in row] for row in obj["scores"]], dtype=float)
        meta = {k: v for k, v in obj.items()
                if k not in ("criterion", "layers", "heads", "scores", "higher_is_more_important", "params")}
        params = obj.get("params", {})
        if not isinstance(params, dict):   # a file read back may be hand-edited: params are read by name
            raise ValueError(f'its "params" is {type(params).__name__} {str(params)[:40]!r}, not an object '
                             '{"name": value}')
        return cls(scores, obj["criterion"], params, meta)

    def importance(self) -> np.ndarray:
        """Rank of each live head scaled to [0, 1]: 0 = pruned first, 1 = kept longest; NaN where pruned."""
        ranks = self.ranks()
        n_live = int(np.sum(~np.isnan(ranks)))
        return (n_live - ranks) / max(n_live - 1, 1)

    def kept_at(self, ratio: float, inverse: bool = False) -> np.ndarray:
        """(L, H) bool: heads still kept once round(ratio * N) grid heads are pruned in this map's order (the
        inverse order, most important first, with ``inverse``)."""
        problem = UNIT(ratio)
        if problem:
            raise CriterionError(f"Pruning ratio {ratio!r} {problem}.")
        return self.kept_count(round(ratio * self.scores.size), inverse)

    def kept_count(self, n_pruned: int, inverse: bool = False) -> np.ndarray:
        """(L, H) bool: heads still kept once ``n_pruned`` grid heads are pruned in this map's order (heads
        already pruned, NaN, count towards that number, as in :meth:`kept_at`)."""
        if not isinstance(n_pruned, (int, np.integer)) or not 0 <= n_pruned <= self.scores.size:
            raise CriterionError(f"Head count {n_pruned!r} must be an integer in [0, {self.scores.size}] (the heads "
                                 "of the grid).")
        live = ~np.isnan(self.scores)
        n_more = max(0, int(n_pruned) - int((~live).sum()))
        kept = live.copy()
        for layer, head in self.order(inverse)[:n_more]:
            kept[layer, head] = False
        return kept

    def rank_correlation(self, other: ScoreMap) -> float:
        """Spearman's rho with ``other`` over the heads live in both (NaN with fewer than 3 such heads)."""
        both = ~np.isnan(self.scores) & ~np.isnan(other.scores)
        return spearman(self.scores[both], other.scores[both]) if both.sum() > 2 else float("nan")


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """|a ∩ b| / |a ∪ b| of two (L, H) bool sets (1 when both are empty)."""
    union = np.sum(a | b)
    return float(np.sum(a & b) / union) if union else 1.0


def rank_correlations(scores: Mapping[str, ScoreMap]) -> np.ndarray:
    """(n, n) Spearman's rho between every pair of ``scores`` (1 on the diagonal), in their order."""
    names = list(scores)
    out = np.eye(len(names))
    for i, a in enumerate(names):
        for j in range(i + 1, len(names)):
            out[i, j] = out[j, i] = scores[a].rank_correlation(scores[names[j]])
    return out


def jaccards(scores: Mapping[str, ScoreMap], ratio: float) -> np.ndarray:
    """(n, n) Jaccard overlap of the sets every pair of ``scores`` keeps at ``ratio``, in their order."""
    kept = [s.kept_at(ratio) for s in scores.values()]
    return np.array([[jaccard(a, b) for b in kept] for a in kept])
