"""A protocol's cells on parallel workers: ``python benchmarks/bench_shards.py [--skip-runs]``

1. ``protocols/demo.toml`` (13 cells on the demo classifier) run twice from the command line, each in a fresh
   results folder: ``--executor local`` (one process, torch's default threads) and ``--executor pool --workers 2
   --threads 1``; wall times, and whether both ``results.csv`` are byte-equal.
2. The overhead a shard pays before its first cell, measured in this process: the model load and the data roles
   (workspace build + the repeat's calibration draw), and a fresh worker's imports (``python -c "import
   headprune.protocol.executors"``).
3. A model of the scaling past this machine for ``protocols/hies_table1.toml`` (8 BERT-base models x 13 cells):
   each model's cell time is ``--plan``'s estimate (a random-initialised BERT-base of the hub checkpoints' shape,
   timed here: one forward x counted passes, an upper bound; GLUE dev's row counts for the "all" evaluation
   roles), shards dealt by ``schedule.deal`` over W workers,

       T(W) = max over workers of (sum of its cells' estimated seconds + units x per-unit overhead)

   for W = 1, 4, 32 (one worker per GPU; the shards' cells are the same on a GPU, only each second shrinks).

The machine is shared: its load (``os.getloadavg``) is printed next to every number.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

import torch  # noqa: E402
from transformers import BertConfig  # noqa: E402

from headprune.protocol import Protocol, expand, plan  # noqa: E402
from headprune.protocol import cells as adapter  # noqa: E402
from headprune.protocol.schedule import deal  # noqa: E402

# GLUE's dev splits (rows), for the evaluation roles written "all" in hies_table1.toml
GLUE_DEV = {"sst2:validation": 872, "cola:validation": 1043, "mrpc:validation": 408, "qqp:validation": 40430,
            "stsb:validation": 1500, "qnli:validation": 5463, "mnli:validation_matched": 9815,
            "rte:validation": 277}


def load() -> str:
    return "load {:.1f}/{:.1f}/{:.1f}".format(*os.getloadavg())


def cli(args: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "headprune", *args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise SystemExit(f"headprune {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return time.perf_counter() - start


def runs(tmp: Path) -> dict:
    demo = str(ROOT / "protocols" / "demo.toml")
    before = load()
    seq = cli(["run", demo, "--out", str(tmp / "seq"), "--no-plots"])
    mid = load()
    pool = cli(["run", demo, "--out", str(tmp / "pool"), "--no-plots", "--executor", "pool", "--workers", "2",
                "--threads", "1"])
    same = (tmp / "seq" / "results.csv").read_text() == (tmp / "pool" / "results.csv").read_text()
    cells = [json.loads(p.read_text()) for p in (tmp / "seq" / "cells").glob("*.json")]
    return {"sequential_s": seq, "load_before_sequential": before, "pool2_s": pool, "load_before_pool": mid,
            "same_results_csv": same, "cells": len(cells), "cell_seconds_sum": sum(c["seconds"] for c in cells)}


def overhead() -> dict:
    torch.set_num_threads(1)   # as a pool worker on this machine
    protocol = Protocol.read(ROOT / "protocols" / "demo.toml")
    entry = protocol.models[0]
    start = time.perf_counter()
    loaded = adapter.load_model_for(entry, protocol)
    model_s = time.perf_counter() - start
    start = time.perf_counter()
    adapter.build_workspace_for(loaded, entry, protocol, 0, {})
    data_s = time.perf_counter() - start
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import headprune.protocol.executors"], check=True, env=env)
    import_s = time.perf_counter() - start
    return {"model_load_s": model_s, "data_roles_s": data_s, "worker_imports_s": import_s, "load": load()}


def scaling(tmp: Path, unit_overhead: float) -> dict:
    """The hies_table1 model (module doc): BERT-base's shape (BertConfig's defaults) for every checkpoint."""
    folder = tmp / "bert-base-shape"
    BertConfig(num_labels=3).save_pretrained(folder)   # 3: MNLI's head; the others' 2 change nothing measurable
    text = (ROOT / "protocols" / "hies_table1.toml").read_text(encoding="utf-8")
    text = re.sub(r'model = "textattack/[^"]+"', f'model = "{folder}"', text)
    for split, rows in GLUE_DEV.items():   # "all" of each dev split: its published row count (offline)
        text = text.replace(f'glue:{split}", size = "all"', f'glue:{split}", size = {rows}')
    protocol = Protocol.parse(text, "hies_table1.toml (BERT-base shape)", default_name="hies_table1")
    plans = plan(protocol, time_it=True)
    # a model's estimate spread evenly over its cells (its scoring passes too: a mean cell)
    per_cell = {p.entry.name: (p.seconds or 0.0) / len(p.cells) for p in plans}
    assert all(p.seconds for p in plans), [p.note for p in plans]
    out = {"cells": len(expand(protocol)), "estimate_s_total": sum(p.seconds or 0.0 for p in plans),
           "per_cell_s": per_cell, "unit_overhead_s": unit_overhead, "load": load()}
    for workers in (1, 4, 32):
        shards = deal(protocol, workers)
        times = [sum(per_cell[c.model] for u in s for c in u.cells) + len(s) * unit_overhead for s in shards]
        out[f"T({workers})_s"] = max(times)
        out[f"units({workers})"] = sum(len(s) for s in shards)
        out[f"busy({workers})"] = sum(times) / (workers * max(times))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--skip-runs", action="store_true", help="only the overhead and the scaling model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        result = {} if args.skip_runs else runs(tmp)
        print(json.dumps(result, indent=1), flush=True)
        over = overhead()
        print(json.dumps(over, indent=1), flush=True)
        model = scaling(tmp, over["model_load_s"] + over["data_roles_s"])
        print(json.dumps(model, indent=1), flush=True)


if __name__ == "__main__":
    main()
