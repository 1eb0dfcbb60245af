"""The Prune page's live view: a running estimate first, then the exact value (== a full evaluation); the LM demo's
perplexity (lower is better); which pruned sets a grouped-query model can cut cleanly.

Splits are small (app_support.SMALL); the classifier and LM demos are built once per machine (CI does that).
"""

from __future__ import annotations

import re

import pytest
from app_support import metric, open_app, problems, small_env, workspace

from dashboard.ui import estimate_value
from headprune.evaluation.metrics import evaluate
from headprune.model.mask import HeadMask


@pytest.fixture(scope="module", autouse=True)
def small_splits():
    with small_env(HEADPRUNE_EVAL_SIZE="128"):  # 4 batches: room for estimates
        yield


@pytest.fixture
def shown_estimates(monkeypatch):
    """Every running estimate the page draws, with what it drew for it (ui.running_metric's st.metric arguments)."""
    import dashboard.ui as ui

    seen, formatter = [], ui.running_metric

    def record(metric, estimate, previous):
        drawn = formatter(metric, estimate, previous)
        seen.append((estimate, drawn, previous))
        return drawn

    monkeypatch.setattr(ui, "running_metric", record)
    return seen


def sidebar_heads_left(at) -> str:
    text = "\n".join(m.value for m in at.sidebar.markdown)
    return re.search(r"heads left: \*\*([^*]+)\*\*", text).group(1)


def test_a_click_shows_an_estimate_then_the_exact_value_of_a_full_evaluation(shown_estimates):
    at = open_app("prune")
    assert not problems(at)
    assert metric(at, "heads left") == "72 / 72" and sidebar_heads_left(at) == "72 / 72"
    at.button(key="prune-toggle").click().run()                  # layer 0, head 0: every layer re-runs
    assert not problems(at)
    ws, sd = workspace(at), at.session_state["hp_session"]
    full = evaluate(ws.loaded.model, ws.eval_batches, sd.mask)
    running = [e for e, _, _ in shown_estimates if not e.exact]
    assert running, "no running estimate was shown before the exact value"
    for estimate, drawn, previous in shown_estimates:   # a number only once its interval is narrow (issue 35)
        if estimate.shown:
            assert drawn["value"] == estimate_value(estimate) and drawn["label"] == "accuracy"
        else:
            assert drawn["value"] == f":gray[{previous:.4f}]" and "computing" in drawn["label"]
    dense = ws.metric_of(ws.dense())
    assert all(p == pytest.approx(dense) for _, _, p in shown_estimates)     # the first click greys the dense value
    done = [e.done for e in running]           # the first batch's at once, later ones at most every 0.3 s
    assert done[0] == 1 and done == sorted(set(done)) and done[-1] < len(ws.eval_batches)
    assert all(e.metric == "accuracy" and e.total == len(ws.eval_batches) for e in running)
    assert all(e.low <= e.value <= e.high for e in running if e.low is not None)
    assert float(metric(at, "accuracy")) == pytest.approx(full.accuracy, abs=1e-4)   # then exact
    assert metric(at, "heads left") == "71 / 72" and sidebar_heads_left(at) == "71 / 72"


def test_estimate_text_says_value_and_interval():
    from headprune.evaluation.progressive import Estimate

    assert estimate_value(Estimate("accuracy", 0.81, None, None, 1, 16, 32)) == "≈ 0.810"
    assert estimate_value(Estimate("accuracy", 0.81, 0.78, 0.84, 6, 16, 192)) == "0.810 ± 0.030"
    assert estimate_value(Estimate("perplexity", 263.0, 250.0, 280.0, 6, 16, 192)) == "≈ 263.0 (250.0–280.0)"


