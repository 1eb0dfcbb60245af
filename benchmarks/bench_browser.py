"""What a person feels on the Prune page: click a head cell in a real browser, time the first and the exact number.

    python benchmarks/bench_browser.py --model demo [--eval-size 500] [--clicks-per-layer 2] [--root DIR]
    python benchmarks/bench_browser.py --model demo-lm
    git archive <commit> | tar -x -C /tmp/before && python benchmarks/bench_browser.py --baseline /tmp/before

``--baseline`` serves an older checkout at the same time and clicks both in turn (same heads), so a change in a
shared machine's load hits before and after alike. Starts ``streamlit run app.py`` (from ``--root``, the
repository by default) on 127.0.0.1 at a free port with HEADPRUNE_MODEL / HEADPRUNE_DATA = ``--model``,
drives headless Chromium through Playwright to the Prune page, waits until the page is idle, then clicks head cells
of the mask grid: ``--clicks-per-layer`` passes over the layers, each pass pruning a different head per layer. Per
click, timed in Python from just before the mouse click:

* **first number**: the "heads left" metric shows the new count and the headline metric (accuracy or perplexity)
  shows a number that belongs to this run (its element is not stale): a running estimate or the exact value;
* **exact number**: the headline metric shows the exact full-set value (no "±" / "≈" of a running estimate).

Before a progressive page both are the same moment. The page is left idle between clicks (the next click starts
from a settled page, as a person's would). The servers are stopped at the end. Prints per layer the median and the
maximum of both, then the overall p50 and the worst layer (highest median); ``--json`` writes every click.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run"]

# The page's numbers, read in the browser. A metric's element is stale while a rerun has not redrawn it yet.
READ_METRICS = """() => {
  const out = {};
  for (const box of document.querySelectorAll('[data-testid="stMetric"]')) {
    const label = box.querySelector('[data-testid="stMetricLabel"]');
    const value = box.querySelector('[data-testid="stMetricValue"]');
    if (!label || !value) continue;
    const stale = !!box.closest('[data-stale="true"]');
    out[label.innerText.trim()] = {value: value.innerText.trim(), stale: stale};
  }
  return out;
}"""
NUMBER = re.compile(r"\d+\.\d+")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def streamlit_server(root: Path, env: dict, log: Path, start_timeout: float = 300, python: str = sys.executable,
                     watcher: str | None = "none", script: str = "app.py", flags: tuple[str, ...] = ()):
    """``python -m streamlit run <script> <flags>`` in ``root``; yields its URL once healthy, stops it on exit.

    ``watcher`` is passed as ``--server.fileWatcherType``; None passes nothing, so the checkout's own
    ``.streamlit/config.toml`` decides (as for a user who types the README's command)."""
    port = free_port()
    watch = [] if watcher is None else ["--server.fileWatcherType", watcher]
    with open(log, "w") as out:
        proc = subprocess.Popen([python, "-m", "streamlit", "run", script, "--server.headless", "true",
                                 "--server.port", str(port), "--server.address", "127.0.0.1",
                                 "--browser.gatherUsageStats", "false", *watch, *flags],
                                cwd=root, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + start_timeout
        while True:
            try:
                urllib.request.urlopen(f"{url}/_stcore/health", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.time() > deadline:
                    raise RuntimeError(f"streamlit did not start:\n{log.read_text()}") from None
                time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_settled(page, timeout_ms: float = 600_000) -> None:
    """No element is stale and the status widget shows no running script (then a moment for plotly to draw)."""
    page.wait_for_timeout(300)
    page.wait_for_function(
        "() => !document.querySelector('[data-stale=\"true\"]') && (!document.querySelector("
        "'[data-testid=\"stStatusWidget\"]') || !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        ".innerText.includes('Running'))", timeout=timeout_ms)
    page.wait_for_timeout(300)


def headline_name(metrics: dict) -> str:
    for name in ("accuracy", "perplexity", "pearson", "loss"):
        if name in metrics:
            return name
    raise RuntimeError(f"no headline metric on the Prune page (metrics shown: {sorted(metrics)})")


def shown(page, heads_left: str, metric: str, exact: bool) -> bool:
    """Does the page show ``heads_left`` and a current (``exact``: final) number for ``metric``?"""
    metrics = page.evaluate(READ_METRICS)
    left, value = metrics.get("heads left"), metrics.get(metric)
    if left is None or value is None or left["value"] != heads_left or left["stale"] or value["stale"]:
        return False
    if not NUMBER.search(value["value"]):
        return False
    return not exact or not any(mark in value["value"] for mark in ("±", "≈"))


def poll(page, condition, timeout: float = 600.0, step_ms: int = 15) -> float:
    """Seconds (perf_counter) at which ``condition()`` first holds."""
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the Prune page did not show the number in time")
        page.wait_for_timeout(step_ms)
    return time.perf_counter()


def grid_size(page) -> tuple[int, int]:
    """(layers, heads) from the sidebar's 'heads (L × H): **a × b**' line."""
    text = page.locator('[data-testid="stSidebar"]').inner_text()
    match = re.search(r"heads \(L × H\): (\d+) × (\d+)", text)
    if not match:
        raise RuntimeError("could not read the grid size from the sidebar")
    return int(match.group(1)), int(match.group(2))


def click_cell(page, layer: int, head: int, n_heads: int) -> None:
    """Click the grid's transparent click marker of (layer, head): point layer·H + head of the 'heads' trace."""
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .scatterlayer .point').length > 0",
                           timeout=120_000)
    # the points drawn on screen: a grid in a tab or expander not shown has points without a box
    cell = page.locator(".js-plotly-plot .scatterlayer .point:visible").nth(layer * n_heads + head)
    cell.scroll_into_view_if_needed()     # a mouse click lands where the viewport shows it: below the fold, elsewhere
    box = cell.bounding_box()
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)


def nav(page, title: str):
    """The sidebar's navigation link of the page called ``title`` (its icon before it): the role name alone matches
    by substring, and "Prune" found "What the pruned model says" first once the pages were grouped in sections."""
    return page.locator('[data-testid="stSidebarNav"] a',
                        has_text=re.compile(rf"^\W*{re.escape(title)}\s*$")).first


def open_prune(browser, url: str):
    """A page on the Prune page of the server at ``url``, settled; (page, layers, heads, headline metric)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    page.set_default_timeout(600_000)
    page.goto(url)  # home first: a first visit straight to /prune also runs the main page once
    page.get_by_text("heads left").first.wait_for()
    wait_settled(page)
    nav(page, "Prune").click()
    page.get_by_text("parameters left").first.wait_for()
    wait_settled(page)
    n_layers, n_heads = grid_size(page)
    return page, n_layers, n_heads, headline_name(page.evaluate(READ_METRICS))


def timed_click(page, layer: int, head: int, n_heads: int, left: str, metric: str) -> dict:
    """Click (layer, head) and time the first and the exact number (see the module docstring)."""
    start = time.perf_counter()
    click_cell(page, layer, head, n_heads)
    first = poll(page, lambda: shown(page, left, metric, exact=False)) - start
    exact = poll(page, lambda: shown(page, left, metric, exact=True)) - start
    value = page.evaluate(READ_METRICS)[metric]["value"]
    wait_settled(page)
    if not page.get_by_text(f"toggled layer {layer} · head {head}").count():
        raise RuntimeError(f"the click on layer {layer}, head {head} toggled another head")
    return {"layer": layer, "head": head, "first_s": first, "exact_s": exact, "metric": metric, "value": value}


def run(model: str, eval_size: int, clicks_per_layer: int, roots: dict[str, Path], log: Path,
        url: str | None = None, python: str = sys.executable, watcher: str | None = "none",
        env: dict | None = None, data: str | None = None) -> dict[str, list[dict]]:
    """Clicks on the Prune page of one server per entry of ``roots`` (name -> checkout), all up at once and
    clicked in turn, the same head on each: a change in the machine's load hits every checkout alike.
    ``python`` and ``watcher`` start the servers (see ``streamlit_server``); ``env`` is added to theirs; ``data``:
    the data served (default ``model``, for the demos)."""
    from playwright.sync_api import sync_playwright

    env = {**(env or {}), "HEADPRUNE_MODEL": model, "HEADPRUNE_DATA": data or model,
           "HEADPRUNE_EVAL_SIZE": str(eval_size), "HEADPRUNE_CALIB_SIZE": "64"}
    clicks: dict[str, list[dict]] = {name: [] for name in roots}
    with ExitStack() as stack:
        urls = {name: stack.enter_context(nullcontext(url) if url else
                                          streamlit_server(root, env, log.with_suffix(f".{name}.log"),
                                                           python=python, watcher=watcher))
                for name, root in roots.items()}
        p = stack.enter_context(sync_playwright())
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        pages = {name: open_prune(browser, u) for name, u in urls.items()}
        print("Prune pages ready", file=sys.stderr)
        _, n_layers, n_heads, metric = next(iter(pages.values()))
        total = n_layers * n_heads
        pruned = 0
        for round_ in range(clicks_per_layer):
            for layer in range(n_layers):
                head = (3 * round_ + layer) % n_heads
                pruned += 1
                for name, (page, *_rest) in pages.items():
                    c = timed_click(page, layer, head, n_heads, f"{total - pruned} / {total}", metric)
                    clicks[name].append(c)
                    print(f"  {name}: layer {layer} head {head}: first {c['first_s']:.2f} s, exact "
                          f"{c['exact_s']:.2f} s ({metric} {c['value']})", file=sys.stderr)
    return clicks


def summary(clicks: list[dict]) -> dict:
    by_layer: dict[int, list[dict]] = {}
    for c in clicks:
        by_layer.setdefault(c["layer"], []).append(c)
    rows = {layer: {kind: (statistics.median(c[f"{kind}_s"] for c in cs), max(c[f"{kind}_s"] for c in cs))
                    for kind in ("first", "exact")} for layer, cs in sorted(by_layer.items())}
    worst = max(rows, key=lambda layer: rows[layer]["first"][0])
    return {"layers": rows, "first_p50": statistics.median(c["first_s"] for c in clicks),
            "exact_p50": statistics.median(c["exact_s"] for c in clicks), "worst_layer": worst,
            "worst_first_p50": rows[worst]["first"][0], "first_max": max(c["first_s"] for c in clicks),
            "exact_max": max(c["exact_s"] for c in clicks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", help="demo | demo-lm (also used as the data)")
    parser.add_argument("--eval-size", type=int, default=500)
    parser.add_argument("--clicks-per-layer", type=int, default=2)
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout whose app.py is served")
    parser.add_argument("--baseline", type=Path, help="an older checkout (e.g. git archive of a commit) served at "
                                                      "the same time and clicked in turn, for a fair before/after")
    parser.add_argument("--log", type=Path, default=Path("/tmp/bench_browser_server.log"))
    parser.add_argument("--json", type=Path, help="write every click here")
    parser.add_argument("--url", help="use this running server (same model; not with --baseline)")
    args = parser.parse_args()
    if not Path(CHROMIUM).exists():
        sys.exit(f"{CHROMIUM} not found: install Debian's chromium")
    roots = {"this": args.root.resolve()}
    if args.baseline:
        roots = {"baseline": args.baseline.resolve(), **roots}
    clicks = run(args.model, args.eval_size, args.clicks_per_layer, roots, args.log, args.url)
    print(f"Prune page, {args.model}, {args.eval_size} evaluation rows, {args.clicks_per_layer} click(s) per layer"
          f" ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end)")
    for name, root in roots.items():
        s = summary(clicks[name])
        print(f"\n{name} ({root})")
        print("layer | click → first number p50 / max (s) | click → exact number p50 / max (s)")
        for layer, row in s["layers"].items():
            print(f"{layer:5d} | {row['first'][0]:6.2f} / {row['first'][1]:5.2f}"
                  f"                   | {row['exact'][0]:6.2f} / {row['exact'][1]:5.2f}")
        print(f"all   | first p50 {s['first_p50']:.2f} s (max {s['first_max']:.2f}), worst layer {s['worst_layer']} "
              f"p50 {s['worst_first_p50']:.2f} s | exact p50 {s['exact_p50']:.2f} s (max {s['exact_max']:.2f})")
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "eval_size": args.eval_size, "clicks": clicks,
                                         "summaries": {n: summary(c) for n, c in clicks.items()}},
                                        indent=1, default=str))

if __name__ == "__main__":
    main()
