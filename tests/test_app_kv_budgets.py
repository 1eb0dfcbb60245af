"""Dashboard KV page (issue 37 item 6): budget plans (HeadKV's allocation) and each rule's card, on a tiny saved
Llama LM (4 blocks x 2 key/value groups), checked against the library's allocation and an independent evaluation."""

from __future__ import annotations

import numpy as np
import pytest
from app_support import array, figures, open_app, problems, workspace
from conftest import save_tiny_lm

from dashboard.config import Setup
from headprune.kvcache.budgets import allocate
from headprune.kvcache.plan import KVPlan
from headprune.kvcache.scores import RULE_KINDS, RULES
from headprune.kvcache.tasks import metric_under_plan

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_setup(tmp_path_factory):
    folder, rows = save_tiny_lm(tmp_path_factory.mktemp("kv-page"))
    return Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=12, max_length=32)


def test_kv_page_budgets_and_rule_cards(tiny_setup):
    at = open_app("kv", tiny_setup)
    assert not problems(at), problems(at)
    at.selectbox(key="kv-rule").set_value("random").run()
    at.number_input(key="kv-sink").set_value(1).run()
    at.number_input(key="kv-window").set_value(3).run()
    assert any("**random**: baseline (seeded)" in c.value for c in at.caption)
    at.radio(key="kv-kind").set_value("budgets (HeadKV)").run()
    at.number_input(key="kv-budget").set_value(48).run()
    assert not problems(at), problems(at)
    assert any("**budgets**: published (HeadKV" in c.value for c in at.caption)
    grid = next(f for f in figures(at) if f["layout"]["title"]["text"].startswith("KV budget per key/value head"))
    shown = next(t for t in grid["data"] if t.get("name") == "heads")["text"]
    # the page's budgets are HeadKV's allocation of the same group scores (the library, called independently)
    from dashboard.compute import kv_group_scores

    ws = workspace(at)
    scores = kv_group_scores(ws, "random", 1, 3)
    expected = allocate(scores, 48, 1, 2.0)
    assert [int(v) for v in array(shown).ravel()] == expected.ravel().tolist() and expected.sum() == 48
    # the metric shown is an exact evaluation under that budget plan
    plan = KVPlan(np.zeros((4, 2), dtype=bool), 8, 1, 1, windows=expected - 1, budget=48)
    exact = metric_under_plan(ws.loaded.model, ws.eval_batches, plan).to_dict()["perplexity"]
    assert next(m for m in at.metric if m.label.startswith("perplexity")).value == f"{exact:.4g}"
    # a total too small for S + 1 per group: the reason, not a traceback
    at.number_input(key="kv-budget").set_value(8).run()
    assert any("each needs at least S + 1 = 2" in e.value for e in at.error) and not at.exception
    # the outside-window mass on rows no longer than S + W: the reason, and the page stops there
    at.selectbox(key="kv-rule").set_value("far-mass" if "far-mass" in RULES else "duo").run()
    at.number_input(key="kv-window").set_value(4000).run()
    assert any("needs rows longer than S + W = 4001" in e.value for e in at.error) and not at.exception


def test_every_rule_says_published_proxy_or_baseline():
    assert set(RULE_KINDS) == set(RULES)
    assert all(kind.split(" (")[0] in ("published", "proxy", "baseline") for kind in RULE_KINDS.values())
    if "far-mass" not in RULES:   # today's duo is the attention-mass measure: its card says proxy
        assert RULE_KINDS["duo"].startswith("proxy") and "not DuoAttention's gates" in RULE_KINDS["duo"]
