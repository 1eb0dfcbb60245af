"""SAP: Syntactic Attention Pruning, with Candidate Filtering (sap-syntactic-attention-pruning.txt, §3.2-3.4).

§3.2 Dependency statistics. Dependency labels are counted over the parsed calibration texts and ranked by count
     (rank 1 = most frequent; ties: alphabetical). Weights for a given k:
         w(rank r) = k − r + 1   for r ≤ k     (top-k: k, k−1, ..., 1)
         w(rank r) = r − k       for r > k     (the rest: 1, 2, ..., #labels − k; rarer weighs more)
     e.g. k = 5, rank 29 -> 24 (the paper's example). #labels = the labels seen in the data.
§3.3 Threshold and counters. θ = the global mean of all attention values of the live heads over the texts. For
     each head and each arc a (dependent -> head word) of label ℓ, with attention v = A_w[dep(a), head(a)]:
         cnt(l, h) += w(ℓ)  if ℓ is top-k and v < θ,   or ℓ is not top-k and v > θ
     S = Σ_a w(ℓ_a), the total weighted occurrences of all arcs.
§3.3 Selection (eq. 1). Scan heads by descending cnt; prune those with cnt ≥ S·R (R = ``ratio``, default 0.5). For
     a target sparsity R is lowered by ``ratio_step`` until enough heads qualify (at R = 0 every live head does);
     when the last step overshoots, the heads with the highest counters are taken (ties: layer, head).
§4.1 k is swept over 1..k_max (10) and the k whose pruned model scores best on the calibration split is kept
     (ties: the smaller k); a fixed ``k`` skips the sweep and needs no labels. The paper picks k per target
     sparsity (Fig. 7: the best k differs between 0.25, 0.5 and 0.75). Departure, documented: a ScoreMap is one
     nested pruning order, which a trajectory follows step by step, while the best-k selections of different
     sparsities need not be nested; so k is picked once, at ``sparsity`` (default 0.5, the paper's middle
     level), and the order is −cnt for that k. The paper's model at another level s is ``sparsity=s``
     (``meta["sap_mask"]``, with that level's best k in ``meta["best_k"]``); ``SAP.per_sparsity`` gives the
     paper's per-level selections for several levels at once.
§3.4 Candidate Filtering. CF re-ranks a pool of SAP candidates by each one's measured single-head degradation and
     prunes in that order. With m0 the metric of the model as given (on the selection rows), each pool head is
     pruned alone and its degradation m0 − m(c) measured; the pool is re-ranked by ascending degradation (ties: SAP
     order), then pruned cumulatively from the model as given, in one of two modes:
     * tolerance (``sparsity`` = 0, the paper's mode: "instead of providing a sparsity ratio, the user specifies a
       tolerance threshold"): CF stops before the first head whose cumulative pruning would bring the metric below
       tolerance · m0; the sparsity reached is CF's result. The pool is "the set of head pruning candidates (the
       orange block in Figure 3)": the heads with cnt ≥ S·R at R = ``ratio`` (``pool`` = 0), or SAP's first
       round(pool·N) heads when ``pool`` > 0. On the demo (128 calibration reviews, defaults) the k sweep keeps
       k = 7 and R = 0.5 gives 19 candidates; CF accepts all 19 (0.828 → 0.805, floor 0.745).
     * target (``sparsity`` = s > 0, Fig. 5's SAP+CF at 0.25/0.5/0.75): CF prunes the first round(s·N) heads of its
       degradation ranking (no tolerance stop). The paper does not say how CF meets a target. Two pools
       (``cf_pool``):
       - "paper": SAP's own candidates at the target, the paper's CF input (§3.4, "the set of head pruning
         candidates"): every head with cnt ≥ S·R at the R SAP used for s (``ratio``, lowered by ``ratio_step``
         until round(s·N) heads qualify, §4.1). It always holds the target (at R = 0 every live head qualifies);
         CF chooses among the heads above S·R at ``ratio`` when more qualify than the target, else among the
         heads the last step of R let in (often few beyond the target: then CF's mask is close to SAP's).
       - "widened" (the default of the criterion; the paper protocols ask for "paper"): a pool of exactly
         round(s·N) heads (SAP's own selection) would leave CF nothing to choose, its mask SAP's whatever it
         measured. Our pool rule, documented, headprune's construction: SAP's ranking at a larger target -- R
         lowered from ``ratio`` as SAP does to reach a sparsity (§4.1, "we gradually decrease R"), until
         round(pool·N) heads qualify, with the k SAP picks at the target s. ``pool`` = 0 (auto) is halfway between
         the target and every head, p = s + (1 − s)/2 (0.25 → 0.625, 0.5 → 0.75, 0.75 → 0.875): CF picks its
         target among (1 + s)/(2s) times as many heads (2.5x at 0.25, 1.5x at 0.5, 1.17x at 0.75), and SAP's most
         syntax-relevant heads, (1 − s)/2 of the grid, are never candidates, so SAP keeps its say ("SAP provides
         coarse-grained pruning ..., while CF refines the process", §4.2).
       A ``pool`` > 0 sets the pool itself (with ``cf_pool`` given: refused); a ``pool`` below ``sparsity`` is an
       error (CriterionError; a protocol names the key and its line).
§3.4 Whole-layer rule ("if the number of pruned heads in a layer exceeds a certain threshold, the entire layer is
     pruned"). Our reading: with ``layer_threshold`` = n > 0, a layer with more than n pruned heads is dropped: its
     encoder layer is skipped (output = input, feed-forward block included) and all its heads count as pruned (so
     more heads than a target sparsity may go). Off (0) by default; it needs per-layer modules, so not on ALBERT.
     Trajectories prune heads only and ignore it.

Open choices, documented:
* Attention values are word-level (headprune/syntax/align.py; mean over the dependent's sub-tokens of the sum
  over the head word's sub-tokens, Clark et al. 2019). θ is the mean of the same word-level values (every pair
  of words the model saw, every live head), so both sides of the comparison are on one scale.
* An arc's attention is the dependent's attention to its head (direction of the paper's Fig. 8). All spaCy
  labels count except ROOT (no arc); punctuation included, the paper excludes nothing.
* Values equal to θ count as neither below nor above.
* Dependency statistics come from the parses alone (every arc); counters and S from the arcs the model saw
  (arcs cut off by max length are dropped and reported).
* Tied ALBERT heads act in every layer: their counter is the mean over the layers (so cnt ≤ S still holds).
* Target sparsity is the fraction of all heads pruned, heads already pruned in the mask included.
* Without raw texts in the ScoringContext the calibration batches are decoded by the tokenizer and parsed (a
  warned fallback: an uncased tokenizer loses case, unknown words are lost).

ScoreMaps. ``sap``: −cnt (higher = kept longer). ``sap-cf``: the position in the pruning order CF implies: heads
CF prunes (in its order) first, then the rejected candidates (by degradation), then the other heads by descending
counter. Both put the selected mask, best k and the statistics in ``meta``.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import CriterionError
from ..evaluation.metrics import HIGHER_IS_BETTER, evaluate
from ..limits import NON_NEGATIVE, POSITIVE, UNIT, Interval
from ..model.arch import adapt
from ..model.layers import skip_layers
from ..model.mask import HeadMask
from ..scoring import Criterion, Param, ScoreMap, ScoringContext, register
from ..syntax import DEFAULT_PIPELINE, QUERY_REDUCE, ArcData, collect_arc_attention, parse_dataset

Head = tuple[int, int]
MetricFn = Callable[[HeadMask, list[int]], float]


# -- §3.2 dependency statistics ---------------------------------------------------------------------------------

@dataclass
class DependencyStats:
    labels: list[str]                # rank order: most frequent first (ties: alphabetical)
    counts: list[int]

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> DependencyStats:
        counts = Counter(labels)
        ranked = sorted(counts, key=lambda lab: (-counts[lab], lab))
        return cls(ranked, [counts[lab] for lab in ranked])

    @classmethod
    def from_parses(cls, parses: Sequence) -> DependencyStats:
        segments = [s for p in parses for s in (p if isinstance(p, tuple) else (p,))]
        return cls.from_labels(a.label for s in segments for a in s.arcs())

    def ranks(self) -> dict[str, int]:
        return {lab: r for r, lab in enumerate(self.labels, start=1)}

    def weights(self, k: int) -> dict[str, int]:
        """§3.2: top-k ranks weigh k..1, the others 1..(#labels − k)."""
        return {lab: (k - r + 1) if r <= k else (r - k) for lab, r in self.ranks().items()}

    def to_json(self, k: int) -> dict:
        weights = self.weights(k)
        return {"k": k, "labels": [{"label": lab, "count": c, "rank": r, "weight": weights[lab], "top_k": r <= k}
                                   for r, (lab, c) in enumerate(zip(self.labels, self.counts), start=1)]}


# -- §3.3 counters and selection --------------------------------------------------------------------------------

def sap_counters(values: np.ndarray, labels: Sequence[str], stats: DependencyStats, k: int,
                 threshold: float) -> tuple[np.ndarray, float]:
    """(cnt of every head, S) from arc attention ``values`` (..., n_arcs) with arc ``labels`` (module doc, §3.3)."""
    weights, ranks = stats.weights(k), stats.ranks()
    w = np.array([weights[lab] for lab in labels], dtype=float)
    top = np.array([ranks[lab] <= k for lab in labels], dtype=bool)
    counted = np.where(top, values < threshold, values > threshold)
    return (counted * w).sum(axis=-1), float(w.sum())


def layers_to_blocks(per_layer: np.ndarray, layer_to_block: Sequence[int], n_blocks: int) -> np.ndarray:
    """(n_blocks, H): mean over the forward layers that use each block (identity unless ALBERT)."""
    index = np.asarray(layer_to_block)
    return np.stack([per_layer[index == b].mean(axis=0) for b in range(n_blocks)])


def select_heads(counters: np.ndarray, total: float, ratio: float) -> list[Head]:
    """Eq. 1: heads with cnt ≥ S·R, by descending cnt (ties: layer, head); NaN (pruned) heads never qualify."""
    order = ScoreMap(-counters, "sap").order()
    return [(l, h) for l, h in order if counters[l, h] >= total * ratio]


def select_for_sparsity(counters: np.ndarray, total: float, n_prune: int, ratio: float = 0.5,
                        step: float = 0.05) -> tuple[list[Head], float]:
    """Lower R by ``step`` from ``ratio`` until ``n_prune`` heads qualify; returns (the n_prune heads, R used)."""
    while True:
        chosen = select_heads(counters, total, ratio)
        if len(chosen) >= n_prune or ratio <= 0:
            return chosen[:max(n_prune, 0)], ratio
        ratio = max(0.0, round(ratio - step, 10))


CF_POOLS = ("paper", "widened")   # CF's pool at a target sparsity when ``pool`` = 0 (module doc, §3.4)


def pool_fraction(sparsity: float, pool: float, cf_pool: str = "widened") -> float:
    """CF's candidate pool as a fraction of the grid (module doc, §3.4): ``pool`` when set, else (0, auto) halfway
    between the target ``sparsity`` and every head ("widened"); 0 for SAP's own S·R candidates (the tolerance mode,
    ``sparsity`` 0, and ``cf_pool`` "paper" at a target: their count is known once SAP has counted)."""
    if pool > 0 or sparsity <= 0 or cf_pool == "paper":
        return pool
    return sparsity + (1.0 - sparsity) / 2


def pool_rule(sparsity: float, pool: float, cf_pool: str = "widened") -> str:
    """Which pool CF filters, in words (said under a protocol's table and in a score file's meta)."""
    if pool > 0:
        return f"SAP's first round({pool:g}·N) heads (pool = {pool:g})"
    if sparsity <= 0 or cf_pool == "paper":
        return "the paper's: SAP's own candidates, the heads with cnt ≥ S·R (§3.4)"
    return "widened: SAP's ranking at s + (1 − s)/2 of the heads, headprune's construction"


def check_pool(sparsity: float, pool: float) -> str | None:
    """Why a ``pool`` cannot serve a target ``sparsity`` (None when it can): CF picks its target from the pool."""
    if sparsity > 0 and 0 < pool < sparsity:
        return (f"the candidate pool pool={pool:g} (a fraction of the heads) is smaller than the target "
                f"sparsity={sparsity:g}: candidate filtering prunes its target from the pool. Accepted: pool >= "
                f"sparsity, or pool = 0 (auto: halfway between the target and every head)")
    return None


def apply_layer_rule(mask: HeadMask, layer_threshold: int) -> tuple[HeadMask, list[int]]:
    """§3.4: layers with more than ``layer_threshold`` pruned heads are dropped whole (0 = rule off)."""
    if layer_threshold <= 0:
        return mask, []
    dropped = [l for l, n in enumerate((mask.values == 0).sum(dim=1).tolist()) if n > layer_threshold]
    values = mask.values.clone()
    values[dropped] = 0.0
    return HeadMask(values), dropped


@dataclass
class SapResult:
    k: int
    counters: np.ndarray             # (n_blocks, H), NaN for heads already pruned
    total: float                     # S
    selected: list[Head]             # by descending counter
    ratio: float                     # R that produced the selection
    mask: HeadMask
    dropped_layers: list[int]
    metric: float | None = None
    sweep: dict[int, float] = field(default_factory=dict)


def run_sap(data: ArcData, stats: DependencyStats, base: HeadMask, layer_to_block: Sequence[int], k: int = 0,
            k_max: int = 10, ratio: float = 0.5, ratio_step: float = 0.05, sparsity: float = 0.0,
            layer_threshold: int = 0, metric_fn: MetricFn | None = None,
            progress: Callable[[float, str], None] | None = None) -> SapResult:
    """SAP selection for one k, or the best k of 1..k_max by ``metric_fn`` (§3.3, §4.1)."""
    ks = [k] if k else list(range(1, min(k_max, len(stats.labels)) + 1))
    if not ks:
        raise CriterionError("SAP found no dependency arcs in the calibration texts; it needs parsable sentences.")
    if len(ks) > 1 and metric_fn is None:
        raise CriterionError("Sweeping k needs a metric on labelled calibration data; give a fixed k (1..10).")
    live = layers_to_blocks(data.live.astype(float), layer_to_block, base.shape[0]) > 0
    n_prune = round(sparsity * base.values.numel()) - base.n_pruned if sparsity > 0 else None
    results = []
    for i, kk in enumerate(ks):
        per_layer, total = sap_counters(data.values, data.labels, stats, kk, data.threshold)
        counters = np.where(live, layers_to_blocks(per_layer, layer_to_block, base.shape[0]), np.nan)
        if n_prune is None:
            selected, used = select_heads(counters, total, ratio), ratio
        else:
            selected, used = select_for_sparsity(counters, total, n_prune, ratio, ratio_step)
        mask = base
        for head in selected:
            mask = mask.prune(*head)
        mask, dropped = apply_layer_rule(mask, layer_threshold)
        metric = metric_fn(mask, dropped) if len(ks) > 1 else None
        results.append(SapResult(kk, counters, total, selected, used, mask, dropped, metric))
        if progress is not None:
            progress((i + 1) / len(ks), f"SAP k={kk}: {len(selected)} heads selected")
    best = max(results, key=lambda r: (-np.inf if r.metric is None else r.metric, -r.k))
    best.sweep = {r.k: r.metric for r in results if r.metric is not None}
    return best


# -- §3.4 candidate filtering -----------------------------------------------------------------------------------

@dataclass
class CFResult:
    dense: float                     # m0: metric of the model as given
    floor: float                     # tolerance · m0
    degradation: dict[Head, float]   # m0 − metric with the candidate pruned alone
    order: list[Head]                # candidates by ascending degradation
    selected: list[Head]             # heads pruned, in order
    trace: list[float]               # metric after each accepted head
    mask: HeadMask
    dropped_layers: list[int]
    rejected: tuple[Head, float] | None = None   # first head that would fall below the floor, and that metric


def candidate_filtering(candidates: Sequence[Head], metric_fn: MetricFn, base: HeadMask, tolerance: float,
                        layer_threshold: int = 0,
                        progress: Callable[[float, str], None] | None = None,
                        n_target: int | None = None) -> CFResult:
    """§3.4 (module doc): rank candidates by single-head degradation, then prune in that order: cumulatively while
    the metric stays ≥ tolerance · m0 (``n_target`` None: the paper's tolerance mode), or the first ``n_target``
    of the ranking (a target sparsity: no stop, one evaluation of the result in ``trace``)."""
    def metric(mask: HeadMask) -> float:
        return metric_fn(*apply_layer_rule(mask, layer_threshold))

    if n_target is not None and n_target > len(candidates):
        raise CriterionError(f"Candidate filtering was asked to prune {n_target} heads from a pool of "
                             f"{len(candidates)} candidates; the pool must hold at least the target.")
    steps, done = len(candidates) + 1 + (1 if n_target is not None else len(candidates)), 0

    def report(message: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / steps, message)

    dense = metric_fn(base, [])
    report("candidate filtering: dense model")
    degradation = {}
    for c in candidates:
        degradation[c] = dense - metric(base.prune(*c))
        report(f"candidate filtering: head {c} alone")
    order = sorted(candidates, key=lambda c: degradation[c])     # stable: ties keep SAP's order
    floor = tolerance * dense
    if n_target is not None:
        mask = base
        for c in order[:n_target]:
            mask = mask.prune(*c)
        trace = [metric(mask)]
        report(f"candidate filtering: {n_target} heads")
        final, dropped = apply_layer_rule(mask, layer_threshold)
        return CFResult(dense, floor, degradation, order, list(order[:n_target]), trace, final, dropped)
    mask, selected, trace, rejected = base, [], [], None
    for c in order:
        value = metric(mask.prune(*c))
        report(f"candidate filtering: {len(selected) + 1} heads")
        if value < floor:
            rejected = (c, value)
            break
        mask = mask.prune(*c)
        selected.append(c)
        trace.append(value)
    final, dropped = apply_layer_rule(mask, layer_threshold)
    return CFResult(dense, floor, degradation, order, selected, trace, final, dropped, rejected)


# where a ScoreMap of sap / sap-cf keeps its own selection at its ``sparsity`` parameter: (mask key, dropped layers)
OWN_SELECTION = {"sap": ("sap_mask", "sap_dropped_layers"), "sap-cf": ("mask", "dropped_layers")}


def layer_rule_json(mask: HeadMask, dropped_layers: Sequence[int]) -> dict:
    """A mask file that carries SAP's whole-layer rule (§3.4): the heads, plus ``"dropped_layers"`` (the layers
    skipped whole, feed-forward block included), which ``evaluate`` and ``prune`` apply
    (``headprune.model.mask.dropped_layers``)."""
    return {**mask.to_json(), "dropped_layers": [int(layer) for layer in dropped_layers]}


def levels_json(results: dict[float, SapResult]) -> dict:
    """``SAP.per_sparsity`` results for a score file: per level (key ``str(level)``) its best k, the k sweep on the
    selection data, the selected heads and the mask with the layer rule (``layer_rule_json``)."""
    return {str(level): {"best_k": r.k, "k_sweep": {str(k): v for k, v in r.sweep.items()}, "ratio_used": r.ratio,
                         "selected": _heads_json(r.selected), "mask": layer_rule_json(r.mask, r.dropped_layers)}
            for level, r in results.items()}


# -- criteria -------------------------------------------------------------------------------------------------------

def calibration_metric(ctx: ScoringContext, name: str) -> MetricFn:
    """metric(mask, dropped layers) on the selection batches (``ctx.selection``: the selection role, else the
    calibration batches; "auto": accuracy, Pearson for regression, next-token accuracy for a language model).

    The k sweep keeps the k with the highest metric and candidate filtering keeps heads while the metric stays above
    tolerance · m0, so only metrics where higher is better are accepted (perplexity or loss would invert both)."""
    memo: dict[tuple, float] = {}

    def metric(mask: HeadMask, dropped: list[int]) -> float:
        key = (hash(mask), tuple(dropped))
        if key not in memo:
            with skip_layers(adapt(ctx.model), dropped):
                values = {k: v for k, v in evaluate(ctx.model, ctx.selection, mask).to_dict().items()
                          if v is not None and HIGHER_IS_BETTER.get(k, False)}
            chosen = name if name != "auto" else next(
                (m for m in ("accuracy", "pearson", "next_token_accuracy") if m in values), None)
            if chosen not in values:
                raise CriterionError(f"metric={name!r} is not available for this task (it must be one where higher "
                                     f"is better); accepted: auto, {', '.join(sorted(values))}.")
            memo[key] = float(values[chosen])
        return memo[key]

    return metric


FRACTION = Interval(0, 1, closed="left")


def _heads_json(heads: Iterable[Head]) -> list[list[int]]:
    return [[int(l), int(h)] for l, h in heads]


def _grid_json(a: np.ndarray) -> list[list[float | None]]:
    return [[None if np.isnan(v) else float(v) for v in row] for row in a]


class _SapBase(Criterion):
    needs_parser = True
    needs_labels = True              # the default k = 0 picks k on the calibration metric; a fixed k needs none
    params = {
        "k": Param(0, "top-k dependency labels counted as important (0 = sweep 1..k_max, keep the best)", int,
                   NON_NEGATIVE),
        "k_max": Param(10, "largest k of the sweep", int, POSITIVE),
        "ratio": Param(0.5, "pruning ratio R: heads with cnt ≥ S·R are selected", float, NON_NEGATIVE),
        "ratio_step": Param(0.05, "how much R is lowered at a time to reach the target sparsity", float, POSITIVE),
        "sparsity": Param(0.5, "target fraction of heads pruned (0 = select by R alone)", float, FRACTION),
        "layer_threshold": Param(0, "drop a whole layer when more than this many of its heads are pruned (0 = off)",
                                 int, NON_NEGATIVE),
        "metric": Param("auto", "calibration metric that picks k, higher is better (auto: accuracy, Pearson for "
                                "regression, next-token accuracy for an LM)", str),
        "parser": Param(DEFAULT_PIPELINE, "installed spaCy pipeline with a dependency parser", str),
        "query_reduce": Param("mean", "sub-token aggregation of the dependent (Clark et al.: mean)", str,
                              choices=QUERY_REDUCE),
        "max_length": Param(128, "tokens per text (arcs beyond are dropped and counted)", int, POSITIVE),
    }

    def requires_labels(self, params: dict) -> bool:
        return params["k"] == 0

    def selection_work(self, ctx: ScoringContext, params: dict) -> float:
        """The k sweep (k = 0): one evaluation of the selection rows per k of 1..k_max (at most: fewer when the
        parses hold fewer labels, or two k give one mask)."""
        return float(params["k_max"]) if params["k"] == 0 and params["k_max"] > 1 else 0.0

    def _texts(self, ctx: ScoringContext) -> list:
        """The raw calibration texts; without them, the batches decoded by the tokenizer (lossy, warned)."""
        if ctx.tokenizer is None:
            raise CriterionError(f"Criterion '{self.name}' parses the calibration texts: the scoring context needs "
                                 "the model's tokenizer (tokenizer=...) and the raw texts (texts=...).")
        if ctx.texts is not None:
            return list(ctx.texts)
        warnings.warn(f"'{self.name}' was given no raw texts; it parses the calibration batches decoded by the "
                      "tokenizer (case and unknown words may be lost). Pass ScoringContext(texts=...).", stacklevel=3)
        return [t for b in ctx.calib for t in ctx.tokenizer.batch_decode(b["input_ids"], skip_special_tokens=True)]

    def _arc_data(self, ctx: ScoringContext, parser: str, query_reduce: str, max_length: int):
        key = ("sap-arcs", parser, query_reduce, max_length, None if ctx.mask is None else hash(ctx.mask))
        if key not in ctx.cache:
            parses = parse_dataset(self._texts(ctx), parser)
            ctx.report(0.0, "attention on dependency arcs")
            data = collect_arc_attention(ctx.model, ctx.tokenizer, parses, ctx.mask, max_length, query_reduce,
                                         progress=lambda f, m: ctx.report(0.4 * f, m))
            ctx.cache[key] = (DependencyStats.from_parses(parses), data)
        return ctx.cache[key]

    def _sap(self, ctx: ScoringContext, p: dict) -> tuple[SapResult, DependencyStats, ArcData]:
        stats, data = self._arc_data(ctx, p["parser"], p["query_reduce"], p["max_length"])
        adapter = adapt(ctx.model)
        base = ctx.mask if ctx.mask is not None else HeadMask.ones(adapter.grid_shape)
        metric_fn = calibration_metric(ctx, p["metric"]) \
            if p["k"] == 0 or self.name == "sap-cf" else None
        result = run_sap(data, stats, base, adapter.layer_to_block, p["k"], p["k_max"], p["ratio"], p["ratio_step"],
                         p["sparsity"], p["layer_threshold"], metric_fn,
                         progress=lambda f, m: ctx.report(0.4 + 0.2 * f, m))
        return result, stats, data

    @staticmethod
    def _meta(result: SapResult, stats: DependencyStats, data: ArcData) -> dict:
        return {"best_k": result.k, "k_sweep": {str(k): v for k, v in result.sweep.items()},
                "counters": _grid_json(result.counters), "S": result.total, "threshold": data.threshold,
                "ratio_used": result.ratio, "sap_selected": _heads_json(result.selected),
                "sap_mask": result.mask.to_json(), "sap_dropped_layers": result.dropped_layers,
                "dependency_stats": stats.to_json(result.k), "arcs": len(data.labels),
                "dropped_arcs": data.dropped, "multi_sentence_texts": data.n_multi_sentence}


@register
class SAP(_SapBase):
    name = "sap"
    description = "Syntactic Attention Pruning: weighted count of dependency arcs a head under- or over-attends."
    reference = "sap-syntactic-attention-pruning.txt §3.2-3.3, eq. 1"
    latex = (r"cnt_{l,h}=\sum_{a}w(\ell_a)\big([\ell_a\in\mathrm{top}_k][A^{l,h}_a<\theta]+"
             r"[\ell_a\notin\mathrm{top}_k][A^{l,h}_a>\theta]\big),\ \text{prune if } cnt_{l,h}\ge S\cdot R")

    def per_sparsity(self, ctx: ScoringContext, levels: Iterable[float], params: dict | None = None
                     ) -> dict[float, SapResult]:
        """The paper's protocol (§4.1, Fig. 7): at each target sparsity its own selection with its own best k
        (one parse and one attention pass shared by all levels), k chosen by the metric on the selection batches
        (``ctx.selection``: the selection role, else the calibration batches). These masks need not be nested, so
        they are reported per level instead of as one pruning order (module doc); ``levels_json`` writes them for a
        score file."""
        resolved = self.prepare(ctx, params)
        return {float(level): self._sap(ctx, {**resolved, "sparsity": self.params["sparsity"].parse("sparsity",
                                                                                                     level)})[0]
                for level in levels}

    def score(self, ctx: ScoringContext, **p) -> ScoreMap:
        result, stats, data = self._sap(ctx, p)
        ctx.report(1.0, f"SAP: best k = {result.k}")
        return ScoreMap(-result.counters, self.name, p, self._meta(result, stats, data))


@register
class SAPCandidateFiltering(_SapBase):
    name = "sap-cf"
    description = ("SAP candidates (a pool larger than the target) re-ranked by measured single-head degradation, "
                   "pruned to the target sparsity or while the metric stays ≥ tolerance.")
    reference = "sap-syntactic-attention-pruning.txt §3.4"
    latex = r"\text{prune candidates by ascending } m_0-m(c)\ \text{while } m \ge \tau\, m_0"
    needs_labels = True
    params = {**_SapBase.params,
              "sparsity": Param(0.0, "target fraction of heads pruned: CF prunes that many of its degradation "
                                "ranking of the pool (0 = the paper's mode: prune while the metric stays ≥ "
                                "tolerance, the sparsity reached is CF's result)", float, FRACTION),
              "pool": Param(0.0, "candidate pool, a fraction of the heads: SAP's first round(pool·N) heads (0 = "
                                 "auto: cf_pool's rule at a target sparsity; with sparsity 0, the heads with "
                                 "cnt ≥ S·R)", float, UNIT),
              "cf_pool": Param("widened", "CF's pool at a target sparsity when pool = 0: 'paper' (SAP's own "
                                          "candidates, cnt ≥ S·R at the R SAP used for the target) or 'widened' "
                                          "(SAP's ranking at s + (1 − s)/2 of the heads, headprune's construction)",
                               str, choices=CF_POOLS),
              "tolerance": Param(0.9, "keep at least this fraction of the dense calibration metric (sparsity 0)",
                                 float, Interval(0, 1, closed="right"))}

    def requires_labels(self, params: dict) -> bool:
        return True

    def selection_work(self, ctx: ScoringContext, params: dict) -> float:
        """SAP's k sweep, then candidate filtering on the selection rows: the model as given, each pool head alone,
        then the target's mask (one evaluation) or each cumulative step (tolerance mode: at most the pool). The
        pool is ``candidates``' count, capped at the live heads; the S·R pool (``pool`` = 0, tolerance mode) is
        known only once SAP has counted, so every live head stands in for it (an upper bound)."""
        live = adapt(ctx.model).live_grid()
        if ctx.mask is not None:
            live &= ctx.mask.keep_bool()
        fraction = pool_fraction(params["sparsity"], params["pool"], params["cf_pool"])
        already = ctx.mask.n_pruned if ctx.mask is not None else 0
        n_pool = int(live.sum()) if fraction <= 0 else min(max(round(fraction * live.numel()) - already, 0),
                                                            int(live.sum()))
        return super().selection_work(ctx, params) + 1 + n_pool + (1 if params["sparsity"] > 0 else n_pool)

    def resolve_params(self, given: dict | None) -> dict:
        """Each parameter checked alone, then the pool against the target (``check_pool``)."""
        resolved = super().resolve_params(given)
        problem = check_pool(resolved["sparsity"], resolved["pool"])
        if problem:
            raise CriterionError(f"Parameter pool={resolved['pool']!r}: {problem}.")
        if given and "cf_pool" in given and resolved["pool"] > 0:   # refused, never ignored: pool sets the pool
            raise CriterionError(f"Parameter cf_pool={given['cf_pool']!r} applies to pool = 0 only; pool="
                                 f"{resolved['pool']!r} sets CF's pool itself (SAP's first round(pool·N) heads). "
                                 "Give one of the two.")
        # a written sparsity = 0 only: a protocol checks its params before each cell gives its sparsity
        if given and given.get("cf_pool") == "widened" and "sparsity" in given and resolved["sparsity"] == 0:
            raise CriterionError("Parameter cf_pool='widened' applies to a target sparsity only; with sparsity=0 "
                                 "(the paper's tolerance mode) CF's pool is SAP's own candidates, cnt >= S·R. Give "
                                 "a sparsity > 0, or leave cf_pool out.")
        if given and "tolerance" in given and resolved["sparsity"] > 0:   # refused, never ignored
            raise CriterionError(f"Parameter tolerance={given['tolerance']!r} applies to sparsity 0 only (the "
                                 "paper's mode: prune while the metric stays >= tolerance x dense); with sparsity="
                                 f"{resolved['sparsity']!r} CF prunes that share of the heads and no tolerance acts. "
                                 "Give one of the two.")
        return resolved

    def candidates(self, ctx: ScoringContext, p: dict) -> tuple[SapResult, DependencyStats, ArcData,
                                                                  list[Head], int | None]:
        """(SAP at the target with its best k, stats, arcs, CF's pool, the number of heads to prune or None for
        the tolerance mode): the pool rule of the module doc."""
        result, stats, data = self._sap(ctx, p)
        fraction = pool_fraction(p["sparsity"], p["pool"], p["cf_pool"])
        base = ctx.mask if ctx.mask is not None else HeadMask.ones(result.mask.shape)
        n_target = round(p["sparsity"] * base.values.numel()) - base.n_pruned if p["sparsity"] > 0 else None
        if fraction <= 0:   # SAP's own candidates: cnt ≥ S·R at the R SAP used (at the target, or ``ratio``)
            pool = select_heads(result.counters, result.total, result.ratio)
            return result, stats, data, pool, None if n_target is None else max(min(n_target, len(pool)), 0)
        n_pool = round(fraction * base.values.numel()) - base.n_pruned
        pool, _ = select_for_sparsity(result.counters, result.total, n_pool, p["ratio"], p["ratio_step"])
        return result, stats, data, pool, None if n_target is None else max(min(n_target, len(pool)), 0)

    def filtered(self, ctx: ScoringContext, p: dict) -> tuple[SapResult, DependencyStats, ArcData, list[Head],
                                                               CFResult]:
        result, stats, data, pool, n_target = self.candidates(ctx, p)
        base = ctx.mask if ctx.mask is not None else HeadMask.ones(result.mask.shape)
        cf = candidate_filtering(pool, calibration_metric(ctx, p["metric"]), base, p["tolerance"],
                                 p["layer_threshold"], progress=lambda f, m: ctx.report(0.6 + 0.4 * f, m),
                                 n_target=n_target)
        return result, stats, data, pool, cf

    def per_sparsity(self, ctx: ScoringContext, levels: Iterable[float], params: dict | None = None
                     ) -> dict[float, SapResult]:
        """CF's own selection at each target sparsity (module doc), as ``SAP.per_sparsity`` gives SAP's: each a
        SapResult whose ``selected``, ``mask`` and ``dropped_layers`` are CF's (``k``, ``sweep``: SAP's at that
        target)."""
        resolved = self.prepare(ctx, params)
        out = {}
        for level in levels:
            # the resolved default tolerance is no user's choice: left out, as a given one at a level is refused
            # so is a default cf_pool (a given one beside a pool > 0 is refused)
            p = {**{k: v for k, v in resolved.items() if k != "tolerance"
                    and not (k == "cf_pool" and v == self.params["cf_pool"].default)},
                 "sparsity": self.params["sparsity"].parse("sparsity", level)}
            result, _, _, _, cf = self.filtered(ctx, self.resolve_params(p))
            out[float(level)] = SapResult(result.k, result.counters, result.total, cf.selected, result.ratio,
                                          cf.mask, cf.dropped_layers, cf.trace[-1] if cf.trace else cf.dense,
                                          result.sweep)
        return out

    def score(self, ctx: ScoringContext, **p) -> ScoreMap:
        result, stats, data, pool, cf = self.filtered(ctx, p)
        rest = [h for h in ScoreMap(-result.counters, "sap").order() if h not in cf.order]
        pruning_order = cf.selected + [h for h in cf.order if h not in cf.selected] + rest
        scores = np.full(result.counters.shape, np.nan)
        for position, (l, h) in enumerate(pruning_order):
            scores[l, h] = position
        meta = {**self._meta(result, stats, data), "mask": cf.mask.to_json(), "selected": _heads_json(cf.selected),
                "dropped_layers": cf.dropped_layers, "dense_metric": cf.dense, "floor": cf.floor,
                "pool": _heads_json(pool), "pool_fraction": pool_fraction(p["sparsity"], p["pool"], p["cf_pool"]),
                "pool_rule": pool_rule(p["sparsity"], p["pool"], p["cf_pool"]),
                "mode": "target" if p["sparsity"] > 0 else "tolerance",
                "sparsity_reached": cf.mask.n_pruned / cf.mask.values.numel(),
                "metric_trace": cf.trace, "degradation": {f"{l},{h}": d for (l, h), d in cf.degradation.items()},
                "rejected": None if cf.rejected is None else {"head": list(cf.rejected[0]), "metric": cf.rejected[1]}}
        return ScoreMap(scores, self.name, p, meta)
