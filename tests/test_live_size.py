"""How many evaluation rows a dashboard click re-evaluates on a big model (issue 36 item 6): the rule on stated
costs, a workspace on fewer rows against an independent evaluation of those rows, and the Prune page saying so."""

from __future__ import annotations

import pytest

from headprune.estimate import MIN_LIVE_ROWS, live_size
from headprune.evaluation.metrics import evaluate
from headprune.workspace import Workspace


@pytest.mark.parametrize("rate, tokens, rows, batch, want", [
    # (seconds per token, tokens a row, rows, batch rows) -> (rows, batch rows, shrunk)
    (1e-5, 40, 500, 32, (500, 32, False)),    # a demo: 0.2 s a pass, 13 ms a batch: all as given
    (2e-3, 64, 500, 32, (117, 7, True)),      # 0.128 s a row: 15 // 0.128 = 117 rows, 1 // 0.128 = 7 a batch
    (2e-3, 64, 100, 32, (100, 7, True)),      # all 100 rows fit 12.8 s; the batches do not fit 1 s
    (1.0, 64, 500, 32, (MIN_LIVE_ROWS, 1, True)),   # 64 s a row: never fewer than MIN_LIVE_ROWS, one a batch
    (1.0, 64, 5, 32, (5, 1, True)),           # ... nor more than there are
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


def test_the_prune_page_says_when_a_click_uses_fewer_rows(monkeypatch):
    """A machine too slow for the whole split (the limits lowered so even the demo does not fit): the page's live
    numbers use MIN_LIVE_ROWS rows one a batch, it says so, and its dense value is that of those rows."""
    from app_support import metric, open_app, problems, small_env

    import headprune.estimate as estimate

    monkeypatch.setattr(estimate, "LIVE_CLICK_SECONDS", 1e-9)
    monkeypatch.setattr(estimate, "LIVE_FIRST_SECONDS", 1e-9)
    with small_env(HEADPRUNE_EVAL_SIZE="48"):   # a setup of its own: the store keys workspaces by setup
        at = open_app("prune")
    assert not problems(at)
    from dashboard.store import store

    ws = store().get(f"ws|{at.session_state['hp_setup'].key}")
    assert len(ws.eval) == MIN_LIVE_ROWS and all(len(b["input_ids"]) == 1 for b in ws.eval_batches)
    assert any(f"Live numbers use {MIN_LIVE_ROWS} of the 48 evaluation rows, 1 a batch" in c.value
               for c in at.caption)
    rows = evaluate(ws.loaded.model, ws.eval_batches, task=ws.task)
    assert float(metric(at, "dense accuracy")) == pytest.approx(rows.accuracy, abs=1e-4)


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
