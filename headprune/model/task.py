"""The one place that knows the task kinds: "classification", "regression", "lm" (causal language modelling) and
"multiple_choice" (a causal LM choosing among answers by their log-likelihood).

Evaluation, live evaluation, trajectories and criteria ask a :class:`Task` for the loss, the metrics' direction and
the output distribution, instead of testing ``num_labels`` or the model class themselves.

Detection (:func:`task_of`)
    A model whose class is a ``*ForCausalLM`` / ``*LMHeadModel`` (an output layer over the vocabulary) is "lm";
    any other head is a classifier: "regression" when it has one output (``num_labels == 1``, STS-B style),
    "classification" otherwise. ``--task lm|classification`` may confirm the detected kind; asking for a kind the
    head cannot compute (``lm`` on a classifier, ``classification`` on a language model) is a :class:`TaskError`.

Language-model loss (labels = the input ids, padding masked; see ``headprune.data.make_batches``)
    Position t predicts token t+1: with logits z_{b,t} ∈ R^V and targets y_{b,t+1}, the token loss is
        ℓ_{b,t} = −log softmax(z_{b,t})[y_{b,t+1}]        for t = 0..T−2 where y_{b,t+1} is a real token
    (a target is real when its attention-mask entry is 1; padding targets carry the label −100 and are skipped).
    The first token of a row is context only: it is never predicted (a BOS token, when the tokenizer adds one).
    Per example:  L_b = (1/n_b) Σ_t ℓ_{b,t}, with n_b the row's real targets (rows of different length count
    equally in the per-example loss, which criteria average over examples).
    Over a dataset the loss is **token-weighted**, the standard for perplexity:
        loss = Σ_{b,t} ℓ_{b,t} / Σ_b n_b,      perplexity = exp(loss),
        next-token accuracy = (1/Σ_b n_b) Σ_{b,t} [argmax z_{b,t} = y_{b,t+1}],
    so a long document weighs as much as the short ones holding as many tokens.
    Lower loss and perplexity are better; higher next-token accuracy is better.

Classification loss: L_b = −log softmax(z_b)[y_b];  regression (one output): L_b = (z_b − y_b)².

Multiple choice (``multiple_choice``; data with a context, choices and the right one's index, see
``headprune.data.choice``; a causal LM's head, chosen from the DATA: :func:`task_for`)
    One row per (question q, choice c): <prefix> context + continuation, labels = the continuation's token ids and
    IGNORE_INDEX elsewhere, so the LM token loss above sums over the continuation only. The choice's score is its
    summed log-likelihood (lm-evaluation-harness ``loglikelihood``)
        ll_{q,c} = Σ_{t in continuation} log softmax(z_{t−1})[y_t] = −Σ_t ℓ_{b,t},
    and with g_q the right choice (lm-eval ``api/task.py``, ``np.argmax``: the first of tied maxima):
        acc       = (1/Q) Σ_q [argmax_c ll_{q,c} = g_q]
        acc_norm  = (1/Q) Σ_q [argmax_c ll_{q,c} / len(choice_c) = g_q]      (length in characters, no separator)
        acc_bytes = (1/Q) Σ_q [argmax_c ll_{q,c} / bytes(choice_c) = g_q]    (UTF-8 bytes)
    each with lm-eval's standard error (``api/metrics.py`` ``mean_stderr``): sample standard deviation (n − 1) of the
    0/1 correctness over √Q. Loss (criteria that need one): the negative log-likelihood of the right choice only,
        L_q = −ll_{q,g_q}   (summed over its tokens, not averaged: the quantity acc compares);
    rows of the other choices contribute 0 (``per_example_loss``), and ``loss`` is the mean over questions.

Output distribution (for KL between an intact and an ablated model)
    classification: softmax(z_b) over the classes, one row per example;
    lm: softmax(z_{b,t}) over the vocabulary at every real (non-padding) position t of every row, including the last
    (a next-token distribution needs no target); rows keep their (B, T) layout so a caller can average per row.
    multiple_choice: softmax(z_{b,t}) at the positions that predict a continuation token (t with y_{b,t+1} a
    target): what the choice's score is made of; the context's own next-token predictions do not decide an answer.
    Classes are compared in float64; a vocabulary-sized distribution in float32 (a float64 copy of (B, T, V) per
    ablation would dominate the memory of KL scoring).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import HeadpruneError

KINDS = ("classification", "regression", "lm", "multiple_choice")
REQUESTABLE = ("lm", "classification")   # what --task accepts; regression is a classifier head with one output
IGNORE_INDEX = -100                       # label of a padding target (the transformers / PyTorch convention)
_LM_CLASS_MARKS = ("ForCausalLM", "LMHeadModel")
# Per-row keys of a multiple-choice batch (headprune.data.choice), besides the LM ones and ``index`` (= the question):
# which choice the row holds, whether it is the right one, and the choice's length in characters and UTF-8 bytes.
CHOICE_KEY, GOLD_KEY, CHARS_KEY, BYTES_KEY = "choice", "gold", "choice_chars", "choice_bytes"
CHOICE_KEYS = (CHOICE_KEY, GOLD_KEY, CHARS_KEY, BYTES_KEY)


class TaskError(HeadpruneError):
    """A task the model's head cannot compute (e.g. ``--task lm`` on a classifier)."""


