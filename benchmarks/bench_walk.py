"""The long random walk of issue 45: several seeded walks through the dashboard in headless Chromium, then the same
walks again with CPU burners running beside the server; invariant failures by kind and timings printed.

    python benchmarks/bench_walk.py [--seeds 1 2 3] [--actions 700] [--burners 2] [--eval-size 64]
                                    [--json out.json]

One server (``streamlit run app.py`` from this checkout, the demo by default; ``--eval-size`` sets
HEADPRUNE_EVAL_SIZE, 0 keeps each demo's own split) and one Chromium serve every walk. Each seed walks
``--actions`` actions over the three demos (``benchmarks/walk.py``: what a walk does and the invariants it checks
after every action). Then, with ``--burners`` processes of ``while 1: pass`` running at normal priority (a server
shared with other work), the first seed is walked again. Printed per walk and in total: actions, invariant checks,
failures by invariant (each failure listed), running intervals seen and how many held the exact value, seconds per
action kind, and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_browser  # noqa: E402
import walk  # noqa: E402


def burners(n: int) -> list[subprocess.Popen]:
    """``n`` processes spinning a CPU each, at normal priority (whatever this script's own priority is)."""
    return [subprocess.Popen([sys.executable, "-c", "import os; os.setpriority(os.PRIO_PROCESS, 0, 0)\nwhile 1: pass"],
                             preexec_fn=None) for _ in range(n)]


def walk_once(browser, url: str, seed: int, actions: int, label: str) -> walk.WalkReport:
    print(f"\n== {label}: seed {seed}, {actions} actions (load average {os.getloadavg()[0]:.1f})", flush=True)
    report = walk.Walk(browser, url, seed, log=lambda line: print(line, flush=True)).run(actions)
    print("\n".join(report.lines()), flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}", flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--actions", type=int, default=700, help="actions per seed")
    parser.add_argument("--burners", type=int, default=2, help="CPU burners for the loaded walk (0: none)")
    parser.add_argument("--eval-size", type=int, default=64, help="HEADPRUNE_EVAL_SIZE (0: each demo's own split)")
    parser.add_argument("--log", type=Path, default=Path("/tmp/bench_walk_server.log"))
    parser.add_argument("--json", type=Path, help="write the reports here")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    env = {"HEADPRUNE_CALIB_SIZE": "32", "HEADPRUNE_MAX_LENGTH": "64"}
    if args.eval_size:
        env["HEADPRUNE_EVAL_SIZE"] = str(args.eval_size)
    reports: dict[str, walk.WalkReport] = {}
    with bench_browser.streamlit_server(ROOT, env, args.log, start_timeout=600) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=bench_browser.CHROMIUM, args=bench_browser.CHROMIUM_ARGS)
        for seed in args.seeds:
            reports[f"seed {seed}"] = walk_once(browser, url, seed, args.actions, "walk")
        if args.burners:
            spinning = burners(args.burners)
            try:
                time.sleep(5)
                seed = args.seeds[0]
                reports[f"seed {seed}, {args.burners} burners"] = walk_once(
                    browser, url, seed, args.actions, f"walk with {args.burners} CPU burners")
            finally:
                for proc in spinning:
                    proc.kill()
        browser.close()
    total = walk.WalkReport(seed=-1)
    for report in reports.values():
        total.merge(report)
    print(f"\n== all walks ({os.cpu_count()} CPUs)")
    print("\n".join(total.lines()))
    if args.json:
        args.json.write_text(json.dumps({name: {"actions": dict(r.actions), "failures": [str(f) for f in r.failures],
                                                "by_invariant": dict(r.by_invariant()), "checks": r.checks,
                                                "intervals": r.intervals, "covered": r.covered, "wall": r.wall}
                                         for name, r in reports.items()}, indent=1))


if __name__ == "__main__":
    main()
