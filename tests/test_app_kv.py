"""Dashboard: the KV cache page -- a plan per key/value head, switched by hand; the metric and the bytes move."""

from __future__ import annotations

import numpy as np
import pytest
from app_support import figures, open_app, problems, small_env, workspace

from dashboard.config import Setup
from headprune.kvcache import KVPlan
from headprune.kvcache.tasks import metric_under_plan


@pytest.fixture(scope="module", autouse=True)
def small_splits():
    with small_env():
        yield


def metric_of(at, prefix: str):
    return next(m for m in at.metric if m.label.startswith(prefix))


def test_kv_page_switch_a_head_moves_bytes_and_metric():
    at = open_app("kv", Setup(model="demo-lm", data="demo-lm", data_label="demo-lm"))
    assert not problems(at), problems(at)
    at.selectbox(key="kv-rule").set_value("random").run()
    at.number_input(key="kv-window").set_value(4).run()
    assert not problems(at), problems(at)
    ws = workspace(at)
    full = at.session_state["kv-full"].copy()
    assert full.shape == (6, 2) and int(full.sum()) == 3                      # 25% of 12 key/value heads
    grid = next(f for f in figures(at) if any(t.get("name") == "heads" for t in f["data"]))
    assert np.array_equal(np.array(next(t for t in grid["data"] if t.get("name") == "heads")["text"],
                                   dtype=object), np.where(full, "F", "S").ravel())
    before_metric = metric_of(at, "perplexity").value
    before_bytes = metric_of(at, "KV bytes").value
    streaming = tuple(int(i) for i in np.argwhere(~full)[0])
    at.selectbox(key="kv-head").set_value(streaming).run()
    at.button(key="kv-toggle").click().run()
    assert not problems(at), problems(at)
    after = at.session_state["kv-full"]
    assert after[streaming] and int(after.sum()) == 4
    assert metric_of(at, "KV bytes").value != before_bytes
    assert metric_of(at, "perplexity").value != before_metric
    # the number shown is an independent evaluation under the same plan
    exact = metric_under_plan(ws.loaded.model, ws.eval_batches, KVPlan(after, 8, 4, 4)).to_dict()["perplexity"]
    assert metric_of(at, "perplexity").value == f"{exact:.4g}"


def test_kv_page_refuses_an_encoder_with_the_reason():
    at = open_app("kv")     # the default demo: MiniLM, an encoder
    assert not problems(at), problems(at)
    assert any("encoder" in w.value and "no key/value cache" in w.value for w in at.warning)