@dataclass(frozen=True)
class Task:
    """A task kind with its headline metric, the metric's direction, and its loss and output distribution."""

    kind: str

    def __post_init__(self):
        if self.kind not in KINDS:
            raise TaskError(f"Unknown task '{self.kind}'. Accepted: {', '.join(KINDS)}.")

    @property
    def is_lm(self) -> bool:
        """A causal LM's next-token output: language modelling, and multiple choice (scored from the same tokens)."""
        return self.kind in ("lm", "multiple_choice")

    @property
    def is_choice(self) -> bool:
        return self.kind == "multiple_choice"

    @property
    def headline(self) -> str:
        """Name of the ``Metrics`` field a summary leads with."""
        return {"classification": "accuracy", "regression": "pearson", "lm": "perplexity",
                "multiple_choice": "acc"}[self.kind]

    @property
    def higher_is_better(self) -> bool:
        """Direction of the headline metric: a lower perplexity is better."""
        return HIGHER_IS_BETTER[self.headline]

    def per_example_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """(B,) loss L_b of each row (module doc): row-mean next-token cross-entropy for LM, cross-entropy or
        squared error for a classifier. Differentiable (criteria take gradients of it)."""
        labels = batch["labels"].to(logits.device)
        if self.is_choice:   # −ll of the right choice's row, 0 for the other rows (module doc)
            token_loss, _ = lm_token_losses(logits, labels)
            return token_loss.sum(-1) * batch[GOLD_KEY].to(logits.device).to(token_loss.dtype)
        if self.is_lm:
            token_loss, real = lm_token_losses(logits, labels)
            return token_loss.sum(-1) / real.sum(-1).clamp(min=1)
        if self.kind == "regression":
            return (logits[:, 0] - labels.to(logits.dtype)) ** 2
        return F.cross_entropy(logits, labels.long(), reduction="none")

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """Scalar loss of a batch: token-weighted mean for LM (Σ ℓ / Σ n_b), mean over rows for a classifier, mean
        over the batch's questions of the right choice's −ll for multiple choice."""
        if self.is_choice:
            return self.per_example_loss(logits, batch).sum() / batch[GOLD_KEY].sum().clamp(min=1)
        if self.is_lm:
            token_loss, real = lm_token_losses(logits, batch["labels"].to(logits.device))
            return token_loss.sum() / real.sum().clamp(min=1)
        return self.per_example_loss(logits, batch).mean()

    def output_log_probs(self, logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log p, real): the log-distributions compared by KL (module doc) and which entries are real.

        classification / regression: log p (B, C) float64, real None (every row counts);
        lm: log p (B, T, V) float32 and real (B, T) bool, the real (non-padding) positions of each row;
        multiple_choice: the same log p, real = the positions predicting a continuation token.
        """
        if not self.is_lm:
            return F.log_softmax(logits.double(), dim=-1), None
        if self.is_choice:
            targets = batch["labels"].to(logits.device)[:, 1:] != IGNORE_INDEX
            return F.log_softmax(logits.float(), dim=-1), F.pad(targets, (0, 1), value=False)
        return F.log_softmax(logits.float(), dim=-1), batch["attention_mask"].to(logits.device).bool()


# The direction of every metric ``headprune.evaluate.Metrics`` can hold.
HIGHER_IS_BETTER = {"accuracy": True, "f1": True, "macro_f1": True, "mcc": True, "pearson": True,
                    "spearman": True, "next_token_accuracy": True, "loss": False, "mse": False, "perplexity": False,
                    "acc": True, "acc_norm": True, "acc_bytes": True,
                    # percent of answers kept: as the dense model's, or under word drop (evaluation.stability)
                    "agreement": True, "stability": True}
CHOICE_METRICS = ("acc", "acc_norm", "acc_bytes")   # the multiple-choice task's metric set (lm-eval's names)


def lm_labels(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Labels of a language-model batch: the input ids, with IGNORE_INDEX where the attention mask is 0."""
    return input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)


