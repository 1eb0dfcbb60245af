"""KV cache plans measured (issue 32).

    nice -n 10 python benchmarks/bench_kv.py circuit [--seeds 10] [--window 4] [--sink 1] [--json OUT]
    nice -n 10 python benchmarks/bench_kv.py decode [--lengths 4096,16384,32768] [--dtypes float32,bfloat16]
                                             [--layers 24] [--new-tokens 8] [--repeats 1] [--device cpu] [--json OUT]
    nice -n 10 python benchmarks/bench_kv.py longctx [--seeds 3] [--rows 100] [--json OUT]
    nice -n 10 python benchmarks/bench_kv.py update [--lengths 4096,16384] [--steps 60] [--json OUT]
    nice -n 10 python benchmarks/bench_kv.py speed [--lengths 1024,2048,4096] [--layers 4] [--json OUT]

circuit   demo-circuit's repeated-half next-token accuracy (its evaluation rows, ``load_data("demo-circuit")``):
          dense; the plan keeping the induction + previous-token heads full (labels of ``roles.head_roles`` on the
          demo's calibration rows) and streaming the rest at sink S, window W; the plan streaming the induction
          heads instead (every other head full); random plans with as many full heads as the first (--seeds).
decode    a random decoder of Qwen2.5-0.5B's shape (14 query / 2 key-value heads, head size 64, hidden 896, MLP 4864,
          vocabulary 151936; --layers of its 24) in each of --dtypes, at each context length: the cache filled with
          random keys/values of that many tokens (``cache.fill_random``: a 32k prefill on a shared CPU takes minutes
          and does not change what a decode step costs), then --new-tokens + 1 real decode steps with each of
          --variants: transformers' DynamicCache, its StaticCache (eager, and compiled: ``generate(compile=True)``),
          the mixed cache of a random plan keeping --full-share of the key/value groups full (S=4, W=64; growing,
          eager; and static, compiled). Per variant: the median and range of the steps after the first (compiled:
          the first is the compile, on CUDA the second records the graph), their CPU seconds in the decoding thread
          (what the step costs, less stretched than the wall clock by a shared CPU's other load), the first step,
          the measured KV bytes (held, allocated) and the load average. Prints a markdown table per length x dtype.
          --device cuda: model and caches on the GPU (``generate`` reads each token back: the clock waits for the
          step's kernels).
update    one layer's cache update alone (Qwen2.5-0.5B's 2 key/value heads of size 64, fp32): filled with that
          many random keys/values, then --steps single-token updates timed, median per update, for transformers'
          DynamicLayer, a mixed layer with 1 full + 1 streaming head (S=4, W=64) and one with both heads full.
longctx   per context length (``kvcache.longctx``): the passkey task on demo-circuit (filler: demo-lm's held-out
          reviews; --rows rows per length, depths 0..1) dense, keeping the induction + previous-token heads full
          (S=1, W=4), the razor rule's plan with as many full heads, streaming the induction heads instead, random
          plans with as many full heads (--seeds); and
          long-row perplexity on demo-lm (its evaluation rows, 64 calibration rows apart; --tokens tokens per
          length) dense, the far-mass plan keeping 25% of the key/value heads full (S=4, W=16), every head streaming,
          random 25% plans (--seeds).
speed     a random decoder of Qwen2.5-0.5B's shape (--layers layers): a real prefill of each context length, then
          greedy decoding of --new-tokens: KV bytes (measured from the cache tensors) and time per output token with
          transformers' DynamicCache, its StaticCache (preallocated to the context + new tokens) and the mixed cache
          under a random plan keeping 25% of the key/value heads full (S = 4, W = 64 and 256).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headprune.kvcache.cache import cache_bytes, fill_random, generate  # noqa: E402
from headprune.kvcache.restrict import restricted  # noqa: E402
from headprune.kvcache.tasks import invert, metric_under_plan, random_plans, role_plan  # noqa: E402


def circuit(args) -> dict:
    from headprune.roles import head_roles
    from headprune.workspace import Workspace

    ws = Workspace.build("demo-circuit", "demo-circuit", calib_size=args.calib_size, eval_size=None)
    model, adapter = ws.loaded.model, ws.loaded.adapter
    report = head_roles(model, ws.loaded.tokenizer, ws.calib_batches)
    induction, previous = report.heads_with("induction"), report.heads_with("previous-token")
    n_kv = adapter.n_kv_heads
    keep = role_plan(induction | previous, n_kv, args.sink, args.window, {"rule": "induction+previous-token"})
    stream_induction = invert(role_plan(induction, n_kv, args.sink, args.window), {"rule": "stream induction"})
    metric = "next_token_accuracy"   # on the repeated half only (the demo data's targets)
    dense = metric_under_plan(model, ws.eval_batches, None).to_dict()[metric]
    kept = metric_under_plan(model, ws.eval_batches, keep).to_dict()[metric]
    streamed = metric_under_plan(model, ws.eval_batches, stream_induction).to_dict()[metric]
    randoms = [metric_under_plan(model, ws.eval_batches, p).to_dict()[metric]
               for p in random_plans(keep.shape, keep.n_heads, int(keep.full.sum()), range(args.seeds), args.sink,
                                     args.window)]
    return {"model": "demo-circuit", "eval_rows": sum(len(b["input_ids"]) for b in ws.eval_batches),
            "metric": metric, "sink": args.sink, "window": args.window, "dense": dense,
            "induction_heads": np.argwhere(induction).tolist(), "previous_token_heads": np.argwhere(previous).tolist(),
            "keep_induction_previous": {"full_heads": int(keep.full.sum()), metric: kept,
                                        "ratio_to_dense": kept / dense},
            "stream_induction": {"full_heads": int(stream_induction.full.sum()), metric: streamed,
                                 "ratio_to_dense": streamed / dense},
            "random_same_count": {"seeds": args.seeds, "values": randoms, "mean": statistics.mean(randoms),
                                  "min": min(randoms), "max": max(randoms)}}


def qwen_shape_model(seed: int = 0, layers: int = 24):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=896, intermediate_size=4864, num_hidden_layers=layers, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, use_sliding_window=False)
    return Qwen2ForCausalLM(config).eval()


VARIANTS = ("dynamic", "static", "static_compiled", "mixed", "mixed_compiled")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def decode_variant(model, plan, variant: str, length: int, dtype, new_tokens: int, device, layers: int) -> dict:
    """One variant's decode steps after ``length`` random keys/values (``fill_random``): the stock DynamicCache, the
    stock StaticCache (eager or compiled), the plan's mixed cache (growing, eager; or static, compiled). Returns the
    median and range of the decode steps after the first, the first step (with compile: the compile cost), the
    measured KV bytes (held, allocated), the tokens and the load average around the run."""
    from transformers import DynamicCache, StaticCache

    from headprune.kvcache.cache import MixedCache

    compiled = variant.endswith("_compiled")
    mixed = variant.startswith("mixed")
    if compiled:
        torch.compiler.reset()   # each compiled variant compiles afresh: its first step is the whole compile cost
    load = os.getloadavg()[0]
    with restricted(model, plan) if mixed else nullcontext(model) as runner:
        static = length + new_tokens + 1 if compiled or variant == "static" else None
        cache = (MixedCache(runner, static) if mixed else StaticCache(config=runner.config, max_cache_len=static)
                 if static else DynamicCache(config=runner.config))
        start = time.perf_counter()
        fill_random(cache, (layers, 2, 64), length, dtype=dtype, seed=1, device=device)
        fill_s = time.perf_counter() - start
        out = generate(runner, torch.tensor([[11]], device=device), new_tokens + 1, mode="mixed" if mixed else "full",
                       cache=cache, compile=compiled)
    # the steps after the first (compiled on CUDA: after the first two, the second records the CUDA graph)
    warmup = 2 if compiled and device.type == "cuda" else 1
    steps = out.step_s[warmup:]
    row = {"median_s": statistics.median(steps), "min_s": min(steps), "max_s": max(steps),
           "median_cpu_s": statistics.median(out.step_cpu_s[warmup:]),
           "first_step_s": sum(out.step_s[:warmup]), "fill_s": fill_s, "kv_bytes": cache_bytes(cache),
           "kv_bytes_allocated": cache_bytes(cache, allocated=True), "tokens": out.tokens,
           "load": [round(load, 2), round(os.getloadavg()[0], 2)]}
    del cache
    return row


def decode(args) -> dict:
    """Time per output token at each context length and dtype, for the stock caches and the plan's mixed cache
    (module doc); prints a markdown table per dtype and returns every row."""
    layers = args.layers
    device = torch.device(args.device)
    plan = random_plans((layers, 2), 14, round(args.full_share * layers * 2), [0], args.sink, args.window)[0]
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; accepted: {', '.join(VARIANTS)}")
    rows = []
    for dtype_name in args.dtypes.split(","):
        dtype = DTYPES[dtype_name]
        model = qwen_shape_model(layers=layers).to(device, dtype)
        for length in [int(x) for x in args.lengths.split(",")]:
            for repeat in range(args.repeats):
                row = {"context": length, "dtype": dtype_name, "repeat": repeat}
                for variant in variants:
                    row[variant] = decode_variant(model, plan, variant, length, dtype, args.new_tokens, device,
                                                  layers)
                    print(json.dumps({"context": length, "dtype": dtype_name, "variant": variant,
                                      **{k: v for k, v in row[variant].items() if k != "tokens"}}),
                          file=sys.stderr, flush=True)
                ideal = plan.ideal_bytes(length + args.new_tokens, 64, torch.finfo(dtype).bits // 8)
                row["ideal_byte_ratio"] = ideal["ratio"]
                rows.append(row)
        del model
    result = {"model": f"random Qwen2.5-0.5B shape, {layers} layers ({device})", "layers": layers,
              "full_kv_heads": int(plan.full.sum()), "kv_heads": plan.full.numel(), "sink": args.sink,
              "window": args.window, "new_tokens": args.new_tokens, "threads": torch.get_num_threads(),
              "device": str(device), "torch": torch.__version__, "rows": rows}
    print(decode_table(result), file=sys.stderr)
    return result


def decode_table(result: dict) -> str:
    """Milliseconds per output token (median of the decode steps after the first; the range over repeats and
    steps in brackets when there are several) per context x dtype, one column per variant, and the first compiled
    step (the compile cost) in seconds."""
    variants = [v for v in VARIANTS if v in result["rows"][0]]
    lines = ["| context | dtype | " + " | ".join(f"{v} ms/token" for v in variants) +
             " | mixed / best stock | CPU ms/token: " + ", ".join(variants) + " | compile s (static, mixed) |",
             "|---" * (len(variants) + 5) + "|"]
    keys = list(dict.fromkeys((r["context"], r["dtype"]) for r in result["rows"]))
    for context, dtype in keys:
        group = [r for r in result["rows"] if (r["context"], r["dtype"]) == (context, dtype)]
        cell = {}
        for v in variants:
            medians = [r[v]["median_s"] * 1000 for r in group]
            cell[v] = statistics.median(medians)
            low, high = min(r[v]["min_s"] for r in group) * 1000, max(r[v]["max_s"] for r in group) * 1000
            cell[v + "_text"] = f"{cell[v]:.1f} ({low:.1f}-{high:.1f})"
        stock = [cell[v] for v in variants if not v.startswith("mixed")]
        ours = [cell[v] for v in variants if v.startswith("mixed")]
        ratio = f"{min(ours) / min(stock):.2f}" if stock and ours else ""
        compile_s = ", ".join(f"{statistics.median(r[v]['first_step_s'] for r in group):.0f}"
                              for v in variants if v.endswith("_compiled"))
        cpu = ", ".join(f"{statistics.median(r[v]['median_cpu_s'] for r in group) * 1000:.0f}" for v in variants)
        lines.append(f"| {context:,} | {dtype} | " + " | ".join(cell[v + "_text"] for v in variants) +
                     f" | {ratio} | {cpu} | {compile_s} |")
    return "\n".join(lines)


def update(args) -> dict:
    from transformers.cache_utils import DynamicLayer

    from headprune.kvcache.cache import MixedLayer

    layers = {"stock DynamicLayer": DynamicLayer,
              "mixed, 1 full + 1 streaming": lambda: MixedLayer([False, True], 4, 64),
              "mixed, 2 full": lambda: MixedLayer([False, False], 4, 64)}
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        for name, make in layers.items():
            layer, gen = make(), torch.Generator().manual_seed(0)
            for start in range(0, length, 1024):
                t = min(1024, length - start)
                layer.update(torch.randn(1, 2, t, 64, generator=gen), torch.randn(1, 2, t, 64, generator=gen))
            times = []
            for _ in range(args.steps):
                k, v = torch.randn(1, 2, 1, 64, generator=gen), torch.randn(1, 2, 1, 64, generator=gen)
                start = time.perf_counter()
                layer.update(k, v)
                times.append(time.perf_counter() - start)
            rows.append({"context": length, "layer": name, "median_update_ms": 1000 * statistics.median(times)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return {"threads": torch.get_num_threads(), "steps": args.steps, "rows": rows}


def longctx(args) -> dict:
    from headprune.kvcache.longctx import measure
    from headprune.kvcache.plan import KVPlan
    from headprune.kvcache.scores import head_scores, plan_from_scores
    from headprune.roles import head_roles
    from headprune.workspace import Workspace

    seeds = range(args.seeds)
    ws = Workspace.build("demo-circuit", "demo-circuit", calib_size=64, eval_size=None)
    model, tok, n_kv = ws.loaded.model, ws.loaded.tokenizer, ws.loaded.adapter.n_kv_heads
    report = head_roles(model, tok, ws.calib_batches)
    induction, previous = report.heads_with("induction"), report.heads_with("previous-token")
    keep = role_plan(induction | previous, n_kv, 1, 4)
    n_full = int(keep.full.sum())
    razor = plan_from_scores(head_scores("razor", model, calib=[], tokenizer=tok, sink=1, window=4), n_kv,
                             n_full / keep.full.numel(), 1, 4)
    plans = {"dense": None, "keep induction+previous": keep, f"razor, {n_full} full": razor,
             "stream induction": invert(role_plan(induction, n_kv, 1, 4))}
    plans.update({f"random {p.meta['seed']}": p for p in random_plans(keep.shape, keep.n_heads, int(keep.full.sum()),
                                                                        seeds, 1, 4)})
    filler = Workspace.build("demo-lm", "demo-lm", calib_size=0, eval_size=None).eval.texts
    passkey = measure(model, tok, "passkey", [16, 24, 32, 48, 64], plans, filler, rows=args.rows, seed=0,
                      progress=lambda row: print(json.dumps(row), file=sys.stderr, flush=True))

    ws = Workspace.build("demo-lm", "demo-lm", calib_size=64, eval_size=None)
    model, tok, adapter = ws.loaded.model, ws.loaded.tokenizer, ws.loaded.adapter
    far_scores = head_scores("far-mass", model, calib=ws.calib_batches, sink=4, window=16)
    far = plan_from_scores(far_scores, adapter.n_kv_heads, 0.25, 4, 16)
    n_full = int(far.full.sum())
    plans = {"dense": None, "far-mass 25% full": far,
             "all streaming": KVPlan(torch.zeros(far.shape, dtype=torch.bool), far.n_heads, 4, 16)}
    plans.update({f"random {p.meta['seed']}": p for p in random_plans(far.shape, far.n_heads, n_full, seeds, 4, 16)})
    perplexity = measure(model, tok, "perplexity", [16, 32, 64, 128], plans, ws.eval.texts, tokens=args.tokens,
                         progress=lambda row: print(json.dumps(row), file=sys.stderr, flush=True))
    return {"passkey": {"model": "demo-circuit", "filler": "demo-lm held-out reviews", "rows_per_length": args.rows,
                        "sink": 1, "window": 4, "induction_heads": np.argwhere(induction).tolist(),
                        "previous_token_heads": np.argwhere(previous).tolist(),
                        "razor_full_kv_heads": razor.head_ids()["full_kv_heads"], "table": passkey},
            "perplexity": {"model": "demo-lm", "data": "demo-lm evaluation rows", "tokens": args.tokens, "sink": 4,
                           "window": 16, "far_mass_full_kv_heads": far.head_ids()["full_kv_heads"],
                           "table": perplexity},
            "threads": torch.get_num_threads()}


def speed(args) -> dict:
    """KV bytes and time per output token after a real prefill, per context length: transformers' DynamicCache,
    its StaticCache (preallocated to the context + new tokens) and the mixed cache under a random plan keeping 25% of
    the key/value heads full at S = 4, W = 64 and 256, on a random decoder of Qwen2.5-0.5B's shape (--layers
    layers). Greedy decoding of --new-tokens; the tokens of the three caches are compared (full caches: the same)."""
    from transformers import StaticCache

    model = qwen_shape_model(layers=args.layers)
    plan = random_plans((args.layers, 2), 14, args.layers // 2, [0], 4, 64)[0]
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        ids = torch.randint(100, 50000, (1, length), generator=torch.Generator().manual_seed(length))
        row = {"context": length}
        runs = (("DynamicCache", "full", None, lambda runner: None),
                ("StaticCache", "full", None, lambda runner, length=length: StaticCache(
                    config=runner.config, max_cache_len=length + args.new_tokens)),
                ("mixed, 25% full, W=64", "mixed", plan, lambda runner: None),
                ("mixed, 25% full, W=256", "mixed", plan.with_window(4, 256), lambda runner: None))
        for name, mode, runs_plan, make in runs:
            with restricted(model, runs_plan) if runs_plan is not None else nullcontext(model) as runner:
                out = generate(runner, ids, args.new_tokens, mode=mode, cache=make(runner), prefill_chunk=1024)
            row[name] = {"kv_bytes": out.kv_bytes, "time_per_output_token_s": out.per_token_s,
                         "prefill_and_first_token_s": out.first_token_s, "tokens": out.tokens}
        row["static_same_tokens"] = row["StaticCache"]["tokens"] == row["DynamicCache"]["tokens"]
        for name in list(row):
            if isinstance(row[name], dict):
                row[name].pop("tokens")
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return {"model": f"random Qwen2.5-0.5B shape, {args.layers} layers (fp32, CPU)",
            "full_kv_heads": int(plan.full.sum()), "kv_heads": plan.full.numel(), "new_tokens": args.new_tokens,
            "threads": torch.get_num_threads(), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="part", required=True)
    p = sub.add_parser("circuit")
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--sink", type=int, default=1)
    p.add_argument("--calib-size", type=int, default=64)
    p.add_argument("--json")
    p = sub.add_parser("decode")
    p.add_argument("--lengths", default="4096,16384,32768")
    p.add_argument("--new-tokens", type=int, default=8, help="decode steps timed after the first (default: 8)")
    p.add_argument("--layers", type=int, default=24, help="fewer layers of the same shape: a shorter run")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"any of {', '.join(VARIANTS)}")
    p.add_argument("--full-share", type=float, default=0.25, help="key/value heads kept full (random plan, seed 0)")
    p.add_argument("--sink", type=int, default=4)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1, help="rounds of every variant per length (alternating)")
    p.add_argument("--device", default="cpu", help="where the model and caches live (cpu, cuda)")
    p.add_argument("--json")
    p = sub.add_parser("longctx")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--json")
    p = sub.add_parser("speed")
    p.add_argument("--lengths", default="1024,2048,4096")
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--json")
    p = sub.add_parser("update")
    p.add_argument("--lengths", default="4096,16384")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--json")
    args = parser.parse_args()
    result = {"circuit": circuit, "decode": decode, "longctx": longctx, "speed": speed,
              "update": update}[args.part](args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
