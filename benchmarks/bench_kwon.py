"""Kwon et al.'s retrain-free pruning against SAP, SAP+CF and HIS on the demo.  ``python benchmarks/bench_kwon.py``

Demo classifier (MiniLM-L6 sentiment, 6 x 12 heads), ``--eval-size`` held-out rows of ``demo``, ``--calib-size``
calibration rows (re-drawn per repeat, ``Workspace.calibration_draw``) and ``--select-size`` selection rows (SAP's k
and CF's choices). At each sparsity s of 0.25 / 0.5 / 0.75, retrain-free, for ``--repeats`` repeats:

    sap            SAP's own selection at s (its best k on the selection rows; ``protocol.cells.mask_at``)
    sap-cf         whatever ``sap-cf`` is on this branch, scored as a protocol cell scores it (sparsity s)
    kwon-search    Kwon et al.'s Fisher mask search alone at budget 1 - s (rearrange=false, tune=false)
    kwon           search + rearrangement + mask tuning at budget 1 - s (the tuned, real-valued mask), with the
                   reference code's choices (kwon's defaults: per-32-example-batch Fisher, the partly pruned
                   teacher, layer 0 not tuned, the bias column)
    kwon-search-today, kwon-today   the same with the earlier defaults (per-example Fisher, the dense teacher, every
                   layer tuned, no bias column): the two rows side by side on the same rows and repeats
    his            HIS's order, kept_at(s)

accuracy on the evaluation rows (mean ± sd over repeats). Time: one HIS pass (a fresh scoring context: forward +
backward over the calibration rows) against one full Kwon run at budget 0.5 on a fresh context (Fisher pass +
search + rearrangement + tuning), median of ``--time-repeats``; target: Kwon ≤ 3x a HIS pass.
Cells are printed as they finish and appended to ``--log`` (JSON lines). Run it with ``nice -n 10``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from headprune.criteria import get  # noqa: E402
from headprune.data import calibration_texts  # noqa: E402
from headprune.evaluation.metrics import evaluate  # noqa: E402
from headprune.model.layers import skip_layers  # noqa: E402
from headprune.protocol.cells import mask_at, scored_params  # noqa: E402
from headprune.scoring import ScoringContext  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402

TODAY = {"fisher_batch": 1, "teacher": "dense", "skip_first_layer": False, "bias_column": False}
METHODS = {"kwon-search": ("kwon", {"rearrange": False, "tune": False}), "kwon": ("kwon", {}),
           "kwon-search-today": ("kwon", {"rearrange": False, "tune": False, **TODAY}),
           "kwon-today": ("kwon", TODAY), "his": ("his", {}), "sap": ("sap", {}), "sap-cf": ("sap-cf", {})}


def context(ws: Workspace, batches: list[dict], texts: list, seed: int) -> ScoringContext:
    loaded = ws.loaded
    return ScoringContext(loaded.model, batches, None, loaded.device, loaded.tokenizer, texts, seed=seed,
                          select=ws.select_batches or None)


def accuracy(ws: Workspace, mask, dropped) -> float:
    with skip_layers(ws.adapter, dropped):
        return ws.metric_of(evaluate(ws.loaded.model, ws.eval_batches, mask, task=ws.task))


def timings(ws: Workspace, repeats: int) -> dict:
    """Median seconds of one HIS pass and of one full Kwon run (budget 0.5), each on a fresh context."""
    texts = ws.calib_texts()
    his, kwon, stages = [], [], []
    for _ in range(repeats):
        ctx = context(ws, ws.calib_batches, texts, 0)
        start = time.perf_counter()
        get("his")(ctx, {})
        his.append(time.perf_counter() - start)
        ctx = context(ws, ws.calib_batches, texts, 0)
        start = time.perf_counter()
        scores = get("kwon")(ctx, {"budget": 0.5})
        kwon.append(time.perf_counter() - start)
        stages.append(scores.meta["seconds"])
    return {"his_seconds": statistics.median(his), "kwon_seconds": statistics.median(kwon),
            "ratio": statistics.median(kwon) / statistics.median(his),
            "kwon_stages": {k: statistics.median(s[k] for s in stages) for k in stages[0]},
            "calib_rows": len(ws.calib), "repeats": repeats}


def print_table(log: Path) -> None:
    """The mean ± sd accuracy per (method, sparsity) of the cells in ``log`` (several processes' repeats)."""
    rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    cells: dict[tuple[str, float], list[float]] = {}
    for row in rows:
        if "method" in row:
            cells.setdefault((row["method"], row["sparsity"]), []).append(row["accuracy"])
        else:
            print(json.dumps(row))
    sparsities = sorted({s for _, s in cells})
    print("| method | " + " | ".join(f"{s:.0%}" for s in sparsities) + " |")
    print("|---|" + "---|" * len(sparsities))
    for name in dict.fromkeys(m for m, _ in cells):
        values = [cells.get((name, s), []) for s in sparsities]
        print(f"| {name} | " + " | ".join(
            f"{statistics.mean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0:.3f} (n={len(v)})" if v else "—"
            for v in values) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--calib-size", type=int, default=128)
    ap.add_argument("--select-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only-repeat", type=int, help="run this repeat alone (several processes at once; the table is "
                                                      "then made from the --log lines)")
    ap.add_argument("--time-repeats", type=int, default=3)
    ap.add_argument("--sparsities", default="0.25,0.5,0.75")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--log", default="bench_kwon.jsonl")
    ap.add_argument("--table", action="store_true", help="print the table of the cells in --log and stop")
    args = ap.parse_args()
    if args.table:
        print_table(Path(args.log))
        return
    torch.manual_seed(0)
    ws = Workspace.build("demo", "demo", calib_size=args.calib_size, eval_size=args.eval_size,
                         select_size=args.select_size, seed=0, device="cpu")
    log = Path(args.log)
    dense = ws.metric_of(ws.dense())
    print(json.dumps({"dense": dense, "metric": ws.metric, "eval_rows": len(ws.eval)}), flush=True)
    if args.time_repeats:
        time_row = timings(ws, args.time_repeats)
        print(json.dumps({"timing": time_row}), flush=True)
        with log.open("a") as f:
            f.write(json.dumps({"timing": time_row}) + "\n")
    sparsities = [float(s) for s in args.sparsities.split(",")]
    results: dict[tuple[str, float], list[float]] = {}
    for repeat in range(args.repeats) if args.only_repeat is None else [args.only_repeat]:
        calib, batches = ws.calibration_draw(repeat)
        texts = calibration_texts(calib, batches)
        ctx = context(ws, batches, texts, repeat)       # one context per repeat: Fisher / HIS / parses shared
        for name in args.methods.split(","):
            criterion, fixed = METHODS[name]
            crit = get(criterion)
            for s in sparsities:
                start = time.perf_counter()
                scores = crit(ctx, scored_params(crit, fixed, s))
                mask, dropped = mask_at(scores, s)
                acc = accuracy(ws, mask, dropped)
                cell = {"method": name, "sparsity": s, "repeat": repeat, "accuracy": acc,
                        "pruned": mask.n_pruned, "scaled": mask.is_scaled, "seconds": time.perf_counter() - start}
                results.setdefault((name, s), []).append(acc)
                with log.open("a") as f:
                    f.write(json.dumps(cell) + "\n")
                print(json.dumps(cell), flush=True)
    print(f"\ndense {ws.metric} {dense:.3f} on {len(ws.eval)} held-out rows; {args.repeats} repeats "
          f"(calibration {len(ws.calib)} rows, selection {len(ws.select) if ws.select is not None else 0})")
    print("| method | " + " | ".join(f"{s:.0%}" for s in sparsities) + " |")
    print("|---|" + "---|" * len(sparsities))
    for name in args.methods.split(","):
        row = []
        for s in sparsities:
            v = results[name, s]
            row.append(f"{statistics.mean(v):.3f} ± {statistics.stdev(v) if len(v) > 1 else 0:.3f}")
        print(f"| {name} | " + " | ".join(row) + " |")
    if args.time_repeats:
        print(f"\ntime: HIS pass {time_row['his_seconds']:.2f} s, Kwon (Fisher + search + rearrangement + tuning) "
              f"{time_row['kwon_seconds']:.2f} s = {time_row['ratio']:.2f}x; stages {time_row['kwon_stages']}")


if __name__ == "__main__":
    main()
