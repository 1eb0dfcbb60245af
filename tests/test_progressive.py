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
from headprune.evaluation.progressive import count_estimate, ratio_estimate, visit_order
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
    """Over 400 random visit orders and every prefix of 2..N-1 batches, the 95% interval the page shows (the hull
    of the exact count interval and the batch-level ratio interval with the FPC) covers the exact accuracy of the
    500 evaluation rows at least 95% of the time: its stated rate."""
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
            est = count_estimate([correct[i] for i in pick], [sizes[i] for i in pick], sizes, "accuracy")
            assert est.low < est.high
            hits.append(est.covers(exact))
    coverage = float(np.mean(hits))
    print(f"coverage {coverage:.3f} over {len(hits)} intervals; exact accuracy {exact:.3f}")
    assert coverage >= 0.95


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


# -- honest intervals at small counts (issue 45 item 2) ---------------------------------------------------------------

def _tails_by_hand(x: int, n: int, big_n: int, k: int) -> tuple[float, float]:
    """P(X >= x | K = k), P(X <= x | K = k) for X hypergeometric (n drawn of big_n, k marked), from binomial
    coefficients (no scipy)."""
    def p(j):
        return math.comb(k, j) * math.comb(big_n - k, n - j) / math.comb(big_n, n)
    return sum(p(j) for j in range(x, n + 1)), sum(p(j) for j in range(0, x + 1))


def test_the_count_interval_is_the_exact_test_inverted_by_hand():
    """Independent: the K interval from binomial coefficients (every K the data allow tested at 2.5 % a side), for
    every count of every sample size of a population of 12; never a single value while rows are unseen."""
    from headprune.evaluation.progressive import count_interval

    big_n = 12
    for n in range(1, big_n + 1):
        for x in range(n + 1):
            allowed = range(x, x + big_n - n + 1)
            lows = [k for k in allowed if _tails_by_hand(x, n, big_n, k)[0] > 0.025]
            highs = [k for k in allowed if _tails_by_hand(x, n, big_n, k)[1] > 0.025]
            want = (min(lows), max(highs))
            got = count_interval(x, n, big_n)
            if n < big_n and want[0] == want[1]:     # widened by one K the data allow (module doc)
                assert got in ((want[0], want[1] + 1), (want[0] - 1, want[1])) and got[0] >= x \
                    and got[1] <= x + big_n - n, (x, n, got, want)
            else:
                assert got == want, (x, n, got, want)
            assert (got[0] < got[1]) == (n < big_n), (x, n, got)


@pytest.mark.parametrize("x, n", [(15, 20), (0, 7), (7, 7), (130, 200)])
def test_the_count_interval_of_a_huge_set_is_clopper_pearson(x, n):
    """Independent: a sample of a set a million times larger behaves as a binomial one, whose exact (Clopper-
    Pearson) interval scipy's binomtest gives."""
    from scipy.stats import binomtest

    from headprune.evaluation.progressive import count_interval

    big_n = 10**6
    low, high = count_interval(x, n, big_n)
    reference = binomtest(x, n).proportion_ci(0.95, method="exact")
    assert low / big_n == pytest.approx(reference.low, abs=2e-4) and high / big_n == pytest.approx(reference.high,
                                                                                                    abs=2e-4)


def test_two_rows_right_out_of_22_is_not_a_zero_width_interval():
    """Issue 45 item 2: 22 rows one a batch, the first two right: the cluster interval alone read "1.000 ± 0.000".
    The shown interval is the exact one: wide, and it holds every accuracy the 20 unseen rows allow but the worst."""
    est = count_estimate([1, 1], [1, 1], [1] * 22, "accuracy")
    assert est.value == 1.0 and est.high == 1.0 and est.low < 0.5 and est.width > 0.5 and not est.shown
    zero = count_estimate([0, 0], [1, 1], [1] * 22, "accuracy")
    assert zero.low == 0.0 and zero.high > 0.5
    last = count_estimate([1] * 22, [1] * 22, [1] * 22, "accuracy")
    assert last.exact and last.low == last.high == 1.0


@pytest.mark.parametrize("rows, batch, spread", [(22, 1, 0.0), (64, 4, 0.1), (500, 32, 0.15)])
def test_the_accuracy_interval_covers_at_its_stated_rate_by_simulation(rows, batch, spread):
    """A seeded simulation: sets of ``rows`` rows whose batches' accuracies spread by ``spread`` around the set's
    (rows alike within a batch, as length-sorted batches are: a cluster effect), each visited in random batch
    orders; over every prefix before the last batch the interval holds the set's exact accuracy at least 95 % of
    the time, and is never of zero width. Batches of one row have an interval from the first; others from the
    second."""
    rng = np.random.default_rng(7)
    sizes = [batch] * (rows // batch) + ([rows % batch] if rows % batch else [])
    hits, widths = [], []
    for _ in range(6):
        accuracy = rng.uniform(0.55, 0.98)
        batch_rate = np.clip(rng.normal(accuracy, spread, len(sizes)), 0, 1)
        correct = [int(rng.binomial(size, p)) for size, p in zip(sizes, batch_rate)]
        exact = sum(correct) / rows
        for seed in range(12):
            order = visit_order(len(sizes), seed)
            for done in range(1, len(sizes)):
                pick = order[:done]
                est = count_estimate([correct[i] for i in pick], [sizes[i] for i in pick], sizes, "accuracy")
                assert (est.low is None) == (done == 1 and batch > 1)
                if est.low is not None:
                    hits.append(est.covers(exact))
                    widths.append(est.width)
    coverage = float(np.mean(hits))
    print(f"{rows} rows, {batch} a batch: coverage {coverage:.3f} over {len(hits)} intervals")
    assert coverage >= 0.95 and min(widths) > 0


def test_a_perplexity_interval_of_zero_width_is_no_interval():
    """Two batches with the same mean loss: the cluster interval would be a point; before the last batch that is
    no interval (and nothing is shown), on the log scale as always."""
    same = ratio_estimate([8.0, 8.0], [4, 4], [4, 4, 4], "perplexity", bounds=(0, math.inf), transform=math.exp)
    assert same.low is None and same.width is None and not same.shown
    last = ratio_estimate([8.0, 8.0, 8.0], [4, 4, 4], [4, 4, 4], "perplexity", bounds=(0, math.inf),
                          transform=math.exp)
    assert last.exact and last.shown
