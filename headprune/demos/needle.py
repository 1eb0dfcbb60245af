"""The long-context demo: a 3-layer Llama LM trained to retrieve a key over 1k-4k tokens of filler (issue 37).

KV plans at S = 4, W = 64-256 only matter where a model reads keys thousands of tokens back; the other demos stop
copying beyond their trained distances (64-128 positions). This one is built for the passkey task
(``kvcache.longctx``, ``evaluate --long-context passkey``): [BOS] + filler + key + filler + key, the second copy's
first P tokens the cue, the rest answered by reading the first copy (induction at the needle's distance).

    vocabulary  word level (``circuit.make_tokenizer``): <pad> <bos> <eos> <unk>, FILLER_WORDS filler words
                "f00".. and KEY_WORDS key words "k000"..; the two sets are disjoint, so a key token occurs in a
                row only as a key (the passkey task draws keys from the words outside the row's filler: here the
                key words, once the filler holds every filler word, as any row of 1k tokens does)
    model       LlamaForCausalLM: LAYERS layers x HEADS heads over KV_HEADS key/value heads, hidden HIDDEN (head
                size 32: enough rotary frequencies for a previous-token head AND slow ones that keep content
                matching distance-invariant up to 4k), RoPE theta ROPE_THETA, CONTEXT positions, tied embeddings
    training    a curriculum of STAGES (length, steps, rows per batch, kind), seeded (SEED), 1 thread, AdamW as the
                other demos (``build.train_steps``):
                ``adjacent``  [BOS] + r + r + filler with r of BLOCK_MIN..BLOCK_MAX distinct key words: the circuit
                              demo's task, where an induction circuit forms within a few hundred steps
                ``haystack``  filler with up to ``blocks`` key blocks of HAYSTACK_MIN..HAYSTACK_MAX words, each
                              repeated later (at most ``gap`` filler words after its first copy, or anywhere)
                only the repeated copies' tokens after their first are targets (the rest cannot be predicted)
    data        ``load_data("demo-long")``: EVAL_ROWS texts of TEXT_WORDS filler words (seed EVAL_SEED): the
                haystack the passkey task cuts its rows from
Cached like every demo (``build.build_cached``); ``python -m headprune demo --long`` builds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig

from ..data import TextDataset
from ..evaluation.metrics import evaluate
from ..model.task import IGNORE_INDEX, Task
from ..provenance import versions
from .build import build_cached, cache_dir, read_info, stderr_progress, train_llama
from .circuit import SPECIAL_TOKENS, make_tokenizer
from .corpus import SEED

RECIPE = "demo-long-llama-v2"   # bump when anything below changes: the cache folder is named after it
FILLER_WORDS = 64
KEY_WORDS = 256
LAYERS = 3
HEADS = 4
KV_HEADS = 4
HIDDEN = 128
INTERMEDIATE = 256
CONTEXT = 4096
ROPE_THETA = 1e6
BLOCK_MIN, BLOCK_MAX = 8, 24          # adjacent rows (the circuit demo's blocks)
HAYSTACK_MIN, HAYSTACK_MAX = 4, 10    # key blocks hidden in filler
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01
THREADS = 1
EVAL_ROWS = 64
TEXT_WORDS = 256
EVAL_SEED = 1
CHECK_LENGTHS = (1024, 2048, 4096)   # the build's own held-out check (recorded in the info file)
CHECK_ROWS = 8
CHECK_BLOCKS = 3


@dataclass(frozen=True)
class Stage:
    """``steps`` batches of ``batch`` rows of ``length`` tokens of one ``kind`` (module doc); haystack rows hold up
    to ``blocks`` key blocks, each repeated at most ``gap`` filler words after its first copy (None: anywhere)."""

    length: int
    steps: int
    batch: int
    kind: str = "haystack"
    blocks: int = 1
    gap: int | None = None


# v2 added the 2,048- and 4,096-token stages: v1 (up to 1,024) retrieved 0.85 of needles at 2,048 and 0.50 at
# 4,096 -- the longer filler, not the distance, confused it (docs/results/kv-long-context.md)
STAGES = (Stage(50, 600, 32, "adjacent"), Stage(96, 300, 16, gap=32), Stage(256, 300, 8, blocks=2),
          Stage(1024, 200, 2, blocks=3), Stage(2048, 200, 2, blocks=3), Stage(4096, 100, 1, blocks=4))


def vocabulary() -> list[str]:
    """The filler words, then the key words (after the special tokens in the tokenizer)."""
    return [f"f{i:02d}" for i in range(FILLER_WORDS)] + [f"k{i:03d}" for i in range(KEY_WORDS)]


FIRST_FILLER = len(SPECIAL_TOKENS)
FIRST_KEY = FIRST_FILLER + FILLER_WORDS


def filler(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(FIRST_FILLER, FIRST_KEY, n)


def adjacent_row(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray]:
    """[BOS] + r + r + filler (``length`` tokens); labels: the second copy after its first word."""
    n = int(rng.integers(BLOCK_MIN, min(BLOCK_MAX, (length - 1) // 2) + 1))
    block = rng.choice(KEY_WORDS, n, replace=False) + FIRST_KEY
    ids = filler(rng, length)
    ids[0] = 1
    ids[1:1 + n] = ids[1 + n:1 + 2 * n] = block
    labels = np.full(length, IGNORE_INDEX)
    labels[2 + n:1 + 2 * n] = block[1:]
    return ids, labels


def haystack_row(rng: np.random.Generator, length: int, blocks: int, gap: int | None) -> tuple[np.ndarray,
                                                                                                np.ndarray]:
    """Filler with up to ``blocks`` key blocks, each placed twice without overlapping another (seeded tries; a
    block that finds no room in 50 is left out); labels: each second copy after its first word."""
    sizes = rng.integers(HAYSTACK_MIN, HAYSTACK_MAX + 1, blocks)
    keys = rng.choice(KEY_WORDS, int(sizes.sum()), replace=False) + FIRST_KEY
    ids, labels = filler(rng, length), np.full(length, IGNORE_INDEX)
    ids[0] = 1
    used = np.zeros(length, dtype=bool)
    used[0] = True
    for block in np.split(keys, np.cumsum(sizes)[:-1]):
        n = len(block)
        for _ in range(50):
            if gap is None:
                first, second = sorted(int(p) for p in rng.integers(1, length - n + 1, 2))
            else:
                first = int(rng.integers(1, length - n + 1))
                second = first + n + int(rng.integers(0, gap + 1))
            if second - first >= n and second + n <= length and not used[first:first + n].any() \
                    and not used[second:second + n].any():
                break
        else:
            continue
        ids[first:first + n] = ids[second:second + n] = block
        used[first:first + n] = used[second:second + n] = True
        labels[second + 1:second + n] = block[1:]
    return ids, labels


def stage_batch(rng: np.random.Generator, stage: Stage) -> dict:
    rows = [adjacent_row(rng, stage.length) if stage.kind == "adjacent" else
            haystack_row(rng, stage.length, stage.blocks, stage.gap) for _ in range(stage.batch)]
    ids = torch.from_numpy(np.stack([r[0] for r in rows]))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "labels": torch.from_numpy(np.stack([r[1] for r in rows]))}


def training_batches(stages=STAGES, seed: int = SEED) -> list[dict]:
    """Every batch of the curriculum, in order, drawn with ``default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    return [stage_batch(rng, stage) for stage in stages for _ in range(stage.steps)]


