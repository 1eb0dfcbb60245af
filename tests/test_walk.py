"""The short random walk of issue 45 in CI: one seed, 200 actions over the three demos, in headless Chromium on
the browser tests' shared server (tests/conftest.py), with every invariant of ``benchmarks/walk.py`` checked after
every action -- no exception box; the address bar, the sidebar's link, its Copy text and its QR code name the view
on screen; heads left is the link's mask, the mask the one the walk expects; the link opened in a fresh context
shows the same page, heads left and selection; no running interval of zero width. The long walk (three seeds, and
under CPU burners) is ``benchmarks/bench_walk.py``; docs/results/walks.md has both walks' numbers.

Skipped, with the reason printed, when /usr/bin/chromium or Playwright is missing."""

from __future__ import annotations

from app_support import benchmark

SEED = 45
ACTIONS = 200


def test_a_seeded_walk_over_the_three_demos_breaks_no_invariant(server, browser):
    walk = benchmark("walk")
    report = walk.Walk(browser, server, SEED, log=print).run(ACTIONS)
    print("\n".join(report.lines()))
    assert sum(report.actions.values()) >= ACTIONS and report.checks >= ACTIONS
    assert set(report.seen) == set(walk.DEMOS), report.seen           # all three demos walked and checked
    assert not report.failures, "\n".join(map(str, report.failures))
