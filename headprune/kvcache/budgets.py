"""Per-group KV budgets from any score under a total token budget: HeadKV's allocation.

HeadKV (Fu et al. 2024, "Not All Heads Matter: A Head-Level KV Cache Compression Method with Integrated Retrieval
and Reasoning", arXiv 2410.19258, §3.3; reference code FYYFU/HeadKV ``headkv/snapkv_utils.py``,
``ReasonSnapKVCluster``) gives every head a shared base budget and distributes a pool in proportion to the head's
normalised importance score. With N heads, a mean budget b per head and a pool parameter β >= 1::

    base   = b - floor(b / β)                    # every head keeps at least this
    pool   = floor(b / β) * N                    # shared, distributed by score
    w_i    = s_i^τ / Σ_j s_j^τ                   # normalised score (τ: temperature, HeadKV's ``temp``; 1 there)
    b_i    = round(base + w_i * pool)

Here a "head" is a key/value group (GQA: the group's score, ``scores.group_scores``) and a group's budget counts
the tokens it keeps, b_g = S + W_g: the S sinks and its last W_g keys (AdaKV and HeadKV keep the top-scored tokens
plus a recent window; a plan keeps sink + window, so the window is what varies per group). Choices HeadKV leaves
open, made here and documented in docs/explanation/kv-budgets.md:

- the total is given in tokens, T = b * N (``--budget``); when N does not divide T the remainder joins the pool;
- rounding is by largest remainder, so the budgets sum to exactly T (HeadKV rounds each head, so its sum drifts by
  up to N / 2 tokens); ties of remainders go to the lower flat index;
- scores need not be probabilities: NaN (a cut or gated group) and negative scores weigh 0 (they get the base);
  if no group weighs anything the pool is spread evenly;
- the base must leave every group at least one recent key, base >= S + 1, or the total is refused.

β = 1 puts the whole budget in the pool (base 0: refused, a group needs S + 1); a β above b gives every group the
same b (floor(b / β) = 0, no pool): today's all-streaming plan at W = b - S. Full groups (every key) are the
other extreme, ``budget = inf`` per group; a budget plan is exact in the restriction and the mixed cache.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..limits import Interval
from .plan import PLAN_TOTAL, KVPlan, KVPlanError, check_window

BETA = Interval(1, 1e6, why="HeadKV's pool parameter: the pool is floor(b / beta) tokens per group")
TEMPERATURE = Interval(0, 100, closed="right", why="HeadKV's temperature on the normalised scores")
KIND = ("published (HeadKV, Fu et al. 2024, §3.3: a base budget per group plus a pool shared in proportion to "
        "the score, on whichever rule's score is chosen; HeadKV's own retrieval-reasoning score is not offered)")
BETA_DEFAULT = 2.0     # in HeadKV's searched grid (1.005 ... 10): half of each budget shared, the base left for S + 1
TEMPERATURE_DEFAULT = 1.0


def check_allocation(total, n_groups: int, sink: int, beta: float = BETA_DEFAULT,
                     temperature: float = TEMPERATURE_DEFAULT) -> int:
    """Refuse a total, β or τ that cannot make a plan (before anything loads); returns the base budget per group."""
    check_window(sink, 1)
    for name, value, limit in (("--beta", beta, BETA), ("--temperature", temperature, TEMPERATURE)):
        problem = limit(value)
        if problem:
            raise KVPlanError(f"{name} {value!r} {problem}.")
    if PLAN_TOTAL(total):
        raise KVPlanError(f"--budget {total!r} must be a whole number of tokens >= 0, at most {PLAN_TOTAL.high:,} "
                          f"({PLAN_TOTAL.why}): the KV tokens all {n_groups} key/value groups keep together (S + W_g "
                          "each).")
    mean = total // n_groups
    base = mean - math.floor(mean / beta)
    if base < sink + 1:
        raise KVPlanError(f"--budget {total} gives each of the {n_groups} key/value groups a base of {base} tokens "
                          f"(mean {mean}, beta {beta:g}); each needs at least S + 1 = {sink + 1} (its sinks and "
                          "the key itself). Raise --budget or --beta (a larger beta, a smaller pool), or lower --sink.")
    return base


def allocate(scores, total: int, sink: int, beta: float = BETA_DEFAULT,
             temperature: float = TEMPERATURE_DEFAULT) -> np.ndarray:
    """Int (L, H_kv) budgets b_g = S + W_g summing to exactly ``total`` (module doc)."""
    scores = np.asarray(scores, dtype=float)
    n = scores.size
    base = check_allocation(total, n, sink, beta, temperature)
    pool = total - base * n
    weights = np.where(np.isfinite(scores) & (scores > 0), scores, 0.0).ravel()
    if weights.sum() > 0:
        weights = (weights / weights.sum()) ** temperature   # HeadKV normalises before the power, then again
        weights = weights / weights.sum()
    else:
        weights = np.full(n, 1.0 / n)
    share = weights * pool
    extra = np.floor(share).astype(np.int64)
    left = int(pool - extra.sum())
    order = sorted(range(n), key=lambda i: (-(share[i] - extra[i]), i))
    extra[order[:left]] += 1
    return (base + extra).reshape(scores.shape)


def budget_plan(scores, n_heads: int, total: int, sink: int, beta: float = BETA_DEFAULT,
                temperature: float = TEMPERATURE_DEFAULT, meta: dict | None = None) -> KVPlan:
    """The budget plan of group ``scores`` (L, H_kv): every group streams at its own window W_g = b_g - S."""
    budgets = allocate(scores, total, sink, beta, temperature)
    full = torch.zeros(budgets.shape, dtype=torch.bool)
    info = {**(meta or {}), "allocation": "headkv", "beta": beta, "temperature": temperature}
    return KVPlan(full, n_heads, sink, 1, info, windows=torch.as_tensor(budgets - sink), budget=total)
