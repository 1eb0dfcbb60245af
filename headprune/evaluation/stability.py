"""Stability of a pruned model's answers (reported beside accuracy, HIES paper Table 2 and Fig. 5): two measures.

The HIES paper (hies.txt §4, Table 2) reports "stability" as a percentage without defining it; it motivates
stability as "a model's resilience to input perturbations and pruning-induced changes" (§1). Both readings are
measured here, each a named metric (``STABILITY_METRICS``) that trajectories (``trajectory --metric agreement``,
``--stability``) and protocols (``metrics = ["accuracy", "agreement", "stability"]``) report, in percent:

    agreement(mask) = 100 · (1/n) Σ_i [answer_mask(x_i) = answer_dense(x_i)]

the percentage of evaluation rows on which the pruned model gives the dense model's answer (a classifier's argmax
class, or the picked choice of a multiple-choice question). Our choice, documented, and a reading the paper does
not confirm: Table 2's values fall with the ratio -- 93.87-97.14 % at 10 % of the heads pruned, down to 43.62-89.36 %
at 50 % (CoLA under HIS the lowest) -- as an agreement with the unpruned model must (it is 100 % at 0 %), while a
perturbation measure need not fall with pruning. Nothing else in the paper ties Table 2 to a measure: Table 1's
CoLA MCC under HIS at 50 % is 61.14, so the 43.62 % is not a collapsed classifier. The dense model agrees with
itself: 100. ``protocols/hies_table2.toml`` sets Table 2's values against this metric.

The perturbation measure ("resilience to input perturbations"):

    stability(mask) = 100 · (1/n) Σ_i [argmax f_mask(x_i) = argmax f_mask(x̃_i)]

the percentage of evaluation examples whose predicted class is unchanged when the input is perturbed, x̃_i being
x_i with each word dropped independently with probability p (default 0.1; at least one word is kept), drawn
once with a seed so every mask of a trajectory sees the same perturbed inputs.

Words are whitespace-separated words of the decoded text of each segment (sentence pairs keep their two
segments), re-tokenized with the model's tokenizer. Without a tokenizer, sub-word tokens stand in for words
(the first and last real token -- [CLS]/[SEP] or <s>/</s> -- are always kept).

Multiple choice: the prediction is the picked choice (acc's argmax of summed log-likelihoods) of each question,
so stability(mask) = 100 · (1/Q) Σ_q [pick_mask(q) = pick_mask(q̃)]. Only the context is perturbed, once per question
(one draw shared by all its choices, so the choices still compete on the same context); the choices are kept
whole. The context's words are those of its decoded tokens (after the prefix token), re-encoded without special
tokens; without a tokenizer the context's tokens (not the prefix) are dropped instead.
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import DataError
from ..model.task import IGNORE_INDEX, is_choice_batch
from .metrics import choice_predictions, lm_stats, predict

DEFAULT_DROP = 0.1
# the stability measures of the module doc, as metric names (percent; higher is better)
STABILITY_METRICS = ("agreement", "stability")


def drop_words(text: str, p: float, rng: np.random.Generator) -> str:
    words = text.split()
    kept = [w for w, u in zip(words, rng.random(len(words))) if u >= p]
    return " ".join(kept or words[:1])


def _segments(ids: list[int], special: set[int]) -> list[list[int]]:
    """Runs of non-special token ids: one per text segment."""
    runs, current = [], []
    for i in ids:
        if i in special:
            if current:
                runs.append(current)
            current = []
        else:
            current.append(i)
    return runs + [current] if current else runs


def _perturb_row(row: dict, tokenizer, p: float, rng) -> dict:
    ids = row["input_ids"].tolist()
    if tokenizer is None:
        keep = np.ones(len(ids), dtype=bool)
        keep[1:-1] = rng.random(len(ids) - 2) >= p
        return {k: v[torch.as_tensor(keep)] for k, v in row.items()}
    texts = [drop_words(tokenizer.decode(seg), p, rng) for seg in _segments(ids, set(tokenizer.all_special_ids))]
    enc = tokenizer(*texts[:2], truncation=True, max_length=max(len(ids), 2))
    return {k: torch.tensor(enc[k]) for k in row if k in enc}


def _pad(rows: list[dict], pad_id: int) -> dict:
    width = max(len(r["input_ids"]) for r in rows)
    out = {}
    for key in rows[0]:
        fill = pad_id if key == "input_ids" else 0
        out[key] = torch.stack([torch.cat([r[key], r[key].new_full((width - len(r[key]),), fill)]) for r in rows])
    return out


def _drop_context(context: list[int], tokenizer, p: float, rng) -> list[int]:
    """A multiple-choice row's context ids (prefix token first) with words dropped; the prefix is kept."""
    prefix, body = context[:1], context[1:]
    if not body:
        return context
    if tokenizer is None:
        keep = rng.random(len(body)) >= p
        return prefix + ([t for t, k in zip(body, keep) if k] or body[:1])
    return prefix + tokenizer.encode(drop_words(tokenizer.decode(body), p, rng), add_special_tokens=False)


