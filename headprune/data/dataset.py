"""TextDataset: rows of text (and optional second text) with labels, as loaded or aligned to a model."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

# Keys of a batch that are bookkeeping, not model inputs.
NON_INPUT_KEYS = ("labels", "index")


@dataclass
class TextDataset:
    """Rows of text (and optional second text) with labels.

    ``labels`` are raw values (names or ints) as loaded, and model label ids (float targets for regression)
    after ``align_labels``. ``label_names[i]`` names the integer label ``i`` when labels are ints.
    """

    texts: list[str]
    pairs: list[str] | None = None
    labels: list | None = None
    label_names: list[str] | None = None
    source: str = ""
    task: str = "classification"          # "classification" | "regression" | "lm" (headprune.task.KINDS)
    columns: dict = field(default_factory=dict)   # {"text": ..., "pair": ..., "label": ...} as found
    # language-model data: per row, the character offset where scored text starts; tokens starting before it are
    # context, not next-token targets (the circuit demo scores the repeated half only). None: every token counts.
    targets_from: list[int] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices) -> TextDataset:
        pick = [int(i) for i in indices]
        return replace(self, texts=[self.texts[i] for i in pick],
                       pairs=None if self.pairs is None else [self.pairs[i] for i in pick],
                       labels=None if self.labels is None else [self.labels[i] for i in pick],
                       targets_from=None if self.targets_from is None else [self.targets_from[i] for i in pick])


def as_lm_data(ds: TextDataset) -> TextDataset:
    """``ds`` as language-model data: its texts only (labels and pairs dropped), ``task="lm"``."""
    return replace(ds, pairs=None, labels=None, label_names=None, task="lm",
                   columns={**ds.columns, "pair": None, "label": None})


def content_hash(ds: TextDataset) -> str:
    """sha256 (hex) over the rows of ``ds`` in order: each row's text, pair and label as one JSON line. Two draws
    of different rows (or of the same rows in another order) hash differently; run files record it per role."""
    digest = hashlib.sha256()
    for i, text in enumerate(ds.texts):
        row = [text, None if ds.pairs is None else ds.pairs[i], None if ds.labels is None else ds.labels[i]]
        digest.update((json.dumps(row, default=str, ensure_ascii=False) + "\n").encode("utf-8"))
    return digest.hexdigest()
