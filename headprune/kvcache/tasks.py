"""Tasks measured under a plan, and the plans the comparisons need.

:func:`metric_under_plan` evaluates a model's task metric with the plan's streaming heads restricted (a private
copy; the metric is the one ``evaluation.evaluate`` gives). :func:`role_plan` keeps the groups holding a head of
the given roles full (GQA: a group is full when any of its query heads has the role); :func:`random_plans` draws
plans with the same number of full groups, one per seed (the baseline band). :func:`bytes_at` is the bar the
dashboard draws: the plan's ideal KV bytes at a context length beside the full cache's.
"""

from __future__ import annotations

import numpy as np
import torch

from ..evaluation.metrics import Metrics, evaluate
from ..model.arch import adapt
from .plan import KVPlan, KVPlanError
from .restrict import restricted


def metric_under_plan(model, batches: list[dict], plan: KVPlan | None, mask=None, progress=None) -> Metrics:
    """The task's metrics on ``batches`` with ``plan`` applied (None: the dense model), optionally under ``mask``."""
    if plan is None:
        return evaluate(model, batches, mask, progress=progress)
    with restricted(model, plan) as copy:
        return evaluate(copy, batches, mask, progress=progress)


def role_plan(heads: np.ndarray, n_kv_heads: int, sink: int, window: int, meta: dict | None = None) -> KVPlan:
    """Groups holding any True head of ``heads`` (L, H) full; the rest stream."""
    heads = torch.as_tensor(np.asarray(heads, dtype=bool))
    full = heads.view(heads.shape[0], n_kv_heads, -1).any(-1)
    return KVPlan(full, heads.shape[1], sink, window, dict(meta or {}))


def invert(plan: KVPlan, meta: dict | None = None) -> KVPlan:
    """The plan streaming exactly the groups ``plan`` keeps full, and keeping the others full."""
    if plan.is_budget:
        raise KVPlanError("A budget plan has no inverse: its groups keep budgets, not full / streaming.")
    return KVPlan(~plan.full, plan.n_heads, plan.sink, plan.window, dict(meta or {}))


def random_plans(shape: tuple[int, int], n_heads: int, n_full: int, seeds, sink: int, window: int) -> list[KVPlan]:
    """One plan per seed with ``n_full`` groups drawn uniformly at random (``numpy`` default_rng(seed))."""
    plans = []
    for seed in seeds:
        flat = np.zeros(shape[0] * shape[1], dtype=bool)
        flat[np.random.default_rng(seed).choice(flat.size, n_full, replace=False)] = True
        plans.append(KVPlan(torch.as_tensor(flat.reshape(shape)), n_heads, sink, window,
                            {"rule": "random", "seed": int(seed)}))
    return plans


def bytes_at(model, plan: KVPlan, length: int, mask=None) -> dict:
    """The plan's and the full cache's KV bytes at ``length`` tokens (batch 1), counted from the model's shapes
    (head size, weight dtype); groups with no live head (cut, or gated off by ``mask``) need none."""
    adapter = adapt(model)
    live = adapter.live_grid()
    if mask is not None:
        live &= mask.keep_bool()
    groups = live.view(live.shape[0], adapter.n_kv_heads, -1).any(-1)
    size = next(model.parameters()).element_size()
    return plan.ideal_bytes(length, adapter.blocks[0].head_size, size, groups)
