"""Phones and small laptops as first-class (issue 45 items 5-6), in a real browser: one Streamlit server and one
Chromium for the module (tests/test_browser.py's fixtures).

* a phone (390 x 844, touch, mobile): one tap on a Prune grid cell prunes that head (the first tap used to show only
  its tooltip); the metric row, the grid, the atlas of every head and the token strip all lie within the screen's
  width; a tap on a thumbnail of the atlas opens its head;
* a small laptop (1280 x 720): the Prune page's metric row and its grid are on screen together; the navigation
  shows every page under its section, none folded; the share link opens at the app's root, and loading it asks
  nothing the server answers with an error (a page's own path made Streamlit probe ``/<page>/_stcore/health``).

Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from test_browser import browser, metric_value, server, wait_idle  # noqa: F401 - module fixtures shared

PHONE = {"viewport": {"width": 390, "height": 844}, "has_touch": True, "is_mobile": True}
LAPTOP = {"width": 1280, "height": 720}

# the boxes of what a reader must see whole: the metric boxes and every Plotly figure
BOXES = """selector => [...document.querySelectorAll(selector)].map(e => {
  const b = e.getBoundingClientRect();
  return {left: b.left, top: b.top, right: b.right, bottom: b.bottom};
})"""


def boxes(page, selector: str) -> list[dict]:
    return page.evaluate(BOXES, selector)


def inside(box: dict, width: float, height: float | None = None) -> bool:
    """Whether ``box`` lies within the screen (a pixel of rounding allowed)."""
    return (box["left"] >= -1 and box["right"] <= width + 1
            and (height is None or (box["top"] >= -1 and box["bottom"] <= height + 1)))


def open_view(page, url: str) -> None:
    """Open ``url`` and wait until its model is loaded and the page has settled."""
    page.goto(url)
    page.wait_for_function("() => document.body.textContent.includes('heads left') "
                           "&& !document.body.textContent.includes('Loading model')")
    wait_idle(page)


def tap_centre(page, locator) -> None:
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    assert inside(box, PHONE["viewport"]["width"], PHONE["viewport"]["height"]), box
    page.touchscreen.tap(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def test_on_a_phone_one_tap_prunes_a_head_and_every_view_fits_the_screen(server, browser):  # noqa: F811
    context = browser.new_context(**PHONE)
    page = context.new_page()
    page.set_default_timeout(300_000)
    width = PHONE["viewport"]["width"]

    open_view(page, f"{server}/?model=demo&data=demo&page=prune")
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")   # the exact value is in
    wait_idle(page)
    assert metric_value(page, "heads left") == "72 / 72"
    shown = boxes(page, '[data-testid="stMetric"]') + boxes(page, ".js-plotly-plot")
    assert len(shown) >= 5 and all(inside(b, width) for b in shown), shown
    tap_centre(page, page.locator(".js-plotly-plot .scatterlayer .point").nth(5))   # layer 0 · head 5
    page.wait_for_function("() => document.body.innerText.includes('71 / 72')", timeout=120_000)
    page.wait_for_function("() => new URLSearchParams(location.search).get('mask') === '0.5'")

    # every head at a glance: the whole atlas on the screen, a tap on a thumbnail opens its head
    open_view(page, f"{server}/?model=demo&data=demo&page=heads")
    thumbnails = page.locator("button[data-head]")
    thumbnails.first.wait_for()
    assert thumbnails.count() == 72
    corner = page.locator('button[data-head="5.11"]')            # the last layer's last head
    corner.scroll_into_view_if_needed()
    box = corner.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width + 1, box
    tap_centre(page, page.locator('button[data-head="2.11"]'))
    page.get_by_role("heading", name="layer 2 · head 11").wait_for(timeout=120_000)

    # the token strip of what the pruned model says wraps inside the screen
    open_view(page, f"{server}/?model=demo-lm&data=demo-lm&page=example")
    page.locator("span[data-pos]").first.wait_for()
    tokens = boxes(page, "span[data-pos]")
    assert len(tokens) > 10 and all(inside(b, width) for b in tokens), max(b["right"] for b in tokens)
    assert len({round(b["top"]) for b in tokens}) > 1                       # on several lines
    context.close()


def test_on_a_small_laptop_the_metric_row_and_the_grid_share_the_screen_and_nothing_is_folded(server,  # noqa: F811
                                                                                              browser):  # noqa: F811
    from dashboard.ui import PAGES, SECTIONS

    page = browser.new_page(viewport=LAPTOP)
    page.set_default_timeout(300_000)
    open_view(page, f"{server}/?model=demo&data=demo&page=prune")
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")
    wait_idle(page)
    metrics, grids = boxes(page, '[data-testid="stMetric"]'), boxes(page, ".js-plotly-plot")
    assert len(metrics) == 4 and grids, (metrics, grids)
    assert all(inside(b, LAPTOP["width"], LAPTOP["height"]) for b in metrics + grids[:1]), (metrics, grids[:1])

    nav = page.locator('[data-testid="stSidebarNav"]')
    assert nav.locator('[data-testid="stSidebarNavViewButton"]').count() == 0        # no "View N more"
    text = nav.inner_text()
    assert all(section in text for section in SECTIONS), text
    for _, title, _, url in PAGES:
        assert nav.locator(f'a[href$="/{url}"]').first.is_visible(), title

    # the share link names its page in the query at the app's root; opened, nothing answers with an error
    link = page.locator('[data-testid="stSidebar"] [data-testid="stCode"]').first.inner_text().strip()
    assert urlsplit(link).path == "/" and "page=prune" in link, link
    fresh = browser.new_page(viewport=LAPTOP)
    fresh.set_default_timeout(300_000)
    failed = []
    fresh.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    open_view(fresh, link)
    fresh.get_by_role("heading", name="Prune").wait_for()
    assert not failed, failed
    fresh.close()
    page.close()
