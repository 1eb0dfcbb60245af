"""Does recovery with the shipped defaults win back what pruning lost?  ``python benchmarks/bench_recover.py``

Demo classifier (MiniLM-L6, 6 x 12 heads): heads pruned at 75% and 50% in the order of every criterion listed
(default: HIS, SAP, SAP+CF, Kwon et al. when the criterion is registered, random), each mask made as a protocol
cell makes it (``protocol.cells``: the criterion scored on 64 calibration rows of ``demo`` at the cell's sparsity,
``mask_at``; random with its own seed per sparsity). Each pruned model is recovered with ``RecoverySpec()``'s
defaults (only ``seed`` and ``max_length`` set; ``--spec`` overrides fields for an ablation, e.g. the recipe before
issue 29: ``--spec '{"method": "finetune", "lr": 1e-4, "dropout": true}'``) for one pass over ``--train-size``
rows of ``demo:train`` (a seeded draw; the demo's fine-tuning split, never an evaluation row), and dense / pruned /
recovered accuracy is measured on ``--eval-size`` held-out rows of ``demo``:

    regained = (acc_recovered − acc_pruned) / (acc_dense − acc_pruned)      target at 75%: ≥ 0.5 within 10 min

Noise: each accuracy is a mean of n Bernoulli outcomes, so its binomial standard error is √(p(1 − p) / n) (printed
as ``se``); a recovered cell "below its pruned cell beyond the noise" means below it by more than 2 × √2 × se (two
standard errors of the difference of two such accuracies, conservative for the same rows).
Time: the training's wall seconds and its process CPU seconds (load-independent: on a shared machine the wall time
is several times what 2 idle cores take; CPU seconds / 2 is what two fully used cores would need), with the load
average at the end.

Cells print as JSON lines as they finish (and append to ``--log``); ``--table LOG`` prints the markdown table of a
log, so cells may run in separate processes (``--cells his:0.75,random:0.75``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from headprune.criteria import available, get  # noqa: E402
from headprune.data import align_labels, load_data  # noqa: E402
from headprune.protocol.cells import cell_seed, mask_at, score_cell  # noqa: E402
from headprune.recovery import RecoveryRun, RecoverySpec, headline_gain, stage_metrics  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402

CRITERIA = ("his", "sap", "sap-cf", "kwon", "random")


def cell_mask(ws: Workspace, name: str, ratio: float):
    """The mask a protocol cell of ``name`` at ``ratio`` evaluates (``protocol.cells``), and its dropped layers."""
    crit = get(name)
    ctx = ws.scoring_context(None)
    ctx.seed = cell_seed(crit, 0, ratio)
    return mask_at(score_cell(ctx, crit, {}, ratio), ratio)


def train_rows(size: int, seed: int, id2label: dict):
    ds = load_data("demo:train")
    return align_labels(ds.subset(np.sort(np.random.default_rng(seed).permutation(len(ds))[:size])), id2label)


def one_cell(ws: Workspace, name: str, ratio: float, train, spec: RecoverySpec, log: Path) -> dict:
    mask, dropped = cell_mask(ws, name, ratio)
    with tempfile.TemporaryDirectory() as work:
        run = RecoveryRun(spec, ws.loaded.model, ws.loaded.tokenizer, mask, train, work_dir=work, task=ws.task)
        estimate = run.estimate().seconds
        cpu = time.process_time()
        result = run.run()
        cpu = time.process_time() - cpu
    metrics = stage_metrics(ws.loaded.model, mask, result, ws.eval_batches, task=ws.task)
    n = metrics["dense"]["n"]
    se = {k: math.sqrt(m["accuracy"] * (1 - m["accuracy"]) / n) for k, m in metrics.items()}
    cell = {"criterion": name, "ratio": ratio, "heads_pruned": mask.n_pruned, "dropped_layers": dropped,
            "spec": spec.to_json(), "steps": result.steps, "train_rows": len(train), "eval_rows": n,
            "train_seconds": round(result.seconds, 1), "train_cpu_seconds": round(cpu, 1),
            "estimate_seconds": round(estimate, 1), "load_average": round(os.getloadavg()[0], 1),
            "trainable": result.trainable_parameters,
            "accuracy": {k: m["accuracy"] for k, m in metrics.items()}, "se": se,
            "regained": headline_gain(metrics, "accuracy"),
            "below_pruned_beyond_noise": metrics["recovered"]["accuracy"] < metrics["pruned"]["accuracy"]
            - 2 * math.sqrt(2) * se["pruned"]}
    with log.open("a") as f:
        f.write(json.dumps(cell) + "\n")
    print(json.dumps(cell), flush=True)
    return cell


def print_table(cells: list[dict]) -> None:
    print("| criterion | pruned | steps | dense | pruned | recovered | regained | ± se | train s (wall) | "
          "train CPU s | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in sorted(cells, key=lambda c: (-c["ratio"], CRITERIA.index(c["criterion"])
                                          if c["criterion"] in CRITERIA else 99)):
        a = c["accuracy"]
        regained = "–" if c["regained"] is None else f"{c['regained']:.2f}"
        print(f"| {c['criterion']} | {c['ratio']:.0%} | {c['steps']} | {a['dense']:.3f} | {a['pruned']:.3f} | "
              f"{a['recovered']:.3f} | {regained} | {c['se']['pruned']:.3f} | {c['train_seconds']:.0f} | "
              f"{c['train_cpu_seconds']:.0f} | {c['load_average']} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cells", default=None,
                   help="criterion:ratio pairs, comma-separated (default: every --criteria at 0.75, then at 0.5)")
    p.add_argument("--criteria", default=",".join(c for c in CRITERIA if c in available()))
    # 4,096 rows (128 steps): at 2,048 SAP+CF's 75% mask won back 0.38 of its loss, at 4,096 every criterion >= 0.75
    p.add_argument("--train-size", type=int, default=4096, help="rows of demo:train (one pass: train-size / 32 steps)")
    p.add_argument("--eval-size", type=int, default=2000)
    p.add_argument("--spec", default="{}", help="RecoverySpec fields to override, as JSON (an ablation)")
    p.add_argument("--log", default="/tmp/bench_recover.jsonl")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--table", default=None, help="print the table of this log and exit")
    args = p.parse_args()
    if args.table:
        print_table([json.loads(line) for line in Path(args.table).read_text().splitlines() if line.strip()])
        return
    torch.set_num_threads(args.threads)
    cells = [(c.split(":")[0], float(c.split(":")[1])) for c in args.cells.split(",")] if args.cells else \
        [(name, ratio) for ratio in (0.75, 0.5) for name in args.criteria.split(",")]
    ws = Workspace.build("demo", "demo", calib_size=64, eval_size=args.eval_size, seed=0)
    train = train_rows(args.train_size, 0, ws.loaded.id2label)
    spec = RecoverySpec(**{"seed": 0, "max_length": 64, **json.loads(args.spec)})
    done = [one_cell(ws, name, ratio, train, spec, Path(args.log)) for name, ratio in cells]
    print()
    print_table(done)


if __name__ == "__main__":
    main()
