"""Lessons in a real browser (issues 36, 45 and 46).

Every shipped lesson walked step by step: each step's link opens its page in its state with its words above it;
the numbers the words quote are the ones the page shows (``{dense}``, ``{pruned}``, ``{heads_left}``, ... filled
from this server's live values, within what the lesson states, on the page's own metric too: the induction heads
cut give a perplexity far above dense); every control a step tells the student to use is on screen with that
label, a button enabled, and where the words promise what a press shows, pressed and seen (Apply prunes half of
the heads, Compute scores draws the figures the step describes); the induction lesson's token strip fits its
column and its guesses open past ``<bos>``.

A lesson is a file people share: a teacher's folder (HEADPRUNE_LESSONS, this module's server) holds one lesson
with raw HTML in every field, which the Lessons page lists as refused, its words shown as text, and one whose
words spell HTML through character references, shown as text in the lesson panel: no element, no script, no
request to another host.

One Streamlit server and one Chromium for the whole module (tests/test_browser.py's fixtures); a step is one page
load. Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing."""

from __future__ import annotations

import re
import time
from urllib.parse import urlencode, urlsplit

import pytest
from test_browser import wait_idle  # the server and browser: tests/conftest.py, shared

from dashboard.ui import PAGES
from headprune.lessons import (
    SHIPPED,
    TOLERANCE,
    load_lessons,
    named_controls,
    named_shape,
    number,
    placeholders,
)

TITLES = {url: title for _, title, _, url in PAGES}
LESSONS, ERRORS = load_lessons([SHIPPED], pages=list(TITLES))
NUMBER = re.compile(r"[0-9][0-9,]*\.?[0-9]*")
PAYLOAD = "<img src=x onerror=alert(1)>"
# the steps whose words promise what a press of their button shows (pressed in the walk, then that must be on
# screen); any other button a step names is checked visible and enabled, not pressed: Find head roles and a first
# Compute scores cost a minute of a loaded CI machine each, and tests/test_browser.py presses them already
AFTER_PRESS = {("most-heads-can-go", 2): "36 / 72", ("most-heads-can-go", 3): "36 / 72",
               ("most-heads-can-go", 4): "Do the criteria agree?"}


def server_env(tmp_path_factory) -> dict[str, str]:
    """A teacher's folder for this module's server: one hostile lesson, one that spells HTML as entities."""
    folder = tmp_path_factory.mktemp("teacher-lessons")
    fields = {key: f"{key} {PAYLOAD}" for key in ("title", "summary", "step", "text", "look", "question", "answer")}
    (folder / "hostile.toml").write_text(
        f'title = "{fields["title"]}"\nsummary = "{fields["summary"]}"\nminutes = 5\nmodel = "demo-circuit"\n'
        f'data = "demo-circuit"\n\n[[step]]\ntitle = "{fields["step"]}"\npage = "heads"\ntext = "{fields["text"]}"\n'
        f'look = "{fields["look"]}"\nquestion = "{fields["question"]}"\nanswer = "{fields["answer"]}"\n')
    (folder / "entities.toml").write_text(
        'title = "Entities &lt;img src=x onerror=alert(1)&gt;"\nsummary = "Words that spell a tag."\nminutes = 5\n'
        'model = "demo-circuit"\ndata = "demo-circuit"\n\n[[step]]\ntitle = "Spelled &#60;b&#62;"\npage = "heads"\n'
        'text = "A row starts with `<bos>`; this &lt;img src=x onerror=alert(1)&gt; is only words."\n')
    return {"HEADPRUNE_LESSONS": str(folder)}


def grid_size(lesson) -> int:
    layers, heads = named_shape(lesson.model)
    return layers * heads


def watched_page(browser, server):  # noqa: F811
    """A page that records every dialog (an alert would be a script run) and every request to another host."""
    origin = urlsplit(server).netloc
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(300_000)
    page.dialogs, page.elsewhere = [], []
    page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
    page.on("request", lambda request: None if urlsplit(request.url).scheme in ("data", "blob")
            or urlsplit(request.url).netloc == origin else page.elsewhere.append(request.url))
    return page


