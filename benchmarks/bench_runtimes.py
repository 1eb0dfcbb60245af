"""Is the pruned model faster where people run models?  One section per runtime (issue 48):

    onnxruntime   ``python3 benchmarks/bench_runtimes.py onnx``       (section "onnxruntime" below)
    llama.cpp     the ``gguf`` section, when its runtime is installed  (section "llama.cpp": helper gguf's)

Every section prints, for 25 / 50 / 75 % of the heads cut, the pruned/dense time ratio measured in the runtime next
to the ideal ratio from the FLOPs (``headprune.evaluation.speed.count_flops``: F_pruned / F_dense, matrix products
only), and the conditions: date, command, nice level, the machine's load before and after, CPU.

onnxruntime
-----------
Models: the demo (MiniLM-L6 classifier, 6 x 12 heads, hidden 384) and a BERT-base-shaped classifier (12 x 12 heads,
hidden 768, feed-forward 3072, vocabulary 30522; random weights, seed 0: speed does not depend on the values). For
each fraction a seeded random set of heads is cut (so every layer keeps a different number), the dense and the cut
model are exported with ``prune --format onnx``'s exporter (``onnx_export.export_onnx``) and timed in onnxruntime
on the CPU with 2 intra-op threads (``intra_op_num_threads=2``), dense and pruned in turn, ``--repeats`` rounds after
``--warmup``, on one batch of ``--batch`` x ``--length`` random token ids (``onnx_export.compare_sessions``). The
ratio is the median over rounds of t_pruned / t_dense within a round, so a change of the shared machine's load
between rounds cancels; the interquartile range of those per-round ratios is printed beside it.

    nice -n 10 python3 benchmarks/bench_runtimes.py onnx                      # both models, about 10 minutes idle
    nice -n 10 python3 benchmarks/bench_runtimes.py onnx --models demo --repeats 15
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForSequenceClassification, BertConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from headprune.evaluation.speed import count_flops  # noqa: E402
from headprune.model.arch import adapt  # noqa: E402
from headprune.model.loading import load_model  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402
from headprune.model.onnx_export import compare_sessions, export_onnx  # noqa: E402

FRACTIONS = (0.25, 0.5, 0.75)


def conditions() -> dict:
    """What a reader needs to weigh the numbers: when, how it was run, and how busy the machine was."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    return {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "nice": os.nice(0), "cpus": os.cpu_count(), "cpu": cpu, "load_before": list(os.getloadavg())}


def random_cut(shape: tuple[int, int], fraction: float, seed: int) -> HeadMask:
    """``fraction`` of all heads cut, chosen by a seeded permutation (so layers keep different counts)."""
    n_layers, n_heads = shape
    values = torch.ones(n_layers * n_heads)
    order = torch.randperm(n_layers * n_heads, generator=torch.Generator().manual_seed(seed))
    values[order[: round(fraction * n_layers * n_heads)]] = 0.0
    return HeadMask(values.view(n_layers, n_heads))


# -- onnxruntime ------------------------------------------------------------------------------------------------------

def bert_base() -> torch.nn.Module:
    """BERT-base's shape (bert-base-uncased's config values) as a 2-label classifier with seeded random weights."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, max_position_embeddings=512, type_vocab_size=2, num_labels=2)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").eval()


ONNX_MODELS = {"demo": lambda: load_model("demo", "cpu").model, "bert-base": bert_base}


def onnx_section(args) -> dict:
    """The onnxruntime section: per model and fraction, measured and ideal pruned/dense ratios."""
    results = {}
    for name in args.models:
        model = ONNX_MODELS[name]()
        shape = adapt(model).grid_shape
        with tempfile.TemporaryDirectory(prefix="bench-onnx-") as tmp:
            begin = time.perf_counter()
            dense = export_onnx(model, None, None, Path(tmp) / "dense")
            dense_flops = count_flops(dense["model"], args.length).total
            rows = []
            print(f"\n{name}: {shape[0]} x {shape[1]} heads, batch {args.batch} x {args.length} tokens, "
                  f"{args.threads} threads, {args.repeats} rounds (dense export {time.perf_counter() - begin:.1f} s)")
            print(f"{'cut':>5} {'kept per layer':<40} {'pruned/dense':>12} {'IQR':>13} {'ideal':>6} "
                  f"{'dense ms':>9} {'pruned ms':>9}")
            for fraction in args.fractions:
                mask = random_cut(shape, fraction, args.seed)
                pruned = export_onnx(model, None, mask, Path(tmp) / f"cut-{fraction}")
                timing = compare_sessions(dense["file"], pruned["file"], dense["model"], batch_size=args.batch,
                                          seq_len=args.length, threads=args.threads, repeats=args.repeats,
                                          warmup=args.warmup)
                ideal = count_flops(pruned["model"], args.length).total / dense_flops
                kept = [int(row.sum()) for row in mask.keep_bool()]
                rows.append({"cut": fraction, "kept_per_layer": kept, **timing, "ideal_ratio": ideal})
                print(f"{fraction:>5.0%} {str(kept):<40} {timing['ratio']:>12.3f} "
                      f"{timing['spread'][0]:>6.3f}-{timing['spread'][1]:<6.3f} {ideal:>6.3f} "
                      f"{1e3 * timing['dense_s']:>9.1f} {1e3 * timing['pruned_s']:>9.1f}", flush=True)
        results[name] = rows
    return results


# -- llama.cpp ------------------------------------------------------------------------------------------------------
# helper gguf's section (prompt processing and generation tokens/s in llama.cpp) goes here, registered in SECTIONS.


SECTIONS = {"onnx": onnx_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("section", choices=tuple(SECTIONS), help="which runtime to time")
    parser.add_argument("--models", nargs="+", default=list(ONNX_MODELS), choices=tuple(ONNX_MODELS))
    parser.add_argument("--fractions", nargs="+", type=float, default=list(FRACTIONS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads (default: 2)")
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds, dense and pruned in turn")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="which heads are cut")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)   # the exports and FLOP counts; timing uses onnxruntime's own threads
    info = conditions()
    print(json.dumps(info))
    results = SECTIONS[args.section](args)
    info["load_after"] = list(os.getloadavg())
    print(f"\nload average before {info['load_before']}, after {info['load_after']} ({info['cpus']} CPUs)")
    if args.json:
        args.json.write_text(json.dumps({"conditions": info, "results": results}, indent=1))


if __name__ == "__main__":
    main()
