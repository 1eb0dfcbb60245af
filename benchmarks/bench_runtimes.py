"""Is the pruned model faster where people run models?  One section per runtime (issue 48):

    onnxruntime   ``python3 benchmarks/bench_runtimes.py onnx``       (section "onnxruntime" below)
    llama.cpp     ``python3 benchmarks/bench_runtimes.py llamacpp``   (section "llama.cpp" below; llama-cpp-python
                  in its own virtualenv, ``--llama-python``: benchmarks/gguf_check.sh builds one)

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

llama.cpp
---------
Random decoders with the shapes of SmolLM2-135M (30 layers, 9 query heads in 3 key/value groups of 64, hidden 576,
MLP 1536, vocabulary 49,152, tied) and Qwen2.5-0.5B (24 layers, 14 query heads in 2 groups of 64, hidden 896, MLP
4864, vocabulary 151,936, tied, q/k/v biases), seeded; for 25 / 50 / 75 % of the heads cut (``--fractions``), chosen
two ways (``--masks``): "heads", a seeded random choice of heads over the whole grid, uneven per layer and per
key/value group as criteria produce (surgery then holds some key/value rows more than once: ``surgery.py``'s gcd
layout); "groups", a seeded random choice of whole key/value groups over the grid (``pruned_groups`` masks: uneven
per layer, no key/value row repeated). Each cut and the dense export (empty mask) are written by ``prune --format
gguf``'s code; llama.cpp times each cut beside the dense export, the two in turn, two models in memory
(``llamacpp_speed.py`` in llama-cpp-python's own virtualenv, ``--llama-python``): prompt processing (pp, one batch
of ``--prompt`` tokens) and generation (tg, ``--gen`` tokens one by one after it), tokens per second with
``--threads`` threads.
Reported per cut: tokens/s [dense, pruned], time ratio pruned / dense = (dense tok/s) / (pruned tok/s), < 1 is
faster, the same ratio of CPU time (``*_cpu_ratio``: robust on a shared machine at one thread), and the ideal ratio
from FLOPs:
    pp  F_pruned(T) / F_dense(T), ``evaluation.speed.count_flops`` over a T = --prompt token forward;
    tg  per generated token at context c = prompt + gen / 2: the projections of one token (count_flops at T = 1)
        + the attention over the cache, 4 c d_h summed over the layers' query heads (scores and context).

    nice -n 10 python3 benchmarks/bench_runtimes.py llamacpp --llama-python /tmp/llama-venv/bin/python
    nice -n 10 python3 benchmarks/bench_runtimes.py llamacpp --shapes smollm2-135m --fractions 0.5 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers as tf
from transformers import AutoModelForSequenceClassification, BertConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from headprune.demos.corpus import reviews  # noqa: E402
from headprune.evaluation.speed import count_flops  # noqa: E402
from headprune.model.arch import adapt  # noqa: E402
from headprune.model.gguf_export import export_gguf  # noqa: E402
from headprune.model.loading import load_model  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402
from headprune.model.onnx_export import compare_sessions, export_onnx  # noqa: E402
from headprune.model.surgery import prune_model  # noqa: E402
from headprune.testing import offline_tokenizer  # noqa: E402

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

SHAPES = {
    "smollm2-135m": (tf.LlamaConfig, dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                          num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                          vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0,
                                          max_position_embeddings=2048, rms_norm_eps=1e-5)),
    "qwen2.5-0.5b": (tf.Qwen2Config, dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                          num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                                          tie_word_embeddings=True, rope_theta=1000000.0, use_sliding_window=False,
                                          max_position_embeddings=32768, rms_norm_eps=1e-6)),
}


def random_group_cut(adapter, share: float, seed: int) -> HeadMask:
    """Prune round(share * groups) whole key/value groups chosen uniformly at random over the grid (seeded)."""
    groups = adapter.group_grid()
    n_groups = adapter.blocks[0].n_kv_heads
    chosen = torch.randperm(adapter.n_layers * n_groups, generator=torch.Generator().manual_seed(seed))
    values = torch.ones(adapter.grid_shape)
    for index in chosen[: round(share * adapter.n_layers * n_groups)].tolist():
        layer, group = divmod(index, n_groups)
        values[layer][groups[layer] == group] = 0.0
    return HeadMask(values)


def decode_flops(model, context: int) -> float:
    """FLOPs of generating one token at ``context`` tokens of cache (module docstring)."""
    one = count_flops(model, 1)
    heads = sum(b.n_live * b.head_size for b in adapt(model).blocks)
    return one.attention_projections + one.other + 4.0 * context * heads


def llamacpp_section(args) -> list[dict]:
    texts = reviews().texts[:300]
    tokenizer = offline_tokenizer("byte-level-bpe", texts, vocab_size=1000)
    rows = []
    for shape_name in args.shapes.split(","):
        config_cls, config = SHAPES[shape_name]
        torch.manual_seed(args.seed)
        model = tf.AutoModelForCausalLM.from_config(config_cls(**config, pad_token_id=0, bos_token_id=1,
                                                               eos_token_id=2), dtype=torch.float32).eval()
        adapter = adapt(model)
        work = Path(tempfile.mkdtemp(prefix="bench-llamacpp-", dir=args.work))
        files, cuts = {}, {}
        plans = [("dense", 0.0)] + [(kind, float(s)) for kind in args.masks.split(",") for s in args.fractions]
        for kind, share in plans:
            mask = (HeadMask.ones(adapter.grid_shape) if kind == "dense" else
                    random_cut(adapter.grid_shape, share, args.seed) if kind == "heads" else
                    random_group_cut(adapter, share, args.seed))
            cut = prune_model(model, mask)
            _, report = export_gguf(model, tokenizer, mask, work / f"{kind}{int(share * 100)}", args.gguf_type,
                                    cut=cut)
            files[kind, share] = report["file"]
            cuts[kind, share] = {"heads_cut": round(mask.n_pruned / mask.values.numel(), 3),
                                 "pp_flops": count_flops(cut, args.prompt).total,
                                 "tg_flops": decode_flops(cut, args.prompt + args.gen // 2),
                                 "query_heads": sum(report["head_count"]) - len(report["null_head_layers"]),
                                 "kv_heads": sum(report["head_count_kv"]) - len(report["null_head_layers"]),
                                 "mb": round(Path(report["file"]).stat().st_size / 2**20, 1)}
            del cut
        del model
        dense_file, dense_info = files.pop(("dense", 0.0)), cuts["dense", 0.0]
        for (kind, share), path in files.items():   # each cut timed beside the dense export, two models in memory
            timed = _llamacpp_speed(args, [dense_file, path])
            dense, speed, info = timed[dense_file], timed[path], cuts[kind, share]
            rows.append({"runtime": "llama.cpp", "model": shape_name, "mask": kind, "type": args.gguf_type,
                         **{k: info[k] for k in ("heads_cut", "query_heads", "kv_heads", "mb")},
                         "dense": {k: dense_info[k] for k in ("query_heads", "kv_heads", "mb")},
                         "pp_tok_s": [round(dense["pp_tok_s"], 1), round(speed["pp_tok_s"], 1)],
                         "tg_tok_s": [round(dense["tg_tok_s"], 2), round(speed["tg_tok_s"], 2)],
                         "pp_ratio": round(dense["pp_tok_s"] / speed["pp_tok_s"], 3),
                         "pp_ideal": round(info["pp_flops"] / dense_info["pp_flops"], 3),
                         "tg_ratio": round(dense["tg_tok_s"] / speed["tg_tok_s"], 3),
                         "tg_ideal": round(info["tg_flops"] / dense_info["tg_flops"], 3),
                         "pp_cpu_ratio": round(dense["pp_cpu_tok_s"] / speed["pp_cpu_tok_s"], 3),
                         "tg_cpu_ratio": round(dense["tg_cpu_tok_s"] / speed["tg_cpu_tok_s"], 3)})
            print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(work)
    return rows


def _llamacpp_speed(args, files: list[str]) -> dict:
    """``llamacpp_speed.py``'s tokens/s for ``files``, run by llama-cpp-python's own python (no PYTHONPATH)."""
    return json.loads(subprocess.run(
        [args.llama_python, str(Path(__file__).resolve().parent / "llamacpp_speed.py"), *files,
         "--threads", str(args.threads),
         "--prompt", str(args.prompt), "--gen", str(args.gen), "--repeats", str(args.llama_repeats)],
        check=True, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout)


SECTIONS = {"onnx": onnx_section, "llamacpp": llamacpp_section}


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
    llama = parser.add_argument_group("llamacpp section")
    llama.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", "/tmp/llama-venv/bin/python"),
                       help="python of the virtualenv holding llama-cpp-python (benchmarks/gguf_check.sh builds one)")
    llama.add_argument("--shapes", default="smollm2-135m,qwen2.5-0.5b", help="model shapes, comma-separated")
    llama.add_argument("--masks", default="heads,groups", help="heads and/or groups (module docstring)")
    llama.add_argument("--gguf-type", default="f16", choices=("f32", "f16", "q8_0"))
    llama.add_argument("--prompt", type=int, default=128, help="prompt tokens, processed in one batch")
    llama.add_argument("--gen", type=int, default=32, help="tokens generated one by one after the prompt")
    llama.add_argument("--llama-repeats", type=int, default=3, help="rounds, dense and pruned in turn (best kept)")
    llama.add_argument("--work", default=None, help="folder for the temporary GGUF files (default: the system's)")
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
