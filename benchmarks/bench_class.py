"""A class on one machine: N students' browsers on one dashboard server, each following a lesson link and clicking
five heads. Click → first number, errors, and memory per student.

    python benchmarks/bench_class.py [--students 30] [--arrive-over 60] [--clicks 5] [--think 3-8]
                                     [--lesson most-heads-can-go] [--step 2] [--model demo] [--eval-size 128]
                                     [--nice-browser] [--json out.json]

Starts one ``streamlit run app.py`` (``bench_browser.streamlit_server``: the dashboard's default splits unless
HEADPRUNE_EVAL_SIZE etc. are set) and ONE headless Chromium (/usr/bin/chromium, Playwright's async API) with one
browser context per student (its own cookies and Streamlit session, as separate laptops). Student i arrives at
i · arrive-over / N seconds (0: all at once) and

1. opens the lesson step's link (``Lesson.query``: ``/?page=prune&...&lesson=NAME&step=K``) and waits until the
   step's panel and page are drawn and the page is idle (**open s**: link → idle);
2. clicks ``--clicks`` heads of the Prune page's grid, distinct per student (``random.Random(seed + i)``), each
   from an idle page after ``--think`` seconds (``A-B``: drawn uniformly per click, seeded per student, as a
   student reads the page before the next click): **click s** is the mouse click → the page shows the new "heads
   left" count and a current (not stale) number for the headline metric, the running estimate or the exact value,
   timed in the browser (``performance.now()`` at the click and when the condition first holds, polled per frame).
   It also checks that the caption names the clicked head.

Errors counted per student: exception boxes (``stException``) and ``st.error`` boxes on the page, console errors,
failed requests and HTTP responses >= 400, and any step that timed out. Memory: the server process's RSS (psutil;
the server is this process's child) before the first student (model loaded by a warm-up visit), peak, and after
the last student's last click; per student = (after − before) / N. Chromium's: the summed PSS of its processes
(PSS splits shared pages among them; on a student's laptop in a real class). Both are read with every student still on
the page (the contexts are closed at the end).

All students' browsers run on this machine too, so their rendering competes with the server for the same cores:
in a classroom each browser runs on its student's own computer and the numbers here are pessimistic.
``--nice-browser`` starts Chromium (and so every renderer it forks) at ``nice -n 19``: the server gets the cores
whenever it wants them and the browsers use what is left, the nearest this one machine comes to separate laptops.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

spec = importlib.util.spec_from_file_location("bench_browser", ROOT / "benchmarks" / "bench_browser.py")
bench_browser = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_browser)

# resolves with performance.now() at the first frame in which the page shows `left` heads left and a current number
# for the headline. The condition is re-read when the page's DOM changes (a MutationObserver), not on every frame:
# 30 pages polling per frame while they wait cost the shared cores more than a student's browser ever spends
SHOWN = """([left, metric]) => new Promise(resolve => {
  const current = () => {
    const read = {};
    for (const box of document.querySelectorAll('[data-testid="stMetric"]')) {
      const label = box.querySelector('[data-testid="stMetricLabel"]');
      const value = box.querySelector('[data-testid="stMetricValue"]');
      if (label && value) read[label.innerText.trim()] = [value.innerText.trim(), !!box.closest('[data-stale="true"]')];
    }
    const l = read['heads left'], v = read[metric];
    return l && v && l[0] === left && !l[1] && !v[1] && /\\d+\\.\\d+/.test(v[0]);
  };
  let done = false;
  const check = () => {
    if (done || !current()) return;
    done = true;
    observer.disconnect();
    requestAnimationFrame(() => resolve(performance.now()));   // the frame that paints it
  };
  const observer = new MutationObserver(check);
  observer.observe(document.body, {subtree: true, childList: true, characterData: true, attributes: true,
                                   attributeFilter: ['data-stale']});
  check();
})"""
IDLE = ("() => !document.querySelector('[data-stale=\"true\"]') && (!document.querySelector('[data-testid=\"stStatus"
        "Widget\"]') || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText.includes('Running'))")
ERROR_BOXES = ("() => document.querySelectorAll('[data-testid=\"stException\"]').length"
               " + document.querySelectorAll('[data-testid=\"stAlertContentError\"]').length")


def think_range(text: str) -> tuple[float, float]:
    """``--think``: ``S`` seconds, or ``A-B`` for a uniform draw per click."""
    low, _, high = text.partition("-")
    low, high = float(low), float(high or low)
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"--think takes S or A-B seconds with 0 <= A <= B, not {text!r}")
    return low, high


def student_heads(index: int, clicks: int, shape: tuple[int, int], seed: int) -> list[tuple[int, int]]:
    """The heads student ``index`` clicks: distinct, drawn with the student's own seed."""
    layers, heads = shape
    return [divmod(cell, heads) for cell in random.Random(seed + index).sample(range(layers * heads), clicks)]


