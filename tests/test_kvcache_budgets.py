"""Per-group KV budgets (issue 37 item 2): HeadKV's allocation, exact in the restriction and the mixed cache."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headprune.kvcache.budgets import allocate, budget_plan
from headprune.kvcache.cache import generate
from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.kvcache.restrict import restricted
from headprune.model.capture import capture_attention
from headprune.testing import random_decoder_batch, tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")

WINDOWS = torch.tensor([[3, 1], [6, 2], [2, 4], [1, 5]])   # tiny decoders: 4 blocks x 2 groups
FULL = torch.tensor([[0, 0], [0, 1], [0, 0], [0, 0]], dtype=torch.bool)


def inputs(seq_len=12):
    return random_decoder_batch(seq_len=seq_len)


def logits(model, plan, batch):
    with torch.no_grad(), restricted(model, plan) as copy:
        return copy(**batch).logits


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_budget_plan_extremes_are_dense_and_all_streaming_exactly(impl):
    model = tiny_decoder("llama", attn_implementation=impl)
    batch = inputs()
    with torch.no_grad():
        dense = model(**batch).logits
    infinite = KVPlan.from_json({"format": "headprune-kv-plan", "version": 2, "kind": "budgets", "shape": [4, 2],
                                 "n_heads": 8, "sink": 2, "budgets": [[None, None]] * 4})
    assert torch.equal(logits(model, infinite, batch), dense)
    # budgets >= every row: nothing outside any window either
    wide = KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, 2, 1, windows=torch.full((4, 2), 12))
    assert torch.equal(logits(model, wide, batch), dense)
    # S + W everywhere: today's all-streaming plan, bit for bit
    same = KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, 2, 1, windows=torch.full((4, 2), 3), budget=40)
    assert torch.equal(logits(model, same, batch), logits(model, KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, 2, 3),
                                                           batch))
    assert not torch.allclose(logits(model, same, batch), dense, atol=1e-4)


def test_each_group_sees_exactly_its_own_window():
    model = tiny_decoder("llama", attn_implementation="sdpa")
    batch = inputs(seq_len=14)
    sink = 2
    plan = KVPlan(FULL, 8, sink, 1, windows=WINDOWS)
    with restricted(model, plan) as copy:
        maps = capture_attention(copy, batch)
    t = batch["input_ids"].shape[1]
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    for layer, probs in enumerate(maps.probs):
        for h in range(8):
            group = h // 4
            if FULL[layer, group]:
                outside = k > q
            else:   # the hand formula at this group's own window
                outside = (k > q) | ((k >= sink) & (k <= q - int(WINDOWS[layer, group])))
            assert torch.equal(probs[:, h][:, outside], torch.zeros_like(probs[:, h][:, outside]))
            assert probs[:, h][:, ~outside].abs().sum() > 0


@pytest.mark.parametrize("chunk", [None, 5])
def test_mixed_cache_keeps_each_groups_budget_and_generates_the_restricted_tokens(chunk):
    model = tiny_decoder("qwen2")
    prompt = torch.randint(3, 100, (1, 30), generator=torch.Generator().manual_seed(1))
    sink = 2
    plan = KVPlan(FULL, 8, sink, 1, windows=WINDOWS)
    with restricted(model, plan) as copy:
        ref = generate(copy, prompt, 10, mode="restricted")
        mixed = generate(copy, prompt, 10, mode="mixed", prefill_chunk=chunk)
    assert mixed.tokens == ref.tokens
    # measured bytes = the sum of the budgets (float32, head dim 8, key + value) + the full group's T tokens;
    # the cache's own overhead, counted only in kv_bytes_allocated: the full buffer's spare capacity, and the padding
    # of each layer's one ring, S + the layer's largest streaming window for every streaming group
    t, per = 30 + 9, 2 * 8 * 4
    budgets = int((sink + WINDOWS)[~FULL].sum())
    assert mixed.kv_bytes == (budgets + t * int(FULL.sum())) * per
    assert mixed.kv_bytes == plan.ideal_bytes(t, 8, 4)["plan"]
    padded = sum(int((~FULL[layer]).sum()) * (sink + int(WINDOWS[layer][~FULL[layer]].max())) for layer in range(4))
    assert mixed.kv_bytes_allocated == (padded + 256 * int(FULL.sum())) * per and padded > budgets


def test_headkv_allocation_by_hand():
    scores = np.array([[3.0, 1.0], [0.0, np.nan], [-2.0, 4.0], [0.0, 0.0]])
    total, sink, beta = 8 * 20, 4, 2.0
    got = allocate(scores, total, sink, beta)
    # b = 20 per group, base = 20 - floor(20 / 2) = 10, pool = 10 x 8 = 80, shares 3:1:4 of the positive scores
    assert got.tolist() == [[10 + 30, 10 + 10], [10, 10], [10, 10 + 40], [10, 10]]
    assert got.sum() == total
    # largest-remainder rounding: the sum is the total exactly, and a higher score never gets less
    odd = allocate(np.array([[1.0, 1.0, 1.0], [2.0, 5.0, 0.5]]), 6 * 17 + 5, 1, beta=1.5, temperature=0.7)
    assert odd.sum() == 6 * 17 + 5
    assert odd[1, 1] >= odd[1, 0] >= odd[0, 0] >= odd[1, 2]
    # a beta above the mean budget: no pool, every group the same budget (the all-streaming plan)
    assert (allocate(scores, total, sink, beta=1e6) == 20).all()
    plan = budget_plan(scores, 8, total, sink, beta)
    assert plan.budget_tokens() == total and torch.equal(plan.windows, torch.as_tensor(got - sink))


def test_budget_plan_file_round_trip_and_refusals(tmp_path):
    plan = KVPlan(FULL, 8, 2, 1, {"rule": "x"}, windows=WINDOWS, budget=60)
    path = tmp_path / "p.json"
    plan.write(path)
    obj = json.loads(path.read_text())
    assert obj["version"] == 2 and obj["budgets"][1] == [8, None] and obj["budget"] == 60
    back = KVPlan.read(path)
    assert torch.equal(back.full, FULL) and torch.equal(back.windows[~FULL], WINDOWS[~FULL]) and back.window == 6
    # version 1 files still load; an unknown version is refused, not read as version 1
    one = KVPlan(FULL, 8, 2, 3).to_json()
    assert KVPlan.from_json(one).windows is None
    with pytest.raises(KVPlanError, match="version 99 is not one this headprune reads"):
        KVPlan.from_json({**one, "version": 99})
    with pytest.raises(KVPlanError, match="sum to 36 tokens, more than its total budget 35"):
        KVPlan.from_json({**obj, "budget": 35})
    with pytest.raises(KVPlanError, match="budget -3 must be a whole number of tokens"):
        KVPlan.from_json({**obj, "budgets": [[-3, 3]] + obj["budgets"][1:]})
    with pytest.raises(KVPlanError, match="belong to a version-2 plan; this file says version 1"):
        KVPlan.from_json({**one, "budgets": obj["budgets"]})
    with pytest.raises(KVPlanError, match="not full or window"):
        KVPlan.from_json({**obj, "full": {}, "window": 4})
    with pytest.raises(KVPlanError, match="at least S \\+ 1 = 3"):
        KVPlan.from_json({**obj, "budgets": [[2, 3]] + obj["budgets"][1:]})
