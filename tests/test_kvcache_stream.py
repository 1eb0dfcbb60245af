"""Streaming trajectories ("stream the next head" as a step, issue 32): each step's metric is the metric under the
plan made independently from the same scores, a window covering the row never moves the metric, masks compose,
random orders give the band, and bad settings are refused before any work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.kvcache.scores import head_scores, plan_from_scores
from headprune.kvcache.stream import StreamSpec, StreamTrajectory, run_stream, run_stream_seeds
from headprune.kvcache.tasks import metric_under_plan
from headprune.model.mask import HeadMask
from headprune.model.task import lm_labels
from headprune.testing import random_decoder_batch, tiny_decoder, tiny_model
from headprune.trajectory import spread

pytestmark = pytest.mark.usefixtures("one_thread")


def lm_batch(seq_len=12, seed=0):
    batch = random_decoder_batch(seq_len=seq_len, seed=seed)
    batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
    return batch


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_each_step_is_the_metric_under_the_plan_made_independently(arch):
    model = tiny_decoder(arch)                       # 4 blocks x 8 query heads, 2 key/value groups: 8 groups
    calib, evals = [lm_batch(seed=1)], [lm_batch(seed=2)]
    spec = StreamSpec(rule="far-mass", sink=1, window=3, step=3)
    run = run_stream(spec, model, calib, evals)
    assert [s["n_streamed"] for s in run.steps] == [3, 6, 8] and run.steps[-1]["full_share"] == 0.0
    scores = head_scores("far-mass", model, calib=calib, sink=1, window=3)
    # by hand: a group's need is the max of its 4 query heads' far-mass scores; the lowest needs stream first
    need = scores.reshape(4, 2, 4).max(-1)
    by_hand = [tuple(np.unravel_index(i, need.shape)) for i in np.argsort(need.ravel(), kind="stable")]
    assert [tuple(g) for g in run.order] == by_hand
    for step in run.steps:
        n = step["n_streamed"]
        plan = plan_from_scores(scores, 2, (8 - n) / 8, 1, 3)          # the plan kvplan would write at that share
        assert torch.equal(plan.full, run.plan_at(run.steps.index(step) + 1).full)
        assert int((~plan.full).sum()) == n
        assert metric_under_plan(model, evals, plan).to_dict() == step["metrics"]
    assert run.values()[0] == metric_under_plan(model, evals, None).to_dict()["perplexity"]
    assert run.metric == "perplexity" and run.values()[-1] != run.values()[0]   # streaming everything does hurt


def test_a_window_covering_the_row_never_moves_the_metric():
    model = tiny_decoder("llama")
    evals = [lm_batch(seq_len=12)]
    run = run_stream(StreamSpec(rule="random", sink=0, window=12, step=1, seed=3), model, [], evals)
    assert len(run.steps) == 8
    for step in run.steps:
        assert step["metrics"] == run.dense                    # exactly the dense metrics at every step
    assert run.auc() == run.dense["perplexity"] and run.tolerance_ratio(0.99) == 1.0


def test_masked_heads_stay_masked_and_an_empty_group_needs_no_cache():
    model = tiny_decoder("llama")
    evals = [lm_batch(seed=4)]
    mask = HeadMask.ones((4, 8))
    mask.values[1, 4:] = 0.0                                  # group (1, 1): every query head gated off
    mask.values[2, 0] = 0.0                                   # group (2, 0) keeps three live heads
    run = run_stream(StreamSpec(rule="random", sink=1, window=2, step=2, seed=0), model, [], evals, mask=mask)
    assert run.no_cache == [[1, 1]] and [1, 1] not in run.order and len(run.order) == 7
    assert [s["n_streamed"] for s in run.steps] == [2, 4, 6, 7] and run.steps[0]["ratio"] == 2 / 7
    assert run.dense == metric_under_plan(model, evals, None, mask).to_dict()
    for i, step in enumerate(run.steps, start=1):
        full = torch.ones(4, 2, dtype=torch.bool)
        for layer, group in [[1, 1]] + run.order[:step["n_streamed"]]:
            full[layer, group] = False
        assert torch.equal(run.plan_at(i).full, full)
        assert step["metrics"] == metric_under_plan(model, evals, KVPlan(full, 8, 1, 2), mask).to_dict()
    # the full-share stop: at most half of the 7 live groups full -> 7 - 3 = 4 streamed
    half = run_stream(StreamSpec(rule="random", sink=1, window=2, full_share=0.5), model, [], evals, mask=mask)
    assert half.steps[-1]["n_streamed"] == 4 and half.order == run.order


def test_random_orders_give_the_band_and_the_run_file_round_trips():
    model = tiny_decoder("llama")
    evals = [lm_batch(seed=5)]
    spec = StreamSpec(rule="random", sink=1, window=2, step=4)
    runs = run_stream_seeds(spec, model, [], evals, range(3))
    assert [r.seed for r in runs] == [0, 1, 2] and len({tuple(map(tuple, r.order)) for r in runs}) > 1
    again = run_stream(spec.seeded(1), model, [], evals)
    assert again.order == runs[1].order and again.values().tolist() == runs[1].values().tolist()
    band = spread(runs, band=True)
    assert band["ratios"] == [0.0, 0.5, 1.0]
    assert band["mean"] == pytest.approx(np.mean([r.values() for r in runs], axis=0).tolist())
    back = StreamTrajectory.from_json(runs[0].to_json())
    assert back.order == runs[0].order and back.auc() == runs[0].auc()
    assert runs[0].to_json()["summary"]["final_full_share"] == 0.0 and "torch" in runs[0].versions
    with pytest.raises(KVPlanError, match="steps 0..2"):
        back.plan_at(3)


@pytest.mark.parametrize("kwargs, words", [
    (dict(rule="nope"), "Unknown KV plan rule 'nope'"),
    (dict(rule="far-mass", window=0), "window 0"),
    (dict(rule="far-mass", sink=-1), "sink -1"),
    (dict(rule="far-mass", full_share=1.5), "--full-share 1.5"),
    (dict(rule="far-mass", step=0), "Step 0"),
    (dict(rule="far-mass", group="median"), "accepted: max, mean"),
    (dict(rule="far-mass", metric="bleu"), "Metric 'bleu'"),
    (dict(rule="far-mass", tolerance=0), "Tolerance 0"),
])
def test_bad_settings_are_refused_on_construction(kwargs, words):
    with pytest.raises(KVPlanError, match=words):
        StreamSpec(**kwargs)


def test_an_encoder_is_refused():
    with pytest.raises(KVPlanError, match="encoder"):
        run_stream(StreamSpec(rule="random"), tiny_model("bert"), [], [])
