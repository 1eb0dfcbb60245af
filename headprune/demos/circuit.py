"""The circuit demo: a 3-layer Llama LM trained so that predicting a repeated block needs an induction circuit.

The answer is known. On [BOS] + r + r, with r a block of n distinct random words, the first copy of r cannot be
predicted and the second can only be copied from context: at query i (word r_k of the second copy) the model must
find the earlier r_k and read the word after it. Olsson et al. (2022) show that models learn this with a
previous-token head in an early layer (each position writes down the word before it) and induction heads in a later
one (which match that on the current word and copy the next one). Measured on this build: previous-token heads in
layer 0, induction heads in layer 1, and layer 2 left to the review sentences. A student can check which heads a
criterion keeps against that ground truth (docs/tutorials/circuit.md; tests/test_circuit.py measures it).

    vocabulary  word level: the VOCAB_WORDS most frequent lower-cased words and punctuation of the training reviews
                (``corpus.demo_split``), plus <pad> (0), <bos> (1), <eos> (2), <unk> (3); a row reads <bos> words
    training    STEPS steps of BATCH_SIZE rows, seeded (SEED): a TEXT_SHARE of the rows are review sentences (so
                some heads learn other things than copying), the rest repeats [BOS] + r + r with n drawn from
                BLOCK_MIN..BLOCK_MAX and r sampled without replacement from the vocabulary words; only the second
                copy's words after its first are targets of a repeat row (the first copy and the first repeated
                word cannot be predicted); AdamW as the LM demo (``build.train_steps``), 1 thread
    model       LlamaForCausalLM: LAYERS layers x HEADS heads (no grouping), hidden HIDDEN, MLP INTERMEDIATE, tied
                embeddings, context CONTEXT (RoPE)
    data        ``load_data("demo-circuit")``: EVAL_ROWS repeats drawn with seed EVAL_SEED, as text with
                ``targets_from`` at the second copy's second word, so next-token accuracy (and perplexity) is
                measured on the repeated half only; chance is 1 / VOCAB_WORDS
    choices     ``load_data("demo-circuit-choice")`` (multiple choice, ``demo_circuit_choice_dataset``): one question
                per block of ``repeat_rows(vocabulary(), CHOICE_ROWS, CHOICE_SEED)`` (the held-out blocks of
                ``load_data("demo-circuit")``): the context "r r[:j]" ([BOS] + r + r[:j] once tokenized), j
                drawn in 1..n-1 (the second copy's first word cannot be predicted); the right choice r[j] and
                CHOICE_OPTIONS - 1 distractors drawn without replacement from the OTHER words of r, in seeded
                order. Every choice already occurs in the context, so a model that copies any word of the block is
                at chance (1 / CHOICE_OPTIONS); only the word after the current word's earlier occurrence
                (induction) is right
Cached like every demo (``build.build_cached``).
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import LlamaConfig, PreTrainedTokenizerFast

from ..data import TextDataset, make_batches
from ..evaluation.metrics import evaluate
from ..model.task import IGNORE_INDEX, Task
from ..provenance import versions
from .build import build_cached, cache_dir, read_info, stderr_progress, train_llama
from .corpus import SEED, demo_split, reviews

RECIPE = "demo-circuit-llama-v2"   # bump when anything below changes: the cache folder is named after it
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")   # ids 0..3
VOCAB_WORDS = 500
LAYERS = 3
HEADS = 8
HIDDEN = 64
INTERMEDIATE = 128
CONTEXT = 64
BLOCK_MIN, BLOCK_MAX = 8, 24
TEXT_SHARE = 0.5
STEPS = 1200
BATCH_SIZE = 32
LEARNING_RATE = 3e-3
WEIGHT_DECAY = 0.01
THREADS = 1
EVAL_ROWS = 256
EVAL_SEED = 1
CHOICE_ROWS = 256
CHOICE_SEED = 1
CHOICE_OPTIONS = 4
WORD = re.compile(r"\w+|[^\w\s]")


def demo_circuit_dir() -> Path:
    return cache_dir() / RECIPE


def vocabulary() -> list[str]:
    """The VOCAB_WORDS most frequent words and punctuation marks of the training reviews (ties: first seen)."""
    counts = Counter(w for i in demo_split()[0] for w in WORD.findall(reviews().texts[i].lower()))
    return [w for w, _ in counts.most_common(VOCAB_WORDS)]


def make_tokenizer(words: list[str], context: int = CONTEXT) -> PreTrainedTokenizerFast:
    """Word-level tokenizer: lower-cases, splits words and punctuation, reads a row as <bos> words (<unk> else);
    ``context``: its model_max_length (the long-context demo reuses it at 4,096)."""
    pad, bos, eos, unk = SPECIAL_TOKENS
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *words])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=unk))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, vocab[bos])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk,
                                   model_max_length=context)


def repeat_rows(words: list[str], rows: int, seed: int) -> TextDataset:
    """``rows`` texts "r r" (r: n distinct vocabulary words, n in BLOCK_MIN..BLOCK_MAX, seeded) with
    ``targets_from`` at the second copy's second word: the language-model data of ``load_data("demo-circuit")``."""
    rng = np.random.default_rng(seed)
    texts, starts = [], []
    for _ in range(rows):
        block = [words[i] for i in rng.permutation(len(words))[:rng.integers(BLOCK_MIN, BLOCK_MAX + 1)]]
        first = " ".join(block)
        texts.append(f"{first} {first}")
        starts.append(len(first) + 2 + len(block[0]))     # after "r " and the second copy's first word
    return TextDataset(texts, source="demo-circuit", task="lm", columns={"text": "text"}, targets_from=starts)


