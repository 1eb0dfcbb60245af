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
are alike: treating batches (not rows) as the sampled units is what keeps the interval honest. Below two batches no
interval is given.

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
from scipy.stats import t as student_t

MAX_WIDTH = 0.06                 # accuracy-like metrics: widest 95% interval (high - low) worth showing as a number
LOG_MAX_WIDTH = math.log(1.10)   # perplexity: widest interval of the log (the mean loss), a factor 1.10 end to end


@dataclass(frozen=True)
class Estimate:
    """A running value of ``metric`` after ``done`` of ``total`` batches; ``low``/``high`` None below 2 batches."""

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
    population = np.asarray(population_sizes, dtype=np.float64)
    n, big_n = len(y), len(population)
    ratio = float(y.sum() / m.sum())
    low = high = None
    if n >= 2:
        mean_size = population.sum() / big_n
        residual = ((y - ratio * m) ** 2).sum() / (n - 1)
        variance = max(0.0, 1.0 - n / big_n) / (n * mean_size**2) * residual
        half = float(student_t.ppf(0.5 + level / 2, n - 1)) * math.sqrt(variance)
        low, high = max(bounds[0], ratio - half), min(bounds[1], ratio + half)
    f = transform or (lambda v: v)
    limit = max_width if max_width is not None else (MAX_WIDTH if transform is None else LOG_MAX_WIDTH)
    return Estimate(metric, f(ratio), None if low is None else f(low), None if high is None else f(high), n, big_n,
                    int(m.sum()), None if low is None else high - low, limit, transform is not None)


def visit_order(n_batches: int, seed: int | Sequence[int] = 0) -> list[int]:
    """The seeded random order in which batches are evaluated (a permutation of 0..n_batches-1); ``seed`` may be
    a sequence (an evaluator's seed and its run number: a fresh order per run)."""
    return [int(i) for i in np.random.default_rng(seed).permutation(n_batches)]
