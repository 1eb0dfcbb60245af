"""The address bar is the view (issue 35 items 1-2), in a real browser: one Streamlit server, one Chromium.

A walk on the demo makes the changes a teacher makes (grid click, Prune / restore, ratio slider, typed sentence),
reads the address bar after each, opens it in a NEW browser context and reloads it (F5): the same view must come
back (page, heads left, the metric, the selected head, ratio, sentence). One load of the worst hand-edited link
checks the one-line notice. The codec itself is tested without a browser in tests/test_viewstate.py.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

from test_browser import metric_value, nav, wait_idle

VIEW = {"width": 1500, "height": 1000}


def query(page) -> dict[str, str]:
    return {k: v[-1] for k, v in parse_qs(urlparse(page.url).query).items()}


def prune_view(page, metric: str = "accuracy") -> dict:
    """What the Prune page shows: heads left, the headline ``metric``, the Head dropdown's text, the ratio slider."""
    page.get_by_text("heads left").first.wait_for()
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")   # the exact value is in
    wait_idle(page)
    head = page.locator('[data-testid="stSelectbox"] input[aria-label="Head"]').first
    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
    return {"left": metric_value(page, "heads left"), metric: metric_value(page, metric),
            "head": head.input_value(), "ratio": slider.input_value(),
            "title": page.locator("h1").first.inner_text()}


def click_grid(page, n: int) -> None:
    """Click the ``n``-th point of the Prune page's head grid (a plotly scatter, one point per head)."""
    page.wait_for_function(f"() => document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length > {n}")
    box = page.locator(".js-plotly-plot .scatterlayer .point").nth(n).bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def open_and_click(browser, url: str, n: int, heads: int) -> tuple:  # noqa: F811 - the fixture, passed in
    """Open ``url`` on the Prune page of a language model with ``heads`` heads, all kept; click the ``n``-th grid
    point. Returns (page, the view before the click, the clicked head as the link writes it ``layer.head``): the
    click prunes that head and selects it, and the link's mask is exactly that head."""
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    page.goto(url)
    before = prune_view(page, "perplexity")
    assert before["left"] == f"{heads} / {heads}", before
    click_grid(page, n)
    page.wait_for_function(f"() => document.body.innerText.includes('{heads - 1} / {heads}')")
    page.wait_for_function("() => location.search.includes('head=')")
    clicked = query(page)["head"]
    assert query(page)["mask"] == clicked
    return page, before, clicked


def opened_elsewhere(browser, url: str, read) -> tuple[dict, dict]:  # noqa: F811 - the fixture, passed in
    """``read`` of ``url`` opened in a fresh browser context (no cookies, no session), then after a reload (F5)."""
    context = browser.new_context(viewport=VIEW)
    page = context.new_page()
    page.set_default_timeout(300_000)
    page.goto(url)
    fresh = read(page)
    page.reload()
    reloaded = read(page)
    context.close()
    return fresh, reloaded


def type_sentence(page, text: str) -> None:
    """Open the Attention page through the sidebar, type ``text`` as its sentence; wait until the link has one."""
    nav(page, "Attention").click()
    page.get_by_text("type one").first.click()
    box = page.get_by_label("Your sentence")
    box.fill(text)
    box.press("Enter")
    page.wait_for_function("() => location.search.includes('sentence=')")


def attention_view(page) -> dict:
    """What the Attention page shows of the view: the typed sentence, the page, the selected head."""
    page.get_by_label("Your sentence").wait_for()
    wait_idle(page)
    return {"sentence": page.get_by_label("Your sentence").input_value(),
            "title": page.locator("h1").first.inner_text(), "head": query(page).get("head")}


def criteria_view(page) -> dict:
    """What the Head scores page shows of the view: the criteria chips, the page."""
    page.locator('[data-testid="stMultiSelect"]').first.wait_for()
    wait_idle(page)
    chips = page.locator('[data-testid="stMultiSelect"]').first.locator("[data-tag]")   # each chip's label is its name
    return {"criteria": [chips.nth(i).get_attribute("aria-label") for i in range(chips.count())],
            "title": page.locator("h1").first.inner_text()}