def open_step(page, server, lesson, k: int) -> None:  # noqa: F811
    page.goto(f"{server}/?{urlencode(lesson.query(k))}")
    step = lesson.steps[k - 1]
    page.get_by_text(f"step {k} of {len(lesson.steps)}").first.wait_for()
    page.get_by_role("heading", name=TITLES[step.state.page]).first.wait_for()
    wait_idle(page)


def exact_metrics(page) -> dict[str, str]:
    """The page's metrics once the headline is exact (no running estimate)."""
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')]"
                           ".some(v => /[0-9]/.test(v.innerText) && !v.innerText.includes('≈') && "
                           "!v.innerText.includes('±'))")
    wait_idle(page)
    values = {}
    for box in page.locator('[data-testid="stMetric"]').all():
        label = box.locator('[data-testid="stMetricLabel"]').inner_text().strip()
        values[label] = box.locator('[data-testid="stMetricValue"]').inner_text().strip()
    return values


def value_of(text: str) -> float:
    return float(NUMBER.search(text).group().replace(",", ""))


def shown_values(page, step) -> dict[str, str]:
    """The placeholders of ``step`` the page itself shows, formatted as the lesson panel formats them."""
    names = {m.group(1) for text in step.words().values() for m in placeholders(text)}
    shown = {}
    if names & {"dense", "pruned", "change"} and step.state.page == "prune":
        metrics = exact_metrics(page)
        dense_label = next(label for label in metrics if label.startswith("dense "))
        dense, pruned = value_of(metrics[dense_label]), value_of(metrics[dense_label.removeprefix("dense ")])
        shown.update(dense=number(dense), pruned=number(pruned))
    body = page.inner_text("body")
    left = re.search(r"heads left:? *\n?\s*([0-9]+) / ([0-9]+)", body)
    if left:
        shown.update(heads_left=number(int(left.group(1))), heads=number(int(left.group(2))))
    rows = re.search(r"evaluation / calibration: ([0-9]+) /", body)
    if rows:
        shown["rows"] = number(int(rows.group(1)))
    return {name: value for name, value in shown.items() if name in names}


def see_or_press(page, name: str, press: bool) -> bool:
    """The control labelled ``name`` is on screen; a button is enabled, and pressed when ``press`` (True)."""
    button = page.get_by_role("button", name=name, exact=True)
    if button.count():
        assert button.first.is_visible() and button.first.is_enabled(), f"button {name!r} is hidden or disabled"
        if press:
            button.first.click()
            wait_idle(page)
        return press
    control = page.get_by_role("tab", name=name, exact=True).or_(page.get_by_label(name, exact=True)) \
        .or_(page.get_by_text(name, exact=True))
    assert control.first.is_visible(), f"no control labelled {name!r} on screen"
    return False


def stated_numbers_hold_on_the_page(page, step) -> None:
    """Each number the words rely on (``{pruned~6100+-60%}``) holds for the page's own metric, not only the panel's:
    the induction lesson's "the task is gone" is a perplexity far above dense on the Prune page itself."""
    metrics = exact_metrics(page)
    dense_label = next(label for label in metrics if label.startswith("dense "))
    live = {"dense": value_of(metrics[dense_label]), "pruned": value_of(metrics[dense_label.removeprefix("dense ")])}
    for text in step.words().values():
        for match in placeholders(text):
            stated = match.group(3) and TOLERANCE.fullmatch(match.group(3))
            if stated and match.group(1) in live:
                expect, within = float(stated["value"].replace(",", "")), float(stated["within"].replace(",", ""))
                within = abs(expect) * within / 100 if stated["percent"] else within
                assert abs(live[match.group(1)] - expect) <= within, (match.group(), live)


def token_strip_fits_and_guesses_start_past_bos(page) -> None:
    """The induction lesson's step on What it says: the token strip wraps inside its column (it was 1,465 px in a
    940 px one) and the next-token guesses open on a token of the text, not on <bos>."""
    strip = page.locator('div[style*="pre-wrap"]', has=page.locator("span[data-pos]")).first
    strip.wait_for()
    scroll, client, right, window = strip.evaluate(
        "e => [e.scrollWidth, e.clientWidth, e.getBoundingClientRect().right, window.innerWidth]")
    assert scroll <= client + 1 and right <= window, (scroll, client, right, window)
    guess = page.locator('[data-testid="stSliderThumbValue"]').first.inner_text()
    assert not guess.startswith("0:") and "<bos>" not in guess, guess