def test_lm_demo_shows_perplexity_live_with_lower_is_better():
    from dashboard.config import Setup

    at = open_app("prune", setup=Setup(model="demo-lm", data="demo-lm", data_label="demo-lm"))
    assert not problems(at)
    at.button(key="prune-toggle").click().run()
    assert not problems(at)
    ws, sd = workspace(at), at.session_state["hp_session"]
    full = evaluate(ws.loaded.model, ws.eval_batches, sd.mask, task=ws.task)
    shown = next(m for m in at.metric if m.label == "perplexity")
    assert float(shown.value) == pytest.approx(full.perplexity, rel=1e-4)
    from streamlit.proto.Metric_pb2 import Metric

    worse = full.perplexity > ws.dense().perplexity                   # a higher perplexity is drawn red
    assert shown.proto.color == (Metric.MetricColor.RED if worse else Metric.MetricColor.GREEN)
    assert "lower is better" in shown.proto.help
    # the LM demo has 8 query / 2 key-value heads: one head of layer 0 is an uneven cut
    assert any(m.value.startswith("- layer 0: uneven") for m in at.markdown)


@pytest.fixture(scope="module")
def tiny_gqa_setup(tmp_path_factory):
    """A tiny saved Llama LM (4 layers, 8 query / 2 key-value heads) and a text file to evaluate it on."""
    from dashboard.config import Setup
    from headprune.testing import offline_tokenizer, tiny_decoder

    root = tmp_path_factory.mktemp("tiny-gqa")
    lines = [f"the film {w} and the cast {v} a lot" for w in ("was good", "was bad", "felt slow", "is fun")
             for v in ("liked it", "hated it", "knew it", "saw it", "lost it")]
    tokenizer = offline_tokenizer("unigram", lines)
    model = tiny_decoder("llama", "lm", vocab_size=max(len(tokenizer), 120))
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    (root / "text.txt").write_text("\n".join(lines) + "\n")
    return Setup(model=str(root / "model"), data=str(root / "text.txt"), data_label="text.txt", calib_size=8,
                 eval_size=12), model


def test_cut_summary_names_clean_and_uneven_cuts_of_a_gqa_model(tiny_gqa_setup):
    setup, model = tiny_gqa_setup
    at = open_app("prune", setup=setup)
    assert not problems(at)
    sd = at.session_state["hp_session"]
    # layer 1 keeps 1 head of group 0 and all 4 of group 1 (group 1's K/V held 4 times); layer 3 drops group 1
    sd.set_mask(HeadMask.from_pruned({1: [0, 1, 2], 3: [4, 5, 6, 7]}, sd.mask.shape), "test")
    at.run()
    assert not problems(at)
    lines = [m.value for m in at.markdown if m.value.startswith("- layer ")]
    assert len(lines) == 1
    rows = lines[0].split("\n")
    k_proj = model.model.layers[1].self_attn.k_proj
    head_dim = model.config.head_dim
    per_copy = 2 * head_dim * k_proj.in_features          # W_K and W_V rows of one key/value head (no biases)
    assert rows[0] == (f"- layer 1: uneven — K/V of group 1 held 4×, +{3 * per_copy:,} parameters "
                       "(5 query / 5 key-value heads left)")
    assert rows[1] == "- layer 3: whole key/value groups — cuts cleanly (4 query / 1 key-value heads left)"


def test_speed_up_is_measured_on_request_next_to_the_ideal(tiny_gqa_setup):
    from headprune.evaluation.speed import mask_flops

    setup, model = tiny_gqa_setup
    at = open_app("prune", setup=setup)
    sd = at.session_state["hp_session"]
    mask = HeadMask.from_pruned({0: [4, 5, 6, 7], 2: [0, 1, 2, 3]}, sd.mask.shape)
    sd.set_mask(mask, "test")
    at.run()
    assert "ideal speed-up (FLOPs)" not in [m.label for m in at.metric]   # nothing is timed unasked
    at.button(key="prune-speed").click().run()
    assert not problems(at)
    length = max(n for n in (64, 256) if n <= model.config.max_position_embeddings)   # longer ones are skipped
    assert metric(at, "ideal speed-up (FLOPs)") == f"{mask_flops(model, mask, length)['ideal_speedup']:.2f}×"
    assert re.fullmatch(r"\d+\.\d\d×", metric(at, "measured, throughput"))
