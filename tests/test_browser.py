"""The dashboard in a real browser: `streamlit run app.py` driven by headless Chromium through Playwright.

Loads the demo, computes head-score heatmaps, prunes a head by clicking its cell on the Prune page's grid and
checks that the numbers change; screenshots go under the test's tmp_path (and, when HEADPRUNE_SCREENSHOT names a
file, the Prune view is also saved there -- that is how assets/dashboard.png is made).
The server and the browser are tests/conftest.py's, one of each for every browser test module. Skipped, with the
reason printed, when /usr/bin/chromium or Playwright is missing.
"""

from __future__ import annotations

import os
import re
import time

import pytest
from app_support import benchmark


def _bench_browser():
    """benchmarks/bench_browser.py, whose ``streamlit_server`` starts the shared server (tests/conftest.py)."""
    return benchmark("bench_browser")


def metric_value(page, label: str) -> str:
    """The value of the st.metric whose label is ``label``."""
    box = page.locator('[data-testid="stMetric"]', has=page.get_by_text(label, exact=True)).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


def nav(page, title: str):
    """The sidebar's navigation link of the page called ``title`` (``bench_browser.nav``)."""
    return _bench_browser().nav(page, title)


def wait_idle(page, timeout: float = 300_000) -> None:
    """Wait until Streamlit finished the current run (no stale element, no running script) and plotly drew."""
    _bench_browser().wait_settled(page, timeout)


def score_heatmaps(page) -> None:
    """Head scores page: compute the default criteria and wait until plotly drew the heatmaps, the correlation
    matrix and the overlap grid (it draws after the run ends)."""
    page.get_by_role("button", name="Compute scores").click()
    page.get_by_text("Do the criteria agree?").wait_for()
    wait_idle(page)
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length >= 5", timeout=60_000)


def open_prune_and_click_first_cell(page, n_heads: int, metric: str) -> tuple[str, float]:
    """Prune page: check that all ``n_heads`` are left, click the cell of layer 0, head 0 on the mask grid (its
    transparent click marker), wait for the count to drop by one. Returns the metric before and the seconds from
    the click until the new count is shown."""
    nav(page, "Prune").click()
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    assert metric_value(page, "heads left") == f"{n_heads} / {n_heads}"
    before = metric_value(page, metric)
    page.wait_for_function("() => document.querySelector('.js-plotly-plot .scatterlayer .point')", timeout=60_000)
    box = page.locator(".js-plotly-plot .scatterlayer .point").first.bounding_box()
    start = time.perf_counter()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_function(f"() => document.body.innerText.includes('{n_heads - 1} / {n_heads}')")
    return before, time.perf_counter() - start


