"""How many evaluation rows a dashboard click re-evaluates on a big model (issue 36 item 6): the rule on stated
costs, a workspace on fewer rows against an independent evaluation of those rows, and the Prune page saying so."""

from __future__ import annotations

import pytest

from headprune.estimate import MIN_BATCH_ROWS, MIN_LIVE_ROWS, live_size
from headprune.evaluation.metrics import evaluate
from headprune.workspace import Workspace


@pytest.mark.parametrize("rate, tokens, rows, batch, want", [
    # (seconds per token, tokens a row, rows, batch rows) -> (rows, batch rows, shrunk)
    (1e-5, 40, 500, 32, (500, 32, False)),    # a demo: 0.2 s a pass, 13 ms a batch: all as given
    (2e-3, 64, 500, 32, (117, 7, True)),      # 0.128 s a row: 15 // 0.128 = 117 rows, 1 // 0.128 = 7 a batch
    (2e-3, 64, 100, 32, (100, 7, True)),      # all 100 rows fit 12.8 s; the batches do not fit 1 s
    (1.0, 64, 500, 32, (MIN_LIVE_ROWS, MIN_BATCH_ROWS, True)),   # 64 s a row: never fewer than MIN_LIVE_ROWS,
    (1.0, 64, 5, 32, (5, MIN_BATCH_ROWS, True)),                  # nor more than there are; never 1 row a batch
    (1.0, 64, 500, 2, (MIN_LIVE_ROWS, 2, True)),                  # a batch is never bigger than asked
])
def test_the_rule_on_stated_costs(rate, tokens, rows, batch, want):
    size = live_size(rate, tokens, rows, batch)
    assert (size.rows, size.batch_rows, size.shrunk) == want
    assert size.seconds_per_row == pytest.approx(rate * tokens)
    note = size.note(rows, "timed")
    assert (note == "") == (not size.shrunk)
    if size.shrunk:
        assert f"{size.rows} of the {rows} evaluation rows, {size.batch_rows} a batch" in note and "15 s" in note


def test_a_workspace_on_fewer_rows_evaluates_exactly_those_rows(tiny_model_dir, tiny_csv, one_thread):
    """Independent: ``evaluate`` on the first 9 evaluation rows batched 32 a batch (one batch) against the
    workspace cut to them and batched 2 a batch; calibration rows unchanged."""
    ws = Workspace.build(str(tiny_model_dir), tiny_csv, calib_size=16, eval_size=30, seed=3)
    small = ws.with_eval_rows(9, 2, "why")
    assert small.eval.texts == ws.eval.texts[:9] and small.calib.texts == ws.calib.texts
    assert [len(b["input_ids"]) for b in small.eval_batches] == [2, 2, 2, 2, 1]
    from headprune.data import make_batches

    reference = evaluate(ws.loaded.model, make_batches(ws.loaded.tokenizer, ws.eval.subset(range(9)), 32,
                                                       ws.max_length), task=ws.task)
    assert small.dense().accuracy == pytest.approx(reference.accuracy)
    assert small.dense().loss == pytest.approx(reference.loss, abs=1e-5)
    assert small.eval_note == "why" and "why" in small.notes and ws.eval_note == ""
    assert ws.with_eval_rows(30, 32) is ws     # nothing to cut: the same workspace


def test_the_prune_page_says_when_a_click_uses_fewer_rows(monkeypatch, tiny_model_dir, tiny_csv):
    """A model that is not a demo on a machine too slow for the whole split (the limits lowered so even the tiny
    model does not fit): the page's live numbers use MIN_LIVE_ROWS rows, MIN_BATCH_ROWS a batch (never one), it says
    so, and its dense value is that of those rows."""
    from app_support import metric, open_app, problems, small_env

    import headprune.estimate as estimate

    monkeypatch.setattr(estimate, "LIVE_CLICK_SECONDS", 1e-9)
    monkeypatch.setattr(estimate, "LIVE_FIRST_SECONDS", 1e-9)
    with small_env(HEADPRUNE_MODEL=str(tiny_model_dir), HEADPRUNE_DATA=tiny_csv, HEADPRUNE_EVAL_SIZE="48",
                   HEADPRUNE_CALIB_SIZE="8"):
        at = open_app("prune")
    assert not problems(at)
    from dashboard.store import store

    ws = store().get(f"ws|{at.session_state['hp_setup'].key}")
    assert len(ws.eval) == MIN_LIVE_ROWS and all(len(b["input_ids"]) == MIN_BATCH_ROWS for b in ws.eval_batches)
    assert any(f"Live numbers use {MIN_LIVE_ROWS} of the 48 evaluation rows, {MIN_BATCH_ROWS} a batch" in c.value
               for c in at.caption)
    rows = evaluate(ws.loaded.model, ws.eval_batches, task=ws.task)
    assert float(metric(at, "dense accuracy")) == pytest.approx(rows.accuracy, abs=1e-4)


