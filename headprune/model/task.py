"""The one place that knows the task kinds: "classification", "regression" and "lm" (causal language modelling).

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

Output distribution (for KL between an intact and an ablated model)
    classification: softmax(z_b) over the classes, one row per example;
    lm: softmax(z_{b,t}) over the vocabulary at every real (non-padding) position t of every row, including the last
    (a next-token distribution needs no target); rows keep their (B, T) layout so a caller can average per row.
    Classes are compared in float64; a vocabulary-sized distribution in float32 (a float64 copy of (B, T, V) per
    ablation would dominate the memory of KL scoring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import HeadpruneError

KINDS = ("classification", "regression", "lm")
REQUESTABLE = ("lm", "classification")   # what --task accepts; regression is a classifier head with one output
IGNORE_INDEX = -100                       # label of a padding target (the transformers / PyTorch convention)
_LM_CLASS_MARKS = ("ForCausalLM", "LMHeadModel")


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
        return self.kind == "lm"

    @property
    def headline(self) -> str:
        """Name of the ``Metrics`` field a summary leads with."""
        return {"classification": "accuracy", "regression": "pearson", "lm": "perplexity"}[self.kind]

    @property
    def higher_is_better(self) -> bool:
        """Direction of the headline metric: a lower perplexity is better."""
        return HIGHER_IS_BETTER[self.headline]

    def per_example_loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """(B,) loss L_b of each row (module doc): row-mean next-token cross-entropy for LM, cross-entropy or
        squared error for a classifier. Differentiable (criteria take gradients of it)."""
        labels = batch["labels"].to(logits.device)
        if self.is_lm:
            token_loss, real = lm_token_losses(logits, labels)
            return token_loss.sum(-1) / real.sum(-1).clamp(min=1)
        if self.kind == "regression":
            return (logits[:, 0] - labels.to(logits.dtype)) ** 2
        return F.cross_entropy(logits, labels.long(), reduction="none")

    def loss(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """Scalar loss of a batch: token-weighted mean for LM (Σ ℓ / Σ n_b), mean over rows for a classifier."""
        if self.is_lm:
            token_loss, real = lm_token_losses(logits, batch["labels"].to(logits.device))
            return token_loss.sum() / real.sum().clamp(min=1)
        return self.per_example_loss(logits, batch).mean()

    def output_log_probs(self, logits: torch.Tensor, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log p, real): the log-distributions compared by KL (module doc) and which entries are real.

        classification / regression: log p (B, C) float64, real None (every row counts);
        lm: log p (B, T, V) float32 and real (B, T) bool, the real (non-padding) positions of each row.
        """
        if not self.is_lm:
            return F.log_softmax(logits.double(), dim=-1), None
        return F.log_softmax(logits.float(), dim=-1), batch["attention_mask"].to(logits.device).bool()


# The direction of every metric ``headprune.evaluate.Metrics`` can hold.
HIGHER_IS_BETTER = {"accuracy": True, "f1": True, "macro_f1": True, "mcc": True, "pearson": True,
                    "spearman": True, "next_token_accuracy": True, "loss": False, "mse": False, "perplexity": False}


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
    keeping a (B, T, V) logits tensor per batch.
    """
    token_loss, real = lm_token_losses(logits, labels)
    correct = (logits[:, :-1].argmax(-1) == labels[:, 1:]) & real
    return torch.stack([token_loss.double().sum(-1), real.double().sum(-1), correct.double().sum(-1)], dim=-1).cpu()


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


def is_language_model(model) -> bool:
    """True for a model with a language-model head (``*ForCausalLM`` / ``*LMHeadModel``)."""
    return any(mark in type(model).__name__ for mark in _LM_CLASS_MARKS)


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
