"""What the pruned model now says: one example through the dense and the pruned model, side by side.

A language model: for each token t ≥ 1 of the text, its loss ℓ_t = −log p(x_t | x_<t) under the dense model and
under the mask, their change Δ_t = ℓ_t(pruned) − ℓ_t(dense) (positive = the pruned model finds the right token
harder), and at each position the top-k next-token guesses of each with their probabilities. A classifier: the
probability of every label under each. The text is tokenized exactly as the data layer tokenizes a row
(``data.make_batches`` on a one-row TextDataset), so an evaluation row gives the tokens its metric is computed on;
a row's ``targets_from`` (demo-circuit's repeated half) marks which tokens its metric scores (``scored``).

Both passes run on one private ``structural_copy`` of the model: the dense pass without gates, the pruned pass
gated by ``model.gating.gate_heads`` (the one place heads are gated). The model given is never hooked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..data import TextDataset, make_batches, model_inputs
from ..errors import DataError
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from ..model.mask import HeadMask
from ..model.task import IGNORE_INDEX

MAX_CHARS = 4000     # a typed text longer than this is refused (the view is for one sentence or a paragraph)


@dataclass
class TokenComparison:
    """One text through a language model, dense and pruned (module doc). Arrays are over the T tokens; position 0
    has no loss (nothing predicts it): NaN there."""

    tokens: list[str]              # each token as text
    ids: np.ndarray                # (T,) token ids
    dense_loss: np.ndarray         # (T,) ℓ_t dense, NaN at t = 0
    pruned_loss: np.ndarray        # (T,) ℓ_t pruned
    scored: np.ndarray             # (T,) bool: tokens the data's metric scores (all t ≥ 1 without targets_from)
    dense_top: list[list[tuple[str, float]]]    # per position t: the top-k guesses for token t + 1, dense
    pruned_top: list[list[tuple[str, float]]]

    @property
    def delta(self) -> np.ndarray:
        """(T,) Δ_t = ℓ_t(pruned) − ℓ_t(dense), NaN at t = 0."""
        return self.pruned_loss - self.dense_loss

    def perplexity(self, which: str = "dense") -> float:
        """exp of the mean loss over the scored tokens (``which``: "dense" or "pruned")."""
        loss = self.dense_loss if which == "dense" else self.pruned_loss
        return float(np.exp(np.nanmean(np.where(self.scored, loss, np.nan))))


@dataclass
class LabelComparison:
    """One text through a classifier, dense and pruned: each label's probability."""

    labels: list[str]
    dense: np.ndarray              # (C,) probabilities
    pruned: np.ndarray

    @property
    def dense_label(self) -> str:
        return self.labels[int(self.dense.argmax())]

    @property
    def pruned_label(self) -> str:
        return self.labels[int(self.pruned.argmax())]


def example_row(text: str | tuple[str, str], task: str, targets_from: int | None = None) -> TextDataset:
    """A one-row TextDataset of a typed or picked text (a pair as a tuple), refused when empty or too long."""
    first, pair = text if isinstance(text, tuple) else (text, None)
    if not isinstance(first, str) or not first.strip():
        raise DataError("The example text is empty. Accepted: a sentence or a short paragraph.")
    if len(first) + len(pair or "") > MAX_CHARS:
        raise DataError(f"The example text has {len(first) + len(pair or ''):,} characters; accepted: at most "
                        f"{MAX_CHARS:,} (one sentence or a short paragraph).")
    return TextDataset([first], pairs=None if pair is None else [pair], source="example", task=task,
                       columns={"text": "text"}, targets_from=None if targets_from is None else [targets_from])


def _two_passes(model, batch: dict, mask: HeadMask | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the dense and the gated pass, on a private copy (the module doc's rule)."""
    copy = structural_copy(model)
    inputs = model_inputs(batch)
    device = next(copy.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    with torch.no_grad():
        dense = copy(**inputs).logits[0].float().cpu()
        with gate_heads(copy, mask):
            pruned = copy(**inputs).logits[0].float().cpu()
    return dense, pruned


def _top(tokenizer, probs: torch.Tensor, k: int) -> list[list[tuple[str, float]]]:
    values, ids = probs.topk(min(k, probs.shape[-1]), dim=-1)
    return [[(tokenizer.decode([int(i)]), float(v)) for v, i in zip(vs, is_)] for vs, is_ in zip(values, ids)]


def compare_lm(model, tokenizer, text: str, mask: HeadMask | None, *, top_k: int = 5, max_length: int = 128,
               targets_from: int | None = None) -> TokenComparison:
    """Per-token losses and top-k guesses of ``text`` dense and under ``mask`` (module doc)."""
    batch = make_batches(tokenizer, example_row(text, "lm", targets_from), batch_size=1, max_length=max_length)[0]
    dense, pruned = _two_passes(model, batch, mask)
    ids = batch["input_ids"][0]
    keep = batch["attention_mask"][0].bool()
    ids, dense, pruned, labels = ids[keep], dense[keep], pruned[keep], batch["labels"][0][keep]

    def losses(logits: torch.Tensor) -> np.ndarray:
        # ℓ_t = −log softmax(logits_{t−1})[x_t]: the logits at t − 1 predict token t
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, ids[1:, None])[:, 0]
        return np.concatenate([[np.nan], (-logp).numpy()])

    scored = np.concatenate([[False], (labels[1:] != IGNORE_INDEX).numpy()])
    return TokenComparison(tokens=[tokenizer.decode([int(i)]) for i in ids], ids=ids.numpy(),
                           dense_loss=losses(dense), pruned_loss=losses(pruned), scored=scored,
                           dense_top=_top(tokenizer, dense.softmax(-1), top_k),
                           pruned_top=_top(tokenizer, pruned.softmax(-1), top_k))


def compare_classifier(model, tokenizer, text: str | tuple[str, str], mask: HeadMask | None, *,
                       max_length: int = 128) -> LabelComparison:
    """Each label's probability for ``text`` (a pair as a tuple) dense and under ``mask``."""
    batch = make_batches(tokenizer, example_row(text, "classification", None), batch_size=1, max_length=max_length)[0]
    dense, pruned = _two_passes(model, batch, mask)
    id2label = getattr(model.config, "id2label", None) or {}
    labels = [str(id2label.get(i, i)) for i in range(dense.shape[-1])]
    return LabelComparison(labels=labels, dense=dense.softmax(-1).numpy(), pruned=pruned.softmax(-1).numpy())
