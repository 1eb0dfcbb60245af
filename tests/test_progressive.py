"""Progressive evaluation: the ratio estimator and its interval by hand, exactness at the last batch, interrupted
runs finished correctly, and the interval's coverage of the exact 500-row accuracy on the demo."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import t as student_t

from headprune.data import align_labels, load_data, make_batches, split_calib_eval
from headprune.evaluation.live import LiveEvaluator
from headprune.evaluation.metrics import evaluate
from headprune.evaluation.progressive import ratio_estimate, visit_order
from headprune.model.mask import HeadMask
from headprune.testing import random_batch, tiny_model


def test_ratio_estimate_by_hand():
    totals, sizes, population = [3, 5, 2], [4, 6, 4], [4, 6, 4, 6, 4]
    est = ratio_estimate(totals, sizes, population, "accuracy")
    r = 10 / 14
    residual = ((3 - r * 4) ** 2 + (5 - r * 6) ** 2 + (2 - r * 4) ** 2) / 2
    half = student_t.ppf(0.975, 2) * math.sqrt((1 - 3 / 5) / (3 * (24 / 5) ** 2) * residual)
    assert est.value == pytest.approx(r) and est.low == pytest.approx(r - half) and est.high == pytest.approx(r + half)
    assert not est.exact and est.rows == 14
    full = ratio_estimate([3, 5, 2, 4, 1], population, population, "accuracy")
    assert full.exact and full.low == full.high == pytest.approx(15 / 24)
    one = ratio_estimate([3], [4], population, "accuracy")
    assert one.low is None and not one.covers(0.75)
    ppl = ratio_estimate([8.0, 9.0], [4, 4], [4, 4, 4], "perplexity", bounds=(0, math.inf), transform=math.exp)
    assert ppl.value == pytest.approx(math.exp(17 / 8)) and ppl.low < ppl.value < ppl.high


def test_visit_order_is_a_seeded_permutation():
    assert sorted(visit_order(9, 3)) == list(range(9)) and visit_order(9, 3) == visit_order(9, 3)
    assert visit_order(9, 3) != visit_order(9, 4)


def _batches(n=6):
    return [random_batch(batch_size=4, seed=s) for s in range(n)]


def test_estimates_arrive_per_batch_and_the_last_is_exact(one_thread):
    model, batches = tiny_model("bert"), _batches()
    live = LiveEvaluator(model, batches, seed=1)
    mask = HeadMask.from_pruned({1: [0, 2]}, (3, 4))
    seen = []
    metrics = live.set_mask(mask, on_estimate=seen.append)
    assert [e.done for e in seen] == list(range(1, 7))
    assert seen[-1].exact and seen[-1].value == pytest.approx(metrics.accuracy)
    assert metrics.accuracy == pytest.approx(evaluate(model, batches, mask).accuracy)


def test_an_interrupted_run_is_finished_by_the_next_change(one_thread):
    model, batches = tiny_model("bert"), _batches()
    live = LiveEvaluator(model, batches)
    first = HeadMask.from_pruned({2: [1]}, (3, 4))

    def stop_after_two(estimate):
        if estimate.done == 2:
            raise KeyboardInterrupt  # e.g. the browser session reran before the evaluation finished

    with pytest.raises(KeyboardInterrupt):
        live.set_mask(first, on_estimate=stop_after_two)
    second = HeadMask.from_pruned({0: [3]}, (3, 4))
    assert live.set_mask(second).accuracy == pytest.approx(evaluate(model, batches, second).accuracy)
    torch.testing.assert_close(live.logits, LiveEvaluator(model, batches, second).logits)


@pytest.mark.parametrize("pruned", [{}, {0: [0, 1, 2, 3], 3: list(range(12))}])
def test_interval_coverage_on_the_demo(demo, pruned):
    """Over 400 random visit orders and every prefix of 2..N-1 batches, the 95% interval covers the exact accuracy
    of the 500 evaluation rows at least 90% of the time (batch-level ratio estimator with the FPC)."""
    ds = align_labels(load_data("demo"), demo.id2label)
    _, evals = split_calib_eval(ds, 0, 500, seed=0)
    batches = make_batches(demo.tokenizer, evals, batch_size=32, max_length=128)
    live = LiveEvaluator(demo.model, batches, HeadMask.from_pruned(pruned, (6, 12)))
    exact = live.metrics().accuracy
    correct = [int((live._logits[b].argmax(-1) == batch["labels"]).sum()) for b, batch in enumerate(batches)]
    sizes = [len(b["labels"]) for b in batches]
    hits = []
    for seed in range(400):
        order = visit_order(len(batches), seed)
        for n in range(2, len(batches)):
            pick = order[:n]
            hits.append(ratio_estimate([correct[i] for i in pick], [sizes[i] for i in pick], sizes,
                                       "accuracy").covers(exact))
    coverage = float(np.mean(hits))
    print(f"coverage {coverage:.3f} over {len(hits)} intervals; exact accuracy {exact:.3f}")
    assert coverage >= 0.90


def test_each_run_draws_a_fresh_seeded_order_and_forks_keep_the_caches(one_thread):
    """Issue 35: every click draws its own order (so the first batch differs from click to click), the same seed
    gives the same orders, and a fork's different order does not stop it reusing the cached layers."""
    model, batches = tiny_model("bert"), _batches(8)
    a, b = LiveEvaluator(model, batches, seed=3), LiveEvaluator(model, batches, seed=3)
    orders_a, orders_b = [], []
    for head in range(4):
        for live, orders in ((a, orders_a), (b, orders_b)):
            live.toggle(2, head)
            orders.append(live.last_order)
    assert orders_a == orders_b                                   # seeded
    assert len({tuple(o) for o in orders_a}) == 4                 # a fresh order per run
    assert all(sorted(o) == list(range(8)) for o in orders_a)
    assert len({o[0] for o in orders_a}) > 1                      # not the same first batch every click
    twin = a.fork()
    twin.toggle(2, 0)
    assert twin.last_order != a.last_order and twin.stats.last_start_layer == 2 and twin.stats.full_runs == 0
    mask = twin.mask
    assert twin.metrics().accuracy == pytest.approx(evaluate(model, batches, mask).accuracy)


