"""Exported figures keep their labels (issue 35, item 5): every figure kind the dashboard draws carries axis
titles and tick labels in its standalone HTML, lets them push the margins (plotly's own default cuts the layer
labels off at a 10 px margin), writes cell text in a colour that reads on the cell, and a kaleido PNG has its
labels inside the image."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

from headprune import viz
from headprune.criteria import ScoreMap
from headprune.model.mask import HeadMask
from headprune.trajectory import Trajectory

RNG = np.random.default_rng(0)


def smap(name: str, shape=(6, 12)) -> ScoreMap:
    return ScoreMap(RNG.random(shape), name)


def trajectory(name: str) -> Trajectory:
    steps = [{"ratio": r, "metrics": {"accuracy": a}} for r, a in ((0.25, 0.8), (0.5, 0.6), (0.75, 0.4))]
    return Trajectory(name, {}, False, 1, 0, [6, 12], "head", "accuracy", {"accuracy": 0.85}, steps=steps)


def figure_kinds() -> dict:
    """Every figure kind the pages draw and the Export page hands out, on small made-up inputs."""
    scores = {name: smap(name) for name in ("gnorm", "kl", "sap-cf")}
    profile_like = type("P", (), {"relations": ["nsubj", "det"], "counts": {"nsubj": 9, "det": 4},
                                  "accuracy": {"nsubj": RNG.random((6, 12)), "det": RNG.random((6, 12))},
                                  "best_head": lambda self, r: {"layer": 1, "head": 2, "accuracy": 0.9}})()
    return {
        "head mask": viz.mask_figure(HeadMask.ones((6, 12)).prune(0, 3)),
        "scores": viz.score_heatmap(scores["kl"], title="kl"),
        "scores 32x32": viz.score_heatmap(smap("gnorm", (32, 32))),
        "rank correlation": viz.correlation_figure(viz.rank_correlation(scores)),
        "overlap": viz.overlap_figure(scores, 0.5),
        "role grid": viz.role_grid(smap("previous-token"), 0.5),
        "kv plan": viz.kv_plan_grid(RNG.random((6, 2)), RNG.random((6, 2)) > 0.5),
        "trajectories": viz.trajectory_figure([trajectory("gnorm"), trajectory("kl")], tolerance=0.9),
        "sparsity": viz.sparsity_figure([{"criterion": "kl", "sparsity": s, "mean": 0.8 - s, "sd": 0.01}
                                         for s in (0.25, 0.5)], "accuracy", dense=0.85),
        "kept share": viz.kept_share_figure({"induction": [1.0, 0.5, 0.0]}, [0.0, 0.5, 1.0]),
        "attention": viz.attention_figure(["the", "film", "was", "good"], RNG.random((4, 4))),
        "profile": viz.profile_figure(profile_like, 0, 1),
        "kv bytes": viz.kv_bytes_figure({"full_cache": 2**21, "plan": 2**20, "ratio": 0.5}, 1024),
    }


def html_figure(html: str) -> dict:
    """The figure JSON inside a standalone HTML export: Plotly.newPlot("id", data, layout, config)."""
    call = html[html.index("Plotly.newPlot("):]
    decoder = json.JSONDecoder()
    rest = call[call.index(",") + 1:].lstrip()
    data, end = decoder.raw_decode(rest)
    rest = rest[end:].lstrip()[1:].lstrip()
    layout, _ = decoder.raw_decode(rest)
    return {"data": data, "layout": layout}


@pytest.fixture(scope="module")
def exported():
    return {name: html_figure(viz.figure_html(fig)) for name, fig in figure_kinds().items()}


@pytest.mark.parametrize("name", list(figure_kinds()))
def test_html_export_carries_axis_titles_tick_labels_and_pushes_the_margins(exported, name):
    layout = exported[name]["layout"]
    for axis in ("xaxis", "yaxis"):
        assert layout[axis].get("automargin") is True, f"{name}: {axis} labels may be cut off"
    assert layout["xaxis"]["title"]["text"] and layout["yaxis"]["title"]["text"], f"{name} lacks an axis title"


def test_grid_exports_name_every_layer_and_head(exported):
    for name, rows, cols in (("head mask", 6, 12), ("scores", 6, 12), ("scores 32x32", 32, 32), ("overlap", 6, 12)):
        layout = exported[name]["layout"]
        assert layout["yaxis"]["ticktext"] == [f"L{i}" for i in range(rows)]
        assert list(layout["xaxis"]["tickvals"]) == list(range(cols))
    assert exported["scores"]["layout"]["title"]["text"] == "kl"


def test_rank_correlation_export_names_the_criteria_on_both_axes_and_writes_every_value(exported):
    fig = exported["rank correlation"]
    heat, values = fig["data"]
    assert heat["x"] == heat["y"] == ["gnorm", "kl", "sap-cf"]
    assert fig["layout"]["xaxis"]["title"]["text"] == fig["layout"]["yaxis"]["title"]["text"] == "criterion"
    assert len(values["text"]) == 9 and "1.00" in values["text"]


def wcag_contrast(a: str, b: str) -> float:
    def lum(color):
        rgb = [int(color.lstrip("#")[i:i + 2], 16) / 255 for i in (0, 2, 4)]
        lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    high, low = sorted((lum(a), lum(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_cell_text_colour_follows_the_cell():
    # importance 1 is the criterion's deep shade, 0 its pale tint (criterion_colorscale's ends)
    score = ScoreMap(np.array([[0.0, 1.0, 2.0]]), "kl")
    fig = viz.score_heatmap(score, marks=np.array([["a", "b", "c"]], dtype=object))
    colors = list(fig.data[2].textfont.color)
    pale, _, deep = (c for _, c in viz.criterion_colorscale("kl"))
    assert colors[0] == viz.DARK_TEXT and colors[2] == viz.LIGHT_TEXT
    assert wcag_contrast(colors[0], pale) >= 4.5 and wcag_contrast(colors[2], deep) >= 4.5
    # rank correlation on RdBu: the diagonal's 1.00 sits on dark blue, a 0 on near white
    corr = viz.rank_correlation({"a": ScoreMap(np.array([[1.0, 2.0, 3.0]]), "a"),
                                 "b": ScoreMap(np.array([[3.0, 1.0, 2.0]]), "b")})
    values = viz.correlation_figure(corr).data[1]
    by_text = dict(zip(values.text, values.textfont.color))
    assert by_text["1.00"] == viz.LIGHT_TEXT and by_text["-0.50"] == viz.DARK_TEXT
    assert viz.contrast_text("#000000") == viz.LIGHT_TEXT and viz.contrast_text(viz.LIGHT_TEXT) == viz.DARK_TEXT


def test_png_export_has_its_labels_inside_the_image():
    """Kaleido PNG of a 6 x 12 grid built as the dashboard builds it (under the "streamlit" plotly template, the
    default once streamlit is imported, which does not turn automargin on): the left margin holds the L0-L5 labels
    and the axis title (ink there), and nothing runs off the left or bottom edge (the outermost pixel columns and
    rows are background)."""
    from PIL import Image
    from streamlit.elements.lib.streamlit_plotly_theme import configure_streamlit_plotly_theme

    configure_streamlit_plotly_theme()
    fig = viz.score_heatmap(smap("gnorm"), title="gnorm")
    fig.update_layout(template="streamlit")
    try:
        png = viz.figure_png(fig, width=900, scale=1)
    except RuntimeError as exc:
        pytest.skip(str(exc))
    rgba = Image.open(io.BytesIO(png)).convert("RGBA")
    white = Image.new("RGBA", rgba.size, "#ffffff")
    image = np.asarray(Image.alpha_composite(white, rgba).convert("L"), dtype=float)
    height, width = image.shape
    ink = image < 200
    edges = (ink[:, :2], ink[:, -2:], ink[:2, :], ink[-2:, :])
    assert not any(edge.any() for edge in edges), "a label runs off the image's edge"
    left = ink[:, : width // 15]
    assert left.sum() > 100, "no layer labels in the left margin"
    # the bottom margin holds the head numbers and the axis title "head": ink in the last 12% of the rows
    assert ink[int(height * 0.88):, :].sum() > 50
    assert re.match(rb"\x89PNG", png)


def test_png_and_svg_come_from_one_render_and_the_svg_keeps_its_words_as_text():
    """Issue 45 item 8: SVG next to PNG and HTML. One kaleido start renders both (a start is most of a render's
    time); the SVG of a trajectory figure holds its axis titles, tick labels and legend as SVG text a paper can
    restyle (the grids' layer labels: ``test_png_export_has_its_labels_inside_the_image``)."""
    fig = viz.trajectory_figure([trajectory("gnorm"), trajectory("kl")], tolerance=0.9)
    try:
        images = viz.figure_images(fig, ["png", "svg"])
    except RuntimeError as exc:
        pytest.skip(str(exc))
    assert re.match(rb"\x89PNG", images["png"]) and images["svg"].lstrip().startswith(b"<svg")
    words = set(re.findall(r">([^<>]+)</(?:text|tspan)>", images["svg"].decode()))
    assert {"heads pruned (%)", "accuracy (higher is better)"} <= words, words          # axis titles
    assert {"gnorm", "kl"} <= words                                                   # the legend
    assert {"20%", "50%", "0.4", "0.8"} <= words                                      # tick labels, both axes