def demo_circuit_dataset() -> TextDataset:
    """EVAL_ROWS held-out repeats (seed EVAL_SEED), scored on the repeated half (module doc)."""
    return replace(repeat_rows(vocabulary(), EVAL_ROWS, EVAL_SEED), source="demo-circuit")


def choice_questions(rows: int = CHOICE_ROWS, seed: int = CHOICE_SEED) -> list[tuple[str, list[str], int]]:
    """(context, choices, answer index) of ``rows`` induction questions (module doc, "choices"), seeded."""
    rng = np.random.default_rng(seed)
    questions = []
    for text in repeat_rows(vocabulary(), rows, seed).texts:
        words = text.split()
        block = words[:len(words) // 2]
        j = int(rng.integers(1, len(block)))
        others = [w for k, w in enumerate(block) if k != j]
        options = [block[j], *(others[k] for k in rng.choice(len(others), CHOICE_OPTIONS - 1, replace=False))]
        order = rng.permutation(CHOICE_OPTIONS)
        questions.append((" ".join(block + block[:j]), [options[k] for k in order],
                          int(np.flatnonzero(order == 0)[0])))
    return questions


def demo_circuit_choice_dataset(rows: int = CHOICE_ROWS, seed: int = CHOICE_SEED) -> TextDataset:
    """The induction questions as multiple-choice data (``source="demo-circuit-choice"``; module doc)."""
    questions = choice_questions(rows, seed)
    return TextDataset(texts=[q[0] for q in questions], labels=[q[2] for q in questions],
                       choices=[q[1] for q in questions], source="demo-circuit-choice", task="multiple_choice",
                       columns={"context": "context", "choices": "choices", "answer": "answer", "field_map": "generic"})


def training_batches(tokenizer, words: list[str]) -> list[dict]:
    """STEPS batches of BATCH_SIZE rows, each row a review sentence (TEXT_SHARE of them, every word a target) or a
    repeat [BOS] + r + r (targets: the second copy after its first word), seeded (module doc). Built from token
    ids directly: every vocabulary word is one token, so this equals tokenizing ``repeat_rows`` text."""
    rng = np.random.default_rng(SEED)
    bos = tokenizer.bos_token_id
    texts = tokenizer([reviews().texts[i] for i in demo_split()[0]], truncation=True, max_length=CONTEXT)["input_ids"]
    first_word = len(SPECIAL_TOKENS)
    batches = []
    for _ in range(STEPS):
        rows, targets = [], []
        for _ in range(BATCH_SIZE):
            if rng.random() < TEXT_SHARE:
                row = texts[rng.integers(len(texts))]
                rows.append(row)
                targets.append(row)
            else:
                n = int(rng.integers(BLOCK_MIN, BLOCK_MAX + 1))
                block = (rng.permutation(len(words))[:n] + first_word).tolist()
                rows.append([bos, *block, *block])
                targets.append([IGNORE_INDEX] * (n + 2) + block[1:])
        width = max(map(len, rows))
        ids = np.zeros((BATCH_SIZE, width), dtype=np.int64)
        mask = np.zeros_like(ids)
        labels = np.full_like(ids, IGNORE_INDEX)
        for k, (row, target) in enumerate(zip(rows, targets)):
            ids[k, :len(row)] = row
            mask[k, :len(row)] = 1
            labels[k, :len(row)] = target
        batches.append({"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
                        "labels": torch.from_numpy(labels)})
    return batches


def model_config(vocab_size: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                       num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                       max_position_embeddings=CONTEXT, tie_word_embeddings=True, attention_dropout=0.0,
                       pad_token_id=0, bos_token_id=1, eos_token_id=2, architectures=["LlamaForCausalLM"])


def train(progress=stderr_progress) -> tuple[torch.nn.Module, object, dict]:
    """Train the circuit model; return (model in eval mode, tokenizer, info)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS)
    try:
        start, cpu_start = time.time(), time.process_time()
        words = vocabulary()
        tokenizer = make_tokenizer(words)
        batches = training_batches(tokenizer, words)
        model = train_llama(model_config(len(tokenizer)), batches, SEED, LEARNING_RATE, WEIGHT_DECAY, Task("lm").loss,
                            progress)
        train_seconds, train_cpu = time.time() - start, time.process_time() - cpu_start
        metrics = evaluate(model, make_batches(tokenizer, demo_circuit_dataset(), 64, CONTEXT), task=Task("lm"))
    finally:
        torch.set_num_threads(threads)
    progress(1.0, f"repeated-half next-token accuracy {metrics.next_token_accuracy:.3f}")
    info = {"recipe": RECIPE, "seed": SEED, "vocab_size": len(tokenizer), "vocab_words": VOCAB_WORDS,
            "layers": LAYERS, "heads": HEADS, "hidden": HIDDEN, "intermediate": INTERMEDIATE, "context": CONTEXT,
            "block": [BLOCK_MIN, BLOCK_MAX], "text_share": TEXT_SHARE, "steps": STEPS, "batch_size": BATCH_SIZE,
            "learning_rate": LEARNING_RATE, "threads": THREADS, "eval_rows": EVAL_ROWS, "eval_seed": EVAL_SEED,
            "parameters": sum(p.numel() for p in model.parameters()), "chance": 1 / VOCAB_WORDS,
            "heldout_metrics": metrics.to_dict(), "next_token_accuracy": metrics.next_token_accuracy,
            "train_seconds": round(train_seconds, 1), "train_cpu_seconds": round(train_cpu, 1),
            "build_seconds": round(time.time() - start, 1), "versions": versions()}
    return model, tokenizer, info


def ensure_demo_circuit_model(progress=None) -> Path:
    """Path of the cached circuit demo, training it first (about two CPU minutes) when it is not there yet."""
    return build_cached(demo_circuit_dir(), lambda: train(progress or stderr_progress), "circuit demo",
                        lambda info: f"repeated-half next-token accuracy {info['next_token_accuracy']:.3f}")


def demo_circuit_info() -> dict:
    """The recorded facts of the cached circuit demo (builds it when missing)."""
    return read_info(ensure_demo_circuit_model())
