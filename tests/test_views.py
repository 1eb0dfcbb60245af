"""Views drawn without plotly (issue 36 items 2-3): the head atlas is every head's own map, in one PNG."""

import io

import numpy as np
import pytest

from headprune.views import EMPTY, HIGH, LOW, delta_colour, encode_png, head_atlas, loss_change_html


def test_each_thumbnail_is_its_heads_map_and_pruned_heads_are_grey():
    rng = np.random.default_rng(0)
    t, cell = 5, 10                      # each token spans exactly 2 pixels
    attention = rng.random((3, 4, t, t)).astype(np.float32)
    attention /= attention.sum(-1, keepdims=True)
    attention[2, 3] = 0                  # a head cut from the weights: no attention at all
    live = np.ones((3, 4), bool)
    live[1, 2] = False
    atlas = head_atlas(attention, live, cell=cell, gap=2)
    assert atlas.image.shape == (2 + 3 * 12, 2 + 4 * 12, 3)
    for layer in range(3):
        for head in range(4):
            x0, y0, x1, y1 = atlas.box(layer, head)
            thumb = atlas.image[y0:y1, x0:x1].astype(float)
            if (layer, head) == (2, 3):
                assert (thumb == EMPTY).all()
                continue
            # independent: the attention of query i to key j sits at pixel (2i, 2j), scaled by the head's max
            share = attention[layer, head] / attention[layer, head].max()
            if live[layer, head]:
                expect = LOW + (HIGH - LOW) * share[..., None]
                np.testing.assert_allclose(thumb[::2, ::2], expect, atol=0.51)
            else:
                assert (thumb[..., 0] == thumb[..., 1]).all() and (thumb[..., 1] == thumb[..., 2]).all()
                assert thumb.min() >= 150     # greyed: a third of the contrast
    np.testing.assert_allclose(atlas.peak, attention.max(axis=(-1, -2)))


def test_png_round_trip_and_selection_outline():
    pil = pytest.importorskip("PIL.Image")
    attention = np.full((2, 2, 3, 3), 1 / 3, dtype=np.float32)
    atlas = head_atlas(attention, np.ones((2, 2), bool), cell=6, gap=2, selected=(1, 0))
    decoded = np.array(pil.open(io.BytesIO(encode_png(atlas.image))))
    assert (decoded == atlas.image).all()
    x0, y0, x1, y1 = atlas.box(1, 0)
    assert tuple(atlas.image[y0 - 1, x0]) == (214, 39, 40) and tuple(atlas.image[y0, x0]) == tuple(HIGH.astype(int))
    assert atlas.data_uri().startswith("data:image/png;base64,")
    with pytest.raises(ValueError, match="layers, heads, T, T"):
        head_atlas(np.zeros((2, 2, 3)), np.ones((2, 2), bool))


def test_loss_change_colours():
    assert delta_colour(0.0) == "rgb(255,255,255)" and delta_colour(9.0) == "rgb(214,39,40)"
    assert delta_colour(-3.0) == "rgb(31,119,180)" and delta_colour(float("nan")) == "transparent"
    html = loss_change_html(["<a>", " b", " c"], np.array([np.nan, 1.0, 2.0]), np.array([np.nan, 4.0, 2.0]),
                            np.array([False, True, False]), selected=2)
    assert "&lt;a&gt;" in html and "loss 1.00 → 4.00 nats (Δ +3.00)" in html and "rgb(214,39,40)" in html
    assert html.count("background:") == 2 and html.count("border-bottom") == 1 and "outline" in html
    assert 'data-pos="2" style="padding:1px 0;border-radius:2px;background:rgb(255,255,255);outline' in html
