"""Why the dashboard runs no file watcher (issue 25): a CPU-bound training loop inside ``streamlit run``, in a
checkout with its ``.venv`` inside, under each of Streamlit's watchers, in turn.

    python benchmarks/bench_watcher.py --layout /tmp/fs/clone [--steps 8] [--rounds 1]

``--layout`` is a clone with a virtualenv inside (``benchmarks/bench_first_start.py`` makes one). A probe script
written next to its ``app.py`` (removed afterwards) imports headprune (so its modules are registered with the
watcher, as the dashboard's are), trains a 6-layer transformer encoder (d=384, batch 4x64, AdamW) for ``--steps``
steps in the server's script thread and shows the step times and each thread's CPU seconds; headless Chromium opens
it. Configurations: ``none`` (the dashboard's), ``poll``, ``auto`` (Streamlit's default: watchdog / inotify) and
``auto`` with ``server.folderWatchBlacklist = [".venv"]``. Prints per configuration the median and fastest step and
the CPU seconds of the script thread and of the watcher's (watchdog's inotify) threads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "bench_watcher_probe.py"
CONFIGS = {"none": ("none", ()), "poll": ("poll", ()), "auto": ("auto", ()),
           "auto + blacklist .venv": ("auto", ("--server.folderWatchBlacklist", ".venv"))}
PROBE_SOURCE = '''
import json, os, threading, time
import streamlit as st
import torch
import headprune  # noqa: F401  (registered with the watcher, as the dashboard's modules are)

torch.manual_seed(0)
model = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(384, 12, 1536, batch_first=True), 6)
opt = torch.optim.AdamW(model.parameters(), 1e-4)
x = torch.randn(4, 64, 384)
steps = []
for _ in range(int(os.environ["PROBE_STEPS"])):
    t = time.perf_counter()
    model(x).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
    steps.append(time.perf_counter() - t)

def cpu(tid):
    fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

threads = {f"{type(t).__module__}.{type(t).__name__}:{t.name}": cpu(t.native_id) for t in threading.enumerate()}
st.text("PROBE " + json.dumps({"steps": steps, "threads": threads}))
'''


def bench_browser():
    spec = importlib.util.spec_from_file_location("bench_browser", ROOT / "benchmarks" / "bench_browser.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(browser, layout: Path, watcher: str, flags: tuple[str, ...], steps: int, log: Path) -> dict:
    bb = bench_browser()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PROBE_STEPS=str(steps), PYTHONPATH=str(layout))
    with bb.streamlit_server(layout, env, log, python=str(layout / ".venv" / "bin" / "python3"), watcher=watcher,
                             script=PROBE, flags=flags) as url:
        page = browser.new_page()
        page.goto(url)
        text = page.locator("[data-testid=stText]", has_text="PROBE {").first
        text.wait_for(timeout=1_800_000)
        result = json.loads(text.inner_text().split("PROBE ", 1)[1])
        page.close()
    script = sum(v for k, v in result["threads"].items() if "ScriptRunner" in k)
    inotify = sum(v for k, v in result["threads"].items() if "inotify" in k.lower())
    return {"median": statistics.median(result["steps"]), "min": min(result["steps"]), "script_cpu": script,
            "watcher_cpu": inotify, "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", type=Path, required=True, help="a clone with its .venv inside")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1, help="passes over the configurations, in turn")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    bb = bench_browser()
    layout = args.layout.resolve()
    (layout / PROBE).write_text(PROBE_SOURCE)
    rows = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=bb.CHROMIUM, args=[*bb.CHROMIUM_ARGS, "--headless"])
            for round_ in range(args.rounds):
                for name, (watcher, flags) in CONFIGS.items():
                    r = measure(browser, layout, watcher, flags, args.steps, Path(f"/tmp/bench_watcher.{watcher}.log"))
                    rows.append((round_, name, r))
                    print(f"round {round_} {name}: {json.dumps(r)}", file=sys.stderr)
            browser.close()
    finally:
        (layout / PROBE).unlink()
    print(f"training step inside `streamlit run`, {layout} (.venv inside), {os.cpu_count()} CPUs")
    print("round | watcher                 | step median / min (s) | script thread CPU (s) | watcher threads CPU (s)"
          " | load")
    for round_, name, r in rows:
        print(f"{round_:5d} | {name:23s} | {r['median']:7.2f} / {r['min']:5.2f}       | {r['script_cpu']:21.1f} | "
              f"{r['watcher_cpu']:23.1f} | {r['load']:.1f}")


if __name__ == "__main__":
    main()
