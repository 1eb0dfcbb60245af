"""Phones and small laptops as first-class (issue 45 items 5-6), in a real browser: one Streamlit server and one
Chromium for the module (tests/test_browser.py's fixtures).

* a phone (390 x 844, touch, mobile): one tap on a Prune grid cell prunes that head (the first tap used to show only
  its tooltip); the metric row, the grid and the atlas of every head lie within the screen's width; a tap on a
  thumbnail of the atlas opens its head; the token strip of what the pruned model says wraps within it;
* a small laptop (1280 x 720): the Prune page's metric row and its grid are on screen together; the navigation
  shows every page under its section, none folded; the share link is at the app's root, and loading such a link
  asks nothing the server answers with an error (a page's own path made Streamlit probe
  ``/<page>/_stcore/health``).

Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing.
"""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import numpy as np
from test_browser import metric_value, wait_idle

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


def box_of(locator) -> dict:
    """A locator's box (scrolled into view) with the edges ``inside`` reads."""
    locator.scroll_into_view_if_needed()
    box = locator.bounding_box()
    return {"left": box["x"], "top": box["y"], "right": box["x"] + box["width"], "bottom": box["y"] + box["height"]}


def tap_centre(page, locator) -> None:
    """One tap (a touch, no mouse) on the middle of ``locator``, which must lie on the screen."""
    box = box_of(locator)
    assert inside(box, PHONE["viewport"]["width"], PHONE["viewport"]["height"]), box
    page.touchscreen.tap((box["left"] + box["right"]) / 2, (box["top"] + box["bottom"]) / 2)


def test_on_a_phone_one_tap_prunes_a_head_and_every_view_fits_the_screen(server, browser):  # noqa: F811
    context = browser.new_context(**PHONE)
    page = context.new_page()
    page.set_default_timeout(300_000)
    width = PHONE["viewport"]["width"]
    start = time.perf_counter()

    open_view(page, f"{server}/?model=demo&data=demo&page=prune")
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")   # the exact value is in
    wait_idle(page)
    assert metric_value(page, "heads left") == "72 / 72"
    shown = boxes(page, '[data-testid="stMetric"]') + boxes(page, ".js-plotly-plot")
    assert len(shown) >= 5 and all(inside(b, width) for b in shown), shown
    tap_centre(page, page.locator(".js-plotly-plot .scatterlayer .point").nth(5))   # layer 0 · head 5
    page.wait_for_function("() => document.body.innerText.includes('71 / 72')", timeout=120_000)
    page.wait_for_function("() => new URLSearchParams(location.search).get('mask') === '0.5'")
    print(f"phone, Prune: opened, checked and one tap acted in {time.perf_counter() - start:.1f} s")
    start = time.perf_counter()

    # every head at a glance: the whole atlas on the screen, a tap on a thumbnail opens its head
    open_view(page, f"{server}/?model=demo&data=demo&page=heads")
    thumbnails = page.locator("button[data-head]")
    thumbnails.first.wait_for()
    assert thumbnails.count() == 72
    assert inside(box_of(page.locator('button[data-head="5.11"]')), width)    # the last layer's last head
    tap_centre(page, page.locator('button[data-head="2.11"]'))
    page.get_by_role("heading", name="layer 2 · head 11").wait_for(timeout=120_000)

    context.close()


def test_on_a_phone_the_token_strip_wraps_inside_the_screen(browser):  # noqa: F811
    """What the pruned model says: the strip of tokens coloured by their loss change (``views.loss_change_html``,
    as the page hands it to st.html) on a phone's width. A token's leading space is a no-break space, so the strip
    had no break at all: 1,465 px wide in a 940 px column. Drawn by Chromium on its own (no server needed)."""
    from headprune.views import loss_change_html

    words = ["<bos>"] + [f" {w}" for w in ("Too much of this well-acted but dangerously slow thriller feels like a "
                                           "preamble to a bigger, more complicated story, one that never "
                                           "materializes.").split()] + [" supercalifragilisticexpialidocious" * 2]
    losses = np.linspace(1.0, 3.0, len(words))
    context = browser.new_context(**PHONE)
    page = context.new_page()
    strip = loss_change_html(words, losses, losses[::-1], np.ones(len(words), bool))
    # the device's width, as Streamlit's own page says (without it a mobile browser lays out 980 px)
    page.set_content(f"<meta name='viewport' content='width=device-width'><body style='margin:12px'>{strip}</body>")
    tokens = boxes(page, "span[data-pos]")
    assert len(tokens) == len(words) and all(inside(b, PHONE["viewport"]["width"]) for b in tokens), tokens
    assert len({round(b["top"]) for b in tokens}) > 3                       # on several lines
    context.close()


def test_on_a_small_laptop_the_metric_row_and_the_grid_share_the_screen_and_nothing_is_folded(server,  # noqa: F811
                                                                                              browser):  # noqa: F811
    from dashboard.ui import PAGES, SECTIONS

    page = browser.new_page(viewport=LAPTOP)
    page.set_default_timeout(300_000)
    failed = []
    page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    open_view(page, f"{server}/?model=demo&data=demo&page=prune")     # a link as the app writes them
    page.wait_for_function("() => document.body.innerText.includes('vs dense')")
    wait_idle(page)
    metrics, grids = boxes(page, '[data-testid="stMetric"]'), boxes(page, ".js-plotly-plot")
    assert len(metrics) == 4 and grids, (metrics, grids)
    assert all(inside(b, LAPTOP["width"], LAPTOP["height"]) for b in metrics + grids[:1]), (metrics, grids[:1])
    print(f"1280 x 720, Prune: metric row {min(b['top'] for b in metrics):.0f}-{max(b['bottom'] for b in metrics):.0f}"
          f" px, grid {grids[0]['top']:.0f}-{grids[0]['bottom']:.0f} px")

    nav = page.locator('[data-testid="stSidebarNav"]')
    assert nav.locator('[data-testid="stSidebarNavViewButton"]').count() == 0        # no "View N more"
    text = nav.inner_text()
    assert all(section in text for section in SECTIONS), text
    for _, title, _, url in PAGES:
        assert nav.locator(f'a[href$="/{url}"]').first.is_visible(), title

    # the share link names its page in the query at the app's root, as the link opened above did; opening that,
    # nothing was answered with an error (a page's own path made the browser ask /prune/_stcore/health: 404)
    link = page.locator('[data-testid="stSidebar"] [data-testid="stCode"]').first.inner_text().strip()
    assert urlsplit(link).path == "/" and "page=prune" in link, link
    assert not failed, failed
    page.close()
