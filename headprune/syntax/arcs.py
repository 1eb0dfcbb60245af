"""Dependency arcs of one text together with the word-level attention of every head.

``DependencyArcs`` is what the dashboard's attention view draws: the words, the arcs (dependent -> head, label),
and for any head (layer, head) the (W x W) word attention (see align.py for the word-level equation) and the
attention on each arc. "The attention on an arc" is the word attention from the dependent (query) to its
syntactic head (key), the direction of SAP's word pairs (sap-syntactic-attention-pruning.txt §3.3, Fig. 8) and of
Clark et al.'s dependency accuracy.

A text pair (premise, hypothesis) is two parses; its words are the first segment's followed by the second's.
Layers are forward layers (ALBERT: 12 layers sharing one block).

Causal models (decoders, ``ModelAdapter.causal``): a query word sees only itself and the words before it, so an arc
can carry attention only when its grammatical head *precedes* its dependent (the dependent, as query, attends back
to its head). Arcs whose head follows the dependent are left out and counted in ``dropped["future head"]``, and
the background mean attention (SAP's global threshold) is taken over the attendable pairs only (key word <= query
word); ``causal`` records which rule applied.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..model.arch import adapt
from ..model.capture import AttentionMaps, capture_attention
from ..model.mask import HeadMask
from .align import encode, token_words, word_attention, word_status
from .parse import Arc, Parse, load_parser, parse_texts


@dataclass
class DependencyArcs:
    text: str | tuple[str, str]
    words: list[str]
    arcs: list[Arc]                  # arcs whose two words the model saw (dropped ones are only counted)
    attention: np.ndarray            # (n_layers, H, W, W) word-level attention, float32
    live: np.ndarray                 # (n_layers, H) bool: head present and not gated to 0
    seen: np.ndarray                 # (W,) bool: word has at least one token in the model's input
    dropped: dict = field(default_factory=dict)   # {"truncated": n, "unaligned": n} arcs left out
    n_sentences: int = 1
    query_reduce: str = "mean"
    causal: bool = False             # decoder: only arcs whose head precedes the dependent are kept (module doc)

    @property
    def labels(self) -> list[str]:
        return [a.label for a in self.arcs]

    def word_attention(self, layer: int, head: int) -> np.ndarray:
        """(W, W): attention from word i (row) to word j (column) in head ``head`` of forward layer ``layer``."""
        return self.attention[layer, head]

    def arc_weights(self, layer: int, head: int) -> np.ndarray:
        """(n_arcs,): word attention from each arc's dependent to its head, in ``arcs`` order."""
        return self.arc_values()[layer, head]

    def arc_values(self) -> np.ndarray:
        """(n_layers, H, n_arcs): ``arc_weights`` of every head at once."""
        dep, head = self._ends()
        return self.attention[:, :, dep, head]

    def arc_offsets(self) -> np.ndarray:
        """(n_arcs,) int: head word index minus dependent word index (what a fixed-offset baseline predicts)."""
        dep, head = self._ends()
        return head - dep

    def arc_hits(self) -> np.ndarray:
        """(n_layers, H, n_arcs) bool: the dependent's strongest attention (over the seen words) is its head.

        Clark et al.'s dependency accuracy counts these; a head that attends to nothing (pruned) never hits.
        """
        dep, head = self._ends()
        rows = np.where(self.seen, self.attention[:, :, dep, :], -np.inf)   # (L, H, n_arcs, W)
        return (rows.argmax(-1) == head) & self.live[:, :, None]

    def _ends(self) -> tuple[np.ndarray, np.ndarray]:
        return (np.array([a.dependent for a in self.arcs], dtype=int), np.array([a.head for a in self.arcs], dtype=int))

    def attendable(self) -> np.ndarray:
        """(W, W) bool: word pairs (query, key) the model could attend -- all, or key <= query when causal."""
        w = len(self.words)
        pairs = np.ones((w, w), dtype=bool)
        return np.tril(pairs) if self.causal else pairs

    def to_json(self) -> dict:
        return {"text": self.text, "words": self.words, "seen": self.seen.tolist(),
                "arcs": [{"dependent": a.dependent, "head": a.head, "label": a.label} for a in self.arcs],
                "dropped": self.dropped, "n_sentences": self.n_sentences, "query_reduce": self.query_reduce}


def _segments(item: Parse | tuple[Parse, Parse]) -> tuple[Parse, ...]:
    return item if isinstance(item, tuple) else (item,)


