"""Random walks through the dashboard in a real browser, with the view's invariants checked after every action.

The engine of issue 45's walks: ``tests/test_walk.py`` (the short CI walk, one seed, the browser tests' shared
server) and ``benchmarks/bench_walk.py`` (the long walk, several seeds, the same walk again with CPU burners) both
import it. A walk is a seeded sequence of what a person does with the dashboard:

    open      a link (a demo, a page, sometimes a mask and a head) in the walk's tab: a new session
    switch    another page through the sidebar            reload   F5 (a new session on the address bar)
    grid      a click on a head cell of the page's grid   restore  "Prune / restore" (the outlined head)
    undo      "Undo"        reset  "Reset"                apply    "Apply" (prune the lowest x% by a criterion)
    criterion the Prune page's criterion                  ratio    the Prune page's ratio slider, a step or two
    sentence  a typed sentence on Attention               roles    the sidebar's role-letter toggle
    lesson    a lesson step's link, or its panel's "step k+1 →"
    fresh     the sidebar's link, taken with its Copy button, opened in a fresh browser context
    cancel    a long job (head roles, a role's ablation) started and cancelled

Each action is drawn among those that apply to the page on screen (a Prune action on the Prune page, a grid click
where a grid is); weights favour clicks, the costly page loads are rarer. After EVERY action, once the page is
idle, the walk reads the page once (``READ_VIEW``) and checks:

    exception     no exception box and no "unexpected" error
    link          the sidebar's share link (its code block: the text its Copy button copies) is the address bar
    qr            the sidebar's QR code is ``dashboard.ui.qr_data_uri`` of that link (same PNG data URI)
    heads-left    the sidebar's "heads left" is the grid minus the link's mask (and the Prune page's metric agrees)
    mask          the link's mask is the one the walk expects from its own model of the session (a click toggles
                  the head, Prune / restore the outlined one, Undo the last change, Reset none, a link or F5 keeps
                  its mask; Apply prunes the lowest ``ratio`` of the grid on top of the mask: a superset of it with
                  at least that many heads pruned)
    selection     the head the page shows selected (Prune's Head box, Roles' heading, Head scores' caption) is the
                  link's ``head``; the page's title is the link's ``page``; the Prune page's ratio slider and
                  criterion are the link's ``ratio`` and ``criterion``
    rows          the link's ``rows`` is the evaluation size the sidebar shows
and, at its own actions: ``fresh`` (the link in a fresh context shows the same page, heads left and selection),
``reload`` (F5 shows the same view), ``cancel`` (the note says the run was cancelled). While the Prune page
evaluates a new mask the walk polls its headline: every running value shown with an interval is recorded, and once
the exact value is in, ``interval`` checks that none was of zero width before its last batch and counts how many
held the exact value (coverage, reported: the stated rate is 95 %).

``Walk(...).run(n)`` returns a ``WalkReport``: actions by kind with their seconds, failures by invariant (each with
the action, its number and what was seen), intervals seen and covered.
"""

from __future__ import annotations

import functools
import random
import re
import statistics
import time
from collections import Counter, defaultdict, deque
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlencode, urlsplit

DEMOS = {"demo": (6, 12), "demo-lm": (6, 8), "demo-circuit": (3, 8)}     # each demo's head grid (layers, heads)
TITLES = {"headprune": "home", "Prune": "prune", "Roles": "roles", "Head scores": "head-scores",
          "Attention": "attention", "Every head at a glance": "heads", "Lessons": "lessons"}
# pages a "switch" goes to (drawn from the others): back to Prune, where most actions are, half the time
WALKED_PAGES = ("prune", "prune", "prune", "roles", "head-scores", "attention", "home")
GRID_PAGES = ("prune", "roles", "head-scores")
CRITERIA = ("ae", "random", "his")            # the Prune page's criteria a walk picks: each scores in seconds
# how often each action is drawn where it applies: clicks often, the page loads (open, lesson, reload, fresh: a new
# session each, 5-30 s on a busy 2-core server) rarely -- every kind is still drawn a few times in 200 actions
WEIGHTS = {
    "open": 1, "switch": 6, "grid": 24, "restore": 6, "undo": 5, "reset": 3, "apply": 4, "criterion": 3,
    "ratio": 5, "sentence": 1, "roles": 3, "lesson": 1, "next-step": 1, "reload": 1, "fresh": 1, "cancel": 2,
}
SENTENCES = ("The cat sat on the mat.", "red fox blue sky red fox blue sky", "A slow film with a wonderful cast.",
             "the plot was fun but the acting was not")

