"""Is a cut model faster where people run models? Pruned / dense time in a deployment runtime, next to the ideal
ratio from FLOPs (issue 48).

llama.cpp section (``--runtime llamacpp``): random decoders with the shapes of SmolLM2-135M (30 layers, 9 query
heads in 3 key/value groups of 64, hidden 576, MLP 1536, vocabulary 49,152, tied) and Qwen2.5-0.5B (24 layers, 14
query heads in 2 groups of 64, hidden 896, MLP 4864, vocabulary 151,936, tied, q/k/v biases), seeded; for 25 / 50 /
75 % of the heads cut, chosen two ways (``--masks``): "heads", a seeded random choice of heads over the whole grid,
uneven per layer and per key/value group as criteria produce (surgery then holds some key/value rows more than
once: ``surgery.py``'s gcd layout); "groups", a seeded random choice of whole key/value groups over the grid
(``pruned_groups`` masks: uneven per layer, no key/value row repeated). Each cut and the dense export (empty mask)
are written by ``prune --format gguf``'s code; llama.cpp times each cut beside the dense export, the two in turn,
two models in memory (``llamacpp_speed.py`` in llama-cpp-python's own virtualenv, ``--llama-python``): prompt
processing (pp, one batch of ``--prompt`` tokens) and generation (tg, ``--gen`` tokens one by one after it), tokens
per second with ``--threads`` threads.
Reported per cut: tokens/s [dense, pruned], time ratio pruned / dense = (dense tok/s) / (pruned tok/s), < 1 is
faster, the same ratio of CPU time (``*_cpu_ratio``: robust on a shared machine at one thread), and the ideal ratio
from FLOPs:
    pp  F_pruned(T) / F_dense(T), ``evaluation.speed.count_flops`` over a T = --prompt token forward;
    tg  per generated token at context c = prompt + gen / 2: the projections of one token (count_flops at T = 1)
        + the attention over the cache, 4 c d_h summed over the layers' query heads (scores and context).
Usage: python benchmarks/bench_runtimes.py --runtime llamacpp --llama-python /tmp/llama-venv/bin/python
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers as tf

from headprune.demos.corpus import reviews
from headprune.evaluation.speed import count_flops
from headprune.model.arch import adapt
from headprune.model.gguf_export import export_gguf
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import offline_tokenizer

HERE = Path(__file__).resolve().parent

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


def random_cut(shape: tuple[int, int], share: float, seed: int) -> HeadMask:
    """Prune round(share * L * H) heads chosen uniformly at random over the whole grid (seeded)."""
    n = shape[0] * shape[1]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[: round(share * n)]
    values = torch.ones(n)
    values[order] = 0.0
    return HeadMask(values.view(shape))


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
        work = Path(tempfile.mkdtemp(prefix="bench-runtimes-", dir=args.work))
        files, cuts = {}, {}
        plans = [("dense", 0.0)] + [(kind, float(s)) for kind in args.masks.split(",") for s in args.cuts.split(",")]
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
        [args.llama_python, str(HERE / "llamacpp_speed.py"), *files, "--threads", str(args.threads),
         "--prompt", str(args.prompt), "--gen", str(args.gen), "--repeats", str(args.repeats)],
        check=True, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}).stdout)


RUNTIMES = {"llamacpp": llamacpp_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runtime", default="llamacpp", choices=tuple(RUNTIMES))
    parser.add_argument("--llama-python", default=os.environ.get("LLAMA_PYTHON", "/tmp/llama-venv/bin/python"),
                        help="python of the virtualenv holding llama-cpp-python (benchmarks/gguf_check.sh builds one)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--cuts", default="0.25,0.5,0.75")
    parser.add_argument("--masks", default="heads,groups", help="heads and/or groups (module docstring)")
    parser.add_argument("--gguf-type", default="f16", choices=("f32", "f16", "q8_0"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", default=None, help="folder for the temporary GGUF files (default: the system's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"date": datetime.datetime.now().isoformat(timespec="minutes"), "command": " ".join(sys.argv),
                      "nice": os.nice(0), "load_before": os.getloadavg(), "cpus": os.cpu_count()}), flush=True)
    RUNTIMES[args.runtime](args)
    print(json.dumps({"load_after": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()
