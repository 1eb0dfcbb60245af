"""Attention on dependency arcs over a dataset, and the per-head syntactic profile.

``collect_arc_attention`` runs the model once over the parsed texts and keeps, for every arc the model saw, the
word attention dependent -> head of every head (what SAP's counters read, sap-syntactic-attention-pruning.txt
§3.3), whether it is the dependent's strongest attention (what the profile reads), and the sum and number of all
word-level attention values of the live heads (SAP's threshold is their mean).

Per-head syntactic profile (beyond the papers; Clark et al. 2019, "What does BERT look at?", §4.2): for relation
r and head (l, h),

    acc_r(l, h) = |{arcs a of relation r : argmax_j A_w^{l,h}[dep(a), j] = head(a)}| / |{arcs of relation r}|

over the calibration texts (argmax over the words the model saw, the dependent itself included), an L x H map per
relation, and the best head per relation (highest accuracy; ties: lowest layer, then head). Pruned heads get NaN.
Beside it, each relation's fixed-offset baseline (Clark et al. §4.2, Voita et al. 2019): the best accuracy of
"the head is k words away" for one k, max_k |{a of r : head(a) − dep(a) = k}| / |{a of r}|.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from ..model.mask import HeadMask
from .arcs import DependencyArcs, iter_arcs
from .parse import Parse, load_parser, parse_texts


@dataclass
class ArcData:
    labels: list[str]                # relation of every kept arc, over the dataset
    values: np.ndarray               # (n_layers, H, n_arcs) word attention dependent -> head
    hits: np.ndarray                 # (n_layers, H, n_arcs) bool: that attention is the dependent's strongest
    offsets: np.ndarray              # (n_arcs,) int: head word index minus dependent word index
    attention_sum: float             # Σ of every word-level attention value of the live heads
    attention_count: int             # how many values that sum has
    live: np.ndarray                 # (n_layers, H) bool
    dropped: dict = field(default_factory=dict)
    n_texts: int = 0
    n_multi_sentence: int = 0        # texts the parser split into several sentences

    @property
    def threshold(self) -> float:
        """SAP's attention threshold: the global mean word-level attention (§3.3)."""
        return self.attention_sum / max(self.attention_count, 1)


def collect_arc_attention(model, tokenizer, parses: Sequence[Parse | tuple[Parse, Parse]],
                          mask: HeadMask | None = None, max_length: int = 128, query_reduce: str = "mean",
                          batch_size: int = 16, progress: Callable[[float, str], None] | None = None) -> ArcData:
    """One attention pass over the parsed texts (or pairs), reduced to ArcData (module doc)."""
    items = [tuple(p) if isinstance(p, (tuple, list)) else p for p in parses]
    return aggregate_arcs(iter_arcs(model, tokenizer, items, mask, max_length, query_reduce, batch_size, progress))


def aggregate_arcs(texts: Iterable[DependencyArcs]) -> ArcData:
    """ArcData of DependencyArcs objects (one per text): arcs concatenated in order, attention summed."""
    labels, values, hits, offsets = [], [], [], []
    total, count, dropped, multi, n, live = 0.0, 0, Counter(), 0, 0, None
    for arcs in texts:
        live = arcs.live
        labels += arcs.labels
        values.append(arcs.arc_values())
        hits.append(arcs.arc_hits())
        offsets.append(arcs.arc_offsets())
        pairs = arcs.attendable()[arcs.seen][:, arcs.seen]
        seen = arcs.attention[live][:, arcs.seen][:, :, arcs.seen][:, pairs]
        total += float(seen.sum(dtype=np.float64))
        count += seen.size
        dropped.update(arcs.dropped)
        multi += arcs.n_sentences > (len(arcs.text) if isinstance(arcs.text, tuple) else 1)
        n += 1
    if n == 0:
        raise DataError("No texts to read dependency arcs from: the calibration set is empty.")
    return ArcData(labels, np.concatenate(values, axis=-1), np.concatenate(hits, axis=-1),
                   np.concatenate(offsets).astype(int), total, count, live,
                   dict(dropped) or {"truncated": 0, "unaligned": 0}, n, multi)


@dataclass
class SyntacticProfile:
    relations: list[str]                 # by descending arc count (ties: alphabetical)
    counts: dict[str, int]
    accuracy: dict[str, np.ndarray]      # relation -> (n_layers, H), NaN for pruned heads
    baseline: dict[str, float] = field(default_factory=dict)   # relation -> best fixed-offset accuracy
    dropped: dict = field(default_factory=dict)
    n_texts: int = 0
    n_multi_sentence: int = 0
    query_reduce: str = "mean"

    @classmethod
    def from_arcs(cls, data: ArcData, query_reduce: str = "mean") -> SyntacticProfile:
        labels = np.array(data.labels)
        counts = Counter(data.labels)
        relations = sorted(counts, key=lambda r: (-counts[r], r))
        accuracy, baseline = {}, {}
        for r in relations:
            acc = data.hits[:, :, labels == r].mean(axis=-1)
            accuracy[r] = np.where(data.live, acc, np.nan)
            offsets = data.offsets[labels == r]
            baseline[r] = float(np.unique(offsets, return_counts=True)[1].max() / len(offsets))
        return cls(relations, dict(counts), accuracy, baseline, data.dropped, data.n_texts, data.n_multi_sentence,
                   query_reduce)

    def best_head(self, relation: str) -> dict:
        acc = self.accuracy[relation]
        flat = np.nan_to_num(acc, nan=-1.0)
        layer, head = np.unravel_index(int(flat.argmax()), acc.shape)   # argmax: first maximum in (layer, head)
        return {"layer": int(layer), "head": int(head), "accuracy": float(acc[layer, head]),
                "count": self.counts[relation]}

    def to_json(self) -> dict:
        def grid(a):
            return [[None if np.isnan(v) else float(v) for v in row] for row in a]

        return {"relations": self.relations, "counts": self.counts, "query_reduce": self.query_reduce,
                "best_heads": {r: self.best_head(r) for r in self.relations},
                "accuracy": {r: grid(self.accuracy[r]) for r in self.relations}, "offset_baseline": self.baseline,
                "dropped_arcs": self.dropped, "texts": self.n_texts, "multi_sentence_texts": self.n_multi_sentence}


def syntactic_profile(model, tokenizer, texts: Sequence[str | tuple[str, str]], parser=None,
                      mask: HeadMask | None = None, max_length: int = 128, query_reduce: str = "mean",
                      batch_size: int = 16, cache_dir=None,
                      progress: Callable[[float, str], None] | None = None) -> SyntacticProfile:
    """Parse ``texts`` (str or (text, pair)) and build the per-head syntactic profile (module doc)."""
    parses = parse_dataset(texts, parser, cache_dir)
    data = collect_arc_attention(model, tokenizer, parses, mask, max_length, query_reduce, batch_size, progress)
    return SyntacticProfile.from_arcs(data, query_reduce)


def parse_dataset(texts: Sequence[str | tuple[str, str]], parser=None, cache_dir=None) -> list:
    """Parses of single texts, or (Parse, Parse) tuples for text pairs."""
    nlp = load_parser(parser)
    pairs = [t for t in texts if isinstance(t, (tuple, list))]
    if not pairs:
        return parse_texts(list(texts), nlp, cache_dir)
    if len(pairs) != len(texts) or any(len(t) != 2 for t in pairs):
        raise DataError("Texts must be all single strings or all (text, pair) tuples of two strings.")
    flat = parse_texts([s for t in texts for s in t], nlp, cache_dir)
    return [tuple(flat[2 * i:2 * i + 2]) for i in range(len(texts))]
