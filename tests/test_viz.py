"""Figure builders and criterion comparisons of headprune.viz, checked against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from headprune import viz
from headprune.criteria import ScoreMap
from headprune.model.mask import HeadMask
from headprune.syntax.parse import Arc


def smap(values, name="ae") -> ScoreMap:
    return ScoreMap(np.array(values, dtype=float), name)


def test_colors_are_stable_and_distinct_per_criterion():
    from headprune.criteria import available

    colors = [viz.criterion_color(n) for n in available() if n != "random"]
    assert len(set(colors)) == len(colors)
    assert viz.criterion_color("random") == viz.RANDOM_COLOR
    assert viz.criterion_color("inverse gnorm") == viz.criterion_color("gnorm")
    assert viz.criterion_color("not-a-criterion") == viz.criterion_color("not-a-criterion")
    scale = viz.criterion_colorscale("gnorm")
    assert scale[1][1] == viz.criterion_color("gnorm") and scale[0][0] == 0 and scale[-1][0] == 1


def test_score_heatmap_has_one_cell_per_head_with_rank_colours_and_hover():
    s = smap([[0.1, 0.5, np.nan], [0.9, 0.3, 0.2]])
    fig = viz.score_heatmap(s, selected=(1, 0))
    pruned_layer, values_layer, clicks = fig.data
    z = np.array(values_layer.z, dtype=float)
    assert z.shape == (2, 3)
    # 0.9 is kept longest (1.0), 0.1 pruned first (0.0), the pruned head is not coloured
    assert z[1, 0] == 1.0 and z[0, 0] == 0.0 and np.isnan(z[0, 2])
    assert np.array(pruned_layer.z, dtype=float)[0, 2] == 0.0
    hover = list(clicks.hovertext)
    assert "rank 1 of 5" in hover[3] and "pruned" in hover[2]
    assert [list(c) for c in clicks.customdata][4] == [1, 1]
    assert fig.layout.shapes[0].x0 == -0.5 and fig.layout.shapes[0].y0 == 0.5


def test_tied_grid_is_one_row_labelled_all_layers():
    fig = viz.mask_figure(HeadMask.ones((1, 4)).prune(0, 2), tied=True)
    assert list(fig.layout.yaxis.ticktext) == ["all layers (tied)"]
    assert list(fig.data[2].text) == ["", "", "✕", ""]


def test_clicked_head_reads_customdata_or_coordinates():
    assert viz.clicked_head({"points": [{"customdata": [3, 7], "x": 7, "y": 3}]}) == (3, 7)
    assert viz.clicked_head({"points": [{"x": 2.0, "y": 1.0}]}) == (1, 2)
    assert viz.clicked_head({"points": []}) is None and viz.clicked_head(None) is None


def test_rank_correlation_matches_hand_ranks():
    a = smap([[1, 2], [3, 4]], "ae")
    b = smap([[4, 3], [2, 1]], "gnorm")          # exact reverse
    c = smap([[1, np.nan], [3, 10]], "his")      # monotone with a on the shared heads
    corr = viz.rank_correlation({"ae": a, "gnorm": b, "his": c})
    assert corr.loc["ae", "gnorm"] == pytest.approx(-1.0)
    assert corr.loc["ae", "his"] == pytest.approx(1.0)
    assert corr.loc["gnorm", "gnorm"] == 1.0
    assert viz.correlation_figure(corr).data[0].z.shape == (3, 3)


def test_kept_at_ratio_and_jaccard():
    from headprune.scoring import jaccard

    a = smap([[1, 2], [3, 4]], "ae")             # prunes (0,0) then (0,1) ...
    b = smap([[4, 1], [2, 3]], "gnorm")          # prunes (0,1) then (1,0) ...
    np.testing.assert_array_equal(a.kept_at(0.5), [[False, False], [True, True]])
    np.testing.assert_array_equal(b.kept_at(0.5), [[True, False], [False, True]])
    table = viz.jaccard_table({"ae": a, "gnorm": b}, 0.5)
    assert table.loc["ae", "gnorm"] == pytest.approx(1 / 3)   # {(1,0),(1,1)} vs {(0,0),(1,1)}
    # heads already pruned count towards the ratio
    c = smap([[np.nan, 2], [3, 4]], "his")
    np.testing.assert_array_equal(c.kept_at(0.5), [[False, False], [True, True]])
    fig = viz.overlap_figure({"ae": a, "gnorm": b}, 0.5)
    np.testing.assert_array_equal(np.array(fig.data[1].z, dtype=float), [[1, 0], [1, 2]])
    assert jaccard(np.zeros(3, bool), np.zeros(3, bool)) == 1.0


def test_scores_frame_is_long_and_complete():
    df = viz.scores_frame({"ae": smap([[1, np.nan]], "ae"), "his": smap([[5, 6]], "his")})
    assert len(df) == 4 and list(df.columns) == ["criterion", "layer", "head", "score", "rank", "pruned"]
    assert df[(df["criterion"] == "his") & (df["head"] == 1)]["rank"].item() == 1
    assert bool(df[(df["criterion"] == "ae") & (df["head"] == 1)]["pruned"].item())


def test_arc_and_attention_figures():
    words = ["the", "film", "works"]
    arcs = [Arc(0, 1, "det"), Arc(1, 2, "nsubj")]
    fig = viz.arc_figure(words, arcs, np.array([0.1, 0.8]))
    lines = [t for t in fig.data if t.mode == "lines"]
    assert len(lines) == 2 and lines[1].line.width > lines[0].line.width
    assert [a.text for a in fig.layout.annotations] == ["det", "nsubj"]
    att = viz.attention_figure(words, np.eye(3))
    assert np.array(att.data[0].z).shape == (3, 3)


def test_typed_words_and_titles_reach_plotly_as_text_never_markup():
    """Plotly reads <a href>, <span style>, <b> ... in every label, title and hover: a typed sentence's word
    "<a href=...>" was a link to another host in the Attention page's axes. Every string of the figures is
    searched for a tag plotly would read (its own pattern: '<' then an optional '/' and a tag name)."""
    import json
    import re

    words = ["<a href='http://example.com/x'>click</a>", "Tom&Jerry", "<span style='color:red'>x</span>"]
    arcs = [Arc(0, 1, "det"), Arc(1, 2, "nsubj")]
    title = "layer 0 <a href='http://example.com/'>head</a> 1"
    tag = re.compile(r"<\s*/?\s*(a|span|b|i|em|sup|sub)\b", re.IGNORECASE)
    for fig in (viz.attention_figure(words, np.eye(3), title=title), viz.arc_figure(words, arcs, None, title=title),
                viz.kept_share_figure({"ae": [1.0]}, [0.5], title=title),
                viz.score_heatmap(smap([[1, 2]]), title=title)):
        text = json.dumps(json.loads(fig.to_json()), ensure_ascii=False)
        assert not tag.search(text), tag.search(text)
        assert "&lt;a href" in text and ("Tom&amp;Jerry" in text or "attention" not in text)
    assert viz.plot_text("a < b & c") == "a &lt; b &amp; c"


def test_size_table():
    report = {"encoder": {"before": {"params": 100, "mb": 1.0}, "after": {"params": 75, "mb": 0.75},
                          "removed_params": 25}}
    row = viz.size_table(report).iloc[0]
    assert row["removed (%)"] == 25.0 and row["params after"] == 75


def test_clicked_head_accepts_the_shapes_a_browser_sends():
    assert viz.clicked_head({"points": [{"customdata": {"0": 2, "1": 5}}]}) == (2, 5)
    assert viz.clicked_head({"points": [{"customdata": "junk", "x": 1, "y": 0}]}) == (0, 1)
    assert viz.clicked_head({"points": [{"x": None, "y": None}]}) is None


def test_png_and_html_export():
    from pathlib import Path

    fig = viz.mask_figure(HeadMask.ones((2, 3)).prune(1, 1))
    assert "plotly" in viz.figure_html(fig)[:5000].lower() and "<html" in viz.figure_html(fig)[:200].lower()
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("PNG export needs a local Chromium for kaleido")
    png = viz.figure_png(fig, width=300, height=200, scale=1)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
