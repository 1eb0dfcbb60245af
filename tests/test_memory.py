"""The memory planner (headprune.model.memory), time estimates (headprune.estimate) and cancelling a run.

Planned runs are compared with unplanned ones (a budget of 1 TB keeps every batch and all ablations of a layer
in one pass) on a tiny Llama language model; the planner's choices against byte counts worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headprune.cli import main
from headprune.criteria import ScoringContext, get
from headprune.criteria.kl import kl_raw_importance
from headprune.criteria.onepass import score_many
from headprune.errors import Cancelled
from headprune.estimate import TimeEstimate, estimate_scoring, human_duration, tokens
from headprune.evaluation.metrics import evaluate
from headprune.model import memory
from headprune.model.memory import (
    HEADROOM,
    RUNTIME,
    MemoryBudgetError,
    MemoryPlan,
    Shapes,
    parse_budget,
    plan_for,
    resolve_budget,
)
from headprune.model.task import lm_labels
from headprune.testing import random_decoder_batch, tiny_decoder
from headprune.trajectory import TrajectorySpec, run_trajectory

UNPLANNED = 10**12     # 1 TB: every batch whole, every head of a layer in one ablated pass
TINY = 20_000          # bytes: one row per pass and one ablation per pass on the tiny model below


def lm_batches():
    out = []
    for seed, (rows, length) in enumerate([(6, 12), (5, 9)]):
        batch = random_decoder_batch(rows, length, seed=seed + 1)
        batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
        batch["index"] = list(range(seed * 6, seed * 6 + rows))
        out.append(batch)
    return out


@pytest.fixture(scope="module")
def lm(one_thread):
    return tiny_decoder("llama")


# -- the plan against hand-computed byte counts ---------------------------------------------------------------

SHAPES = Shapes(layers=2, heads=4, hidden=8, intermediate=16, outputs=100, lm=True, element=4)
T = 10
# per row at T = 10 (module doc of headprune.model.memory), by hand:
LOGITS = 10 * 100 * 4                                   # 4,000
SLAB = 3 * 10 * 100 * 4                                 # 12,000
LAYER = (10 * (6 * 8 + 3 * 16) + 2 * 4 * 10 * 10) * 4    # 7,040
GRAPH = 2 * (10 * (12 * 8 + 5 * 16) + 3 * 4 * 100) * 4   # 23,680
ATTENTION = 2 * 4 * 100 * 4                              # 3,200
LAYER_INPUTS = 2 * 10 * 8 * 4                            # 640


def fitting(counted: int) -> MemoryPlan:
    """The plan whose counted tensors may fill exactly ``counted`` bytes (``HEADROOM`` of its budget)."""
    plan = MemoryPlan(SHAPES, math.ceil(counted / HEADROOM))
    assert plan.usable == counted
    return plan


def test_byte_counts_by_hand():
    plan = MemoryPlan(SHAPES, 10**9)
    assert plan.row_bytes("forward", T) == (LOGITS + LAYER, SLAB) == (11_040, 12_000)
    assert plan.row_bytes("attention", T) == (LOGITS + LAYER + ATTENTION, SLAB)
    assert plan.row_bytes("gradient", T) == (GRAPH + 4 * LOGITS + ATTENTION + 2 * LAYER_INPUTS, 0) == (44_160, 0)
    assert plan.kl_bytes(3, 2, T) == 3 * (LOGITS + LAYER_INPUTS) + 2 * 3 * (LOGITS + LAYER) + SLAB


def test_a_smaller_budget_plans_smaller_batches():
    fits_three = SLAB + 3 * (LOGITS + LAYER)              # exactly three rows of a forward
    assert fitting(fits_three).rows("forward", T, 32) == 3
    assert fitting(fits_three - 1).rows("forward", T, 32) == 2
    assert MemoryPlan(SHAPES, 10**9).rows("forward", T, 32) == 32          # never more rows than the batch has
    assert MemoryPlan(SHAPES, 1).rows("gradient", T, 32) == 1              # at least one row, whatever the budget
    assert fitting(5 * 44_160).rows("gradient", T, 32) == 5
    assert fitting(5 * 44_160 - 1).rows("gradient", T, 32) == 4
    # KL: rows first (each holds log p, its layer inputs and room for one ablation), then ablations per pass
    per_row = 2 * LOGITS + LAYER_INPUTS + LAYER                               # 15,680
    budget = SLAB + 4 * per_row                                               # 74,720
    assert fitting(budget).kl(T, 8, 4) == (4, 1)
    assert fitting(budget - 1).kl(T, 8, 4) == (3, 1)
    assert MemoryPlan(SHAPES, 10**9).kl(T, 8, 4) == (8, 4)                    # all 4 heads of a layer at most


def test_kl_plan_for_8_rows_at_fewer_heads_spare():
    # 8 rows fit with 8 · 15,680 + 12,000 = 137,440; each further ablation pass of 8 rows costs 8 · 11,040
    assert fitting(137_440).kl(T, 8, 4) == (8, 1)
    assert fitting(137_440 + 8 * 11_040).kl(T, 8, 4) == (8, 2)


def test_the_runtime_is_paid_from_a_cpu_budget(lm):
    """A peak RSS holds the interpreter and libraries too: on the CPU the counted tensors may fill HEADROOM of the
    budget less RUNTIME; on a GPU the free memory was measured with the CUDA context already in it."""
    budget = 2 * 10**9
    cpu = plan_for(lm, budget, "cpu")
    assert cpu.runtime == RUNTIME and cpu.usable == int(HEADROOM * budget) - RUNTIME
    assert MemoryPlan(SHAPES, budget, runtime=0).usable == int(HEADROOM * budget)
    assert MemoryPlan(SHAPES, RUNTIME, runtime=RUNTIME).usable == 0      # never negative: one row still runs
    assert MemoryPlan(SHAPES, RUNTIME, runtime=RUNTIME).rows("forward", T, 32) == 1


def test_shapes_read_off_a_model(lm):
    s = Shapes.of(lm)
    c = lm.config
    assert (s.layers, s.heads, s.hidden, s.intermediate, s.outputs, s.lm, s.element) == \
        (c.num_hidden_layers, c.num_attention_heads, c.hidden_size, c.intermediate_size, c.vocab_size, True, 4)


def test_budget_text_and_default(monkeypatch):
    assert parse_budget("4GB") == 4 * 10**9 and parse_budget("4 g") == 4 * 10**9
    assert parse_budget("512MiB") == 512 * 2**20 and parse_budget("1.5e9") == 1_500_000_000
    assert parse_budget("25%") == 0.25 and parse_budget(None) is None and parse_budget(10**6) == 10**6
    for bad in ("lots", "-1GB", "0", "150%", "4 parsecs"):
        with pytest.raises(MemoryBudgetError, match="Accepted|must"):
            parse_budget(bad)

    class Free:
        available = 8 * 10**9

    monkeypatch.setattr(memory.psutil, "virtual_memory", lambda: Free)
    assert resolve_budget(None, "cpu") == 2 * 10**9           # DEFAULT_SHARE = 25 % of what is free
    assert resolve_budget("50%", "cpu") == 4 * 10**9
    assert resolve_budget("1GB", "cpu") == 10**9


# -- planned runs equal unplanned ones ------------------------------------------------------------------------

def test_the_tiny_budget_really_cuts(lm):
    plan = plan_for(lm, TINY)
    assert plan.rows("gradient", 12, 6) == 1 and plan.rows("forward", 12, 6) == 1
    assert plan.kl(12, 6, 8) == (1, 1)
    assert plan_for(lm, UNPLANNED).kl(12, 6, 8) == (6, 8)


def test_kl_planned_equals_unplanned(lm):
    whole = kl_raw_importance(lm, lm_batches(), memory_budget=UNPLANNED)
    cut = kl_raw_importance(lm, lm_batches(), memory_budget=TINY)
    assert np.nanmax(whole) > 1e-4                         # a test that could fail
    assert np.allclose(cut, whole, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["his", "ae", "taylor", "gnorm", "ad"])
def test_onepass_planned_equals_unplanned(lm, name):
    whole = get(name)(ScoringContext(lm, lm_batches(), memory_budget=UNPLANNED), {}).scores
    cut = get(name)(ScoringContext(lm, lm_batches(), memory_budget=TINY), {}).scores
    assert np.nanmax(np.abs(whole)) > 1e-4
    assert np.allclose(cut, whole, atol=1e-6, rtol=1e-6)


def test_evaluate_planned_equals_unplanned(lm):
    whole = evaluate(lm, lm_batches(), memory_budget=UNPLANNED).to_dict()
    cut = evaluate(lm, lm_batches(), memory_budget=TINY).to_dict()
    assert whole["tokens"] == cut["tokens"] > 0
    assert cut["loss"] == pytest.approx(whole["loss"], abs=1e-6)
    assert cut["next_token_accuracy"] == whole["next_token_accuracy"]


# -- time told before long work -------------------------------------------------------------------------------

def test_human_duration():
    assert human_duration(0.2) == "under a second"
    assert human_duration(20) == "about 20 s"
    assert human_duration(48 * 60) == "about 48 min"
    assert human_duration(2.5 * 3600) == "about 2.5 h"
    est = TimeEstimate(48 * 60, "kl on this model", "this CPU")
    assert est.text == "kl on this model: about 48 min on this CPU" and est.long     # LONG = 10 min
    assert not TimeEstimate(60, "x", "this CPU").long


def test_scoring_estimate_is_rate_times_tokens_times_work(lm):
    ctx = ScoringContext(lm, lm_batches())
    rate = (1e-3, "given")
    n = tokens(lm_batches())
    assert n == 6 * 12 + 5 * 9
    assert estimate_scoring(ctx, ["ae"], rate=rate).seconds == pytest.approx(1e-3 * n)
    assert estimate_scoring(ctx, ["his"], rate=rate).seconds == pytest.approx(3e-3 * n)      # forward + backward
    assert estimate_scoring(ctx, ["ae", "his"], rate=rate).seconds == pytest.approx(3e-3 * n)  # one shared pass
    # KL by hand: 1 intact pass + per head of layer l a pass over layers l.. and the output layer
    c = lm.config
    d, i, v, layers = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_hidden_layers
    per_layer, out = 4 * d * d + 3 * d * i, v * d
    work = 1 + sum(c.num_attention_heads * ((layers - l) * per_layer + out) / (layers * per_layer + out)
                   for l in range(layers))
    assert estimate_scoring(ctx, ["kl"], rate=rate).seconds == pytest.approx(1e-3 * n * work)


def test_estimate_measures_a_forward(lm):
    est = estimate_scoring(ScoringContext(lm, lm_batches()), ["kl"])
    assert est.seconds > 0 and "one forward of 6 rows × 12 tokens" in est.basis and "this CPU" in est.text


# -- cancel -----------------------------------------------------------------------------------------------------

def cancel_after(calls: int):
    seen = []

    def progress(fraction, message):
        seen.append(message)
        if len(seen) >= calls:
            raise Cancelled()
    return progress, seen


def test_a_cancelled_score_stores_nothing(lm):
    progress, seen = cancel_after(1)
    ctx = ScoringContext(lm, lm_batches(), progress=progress, memory_budget=TINY)
    with pytest.raises(Cancelled, match="nothing was stored"):
        score_many(["his", "ae"], ctx)
    assert seen == ["scoring batch 1/11"]          # stopped after the first of 11 one-row batches
    assert ctx.cache.get("onepass", {}) == {}       # no half-summed statistics kept for a later criterion
    model_before = {k: v.clone() for k, v in lm.state_dict().items()}
    progress, seen = cancel_after(3)
    with pytest.raises(Cancelled):
        get("kl")(ScoringContext(lm, lm_batches(), progress=progress), {})
    assert len(seen) == 3 and all(torch.equal(v, lm.state_dict()[k]) for k, v in model_before.items())


def test_a_cancelled_evaluation_and_trajectory_stop(lm):
    progress, seen = cancel_after(1)
    with pytest.raises(Cancelled):
        evaluate(lm, lm_batches(), progress=progress)
    assert len(seen) == 1
    progress, seen = cancel_after(2)
    with pytest.raises(Cancelled):
        run_trajectory(TrajectorySpec(criterion=get("random"), step=4), lm, lm_batches(), lm_batches(),
                       progress=progress)
    assert len(seen) == 2


# -- the CLI ----------------------------------------------------------------------------------------------------

def test_cli_tells_the_time_before_the_bar_and_takes_a_budget(tiny_model_dir, tiny_csv, capsys):
    rc = main(["score", "--model", str(tiny_model_dir), "--data", str(tiny_csv), "--criterion", "ae",
               "--calib-size", "8", "--memory-budget", "1GB"])
    err = capsys.readouterr().err
    assert rc == 0
    line = next(x for x in err.splitlines() if x.startswith("estimate: "))
    assert line.startswith("estimate: ae on this model: ") and line.endswith(" on this CPU")
    assert err.index("estimate: ") < err.index("scoring ae")          # on its own line, before the bar
    with pytest.raises(SystemExit) as stop:
        main(["score", "--model", str(tiny_model_dir), "--criterion", "ae", "--memory-budget", "lots"])
    assert stop.value.code == 2 and "error: argument --memory-budget: Memory budget 'lots' is not a size" in \
        capsys.readouterr().err