def test_demo_heatmap_then_prune_by_clicking(server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.set_default_timeout(300_000)

    page.goto(server)
    page.get_by_text("dense accuracy").first.wait_for()
    wait_idle(page)
    dense = float(metric_value(page, "dense accuracy"))
    assert 0.6 < dense <= 1.0
    page.screenshot(path=str(tmp_path / "1-home.png"), full_page=True)

    page.goto(f"{server}/head-scores")
    score_heatmaps(page)
    page.screenshot(path=str(tmp_path / "2-head-scores.png"), full_page=True)

    before, _ = open_prune_and_click_first_cell(page, 72, "accuracy")
    wait_idle(page)
    caption = page.get_by_text(re.compile("Last change: toggled layer 0 · head 0")).inner_text()
    assert "Loss" in caption
    page.screenshot(path=str(tmp_path / "3-prune-one.png"), full_page=True)

    # and a bigger change: prune the lowest half by the default criterion; the metric moves off the dense value
    page.get_by_role("button", name="Apply").click()
    page.wait_for_function("() => document.body.innerText.includes('54 / 72')")
    wait_idle(page)
    after = metric_value(page, "accuracy")
    assert after != before or metric_value(page, "accuracy") != f"{dense:.4f}"
    page.screenshot(path=str(tmp_path / "4-prune-quarter.png"), full_page=True)
    if os.environ.get("HEADPRUNE_SCREENSHOT"):
        page.screenshot(path=os.environ["HEADPRUNE_SCREENSHOT"], full_page=False)
    print(f"screenshots in {tmp_path}: accuracy dense {dense:.4f}, one head {before}, 25% pruned {after}")


def test_lm_demo_picked_scored_and_a_click_moves_perplexity(server, browser, tmp_path):
    """The decoder demo in the browser: pick it on Model & data, draw its heatmaps (key/value-group borders), click
    a head on the Prune page and see the perplexity change."""
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(server)   # a deep link to a page opens with a "page not found" dialog before the pages register
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    nav(page, "Model & data").click()
    page.get_by_text("Demo language model", exact=False).first.click()
    wait_idle(page)
    page.get_by_role("button", name="Load", exact=True).click()
    page.wait_for_function("() => document.body.innerText.includes('demo-lm · 6-layer Llama')")
    wait_idle(page)

    nav(page, "Head scores").click()
    score_heatmaps(page)
    # one thick line between the two key/value groups of every grid (three heatmaps and the overlap grid)
    n_borders = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].map(p => (p.layout.shapes"
                              " || []).filter(s => s.name === 'key/value group border').length)")
    assert sorted(n_borders)[-4:] == [1, 1, 1, 1]
    page.screenshot(path=str(tmp_path / "lm-head-scores.png"), full_page=True)

    before, to_count = open_prune_and_click_first_cell(page, 48, "perplexity")
    start = time.perf_counter()
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")  # the exact value, not an estimate
    seconds = to_count + time.perf_counter() - start
    wait_idle(page)
    after = metric_value(page, "perplexity")
    page.screenshot(path=str(tmp_path / "lm-prune-one.png"), full_page=True)
    print(f"LM demo: perplexity dense {before}, layer 0 head 0 pruned {after}; click -> exact number {seconds:.2f} s")
    assert float(after) != float(before)


@pytest.mark.parametrize("model", ["demo", "demo-lm", "demo-circuit"])
def test_roles_view_from_a_link(server, browser, tmp_path, model):
    """A link opens the Roles page on each demo; "Find head roles" draws the label grid (time printed)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model={model}&data={model}&page=roles")
    page.get_by_role("button", name="Find head roles").or_(page.get_by_text("Labels", exact=True)).first.wait_for()
    start = time.perf_counter()
    if page.get_by_role("button", name="Find head roles").count():
        page.get_by_role("button", name="Find head roles").click()
    page.get_by_text("Labels", exact=True).wait_for()
    wait_idle(page)
    print(f"roles on {model}: {time.perf_counter() - start:.1f} s from the click to the label grid")
    assert "previous-token" in page.inner_text("body")
    page.screenshot(path=str(tmp_path / f"roles-{model}.png"), full_page=True)
    page.close()


def test_a_link_with_a_mask_opens_prune_with_it(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo&data=demo&page=prune&mask=0.0,0.1")
    page.wait_for_function("() => document.body.innerText.includes('70 / 72')")
    # the address bar keeps the mask, in its compact form (heads 0-1 of layer 0); the page writes it on its run,
    # which may land just after the count is drawn
    page.wait_for_function("() => location.search.includes('mask=')", timeout=60_000)
    assert "mask=0.0-1" in page.url
    page.close()


def test_cancel_stops_a_running_score_and_stores_nothing(server, browser):
    """Issue 35, a Cancel click in the browser: score ae (the earlier result), then add HIES (α chosen by a sweep:
    long enough to catch) and KL and press Compute; the bar moves; press Cancel: the page says the run was
    cancelled, Cancel is gone and Compute scores is back, and the earlier ae heatmap stays (nothing new stored)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo&data=demo&page=head-scores&criteria=ae")
    page.get_by_role("button", name="Compute scores").wait_for()
    wait_idle(page)
    page.get_by_role("button", name="Compute scores").click()
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot').length > 0", timeout=300_000)
    wait_idle(page)
    earlier = page.locator(".js-plotly-plot").count()
    picker = page.locator('[data-testid="stMultiSelect"] input').first
    for name in ("hies", "kl"):
        picker.click()
        page.keyboard.type(name)
        page.keyboard.press("Enter")
        wait_idle(page)
    page.keyboard.press("Escape")
    page.wait_for_function("() => new URLSearchParams(location.search).get('criteria') === 'ae,hies,kl'")
    wait_idle(page)
    page.get_by_role("button", name="Compute scores").click()
    page.get_by_text(re.compile("scoring ae, hies, kl on")).first.wait_for()
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stProgress\"] [role=\"progressbar\"]')]"
                           ".some(b => Number(b.getAttribute('aria-valuenow')) > 0)")      # the bar moves
    start = time.perf_counter()
    page.get_by_role("button", name="Cancel").click()
    page.get_by_text(re.compile("Cancelled: the run stopped")).wait_for()
    print(f"cancel: {time.perf_counter() - start:.2f} s from the click to the note")
    wait_idle(page)
    assert page.get_by_role("button", name="Compute scores").count() == 1      # the button is back
    assert page.get_by_role("button", name="Cancel").count() == 0
    assert page.locator('[data-testid="stProgress"]').count() == 0
    assert page.locator(".js-plotly-plot").count() == earlier                 # the ae result stays, nothing added
    page.close()


