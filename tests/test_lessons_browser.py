"""Every shipped lesson walked step by step in a real browser (issue 36, "Done when"): each step's link opens its
page in its state (page, pruned heads, selected head) with its text above it, and the induction lesson's step
with the induction heads cut shows perplexity far above the dense model's.

One Streamlit server and one Chromium for the whole module (tests/test_browser.py's fixtures); a step is one page
load. Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest
from test_browser import wait_idle  # the server and browser: tests/conftest.py, shared

from dashboard.ui import PAGES
from headprune.lessons import SHIPPED, load_lessons, named_shape

TITLES = {url: title for _, title, _, url in PAGES}
LESSONS, ERRORS = load_lessons([SHIPPED], pages=list(TITLES))
NUMBER = re.compile(r"[0-9][0-9,]*\.?[0-9]*")


def grid_size(lesson) -> int:
    layers, heads = named_shape(lesson.model)
    return layers * heads


def open_step(page, server, lesson, k: int) -> None:  # noqa: F811
    page.goto(f"{server}/?{urlencode(lesson.query(k))}")
    step = lesson.steps[k - 1]
    page.get_by_text(f"step {k} of {len(lesson.steps)}").first.wait_for()
    page.get_by_role("heading", name=TITLES[step.state.page]).first.wait_for()
    wait_idle(page)


@pytest.mark.parametrize("name", sorted(LESSONS))
def test_every_step_opens_its_state_and_its_text(server, browser, name):  # noqa: F811
    assert not ERRORS, ERRORS
    lesson = LESSONS[name]
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    for k, step in enumerate(lesson.steps, start=1):
        open_step(page, server, lesson, k)
        panel = page.locator(".st-key-lesson-panel").inner_text()
        first_line = step.text.split("\n")[0].replace("*", "")[:60]     # as rendered: Markdown's ** gone
        assert step.title in panel and first_line in panel.replace("\n", " "), panel
        if step.question:
            assert step.question in panel
            page.get_by_text("Reveal the answer").click()
            page.get_by_text(step.answer.split("\n")[0][:40]).first.wait_for()
        pruned = len(step.state.mask or ())
        page.get_by_text(f"{grid_size(lesson) - pruned} / {grid_size(lesson)}").first.wait_for()   # heads left
        if step.state.head is not None and step.state.page == "attention":   # the arcs' title names the head
            page.wait_for_function(f"() => document.body.textContent.includes("
                                   f"'word attention, layer {step.state.head[0]}, head {step.state.head[1]}')")
        if k < len(lesson.steps):
            # the panel's last line may land after its text (a loaded machine): wait for it, then count
            page.get_by_role("link", name=f"step {k + 1} →").first.wait_for()
            assert page.get_by_role("link", name=f"step {k + 1} →").count() == 1
    page.close()


def test_the_induction_lesson_after_the_cut_perplexity_is_far_above_dense(server, browser):  # noqa: F811
    lesson = LESSONS["induction-heads"]
    k = next(i for i, s in enumerate(lesson.steps, start=1) if s.state.page == "prune" and s.state.mask)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    open_step(page, server, lesson, k)
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
                           ".some(v => !v.innerText.includes('≈') && !v.innerText.includes('±'))")
    wait_idle(page)
    values = {}
    for box in page.locator('[data-testid="stMetric"]').all():
        label = box.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        values[label] = box.locator('[data-testid="stMetricValue"]').inner_text().strip()
    dense = float(NUMBER.search(values["dense perplexity"]).group().replace(",", ""))
    pruned = float(NUMBER.search(values["perplexity"]).group().replace(",", ""))
    assert dense < 2 and pruned > 100 * dense, values
    page.close()


def test_a_student_over_the_websocket_protocol_acts_as_a_browser_would(server):  # noqa: F811
    """benchmarks/bench_class.py's student whose browser is elsewhere (``protocol_student``, the class-of-30
    numbers in docs/how-to/classroom.md): it opens the lesson link over Streamlit's websocket protocol, and each
    click toggles the head it names (the caption names it, "heads left" counts down, a number follows)."""
    import argparse
    import asyncio
    import concurrent.futures
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("bench_class", Path(__file__).resolve().parents[1] / "benchmarks"
                                                  / "bench_class.py")
    bench_class = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_class)
    lesson = LESSONS["most-heads-can-go"]
    args = argparse.Namespace(step=2, clicks=2, think=(0.0, 0.0), seed=0, timeout=240.0)
    student = bench_class.protocol_student(server, 0, 0.0, args, lesson, named_shape(lesson.model), "accuracy")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop: sync Playwright runs one here
        out = pool.submit(asyncio.run, student).result()
    assert out["errors"] == [] and "open_s" in out, out
    assert [(c["layer"], c["head"]) for c in out["clicks"]] == bench_class.student_heads(0, 2, named_shape(
        lesson.model), 0)
    assert all(c["toggled"] and c["first_s"] > 0 for c in out["clicks"])
