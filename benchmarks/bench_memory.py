"""Peak memory and time of evaluation and scoring on real-sized decoders (random weights, no download).

    python benchmarks/bench_memory.py [--models smollm,qwen] [--methods evaluate,his,ae,kl] [--rows 8,32,128]
                                      [--kl-layers N] [--repo CHECKOUT] [--budget 4GB] [--threads 2]

Two random-init causal LMs with the real shapes of SmolLM2-135M (LlamaConfig: 30 layers, hidden 576, 9 query / 3
key-value heads, intermediate 1536, vocabulary 49,152, tied embeddings) and Qwen2.5-0.5B (Qwen2Config: 24 layers,
hidden 896, 14 / 2 heads, intermediate 4864, vocabulary 151,936, tied embeddings), in float32; ``--models pythia``
adds Pythia-160M's (GPTNeoXConfig: 12 layers, hidden 768, 12 heads in a fused head-interleaved query_key_value,
intermediate 3072, vocabulary 50,304, a quarter of each head rotary, parallel residual, untied output). The data
are random token ids, every row 128 tokens long, in batches of 32 rows (the CLI's default ``--batch-size``).

Every case (model x method x rows) runs in its own subprocess, so its peak resident set size (``ru_maxrss`` of the
child, which includes building the model) is its own. ``--repo`` runs the cases against another checkout's
``headprune`` (e.g. the main branch before the memory planner) through PYTHONPATH; the default is this checkout.
``--kl-layers N`` gates every head of the layers >= N to 0 first, so KL ablates the heads of the first N layers only
(the full 0.5B run takes most of an hour on 2 cores): its time then covers N of the layers, its peak is the peak of
a full run (every layer's ablations hold the same tensors). ``--budget`` passes a memory budget where the checkout
has a planner (default: its default share of free memory).

Prints one row per case: seconds, peak RSS (GB), the model's size (GB, float32 weights) the budget the planner
used and the duration it told beforehand (``headprune.estimate``; where the checkout has them), then the whole
table as JSON on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "smollm": ("LlamaConfig", dict(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                                   intermediate_size=1536, vocab_size=49152, max_position_embeddings=2048,
                                   tie_word_embeddings=True)),
    "qwen": ("Qwen2Config", dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                 intermediate_size=4864, vocab_size=151936, max_position_embeddings=2048,
                                 tie_word_embeddings=True)),
    # Pythia-160M (issue 47: a fused head-interleaved query_key_value, partial rotary, parallel residual)
    "pythia": ("GPTNeoXConfig", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                     intermediate_size=3072, vocab_size=50304, max_position_embeddings=2048,
                                     use_parallel_residual=True, tie_word_embeddings=False,
                                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                      "partial_rotary_factor": 0.25})),
}
SEQ_LEN = 128
BATCH_ROWS = 32


def build(name: str):
    import torch
    import transformers

    torch.manual_seed(0)
    cls_name, kwargs = SHAPES[name]
    config = getattr(transformers, cls_name)(**kwargs)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    return model


def batches(rows: int, vocab: int) -> list[dict]:
    import torch

    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (rows, SEQ_LEN), generator=gen)
    out = []
    for start in range(0, rows, BATCH_ROWS):
        chunk = ids[start:start + BATCH_ROWS]
        out.append({"input_ids": chunk, "attention_mask": torch.ones_like(chunk), "labels": chunk.clone(),
                    "index": list(range(start, start + len(chunk)))})
    return out


def _kl_mask(model, kl_layers: int | None):
    """Every head of the layers >= ``kl_layers`` gated to 0 (None: no mask), so KL ablates the first layers only."""
    import torch

    from headprune.model.mask import HeadMask

    if kl_layers is None:
        return None
    values = torch.ones(model.config.num_hidden_layers, model.config.num_attention_heads)
    values[kl_layers:] = 0
    return HeadMask(values)


def child(name: str, method: str, rows: int, kl_layers: int | None, budget: str | None) -> dict:
    """One case in this process: build, run, report seconds and the peak RSS."""
    import inspect

    from headprune.criteria import ScoringContext, get
    from headprune.evaluation.metrics import evaluate

    try:  # the planner, where this checkout has one
        from headprune.model import memory
    except ImportError:
        memory = None
    model = build(name)
    data = batches(rows, model.config.vocab_size)
    planned = {}
    if memory is not None:
        planned["budget_gb"] = round(memory.resolve_budget(budget, "cpu") / 1e9, 2)
        budget_arg = {"memory_budget": memory.resolve_budget(budget, "cpu")}
    else:
        budget_arg = {}
    if memory is not None:   # the time told beforehand (headprune.estimate), next to the time measured
        from headprune import estimate

        mask = _kl_mask(model, kl_layers) if method == "kl" else None
        ctx = ScoringContext(model, data, mask, memory_budget=budget_arg["memory_budget"])
        told = estimate.estimate_evaluation(model, data, memory_budget=budget_arg["memory_budget"]) \
            if method == "evaluate" else estimate.estimate_scoring(ctx, [method])
        planned["estimate_s"] = round(told.seconds, 1)
    start = time.perf_counter()
    if method == "evaluate":
        kwargs = budget_arg if "memory_budget" in inspect.signature(evaluate).parameters else {}
        evaluate(model, data, **kwargs)
    else:
        mask = _kl_mask(model, kl_layers) if method == "kl" else None
        ctx_fields = inspect.signature(ScoringContext).parameters
        ctx = ScoringContext(model, data, mask, **({k: v for k, v in budget_arg.items() if k in ctx_fields}))
        get(method)(ctx, {})
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # kB on Linux
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"model": name, "method": method, "rows": rows, "seconds": round(seconds, 1),
            "peak_gb": round(peak / 1e9, 2), "model_gb": round(size / 1e9, 2), **planned,
            **({"kl_layers": kl_layers} if method == "kl" and kl_layers is not None else {})}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm,qwen")
    parser.add_argument("--methods", default="evaluate,his,ae,kl")
    parser.add_argument("--rows", default="8,32,128")
    parser.add_argument("--kl-layers", type=int, default=None, help="ablate the heads of the first N layers only")
    parser.add_argument("--repo", default=str(ROOT), help="checkout whose headprune runs the cases")
    parser.add_argument("--budget", default=None, help="memory budget, e.g. 4GB (default: the planner's default)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "METHOD", "ROWS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        name, method, rows = args.child
        print(json.dumps(child(name, method, int(rows), args.kl_layers, args.budget)))
        return []
    table = []
    env = {**os.environ, "PYTHONPATH": str(Path(args.repo).resolve()), "OMP_NUM_THREADS": str(args.threads)}
    print(f"headprune from {Path(args.repo).resolve()}; {args.threads} threads; rows of {SEQ_LEN} tokens in batches "
          f"of {BATCH_ROWS}", flush=True)
    for name in args.models.split(","):
        for method in args.methods.split(","):
            for rows in (int(r) for r in args.rows.split(",")):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", name, method, str(rows),
                       "--threads", str(args.threads)]
                cmd += ["--kl-layers", str(args.kl_layers)] if args.kl_layers is not None else []
                cmd += ["--budget", args.budget] if args.budget else []
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd="/")
                if done.returncode != 0:
                    row = {"model": name, "method": method, "rows": rows, "exit": done.returncode,
                           "error": done.stderr.strip()[-300:]}
                else:
                    row = json.loads(done.stdout.strip().splitlines()[-1])
                table.append(row)
                print(" | ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    print(json.dumps(table))
    return table


if __name__ == "__main__":
    main()