def clicks_of(index: int, args, shape: tuple[int, int]):
    """Student ``index``'s clicks, the same in a page and over the protocol: (k from 1, layer, head, seconds read
    before it), the heads from ``student_heads``, the reading time drawn per click with the student's own seed."""
    thinking = random.Random(f"think {args.seed} {index}")
    for k, (layer, head) in enumerate(student_heads(index, args.clicks, shape, args.seed), start=1):
        yield k, layer, head, thinking.uniform(*args.think)


def record_click(out: dict, k: int, layer: int, head: int, first_s: float, toggled: bool) -> None:
    out["clicks"].append({"layer": layer, "head": head, "first_s": first_s, "toggled": toggled})
    if not toggled:
        out["errors"].append(f"click {k}: the caption does not name layer {layer}, head {head}")


async def idle(page, timeout_ms: float) -> None:
    """Wait until the page is idle, read every 100 ms (Playwright's default reads it every frame: see SHOWN)."""
    await page.wait_for_timeout(300)
    await page.wait_for_function(IDLE, timeout=timeout_ms, polling=100)
    await page.wait_for_timeout(300)


async def student(browser, url: str, index: int, delay: float, args, lesson, shape, metric: str,
                  seen: dict | None = None) -> dict:
    out = {"student": index, "arrived_s": delay, "clicks": [], "errors": [], "browser": True}
    if seen is not None:
        seen[index] = out     # what it did so far, if the run's --deadline stops it
    await asyncio.sleep(delay)
    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    page.set_default_timeout(args.timeout * 1000)
    page.on("console", lambda m: m.type == "error" and out["errors"].append(f"console: {m.text.splitlines()[0][:200]}"))
    page.on("requestfailed", lambda r: out["errors"].append(f"request failed: {r.url[:120]} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and out["errors"].append(f"HTTP {r.status}: {r.url[:120]}"))
    try:
        start = time.perf_counter()
        await page.goto(f"{url}/?{urlencode(lesson.query(args.step))}")
        await page.get_by_text(f"step {args.step} of {len(lesson.steps)}").first.wait_for()
        await page.get_by_text("parameters left").first.wait_for()
        await idle(page, args.timeout * 1000)
        out["open_s"] = time.perf_counter() - start
        total = shape[0] * shape[1]
        points = page.locator(".js-plotly-plot .scatterlayer .point")
        await page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .point')"
                                     f".length >= {total}")
        for k, layer, head, think in clicks_of(index, args, shape):
            await page.wait_for_timeout(think * 1000)
            point = points.nth(layer * shape[1] + head)
            await point.scroll_into_view_if_needed()
            box = await point.bounding_box()
            shown = page.evaluate(SHOWN, [f"{total - k} / {total}", metric])   # armed before the click
            clicked = await page.evaluate("() => performance.now()")
            await page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            first = await asyncio.wait_for(shown, args.timeout)
            await idle(page, args.timeout * 1000)
            toggled = await page.get_by_text(f"toggled layer {layer} · head {head}").count()
            record_click(out, k, layer, head, (first - clicked) / 1000, bool(toggled))
        boxes = await page.evaluate(ERROR_BOXES)
        if boxes:
            out["errors"].append(f"{boxes} exception/error box(es) on the page")
    except Exception as exc:  # noqa: BLE001 - a student's failure is a result to report, not the benchmark's end
        out["errors"].append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
        if args.shots:   # what the student saw when it went wrong
            args.shots.mkdir(parents=True, exist_ok=True)
            await page.screenshot(path=str(args.shots / f"student-{index}.png"), full_page=True)
    # the context stays open, as a student stays on the page: its server session is alive when memory is read
    return out


class ProtocolSession:
    """One Streamlit session spoken to as a browser speaks to it (its websocket protocol: ``BackMsg`` out,
    ``ForwardMsg`` in), without drawing anything: a student whose browser runs on their own laptop. It keeps what a
    browser keeps to act: the widgets' ids (by key), their fragments, the page and its query string."""

    def __init__(self, ws):
        self.ws, self.widgets, self.query, self.page_hash = ws, {}, "", ""
        self.texts: list[str] = []       # the Markdown drawn since the last rerun request

    async def rerun(self, query: str | None = None, widget: tuple[str, str] | None = None) -> None:
        """A rerun request: the page at ``query`` (a link opened), or ``widget`` = (key, JSON text) set from the UI,
        as the browser sends a Plotly selection: the JSON as a string value, in the chart's fragment."""
        from streamlit.proto.BackMsg_pb2 import BackMsg

        self.texts = []
        msg = BackMsg()
        state = msg.rerun_script
        state.query_string = self.query if query is None else query
        state.page_script_hash = self.page_hash
        if widget is not None:
            wid, fragment = self.widgets[widget[0]]
            entry = state.widget_states.widgets.add()
            entry.id, entry.string_value = wid, widget[1]
            if fragment:
                state.fragment_id = fragment
        await self.ws.send(msg.SerializeToString())

    async def until(self, done, timeout: float):
        """Read messages until ``done(kind, message)`` is true for one of them; returns the time it arrived."""
        from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

        end = time.perf_counter() + timeout
        while True:
            fm = ForwardMsg()
            fm.ParseFromString(await asyncio.wait_for(self.ws.recv(), max(end - time.perf_counter(), 0.01)))
            kind = fm.WhichOneof("type")
            if kind == "new_session":
                self.page_hash = fm.new_session.page_script_hash
            elif kind == "page_info_changed":
                self.query = fm.page_info_changed.query_string
            elif kind == "delta" and fm.delta.WhichOneof("type") == "new_element":
                element = fm.delta.new_element
                inner = getattr(element, element.WhichOneof("type") or "", None)
                wid = getattr(inner, "id", "") if inner is not None else ""
                if wid.startswith("$$ID-"):        # a widget with a key: "$$ID-<hash>-<key>"
                    self.widgets[wid.split("-", 2)[2]] = (wid, fm.delta.fragment_id)
                elif element.WhichOneof("type") == "markdown":
                    self.texts.append(element.markdown.body)
            if done(kind, fm):
                return time.perf_counter()


def finished(kind: str, fm) -> bool:
    """A script run that ended normally (a whole page or a fragment), not one cut short for a rerun."""
    return kind == "script_finished" and fm.script_finished in (0, 3)


def shows(left: str, metric: str):
    """True at the message that draws the headline metric as a number, once "heads left" has shown ``left``."""
    seen = {"left": False}

    def done(kind: str, fm) -> bool:
        if kind != "delta" or fm.delta.new_element.WhichOneof("type") != "metric":
            return False
        m = fm.delta.new_element.metric
        seen["left"] |= m.label == "heads left" and m.body == left
        return seen["left"] and m.label == metric and re.match(r"\d+\.\d+", m.body) is not None
    return done


async def protocol_student(url: str, index: int, delay: float, args, lesson, shape, metric: str,
                           seen: dict | None = None) -> dict:
    """``student`` with the browser elsewhere: the same link and clicks sent over Streamlit's websocket protocol.
    click s = the click's message sent → the message that draws the first current number received (the server's
    share of what a student waits; their own browser adds its drawing, one student's alone in ``student``)."""
    import websockets

    out = {"student": index, "arrived_s": delay, "clicks": [], "errors": [], "browser": False}
    if seen is not None:
        seen[index] = out
    await asyncio.sleep(delay)
    try:
        async with websockets.connect(url.replace("http", "ws", 1) + "/_stcore/stream", subprotocols=["streamlit"],
                                      origin=url, max_size=None) as ws:
            session = ProtocolSession(ws)
            start = time.perf_counter()
            await session.rerun(query=urlencode(lesson.query(args.step)))
            # the link's page: a first run switches to the step's page, the second draws it with the grid
            while not any(key.startswith("prune-grid-") for key in session.widgets) or not session.query:
                await session.until(finished, args.timeout)
            out["open_s"] = time.perf_counter() - start
            total = shape[0] * shape[1]
            for k, layer, head, think in clicks_of(index, args, shape):
                await asyncio.sleep(think)
                grid = [key for key in session.widgets if key.startswith("prune-grid-")][-1]   # the newest grid
                event = {"selection": {"points": [{"customdata": [layer, head]}], "point_indices": [], "box": [],
                                       "lasso": []}}
                sent = time.perf_counter()
                await session.rerun(widget=(grid, json.dumps(event)))
                first = await session.until(shows(f"{total - k} / {total}", metric), args.timeout)
                await session.until(finished, args.timeout)
                toggled = any(f"toggled layer {layer} · head {head}" in text for text in session.texts)
                record_click(out, k, layer, head, first - sent, toggled)
    except Exception as exc:  # noqa: BLE001 - as in `student`: a failure is a result
        out["errors"].append(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:200]}")
    return out


