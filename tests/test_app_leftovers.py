"""Issue 35, item 6: the dashboard says only true things. Demo data named for what it is, no label-map controls for
a language model, no syntax views for data that is not a language (with the reason), signed changes whose arrows
agree with them, numbers formatted for people."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from app_support import figures, metric, open_app, problems, small_env, workspace

from headprune import viz
from headprune.data import NAMED_DATA


@pytest.fixture(scope="module", autouse=True)
def small_splits():
    with small_env():
        yield


def test_model_and_data_names_the_demo_data_and_hides_label_maps_for_a_language_model():
    at = open_app("model")
    assert not problems(at)
    data_kind = at.radio(key="md-data-kind")
    assert "Rotten Tomatoes" in data_kind.format_func("demo")
    assert [t.key for t in at.text_input if t.key == "md-label-map"], "a classifier keeps its label map"
    at.radio(key="md-model-kind").set_value("demo-circuit").run()      # picked, not loaded
    assert not problems(at)
    label = at.radio(key="md-data-kind").format_func("demo")
    assert NAMED_DATA["demo-circuit"].description in label and "Rotten" not in label
    assert not [t for t in at.text_input if t.key == "md-label-map"]
    assert not [c for c in at.checkbox if c.key == "md-labels-by-position"]
    assert any("no labels to map" in c.value for c in at.caption)


def test_data_that_is_not_a_language_gets_no_syntax_views_and_says_why():
    from dashboard.compute import syntax_problem

    def ws(data, calib=None):
        return SimpleNamespace(setup=SimpleNamespace(data=data, calib_data=calib), key=f"fake|{data}")

    reason = syntax_problem(ws("demo-circuit"))
    assert reason and "not a language" in reason and "random word blocks" in reason
    assert syntax_problem(ws("demo", calib="demo-circuit")) is not None
    assert syntax_problem(ws("demo")) is None and syntax_problem(ws("demo-lm")) is None
    assert not NAMED_DATA["demo-circuit"].language and NAMED_DATA["demo"].language


def test_attention_page_on_the_circuit_demo_draws_no_arcs_and_no_profile_and_says_why():
    from dashboard.config import Setup

    at = open_app("attention", Setup(model="demo-circuit", data="demo-circuit", data_label="demo-circuit"))
    assert not problems(at)
    assert any("not a language" in i.value for i in at.info)
    titles = [(f.get("layout", {}).get("title") or {}).get("text") or "" for f in figures(at)]
    assert any(t.startswith("word attention") for t in titles)      # the word-level attention is still drawn
    assert len(titles) == 2, titles                                  # and the head grid; no arc figure
    assert not [b for b in at.button if b.key == "att-profile"]
    assert "Syntactic profile of this head" not in [h.value for h in at.subheader]


def test_random_word_blocks_fail_the_parsers_own_language_check():
    """User data: the parser's stop-word share decides (shuffled rare words are not English; a review is)."""
    from headprune.syntax import ParserError
    from headprune.syntax.parse import language_problem

    rng = np.random.default_rng(0)
    words = ["film", "acting", "plot", "wonderful", "slow", "camera", "score", "scene", "director", "cast",
             "story", "ending", "script", "actor", "comedy", "drama", "visual", "music", "heart", "moment"]
    blocks = [" ".join(rng.permutation(words)[:10]) for _ in range(6)]
    prose = ["The film is slow, but the acting is wonderful and the story has a heart of its own.",
             "It was one of the best movies I have seen in years, and I would watch it again."] * 3
    try:
        assert "stop words" in (language_problem(blocks) or "")
    except ParserError as exc:
        pytest.skip(str(exc))
    assert language_problem(prose) is None


def test_pruning_three_heads_shows_a_negative_parameter_change_that_a_real_cut_confirms():
    from headprune.model.surgery import prune_model

    at = open_app("prune")
    for head in range(3):   # pick the head, press Prune / restore
        at.selectbox(key="prune-head").set_value((0, head)).run()
        at.button(key="prune-toggle").click().run()
    assert not problems(at)
    sd = at.session_state["hp_session"]
    box = next(m for m in at.metric if m.label == "parameters left")
    ws = workspace(at)
    cut = sum(p.numel() for p in prune_model(ws.loaded.model, sd.mask).parameters())
    total = sum(p.numel() for p in ws.loaded.model.parameters())
    assert box.value == f"{cut / 1e6:.2f} M"
    assert box.delta == f"{100 * (cut - total) / total:+.1f}%" and box.delta.startswith("-")
    assert metric(at, "heads left") == "69 / 72"


def test_numbers_are_formatted_for_people_in_every_table():
    assert [viz.number_text(v) for v in (100.0, 22713986, 0.84031, 256.54, 1626.9, 0.0012346, None, float("nan"),
                                         True, "kl")] == \
        ["100", "22,713,986", "0.8403", "256.5", "1,627", "0.001235", "—", "—", "True", "kl"]
    frame = pd.DataFrame({"order": ["kl"], "AUC": [0.812345], "pruned at end (%)": [100.0], "steps": [12]})
    html = viz.readable(frame).to_html()
    assert "100.0000" not in html and ">100<" in html and ">0.8123<" in html and ">12<" in html
