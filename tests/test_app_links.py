"""The KV cache page's plan in the link (issue 35), on a tiny saved Llama: the page writes ``kv=`` to the address
bar, and a fresh session given that query string shows the same plan (rule, share, sink, window, full heads)."""

from __future__ import annotations

import numpy as np
from app_support import ROOT, metric, open_app, problems, workspace
from conftest import save_tiny_lm
from streamlit.testing.v1 import AppTest

from dashboard.config import Setup
from headprune.viewstate import KVView


def test_the_kv_plan_goes_to_the_link_and_comes_back(tmp_path):
    folder, rows = save_tiny_lm(tmp_path / "lm")
    setup = Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=8, max_length=32)
    at = open_app("kv", setup)
    assert not problems(at), problems(at)
    at.selectbox(key="kv-rule").set_value("random").run()
    at.number_input(key="kv-window").set_value(4).run()
    full = at.session_state["kv-full"].copy()
    full[0, 0] = not full[0, 0]                      # the Switch button on one key/value head
    at.selectbox(key="kv-head").set_value((0, 0)).run()
    at.button(key="kv-toggle").click().run()
    assert not problems(at), problems(at)
    assert (at.session_state["kv-full"] == full).all()
    text = at.query_params["kv"]
    text = text[-1] if isinstance(text, list) else text
    plan = KVView.parse(text, shape=full.shape)
    assert (plan.rule, plan.sink, plan.window) == ("random", 4, 4) and plan.share == 25
    assert set(plan.full) == set(map(tuple, np.argwhere(full).tolist()))

    # a fresh session (a new browser, or F5) given the query string: the same plan on the page
    again = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    again.session_state["hp_setup"] = setup
    for key, value in at.query_params.items():
        again.query_params[key] = value[-1] if isinstance(value, list) else value
    again.run()
    assert not problems(again), problems(again)
    assert again.title[0].value == "KV cache"
    assert again.selectbox(key="kv-rule").value == "random" and again.number_input(key="kv-window").value == 4
    assert (again.session_state["kv-full"] == full).all()


def test_a_lesson_steps_link_is_read_by_urlstate_alone_and_its_sentence_opens_every_view(tmp_path):
    """Issue 35: the address bar has one reader (dashboard/urlstate.py). A lesson step's link names the lesson, the
    step and a sentence; the session records the step (the panel above the page) and every view that takes one
    text (the model view here; the Attention page and "What the pruned model says" read the same keys) opens on
    the link's sentence, not on its own default."""
    folder, rows = save_tiny_lm(tmp_path / "lm")
    setup = Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=8, max_length=32)
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    at.session_state["hp_setup"] = setup
    for key, value in {"page": "heads", "lesson": "what-a-head-looks-at", "step": "2",
                       "sentence": "a cat sat on the mat"}.items():
        at.query_params[key] = value
    at.run()
    assert not problems(at), problems(at)
    assert at.title[0].value == "Every head at a glance"
    assert at.session_state["hp_lesson"] == ("what-a-head-looks-at", 2)
    assert any("step 2 of" in m.value for m in at.markdown)                  # the lesson panel above the page
    assert at.radio(key="att-source").value == "type one"
    assert at.text_input(key="att-typed").value == "a cat sat on the mat"
    # the address bar carries the sentence and the lesson step on (F5 opens the same)
    sent = {k: (v[-1] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert (sent["sentence"], sent["lesson"], sent["step"]) == ("a cat sat on the mat", "what-a-head-looks-at", "2")


def test_only_urlstate_reads_or_writes_the_query_string():
    """One owner of the address bar (issue 35): no other dashboard module touches ``st.query_params``."""
    touching = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "dashboard").rglob("*.py")
                      if "query_params" in path.read_text(encoding="utf-8"))
    assert touching == ["dashboard/urlstate.py"]


def test_the_kv_page_measures_a_plan_on_quick_rows_by_default_and_all_rows_one_click_away(tmp_path):
    """Issue 35: a KV head click in about 2 s on demo-lm: by default each plan is measured on KV_ROWS evaluation rows
    (seeded whole batches), said on the page; "all" measures every row. Both numbers equal the library's own
    evaluation of that plan on those batches."""
    from dashboard.compute import KV_ROWS, trajectory_batches
    from headprune.kvcache import KVPlan
    from headprune.kvcache.tasks import metric_under_plan

    folder, rows = save_tiny_lm(tmp_path / "lm", n=120)
    setup = Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=100, max_length=32)
    at = open_app("kv", setup)
    assert not problems(at), problems(at)
    ws = workspace(at)
    plan = KVPlan(at.session_state["kv-full"].copy(), ws.adapter.n_heads, 4, 16)

    def shown_and_exact(n_rows):
        exact = ws.metric_of(metric_under_plan(ws.loaded.model, trajectory_batches(ws, n_rows), plan, None))
        return float(metric(at, f"{ws.metric} under the plan")), exact

    assert at.radio(key="kv-rows").value == "quick"
    assert any(f"measured on {KV_ROWS} of the 100 evaluation rows" in c.value for c in at.caption)
    shown, exact = shown_and_exact(KV_ROWS)
    assert len(trajectory_batches(ws, KV_ROWS)) < len(ws.eval_batches)
    assert abs(shown - exact) <= 5e-4 * abs(exact), (shown, exact)
    at.radio(key="kv-rows").set_value("all").run()
    assert not problems(at), problems(at)
    assert any("measured on all 100 evaluation rows" in c.value for c in at.caption)
    shown, exact = shown_and_exact(None)
    assert abs(shown - exact) <= 5e-4 * abs(exact), (shown, exact)


def sidebar_images(at) -> list:
    """The sidebar's ``st.image`` elements (AppTest has no typed accessor for images)."""
    found, stack = [], list(at.sidebar.children.values())
    while stack:
        node = stack.pop()
        if getattr(node, "type", None) == "image":
            found.append(node.proto.imgs[0])
        stack.extend(getattr(node, "children", {}).values())
    return found


def test_the_qr_code_is_inline_and_encodes_the_link(tmp_path):
    """Issue 36 item 5: the QR code was a media file that the session's next rerun dropped, so a browser still
    fetching it got HTTP 404 (2 of 30 students in benchmarks/bench_class.py). It is now a ``data:`` URI inside the
    page's message (no /media/ address to go stale), the same on a rerun, and its pixels are the link's QR modules."""
    import base64
    import io

    import segno
    from PIL import Image

    folder, rows = save_tiny_lm(tmp_path / "lm")
    setup = Setup(model=folder, data=rows, data_label="rows.csv", calib_size=8, eval_size=8, max_length=32)
    at = open_app("home", setup)
    assert not problems(at), problems(at)
    (image,) = sidebar_images(at)
    prefix = "data:image/png;base64,"
    assert image.url.startswith(prefix) and image.caption == "Scan to open this view"
    at.run()
    assert [i.url for i in sidebar_images(at)] == [image.url]
    link = at.sidebar.code[0].value
    pixels = np.array(Image.open(io.BytesIO(base64.b64decode(image.url[len(prefix):]))).convert("L")) < 128
    modules = np.array([[bool(m) for m in row] for row in segno.make(link, error="m").matrix])
    border, scale = 2, 6
    size = modules.shape[0] + 2 * border
    assert pixels.shape == (size * scale, size * scale)
    sampled = pixels[scale // 2::scale, scale // 2::scale][border:-border, border:-border]   # one pixel per module
    assert (sampled == modules).all()