def filler_texts(rows: int = EVAL_ROWS, words: int = TEXT_WORDS, seed: int = EVAL_SEED) -> list[str]:
    """``rows`` texts of ``words`` filler words each, seeded: the passkey task's haystack."""
    rng = np.random.default_rng(seed)
    names = vocabulary()
    return [" ".join(names[i - FIRST_FILLER] for i in filler(rng, words)) for _ in range(rows)]


def demo_long_dataset() -> TextDataset:
    """``load_data("demo-long")``: the filler texts (module doc), unlabelled."""
    return TextDataset(filler_texts(), source="demo-long", task="lm", columns={"text": "text"})


def demo_long_dir() -> Path:
    return cache_dir() / RECIPE


def model_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       max_position_embeddings=CONTEXT, rope_theta=ROPE_THETA, tie_word_embeddings=True,
                       attention_dropout=0.0, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                       architectures=["LlamaForCausalLM"])


def heldout_check(model, lengths=CHECK_LENGTHS, rows: int = CHECK_ROWS, seed: int = EVAL_SEED) -> dict:
    """Per length: next-token accuracy on the repeated key tokens of ``rows`` held-out haystack rows (CHECK_BLOCKS
    blocks anywhere in the row, ``default_rng((seed, length))``): the build's own record of how far it copies.
    The passkey task itself is ``evaluate --long-context passkey --model demo-long --data demo-long``."""
    out = {}
    for length in lengths:
        batch = stage_batch(np.random.default_rng((seed, length)), Stage(length, 1, rows, blocks=CHECK_BLOCKS))
        rows_ = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(rows)]   # one row per forward
        out[str(length)] = evaluate(model, rows_, task=Task("lm")).next_token_accuracy
    return out


def train(progress=stderr_progress) -> tuple[torch.nn.Module, object, dict]:
    """Train the long-context model; return (model in eval mode, tokenizer, info)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        start, cpu_start = time.time(), time.process_time()
        tokenizer = make_tokenizer(vocabulary(), context=CONTEXT)
        batches = training_batches()
        model = train_llama(model_config(len(tokenizer)), batches, SEED, LEARNING_RATE, WEIGHT_DECAY, Task("lm").loss,
                            progress)
        train_seconds, train_cpu = time.time() - start, time.process_time() - cpu_start
        check = heldout_check(model)
    finally:
        torch.set_num_threads(threads)
    progress(1.0, f"held-out key-token accuracy by length {check}")
    info = {"recipe": RECIPE, "seed": SEED, "vocab_size": len(tokenizer), "filler_words": FILLER_WORDS,
            "key_words": KEY_WORDS, "layers": LAYERS, "heads": HEADS, "kv_heads": KV_HEADS, "hidden": HIDDEN,
            "intermediate": INTERMEDIATE, "context": CONTEXT, "rope_theta": ROPE_THETA,
            "stages": [vars(s) for s in STAGES], "learning_rate": LEARNING_RATE, "threads": THREADS,
            "parameters": sum(p.numel() for p in model.parameters()), "heldout_accuracy": check,
            "heldout_rows": CHECK_ROWS, "train_seconds": round(train_seconds, 1),
            "train_cpu_seconds": round(train_cpu, 1), "build_seconds": round(time.time() - start, 1),
            "versions": versions()}
    return model, tokenizer, info


def ensure_demo_long_model(progress=None) -> Path:
    """Path of the cached long-context demo, training it first (a few CPU minutes) when it is not there yet."""
    return build_cached(demo_long_dir(), lambda: train(progress or stderr_progress), "long-context demo",
                        lambda info: f"held-out key-token accuracy by length {info['heldout_accuracy']}")


def demo_long_info() -> dict:
    """The recorded facts of the cached long-context demo (builds it when missing)."""
    return read_info(ensure_demo_long_model())
