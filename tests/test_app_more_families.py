"""The dashboard on issue-47 families, with no family-specific code in the pages: a tiny Longformer classifier
(banded local + global attention, the least BERT-like of them) through scores -> attention -> prune -> export, and a
tiny GPT-J language model whose KV page refuses a plan by name (GPT-J computes attention in its own code).
Live numbers are checked against an independent full evaluation.
"""

from __future__ import annotations

import pytest
from app_support import PAGES, figures, head_grids, metric, open_app, problems, prune_lowest, workspace

from dashboard.config import Setup
from headprune.evaluation.metrics import evaluate

ROWS = [("A three-hour cinema master class.", "fresh"), ("Dull, lifeless and far too long.", "rotten"),
        ("Funny and warm, the cast is wonderful.", "fresh"), ("A mess from start to finish.", "rotten")] * 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """A tiny random Longformer classifier and GPT-J LM with an offline byte-level BPE tokenizer, saved like a
    user's folders, and a CSV of labelled reviews."""
    from headprune.testing import offline_tokenizer, tiny_more

    root = tmp_path_factory.mktemp("app-more")
    tokenizer = offline_tokenizer("byte-level-bpe", [t for t, _ in ROWS])
    labels = {"id2label": {0: "rotten", 1: "fresh"}, "label2id": {"rotten": 0, "fresh": 1}}
    for arch in ("longformer", "gptj"):
        model = tiny_more(arch, num_labels=2, vocab_size=len(tokenizer), max_positions=128)
        model.config.update(dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                 eos_token_id=tokenizer.eos_token_id, **labels))
        model.save_pretrained(root / arch)
        tokenizer.save_pretrained(root / arch)
    data = root / "reviews.csv"
    data.write_text("\n".join(["text,label"] + [f'"{t}",{y}' for t, y in ROWS]) + "\n", encoding="utf-8")
    return {"longformer": str(root / "longformer"), "gptj": str(root / "gptj"), "data": str(data)}


def setup(folders, arch: str) -> Setup:
    return Setup(model=folders[arch], data=folders["data"], data_label="reviews.csv", calib_size=8, eval_size=12,
                 max_length=32)


def test_longformer_scores_attention_prune_export(folders):
    at = open_app("scores", setup(folders, "longformer"))
    assert not problems(at) and workspace(at).adapter.family == "longformer"
    at.multiselect(key="scores-criteria").set_value(["ae", "his"]).run()
    at.button(key="scores-compute").click().run()
    assert not problems(at)
    assert [g.shape for g in head_grids(at)] == [(3, 4)] * 3

    at.switch_page(PAGES["attention"]).run()   # T x T maps assembled from the banded local + global form
    assert not problems(at)
    assert float(head_grids(at)[0].astype(float).max()) > 0

    at.switch_page(PAGES["prune"]).run()
    assert metric(at, "heads left") == "12 / 12"
    prune_lowest(at, 25)
    assert not problems(at) and metric(at, "heads left") == "9 / 12"
    ws = workspace(at)
    reference = evaluate(ws.loaded.model, ws.eval_batches, at.session_state["hp_session"].mask, task=ws.task)
    assert float(metric(at, "accuracy")) == pytest.approx(reference.accuracy, abs=1e-4)

    at.switch_page(PAGES["export"]).run()
    at.button(key="export-build").click().run()
    assert not problems(at)
    assert float(metric(at, "accuracy of the pruned model")) == pytest.approx(reference.accuracy, abs=1e-4)


def test_gptj_kv_page_refuses_by_name_and_prune_page_is_live(folders):
    at = open_app("kv", Setup(model=folders["gptj"], data=folders["data"], data_label="reviews.csv", calib_size=8,
                              eval_size=12, max_length=32))
    assert not problems(at)
    assert any("cannot take a KV cache plan" in w.value and "its own code" in w.value for w in at.warning)
    assert not figures(at)   # the page stopped before drawing a plan

    at.switch_page(PAGES["prune"]).run()
    prune_lowest(at, 25)
    assert not problems(at)
    ws = workspace(at)
    reference = evaluate(ws.loaded.model, ws.eval_batches, at.session_state["hp_session"].mask, task=ws.task)
    shown = float(metric(at, "perplexity").split()[0])
    assert shown == pytest.approx(reference.perplexity, rel=1e-3)