# every st.metric on the page by its label: its value, its delta, and whether it is stale (from an earlier run, not
# redrawn yet: not current)
METRICS = """const metrics = {};
  for (const box of document.querySelectorAll('[data-testid="stMetric"]')) {
    const label = box.querySelector('[data-testid="stMetricLabel"]');
    const value = box.querySelector('[data-testid="stMetricValue"]');
    const delta = box.querySelector('[data-testid="stMetricDelta"]');
    if (!label || !value) continue;
    metrics[label.textContent.trim()] = {value: value.textContent.trim(),
                                         delta: delta ? delta.textContent.trim() : '',
                                         stale: !!box.closest('[data-stale="true"]')};
  }"""
# Everything the invariants read, in one round trip: the address bar, the sidebar's link, QR code and counts, the
# title, errors, and the Prune page's controls and metrics (a metric inside a stale element is not current).
READ_VIEW = """() => {
  const sidebar = document.querySelector('[data-testid="stSidebar"]');
  const code = sidebar ? sidebar.querySelector('[data-testid="stCode"]') : null;
  const qr = sidebar ? [...sidebar.querySelectorAll('img')].find(i => i.src.startsWith('data:image/png')) : null;
  const side = sidebar ? sidebar.textContent : '';
  const left = side.match(/heads left: (\\d+) \\/ (\\d+)/);
  const rows = side.match(/evaluation \\/ calibration: (\\d+) \\/ (\\d+)/);
  METRICS
  const input = label => {
    const e = document.querySelector(`input[aria-label="${label}"]`);
    return e ? e.value : null;
  };
  const slider = document.querySelector('[data-testid="stSlider"] input[type="range"]');
  const h1 = document.querySelector('h1');
  const h3 = [...document.querySelectorAll('h3')].map(h => h.textContent.trim());
  const errors = [...document.querySelectorAll('[data-testid="stAlert"]')].map(a => a.textContent)
      .filter(t => t.includes('Please report this') || t.includes('unexpected'));
  return {url: location.href, link: code ? code.textContent.trim() : null, qr: qr ? qr.src : null,
          left: left ? [Number(left[1]), Number(left[2])] : null, rows: rows ? Number(rows[1]) : null,
          title: h1 ? h1.textContent.trim() : null, h3: h3, metrics: metrics,
          exceptions: document.querySelectorAll('[data-testid="stException"]').length, errors: errors,
          head_box: input('Head'), layer_box: input('Layer'), criterion: input('Criterion'),
          plots: document.querySelectorAll('.js-plotly-plot').length,
          ratio: slider ? slider.value : null,
          body: document.body.textContent.slice(0, 20000)};
}""".replace("METRICS", METRICS)
# idle: the app says its script is not running (its own test attribute: the status widget's "Running" shows late
# on a busy machine) and no element is stale (from an earlier run, not yet redrawn)
# the Prune page's headline while it evaluates, polled often: metrics and the address only (no page text, whose
# reading makes a starved browser lay the page out again)
READ_HEADLINE = """() => {
  METRICS
  return {url: location.href, metrics: metrics};
}""".replace("METRICS", METRICS)
# what the clicks after it landed on (the text of the button under them), for a click that may come too late
CLICK_LOG = ("() => { if (!window.__walkClicks) document.addEventListener('click', e => window.__walkClicks.push("
             "(e.target.closest('button') || e.target).innerText.slice(0, 40)), {capture: true}); "
             "window.__walkClicks = []; }")
SETTLED = ("() => { const app = document.querySelector('[data-testid=\"stApp\"]'); return !!app && "
           "app.getAttribute('data-test-script-state') === 'notRunning' && "
           "!document.querySelector('[data-stale=\"true\"]'); }")
RUNNING = re.compile(r"^(\d+)/(\d+) batches$")
# numbers as viz.metric_text writes them: by magnitude, with thousands separators ("1,651", "6,101 ± 310")
SYMMETRIC = re.compile(r"^([0-9.,]+) ± ([0-9.,]+)$")
LOPSIDED = re.compile(r"^≈ ([0-9.,]+) \(([0-9.,]+)–([0-9.,]+)\)$")
SELECTED = re.compile(r"layer (\d+) · head (\d+)")


@dataclass
class Failure:
    step: int
    action: str
    invariant: str
    detail: str
    trail: str = ""    # where it happened and the actions before it (what a CI log needs to tell the failure apart)

    def __str__(self) -> str:
        where = f" [{self.trail}]" if self.trail else ""
        return f"#{self.step} {self.action}: {self.invariant}: {self.detail}{where}"


