"""Progressive evaluation: a running estimate of the headline metric, with a 95% interval, while batches arrive.

The evaluation batches are visited in a seeded random order, so after n of the N batches the batches seen are a
simple random sample, without replacement, of *clusters* (a batch is a cluster of rows). The headline metric is a
ratio of per-batch totals over per-batch sizes,

    accuracy    R = Σ_i y_i / Σ_i m_i,  y_i correct predictions in batch i, m_i its rows,
    LM loss     R = Σ_i y_i / Σ_i m_i,  y_i summed next-token loss of batch i, m_i its real targets
                (perplexity = exp(R); the interval is mapped through exp, which is monotone),

and R over the sample is the ratio estimator of the full-set value (Cochran, *Sampling Techniques*, 3rd ed.,
§6.2 and §9.4 for cluster sampling with unequal cluster sizes). Its estimated variance, with the
finite-population correction 1 − n/N, is

    v(R) = (1 − n/N) / (n · M̄²) · Σ_i (y_i − R m_i)² / (n − 1),     M̄ = (Σ_all m) / N  (known: every batch's size),

and the interval R ± t √v(R), t the 97.5% quantile of Student's t with n − 1 degrees of freedom (with a handful of
batches the normal 1.96 under-covers: measured 0.85 on the demo), is clipped to the metric's range. With n = N the
correction is 0 and the interval collapses onto the exact value. Batches are length-sorted, so rows inside a batch
are alike: treating batches (not rows) as the sampled units is what keeps the interval honest at many batches.

At few rows that interval is not honest (issue 45: two batches of one row each, both right, gave "1.000 ± 0.000":
every residual is zero). An accuracy is a count, so ``count_estimate`` also inverts the exact test of that count:
x correct among the n rows seen, drawn without replacement from the N rows of the set, of which K are correct
(unknown), is hypergeometric, and the interval for K is Clopper and Pearson's construction on that distribution
(Clopper & Pearson, Biometrika 26, 1934; for sampling without replacement the hypergeometric replaces the
binomial: Cochran, ch. 3, and T. Wright, *Exact Confidence Bounds when Sampling from Small Finite Universes*, 1991),

    K_low  = min { K : P(X ≥ x | K) > α/2 },      K_high = max { K : P(X ≤ x | K) > α/2 },      α = 0.05,

searched over the K the data allow (x ≤ K ≤ x + N − n). It is exact at any size for rows drawn one by one: with
batches of one row it gives an interval from the first batch. Rows of a batch are alike, though, so with bigger
batches an interval waits for the second batch, and the interval shown is the hull of the exact one and the
cluster one above (the cluster one answers for rows alike within a batch, the exact one for few rows): in the
seeded simulation of tests/test_progressive.py, batch accuracies spread by 0.15 around the set's, the hull from the
second batch of 32 held the exact value 0.974 of the time, where the exact interval alone from the first batch held
it 0.941 of the time (a larger run of the same simulation: 10 sets x 20 orders). Before the last
batch it is never a single value: when the test leaves one K (all n rows right and n ≥ 97.5 % of N), the interval
is widened to the next K the data allow (a wider interval only covers more). A perplexity has no count: its
cluster interval is given only when it has a width (n ≥ 2 batches whose mean losses differ); a zero-width interval
before the last batch is no interval, and none is shown.

Every run draws a fresh order (``visit_order`` with a per-run seed, ``LiveEvaluator``): with one fixed order every
click would start from the same first batch, and its error would point the same way on every click (issue 35: the
demo's first batch read 0.875 above a dense 0.840, so every cut first seemed to *raise* accuracy).

When a running value is worth showing (``Estimate.shown``) is our choice, the sources leave it open: once the 95%
interval's full width on the estimator's own scale is at most ``MAX_WIDTH`` (accuracy: 0.06, i.e. about ±3 points)
or, for perplexity, ``LOG_MAX_WIDTH`` on the log scale (log 1.10: the interval's ends within a factor 1.10 of each
other, about ±5 %). Before that a page shows the last exact value and "computing…", never a number whose interval
spans a factor of forty (demo-lm's 37.8–1626.9 after two batches).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln
from scipy.stats import t as student_t

MAX_WIDTH = 0.06                 # accuracy-like metrics: widest 95% interval (high - low) worth showing as a number
LOG_MAX_WIDTH = math.log(1.10)   # perplexity: widest interval of the log (the mean loss), a factor 1.10 end to end


@dataclass(frozen=True)
class Estimate:
    """A running value of ``metric`` after ``done`` of ``total`` batches; ``low``/``high`` None while there is no
    honest interval yet (a ratio below 2 batches, or one of zero width before the last batch)."""

    metric: str
    value: float
    low: float | None
    high: float | None
    done: int
    total: int
    rows: int
    width: float | None = None       # high - low on the estimator's own scale (mean loss for perplexity)
    max_width: float = MAX_WIDTH     # the widest ``width`` shown as a number (module doc)
    log_scale: bool = False          # the interval was computed for the log of the metric (perplexity)

    @property
    def exact(self) -> bool:
        return self.done == self.total

    @property
    def shown(self) -> bool:
        """Whether the running value is precise enough to be shown as a number (module doc): exact, or its interval
        no wider than ``max_width``."""
        return self.exact or (self.width is not None and self.width <= self.max_width)

    @property
    def rule(self) -> str:
        """The width rule in words, for the page that holds a value back."""
        if self.log_scale:
            return (f"its 95% interval's ends are within a factor {math.exp(self.max_width):.2f} of each other "
                    f"(about ±{50 * (math.exp(self.max_width) - 1):.0f} %)")
        return f"its 95% interval is at most {self.max_width:g} wide"

    def covers(self, value: float) -> bool:
        return self.low is not None and self.low <= value <= self.high


def ratio_estimate(totals, sizes, population_sizes, metric: str, bounds: tuple[float, float] = (0.0, 1.0),
                   transform: Callable[[float], float] | None = None, level: float = 0.95,
                   max_width: float | None = None) -> Estimate:
    """Ratio estimate and interval (module doc) from the per-batch ``totals`` y_i and ``sizes`` m_i seen so far.

    Parameters
    ----------
    totals, sizes : (n,) per-batch totals and sizes of the batches evaluated so far.
    population_sizes : (N,) sizes of every batch of the full set.
    bounds : the range of R (accuracy [0, 1]; LM loss [0, inf)).
    transform : applied to the value and both ends (exp for perplexity: the interval is computed for the mean
        loss, i.e. on the log scale of perplexity, and mapped through exp, which is monotone).
    max_width : the widest interval (on R's scale, before ``transform``) shown as a number; default
        ``MAX_WIDTH`` without a transform, ``LOG_MAX_WIDTH`` with one.
    """
    y, m = np.asarray(totals, dtype=np.float64), np.asarray(sizes, dtype=np.float64)
    n, big_n = len(y), len(population_sizes)
    ratio = float(y.sum() / m.sum())
    low, high = _cluster_interval(y, m, population_sizes, ratio, bounds, level)
    if low is not None and high - low <= 0 and n < big_n:
        low = high = None     # every batch alike so far: no honest interval yet (module doc)
    f = transform or (lambda v: v)
    limit = max_width if max_width is not None else (MAX_WIDTH if transform is None else LOG_MAX_WIDTH)
    return Estimate(metric, f(ratio), None if low is None else f(low), None if high is None else f(high), n, big_n,
                    int(m.sum()), None if low is None else high - low, limit, transform is not None)


def _cluster_interval(y: np.ndarray, m: np.ndarray, population_sizes, ratio: float, bounds: tuple[float, float],
                      level: float) -> tuple[float | None, float | None]:
    """R ± t √v(R) of the module doc, clipped to ``bounds``; (None, None) below two batches."""
    n = len(y)
    if n < 2:
        return None, None
    population = np.asarray(population_sizes, dtype=np.float64)
    mean_size = population.sum() / len(population)
    residual = ((y - ratio * m) ** 2).sum() / (n - 1)
    variance = max(0.0, 1.0 - n / len(population)) / (n * mean_size**2) * residual
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * math.sqrt(variance)
    return max(bounds[0], ratio - half), min(bounds[1], ratio + half)


def count_interval(correct: int, seen: int, population: int, level: float = 0.95) -> tuple[int, int]:
    """(K_low, K_high): the exact interval of the module doc for the number K of correct rows among
    ``population``, after ``correct`` of ``seen`` rows drawn without replacement were correct; never a single value
    while rows are unseen."""
    x, n, big_n = int(correct), int(seen), int(population)
    if not 0 <= x <= n <= big_n:
        raise ValueError(f"need 0 <= correct ({x}) <= seen ({n}) <= population ({big_n})")
    unseen = big_n - n
    tail = (1.0 - level) / 2
    # P(X >= x | K) grows with K and P(X <= x | K) shrinks: each bound is a bisection over the K the data allow
    # (K = x + unseen passes the first test and K = x the second, so neither set is empty)
    k_low = _first(x, x + unseen, lambda k: _tail(x, n, big_n, k, upper=True) > tail)
    k_high = _first(x, x + unseen, lambda k: not _tail(x, n, big_n, k, upper=False) > tail) - 1
    k_low, k_high = min(k_low, k_high), max(k_low, k_high)
    if unseen and k_low == k_high:      # one K left: widen to the next K the data allow (module doc)
        if k_high < x + unseen:
            k_high += 1
        else:
            k_low -= 1
    return k_low, k_high


def _tail(x: int, n: int, big_n: int, k: int, upper: bool) -> float:
    """P(X >= x) (``upper``) or P(X <= x) for X hypergeometric: ``n`` drawn from ``big_n`` of which ``k`` are
    marked, summed in log space over the counts j the draw allows (one vector of log-gamma terms: fast enough for
    a bisection on every running estimate)."""
    first, last = max(0, n - (big_n - k)), min(n, k)
    j = np.arange(max(first, x), last + 1) if upper else np.arange(first, min(x, last) + 1)
    if not len(j):
        return 0.0
    log_pmf = _log_choose(k, j) + _log_choose(big_n - k, n - j) - _log_choose(big_n, n)
    top = log_pmf.max()
    return float(np.exp(top) * np.exp(log_pmf - top).sum())


def _log_choose(a, b):
    a, b = np.float64(a), np.asarray(b, dtype=np.float64)
    return gammaln(a + 1) - gammaln(b + 1) - gammaln(a - b + 1)


def _first(low: int, high: int, holds: Callable[[int], bool]) -> int:
    """The smallest k in [low, high] where the monotone ``holds`` (False ... False True ... True) is True; high + 1
    when it never is."""
    high += 1
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return low


def count_estimate(correct, sizes, population_sizes, metric: str, level: float = 0.95,
                   max_width: float | None = None) -> Estimate:
    """Running accuracy (a share of rows, or of questions) after the batches seen: per-batch ``correct`` counts and
    ``sizes`` rows, of ``population_sizes`` (every batch's rows). The interval is the hull of the exact count
    interval (``count_interval``) and the cluster ratio interval (``ratio_estimate``'s), module doc."""
    y, m = np.asarray(correct, dtype=np.float64), np.asarray(sizes, dtype=np.float64)
    seen, total_rows = int(m.sum()), int(sum(population_sizes))
    ratio = float(y.sum() / m.sum())
    limit = MAX_WIDTH if max_width is None else max_width
    if len(y) == len(population_sizes):       # every batch is in: the exact value
        return Estimate(metric, ratio, ratio, ratio, len(y), len(y), seen, 0.0, limit)
    if len(y) < 2 and max(population_sizes) > 1:    # one batch of alike rows says nothing of the others (module doc)
        return Estimate(metric, ratio, None, None, len(y), len(population_sizes), seen, None, limit)
    k_low, k_high = count_interval(int(round(y.sum())), seen, total_rows, level)
    low, high = k_low / total_rows, k_high / total_rows
    cluster_low, cluster_high = _cluster_interval(y, m, population_sizes, ratio, (0.0, 1.0), level)
    if cluster_low is not None:
        low, high = min(low, cluster_low), max(high, cluster_high)
    return Estimate(metric, ratio, low, high, len(y), len(population_sizes), seen, high - low, limit)


def visit_order(n_batches: int, seed: int | Sequence[int] = 0) -> list[int]:
    """The seeded random order in which batches are evaluated (a permutation of 0..n_batches-1); ``seed`` may be
    a sequence (an evaluator's seed and its run number: a fresh order per run)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n_batches)]
