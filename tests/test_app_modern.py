"""The dashboard on tiny saved DeBERTa-v2 and ModernBERT classifiers: model picker -> scores -> attention -> prune
-> export, with no family-specific code in the pages (everything goes through the adapter).

Each folder holds a random tiny model and an offline tokenizer of its family's kind (DeBERTa: SentencePiece
Unigram, ModernBERT: byte-level BPE), as headprune.testing.save_tiny_modern writes them.
"""

from __future__ import annotations

import pytest
from app_support import PAGES, figures, full_evaluation, head_grids, metric, open_app, problems, prune_lowest, workspace

from dashboard.config import Setup
from headprune.testing import save_tiny_modern

ROWS = [("A three-hour cinema master class.", "fresh"), ("Dull, lifeless and far too long.", "rotten"),
        ("Funny and warm.", "fresh"), ("A mess from start to finish.", "rotten")] * 5
ARCHS = ("deberta-v2", "modernbert")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("app-modern")
    texts = [t for t, _ in ROWS]
    out = {arch: str(save_tiny_modern(arch, root / arch, texts, {0: "rotten", 1: "fresh"})) for arch in ARCHS}
    data = root / "reviews.csv"
    data.write_text("\n".join(["text,label"] + [f'"{t}",{y}' for t, y in ROWS]) + "\n", encoding="utf-8")
    out["data"] = str(data)
    return out


def setup_for(folders, arch: str) -> Setup:
    return Setup(model=folders[arch], data=folders["data"], data_label="reviews.csv", calib_size=8, eval_size=12,
                 max_length=32)


@pytest.mark.parametrize("arch", ARCHS)
def test_model_picker_scores_attention_prune_export(arch, folders):
    other = ARCHS[1 - ARCHS.index(arch)]
    at = open_app("model", setup_for(folders, other))
    assert not problems(at)
    at.text_input(key="md-model-folder").set_value(folders[arch]).run()
    at.button(key="md-load").click().run()
    assert not problems(at)
    assert at.session_state["hp_setup"].model == folders[arch]
    assert workspace(at).adapter.family == arch

    at.switch_page(PAGES["scores"]).run()
    at.multiselect(key="scores-criteria").set_value(["ae", "his"]).run()
    at.button(key="scores-compute").click().run()
    assert not problems(at)
    grids = head_grids(at)
    assert len(grids) == 3 and all(g.shape == (3, 4) for g in grids)
    rows = figures(at)[0]["layout"]["yaxis"]["ticktext"]
    if arch == "modernbert":   # local and global layers are marked on the grid
        assert rows == ["L0 · full", "L1 · sliding", "L2 · full"]
    else:
        assert rows == ["L0", "L1", "L2"]

    at.switch_page(PAGES["attention"]).run()
    assert not problems(at)
    assert [g.shape for g in head_grids(at)] == [(3, 4)]   # attention along the parsed arcs, per head
    assert float(head_grids(at)[0].astype(float).max()) > 0

    at.switch_page(PAGES["prune"]).run()
    assert metric(at, "heads left") == "12 / 12"
    prune_lowest(at, 25)
    assert not problems(at)
    assert metric(at, "heads left") == "9 / 12"
    live_accuracy = float(metric(at, "accuracy"))
    assert live_accuracy == pytest.approx(full_evaluation(at).accuracy, abs=1e-4)

    at.switch_page(PAGES["export"]).run()
    assert not problems(at)
    at.button(key="export-build").click().run()
    assert not problems(at)
    assert float(metric(at, "accuracy of the pruned model")) == pytest.approx(live_accuracy, abs=1e-4)
    assert "Pruned model (zip)" in [b.proto.label for b in at.get("download_button")]