def browser_students(students: int, browsers: int | None) -> set[int]:
    """Which students open a real page (spread evenly over the arrivals); the others speak the protocol."""
    browsers = students if browsers is None else min(browsers, students)
    return {round(i * students / browsers) for i in range(browsers)} if browsers else set()


def server_process(url: str):
    import psutil

    port = url.rsplit(":", 1)[1]
    return next(p for p in psutil.Process().children(recursive=True)
                if "streamlit" in " ".join(p.cmdline()) and port in p.cmdline())


def cpu_seconds(proc) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def chromium_cpu_s() -> float:
    """User + system CPU seconds of the live Chromium processes (a renderer per student, GPU/utility processes)."""
    import psutil

    total = 0.0
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name():
                total += cpu_seconds(p)
        except psutil.Error:
            pass
    return total


def chromium_pss_mb() -> float:
    import psutil

    total = 0
    for p in psutil.Process().children(recursive=True):
        try:
            if "chrom" in p.name():
                info = p.memory_full_info()
                total += getattr(info, "pss", info.rss)
        except psutil.Error:
            pass
    return total / 2**20


class Sampler:
    """The peak RSS of one process, sampled every 0.2 s in a thread."""

    def __init__(self, proc):
        self.proc, self.peak, self.stop = proc, 0, threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.2)


