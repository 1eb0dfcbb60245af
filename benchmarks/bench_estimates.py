"""Running estimates on the Prune page: do the intervals shown hold the exact value at their stated rate (issue 35)?

    python benchmarks/bench_estimates.py [--demos demo demo-lm] [--clicks 60] [--seed 0] [--threads 1]
                                         [--json out.json]

For each demo the dashboard's workspace is built with its default sizes (500 evaluation rows, batches of 32) and
one ``LiveEvaluator`` takes ``--clicks`` random clicks: each prunes a random kept head (or, one time in three once
heads are pruned, restores a random pruned one), as a user clicking the grid does. Every click draws its batches in
a fresh seeded order (``LiveEvaluator``); ``on_estimate`` records each running estimate with the time since the
click. After the click the exact value is known, and every estimate the page would show as a number
(``Estimate.shown``: its 95% interval narrower than the width rule, not yet exact) is checked against it.

Printed per demo: the fraction of shown intervals that hold the exact value (stated rate 0.95; the issue asks for
0.90-1.00), the same over every interval with two batches or more (shown or not), the share of clicks that showed
a number before the exact value, and how soon the first number shows (batches done, seconds after the click,
against the seconds to the exact value). The first estimate's error is also given, signed against the exact value,
mean over clicks: a fixed first batch made it point the same way on every click (issue 35).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headprune.evaluation.live import LiveEvaluator  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402


def click(mask, rng: random.Random) -> tuple[int, int]:
    """A random head of the grid to toggle: a kept one to prune, or (1 in 3 once some are pruned) a pruned one."""
    keep = mask.keep_bool()
    pruned = (~keep).nonzero().tolist()
    kept = keep.nonzero().tolist()
    if pruned and (rng.random() < 1 / 3 or len(kept) <= 1):
        return tuple(rng.choice(pruned))
    return tuple(rng.choice(kept))


def run(demo: str, clicks: int, seed: int) -> dict:
    ws = Workspace.build(demo, demo, seed=seed)
    live = LiveEvaluator(ws.loaded.model, ws.eval_batches, seed=seed)
    rng = random.Random(seed)
    shown_hits, all_hits, first_errors, first_batches, first_seconds, exact_seconds = [], [], [], [], [], []
    showed = 0
    for _ in range(clicks):
        seen: list = []
        start = time.perf_counter()
        metrics = live.toggle(*click(live.mask, rng),
                              on_estimate=lambda e, seen=seen: seen.append((e, time.perf_counter())))
        exact = ws.metric_of(metrics)
        exact_seconds.append(time.perf_counter() - start)
        running = [(e, t - start) for e, t in seen if not e.exact]
        if running:
            first_errors.append(running[0][0].value - exact)
        all_hits += [e.covers(exact) for e, _ in running if e.low is not None]
        shown = [(e, t) for e, t in running if e.shown]
        shown_hits += [e.covers(exact) for e, _ in shown]
        if shown:
            showed += 1
            first_batches.append(shown[0][0].done)
            first_seconds.append(shown[0][1])
        else:
            first_batches.append(len(ws.eval_batches))
            first_seconds.append(exact_seconds[-1])
    rule = seen[-1][0].rule if seen else ""

    def mean(values):
        return round(statistics.fmean(values), 4) if values else None

    return {"demo": demo, "metric": ws.metric, "clicks": clicks, "batches": len(ws.eval_batches),
            "rows": len(ws.eval), "rule": rule,
            "shown_intervals": len(shown_hits), "shown_coverage": mean(shown_hits),
            "all_intervals": len(all_hits), "all_coverage": mean(all_hits),
            "clicks_with_a_number_before_exact": showed,
            "first_number_batches_median": statistics.median(first_batches),
            "first_number_seconds_median": round(statistics.median(first_seconds), 3),
            "exact_seconds_median": round(statistics.median(exact_seconds), 3),
            "first_estimate_error_mean": mean(first_errors),
            "first_estimate_above_exact_share": mean([e > 0 for e in first_errors])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demos", nargs="+", default=["demo", "demo-lm"])
    parser.add_argument("--clicks", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    for demo in args.demos:
        result = run(demo, args.clicks, args.seed)
        results.append(result)
        print(json.dumps(result, indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
