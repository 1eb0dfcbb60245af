"""Long context, offline: a passkey (needle) retrieval task and long-row perplexity, per context length.

``passkey``     a row of L tokens: [BOS] + filler + key + filler + key, the key K distinct tokens drawn (seeded) from
                the model's vocabulary outside the row's filler and its special tokens, the filler a seeded slice of
                natural text (the ``texts`` given, tokenized without special tokens). The second copy of the key is
                the question and its answer: after its first P tokens the next K - P are only in the first copy, so
                a model answers them by reading that far back (an induction-style retrieval, as in the passkey
                tests of Mohtashami & Jaggi 2023, at a distance set by the needle's depth). ``depth`` in [0, 1]
                places the first copy: 0 right after BOS (farthest), 1 right before the second copy (nearest);
                row i takes ``depths[i % len(depths)]``. A row is retrieved iff greedy argmax predicts each of the
                K - P answer tokens (teacher-forced: each is predicted from the row's true prefix, so this is exactly
                "greedy decoding after the first P key tokens writes the rest of the key"). Metric: the share of rows
                retrieved (exact retrieval accuracy), per length and per depth.
``perplexity``  the ``texts`` tokenized as the model reads a row (with its special tokens), concatenated into one
                stream, and the first ``tokens`` tokens cut into rows of L (``tokens // L`` rows): exp of the mean
                next-token loss over every position of every row but the first (``evaluation.evaluate``'s
                perplexity), so each L scores (nearly) the same targets with a context of up to L - 1 tokens.

:func:`measure` evaluates either task at each length under each plan (None: the dense model), optionally under a
head mask. A plan's streaming heads see their S + W keys only (``restrict.restricted``), so a plan with W >= L
gives exactly the dense numbers at that length.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import numpy as np
import torch

from ..evaluation.metrics import evaluate
from ..limits import Interval
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from ..model.task import Task
from .plan import KVPlan, KVPlanError
from .restrict import restricted

TASKS = ("passkey", "perplexity")
KEY_TOKENS = 6          # K: the needle
PREFIX_TOKENS = 2       # P: the question's cue; K - P = 4 answer tokens
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
ROWS = Interval(1, 100_000, integer=True, why="passkey rows per context length")
TOKENS = Interval(2, 10_000_000, integer=True, why="tokens of text cut into rows at each length")
DEPTH = Interval(0, 1, why="where the needle sits: 0 right after BOS, 1 right before the question")
# a passkey row holds [BOS] + the key twice; a perplexity row needs one target
MIN_LENGTH = {"passkey": 2 * KEY_TOKENS + 1, "perplexity": 2}
LENGTH = {task: Interval(low, 1_048_576, integer=True, why=f"tokens per {task} row")
          for task, low in MIN_LENGTH.items()}


def check_task(task: str) -> None:
    if task not in TASKS:
        raise KVPlanError(f"Long-context task {task!r} is not known; accepted: {', '.join(TASKS)}.")


def parse_numbers(text, name: str, limit: Interval, kind=int) -> list:
    """``"16,32,64"`` (or a list) -> [16, 32, 64], each within ``limit``; a clear error otherwise."""
    parts = [p.strip() for p in text.split(",") if p.strip()] if isinstance(text, str) else list(text)
    try:
        values = [kind(p) for p in parts]
    except (TypeError, ValueError):
        raise KVPlanError(f"{name} {text!r} must be a comma-separated list of numbers, e.g. 16,32,64.") from None
    if not values:
        raise KVPlanError(f"{name} is empty; give at least one value.")
    for value in values:
        problem = limit(value)
        if problem:
            raise KVPlanError(f"{name}: {value!r} {problem}.")
    return values


def check_lengths(task: str, lengths, max_positions: int | None = None) -> list[int]:
    """Context lengths for ``task``, each within its limit and, when known, within the model's positions."""
    check_task(task)
    values = parse_numbers(lengths, "--lengths", LENGTH[task])
    if max_positions is not None and max(values) > max_positions:
        raise KVPlanError(f"--lengths {max(values)} exceeds the model's {max_positions} positions "
                          "(max_position_embeddings, or GPT-2's n_positions); use lengths up to that.")
    return values


@dataclass
class PasskeyRows:
    """``input_ids`` (N, L); the last ``answer`` tokens of each row are the targets; ``depth`` and ``distance``
    (N,): the needle's depth and the tokens from the key's first copy to its second; ``key_tokens``: K."""

    input_ids: torch.Tensor
    answer: int
    depth: np.ndarray
    distance: np.ndarray
    key_tokens: int = KEY_TOKENS


def filler_stream(tokenizer, texts: list[str]) -> np.ndarray:
    """The texts' tokens, without special tokens (nor unknown-word tokens), concatenated."""
    special = set(tokenizer.all_special_ids)
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    return np.array([t for row in ids for t in row if t not in special], dtype=np.int64)


def passkey_rows(tokenizer, texts: list[str], length: int, rows: int, seed: int = 0, depths=DEPTHS,
                 key_tokens: int = KEY_TOKENS, prefix: int = PREFIX_TOKENS) -> PasskeyRows:
    """``rows`` passkey rows of ``length`` tokens (module doc), drawn with ``default_rng((seed, length))``."""
    return passkey_rows_from(filler_stream(tokenizer, texts), tokenizer, length, rows, seed, depths, key_tokens,
                             prefix)


