"""A GPT-2-sized model live on the Prune page: where a click's time goes, and what a person waits in the browser.

    python benchmarks/bench_gpt2_live.py breakdown [--eval-size 64] [--clicks 6] [--device auto|cpu|cuda]
    python benchmarks/bench_gpt2_live.py browser [--eval-size 64] [--clicks-per-layer 1]

The model is a random-initialised decoder of GPT-2 small's shape: ``transformers.GPT2Config()`` defaults
(12 layers x 12 heads, hidden 768, 1,024 positions, tied 50,257-word vocabulary, 124 M parameters), weights drawn
with seed 0, saved with ``save_pretrained`` into ``~/.cache/headprune-bench/gpt2-shape-random-v1`` (its own folder:
not a demo cache entry). No GPT-2 tokenizer ships offline, so the folder gets the demo-lm tokenizer (byte-level BPE,
4,096 words, trained on the Rotten Tomatoes training rows): it only decides which rows of the 50,257 x 768 embedding
are read; the output projection still scores all 50,257 words at every position, which is the cost measured here.
The data is ``demo-lm`` (held-out Rotten Tomatoes reviews as text).

``breakdown``: one dense evaluation batch split into embedding, the 12 blocks, the final norm, and the LM head with
its loss -- the loss computed as the live evaluator used to (``lm_row_stats`` of the full (B, T, V) logits) and as it
does now (``lm_row_stats_chunked`` on the real targets, in chunks); then ``--clicks`` head toggles through
``LiveEvaluator`` (one per layer spread), timed, and the evaluation size the dashboard's live rule
(``estimate.measure_live_size``) keeps on this machine. ``--device`` places the model (``auto``: a GPU when there is
one, as the dashboard does). ``browser``: ``bench_browser.run`` on a dashboard serving the folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from timing import clock  # noqa: E402

from headprune import estimate  # noqa: E402
from headprune.demos.lm import ensure_demo_lm_model  # noqa: E402
from headprune.evaluation.live import LiveEvaluator  # noqa: E402
from headprune.evaluation.metrics import evaluation_inputs  # noqa: E402
from headprune.model.task import lm_row_stats, lm_row_stats_chunked  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402

FOLDER = Path.home() / ".cache" / "headprune-bench" / "gpt2-shape-random-v1"


def build_folder(folder: Path = FOLDER) -> Path:
    """The GPT-2-shaped random model with an offline tokenizer, written once (temporary folder, then rename)."""
    if (folder / "config.json").exists():
        return folder
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(ensure_demo_lm_model())
    torch.manual_seed(0)
    config = GPT2Config(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id)
    model = GPT2LMHeadModel(config).eval()
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(folder)
    return folder


def timed(fn, repeat: int = 3):
    """(fastest of ``repeat`` calls in seconds, CUDA synchronised around each; the last call's result)."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = clock()
        out = fn()
        best = min(best, clock() - t0)
    return best, out


@torch.no_grad()
def breakdown(eval_size: int, clicks: int, device: str = "auto") -> None:
    folder = build_folder()
    ws = Workspace.build(str(folder), "demo-lm", calib_size=8, eval_size=eval_size, seed=0, device=device)
    model, batches = ws.loaded.model, ws.eval_batches
    batch = max(batches, key=lambda b: b["input_ids"].numel())
    inputs = evaluation_inputs(model, batch, model.device)
    labels = batch["labels"].to(model.device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{folder.name}: {n_params / 1e6:.1f} M parameters, {len(batches)} evaluation batches of "
          f"{[tuple(b['input_ids'].shape) for b in batches]}; timing the largest, {tuple(batch['input_ids'].shape)} "
          f"({int((labels[:, 1:] != -100).sum())} real targets), on {model.device}, {torch.get_num_threads()} CPU "
          f"thread(s), load {os.getloadavg()[0]:.1f}")
    tr = model.transformer
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    t_total, out = timed(lambda: model(**inputs).logits)
    hidden_states = model(**inputs, output_hidden_states=True).hidden_states
    pos = torch.arange(ids.shape[1], device=ids.device)[None]
    t_embed, _ = timed(lambda: tr.drop(tr.wte(ids) + tr.wpe(pos)))
    t_blocks, _ = timed(lambda: tr(input_ids=ids, attention_mask=mask).last_hidden_state)
    last = hidden_states[-1]  # after ln_f in GPT-2's output_hidden_states
    t_head, logits = timed(lambda: model.lm_head(last))
    t_loss, dense = timed(lambda: lm_row_stats(logits, labels))
    t_chunked, chunked = timed(lambda: lm_row_stats_chunked(last, model.lm_head, labels))
    assert torch.allclose(dense, chunked, rtol=1e-5, atol=1e-3), (dense, chunked)
    print(f"dense forward (model(**inputs)): {t_total:.3f} s")
    print(f"  embedding {t_embed:.3f} s | 12 blocks + final norm {t_blocks - t_embed:.3f} s | "
          f"LM head (B,T,V) {t_head:.3f} s | loss of the full logits {t_loss:.3f} s")
    print(f"  LM head + loss as before: {t_head + t_loss:.3f} s; chunked over real targets: {t_chunked:.3f} s")

    size, basis = estimate.measure_live_size(model, batches, max(len(b["input_ids"]) for b in batches))
    print(f"the dashboard's live rule on this machine: {size.rows} of {sum(len(b['input_ids']) for b in batches)} "
          f"rows, {size.batch_rows} a batch ({size.seconds_per_row * 1e3:.1f} ms a row; timed: {basis})")
    t_first, live = timed(lambda: LiveEvaluator(model, batches), repeat=1)
    print(f"live evaluator, first pass over all {len(batches)} batches: {t_first:.2f} s")
    print(f"live evaluator: LM head chunked: {live.chunked_head}; {live.fast_path_note}; "
          f"cache {live.cache_megabytes():.0f} MB")
    n_layers, n_heads = live.adapter.grid_shape
    for i in range(clicks):
        layer = round(i * (n_layers - 1) / max(clicks - 1, 1))
        first: list[float] = []
        t0 = clock()
        live.toggle(layer, i % n_heads, on_estimate=lambda _e, t0=t0, first=first: first.append(clock() - t0))
        total = clock() - t0
        print(f"  click layer {layer:2d}: first batch {first[0] if first else float('nan'):.2f} s, "
              f"all {len(batches)} batches {total:.2f} s, perplexity {live.metrics().perplexity:.1f}")


def browser(eval_size: int, clicks_per_layer: int) -> None:
    from bench_browser import ROOT, run, summary

    folder = build_folder()
    clicks = run(str(folder), eval_size, clicks_per_layer, {"this": ROOT}, Path("/tmp/bench_gpt2_server.log"),
                 data="demo-lm")["this"]
    s = summary(clicks)
    print(f"GPT-2-shaped random model, demo-lm data, {eval_size} evaluation rows, {len(clicks)} clicks "
          f"(load average {os.getloadavg()[0]:.1f} at the end): click -> first number p50 {s['first_p50']:.2f} s "
          f"(max {s['first_max']:.2f}), click -> exact number p50 {s['exact_p50']:.2f} s (max {s['exact_max']:.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("breakdown", "browser", "build"))
    parser.add_argument("--eval-size", type=int, default=64)
    parser.add_argument("--clicks", type=int, default=6)
    parser.add_argument("--clicks-per-layer", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="auto", help="breakdown: where the model runs (auto: a GPU if any)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.what == "build":
        print(build_folder())
    elif args.what == "breakdown":
        breakdown(args.eval_size, args.clicks, args.device)
    else:
        browser(args.eval_size, args.clicks_per_layer)


if __name__ == "__main__":
    main()
