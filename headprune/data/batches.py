"""From rows to model inputs: a seeded calibration/evaluation split, tokenized length-sorted batches.

Language-model data (``task="lm"``) has no labels: a batch's ``labels`` are its input ids with padding masked
(``headprune.model.task.lm_labels``), and the loss shifts them by one position. Decoders often have no pad token:
the rule (``headprune.model.tokenizer.pad_token_of``) is the tokenizer's pad token, else its EOS, else its UNK;
padding is masked by the attention mask, so a real EOS is still a target. ``split_calib_eval`` draws a seeded
calibration set (for scoring heads) and a disjoint evaluation set (for the metric). ``make_batches`` tokenizes
once, truncates, sorts by length and pads each batch only to its own longest row, so little compute is spent on
padding.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..errors import DataError
from ..model.task import IGNORE_INDEX, lm_labels
from ..model.tokenizer import context_of, pad_token_of
from .choice import make_choice_batches
from .dataset import NON_INPUT_KEYS, TextDataset


class TruncationWarning(UserWarning):
    """Rows longer than the model's context were cut to it (the CLI prints this on stderr)."""


def split_calib_eval(ds: TextDataset, calib_size: int, eval_size: int | None,
                     seed: int = 0) -> tuple[TextDataset, TextDataset]:
    """Disjoint seeded (calibration, evaluation) subsets.

    One permutation of the rows; evaluation takes its first ``eval_size`` rows (None = all rows the
    calibration set leaves) and calibration the next ``calib_size``, so the evaluation set does not move when
    only the calibration size changes.
    """
    n = len(ds)
    if n == 0:
        raise DataError(f"{ds.source} is empty: nothing to split.")
    if calib_size < 0 or (eval_size is not None and eval_size < 0):
        raise DataError(f"Split sizes must be >= 0; got calibration {calib_size}, evaluation {eval_size}.")
    if calib_size + (eval_size or 0) > n:
        raise DataError(f"Asked for {calib_size} calibration + {eval_size} evaluation examples, but {ds.source} "
                        f"has only {n}. Choose sizes that sum to at most {n}.")
    if eval_size is None:
        eval_size = n - calib_size
    order = np.random.default_rng(seed).permutation(n)
    return ds.subset(order[eval_size:eval_size + calib_size]), ds.subset(order[:eval_size])


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def _encode(tokenizer, ds: TextDataset, max_length: int) -> dict:
    """Tokenize ``ds`` truncated to ``max_length`` and to the model's context; warn (TruncationWarning) about
    rows longer than that context, which is not the user's choice the way ``max_length`` is."""
    context = context_of(tokenizer)
    if context is None or context >= max_length:
        return tokenizer(ds.texts, ds.pairs, truncation=True, max_length=max_length)
    # One token more than fits shows which rows overflow without tokenizing every row twice.
    enc = tokenizer(ds.texts, ds.pairs, truncation=True, max_length=context + 1)
    long_rows = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > context]
    if long_rows:
        cut = tokenizer([ds.texts[i] for i in long_rows],
                        None if ds.pairs is None else [ds.pairs[i] for i in long_rows],
                        truncation=True, max_length=context)
        for key in enc:
            for row, values in zip(long_rows, cut[key]):
                enc[key][row] = values
        warnings.warn(f"{ds.source}: {len(long_rows)} of {len(ds)} rows are longer than the model's context of "
                      f"{context} tokens and were truncated to it (--max-length {max_length} asked for more).",
                      TruncationWarning, stacklevel=3)
    return enc


def make_batches(tokenizer, ds: TextDataset, batch_size: int = 32, max_length: int = 128,
                 sort_by_length: bool = True) -> list[dict]:
    """Tokenized batches: input_ids, attention_mask, (token_type_ids), labels, and ``index`` (dataset rows).

    Rows are truncated to ``max_length`` tokens, and to the model's context (``tokenizer.model_max_length`` as
    ``prepare_tokenizer`` set it) with a TruncationWarning, and, with ``sort_by_length``, grouped by length so
    each batch is padded (on the right, with the pad token of ``prepare_tokenizer``'s rule) only to its own
    longest row. Labels are a LongTensor, or a FloatTensor for regression; for language-model data (``ds.task ==
    "lm"``) they are the input ids with padding set to -100 (``headprune.task.lm_labels``); other data without
    labels gives batches without "labels". Pass ``model_inputs(batch)`` to a model, not the batch itself.
    Multiple-choice data gives one row per (question, choice), a question's rows in one batch
    (``headprune.data.choice.make_choice_batches``).
    """
    if len(ds) == 0:
        raise DataError(f"{ds.source} is empty: nothing to batch.")
    if batch_size < 1 or max_length < 2:
        raise DataError(f"batch_size must be >= 1 and max_length >= 2; got {batch_size} and {max_length}.")
    if ds.task == "multiple_choice":
        return make_choice_batches(tokenizer, ds, batch_size, max_length, sort_by_length)
    if ds.labels is not None and any(not isinstance(v, (int, float)) for v in ds.labels):
        raise DataError(f"{ds.source}: labels are names, not ids; call align_labels(ds, model.config.id2label).")
    enc = _encode(tokenizer, ds, max_length)
    # character offset of every token, to leave the context of ``ds.targets_from`` out of the targets; special
    # tokens have offset (0, 0) and so are context (a row's <bos> is never a target anyway)
    starts = None if ds.targets_from is None else tokenizer(
        ds.texts, truncation=True, max_length=len(max(enc["input_ids"], key=len)),
        return_offsets_mapping=True)["offset_mapping"]
    lengths = [len(ids) for ids in enc["input_ids"]]
    order = sorted(range(len(ds)), key=lambda i: lengths[i]) if sort_by_length else list(range(len(ds)))
    pad_id = tokenizer.pad_token_id
    if pad_id is None:  # a tokenizer prepare_tokenizer has not seen: the same rule
        pad_id = tokenizer.convert_tokens_to_ids(pad_token_of(tokenizer))
    pad_values = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
    label_dtype = torch.float32 if ds.task == "regression" else torch.long
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batch = {k: _pad([enc[k][i] for i in index], v) for k, v in pad_values.items() if k in enc}
        if ds.task == "lm":
            batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
            if ds.targets_from is not None:
                context = _pad([[int(start < ds.targets_from[i]) for start, _ in starts[i]] for i in index], 1)
                batch["labels"] = batch["labels"].masked_fill(context.bool(), IGNORE_INDEX)
        elif ds.labels is not None:
            batch["labels"] = torch.tensor([ds.labels[i] for i in index], dtype=label_dtype)
        batch["index"] = index
        batches.append(batch)
    return batches


def model_inputs(batch: dict) -> dict:
    """The keys of ``batch`` a model takes (drops labels and row indices)."""
    return {k: v for k, v in batch.items() if k not in NON_INPUT_KEYS}


def batch_texts(ds: TextDataset, batches: list[dict]) -> list[list[str | tuple[str, str]]]:
    """Raw texts of each batch, row for row (for code that needs words, e.g. syntax): a row of a sentence-pair
    dataset is its ``(text, pair)`` tuple, the two texts the model read, so a parser sees both."""
    if ds.pairs is None:
        return [[ds.texts[i] for i in b["index"]] for b in batches]
    return [[(ds.texts[i], ds.pairs[i]) for i in b["index"]] for b in batches]


def calibration_texts(ds: TextDataset, batches: list[dict]) -> list[str | tuple[str, str]]:
    """``batch_texts`` flattened in batch order: the ``texts`` a ScoringContext over ``batches`` takes."""
    return [t for rows in batch_texts(ds, batches) for t in rows]