def _one(parses: tuple[Parse, ...], probs: torch.Tensor, live: np.ndarray, offsets: np.ndarray,
         segments: np.ndarray, query_reduce: str, causal: bool = False) -> DependencyArcs:
    """DependencyArcs of one row: ``probs`` (L, H, T, T) token attention of its real tokens."""
    words, spans, word_seg, arcs = [], [], [], []
    for seg, parse in enumerate(parses):
        first = len(words)
        words += parse.words
        spans += parse.spans
        word_seg += [seg] * len(parse.words)
        arcs += [Arc(a.dependent + first, a.head + first, a.label) for a in parse.arcs()]
    spans_arr = np.array(spans, dtype=int).reshape(-1, 2)
    word_seg_arr = np.array(word_seg, dtype=int)
    tw = token_words(offsets, segments, spans_arr, word_seg_arr)
    status = word_status(tw, offsets, segments, spans_arr, word_seg_arr)
    seen = status == "seen"
    kept = [a for a in arcs if seen[a.dependent] and seen[a.head]]
    dropped = Counter("truncated" if "truncated" in (status[a.dependent], status[a.head]) else "unaligned"
                      for a in arcs if not (seen[a.dependent] and seen[a.head]))
    if causal:
        dropped["future head"] = sum(a.head > a.dependent for a in kept)
        kept = [a for a in kept if a.head < a.dependent]
    attention = word_attention(probs, tw, len(words), query_reduce).numpy().astype(np.float32)
    text = parses[0].text if len(parses) == 1 else tuple(p.text for p in parses)
    counted = {"truncated": dropped["truncated"], "unaligned": dropped["unaligned"]}
    if causal:
        counted["future head"] = dropped["future head"]
    return DependencyArcs(text, words, kept, attention, live, seen, counted, sum(p.n_sentences for p in parses),
                          query_reduce, causal)


def iter_arcs(model, tokenizer, parses: Sequence[Parse | tuple[Parse, Parse]], mask: HeadMask | None = None,
              max_length: int = 128, query_reduce: str = "mean", batch_size: int = 16,
              progress: Callable[[float, str], None] | None = None,
              on_capture: Callable[[dict, AttentionMaps], None] | None = None) -> Iterator[DependencyArcs]:
    """DependencyArcs of every parsed text (or text pair), one batched attention capture per ``batch_size`` texts.

    Texts are truncated to ``max_length`` tokens like the model's own batches; arcs beyond the cut are dropped and
    counted in ``dropped["truncated"]``. ``on_capture(batch, maps)`` sees each chunk's token-level capture (the
    encoded batch with its ``special_tokens_mask``, and the AttentionMaps) before it is reduced to words, so a
    caller that needs token-level statistics of the same texts (head roles) captures them once, not twice.
    """
    device = next(model.parameters()).device
    causal = adapt(model).causal
    accepted = set(getattr(tokenizer, "model_input_names", ("input_ids", "attention_mask")))
    for start in range(0, len(parses), batch_size):
        chunk = [_segments(p) for p in parses[start:start + batch_size]]
        pairs = [c[1].text for c in chunk] if len(chunk[0]) == 2 else None
        enc = encode(tokenizer, [c[0].text for c in chunk], pairs, max_length)
        batch = {k: v.to(device) for k, v in enc.items() if k in accepted | {"input_ids", "attention_mask"}}
        maps = capture_attention(model, batch, mask)
        if on_capture is not None:
            on_capture({**batch, "special_tokens_mask": enc["special_tokens_mask"]}, maps)
        probs = maps.stacked                                   # (L, B, H, T, T)
        live = maps.live.numpy()
        for row, parse_group in enumerate(chunk):
            real = maps.attention_mask[row].nonzero().squeeze(1)      # padding may sit on either side
            segments = np.array([-1 if s is None else s for s in enc.sequence_ids(row)])[real.numpy()]
            segments[enc["special_tokens_mask"][row, real].numpy().astype(bool)] = -1
            yield _one(parse_group, probs[:, row][:, :, real][:, :, :, real], live,
                       enc["offset_mapping"][row, real].numpy(), segments, query_reduce, causal)
        if progress is not None:
            progress(min(start + batch_size, len(parses)) / len(parses), "attention on dependency arcs")


def build_arcs(model, tokenizer, text: str | tuple[str, str], parser=None, mask: HeadMask | None = None,
               max_length: int = 512, query_reduce: str = "mean") -> DependencyArcs:
    """Parse ``text`` (or a (text, pair) tuple) and attach every head's word attention (for the attention view)."""
    nlp = load_parser(parser)
    texts = list(text) if isinstance(text, tuple) else [text]
    parsed = tuple(parse_texts(texts, nlp))
    return next(iter_arcs(model, tokenizer, [parsed if len(parsed) > 1 else parsed[0]], mask, max_length,
                          query_reduce))
