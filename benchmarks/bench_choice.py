"""Multiple choice on the LM demo's cloze set (``demo-lm`` on ``demo-lm-cloze``): live-toggle speed and what one
question costs.

    python benchmarks/bench_choice.py [--eval-size 500] [--toggles 24] [--questions 200] [--threads 2] [--repeats 3]

1. Live pruning: a seeded random walk of single-head toggles, ``LiveEvaluator.set_mask`` (the exact new acc) vs
   ``evaluate`` from scratch (``bench_lm.toggle_walk``; every metric must agree). Target: >= 1.5x, as for the LM
   metrics.
2. One question's cost: its choices as one row each (prefix + context + continuation, what headprune runs: the
   live evaluator's layer replay and the loss/KL code read the 2D mask as "real positions") against ONE packed row
   holding the context once and every continuation after it, each continuation attending to the context and to
   itself only (a 4D boolean mask, position ids restarting after the context for each continuation), which
   transformers 5.23 passes through. Both score the same log-likelihoods (checked here); the ratio is timed over
   ``--questions`` questions, one question per forward (best of ``--repeats``), next to the ratio of tokens.

``--untrained``: the same shapes without waiting for the demo's training -- an untrained model of the demo's config
with a tokenizer of the demo's recipe (both timings depend on the shapes, not the weights; acc is then chance).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers

from bench_lm import toggle_walk  # noqa: E402
from timing import best_of  # noqa: E402

from headprune.data import split_context_continuation  # noqa: E402
from headprune.demos.lm import demo_lm_train_dataset, model_config, train_tokenizer  # noqa: E402
from headprune.evaluation.live import LiveEvaluator  # noqa: E402
from headprune.workspace import Workspace  # noqa: E402

METRICS = ("acc", "acc_norm", "acc_bytes", "loss")


def per_choice(context: list[int], continuations: list[list[int]]) -> dict:
    """The question's rows as headprune batches them: one right-padded row per choice."""
    rows = [context + c for c in continuations]
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return {"input_ids": ids, "attention_mask": mask}


def packed(context: list[int], continuations: list[list[int]]) -> tuple[dict, list[tuple[int, int]]]:
    """One row: context, then every continuation; a 4D mask lets a continuation see the context and itself only."""
    n = len(context)
    ids = context + [t for c in continuations for t in c]
    allow = torch.zeros(len(ids), len(ids), dtype=torch.bool)
    allow[:n, :n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
    positions, spans, start = list(range(n)), [], n
    for c in continuations:
        end = start + len(c)
        allow[start:end, :n] = True
        allow[start:end, start:end] = torch.tril(torch.ones(len(c), len(c), dtype=torch.bool))
        positions += range(n, n + len(c))
        spans.append((start, end))
        start = end
    return {"input_ids": torch.tensor([ids]), "attention_mask": allow[None, None],
            "position_ids": torch.tensor([positions])}, spans


@torch.no_grad()
def loglik_rows(model, context, continuations) -> list[float]:
    logp = F.log_softmax(model(**per_choice(context, continuations)).logits.double(), -1)
    return [sum(float(logp[r, len(context) - 1 + i, t]) for i, t in enumerate(c)) for r, c in enumerate(continuations)]


@torch.no_grad()
def loglik_packed(model, context, continuations) -> list[float]:
    inputs, spans = packed(context, continuations)
    logp = F.log_softmax(model(**inputs).logits[0].double(), -1)
    return [sum(float(logp[p, t]) for p, t in zip([len(context) - 1, *range(s, e - 1)], c))
            for (s, e), c in zip(spans, continuations)]


def untrained_demo_shape(folder: Path) -> str:
    """An untrained LlamaForCausalLM of the LM demo's config and a tokenizer of its recipe, saved in ``folder``."""
    tok = train_tokenizer(demo_lm_train_dataset().texts)
    torch.manual_seed(0)
    LlamaForCausalLM._from_config(model_config(len(tok)), attn_implementation="sdpa").save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--eval-size", type=int, default=500)
    ap.add_argument("--toggles", type=int, default=24)
    ap.add_argument("--questions", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--untrained", action="store_true", help="an untrained model of the demo's shape (no build)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    spec = untrained_demo_shape(Path(tempfile.mkdtemp())) if args.untrained else "demo-lm"
    ws = Workspace.build(spec, "demo-lm-cloze", calib_size=0, eval_size=args.eval_size, device="cpu")
    model, tok = ws.loaded.model, ws.loaded.tokenizer
    dense = ws.dense()
    name = "untrained demo-lm shape" if args.untrained else "demo-lm"
    print(f"{name} on demo-lm-cloze: {len(ws.eval)} questions x 4 choices, {torch.get_num_threads()} threads; dense "
          f"acc {dense.acc:.4f} ± {dense.acc_stderr:.4f}, acc_norm {dense.acc_norm:.4f} ± {dense.acc_norm_stderr:.4f}, "
          f"acc_bytes {dense.acc_bytes:.4f} ± {dense.acc_bytes_stderr:.4f}")

    live = LiveEvaluator(model, ws.eval_batches)
    got, mask = toggle_walk(live, model, ws.eval_batches, args.toggles, args.seed,
                            lambda a, b: all(abs(getattr(a, m) - getattr(b, m)) <= 1e-6 for m in METRICS))
    print(f"final mask: {mask.n_pruned} heads pruned, acc {got.acc:.4f}")

    questions = []
    for q in range(min(args.questions, len(ws.eval))):
        parts = [split_context_continuation(tok, ws.eval.texts[q], c) for c in ws.eval.choices[q]]
        questions.append((parts[0][0], [p[1] for p in parts]))
    worst = max(abs(a - b) for ctx, conts in questions
                for a, b in zip(loglik_rows(model, ctx, conts), loglik_packed(model, ctx, conts)))
    print(f"packed row vs one row per choice: largest log-likelihood difference {worst:.2e}")

    def run(make) -> None:
        with torch.no_grad():
            for ctx, conts in questions:
                inputs = make(ctx, conts)
                model(**(inputs[0] if isinstance(inputs, tuple) else inputs))

    run(per_choice)  # warm-up
    t_rows = best_of(lambda: run(per_choice), args.repeats)
    t_packed = best_of(lambda: run(packed), args.repeats)
    row_tokens = sum(len(conts) * len(ctx) + sum(map(len, conts)) for ctx, conts in questions)
    packed_tokens = sum(len(ctx) + sum(map(len, conts)) for ctx, conts in questions)
    print(f"one question: {len(questions[0][1])} rows {1e3 * t_rows / len(questions):.2f} ms vs one packed row "
          f"{1e3 * t_packed / len(questions):.2f} ms = {t_rows / t_packed:.2f}x; tokens "
          f"{row_tokens / packed_tokens:.2f}x ({row_tokens} vs {packed_tokens} over {len(questions)} questions)")


if __name__ == "__main__":
    main()