@pytest.mark.parametrize("name", sorted(LESSONS))
def test_every_step_opens_its_state_with_its_words_numbers_and_controls(server, browser, name):  # noqa: F811
    assert not ERRORS, ERRORS
    lesson = LESSONS[name]
    page = watched_page(browser, server)
    for k, step in enumerate(lesson.steps, start=1):
        start = time.perf_counter()
        open_step(page, server, lesson, k)
        opened = time.perf_counter()
        panel = page.locator(".st-key-lesson-panel").inner_text()
        assert step.title in panel and "{" not in panel and "…" not in panel, panel
        assert "differ from what the lesson expects" not in page.inner_text("body"), panel   # the stated tolerances
        for placeholder, value in shown_values(page, step).items():
            assert value in panel, (k, placeholder, value, panel)
        pruned = len(step.state.mask or ())
        page.get_by_text(f"{grid_size(lesson) - pruned} / {grid_size(lesson)}").first.wait_for()   # heads left
        if step.state.head is not None and step.state.page == "attention":   # the arcs' title names the head
            page.wait_for_function(f"() => document.body.textContent.includes("
                                   f"'word attention, layer {step.state.head[0]}, head {step.state.head[1]}')")
        if step.question:
            page.get_by_text("Reveal the answer").click()
            first = re.split(r"[{*`]", step.answer.split("\n")[0])[0][:40].strip()
            page.get_by_text(first).first.wait_for()
        if k < len(lesson.steps):
            # the panel's last line may land after its text (a loaded machine): wait for it, then count
            page.get_by_role("link", name=f"step {k + 1} →").first.wait_for()
            assert page.get_by_role("link", name=f"step {k + 1} →").count() == 1
        if step.state.page == "prune" and step.state.mask:
            stated_numbers_hold_on_the_page(page, step)
        if step.state.page == "example" and lesson.model == "demo-circuit":
            token_strip_fits_and_guesses_start_past_bos(page)
        pressed = [label for text in step.words().values() for label in named_controls(text)
                   if see_or_press(page, label, (name, k) in AFTER_PRESS)]
        if pressed:
            page.get_by_text(AFTER_PRESS[name, k]).first.wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0, (k, pressed)
        print(f"{name} step {k}: opened in {opened - start:.1f} s, checked{' and pressed ' if pressed else ' '}"
              f"{', '.join(pressed)} in {time.perf_counter() - opened:.1f} s")
    page.close()
    assert page.dialogs == [] and page.elsewhere == []


def test_a_teachers_lessons_are_shown_as_text_never_as_html(server, browser):  # noqa: F811
    page = watched_page(browser, server)
    page.goto(f"{server}/?page=lessons")
    page.get_by_text("Lessons that could not be used").wait_for()
    wait_idle(page)
    code = page.locator('[data-testid="stMainBlockContainer"] [data-testid="stCode"]').inner_text()
    for field in ("'title'", "'summary'", "step 1 'title'", "step 1 'text'", "step 1 'look'", "step 1 'question'",
                  "step 1 'answer'"):
        assert re.search(rf"hostile\.toml:[0-9]+: {re.escape(field)} holds raw HTML \('[a-z ]*{re.escape(PAYLOAD)}",
                         code), (field, code)
    assert page.get_by_text("Entities &lt;img src=x onerror=alert(1)&gt;").count() == 1   # a title: plain text
    page.get_by_role("link", name="Spelled &#60;b&#62;").click()                           # its step, this tab
    page.get_by_text("step 1 of 1").first.wait_for()
    wait_idle(page)
    panel = page.locator(".st-key-lesson-panel").inner_text()
    assert "this <img src=x onerror=alert(1)> is only words" in panel and "<bos>" in panel, panel
    assert page.evaluate("() => document.querySelectorAll('img[src=\"x\"], img[onerror]').length") == 0
    assert page.locator(".st-key-lesson-panel b, .st-key-lesson-panel img").count() == 0
    # a link to a step this server cannot open says what it dropped
    page.goto(f"{server}/?model=demo-circuit&data=demo-circuit&page=heads&lesson=induction-heads&step=9")
    page.get_by_text("step 9 of lesson 'induction-heads', which has 6 steps").first.wait_for()
    page.close()
    assert page.dialogs == [] and page.elsewhere == [], (page.dialogs, page.elsewhere)


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
