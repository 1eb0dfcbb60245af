"""Does recovery win back what pruning lost?  ``python benchmarks/bench_recover.py [--quick]``

Demo classifier (MiniLM-L6, 6 x 12 heads): heads pruned at 50% and 75% in the order of HIS, SAP-CF and random
(scored on 64 calibration rows of ``demo``), recovered by full fine-tuning on ``--train-size`` rows of
``demo:train`` (seeded draw) for 1 epoch (and ``--epochs-long`` for HIS at 75%); dense / pruned / recovered
accuracy on ``--eval-size`` held-out rows of ``demo``, the share of the lost accuracy regained

    regained = (acc_recovered − acc_pruned) / (acc_dense − acc_pruned)      target at 75%: ≥ 0.5 within 10 min

and the wall time of the training. Distillation against plain fine-tuning at equal steps (HIS, 75%).
LM demo (6-layer Llama, 8 query / 2 key-value heads) at 50% (HIS order): LoRA, full fine-tuning and distillation
on ``--lm-train-size`` rows of ``demo-lm:train``; perplexity before and after, time, trainable parameters.
Training speed: seconds per optimizer step of the cut model against the dense one, next to the ideal FLOPs ratio
(``evaluation.speed.count_flops`` at the batch's mean length).

Cells are printed as they finish (and appended to ``--log`` as JSON lines), the tables at the end. Every run is
seeded; wall times on a shared machine vary by tens of percent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from headprune.criteria import get  # noqa: E402
from headprune.data import align_labels, load_data  # noqa: E402
from headprune.evaluation.speed import count_flops  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402
from headprune.model.surgery import prune_model  # noqa: E402
from headprune.recovery import RecoveryRun, RecoverySpec, headline_gain, stage_metrics  # noqa: E402
from headprune.recovery.train import collate  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402


def masks_for(ws: Workspace, criteria: list[str], ratios: list[float], seed: int) -> dict:
    """{(criterion, ratio): HeadMask} from one score map per criterion."""
    out = {}
    for name in criteria:
        crit = get(name)
        ctx = ws.scoring_context(None)
        ctx.seed = seed
        scores = crit(ctx, {})
        for ratio in ratios:
            out[name, ratio] = HeadMask(torch.as_tensor(scores.kept_at(ratio), dtype=torch.float32))
    return out


def train_rows(spec: str, size: int, seed: int, id2label: dict | None):
    ds = load_data(spec, task=None if id2label else "lm")
    ds = ds.subset(np.sort(np.random.default_rng(seed).permutation(len(ds))[:size]))
    return align_labels(ds, id2label) if id2label else ds


def one_cell(ws: Workspace, mask: HeadMask, train, spec: RecoverySpec, log: Path, **label) -> dict:
    with tempfile.TemporaryDirectory() as work:
        run = RecoveryRun(spec, ws.loaded.model, ws.loaded.tokenizer, mask, train, work_dir=work, task=ws.task)
        estimate = run.estimate().seconds
        result = run.run()
    metrics = stage_metrics(ws.loaded.model, mask, result, ws.eval_batches, task=ws.task)
    cell = {**label, "method": spec.method, "epochs": spec.epochs, "steps": result.steps,
            "train_seconds": round(result.seconds, 1), "estimate_seconds": round(estimate, 1),
            "trainable": result.trainable_parameters, "metrics": metrics,
            "regained": headline_gain(metrics, ws.metric)}
    with log.open("a") as f:
        f.write(json.dumps(cell) + "\n")
    print(json.dumps(cell), flush=True)
    return cell


def step_seconds(model, rows, spec: RecoverySpec, repeats: int) -> float:
    """Median seconds of one forward + backward + AdamW step at ``spec.batch_size`` rows."""
    model = model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    batch = collate([rows[i] for i in range(spec.batch_size)], 0)
    times = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        torch.nn.functional.cross_entropy(out.logits, batch["labels"]).backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - start)
    return float(np.median(times[1:]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train-size", type=int, default=2000)
    p.add_argument("--eval-size", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--epochs-long", type=int, default=3)
    p.add_argument("--lm-train-size", type=int, default=1000)
    p.add_argument("--parts", default="cls75,speed,distill,lm,cls50,long",
                   help="what to run, in this order: cls75, cls50, distill, long, lm, speed")
    p.add_argument("--criteria", default="his,sap-cf,random")
    p.add_argument("--log", default="/tmp/bench_recover.jsonl")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    log = Path(args.log)
    parts = args.parts.split(",")
    criteria = args.criteria.split(",")
    cells = []
    ws = Workspace.build("demo", "demo", calib_size=64, eval_size=args.eval_size, seed=0)
    train = train_rows("demo:train", args.train_size, 0, ws.loaded.id2label)
    spec = RecoverySpec(method="finetune", epochs=1, lr=args.lr, batch_size=args.batch_size, seed=0,
                        freeze_embeddings=True, max_length=64)
    masks = masks_for(ws, criteria, [0.5, 0.75], seed=0)
    print(f"masks ready; dense accuracy {ws.dense().accuracy:.4f}", flush=True)
    for part in parts:
        if part in ("cls75", "cls50"):
            ratio = 0.75 if part == "cls75" else 0.5
            for name in criteria:
                cells.append(one_cell(ws, masks[name, ratio], train, spec, log, model="demo", criterion=name,
                                      ratio=ratio))
        elif part == "distill":
            cells.append(one_cell(ws, masks["his", 0.75], train, RecoverySpec(**{**spec.__dict__, "method": "distill"}),
                                  log, model="demo", criterion="his", ratio=0.75))
        elif part == "long":   # HIS only: three epochs of every criterion would not fit a shared 2-core machine
            for name in criteria[:1]:
                cells.append(one_cell(ws, masks[name, 0.75], train,
                                      RecoverySpec(**{**spec.__dict__, "epochs": args.epochs_long}), log,
                                      model="demo", criterion=name, ratio=0.75))
        elif part == "speed":
            from headprune.recovery.train import Rows
            rows = Rows(ws.loaded.tokenizer, train, 64)
            length = int(np.mean([len(r["input_ids"]) for r in rows.rows[:spec.batch_size]]))
            dense = prune_model(ws.loaded.model, HeadMask.ones(ws.shape))   # a trainable copy
            dense.get_input_embeddings().weight.requires_grad_(False)
            t_dense = step_seconds(dense, rows, spec, 5)
            for ratio in (0.5, 0.75):
                cut = prune_model(ws.loaded.model, masks["his", ratio])
                cut.get_input_embeddings().weight.requires_grad_(False)
                t_cut = step_seconds(cut, rows, spec, 5)
                flops = count_flops(ws.loaded.model, length).total / count_flops(cut, length).total
                cell = {"part": "speed", "ratio": ratio, "dense_step_s": round(t_dense, 3),
                        "cut_step_s": round(t_cut, 3), "measured_speedup": round(t_dense / t_cut, 2),
                        "ideal_forward_flops_ratio": round(flops, 2), "seq_len": length}
                cells.append(cell)
                print(json.dumps(cell), flush=True)
        elif part == "lm":
            lm = Workspace.build("demo-lm", "demo-lm", calib_size=32, eval_size=200, seed=0)
            lm_mask = masks_for(lm, ["his"], [0.5], seed=0)["his", 0.5]
            lm_train = train_rows("demo-lm:train", args.lm_train_size, 0, None)
            for method, lr in (("lora", 1e-3), ("finetune", 1e-4), ("distill", 1e-4)):
                lm_spec = RecoverySpec(method=method, epochs=1, lr=lr, batch_size=16, seed=0, max_length=64)
                cells.append(one_cell(lm, lm_mask, lm_train, lm_spec, log, model="demo-lm", criterion="his",
                                      ratio=0.5))
    print_tables(cells)


def print_tables(cells: list[dict]) -> None:
    print("\n| model | criterion | pruned | method | epochs | steps | dense | pruned | recovered | regained | "
          "train s | trainable |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        if c.get("part") == "speed":
            continue
        m = c["metrics"]
        key = "perplexity" if c["model"] == "demo-lm" else "accuracy"
        regained = "–" if c["regained"] is None else f"{c['regained']:.2f}"
        print(f"| {c['model']} | {c['criterion']} | {c['ratio']:.0%} | {c['method']} | {c['epochs']} | "
              f"{c['steps']} | {m['dense'][key]:.4g} | {m['pruned'][key]:.4g} | {m['recovered'][key]:.4g} | "
              f"{regained} | {c['train_seconds']:.0f} | {c['trainable']:,} |")
    speed = [c for c in cells if c.get("part") == "speed"]
    if speed:
        print("\n| heads pruned | dense s/step | cut s/step | measured speed-up | ideal (forward FLOPs) |")
        print("|---|---|---|---|---|")
        for c in speed:
            print(f"| {c['ratio']:.0%} | {c['dense_step_s']} | {c['cut_step_s']} | {c['measured_speedup']}x | "
                  f"{c['ideal_forward_flops_ratio']}x |")


if __name__ == "__main__":
    main()