async def run_class(url: str, args, lesson, shape, metric: str, server) -> tuple[list[dict], dict]:
    from playwright.async_api import async_playwright

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=args.chromium, args=bench_browser.CHROMIUM_ARGS)
        # one visit first: the server loads the model and data once (a teacher opens the page before class)
        warm = await student(browser, url, -1, 0, argparse.Namespace(**{**vars(args), "clicks": 0}), lesson, shape,
                             metric)
        if warm["errors"]:
            raise RuntimeError(f"the warm-up visit failed: {warm['errors']}")
        rss0 = server.memory_info().rss
        cpu0 = cpu_seconds(server), chromium_cpu_s()
        sampler = Sampler(server)
        sampler.thread.start()
        spread = args.arrive_over / args.students if args.students else 0
        began = time.perf_counter()
        seen: dict[int, dict] = {}
        in_browser = browser_students(args.students, args.browsers)
        tasks = [asyncio.create_task(student(browser, url, i, i * spread, args, lesson, shape, metric, seen)
                                      if i in in_browser else
                                      protocol_student(url, i, i * spread, args, lesson, shape, metric, seen))
                 for i in range(args.students)]
        _, pending = await asyncio.wait(tasks, timeout=args.deadline)
        for task in pending:      # past --deadline: what they did so far counts, the rest is an error
            task.cancel()
        results = [seen[i] for i in range(args.students)]
        for task, out in zip(tasks, results):
            if task in pending:
                out["errors"].append(f"unfinished at the {args.deadline:g} s deadline ({len(out['clicks'])} clicks)")
        wall = time.perf_counter() - began
        rss1 = server.memory_info().rss   # every student's session still open
        cpu1 = cpu_seconds(server), chromium_cpu_s()
        chromium = chromium_pss_mb()
        sampler.stop.set()
        await browser.close()
    return results, {"rss0_mb": rss0 / 2**20, "rss_mb": rss1 / 2**20, "peak_mb": max(sampler.peak, rss1) / 2**20,
                     "per_student_mb": (rss1 - rss0) / 2**20 / max(args.students, 1), "chromium_pss_mb": chromium,
                     "wall_s": wall, "warm_open_s": warm.get("open_s"),
                     "server_cpu_s": cpu1[0] - cpu0[0], "chromium_cpu_s": cpu1[1] - cpu0[1]}


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--students", type=int, default=30)
    parser.add_argument("--arrive-over", type=float, default=60.0, help="seconds over which students arrive "
                                                                         "(0: all at once)")
    parser.add_argument("--browsers", type=int, help="how many of the students use a real Chromium page (spread "
                                                      "over the arrivals); the others send the same messages over "
                                                      "Streamlit's websocket protocol, their browsers elsewhere "
                                                      "(default: all in Chromium)")
    parser.add_argument("--clicks", type=int, default=5)
    parser.add_argument("--think", type=think_range, default="3-8", help="seconds a student reads before each "
                                                                          "click: S, or A-B drawn per click")
    parser.add_argument("--eval-size", type=int, help="the server's evaluation rows (HEADPRUNE_EVAL_SIZE; default: "
                                                      "the dashboard's own)")
    parser.add_argument("--nice-browser", action="store_true", help="run Chromium at nice 19 (the students' "
                                                                    "browsers yield the cores to the server)")
    parser.add_argument("--lesson", default="most-heads-can-go")
    parser.add_argument("--step", type=int, default=2, help="the lesson's step (from 1); it must open the Prune page")
    parser.add_argument("--model", default="demo", help="the server's start-up model and data (the lesson's own)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds any one wait may take")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds after the first arrival when "
                                                                       "the run stops and reports what was done")
    parser.add_argument("--streamlit-flag", action="append", default=[], metavar="--NAME=VALUE",
                        help="passed to `streamlit run` (repeatable), e.g. --streamlit-flag=--runner.postScriptGC=true "
                             "for Streamlit's default")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--shots", type=Path, help="save a screenshot of each student that failed in this folder")
    args = parser.parse_args()
    from headprune.lessons import SHIPPED, load_lessons, named_shape
    from headprune.viewstate import PAGE_NAMES

    lessons, errors = load_lessons([SHIPPED], pages=PAGE_NAMES)
    lesson = lessons[args.lesson]
    if lesson.steps[args.step - 1].state.page != "prune":
        sys.exit(f"step {args.step} of {args.lesson} opens {lesson.steps[args.step - 1].state.page}, not prune")
    shape = named_shape(lesson.model)
    metric = "perplexity" if lesson.model in ("demo-lm", "demo-circuit") else "accuracy"
    env = {"HEADPRUNE_MODEL": args.model, "HEADPRUNE_DATA": args.model, "MALLOC_ARENA_MAX": "2"}
    if args.eval_size:
        env["HEADPRUNE_EVAL_SIZE"] = str(args.eval_size)
    with tempfile.TemporaryDirectory() as tmp, \
            bench_browser.streamlit_server(ROOT, env, Path(tmp) / "server.log", start_timeout=300,
                                           flags=tuple(args.streamlit_flag)) as url:
        args.chromium = bench_browser.CHROMIUM
        if args.nice_browser:   # a wrapper: every process Chromium forks inherits the niceness
            args.chromium = str(Path(tmp) / "chromium-nice")
            Path(args.chromium).write_text(f'#!/bin/sh\nexec nice -n 19 {bench_browser.CHROMIUM} "$@"\n')
            os.chmod(args.chromium, 0o755)
        server = server_process(url)
        results, memory = asyncio.run(run_class(url, args, lesson, shape, metric, server))
    clicks = [c["first_s"] for r in results for c in r["clicks"]]
    seen_in_browser = [c["first_s"] for r in results if r["browser"] for c in r["clicks"]]
    over_protocol = [c["first_s"] for r in results if not r["browser"] for c in r["clicks"]]
    opens = [r["open_s"] for r in results if "open_s" in r and r["browser"]]
    errors = [f"student {r['student']}: {e}" for r in results for e in r["errors"]]
    load = os.getloadavg()
    print(f"{args.students} students, {args.lesson} step {args.step} ({lesson.model}), {args.clicks} clicks each, "
          f"arriving over {args.arrive_over:g} s, think {args.think[0]:g}-{args.think[1]:g} s; one Chromium"
          f"{' at nice 19' if args.nice_browser else ''}, one context per browser student "
          f"({len(browser_students(args.students, args.browsers))} of {args.students}; the others over the "
          f"websocket protocol); evaluation rows "
          f"{args.eval_size or 'default'}; "
          f"{os.cpu_count()} CPUs, load average {load[0]:.1f} / {load[1]:.1f} at the end")
    for name, values in (("in the browser", seen_in_browser), ("over the protocol (no drawing)", over_protocol)):
        if values:
            print(f"click → first number {name}: p50 {statistics.median(values):.2f} s, p90 "
                  f"{percentile(values, 0.9):.2f} s, max {max(values):.2f} s over {len(values)} clicks")
    if opens:
        print(f"link → page idle in the browser: p50 {statistics.median(opens):.1f} s, max {max(opens):.1f} s "
              f"(warm-up visit {memory['warm_open_s']:.1f} s)")
    print(f"errors: {len(errors)}" + "".join(f"\n  {e}" for e in errors[:20]))
    print(f"server RSS: {memory['rss0_mb']:.0f} MB before, {memory['rss_mb']:.0f} MB after, peak "
          f"{memory['peak_mb']:.0f} MB; {memory['per_student_mb']:.0f} MB per student; Chromium PSS "
          f"{memory['chromium_pss_mb']:.0f} MB; wall {memory['wall_s']:.0f} s")
    server_cpu, cores = memory["server_cpu_s"], os.cpu_count()
    print(f"CPU over the class: server {server_cpu:.0f} s ({server_cpu / max(len(clicks), 1):.2f} s a click, page "
          f"opens included), Chromium {memory['chromium_cpu_s']:.0f} s, of {cores * memory['wall_s']:.0f} "
          f"core-seconds on {cores} CPUs")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "students": results,
                                         "memory": memory, "load": load}, indent=1))


if __name__ == "__main__":
    main()
