"""Issue-47 families at real shapes (random weights, no download): the CLI's estimates and memory, and Prune-page
clicks next to a Llama-shaped model of the same size.

    python benchmarks/bench_real_shapes.py build
    python benchmarks/bench_real_shapes.py cli [--shapes opt-125m,llama-125m] [--calib-size 32] [--eval-size 32]
    python benchmarks/bench_real_shapes.py clicks [--shapes ...] [--eval-size 64] [--clicks 6]

Shapes (float32, weights drawn with seed 0, saved once into ~/.cache/headprune-bench/<shape>-random-v1 with the
demo-lm tokenizer -- it only decides which embedding rows are read; the LM head scores the whole vocabulary):

    opt-125m     OPTConfig() defaults = OPT-125M: 12 layers x 12 heads, hidden 768, FFN 3072, vocabulary 50,272,
                 tied embeddings (125 M parameters)
    llama-125m   its Llama twin: the same layers, heads, hidden size and vocabulary, SwiGLU intermediate 2048 (three
                 matrices of 768 x 2048 = OPT's two of 768 x 3072), tied (125 M)
    phi-2        Phi-2's real width -- hidden 2560, 32 heads of 80, partial rotary 0.4, intermediate 10240,
                 vocabulary 51,200, untied LM head -- with 2 of its 32 layers (``--phi-layers``): all 32 would be
                 2.7 B parameters, 11 GB in float32, too much for a 24 GB machine shared by a team. A click on the
                 Prune page replays the layers from the clicked one up, so per layer it costs what it costs in the
                 full model; the LM head (51,200 x 2560) is paid in full.
    llama-phi-2  its Llama twin: hidden 2560, 32 heads, intermediate 6827 (3 x 2560 x 6827 ~ Phi's 2 x 2560 x 10240),
                 same layers and vocabulary, untied
    pythia-160m  Pythia-160M (GPTNeoXConfig): 12 layers x 12 heads in a fused head-interleaved query_key_value, hidden
                 768, FFN 3072, vocabulary 50,304, a quarter of each head rotary, parallel residual, untied (162 M)
    llama-160m   its Llama twin: llama-125m with Pythia's vocabulary and an untied LM head (162 M)

``cli``: per shape, in its own process each (peak RSS its own), ``evaluate`` (--eval-size rows of demo-lm),
``score --criterion his`` (--calib-size rows; the duration it tells beforehand on stderr, ``estimate: ...``, next to
the seconds it took), both under ``--memory-budget`` (--budget-gb), and ``prune`` (a quarter of the heads, --format
headprune); seconds and peak RSS, held against the weights' size plus the budget. ``clicks``: the dashboard's
live evaluator on --eval-size rows of demo-lm (``Workspace.build`` as the dashboard builds it), one head toggled
per layer spread over the depth, the time to the first running estimate and to the exact value, per shape, the
shapes' clicks interleaved (benchmarks/bench_gpt2_live.py's method).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CACHE = Path.home() / ".cache" / "headprune-bench"
SHAPES = {
    "opt-125m": ("OPTConfig", {}),
    "llama-125m": ("LlamaConfig", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                       num_key_value_heads=12, intermediate_size=2048, vocab_size=50272,
                                       max_position_embeddings=2048, tie_word_embeddings=True)),
    "phi-2": ("PhiConfig", dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=32,
                                intermediate_size=10240, vocab_size=51200, max_position_embeddings=2048,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.4}, tie_word_embeddings=False)),
    "llama-phi-2": ("LlamaConfig", dict(hidden_size=2560, num_attention_heads=32, num_key_value_heads=32,
                                        intermediate_size=6827, vocab_size=51200, max_position_embeddings=2048,
                                        tie_word_embeddings=False)),
    "pythia-160m": ("GPTNeoXConfig", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                          intermediate_size=3072, vocab_size=50304, max_position_embeddings=2048,
                                          use_parallel_residual=True, tie_word_embeddings=False,
                                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                           "partial_rotary_factor": 0.25})),
    "llama-160m": ("LlamaConfig", dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                                       num_key_value_heads=12, intermediate_size=2048, vocab_size=50304,
                                       max_position_embeddings=2048, tie_word_embeddings=False)),
}
PHI_LIKE = ("phi-2", "llama-phi-2")


def folder_of(shape: str, phi_layers: int) -> Path:
    layers = f"-{phi_layers}l" if shape in PHI_LIKE else ""
    return CACHE / f"{shape}{layers}-random-v1"


def build(shape: str, phi_layers: int) -> Path:
    """The shape's random model with the demo-lm tokenizer, written once (staged, then renamed into place)."""
    folder = folder_of(shape, phi_layers)
    if (folder / "config.json").exists():
        return folder
    import torch
    import transformers
    from transformers import PreTrainedTokenizerFast

    from headprune.demos.lm import ensure_demo_lm_model
    from headprune.model.loading import write_staged

    tokenizer = PreTrainedTokenizerFast.from_pretrained(ensure_demo_lm_model())
    cls_name, kwargs = SHAPES[shape]
    layers = {"num_hidden_layers": phi_layers} if shape in PHI_LIKE else {}
    config = getattr(transformers, cls_name)(**kwargs, **layers, pad_token_id=tokenizer.pad_token_id,
                                             bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return write_staged(folder, lambda staging: (model.save_pretrained(staging), tokenizer.save_pretrained(staging)))


def child(argv: list[str]) -> None:
    """Run one CLI command in this process; its last stderr line is the peak RSS."""
    from headprune.cli import main

    code = main(argv)
    print(f"peak_rss_bytes={resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024} exit={code}", file=sys.stderr)


def run_cli(argv: list[str], threads: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "child", "--", *argv], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    err = done.stderr
    peak = re.search(r"peak_rss_bytes=(\d+) exit=(\d+)", err)
    if done.returncode != 0 or peak is None or peak.group(2) != "0":
        raise SystemExit(f"{' '.join(argv)} failed:\n{err[-2000:]}")
    out = json.loads(done.stdout) if done.stdout.strip().startswith("{") else {}
    told = re.search(r"estimate: (.*)", err)
    return {"wall_s": round(wall, 1), "peak_rss_gb": round(int(peak.group(1)) / 1e9, 2),
            "told": told.group(1).strip() if told else None, "json": out}


def cli(shapes: list[str], calib_size: int, eval_size: int, phi_layers: int, threads: int, budget_gb: float) -> None:
    from transformers import AutoConfig

    for shape in shapes:
        folder = build(shape, phi_layers)
        config = AutoConfig.from_pretrained(folder)
        weights = sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e9
        data = ["--data", "demo-lm", "--calib-size", str(calib_size), "--eval-size", str(eval_size)]
        budget = f"{budget_gb}GB"   # the planner's budget, given explicitly so the peak can be held against it
        evaluated = run_cli(["evaluate", "--model", str(folder), *data, "--memory-budget", budget], threads)
        scored = run_cli(["score", "--model", str(folder), "--criterion", "his", *data, "--memory-budget", budget],
                         threads)
        layers, heads = config.num_hidden_layers, config.num_attention_heads
        with tempfile.TemporaryDirectory() as tmp:
            mask = Path(tmp) / "mask.json"
            mask.write_text(json.dumps({"pruned": {str(layer): list(range(heads // 4)) for layer in range(layers)}}))
            pruned = run_cli(["prune", "--model", str(folder), "--mask", str(mask), "--out", str(Path(tmp) / "cut")],
                             threads)
        print(f"{shape} ({layers} layers x {heads} heads, weights {weights:.2f} GB float32), {threads} thread(s), "
              f"load {os.getloadavg()[0]:.1f}:")
        print(f"  memory budget {budget} beyond the weights: peak RSS may reach {weights + budget_gb:.2f} GB")
        print(f"  evaluate {eval_size} rows: {evaluated['wall_s']} s wall, peak RSS {evaluated['peak_rss_gb']} GB, "
              f"perplexity {evaluated['json'].get('perplexity', float('nan')):.1f}")
        print(f"  score his on {calib_size} rows: told '{scored['told']}', took {scored['json'].get('seconds', 0):.1f}"
              f" s ({scored['wall_s']} s wall with loading), peak RSS {scored['peak_rss_gb']} GB")
        print(f"  prune a quarter of the heads: {pruned['wall_s']} s wall, peak RSS {pruned['peak_rss_gb']} GB")


def clicks(shapes: list[str], eval_size: int, n_clicks: int, phi_layers: int) -> None:
    """The live evaluators of every shape side by side, their clicks interleaved (shape A's click i, then shape B's
    click i, ...), so a shared machine's changing load reaches every shape alike."""
    import torch

    from headprune.evaluation.live import LiveEvaluator
    from headprune.workspace import Workspace

    lives, first_pass = {}, {}
    for shape in shapes:
        ws = Workspace.build(str(build(shape, phi_layers)), "demo-lm", calib_size=8, eval_size=eval_size, seed=0,
                             device="cpu")
        start = time.perf_counter()
        lives[shape] = LiveEvaluator(ws.loaded.model, ws.eval_batches)
        first_pass[shape] = time.perf_counter() - start
    firsts: dict[str, list[float]] = {shape: [] for shape in shapes}
    exacts: dict[str, list[float]] = {shape: [] for shape in shapes}
    with torch.no_grad():
        for i in range(n_clicks):
            for shape, live in lives.items():
                n_layers, n_heads = live.adapter.grid_shape
                layer = round(i * (n_layers - 1) / max(n_clicks - 1, 1))
                seen: list[float] = []
                t0 = time.perf_counter()
                live.toggle(layer, i % n_heads, on_estimate=lambda _e, t0=t0, seen=seen: seen.append(
                    time.perf_counter() - t0))
                exacts[shape].append(time.perf_counter() - t0)
                firsts[shape].append(seen[0] if seen else exacts[shape][-1])
    for shape, live in lives.items():
        n_layers, n_heads = live.adapter.grid_shape
        print(f"{shape} ({live.adapter.family}, {n_layers} x {n_heads}): {live.n_rows} rows in {len(live.batches)} "
              f"batches, first pass {first_pass[shape]:.2f} s, {n_clicks} clicks (layers spread 0..{n_layers - 1}): "
              f"first number p50 {statistics.median(firsts[shape]):.2f} s (max {max(firsts[shape]):.2f}), exact p50 "
              f"{statistics.median(exacts[shape]):.2f} s (max {max(exacts[shape]):.2f}); chunked LM head "
              f"{live.chunked_head}, {live.fast_path_note}")
    print(f"load average at the end {os.getloadavg()[0]:.1f}; {torch.get_num_threads()} thread(s)")


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        child(sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("build", "cli", "clicks"))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--phi-layers", type=int, default=2)
    parser.add_argument("--calib-size", type=int, default=32)
    parser.add_argument("--eval-size", type=int, default=32)
    parser.add_argument("--clicks", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget-gb", type=float, default=1.0, help="cli: --memory-budget of evaluate and score")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    shapes = args.shapes.split(",")
    if args.what == "build":
        for shape in shapes:
            print(build(shape, args.phi_layers))
    elif args.what == "cli":
        cli(shapes, args.calib_size, args.eval_size, args.phi_layers, args.threads, args.budget_gb)
    else:
        clicks(shapes, args.eval_size, args.clicks, args.phi_layers)


if __name__ == "__main__":
    main()
