"""Repeated random-token probes: [BOS] + r + r (+ [SEP] for an encoder), r a block of n distinct ordinary tokens.

Olsson et al. (2022) find induction and duplicate-token heads on exactly such sequences: in the second copy of r,
query i (token r_k) has an earlier copy of itself at i − n and the token that followed that copy at i − n + 1.
A model cannot predict r's first copy, so only heads that copy from context can use it.

Choices the sources leave open (documented here):
- "ordinary" tokens are the vocabulary minus every special / added token and the placeholder spellings ``[...]``
  and ``<...>`` (BERT's ``[unused12]``, byte fallbacks such as ``<0x0A>``), which are never trained;
- tokens within one r are distinct, so the earlier copy of a query's token is one position, not several;
- each probe row draws its own r from one ``torch.Generator`` seeded with ``seed``;
- n is cut to what the model's context allows: 2n + 2 ≤ context.

Tokenizers of transformers 5 lack ``build_inputs_with_special_tokens``, so the frame is built from the ids:
first the CLS (encoders) or BOS (decoders) id when the tokenizer or config has one, last the SEP id for an encoder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..model.tokenizer import model_context
from .base import RoleError

PLACEHOLDER = re.compile(r"^(\[.*\]|<.*>)$")


@dataclass(frozen=True)
class Probes:
    """A batch of probes: ``input_ids`` / ``attention_mask`` (B, T); r's first copy at ``start``..``start+n−1``."""

    input_ids: torch.Tensor
    start: int
    n: int

    @property
    def batch(self) -> dict:
        return {"input_ids": self.input_ids, "attention_mask": torch.ones_like(self.input_ids)}


def special_id(tokenizer, config, *names: str) -> int | None:
    """The first of the named special-token ids (``cls_token_id``, ...) the tokenizer, else the config, defines."""
    for source in (tokenizer, config):
        for name in names:
            value = getattr(source, name, None) if source is not None else None
            if isinstance(value, int) and value >= 0:
                return value
    return None


def ordinary_ids(tokenizer, vocab_size: int) -> torch.Tensor:
    """Ids of the ordinary tokens of the vocabulary (module doc), ascending."""
    keep = torch.ones(vocab_size, dtype=torch.bool)
    if tokenizer is not None:
        banned = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        for token, index in tokenizer.get_vocab().items():
            if index < vocab_size and PLACEHOLDER.match(token):
                banned.add(index)
        keep[[i for i in banned if 0 <= i < vocab_size]] = False
    return keep.nonzero().squeeze(1)


def make_probes(model, tokenizer, length: int, rows: int, seed: int, causal: bool) -> Probes:
    """``rows`` probes with blocks of ``length`` tokens (cut to the context), seeded; RoleError when the model's
    context or vocabulary cannot hold one."""
    config = getattr(model.config, "text_config", None) or model.config
    first = special_id(tokenizer, config, "bos_token_id") if causal else \
        special_id(tokenizer, config, "cls_token_id", "bos_token_id")
    last = None if causal else special_id(tokenizer, config, "sep_token_id", "eos_token_id")
    frame = (first is not None) + (last is not None)
    context = model_context(model)
    n = length if context is None else min(length, (context - frame) // 2)
    vocab = ordinary_ids(tokenizer, config.vocab_size)
    if n < 2 or len(vocab) < n:
        raise RoleError(f"A repeated-token probe needs 2 x n + {frame} tokens with n ≥ 2 distinct ordinary "
                        f"tokens; this model has a context of {context} and {len(vocab)} ordinary tokens.")
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.stack([vocab[torch.randperm(len(vocab), generator=generator)[:n]] for _ in range(rows)])
    parts = ([torch.full((rows, 1), first)] if first is not None else []) + [blocks, blocks] + \
        ([torch.full((rows, 1), last)] if last is not None else [])
    return Probes(torch.cat(parts, dim=1).long(), int(first is not None), n)