def test_kv_cache_page_a_click_moves_the_bytes_bar_and_the_metric(server, browser, tmp_path):
    """KV cache page on demo-lm from a link: click a key/value head on the plan grid (it selects it, as a click does
    on the other pages' grids: issue 45) and switch it; the bytes bar and the perplexity under the plan both
    change."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.set_default_timeout(300_000)
    page.goto(f"{server}/?model=demo-lm&data=demo-lm&page=kv-cache")
    scored = page.get_by_text("KV bytes under the plan").first
    scoring = page.get_by_role("button", name="Score the key/value heads by razor")
    scored.or_(scoring).wait_for()          # razor's scores start at once unless a busy server makes them slow
    if not scored.is_visible():
        scoring.click()
    scored.wait_for()
    wait_idle(page)
    bars = ("() => [...document.querySelectorAll('.js-plotly-plot')].flatMap(p => p.data)"
            ".filter(t => t.type === 'bar').map(t => Array.from(t.y).join(','))")
    before = (metric_value(page, "perplexity under the plan"), metric_value(page, "KV bytes under the plan"),
              page.evaluate(bars))
    page.wait_for_function("() => document.querySelector('.js-plotly-plot .scatterlayer .point')", timeout=60_000)
    box = page.locator(".js-plotly-plot .scatterlayer .point").first.bounding_box()
    start = time.perf_counter()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    head = page.locator('[data-testid="stSelectbox"] input[aria-label="Key/value head"]')
    page.wait_for_function("() => document.querySelector('[data-testid=\"stSelectbox\"] "
                           "input[aria-label=\"Key/value head\"]').value.startsWith('layer 0 · key/value head 0')")
    assert metric_value(page, "KV bytes under the plan") == before[1]           # selected, not switched
    page.get_by_role("button", name="Switch full / streaming").click()
    page.wait_for_function(f"() => !document.body.innerText.includes('{before[1]}')")
    wait_idle(page)
    assert head.input_value().startswith("layer 0 · key/value head 0")
    after = (metric_value(page, "perplexity under the plan"), metric_value(page, "KV bytes under the plan"),
             page.evaluate(bars))
    page.screenshot(path=str(tmp_path / "kv-cache.png"), full_page=True)
    print(f"KV page: {before[:2]} -> {after[:2]} in {time.perf_counter() - start:.1f} s")
    assert after[1] != before[1] and after[2] != before[2] and float(after[0]) != float(before[0])
    page.close()


WALK_DEMOS = ("demo", "demo-lm", "demo-circuit")


@pytest.mark.parametrize("model", WALK_DEMOS)
def test_every_page_asks_only_the_app_itself(server, browser, model):
    """Offline for real (issue 35, item 7): open the demo from a link, then every page through the sidebar in one
    session (nothing is computed on the way), recording every request the browser makes (favicons, fonts,
    scripts, images): all go to the app's own origin (a data: URI, e.g. the emoji favicon, asks no host)."""
    from urllib.parse import urlsplit

    from dashboard.ui import PAGES

    origin = urlsplit(server).netloc
    elsewhere: list[str] = []
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(300_000)
    page.on("request", lambda request: None if urlsplit(request.url).scheme in ("data", "blob")
            or urlsplit(request.url).netloc == origin else elsewhere.append(request.url))
    page.goto(f"{server}/?model={model}&data={model}")
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    nav = page.locator('[data-testid="stSidebarNav"]')
    more = nav.locator('[data-testid="stSidebarNavViewButton"]')   # past ten pages the list folds: "View N more"
    if more.count() and more.inner_text().endswith("more"):
        more.click()
    for _, title, _, url in PAGES:
        start = time.perf_counter()
        nav.locator(f'a[href$="/{url}"]').first.click()
        page.wait_for_function("title => document.title.startsWith(title)", arg=title)
        wait_idle(page)
        print(f"{model} {title}: {time.perf_counter() - start:.1f} s")
    assert page.locator('[data-testid="stException"]').count() == 0
    page.close()
    assert not elsewhere, f"{len(elsewhere)} requests left the app on {model}: {sorted(set(elsewhere))[:5]}"