def test_the_width_rule_holds_a_value_back_until_its_interval_is_narrow():
    population = [10] * 20
    wide = ratio_estimate([2, 9, 5], [10, 10, 10], population, "accuracy")
    assert wide.width == pytest.approx(wide.high - wide.low) and wide.width > 0.06 and not wide.shown
    narrow = ratio_estimate([8] * 10 + [9] * 9, [10] * 19, population, "accuracy")
    assert narrow.width <= 0.06 and narrow.shown
    assert not ratio_estimate([8], [10], population, "accuracy").shown       # no interval yet
    assert ratio_estimate([8] * 20, population, population, "accuracy").shown  # exact
    assert "0.06" in wide.rule
    custom = ratio_estimate([2, 9, 5], [10, 10, 10], population, "accuracy", max_width=1.0)
    assert custom.shown


def test_perplexity_interval_is_computed_on_the_log_scale_by_hand():
    """The interval of the mean loss R (the log of perplexity) mapped through exp: its ends are exp(R ± half),
    geometric-symmetric around the value, and the width rule reads the loss scale (a factor 1.10 end to end)."""
    totals, sizes, population = [40.0, 52.0, 31.0, 47.0], [10, 12, 9, 11], [10, 12, 9, 11, 10, 12, 10, 8]
    est = ratio_estimate(totals, sizes, population, "perplexity", bounds=(0, math.inf), transform=math.exp)
    y, m = np.array(totals), np.array(sizes, dtype=float)
    r = y.sum() / m.sum()
    mean_size = sum(population) / len(population)
    variance = (1 - 4 / 8) / (4 * mean_size**2) * ((y - r * m) ** 2).sum() / 3
    half = student_t.ppf(0.975, 3) * math.sqrt(variance)
    assert est.value == pytest.approx(math.exp(r))
    assert est.low == pytest.approx(math.exp(r - half)) and est.high == pytest.approx(math.exp(r + half))
    assert est.low * est.high == pytest.approx(est.value**2)                  # symmetric on the log scale
    assert est.log_scale and est.width == pytest.approx(2 * half)
    assert est.shown == (est.high / est.low <= 1.10 + 1e-12)
    assert "factor 1.10" in est.rule