@dataclass
class WalkReport:
    seed: int
    actions: Counter = field(default_factory=Counter)
    seconds: dict = field(default_factory=lambda: defaultdict(list))
    failures: list = field(default_factory=list)
    intervals: int = 0            # running values shown with an interval
    covered: int = 0              # ... that held the exact value once it was in
    zero_width: int = 0
    checks: int = 0               # invariant checks made
    missed_cancels: int = 0       # Cancel clicks that landed after their job ended and its button went
    wall: float = 0.0
    seen: Counter = field(default_factory=Counter)    # invariant checks by demo

    @property
    def demos(self) -> list[str]:
        """The demos the walk's checks saw, in order of first sight."""
        return list(self.seen)

    def by_invariant(self) -> Counter:
        return Counter(f.invariant for f in self.failures)

    def merge(self, other: WalkReport) -> None:
        self.actions.update(other.actions)
        for kind, values in other.seconds.items():
            self.seconds[kind].extend(values)
        self.failures += other.failures
        self.seen.update(other.seen)
        for name in ("intervals", "covered", "zero_width", "checks", "wall", "missed_cancels"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def lines(self) -> list[str]:
        """The report in words: totals, failures by invariant, each failure, seconds per action kind."""
        total = sum(self.actions.values())
        out = [f"{total} actions, {self.checks} invariant checks ("
               + ", ".join(f"{demo} {n}" for demo, n in self.seen.items()) + f"), {len(self.failures)} failures, "
               f"{self.wall:.0f} s ({self.wall / max(total, 1):.2f} s an action)"]
        out.append("failures by invariant: " + (", ".join(f"{k} {v}" for k, v in sorted(self.by_invariant().items()))
                                                or "none"))
        out += [f"  {f}" for f in self.failures[:40]]
        rate = f"{self.covered / self.intervals:.3f}" if self.intervals else "n/a"
        out.append(f"running intervals shown: {self.intervals}, held the exact value: {self.covered} ({rate}), "
                   f"zero width before the last batch: {self.zero_width}; Cancel clicks that came after their job "
                   f"ended: {self.missed_cancels}")
        out.append("action      count  median s  max s")
        for kind in sorted(self.actions):
            times = self.seconds.get(kind) or [0.0]
            out.append(f"{kind:11s} {self.actions[kind]:5d} {statistics.median(times):9.2f} {max(times):6.2f}")
        return out


class Skip(Exception):
    """The drawn action does not apply here after all (e.g. no grid drawn yet): another is drawn."""


class Walk:
    """One seeded walk on the server at ``url`` with the Playwright ``browser``: ``run(n)`` makes ``n`` actions."""

    def __init__(self, browser, url: str, seed: int, demos: tuple[str, ...] = tuple(DEMOS), log=print,
                 timeout_ms: int = 300_000, viewport: dict | None = None):
        self.browser, self.url, self.seed, self.demos, self.log = browser, url.rstrip("/"), seed, demos, log
        self.rng = random.Random(seed)
        self.timeout = timeout_ms
        self.viewport = viewport or {"width": 1400, "height": 1000}
        self.report = WalkReport(seed)
        self.step = 0
        self.where: str | None = None             # the page (or demo opened) the current action starts on
        self.context = self.page = None
        # the walk's model of the session on screen: the demo, the mask and its undo history
        self.model: str | None = None
        self.mask: set | None = None
        self.history: list[frozenset] = []
        self.expected_mask: set | None = None      # set by an action whose effect on the mask is known
        self.apply_base: tuple | None = None       # (mask before, ratio) of an Apply, checked by ``mask``
        self.trail: deque[str] = deque(maxlen=5)   # the last actions, "#step kind on page, seconds"

    # -- the browser ---------------------------------------------------------------------------------------------
    def open_context(self) -> None:
        if self.context is not None:
            self.context.close()
        self.context = self.browser.new_context(viewport=self.viewport)
        self.context.grant_permissions(["clipboard-read", "clipboard-write"])
        self.page = self.context.new_page()
        self.page.set_default_timeout(self.timeout)

    def settle(self, page=None) -> None:
        """Idle: no stale element and no running script (``steady`` then waits for the view to hold still)."""
        page = page or self.page
        page.wait_for_timeout(100)    # a rerun a click asks for starts a moment after it
        page.wait_for_function(SETTLED, timeout=self.timeout)

    def read(self, page=None) -> dict:
        return (page or self.page).evaluate(READ_VIEW)

    def steady(self, page=None, tries: int = 50) -> dict:
        """The view once two reads 0.3 s apart agree on what the invariants compare, on an idle page with its
        sidebar link drawn: a check judges what stays on screen, not a frame still arriving. (The app reports its
        script finished before a CPU-starved browser has drawn all it sent: after an F5 on a loaded machine the
        sidebar's link came 3 s after "not running".) At most ``tries`` reads (15 s); the last is judged as is."""
        page = page or self.page
        keys = ("url", "link", "qr", "left", "title", "rows", "head_box", "exceptions")
        last = self.read(page)
        for _ in range(tries):
            page.wait_for_timeout(300)
            page.wait_for_function(SETTLED, timeout=self.timeout)
            now = self.read(page)
            if all(now[k] == last[k] for k in keys) and now["link"] is not None and now["qr"] is not None:
                return now
            last = now
        return last

    def goto(self, url: str, page=None) -> None:
        page = page or self.page
        page.goto(url)
        page.wait_for_function("() => document.querySelector('h1')", timeout=self.timeout)
        page.wait_for_function("() => document.body.innerText.includes('heads left')", timeout=self.timeout)
        self.settle(page)

    # -- the walk ------------------------------------------------------------------------------------------------
    def run(self, n_actions: int) -> WalkReport:
        """``n_actions`` actions; the walk opens each of its demos in turn at an equal share of them (a walk that
        drew its opens at random could miss one), the rest drawn."""
        start = time.perf_counter()
        self.open_context()
        turns = {round(i * n_actions / len(self.demos)): demo for i, demo in enumerate(self.demos)}
        while self.step < n_actions:
            if self.step in turns:
                demo = turns.pop(self.step)
                self.where = demo
                self.do("open", functools.partial(self.open_link, demo))
                continue
            view = self.read()
            kind = self.draw(view)
            self.where = TITLES.get(view["title"] or "", view["title"])
            action = getattr(self, "act_" + kind.replace("-", "_"))
            self.do(kind, functools.partial(action, view))
        self.context.close()
        self.report.wall = time.perf_counter() - start
        return self.report

    def draw(self, view: dict) -> str:
        here = TITLES.get(view["title"] or "")
        applies = {"open", "switch", "reload", "fresh", "lesson"}
        if here in GRID_PAGES:
            applies.add("grid")
        if here == "prune":
            applies |= {"restore", "undo", "reset", "apply", "criterion", "ratio"}
        if here == "attention":
            applies.add("sentence")
        if "Head roles on the grids" in view["body"]:
            applies.add("roles")
        if "step " in view["body"] and "→" in view["body"]:
            applies.add("next-step")
        if here == "roles":
            applies.add("cancel")
        kinds = sorted(applies)
        return self.rng.choices(kinds, weights=[WEIGHTS[k] for k in kinds])[0]

    def do(self, kind: str, action) -> None:
        self.step += 1
        self.expected_mask, self.apply_base = None, None
        start = time.perf_counter()
        try:
            action()
        except Skip:
            self.step -= 1
            return
        except Exception as exc:  # noqa: BLE001 - a walk records what broke and goes on from a fresh page
            self.count(kind, start)
            self.fail(kind, "action", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            self.recover()
            return
        self.count(kind, start)
        try:
            self.check(kind)
        except Exception as exc:  # noqa: BLE001
            self.fail(kind, "check", f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
            self.recover()

    def count(self, kind: str, start: float) -> None:
        seconds = time.perf_counter() - start
        self.report.actions[kind] += 1
        self.report.seconds[kind].append(seconds)
        self.trail.append(f"#{self.step} {kind} on {self.where}, {seconds:.1f} s")

    def fail(self, action: str, invariant: str, detail: str) -> None:
        failure = Failure(self.step, action, invariant, detail, " <- ".join(reversed(self.trail)))
        self.report.failures.append(failure)
        self.log(f"  FAIL {failure}")

    def recover(self) -> None:
        """After a broken action: a fresh context on the last good link (or the demo), so the walk goes on."""
        self.open_context()
        self.open_link()

    # -- what the page shows --------------------------------------------------------------------------------------
    def link_state(self, view: dict) -> dict:
        """The address bar's query, one value a key."""
        return {k: v[-1] for k, v in parse_qs(urlsplit(view["url"]).query).items()}

    def shape(self) -> tuple[int, int]:
        return DEMOS[self.model]

    def parse_mask(self, text: str | None) -> set:
        from headprune.viewstate import parse_heads

        return set(parse_heads(text, self.shape())) if text else set()

    def shown_selection(self, view: dict) -> tuple[int, int] | None | str:
        """The head the page shows selected, or "n/a" where the page shows none."""
        here = TITLES.get(view["title"] or "")
        if here == "prune" and view["head_box"]:
            match = SELECTED.search(view["head_box"])
            return (int(match.group(1)), int(match.group(2))) if match else None
        if here == "roles" and "Labels" in view["h3"]:      # the head's heading comes with the label grid
            for heading in view["h3"]:
                match = SELECTED.match(heading)
                if match:
                    return int(match.group(1)), int(match.group(2))
            return None
        if here == "head-scores" and view["plots"]:     # the caption comes with the heatmaps
            match = re.search(r"Selected: layer (\d+) · head (\d+)", view["body"])
            return (int(match.group(1)), int(match.group(2))) if match else None
        return "n/a"

    # -- the invariants ------------------------------------------------------------------------------------------
    def check(self, kind: str, view: dict | None = None) -> None:
        from dashboard.ui import qr_data_uri

        view = view or self.steady()
        self.report.checks += 1
        if view["exceptions"] or view["errors"]:
            self.fail(kind, "exception", (view["errors"] or ["an exception box"])[0][:300])
        state = self.link_state(view)
        if state.get("model") in DEMOS:
            self.model = state["model"]
        self.report.seen[self.model] += 1
        if view["link"] is None:
            self.fail(kind, "link", "no share link in the sidebar")
            return
        if not link_names_address(view["link"], view["url"]):
            self.fail(kind, "link", f"sidebar {view['link']} != address bar {view['url']}")
        if view["qr"] != qr_data_uri(view["link"]):
            self.fail(kind, "qr", f"the QR code does not encode the sidebar's link {view['link']}")
        mask = self.parse_mask(state.get("mask"))
        n_units = self.shape()[0] * self.shape()[1]
        if view["left"] != [n_units - len(mask), n_units]:
            self.fail(kind, "heads-left", f"sidebar {view['left']} but the link's mask has {len(mask)} of {n_units}")
        here = TITLES.get(view["title"] or "")
        prune_left = view["metrics"].get("heads left")
        if here == "prune" and prune_left and prune_left["value"] != f"{n_units - len(mask)} / {n_units}":
            self.fail(kind, "heads-left", f"Prune shows {prune_left['value']}, the link's mask {len(mask)} pruned")
        if self.expected_mask is not None and mask != self.expected_mask:
            self.fail(kind, "mask", f"link mask {sorted(mask)} != expected {sorted(self.expected_mask)}")
        if self.apply_base is not None:
            before, ratio = self.apply_base
            if not before <= mask or len(mask) < int(ratio * n_units + 1e-9):
                self.fail(kind, "mask", f"Apply at {ratio:.0%} gave {len(mask)} pruned from {len(before)}")
        if self.mask is not None and mask != self.mask:
            self.history.append(frozenset(self.mask))
        self.mask = mask
        page_name = state.get("page")
        if here is not None and here != "home" and page_name != here:
            self.fail(kind, "selection", f"the link names page {page_name!r}, the screen shows {view['title']!r}")
        selected = self.shown_selection(view)
        linked = tuple(map(int, state["head"].split("."))) if "head" in state else None
        if selected != "n/a" and selected != linked:
            self.fail(kind, "selection", f"the page shows head {selected}, the link names {linked}")
        if here == "prune":
            if view["ratio"] is not None and state.get("ratio") is not None \
                    and abs(float(state["ratio"]) - int(view["ratio"]) / 100) > 1e-9:
                self.fail(kind, "selection", f"ratio slider {view['ratio']} %, link ratio {state['ratio']}")
            if view["criterion"] and state.get("criterion") != view["criterion"]:
                self.fail(kind, "selection", f"criterion box {view['criterion']!r}, link {state.get('criterion')!r}")
        if view["rows"] is not None and state.get("rows") != str(view["rows"]):
            self.fail(kind, "rows", f"the sidebar evaluates {view['rows']} rows, the link names {state.get('rows')}")

    # -- the Prune page's running numbers --------------------------------------------------------------------------
    def watch_evaluation(self, kind: str, before: str) -> None:
        """Poll the Prune page's headline until its exact value differs from ``before``'s state (a new run came
        in and finished); record every running value with an interval and check them against the exact one."""
        page, seen, deadline = self.page, [], time.perf_counter() + self.timeout / 1000
        metric = None
        while time.perf_counter() < deadline:
            view = page.evaluate(READ_HEADLINE)
            metric = metric or next((m for m in ("accuracy", "perplexity") if any(k.startswith(m)
                                                                                   for k in view["metrics"])), None)
            box = next((v for k, v in view["metrics"].items() if metric and k.startswith(metric)), None)
            if box and not box["stale"]:
                running = RUNNING.match(box["delta"])
                if running and int(running.group(1)) < int(running.group(2)):
                    interval = _interval(box["value"])
                    if interval is not None:
                        seen.append((int(running.group(1)), int(running.group(2)), box["value"], *interval))
                elif "vs" in box["delta"] and view["url"] != before and page.evaluate(SETTLED):
                    self.score_intervals(kind, seen, number(box["value"]))
                    return
            page.wait_for_timeout(100)
        raise TimeoutError("the Prune page's exact value did not come")

    def score_intervals(self, kind: str, seen: list, exact: float) -> None:
        for done, total, text, low, high, digits in {s[:3]: s for s in seen}.values():
            self.report.intervals += 1
            slack = 0.5 * 10 ** -digits       # the page rounds the ends: an end within half a unit holds it
            if low - slack <= exact <= high + slack:
                self.report.covered += 1
            if high - low <= 0:
                self.report.zero_width += 1
                self.fail(kind, "interval", f"{text} after {done}/{total} batches is of zero width")

    # -- actions --------------------------------------------------------------------------------------------------
    def open_link(self, model: str | None = None, page_name: str | None = None, with_mask: bool = False) -> None:
        model = model or self.rng.choice(self.demos)
        page_name = page_name or self.rng.choice(("prune", "prune", "roles", "head-scores", "attention"))
        query = {"model": model, "data": model, "page": page_name}
        mask: set = set()
        if with_mask:
            layers, heads = DEMOS[model]
            mask = {(self.rng.randrange(layers), self.rng.randrange(heads)) for _ in range(self.rng.randrange(1, 6))}
            query["mask"] = ",".join(f"{a}.{b}" for a, b in sorted(mask))
            query["head"] = "{}.{}".format(*self.rng.choice(sorted(mask)))
        self.goto(f"{self.url}/?{urlencode(query)}")
        self.model, self.mask, self.history = model, None, []
        self.expected_mask = mask

    def act_open(self, view) -> None:
        self.open_link(with_mask=self.rng.random() < 0.5)

    def act_switch(self, view) -> None:
        here = TITLES.get(view["title"] or "")
        target = self.rng.choice([p for p in WALKED_PAGES if p != here])
        nav = self.page.locator('[data-testid="stSidebarNav"]')
        more = nav.locator('[data-testid="stSidebarNavViewButton"]')
        if more.count() and more.inner_text().strip().endswith("more"):
            more.click()
        href = "" if target == "home" else target
        link = nav.locator(f'a[href$="/{href}"]').first
        if not link.count():
            raise Skip
        link.click()
        title = next(t for t, p in TITLES.items() if p == target)
        self.page.wait_for_function("t => document.querySelector('h1') && document.querySelector('h1').innerText"
                                    ".trim().startsWith(t)", arg=title)
        self.settle()
        self.expected_mask = self.mask

    def grid_points(self, n_units: int):
        """The first plotly grid on the page with one click marker per head (None: none drawn)."""
        plots = self.page.locator(".js-plotly-plot")
        for i in range(plots.count()):
            points = plots.nth(i).locator(".scatterlayer .point")
            if points.count() == n_units:
                return points
        return None

    def act_grid(self, view) -> None:
        layers, heads = self.shape()
        points = self.grid_points(layers * heads)
        if points is None:
            raise Skip
        layer, head = self.rng.randrange(layers), self.rng.randrange(heads)
        point = points.nth(layer * heads + head)
        # a mouse click lands where the viewport shows it: a grid below the fold (under a lesson's step, on Roles)
        # is scrolled to first, else the click fell on whatever the page had there (CI's walk: a selectbox)
        if point.bounding_box() is not None:
            point.scroll_into_view_if_needed()
        box = point.bounding_box()
        if box is None or not 0 <= box["y"] + box["height"] / 2 < self.viewport["height"]:
            raise Skip
        here = TITLES.get(view["title"] or "")
        before = view["url"]
        self.page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        self.page.wait_for_function("u => location.href !== u", arg=before, timeout=60_000) \
            if (here == "prune" or self.link_state(view).get("head") != f"{layer}.{head}") else None
        if here == "prune":
            self.expected_mask = set(self.mask or ()) ^ {(layer, head)}
            self.watch_evaluation("grid", before)
        else:
            self.expected_mask = self.mask
        self.settle()
        if here == "prune" and self.link_state(self.read()).get("head") != f"{layer}.{head}":
            self.fail("grid", "selection", f"clicked layer {layer} head {head}, the link names "
                                           f"{self.link_state(self.read()).get('head')}")

    def press(self, name: str, prune_changes: bool = True) -> None:
        button = self.page.get_by_role("button", name=name, exact=True)
        if not button.count() or button.first.is_disabled():
            raise Skip
        before = self.read()["url"]
        button.first.click()
        if prune_changes:
            self.watch_evaluation(name, before)
        self.settle()

    def act_restore(self, view) -> None:
        head = self.link_state(view).get("head")
        if head is None:
            raise Skip
        self.press("Prune / restore")
        self.expected_mask = set(self.mask or ()) ^ {tuple(map(int, head.split(".")))}

    def act_undo(self, view) -> None:
        if not self.history:
            raise Skip
        self.press("Undo")
        self.expected_mask = set(self.history.pop())
        self.mask = None        # undo is no change to append to the walk's history

    def act_reset(self, view) -> None:
        self.press("Reset")
        self.expected_mask = set()

    def act_apply(self, view) -> None:
        state = self.link_state(view)
        ratio = float(state.get("ratio", "0.25"))
        before = set(self.mask or ())
        if len(before) >= int(ratio * self.shape()[0] * self.shape()[1]):
            raise Skip          # nothing would change: the mask holds that many already
        self.press("Apply")
        self.apply_base = (before, ratio)

    def act_criterion(self, view) -> None:
        box = self.page.locator('[data-testid="stSelectbox"]', has=self.page.locator('input[aria-label="Criterion"]'))
        if not box.count():
            raise Skip
        name = self.rng.choice([c for c in CRITERIA if c != view["criterion"]])
        box.first.click()
        # typed first: the dropdown draws only the options in its view (a virtual list), so a criterion further down
        # was never in the page to click (a 300 s timeout on a busy server)
        self.page.keyboard.type(name)
        self.page.get_by_role("option", name=name, exact=True).first.click()
        self.page.wait_for_function("n => new URLSearchParams(location.search).get('criterion') === n", arg=name)
        self.settle()
        self.expected_mask = self.mask

    def act_ratio(self, view) -> None:
        slider = self.page.locator('[data-testid="stSlider"] input[type="range"]').first
        if not slider.count():
            raise Skip
        now = int(slider.input_value())
        steps = self.rng.choice((-2, -1, 1, 2))
        steps = max(-now // 5, min(steps, (100 - now) // 5)) or 1
        slider.focus()
        for _ in range(abs(steps)):
            self.page.keyboard.press("ArrowRight" if steps > 0 else "ArrowLeft")
        want = f"{(now + 5 * steps) / 100:g}"
        self.page.wait_for_function("r => new URLSearchParams(location.search).get('ratio') === r", arg=want)
        self.settle()
        self.expected_mask = self.mask

    def act_sentence(self, view) -> None:
        self.page.get_by_text("type one").first.click()
        box = self.page.get_by_label("Your sentence")
        box.wait_for()
        text = self.rng.choice(SENTENCES)
        box.fill(text)
        box.press("Enter")
        self.page.wait_for_function("t => new URLSearchParams(location.search).get('sentence') === t", arg=text)
        self.settle()
        self.expected_mask = self.mask

    def act_roles(self, view) -> None:
        toggle = self.page.get_by_text("Head roles on the grids", exact=True)
        if not toggle.count():
            raise Skip
        before = self.link_state(view).get("roles")
        toggle.first.click()
        want = None if before == "0" else "0"
        self.page.wait_for_function("w => new URLSearchParams(location.search).get('roles') === w", arg=want)
        self.settle()
        self.expected_mask = self.mask

    def act_lesson(self, view) -> None:
        from dashboard.ui import PAGES
        from headprune.lessons import SHIPPED, load_lessons

        lessons, _ = load_lessons([SHIPPED], pages=[url for *_, url in PAGES])
        lesson = lessons[self.rng.choice(sorted(lessons))]
        k = self.rng.randrange(1, len(lesson.steps) + 1)
        self.goto(f"{self.url}/?{urlencode(lesson.query(k))}")
        self.page.get_by_text(f"step {k} of {len(lesson.steps)}").first.wait_for()
        self.model, self.history = lesson.model, []
        self.mask, self.expected_mask = None, set(lesson.steps[k - 1].state.mask or ())

    def act_next_step(self, view) -> None:
        link = self.page.get_by_role("link", name=re.compile(r"^step \d+ →$"))
        if not link.count():
            raise Skip
        state = self.link_state(view)
        link.first.click()
        want = str(int(state.get("step", "0")) + 1)
        self.page.wait_for_function("s => new URLSearchParams(location.search).get('step') === s", arg=want)
        self.page.wait_for_function("() => document.body.innerText.includes('heads left')")
        self.settle()
        self.mask, self.history = None, []

    def act_reload(self, view) -> None:
        before = self.steady()
        self.page.reload()
        self.page.wait_for_function("() => document.body.innerText.includes('heads left')")
        self.settle()
        after = self.steady()
        self.compare_views("reload", before, after)
        self.history = []
        self.expected_mask = self.mask

    def act_fresh(self, view) -> None:
        code = self.page.locator('[data-testid="stSidebar"] [data-testid="stCode"]')
        copy = code.locator('button[aria-label="Copy to clipboard"]')
        link = view["link"]
        if copy.count():
            code.first.scroll_into_view_if_needed()
            code.first.hover()          # the copy button shows on hover
            copy.first.click()
            link = self.page.evaluate("() => navigator.clipboard.readText()") or link
            if link != view["link"]:
                self.fail("fresh", "link", f"the Copy button copied {link}, the sidebar shows {view['link']}")
        context = self.browser.new_context(viewport=self.viewport)
        try:
            page = context.new_page()
            page.set_default_timeout(self.timeout)
            self.goto(link, page)
            self.compare_views("fresh", view, self.steady(page))
        finally:
            context.close()
        self.expected_mask = self.mask

    def compare_views(self, kind: str, before: dict, after: dict) -> None:
        """The same page, heads left, selected head and evaluation rows (``fresh``, ``reload``)."""
        same = {"title": (before["title"], after["title"]), "heads left": (before["left"], after["left"]),
                "selection": (self.shown_selection(before), self.shown_selection(after)),
                "rows": (before["rows"], after["rows"])}
        for what, (was, now) in same.items():
            if was != now:
                self.fail(kind, "fresh" if kind == "fresh" else "reload", f"{what}: {was} before, {now} after")

    def act_cancel(self, view) -> None:
        """Start the Roles page's long job (Find head roles, else Measure) and cancel it once its bar moves."""
        for name in ("Find head roles", "Measure"):
            button = self.page.get_by_role("button", name=name, exact=True)
            if button.count():
                break
        else:
            raise Skip
        button.first.click()
        self.expected_mask = self.mask     # stopped, finished or cancelled: the job never changes the mask
        cancel = self.page.get_by_role("button", name="Cancel")
        try:
            cancel.first.wait_for(timeout=30_000)
            self.page.evaluate(CLICK_LOG)
            cancel.first.click()
        except Exception:  # noqa: BLE001 - it finished before Cancel could be pressed: nothing to cancel
            self.settle()
            return
        if self.page.evaluate("() => window.__walkClicks.some(t => t.includes('Cancel'))"):
            # said either way: stopped, or (the job ended before the click reached the server) its result kept
            self.page.get_by_text(re.compile("Cancelled: the run stopped|Cancel came after|already")).first.wait_for(
                timeout=60_000)
        else:
            # the job ended (the button gone) between Playwright's check and its click, which landed on the page
            # behind it: a Measure of under a second on a fast machine; nothing was cancelled, nothing to judge
            self.report.missed_cancels += 1
        self.settle()


def link_names_address(link: str, address: str) -> bool:
    """Whether the sidebar's ``link`` opens what the ``address`` bar shows: the same keys (however each escapes
    them), the link at the app's root -- it names its page in the query (ui.app_root: a page's own path made
    Streamlit probe /<page>/_stcore/health) -- and the address bar at the root or at that page's own path."""
    link_parts, address_parts = urlsplit(link), urlsplit(address)
    query = parse_qs(address_parts.query)
    return (link_parts.path.strip("/") == "" and address_parts.path.strip("/") in ("", *query.get("page", []))
            and parse_qs(link_parts.query) == query)


def number(text: str) -> float:
    """A number as the page prints it ("1,651", "0.8182", "-0.0312")."""
    return float(text.replace(",", ""))


def _interval(text: str) -> tuple[float, float, int] | None:
    """(low, high, decimals) of a running value as the page prints it, or None when it shows no interval."""
    match = SYMMETRIC.match(text)
    if match:
        value, half = number(match.group(1)), number(match.group(2))
        return value - half, value + half, len(match.group(2).partition(".")[2])
    match = LOPSIDED.match(text)
    if match:
        return number(match.group(2)), number(match.group(3)), len(match.group(2).partition(".")[2])
    return None
