"""Every dashboard page on the demo: renders cleanly, and acting on its main widgets changes what it shows.

Splits are small (HEADPRUNE_EVAL_SIZE etc., see app_support.SMALL); the demo model is built once (CI does that).
Numbers shown live are checked against an independent full evaluation.
"""

from __future__ import annotations

import io
import re
import zipfile

import numpy as np
import onnxruntime as ort
import pytest
from app_support import PAGES, figures, head_grids, metric, open_app, problems, run_trajectories, small_env

from headprune.evaluation.metrics import evaluate


@pytest.fixture(scope="module", autouse=True)
def small_splits():
    with small_env():
        yield


def workspace(at):
    from dashboard.store import store

    return store().get(f"ws|{at.session_state['hp_setup'].key}")


def loss_caption(at) -> float:
    text = next(c.value for c in at.caption if "Loss" in c.value)
    return float(re.search(r"Loss (\d+\.\d+)", text).group(1))


def test_home_opens_on_the_demo():
    at = open_app("home")
    assert not problems(at)
    assert at.session_state["hp_setup"].model == "demo"
    assert float(metric(at, "dense accuracy")) > 0.6
    assert any("demo" in s.value for s in at.success)
    sidebar = " ".join(m.value for m in at.sidebar.markdown)
    assert "6 × 12" in sidebar and "64 / 32" in sidebar
    assert "](http://localhost:8000/tutorials/dashboard/)" in at.title[0].proto.help   # the "?": the manual's page


def test_model_and_data_preview_and_reload():
    at = open_app("model")
    assert not problems(at)
    assert "](http://localhost:8000/tutorials/dashboard/#model-data)" in at.title[0].proto.help
    preview = at.dataframe[0].value
    assert {"text", "label"} <= set(preview.columns) and set(preview["label"]) <= {"fresh", "rotten"}
    at.number_input(key="md-eval").set_value(40).run()
    at.button(key="md-load").click().run()
    assert not problems(at)
    assert at.session_state["hp_setup"].eval_size == 40
    assert "40 / 32" in " ".join(m.value for m in at.sidebar.markdown)


def test_head_scores_heatmaps_correlation_and_overlap():
    at = open_app("scores")
    assert not problems(at)
    at.multiselect(key="scores-criteria").set_value(["ae", "gnorm"]).run()
    at.button(key="scores-compute").click().run()
    assert not problems(at)
    grids = head_grids(at)
    assert len(grids) == 3                                  # two criteria + the kept-by overlap grid
    assert all(g.shape == (6, 12) for g in grids)
    assert not np.allclose(grids[0].astype(float), grids[1].astype(float))  # two criteria, two rankings
    # the ρ matrix prints its values (a text layer over the heatmap, each in the colour that reads on its cell)
    corr = next(f for f in figures(at) if len(f["data"]) > 1 and f["data"][1].get("mode") == "text")
    assert corr["data"][0]["x"] == ["ae", "gnorm"] and len(corr["data"][1]["text"]) == 4
    overlap_before = grids[2].astype(float)
    at.slider(key="scores-ratio").set_value(80).run()
    assert not np.array_equal(head_grids(at)[2].astype(float), overlap_before)


def test_prune_toggle_updates_live_metrics_that_match_a_full_evaluation():
    at = open_app("prune")
    assert not problems(at)
    assert metric(at, "heads left") == "72 / 72"
    at.button(key="prune-toggle").click().run()             # the default head: layer 0, head 0
    assert not problems(at)
    assert metric(at, "heads left") == "71 / 72"
    loss_one = loss_caption(at)
    at.slider(key="prune-ratio").set_value(50).run()
    at.button(key="prune-apply").click().run()
    assert not problems(at)
    assert metric(at, "heads left") == "36 / 72"
    ws, sd = workspace(at), at.session_state["hp_session"]
    full = evaluate(ws.loaded.model, ws.eval_batches, sd.mask)
    assert float(metric(at, "accuracy")) == pytest.approx(full.accuracy, abs=1e-4)
    assert loss_caption(at) == pytest.approx(full.loss, abs=1e-4) and loss_caption(at) != loss_one
    at.button(key="prune-undo").click().run()
    assert metric(at, "heads left") == "71 / 72"
    at.button(key="prune-reset").click().run()
    assert metric(at, "heads left") == "72 / 72" and metric(at, "accuracy") == metric(at, "dense accuracy")