def lm_token_losses(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(ℓ, real): (B, T−1) next-token cross-entropy ℓ_{b,t} = −log softmax(z_{b,t})[y_{b,t+1}] (0 where the target
    is padding) and the (B, T−1) bool mask of real targets. Computed in float32 at least."""
    targets = labels[:, 1:]
    real = targets != IGNORE_INDEX
    z = logits[:, :-1]
    z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    token_loss = F.cross_entropy(z.transpose(1, 2), targets.masked_fill(~real, 0), reduction="none")
    return token_loss * real, real


@torch.no_grad()
def lm_row_stats(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, 3) float64 per row: [Σ_t ℓ_{b,t}, n_b real targets, correct next-token predictions].

    Sums, not means, so rows and batches add up to the token-weighted dataset metrics (``lm_metrics``) without
    keeping a (B, T, V) logits tensor per batch. ``logits`` may cover only the last T' <= T positions (a forward
    with ``logits_to_keep``): the labels are aligned to them.
    """
    labels = labels[:, labels.shape[1] - logits.shape[1]:]
    token_loss, real = lm_token_losses(logits, labels)
    correct = (logits[:, :-1].argmax(-1) == labels[:, 1:]) & real
    return torch.stack([token_loss.double().sum(-1), real.double().sum(-1), correct.double().sum(-1)], dim=-1).cpu()


# Positions scored at once by ``lm_row_stats_chunked``: bounds its logits at 1,024 x V float32 (206 MB with GPT-2's
# 50,257 words, 16 MB with demo-lm's 4,096), where a (32, 128, V) batch held 823 MB of logits and as much again of
# log-softmax.
CHUNK_POSITIONS = 1024


@torch.no_grad()
def lm_row_stats_chunked(hidden: torch.Tensor, output_head, labels: torch.Tensor,
                         chunk: int = CHUNK_POSITIONS) -> torch.Tensor:
    """``lm_row_stats`` from the hidden states that enter the output head, without a (B, T, V) logits tensor.

    Only positions with a real next-token target go through ``output_head`` (padding and each row's last position
    are skipped), ``chunk`` positions at a time, so at most (chunk, V) logits exist at once instead of the (B, T, V)
    logits plus their float32 log-softmax. Same per-row sums as ``lm_row_stats(output_head(hidden), labels)`` up to
    float rounding (tests/test_decoders.py). ``hidden`` may cover only the last T' <= T positions, as there.
    """
    labels = labels[:, labels.shape[1] - hidden.shape[1]:].to(hidden.device)
    targets = labels[:, 1:]
    rows, cols = (targets != IGNORE_INDEX).nonzero(as_tuple=True)
    picked, wanted = hidden[:, :-1][rows, cols], targets[rows, cols]
    loss = torch.empty(len(rows), dtype=torch.float64, device=hidden.device)
    correct = torch.empty(len(rows), dtype=torch.float64, device=hidden.device)
    for start in range(0, len(rows), chunk):
        z = output_head(picked[start:start + chunk])
        z = z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
        y = wanted[start:start + chunk]
        loss[start:start + chunk] = F.cross_entropy(z, y, reduction="none").double()
        correct[start:start + chunk] = (z.argmax(-1) == y).double()
    stats = torch.zeros(hidden.shape[0], 3, dtype=torch.float64, device=hidden.device)
    stats[:, 0].index_add_(0, rows, loss)
    stats[:, 1].index_add_(0, rows, torch.ones_like(loss))
    stats[:, 2].index_add_(0, rows, correct)
    return stats.cpu()


def lm_metrics(stats: torch.Tensor) -> dict:
    """Token-weighted dataset metrics from ``lm_row_stats`` rows: loss, perplexity = exp(loss), next-token
    accuracy, rows ``n`` and target ``tokens`` (module doc)."""
    nll, tokens, correct = (float(v) for v in stats.sum(0))
    if tokens == 0:
        raise TaskError("No next-token targets: every row has fewer than two tokens, so nothing can be predicted.")
    loss = nll / tokens
    return {"n": int(stats.shape[0]), "tokens": int(tokens), "loss": loss,
            "perplexity": float(torch.tensor(loss, dtype=torch.float64).exp()),
            "next_token_accuracy": correct / tokens}


def choice_metrics(loglik, question, gold, chars, n_bytes) -> dict:
    """acc, acc_norm, acc_bytes and their ``*_stderr`` (module doc) from per-row arrays in dataset order.

    Parameters
    ----------
    loglik : (R,) summed log-likelihood ll_{q,c} of each row's continuation (= −Σ ℓ of ``lm_row_stats``).
    question : (R,) question of each row; a question's rows are consecutive, in choice order.
    gold : (R,) bool, the right choice's row; chars, n_bytes : (R,) the choice's length in characters / bytes.

    Returns
    -------
    {"n": questions, "loss": mean −ll of the right choices, "acc", "acc_norm", "acc_bytes", "acc_stderr", ...}.
    """
    ll, q = np.asarray(loglik, dtype=np.float64), np.asarray(question)
    gold, chars, n_bytes = np.asarray(gold, bool), np.asarray(chars, np.float64), np.asarray(n_bytes, np.float64)
    starts = np.flatnonzero(np.r_[True, q[1:] != q[:-1]])
    ends = np.r_[starts[1:], len(q)]
    if len(starts) == 0:
        raise TaskError("No questions to score: the multiple-choice data is empty.")
    right = {name: np.empty(len(starts)) for name in CHOICE_METRICS}
    gold_ll = np.empty(len(starts))
    for i, (a, b) in enumerate(zip(starts, ends)):
        g = int(np.flatnonzero(gold[a:b])[0])
        gold_ll[i] = ll[a + g]
        for name, score in (("acc", ll[a:b]), ("acc_norm", ll[a:b] / chars[a:b]),
                            ("acc_bytes", ll[a:b] / n_bytes[a:b])):
            right[name][i] = float(np.argmax(score) == g)
    n = len(starts)
    out = {"n": n, "loss": float(-gold_ll.mean())}
    for name, values in right.items():
        out[name] = float(values.mean())
        out[f"{name}_stderr"] = float(values.std(ddof=1) / np.sqrt(n)) if n > 1 else float("nan")
    return out


def is_language_model(model) -> bool:
    """True for a model with a language-model head (``*ForCausalLM`` / ``*LMHeadModel``)."""
    return any(mark in type(model).__name__ for mark in _LM_CLASS_MARKS)


def is_choice_batch(batch: dict) -> bool:
    """True for a batch of (question, choice) rows (``headprune.data.choice``)."""
    return GOLD_KEY in batch


def task_for(model, batches, requested: str | None = None) -> Task:
    """The task of ``model`` on ``batches``: multiple choice when the batches hold (question, choice) rows (the
    DATA decides; the model must be a causal LM), else :func:`task_of` from the head."""
    if batches and is_choice_batch(batches[0]):
        if not is_language_model(model):
            raise TaskError(f"Multiple-choice data is scored by a causal language model's log-likelihood of each "
                            f"choice, but {type(model).__name__} is a classifier. Load a *ForCausalLM model.")
        if requested not in (None, "auto", "lm"):
            raise TaskError(f"--task {requested} does not fit multiple-choice data; leave --task out (the data "
                            "makes the task multiple choice on a causal LM).")
        return Task("multiple_choice")
    return task_of(model, requested)


def task_of(model, requested: str | None = None) -> Task:
    """The task ``model``'s head computes; ``requested`` ("lm" | "classification" | None = detect) must fit it.

    Raises TaskError naming the head and what it accepts when ``requested`` does not fit.
    """
    lm = is_language_model(model)
    if lm:
        detected = "lm"
    else:
        detected = "regression" if int(getattr(model.config, "num_labels", 2)) == 1 else "classification"
    if requested is None or requested == "auto":
        return Task(detected)
    if requested not in REQUESTABLE:
        raise TaskError(f"Unknown --task '{requested}'. Accepted: {', '.join(REQUESTABLE)} (default: detected "
                        "from the model's head).")
    head = type(model).__name__
    if requested == "lm" and not lm:
        raise TaskError(f"--task lm needs a language-model head, but {head} is a classifier "
                        f"({model.config.num_labels} outputs, no next-token output layer). Use --task classification "
                        "or load the model's *ForCausalLM checkpoint.")
    if requested == "classification" and lm:
        raise TaskError(f"--task classification needs a classifier head, but {head} is a language model (it "
                        "predicts next tokens, not labels). Use --task lm, or a *ForSequenceClassification "
                        "checkpoint fine-tuned on labels.")
    return Task(detected)
