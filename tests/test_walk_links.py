"""Links the server cannot honour say what they dropped, in one notice, and the link's new keys (issue 45 items 3
and 8, issue 46 item 7): the evaluation rows a link carries, the Prune page's criterion, a lesson step this server
does not have. AppTest on a tiny saved classifier (seconds); the browser cases are tests/test_walk_regressions.py."""

from __future__ import annotations

import html

import pytest
from app_support import ROOT, problems
from streamlit.testing.v1 import AppTest

from dashboard.config import Setup


def opened(setup: Setup, query: dict[str, str]) -> AppTest:
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["hp_setup"] = setup
    for key, value in query.items():
        at.query_params[key] = value
    at.run()
    assert not problems(at), problems(at)
    return at


def notices(at) -> list[str]:
    """The link's notices as the page shows them (the Markdown source escapes what could read as markup)."""
    return [html.unescape(w.value) for w in at.warning if "This link named" in w.value]


def link(at) -> dict[str, str]:
    return {k: v[-1] if isinstance(v, list) else v for k, v in at.query_params.items()}


@pytest.fixture(scope="module")
def tiny_setup(tiny_model_dir, tiny_csv) -> Setup:
    return Setup(model=str(tiny_model_dir), data=tiny_csv, data_label="tiny.csv", calib_size=8, eval_size=30,
                 max_length=32)


def test_a_links_rows_are_the_rows_measured_on_and_more_than_there_are_is_said(tiny_setup):
    """``rows=12``: the numbers are measured on the first 12 evaluation rows (independent: ``evaluate`` on those
    rows of the full workspace), and the link writes it back; ``rows=500`` on a 30-row split: all 30, and said."""
    from app_support import metric

    from dashboard.store import store
    from headprune.data import make_batches
    from headprune.evaluation.metrics import evaluate

    at = opened(tiny_setup, {"page": "prune", "rows": "12"})
    ws = store().get(f"ws|{at.session_state['hp_setup'].key}")
    assert len(ws.eval) == 12 and link(at)["rows"] == "12" and not notices(at)
    if store().get(f"ws|{tiny_setup.key}") is None:
        opened(tiny_setup, {})                        # the workspace without the link's rows: the whole split
    full = store().get(f"ws|{tiny_setup.key}")
    rows = make_batches(full.loaded.tokenizer, full.eval.subset(range(12)), 32, full.max_length)
    reference = evaluate(full.loaded.model, rows, task=full.task)
    assert float(metric(at, "dense accuracy")) == pytest.approx(reference.accuracy, abs=1e-4)

    at = opened(tiny_setup, {"page": "prune", "rows": "500"})
    (notice,) = notices(at)
    assert "rows=500 dropped: tiny.csv has 30 evaluation rows here" in notice and link(at)["rows"] == "30"


def test_the_prune_pages_criterion_goes_to_the_link_and_comes_back(tiny_setup):
    at = opened(tiny_setup, {"page": "prune", "criterion": "random", "criteria": "ae,his"})
    assert at.selectbox(key="prune-crit").value == "random"
    assert link(at)["criterion"] == "random" and link(at)["criteria"] == "ae,his"
    at.selectbox(key="prune-crit").set_value("his").run()
    assert link(at)["criterion"] == "his"


def test_a_lesson_step_this_server_does_not_have_is_said_once(tiny_setup):
    at = opened(tiny_setup, {"page": "prune", "lesson": "nope", "step": "2", "ratio": "7"})
    (notice,) = notices(at)
    assert "lesson='nope' step=2 dropped: lesson 'nope', which this server does not have (its lessons:" in notice
    assert "induction-heads" in notice and "ratio='7' dropped" in notice
    assert [html.unescape(w.value) for w in at.warning if "nope" in w.value] == [notice]     # one, not a second
    assert "lesson" not in link(at) and "step" not in link(at)
    at = opened(tiny_setup, {"page": "prune", "lesson": "induction-heads", "step": "99"})
    (notice,) = notices(at)
    assert "lesson='induction-heads' step=99 dropped: step 99 of lesson 'induction-heads', which has 6 steps" \
        in notice


def test_a_job_stopped_by_another_click_is_said_on_the_next_run(tiny_setup):
    """What ``ui.job`` leaves behind when a rerun ends a job (Streamlit stops the script; the browser test stops a
    real Apply): the next run of any page says which job stopped, once."""
    at = opened(tiny_setup, {"page": "prune"})
    at.session_state["hp_running"] = "Find head roles"
    at.run()
    stopped = [w.value for w in at.warning if "stopped before it finished" in w.value]
    assert len(stopped) == 1 and "Find head roles" in stopped[0]
    at.run()
    assert not [w for w in at.warning if "stopped before it finished" in w.value]


def test_a_cancel_that_arrives_after_its_job_ended_is_said_and_forgotten(tiny_setup):
    """A Cancel click that reaches the server once the job has finished (the CI walk pressed Cancel as Measure
    ended: no note came, and the mark stayed to silence the next stopped job's note): said once, then dropped."""
    at = opened(tiny_setup, {"page": "prune"})
    at.session_state["hp_cancelled"] = "roles-ablate-cancel"          # no "hp_running": nothing was running
    at.run()
    assert sum("Cancel came after the run had finished" in i.value for i in at.info) == 1
    assert "hp_cancelled" not in at.session_state
    at.session_state["hp_running"] = "Measure"                        # a later job stopped by another click
    at.run()
    assert any("Measure" in w.value and "stopped before it finished" in w.value for w in at.warning)
    assert not any("Cancel came after" in i.value for i in at.info)


def test_a_kv_budget_plan_goes_to_the_link_and_comes_back(tmp_path):
    """Issue 45 item 8: the KV page's budget plan (HeadKV's allocation) reached no link (only a share of full heads
    did). Its total and beta are written (``kv=rule_bTOTAL-BETA_sink_window_length``) and a fresh session given
    that query string opens the same plan."""
    from conftest import save_tiny_lm

    from headprune.viewstate import KVView

    folder, rows = save_tiny_lm(tmp_path / "lm")
    setup = Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=8, max_length=32)
    at = opened(setup, {"page": "kv-cache"})
    at.radio(key="kv-kind").set_value("budgets (HeadKV)").run()
    at.number_input(key="kv-budget").set_value(160).run()
    at.number_input(key="kv-beta").set_value(3.0).run()
    assert not problems(at), problems(at)
    plan = KVView.parse(link(at)["kv"])
    assert (plan.budget, plan.beta, plan.share, plan.full) == (160, 3.0, None, None), link(at)
    again = opened(setup, link(at))
    assert again.title[0].value == "KV cache" and not notices(again)
    assert again.radio(key="kv-kind").value == "budgets (HeadKV)"
    assert again.number_input(key="kv-budget").value == 160 and again.number_input(key="kv-beta").value == 3.0
    assert link(again)["kv"] == link(at)["kv"]