def passkey_rows_from(stream: np.ndarray, tokenizer, length: int, rows: int, seed: int = 0, depths=DEPTHS,
                      key_tokens: int = KEY_TOKENS, prefix: int = PREFIX_TOKENS) -> PasskeyRows:
    """:func:`passkey_rows` with the filler given as a token stream (no special tokens)."""
    if not 1 <= prefix < key_tokens or length < 2 * key_tokens + 1:
        raise KVPlanError(f"A passkey row of {length} tokens cannot hold [BOS] + a {key_tokens}-token key twice "
                          f"with a {prefix}-token cue; use lengths >= {2 * key_tokens + 1}.")
    n_fill = length - 1 - 2 * key_tokens
    if len(stream) < n_fill + 1:
        raise KVPlanError(f"The filler text holds {len(stream)} tokens; a passkey row of {length} needs {n_fill}.")
    special = set(tokenizer.all_special_ids)
    vocab = np.array([t for t in range(len(tokenizer)) if t not in special], dtype=np.int64)
    bos = tokenizer.bos_token_id
    rng = np.random.default_rng((seed, length))
    out, depth_of, distance = [], [], []
    for i in range(rows):
        depth = float(depths[i % len(depths)])
        start = int(rng.integers(0, len(stream) - n_fill + 1))
        fill = stream[start:start + n_fill]
        allowed = vocab[~np.isin(vocab, fill)]
        key = rng.choice(allowed, key_tokens, replace=False)
        at = int(round(depth * n_fill))
        row = np.concatenate([[bos if bos is not None else int(fill[0])], fill[:at], key, fill[at:], key])
        out.append(row)
        depth_of.append(depth)
        distance.append(n_fill - at + key_tokens)
    return PasskeyRows(torch.as_tensor(np.stack(out)), key_tokens - prefix, np.array(depth_of), np.array(distance),
                       key_tokens)


@torch.no_grad()
def passkey_hits(model, rows: PasskeyRows, mask=None, batch_size: int = 32) -> torch.Tensor:
    """Bool (N,): is every answer token of the row the model's greedy argmax (teacher-forced; module doc)?"""
    device = next(model.parameters()).device
    a = rows.answer
    hits = []
    if mask is not None:   # gate a private copy: the caller's model may be shared (as ``evaluate`` does)
        model = structural_copy(model)
    with gate_heads(model, mask):
        for begin in range(0, len(rows.input_ids), batch_size):
            ids = rows.input_ids[begin:begin + batch_size].to(device)
            # logits at positions L-a-1 .. L-2 predict the last a tokens
            logits = model(input_ids=ids, logits_to_keep=a + 1).logits[:, :a]
            hits.append((logits.argmax(-1) == ids[:, -a:]).all(-1).cpu())
    return torch.cat(hits)


def token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    """(T,) each text tokenized as the model reads a row (its special tokens included), concatenated."""
    ids = tokenizer(list(texts))["input_ids"]
    return torch.tensor([t for row in ids for t in row], dtype=torch.long)


def long_rows(stream: torch.Tensor, length: int, tokens: int) -> torch.Tensor:
    """(tokens // length, length): the first ``tokens`` tokens of ``stream`` cut into rows of ``length``."""
    n = min(tokens, len(stream)) // length
    if n < 1:
        raise KVPlanError(f"The text holds {len(stream)} tokens (using {tokens}): not one row of {length}; give "
                          "more text or shorter lengths.")
    return stream[:n * length].view(n, length)


def long_perplexity(model, ids: torch.Tensor, mask=None, batch_size: int = 16) -> dict:
    """Perplexity, mean loss and target count of the LM on rows ``ids`` (N, L), no padding."""
    batches = [{"input_ids": ids[b:b + batch_size], "attention_mask": torch.ones_like(ids[b:b + batch_size]),
                "labels": ids[b:b + batch_size]} for b in range(0, len(ids), batch_size)]
    metrics = evaluate(model, batches, mask, task=Task("lm")).to_dict()
    return {"perplexity": metrics["perplexity"], "loss": metrics["loss"], "targets": int(ids.shape[0]) *
            (int(ids.shape[1]) - 1)}


def measure(model, tokenizer, task: str, lengths: list[int], plans: dict[str, KVPlan | None], texts: list[str], *,
            rows: int = 64, seed: int = 0, depths=DEPTHS, tokens: int = 4096, mask=None,
            batch_size: int = 32, progress=None) -> list[dict]:
    """One dict per (plan name, length): ``passkey`` accuracy (and per depth, mean distance) or ``perplexity``
    (and loss, targets) of ``model`` under each plan of ``plans`` (None: dense), with ``mask`` gating heads."""
    check_task(task)
    stream = token_stream(tokenizer, texts) if task == "perplexity" else None
    data = {length: passkey_rows(tokenizer, texts, length, rows, seed, depths) if task == "passkey"
            else long_rows(stream, length, tokens) for length in lengths}
    table = []
    for name, plan in plans.items():
        with restricted(model, plan) if plan is not None else nullcontext(model) as runner:
            for length in lengths:
                row = {"plan": name, "length": length}
                if task == "passkey":
                    hits = passkey_hits(runner, data[length], mask, batch_size).numpy()
                    depth = data[length].depth
                    row.update(accuracy=float(hits.mean()), rows=int(len(hits)),
                               by_depth={f"{d:g}": float(hits[depth == d].mean()) for d in sorted(set(depth))},
                               mean_distance=float(data[length].distance.mean()))
                else:
                    row.update(long_perplexity(runner, data[length], mask, batch_size))
                table.append(row)
                if progress is not None:
                    progress(row)
    return table