def test_every_change_reaches_the_link_and_the_link_opens_it(server, browser):  # noqa: F811
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo&data=demo&page=prune")
    prune_view(page)
    # a grid click prunes and selects a head that is not the dropdown's first entry; the link follows at once
    click_grid(page, 20)
    page.wait_for_function("() => document.body.innerText.includes('71 / 72')")
    page.wait_for_function("() => location.search.includes('head=')")
    clicked = query(page)["head"]
    assert query(page)["mask"] == clicked and clicked != "0.0"
    # Prune / restore acts on the outlined head: it restores it, and a second press prunes it again
    wait_idle(page)
    page.get_by_role("button", name="Prune / restore").click()
    page.wait_for_function("() => document.body.innerText.includes('72 / 72')")
    wait_idle(page)
    assert "mask" not in query(page) and query(page)["head"] == clicked
    page.get_by_role("button", name="Prune / restore").click()
    page.wait_for_function("() => document.body.innerText.includes('71 / 72')")
    wait_idle(page)
    assert query(page)["mask"] == clicked
    layer, head = clicked.split(".")
    # the ratio slider: one step right (25% -> 30%)
    page.locator('[data-testid="stSlider"] input[type="range"]').first.focus()
    page.keyboard.press("ArrowRight")
    page.wait_for_function("() => location.search.includes('ratio=0.3')")
    here = prune_view(page)
    assert here["head"].startswith(f"layer {layer} · head {head}") and here["ratio"] == "30", here
    fresh, reloaded = opened_elsewhere(browser, page.url, prune_view)
    assert fresh == here and reloaded == here, (here, fresh, reloaded)

    # a typed sentence on the Attention page
    type_sentence(page, "The cat sat on the mat.")
    wait_idle(page)
    assert query(page)["sentence"] == "The cat sat on the mat." and query(page)["page"] == "attention"

    here = attention_view(page)
    fresh, reloaded = opened_elsewhere(browser, page.url, attention_view)
    assert fresh == here == reloaded and here["head"] == clicked, (here, fresh, reloaded)
    page.close()


def test_the_worst_hand_edited_link_opens_the_nearest_view_with_one_notice(server, browser):  # noqa: F811
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    junk = "x" * 10_000
    page.goto(f"{server}/?model=/etc/passwd&data=demo&page=nowhere&mask=0.1,9.99&head=99.1&ratio=7&junk={junk}")
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    notice = page.locator('[data-testid="stAlert"]', has_text="This link named").all_inner_texts()
    assert len(notice) == 1, notice
    for dropped in ("model='/etc/passwd'", "page='nowhere'", "mask='0.1,9.99'", "head='99.1'", "ratio='7'",
                    "unknown key"):
        assert dropped in notice[0], dropped
    assert page.locator('[data-testid="stException"]').count() == 0
    assert "Traceback" not in page.inner_text("body")
    assert re.search(r"72 / 72", page.inner_text("body"))          # nothing pruned: the bad mask was dropped
    assert "model" not in query(page) or query(page)["model"] == "demo"
    page.close()


def test_a_grid_click_on_the_circuit_demo_reaches_the_link_and_the_link_opens_it(server, browser):  # noqa: F811
    """demo-circuit (a language model: the headline is perplexity): the link of a grid click opens the same heads
    left, the same exact perplexity and the same selected head, in a fresh context and after F5."""
    page, dense, clicked = open_and_click(browser, f"{server}/?model=demo-circuit&data=demo-circuit&page=prune", 10, 24)
    assert clicked != "0.0"
    layer, head = clicked.split(".")
    here = prune_view(page, "perplexity")
    assert here["left"] == "23 / 24" and here["perplexity"] != dense["perplexity"], (dense, here)
    assert here["head"].startswith(f"layer {layer} · head {head}"), here
    fresh, reloaded = opened_elsewhere(browser, page.url, lambda p: prune_view(p, "perplexity"))
    assert fresh == here and reloaded == here, (here, fresh, reloaded)
    page.close()


def test_prune_restore_acts_on_the_clicked_cell_of_the_lm_demo(server, browser):  # noqa: F811
    """demo-lm: click a grid cell that is not the Head dropdown's current head; Prune / restore then toggles that
    cell (the outlined head), not the dropdown's former choice."""
    page, before, clicked = open_and_click(browser, f"{server}/?model=demo-lm&data=demo-lm&page=prune", 27, 48)
    layer, head = clicked.split(".")
    name = f"layer {layer} · head {head}"
    assert not before["head"].startswith(name), (before, clicked)   # the click moved the selection
    wait_idle(page)
    page.get_by_role("button", name="Prune / restore").click()     # restores the clicked head
    page.wait_for_function("() => document.body.innerText.includes('48 / 48')")
    wait_idle(page)
    assert "mask" not in query(page) and query(page)["head"] == clicked
    restored = prune_view(page, "perplexity")
    assert restored["head"].startswith(name) and "pruned" not in restored["head"], restored
    assert restored["perplexity"] == before["perplexity"], (before, restored)   # back to the dense model
    page.get_by_role("button", name="Prune / restore").click()     # and prunes it again
    page.wait_for_function("() => document.body.innerText.includes('47 / 48')")
    wait_idle(page)
    assert query(page)["mask"] == clicked and query(page)["head"] == clicked
    pruned = prune_view(page, "perplexity")
    assert pruned["head"] == f"{name} — pruned", pruned
    page.close()