def _perturb_choice_batch(batch: dict, tokenizer, p: float, rng, pad_id: int) -> dict:
    """``batch`` of (question, choice) rows with each question's context perturbed once (module doc)."""
    valid = batch["attention_mask"].bool()
    target = batch["labels"] != IGNORE_INDEX
    contexts: dict[int, list[int]] = {}
    rows = []
    for i, q in enumerate(batch["index"]):
        ids, scored = batch["input_ids"][i][valid[i]], target[i][valid[i]]
        if q not in contexts:
            contexts[q] = _drop_context(ids[~scored].tolist(), tokenizer, p, rng)
        rows.append((contexts[q], ids[scored].tolist()))
    width = max(len(c) + len(t) for c, t in rows)
    new = {"input_ids": torch.full((len(rows), width), pad_id, dtype=torch.long),
           "attention_mask": torch.zeros((len(rows), width), dtype=torch.long),
           "labels": torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)}
    for i, (context, continuation) in enumerate(rows):
        n = len(context) + len(continuation)
        new["input_ids"][i, :n] = torch.tensor(context + continuation)
        new["attention_mask"][i, :n] = 1
        new["labels"][i, len(context):n] = torch.tensor(continuation)
    new.update({k: v for k, v in batch.items() if k not in new})
    return new


def perturb_batches(batches: list[dict], tokenizer=None, p: float = DEFAULT_DROP, seed: int = 0) -> list[dict]:
    """Copies of ``batches`` with words dropped (see module doc); labels and ``index`` are carried over.
    Multiple-choice batches: each question's context perturbed once, its choices kept."""
    if not 0.0 <= p < 1.0:
        raise DataError(f"Word-drop probability must lie in [0, 1); got {p}.")
    rng = np.random.default_rng(seed)
    pad_id = getattr(tokenizer, "pad_token_id", None) or 0
    out = []
    for batch in batches:
        if is_choice_batch(batch):
            out.append(_perturb_choice_batch(batch, tokenizer, p, rng, pad_id))
            continue
        keys = [k for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch]
        valid = batch["attention_mask"].bool()
        rows = [_perturb_row({k: batch[k][i][valid[i]] for k in keys}, tokenizer, p, rng) for i in range(len(valid))]
        new = _pad(rows, pad_id)
        new.update({k: v for k, v in batch.items() if k not in keys})
        out.append(new)
    return out


def same_answers(clean, perturbed) -> float:
    """Percentage of entries equal in two (n,) prediction vectors (classes, or picked choices)."""
    return 100.0 * float(np.mean(np.asarray(clean) == np.asarray(perturbed)))


def agreement(clean_logits: torch.Tensor, perturbed_logits: torch.Tensor) -> float:
    """Percentage of rows whose argmax class is the same in both."""
    if clean_logits.shape[-1] < 2:
        raise DataError("Stability compares predicted classes; a regression head has none.")
    return same_answers(clean_logits.argmax(-1), perturbed_logits.argmax(-1))


def answers(model, batches: list[dict], mask=None, device=None) -> np.ndarray:
    """(n,) the model's answer per row under ``mask``: a classifier's argmax class, or per question the picked
    choice of multiple-choice data. A regression head or a language model on plain text gives none (DataError)."""
    if is_choice_batch(batches[0]):
        return np.asarray(choice_predictions(lm_stats(model, batches, mask, device), batches)[0])
    if "labels" in batches[0] and batches[0]["labels"].ndim > 1:
        raise DataError("Stability compares the answers a model gives (a classifier's class, or the picked choice "
                        "of multiple-choice data); a language model on plain text gives none.")
    logits = predict(model, batches, mask, device)
    if logits.shape[-1] < 2:
        raise DataError("Stability compares predicted classes; a regression head has none.")
    return logits.argmax(-1).numpy()


def stability(model, batches: list[dict], perturbed: list[dict], mask=None, device=None) -> float:
    """stability(mask) of the module doc, on ``batches`` and their ``perturbed`` copies."""
    return same_answers(answers(model, batches, mask, device), answers(model, perturbed, mask, device))


def dense_agreement(model, batches: list[dict], mask=None, device=None, dense: np.ndarray | None = None) -> float:
    """agreement(mask) of the module doc: % of ``batches``' rows answered as the model without a mask answers them
    (``dense``: those answers, ``answers(model, batches)``, when already computed)."""
    reference = answers(model, batches, None, device) if dense is None else dense
    return same_answers(reference, answers(model, batches, mask, device))
