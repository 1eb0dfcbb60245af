"""Word <-> sub-token alignment through the tokenizer's character offsets, and word-level attention.

Every tokenizer family (WordPiece for BERT, byte-level BPE for RoBERTa, SentencePiece/Unigram for ALBERT and
XLM-R) reports, through a fast tokenizer's ``return_offsets_mapping``, the character span of each token. A token
belongs to the word whose span it overlaps most (ties: the first word); special tokens ([CLS], <s>, padding...)
belong to no word. Offsets that include a leading space (SentencePiece's "▁x", BPE without trimmed offsets) still
overlap the right word. A word that gets no token is either *truncated* (it starts after the last token the
model saw, because the text was cut at max length) or *unaligned* (the parser and the tokenizer disagree, e.g.
spaCy splits "cannot" into "can" + "not" while WordPiece keeps one token, which goes to "can").

Word-level attention (Clark et al. 2019, "What does BERT look at?", §2: attention *to* a split word is summed over
its tokens, attention *from* a split word is averaged over its tokens):

    A_w[i, j] = reduce_{p ∈ P_i}  Σ_{q ∈ P_j} A[p, q]          P_i = the tokens of word i

``query_reduce`` = "mean" (Clark et al., default), "first" (the first token of word i stands for it) or "max".
Keys are always summed, so a row of A_w is still a distribution over the words (minus what goes to special
tokens). The SAP paper leaves this aggregation open (sap-syntactic-attention-pruning.txt §3.3 works on tokens).
"""

from __future__ import annotations

import numpy as np
import torch

from ..errors import HeadpruneError

QUERY_REDUCE = ("mean", "first", "max")


class AlignmentError(HeadpruneError):
    """The tokenizer cannot be aligned with words (no character offsets)."""


def require_offsets(tokenizer) -> None:
    if not getattr(tokenizer, "is_fast", False):
        raise AlignmentError(f"{type(tokenizer).__name__} is a slow (Python) tokenizer: it cannot return character "
                             "offsets (return_offsets_mapping), which word alignment needs. Load the model's fast "
                             "tokenizer (AutoTokenizer.from_pretrained(..., use_fast=True), a tokenizer.json).")


def encode(tokenizer, texts: list, pairs: list | None, max_length: int):
    """Tokenize a batch with character offsets; returns the BatchEncoding (tensors) of the fast tokenizer."""
    require_offsets(tokenizer)
    return tokenizer(texts, pairs, padding=True, truncation=True, max_length=max_length, return_tensors="pt",
                     return_offsets_mapping=True, return_special_tokens_mask=True)


def token_words(offsets: np.ndarray, segments: np.ndarray, spans: np.ndarray, word_segments: np.ndarray) -> np.ndarray:
    """Word index of each token (-1: special or padding), by largest character overlap within the same segment.

    offsets (T, 2) and segments (T,) (-1 for special tokens) describe the tokens; spans (W, 2) and
    word_segments (W,) the words.
    """
    if len(spans) == 0:
        return np.full(len(offsets), -1)
    start = np.maximum(offsets[:, None, 0], spans[None, :, 0])
    end = np.minimum(offsets[:, None, 1], spans[None, :, 1])
    overlap = np.where(segments[:, None] == word_segments[None, :], end - start, 0)
    best = overlap.argmax(axis=1)
    return np.where(overlap.max(axis=1) > 0, best, -1)


def word_status(token_word: np.ndarray, offsets: np.ndarray, segments: np.ndarray, spans: np.ndarray,
                word_segments: np.ndarray) -> np.ndarray:
    """Per word: "seen" (has tokens), "truncated" (starts after the last token of its segment) or "unaligned"."""
    status = np.full(len(spans), "unaligned", dtype=object)
    status[np.unique(token_word[token_word >= 0])] = "seen"
    for seg in np.unique(word_segments):
        ends = offsets[segments == seg, 1]
        last = ends.max() if len(ends) else -1
        status[(word_segments == seg) & (spans[:, 0] >= last) & (status != "seen")] = "truncated"
    return status


def word_attention(attn: torch.Tensor, token_word: np.ndarray, n_words: int, query_reduce: str = "mean"
                   ) -> torch.Tensor:
    """(..., T, T) token attention -> (..., W, W) word attention by the module doc's equation.

    Words without tokens get zero rows and columns.
    """
    if query_reduce not in QUERY_REDUCE:
        raise AlignmentError(f"query_reduce={query_reduce!r}; accepted: {', '.join(QUERY_REDUCE)}.")
    tw = torch.as_tensor(token_word, dtype=torch.long)
    keys = torch.zeros(len(tw), n_words, dtype=attn.dtype)
    real = tw >= 0
    keys[real.nonzero().squeeze(1), tw[real]] = 1.0
    to_words = attn @ keys                                     # (..., T, W): Σ over each key word's tokens
    if query_reduce == "max":
        pieces = keys.T.bool()                                 # (W, T)
        masked = to_words.unsqueeze(-3).masked_fill(~pieces[..., None], float("-inf"))
        return masked.amax(dim=-2).clamp_min(0.0)              # words without tokens: -inf -> 0
    if query_reduce == "first":
        first = torch.zeros_like(keys.T)
        for w in range(n_words):
            rows = (tw == w).nonzero()
            if len(rows):
                first[w, rows[0, 0]] = 1.0
        return first @ to_words
    counts = keys.sum(0).clamp_min(1.0)
    return (keys.T / counts[:, None]) @ to_words