def test_attention_changes_with_the_head_and_says_when_it_is_pruned():
    at = open_app("attention")
    assert not problems(at)

    def arc_widths():
        fig = next(f for f in figures(at) if any("dep → head" in str(t.get("marker", {})) for t in f["data"]))
        return [t["line"]["width"] for t in fig["data"] if t.get("mode") == "lines"]

    first = arc_widths()
    assert first
    at.selectbox(key="att-layer").set_value(3).run()
    at.selectbox(key="att-head").set_value(5).run()
    assert not problems(at)
    assert arc_widths() != first
    sd = at.session_state["hp_session"]
    assert sd.head == (3, 5)
    sd.set_mask(sd.mask.prune(3, 5))
    at.run()
    assert any("pruned" in w.value for w in at.warning)
    assert max(arc_widths()) == pytest.approx(1.0)        # a pruned head puts no attention on any arc


def test_trajectories_run_and_plot():
    at = open_app("trajectories")
    assert not problems(at)
    run_trajectories(at)
    assert not problems(at)
    table = at.dataframe[0].value
    assert list(table["order"]) == ["ae", "random (seed 0)", "random (seed 1)"]
    assert (table["pruned at end (%)"] == 50.0).all()
    fig = figures(at)[0]
    assert {t["type"] for t in fig["data"]} >= {"scatter", "box"}


def test_export_builds_a_pruned_model_that_matches_the_live_metric():
    at = open_app("prune")
    at.slider(key="prune-ratio").set_value(25).run()
    at.button(key="prune-apply").click().run()
    live_accuracy = float(metric(at, "accuracy"))
    at.switch_page(PAGES["export"]).run()
    assert not problems(at)
    labels = [b.proto.label for b in at.get("download_button")]
    assert {"Mask (JSON)", "Scores (CSV)", "Run file (JSON)"} <= set(labels)
    at.button(key="export-build").click().run()
    assert not problems(at)
    assert float(metric(at, "accuracy of the pruned model")) == pytest.approx(live_accuracy, abs=1e-4)
    sizes = at.dataframe[0].value.set_index("part")
    assert sizes.loc["attention qkvo", "removed (%)"] == pytest.approx(25.0, abs=0.5)
    assert "Pruned model (zip)" in [b.proto.label for b in at.get("download_button")]

    # the same mask as an ONNX graph: run in onnxruntime on the evaluation rows, zipped with its tokenizer
    at.radio(key="export-format").set_value("onnx").run()
    at.button(key="export-build").click().run()
    assert not problems(at)
    assert float(metric(at, "accuracy of the pruned model")) == pytest.approx(live_accuracy, abs=1e-4)
    captions = " ".join(c.value for c in at.caption)
    assert "Loads in: onnxruntime" in captions and "onnxruntime ran the file on" in captions
    assert at.button(key="export-onnx-speed").proto.label.startswith("Time the pruned and the dense graph")
    zipped = next(v["zip"] for k, v in at.session_state["hp_session"].exports.items() if k.startswith("model|onnx|"))
    with zipfile.ZipFile(io.BytesIO(zipped)) as archive:   # the bytes the download button hands out
        assert sorted(archive.namelist()) == [f"headprune-onnx-model/{name}" for name in
                                              ("model.onnx", "tokenizer.json", "tokenizer_config.json")]
        graph = archive.read("headprune-onnx-model/model.onnx")
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    ids = np.array([[101, 2023, 3185, 2001, 2307, 102]])
    logits = session.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids),
                                "token_type_ids": np.zeros_like(ids)})[0]
    assert logits.shape == (1, 2) and np.isfinite(logits).all()
