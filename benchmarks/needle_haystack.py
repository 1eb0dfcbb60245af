"""Needle in a haystack on demo-long (issue 37): exact passkey retrieval by depth x length, dense and under KV plans.

For each window W: each rule's plan keeping its top ``--full-share`` of key/value groups full (S = ``--sink``),
the inverse plan (those groups streamed, the others full), and RazorAttention's plan with its compensation token;
then ``kvcache.longctx.measure`` (the ``evaluate --long-context passkey`` task) at every length, ``--rows`` rows
per length spread over the depths. Calibration: far-mass on passkey rows of ``--calib-length`` tokens (seed 1, not
the evaluation's seed 0: it needs rows where a head reads far); duo trains its gates on passkeys in the demo's
filler (its own rows, ``--calib-length``); razor on its repeated-token probes. Writes one JSON (``--json``) and
prints the dense table by depth and the plan table by length (markdown, the cells' row counts in brackets).

    nice -n 10 python benchmarks/needle_haystack.py --json niah.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from headprune.data import load_data
from headprune.kvcache.longctx import DEPTHS, measure, passkey_rows
from headprune.kvcache.scores import head_scores, plan_from_scores
from headprune.kvcache.tasks import invert
from headprune.model.loading import load_model


def batches_of(ids: torch.Tensor, size: int = 4) -> list[dict]:
    return [{"input_ids": ids[i:i + size], "attention_mask": torch.ones_like(ids[i:i + size])}
            for i in range(0, len(ids), size)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo-long")
    p.add_argument("--lengths", default="1024,2048,4096")
    p.add_argument("--rows", type=int, default=20, help="passkey rows per length (default: 20, 4 per depth)")
    p.add_argument("--windows", default="64,256")
    p.add_argument("--sink", type=int, default=4)
    p.add_argument("--full-share", type=float, default=0.25)
    p.add_argument("--rules", default="far-mass,duo,razor")
    p.add_argument("--calib-length", type=int, default=512)
    p.add_argument("--json", required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    loaded = load_model(args.model)
    model, tok = loaded.model, loaded.tokenizer
    texts = load_data(args.model).texts
    lengths = [int(x) for x in args.lengths.split(",")]
    calib = batches_of(passkey_rows(tok, texts, args.calib_length, 16, seed=1).input_ids)
    filler = batches_of(tok(texts[:8], return_tensors="pt")["input_ids"])
    n_kv = loaded.adapter.n_kv_heads
    plans, chosen = {"dense": None}, {}
    start = time.perf_counter()
    for window in [int(x) for x in args.windows.split(",")]:
        for rule in args.rules.split(","):
            scores = head_scores(rule, model, calib=filler if rule == "duo" else calib, tokenizer=tok,
                                 sink=args.sink, window=window, duo_options={"length": args.calib_length})
            plan = plan_from_scores(scores, n_kv, args.full_share, args.sink, window, meta={"rule": rule})
            plans[f"{rule} W={window}"] = plan
            plans[f"{rule} inverse W={window}"] = invert(plan)
            chosen[f"{rule} W={window}"] = {"full": plan.full.nonzero().tolist(),
                                            "group_scores": plan.meta["group_scores"]}
            if rule == "razor":
                plans[f"razor+compensation W={window}"] = plan.with_window(args.sink, window)
                plans[f"razor+compensation W={window}"].compensation = True
            print(f"{rule} W={window}: full groups {plan.full.nonzero().tolist()}", file=sys.stderr, flush=True)
    scoring_s = time.perf_counter() - start

    def progress(row):
        print(f"{row['plan']} at {row['length']}: {row['accuracy']:.2f} {row['by_depth']}", file=sys.stderr,
              flush=True)

    start = time.perf_counter()
    table = measure(model, tok, "passkey", lengths, plans, texts, rows=args.rows, seed=0, depths=DEPTHS,
                    batch_size=1, progress=progress)
    out = {"model": args.model, "lengths": lengths, "rows_per_length": args.rows, "depths": list(DEPTHS),
           "sink": args.sink, "full_share": args.full_share, "calib_length": args.calib_length,
           "plans": chosen, "table": table, "scoring_seconds": round(scoring_s, 1),
           "measure_seconds": round(time.perf_counter() - start, 1), "groups": int(np.prod(plans[next(
               k for k in plans if k != "dense")].shape))}
    with open(args.json, "w") as handle:
        json.dump(out, handle, indent=1)
    print(markdown(out))
    return 0


def markdown(out: dict) -> str:
    """The dense table by depth and the plan table by length (rows in brackets), as in kv-long-context.md."""
    lengths = out["lengths"]
    cells = {(row["plan"], row["length"]): row for row in out["table"]}
    head = "| {} | " + " | ".join(f"L = {n:,}" for n in lengths) + " |"
    rule = "|---|" + "---|" * len(lengths)
    lines = [head.format("depth"), rule]
    for depth in [f"{d:g}" for d in out["depths"]] + ["all"]:
        values = [cells[("dense", n)]["accuracy"] if depth == "all" else cells[("dense", n)]["by_depth"][depth]
                  for n in lengths]
        lines.append(f"| {depth} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
    lines += ["", head.format(f"plan (S = {out['sink']})"), rule]
    for plan in dict.fromkeys(row["plan"] for row in out["table"]):
        lines.append(f"| {plan} | " + " | ".join(
            f"{cells[(plan, n)]['accuracy']:.2f} ({cells[(plan, n)]['rows']})" for n in lengths) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