def test_ratio_criteria_and_sentence_on_the_circuit_demo_reach_the_link_and_the_link_opens_them(server, browser):  # noqa: F811
    """demo-circuit, the kinds of change other than a grid click (issue 35, "Done when"): the ratio slider on Prune,
    the criteria shown on Head scores (with the page), a typed sentence on Attention. After each, the address bar's
    URL opened in a new browser context, and F5, show the same state."""
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo-circuit&data=demo-circuit&page=prune")
    before = prune_view(page, "perplexity")
    slider = page.locator('[data-testid="stSlider"] input[type="range"]').first
    slider.focus()
    page.keyboard.press("ArrowRight")                     # one step of 5 %
    moved = f"{(int(before['ratio']) + 5) / 100:g}"
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('ratio') === '{moved}'")
    here = prune_view(page, "perplexity")
    assert here["ratio"] == str(int(before["ratio"]) + 5) and here["left"] == "24 / 24", (before, here)
    fresh, reloaded = opened_elsewhere(browser, page.url, lambda p: prune_view(p, "perplexity"))
    assert fresh == here == reloaded, (here, fresh, reloaded)

    # the criteria shown: drop the last chip of Head scores' picker (Backspace in its empty input)
    nav(page, "Head scores").click()
    shown = criteria_view(page)
    assert shown["title"] == "Head scores" and len(shown["criteria"]) >= 2, shown
    page.locator('[data-testid="stMultiSelect"] input').first.click()
    page.keyboard.press("Backspace")
    page.keyboard.press("Escape")
    kept = ",".join(shown["criteria"][:-1])
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('criteria') === '{kept}'")
    here = criteria_view(page)
    assert here["criteria"] == shown["criteria"][:-1] and query(page)["page"] == "head-scores", here
    fresh, reloaded = opened_elsewhere(browser, page.url, criteria_view)
    assert fresh == here == reloaded, (here, fresh, reloaded)

    # a typed sentence on Attention
    type_sentence(page, "red fox blue sky red fox blue sky")
    here = attention_view(page)
    assert here["sentence"] == "red fox blue sky red fox blue sky" and query(page)["page"] == "attention", here
    fresh, reloaded = opened_elsewhere(browser, page.url, attention_view)
    assert fresh == here == reloaded, (here, fresh, reloaded)
    page.close()


def kv_view(page) -> dict:
    """What the KV cache page shows of the view: the plan's bytes and metric, its F/S grid letters."""
    page.get_by_text("KV bytes under the plan").first.wait_for()
    wait_idle(page)
    letters = ("() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(p => p.data)"
               ".filter(t => t.type === 'scatter' && t.text).map(t => Array.from(t.text).join(''))")
    return {"bytes": metric_value(page, "KV bytes under the plan"),
            "metric": metric_value(page, "perplexity under the plan"), "grid": page.evaluate(letters),
            "title": page.locator("h1").first.inner_text()}


def test_a_kv_plan_click_reaches_the_link_and_the_link_opens_it(server, browser):  # noqa: F811
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo-lm&data=demo-lm&page=kv-cache")
    before = kv_view(page)
    click_grid(page, 0)    # a click selects the key/value head; "Switch full / streaming" switches it (issue 45 item 8)
    switch = page.get_by_role("button", name="Switch full / streaming")
    page.wait_for_function("() => [...document.querySelectorAll('button')].some(b => "
                           "b.innerText.includes('Switch full / streaming') && !b.disabled)")
    switch.click()
    page.wait_for_function(f"() => !document.body.innerText.includes('{before['bytes']}')")
    page.wait_for_function("() => location.search.includes('kv=')")
    here = kv_view(page)
    assert here["bytes"] != before["bytes"] and here["grid"] != before["grid"], (before, here)
    fresh, reloaded = opened_elsewhere(browser, page.url, kv_view)
    assert fresh == here == reloaded, (here, fresh, reloaded)
    page.close()