def test_a_demo_is_never_sized_by_a_timing(monkeypatch):
    """Issue 45 item 3: the demo keeps the split its setup asks for (here the classroom's HEADPRUNE_EVAL_SIZE),
    however slow the machine: nothing is timed (a timing would raise here), whole batches of 32."""
    from app_support import open_app, problems, small_env

    import dashboard.store as dashboard_store

    def timed(*args, **kwargs):
        raise AssertionError("a demo was sized by a timing")

    monkeypatch.setattr(dashboard_store, "measure_live_size", timed)
    with small_env(HEADPRUNE_EVAL_SIZE="72"):
        at = open_app("home")
    assert not problems(at)
    ws = dashboard_store.store().get(f"ws|{at.session_state['hp_setup'].key}")
    assert len(ws.eval) == 72 and [len(b["input_ids"]) for b in ws.eval_batches] == [32, 32, 8]
    assert ws.eval_note == ""


def test_the_idle_rate_is_the_forwards_own_cpu_time_not_a_busy_clock(monkeypatch, one_thread):
    """A loaded machine stretches the clock, not the CPU time the forward's thread computes: with the wall clock
    made to run 50 times fast (what two busy neighbours on two cores look like, and worse), the idle rate stays
    that of the CPU time, and the plain (clock) rate grows."""
    import time

    import headprune.estimate as estimate
    from headprune.testing import random_batch, tiny_model

    model, batch = tiny_model("bert"), random_batch(batch_size=4, seq_len=32, seed=1)
    real = time.perf_counter
    start = real()
    monkeypatch.setattr(estimate.time, "perf_counter", lambda: start + 50 * (real() - start))
    busy_clock, _ = estimate.forward_rate(model, [batch])
    idle, basis = estimate.forward_rate(model, [batch], idle=True)
    assert idle < busy_clock / 5 and "of CPU" in basis
    monkeypatch.setattr(estimate.time, "perf_counter", real)
    clock = min(estimate.forward_rate(model, [batch])[0] for _ in range(3))
    assert idle < 3 * clock        # the CPU time is no more than the clock's (a little slack for a noisy box)


def test_sessions_opening_one_link_share_its_evaluation():
    """A class opening one lesson link starts 30 sessions at one mask: the first computes that mask's evaluator
    (one pass), the others fork it (no pass); each equals a full evaluation under the mask (independent)."""
    from app_support import open_app, small_env

    from dashboard.compute import live_evaluator
    from dashboard.store import mask_key, store
    from headprune.model.mask import HeadMask

    with small_env():
        at = open_app("home")
    ws = store().get(f"ws|{at.session_state['hp_setup'].key}")
    mask = HeadMask.ones(ws.shape).prune(1, 3).prune(4, 7)
    first, second = live_evaluator(ws, ws.eval_batches, mask), live_evaluator(ws, ws.eval_batches, mask)
    shared = store().get(f"live|{ws.key}|evaluation|{mask_key(mask)}")
    assert shared.stats.full_runs + shared.stats.partial_runs == 1          # one pass, for both sessions
    assert first.stats.layers_run == second.stats.layers_run == 0 and first is not second
    full = evaluate(ws.loaded.model, ws.eval_batches, mask, task=ws.task)
    for live in (first, second):
        assert live.mask == mask and live.metrics().accuracy == pytest.approx(full.accuracy)
        assert live.metrics().loss == pytest.approx(full.loss, abs=1e-5)
    first.toggle(0, 0)                                  # a session's own click moves its fork only
    assert second.mask == mask and shared.mask == mask
