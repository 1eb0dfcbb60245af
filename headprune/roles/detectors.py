"""The seven head roles. Each score is in [0, 1] per head (NaN for a head cut out or gated off) and a head has a
role when its score reaches the role's threshold; the defaults come from the sources cited.

Thresholds of 0.4 for the previous-token, duplicate-token and induction scores follow the detectors of the ARENA
induction-circuit exercises (McDougall, "[1.2] Intro to Mech Interp", built on TransformerLens), which call a head
one of these when its mean attention on the target position exceeds 0.4.
"""

from __future__ import annotations

import numpy as np

from ..limits import UNIT, Interval
from ..scoring import Param
from .base import Role, register_role
from .stats import RoleStats


def threshold(default: float, source: str) -> Param:
    return Param(default, f"a head has the role when its score reaches this ({source})", float, check=UNIT)


class MeanAttentionRole(Role):
    """A role whose score is one of ``RoleStats``' per-head mean attentions (``stat``: previous, duplicate,
    induction or sink), averaged over the rows it reads."""

    stat: str

    def score(self, stats: RoleStats, profile=None, **params) -> np.ndarray:
        return stats.mean(self.stat)


@register_role
class PreviousToken(MeanAttentionRole):
    """s_h = mean over real query positions i ≥ 1 of A_h[i, i−1] on the calibration texts.

    TransformerLens ``detect_head`` with the previous-token template and the ``mul`` measure divides the attention on
    the template by all the attention; over rows i ≥ 1, whose attention sums to 1, that is this mean.
    """

    name = "previous-token"
    description = "attends to the token just before the query"
    reference = "TransformerLens head_detector (previous_token_head template, 'mul'); Olsson et al. (2022)"
    latex = r"s_h = \frac{1}{|I|}\sum_{i \in I} A_h[i, i-1]"
    stat = "previous"
    params = {"threshold": threshold(0.4, "ARENA detectors")}


@register_role
class DuplicateToken(MeanAttentionRole):
    """s_h = mean over the second block i of A_h[i, i−n] on probes [BOS] + r + r (n = |r|): attention to the earlier
    copy of the query's own token (Olsson et al. 2022, "duplicate token heads")."""

    name = "duplicate-token"
    description = "attends to the earlier copy of the query's own token"
    reference = "Olsson et al. (2022), In-context learning and induction heads; TransformerLens head_detector"
    latex = r"s_h = \frac{1}{n}\sum_{i=s+n}^{s+2n-1} A_h[i, i-n]"
    reads = "probe"
    stat = "duplicate"
    params = {"threshold": threshold(0.4, "ARENA detectors")}


@register_role
class Induction(MeanAttentionRole):
    """s_h = mean over the second block i of A_h[i, i−n+1] on probes [BOS] + r + r: attention to the token that
    followed the earlier copy of the query's token -- the prefix-matching stripe of an induction head (Olsson et
    al. 2022). Encoder probes are read the same way (their rows may also look right; only this stripe counts)."""

    name = "induction"
    description = "attends to the token after the earlier copy of the query's token"
    reference = "Olsson et al. (2022), In-context learning and induction heads, prefix matching"
    latex = r"s_h = \frac{1}{n}\sum_{i=s+n}^{s+2n-1} A_h[i, i-n+1]"
    reads = "probe"
    stat = "induction"
    params = {"threshold": threshold(0.4, "ARENA detectors")}


@register_role
class Sink(MeanAttentionRole):
    """s_h = mean over real query rows of the attention on the first position (BOS / [CLS]) -- plus, in encoders,
    on [SEP] and the other special tokens (Clark et al. 2019 §3 find BERT heads parking attention on [SEP]).
    Threshold 0.3 as Gu et al. (2024), "When attention sink emerges in language models"."""

    name = "sink"
    description = "parks its attention on the first token (and, in encoders, on [SEP] / special tokens)"
    reference = "Gu et al. (2024), attention sinks (threshold 0.3); Clark et al. (2019) §3 ([SEP])"
    latex = r"s_h = \frac{1}{|I|}\sum_{i} \sum_{j \in S} A_h[i, j]"
    stat = "sink"
    params = {"threshold": threshold(0.3, "Gu et al. 2024")}


