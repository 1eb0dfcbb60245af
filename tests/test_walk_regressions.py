"""What the random walks found (issue 45), each a small test in a real browser on the shared server
(tests/conftest.py): the sidebar's link after a fragment's rerun, a job stopped by another click, a link Streamlit
would drop whole. The walk itself is tests/test_walk.py; the engine benchmarks/walk.py.

Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing."""

from __future__ import annotations

from app_support import benchmark
from test_browser import wait_idle

VIEW = {"width": 1400, "height": 1000}


def open_page(browser, url: str):
    page = browser.new_page(viewport=VIEW)
    page.set_default_timeout(300_000)
    page.goto(url)
    page.wait_for_function("() => document.body.innerText.includes('heads left')")
    wait_idle(page)
    return page


def assert_the_sidebar_names_the_address(page) -> dict:
    """No exception box; the sidebar's link is the address bar and its QR code encodes it (ui.qr_data_uri)."""
    from dashboard.ui import qr_data_uri

    view = page.evaluate(benchmark("walk").READ_VIEW)
    assert view["exceptions"] == 0 and not view["errors"], view["errors"]
    assert benchmark("walk").link_names_address(view["link"], view["url"]), (view["link"], view["url"])
    assert view["qr"] == qr_data_uri(view["link"])
    return view


def click_head(page, layer: int, head: int, n_heads: int) -> None:
    before = page.url
    benchmark("bench_browser").click_cell(page, layer, head, n_heads)
    page.wait_for_function("u => location.href !== u", arg=before)
    page.wait_for_function(f"() => new URLSearchParams(location.search).get('head') === '{layer}.{head}'")
    wait_idle(page)


def test_a_grid_click_after_apply_keeps_the_sidebars_link_on_the_mask(server, browser):
    """Issue 45 item 1: Prune -> Apply, then a grid click raised "A fragment tried to write to a container created
    outside it" and left the sidebar's link and QR code on the earlier mask. Now the link follows: the click's head
    joins the mask Apply made."""
    page = open_page(browser, f"{server}/?model=demo-circuit&data=demo-circuit&page=prune")
    page.get_by_role("button", name="Apply").click()
    page.wait_for_function("() => new URLSearchParams(location.search).has('mask')")
    wait_idle(page)
    applied = assert_the_sidebar_names_the_address(page)
    click_head(page, 2, 7, 8)
    clicked = assert_the_sidebar_names_the_address(page)
    assert applied["left"][0] - clicked["left"][0] in (1, -1), (applied["left"], clicked["left"])
    page.close()


def test_a_head_click_after_find_head_roles_keeps_the_sidebars_link(server, browser):
    """Issue 45 item 1, the Roles page: "Find head roles", then a head click on the label grid."""
    page = open_page(browser, f"{server}/?model=demo-circuit&data=demo-circuit&page=roles")
    find = page.get_by_role("button", name="Find head roles")
    if find.count():                       # another test may have found them already (the shared server's store)
        find.click()
    page.get_by_text("Labels", exact=True).wait_for()
    wait_idle(page)
    assert_the_sidebar_names_the_address(page)
    click_head(page, 1, 3, 8)
    view = assert_the_sidebar_names_the_address(page)
    assert any(h.startswith("layer 1 · head 3") for h in view["h3"]), view["h3"]
    page.close()


def test_a_grid_click_during_apply_is_queued_not_lost(server, browser):
    """Issue 45, "Bad input": an action during a running job is queued or refused with a message, never lost. A
    grid click while Apply scores the heads by KL is a rerun of the same fragment, which Streamlit queues behind the
    running one: Apply's half of the heads is pruned, then the click toggles its head, and the link says both."""
    page = open_page(browser, f"{server}/?model=demo-circuit&data=demo-circuit&page=prune&criterion=kl&ratio=0.5")
    page.get_by_role("button", name="Apply").click()
    click_head(page, 0, 5, 8)
    page.get_by_text("Last change: toggled layer 0 · head 5").first.wait_for()
    view = assert_the_sidebar_names_the_address(page)
    assert view["left"] in ([11, 24], [13, 24]), view["left"]        # 12 pruned by Apply, then one toggled
    page.close()


def test_a_change_during_a_long_job_stops_it_and_says_so(server, browser):
    """The other case: a change outside the job's fragment (here the criteria, while "Compute scores" runs KL) is a
    new run of the page, which ends the running one. The job is not silently lost: the page says that it stopped
    and stored nothing, and its button is back."""
    page = open_page(browser, f"{server}/?model=demo&data=demo&page=head-scores&criteria=kl")
    page.get_by_role("button", name="Compute scores").click()
    page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stProgress\"]')].length > 0")
    picker = page.locator('[data-testid="stMultiSelect"] input').first
    picker.click()
    page.keyboard.type("ae")
    page.keyboard.press("Enter")
    page.keyboard.press("Escape")
    page.get_by_text("Compute scores stopped before it finished").first.wait_for()
    wait_idle(page)
    assert page.get_by_role("button", name="Compute scores").count() == 1
    assert_the_sidebar_names_the_address(page)
    page.close()


def test_a_link_streamlit_would_drop_whole_is_said(server, browser):
    """Issue 46 item 7: Streamlit reads no key of a query string over 1,000 fields (nor one over 512 Ki characters,
    which its server refuses with HTTP 400 before the page loads, measured); the page says so (one notice) instead
    of opening the default view without a word. A lesson without its step is named too."""
    page = open_page(browser, f"{server}/?" + "&".join(f"x{i}=1" for i in range(1001)))
    notice = page.locator("#hp-link-ignored")      # the browser says it: no app code sees such a query string
    notice.wait_for()
    assert "its query string has 1,001 fields (at most 1,000), so none of it was read" in notice.inner_text()
    assert page.get_by_text("This link named").count() == 1
    page.close()
    page = open_page(browser, f"{server}/?model=demo&data=demo&page=prune&lesson=induction-heads")
    notice = page.locator('[data-testid="stAlert"]', has_text="This link named").all_inner_texts()
    assert len(notice) == 1 and "lesson='induction-heads' dropped" in notice[0], notice
    assert "lesson" not in page.url
    page.close()
