"""How fast every head at a glance draws: the model view's thumbnails in a real browser, timed from page load.

    python benchmarks/bench_model_view.py [--model demo] [--repeats 3] [--screenshot FILE]

Starts ``streamlit run app.py`` (``bench_browser.streamlit_server``) with HEADPRUNE_MODEL / HEADPRUNE_DATA =
``--model`` and the small test splits, warms the server up once (the model loads, the sentence's attention is
captured and stored), then opens ``/heads`` in a new tab of the same browser profile ``--repeats`` times (each
a new Streamlit session; the browser's cache holds the page's scripts, as on a student's second visit). Per load,
timed in the browser (``performance.now()``, 0 = navigation start):

* **page load**: the browser's ``load`` event (Streamlit's shell is up; the script runs after it);
* **title**: the page's title is drawn (the script started: Streamlit's own session start, the same on any page);
* **thumbnails**: the atlas image (one PNG holding every head's map, an ``st.image``) is decoded, and the buttons
  that open a head (a row of ``st.pills`` per layer) are drawn.

Measured 2026-11-26 on the 2-core box, load average ~4-6 (other agents' jobs), demo (72 heads), median of 3:
before (the image under a Plotly click layer) 2353 ms after page load, after (st.image + st.pills rows) 1069 ms
(same machine, minutes apart; a second run of the final layout: 1405 ms at load ~4).

Prints them, thumbnails after page load and after the title, the medians over repeats, and the number of heads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from app_support import SMALL  # noqa: E402  (the test suite's small splits)

spec = importlib.util.spec_from_file_location("bench_browser", ROOT / "benchmarks" / "bench_browser.py")
bench_browser = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_browser)

# resolves with (time the atlas image was decoded, number of head buttons) once the image is decoded and the
# buttons that open a head (one row of st.pills per layer) are on the page
ATLAS_DRAWN = """() => new Promise(resolve => {
  const check = () => {
    const figure = [...document.querySelectorAll('[data-testid="stImage"]')]
      .find(f => f.innerText.includes('rows: layers'));
    const image = figure && figure.querySelector('img');
    const heads = [...document.querySelectorAll('[class*="st-key-glance-pick-"] button')].length;
    if (image && image.complete && image.naturalWidth > 0 && heads > 0) {
      image.decode().then(() => resolve([performance.now(), heads]));
      return;
    }
    requestAnimationFrame(check);
  };
  check();
})"""


def measure(context, url: str, screenshot: Path | None = None) -> dict:
    page = context.new_page()
    page.goto(f"{url}/heads", wait_until="load")
    page.get_by_role("heading", name="Every head at a glance").wait_for()
    title = page.evaluate("() => performance.now()")
    drawn, heads = page.evaluate(ATLAS_DRAWN)
    loaded = page.evaluate("() => performance.getEntriesByType('navigation')[0].loadEventEnd")
    if screenshot is not None:
        bench_browser.wait_settled(page)
        page.screenshot(path=str(screenshot), full_page=True)
    page.close()
    return {"page_load_ms": loaded, "title_ms": title, "thumbnails_ms": drawn, "after_load_ms": drawn - loaded,
            "after_title_ms": drawn - title, "heads": heads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--screenshot", type=Path)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = {**SMALL, "HEADPRUNE_MODEL": args.model, "HEADPRUNE_DATA": args.model}
    with tempfile.TemporaryDirectory() as tmp, \
            bench_browser.streamlit_server(ROOT, env, Path(tmp) / "server.log", start_timeout=300) as url, \
            sync_playwright() as p:
        browser = p.chromium.launch(executable_path=bench_browser.CHROMIUM, args=bench_browser.CHROMIUM_ARGS)
        # one browser profile, as a student's: the first load fetches the page's scripts (plotly.js among them) and
        # loads the model on the server; each repeat is a new tab (a new Streamlit session) with the browser's cache
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        warm = measure(context, url)
        runs = [measure(context, url, args.screenshot if i == 0 else None) for i in range(args.repeats)]
        browser.close()
    for run in runs:
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in run.items()}))
    after_load = statistics.median(r["after_load_ms"] for r in runs)
    after_title = statistics.median(r["after_title_ms"] for r in runs)
    print(f"{args.model}: {runs[0]['heads']} thumbnails drawn {after_load:.0f} ms after page load, {after_title:.0f} "
          f"ms after the page title (median of {len(runs)}; the first, cold: {warm['after_load_ms']:.0f} ms)")


if __name__ == "__main__":
    main()
