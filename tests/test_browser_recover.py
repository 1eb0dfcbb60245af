"""The Recover step in a real browser (headless Chromium through Playwright, the servers and fixtures of
tests/test_browser.py): a one-step recovery of the demo shows the estimate, then the dense / pruned / recovered
table. Skipped, with the reason, when Chromium or Playwright is missing."""

from __future__ import annotations

from test_browser import nav, wait_idle


def test_recover_one_step_in_the_browser(server, browser, tmp_path):  # noqa: F811 - the fixtures above
    page = browser.new_page(viewport={"width": 1500, "height": 1000})
    page.set_default_timeout(300_000)
    page.goto(server)   # a deep link opens with a "page not found" dialog before the pages register
    page.get_by_text("heads left").first.wait_for()
    wait_idle(page)
    nav(page, "Recover").click()
    page.get_by_text("distill recovery", exact=False).first.wait_for()   # the estimate, before anything runs
    for label, value in (("Steps (0: whole epochs)", "1"), ("Training rows", "16")):
        field = page.get_by_label(label)
        field.fill(value)
        field.press("Enter")
        wait_idle(page)
    page.get_by_text("distill recovery (1 steps)", exact=False).first.wait_for()
    page.get_by_role("button", name="Recover", exact=True).click()
    page.get_by_text("Dense, pruned and recovered").wait_for()
    wait_idle(page)
    table = page.locator('[data-testid="stTable"]').first.inner_text()
    assert "accuracy" in table and "recovered" in table
    page.screenshot(path=str(tmp_path / "recover.png"), full_page=True)
