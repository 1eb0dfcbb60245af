"""What the pruned model says (issue 36 item 3), in the dashboard: on demo-circuit with its induction heads cut, the
repeated half of a row turns red; the numbers behind the colours are checked against per-token losses computed by
hand on a copy with the heads cut out by surgery."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from app_support import open_app, problems, small_env, workspace

from dashboard.config import Setup
from headprune.lessons import SHIPPED, read_lesson
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.views import delta_colour

PAGE = "dashboard/pages/13_What_it_says.py"
TOKEN = re.compile(r'<span data-pos="(\d+)" style="[^"]*" title="loss ([0-9.]+) → ([0-9.]+) nats \(Δ ([-+][0-9.]+)\)"')


@pytest.fixture(scope="module", autouse=True)
def small_splits():
    with small_env():
        yield


def induction_heads() -> tuple[tuple[int, int], ...]:
    """The heads the induction lesson cuts (measured on demo-circuit with the role detectors; the lesson says so)."""
    lesson = read_lesson(SHIPPED / "induction-heads.toml", pages=["roles", "heads", "example", "prune", "lessons"])
    return next(s.state.mask for s in lesson.steps if s.state.page == "example" and s.state.mask)


def test_cutting_the_induction_heads_turns_the_repeated_half_red():
    at = open_app("home", Setup(model="demo-circuit", data="demo-circuit", data_label="demo-circuit"))
    at.switch_page(PAGE).run()
    assert not problems(at), problems(at)
    ws = workspace(at)
    heads = induction_heads()
    mask = HeadMask.from_pruned({layer: [h for l_, h in heads if l_ == layer] for layer, _ in heads}, ws.shape)
    at.session_state["hp_session"].set_mask(mask, "test")
    at.run()
    assert not problems(at), problems(at)
    html = next(h.proto.body for h in at.get("html") if "data-pos" in h.proto.body)
    shown = {int(pos): (float(a), float(b), float(d)) for pos, a, b, d in TOKEN.findall(html)}
    # by hand: the row the page shows (evaluation row 0), tokenized as the model reads it, cut by surgery
    text, start = ws.eval.texts[0], ws.eval.targets_from[0]
    ids = torch.tensor(ws.loaded.tokenizer(text)["input_ids"])
    with torch.no_grad():
        dense = F.cross_entropy(ws.loaded.model(input_ids=ids[None]).logits[0, :-1], ids[1:], reduction="none")
        cut = F.cross_entropy(prune_model(ws.loaded.model, mask)(input_ids=ids[None]).logits[0, :-1], ids[1:],
                              reduction="none")
    offsets = ws.loaded.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
    repeated = [t for t in range(1, len(ids)) if offsets[t][1] > offsets[t][0] and offsets[t][0] >= start]
    assert sorted(shown) == list(range(1, len(ids)))     # every token after the first is coloured
    underlined = [int(p) for p in re.findall(r'data-pos="(\d+)" style="[^"]*border-bottom', html)]
    assert underlined == repeated                         # the scored half is underlined
    for t in range(1, len(ids)):
        a, b, d = shown[t]
        assert a == pytest.approx(float(dense[t - 1]), abs=0.006) and b == pytest.approx(float(cut[t - 1]), abs=0.006)
        assert d == pytest.approx(float(cut[t - 1] - dense[t - 1]), abs=0.011)
    # the repeated half is predicted from the first copy: cutting the induction heads makes it much worse there,
    # against the first half (context the metric does not score, but whose losses the model has all the same)
    first = [t for t in range(1, len(ids)) if t not in repeated and offsets[t][1] > offsets[t][0]]
    change = (cut - dense).numpy()
    assert np.mean(change[[t - 1 for t in repeated]]) > np.mean(change[[t - 1 for t in first]]) + 1.0
    assert np.mean([shown[t][2] for t in repeated]) > np.mean([shown[t][2] for t in first]) + 1.0
    # the colour of each token is its change: most of the repeated half red
    colours = dict(re.findall(r'data-pos="(\d+)" style="[^"]*background:(rgb\([0-9,]+\))', html))
    def rgb(text):
        return np.array([int(c) for c in re.findall(r"\d+", text)])

    for t in shown:    # the hover shows Δ to 2 decimals: the colour of the exact Δ is within a step or two
        assert np.abs(rgb(colours[str(t)]) - rgb(delta_colour(float(change[t - 1])))).max() <= 2
    assert sum(shown[t][2] > 0.5 for t in repeated) > len(repeated) / 2


def test_model_view_draws_every_head_in_one_image_and_greys_the_pruned():
    at = open_app("home", Setup(model="demo-circuit", data="demo-circuit", data_label="demo-circuit"))
    at.session_state["hp_session"].set_mask(HeadMask.from_pruned({1: [0, 1, 4, 5, 6, 7]}, (3, 8)), "test")
    at.switch_page("dashboard/pages/12_Model_view.py").run()
    assert not problems(at), problems(at)
    # every head in one picture, under a button per thumbnail (issue 45: clickable, with role letters and marks)
    [atlas] = [json.loads(e.proto.json) for e in at.get("bidi_component")
               if e.proto.component_name == "headprune_atlas"]
    assert atlas["uri"].startswith("data:image/png;base64,") and len(atlas["cells"]) == 24
    pruned = {(1, h) for h in (0, 1, 4, 5, 6, 7)}
    for cell in atlas["cells"]:
        gone = (cell["layer"], cell["head"]) in pruned
        assert cell["mark"].endswith("✕") == gone and cell["title"].endswith("pruned now") == gone, cell
        # the button covers its thumbnail: inside the image, in the head's column and the layer's row
        assert 0 <= cell["x"] and cell["x"] + cell["w"] <= 100 and 0 <= cell["y"] and cell["y"] + cell["h"] <= 100
        assert int(cell["x"] / (100 / 8)) == cell["head"] and int(cell["y"] / (100 / 3)) == cell["layer"]
    rows = [at.pills(key=f"glance-pick-{layer}") for layer in range(3)]   # one row of 8 heads per layer
    for layer, row in enumerate(rows):
        labels = [row.format_func(h) for h in range(8)]
        assert [label.endswith("✕") for label in labels] == [layer == 1 and h in (0, 1, 4, 5, 6, 7)
                                                             for h in range(8)], labels
    # clicking a head opens it large and selects it; the other rows show nothing picked
    at.pills(key="glance-pick-2").set_value(5).run()
    assert not problems(at), problems(at)
    assert [s.value for s in at.subheader] == ["layer 2 · head 5"]
    assert at.session_state["hp_session"].head == (2, 5)
    assert [at.pills(key=f"glance-pick-{layer}").value for layer in range(3)] == [None, None, 5]