@register_role
class Positional(Role):
    """s_h = max over offsets k ∈ [−W, W], k ≠ −1, of the share of real rows whose strongest key is at i + k
    (Voita et al. 2019: a positional head's argmax lands on one relative position in at least 90% of cases).

    k = −1 is the previous-token role and is reported there, so one head is not counted twice for one behaviour;
    ``RoleReport.positional_offset`` gives the k (0 = itself, +1 = the next token, ...). Offsets beyond ±W are not
    positional (an argmax that far is content, or a sink).
    """

    name = "positional"
    description = "attends to one fixed relative position (itself, the next token, two back, ...)"
    reference = "Voita et al. (2019), Analyzing multi-head self-attention, §4.1 (argmax at one offset ≥ 90%)"
    latex = r"s_h = \max_{k \neq -1} \frac{|\{i : \arg\max_j A_h[i, j] = i + k\}|}{|I|}"
    params = {"threshold": threshold(0.9, "Voita et al. 2019")}

    def score(self, stats: RoleStats, profile=None, threshold: float = 0.9) -> np.ndarray:
        shares = stats.offset_shares().copy()
        shares[..., stats.window - 1] = -np.inf           # offset −1 belongs to the previous-token role
        best = shares.max(-1)
        return np.where(np.isfinite(best), best, np.nan)

    @staticmethod
    def offsets(stats: RoleStats) -> np.ndarray:
        """(n_blocks, H) the offset k of each head's positional score (NaN where no row was counted)."""
        shares = stats.offset_shares().copy()
        shares[..., stats.window - 1] = -np.inf
        k = shares.argmax(-1).astype(float) - stats.window
        return np.where(np.isnan(shares).all(-1), np.nan, k)


@register_role
class Syntactic(Role):
    """s_h = max over relations r (with at least ``min_arcs`` arcs) of acc_r(h) − base_r: how often the dependent's
    strongest word-level attention is its grammatical head (Clark et al. 2019 §4.2, ``syntax.SyntacticProfile``),
    beyond the best fixed-offset baseline for that relation ("the head is k words away", base_r = max_k share).
    A head is syntactic, for the relation of its best margin, when that margin is ≥ 10 points (Voita et al. 2019).
    Needs the spaCy parser and raw calibration texts; without them the scores are NaN."""

    name = "syntactic"
    description = "links words to their grammatical heads better than any fixed offset"
    reference = "Voita et al. (2019) §4.2 (≥ 10 points over the positional baseline); Clark et al. (2019) §4.2"
    latex = r"s_h = \max_r \big(\mathrm{acc}_r(h) - \max_k \mathrm{share}_r(k)\big)"
    reads = "arcs"
    params = {"threshold": threshold(0.10, "Voita et al. 2019"),
              "min_arcs": Param(10, "relations with fewer arcs in the calibration texts are not scored", int,
                                check=Interval(1, None, integer=True))}

    @staticmethod
    def margins(stats: RoleStats, profile, min_arcs: int) -> tuple[list[str], np.ndarray]:
        """(relations, (R, n_blocks, H) margins acc − baseline), forward layers averaged into blocks (ALBERT);
        no relation (and an empty array) without a profile or without a relation of ``min_arcs`` arcs."""
        relations = [] if profile is None else [r for r in profile.relations if profile.counts[r] >= min_arcs]
        blocks = [[layer for layer, b in enumerate(stats.layer_to_block) if b == block]
                  for block in range(stats.n_blocks)]
        margins = [np.stack([(profile.accuracy[r][layers] - profile.baseline[r]).mean(0) for layers in blocks])
                   for r in relations]
        return relations, np.stack(margins) if margins else np.zeros((0, stats.n_blocks, stats.n_heads))

    def score(self, stats: RoleStats, profile=None, threshold: float = 0.10, min_arcs: int = 10) -> np.ndarray:
        relations, margins = self.margins(stats, profile, min_arcs)
        if not relations:
            return np.full((stats.n_blocks, stats.n_heads), np.nan)
        return np.max(margins, axis=0)     # NaN stays NaN: a cut head has no accuracy

    def relation(self, stats: RoleStats, profile, min_arcs: int = 10) -> np.ndarray:
        """(n_blocks, H) object: the relation of each head's best margin (None without one)."""
        out = np.full((stats.n_blocks, stats.n_heads), None, dtype=object)
        relations, margins = self.margins(stats, profile, min_arcs)
        if relations:
            best = np.nan_to_num(margins, nan=-np.inf).argmax(0)
            for (block, head), index in np.ndenumerate(best):
                out[block, head] = relations[index]
        return out


@register_role
class Broad(Role):
    """s_h = mean over real rows of H(A_h[i, ·]) / log k_i, the row's entropy over its maximum (k_i keys it may
    attend): 1 for a head spreading evenly over everything it sees, 0 for one looking at a single token. The
    entropy is the one AE and AD read (``criteria.onepass.entropy_terms``); the per-row maximum makes a uniform
    causal head score 1 too. Threshold 0.8 is our choice (the sources describe broad heads, Clark et al. 2019 §3,
    without a cut-off): above it a head's rows are within 20% of uniform entropy on average."""

    name = "broad"
    description = "spreads its attention broadly (high normalised entropy)"
    reference = "Clark et al. (2019) §3 (broad attention); entropy as AE (Greedy-Gnorm paper eq. 3)"
    latex = r"s_h = \frac{1}{|I|}\sum_i \frac{H(A_h[i,\cdot])}{\log k_i}"
    params = {"threshold": threshold(0.8, "our choice, documented")}

    def score(self, stats: RoleStats, profile=None, threshold: float = 0.8) -> np.ndarray:
        return stats.mean("broad")
