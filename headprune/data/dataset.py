"""TextDataset: rows of text (and optional second text) with labels, as loaded or aligned to a model; content
hashes of its rows (what run files record, and how data roles that share rows are found)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace

from ..model.task import CHOICE_KEYS

# Keys of a batch that are bookkeeping, not model inputs (a multiple-choice batch's per-row keys among them).
NON_INPUT_KEYS = ("labels", "index", *CHOICE_KEYS)


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
    task: str = "classification"   # "classification" | "regression" | "lm" | "multiple_choice" (model.task.KINDS)
    columns: dict = field(default_factory=dict)   # {"text": ..., "pair": ..., "label": ...} as found
    # language-model data: per row, the character offset where scored text starts; tokens starting before it are
    # context, not next-token targets (the circuit demo scores the repeated half only). None: every token counts.
    targets_from: list[int] | None = None
    split: str | None = None              # the split read from a Hugging Face DatasetDict (sources.pick_split)
    # how ``align_labels`` matched the labels: {"by": "names" | "ids" | "position" | "map" | "regression",
    # "mapping": {data label: "id (model name)"}}; None before alignment and for language-model data
    label_match: dict | None = None
    # multiple-choice data (headprune.data.choice): per row the choices; ``texts`` are the contexts and ``labels``
    # the index of the right choice
    choices: list[list[str]] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices) -> TextDataset:
        pick = [int(i) for i in indices]
        return replace(self, texts=[self.texts[i] for i in pick],
                       pairs=None if self.pairs is None else [self.pairs[i] for i in pick],
                       labels=None if self.labels is None else [self.labels[i] for i in pick],
                       targets_from=None if self.targets_from is None else [self.targets_from[i] for i in pick],
                       choices=None if self.choices is None else [self.choices[i] for i in pick])


def as_lm_data(ds: TextDataset) -> TextDataset:
    """``ds`` as language-model data: its texts only (labels and pairs dropped), ``task="lm"``."""
    return replace(ds, pairs=None, labels=None, label_names=None, task="lm", choices=None,
                   columns={**ds.columns, "pair": None, "label": None})


def row_hashes(ds: TextDataset) -> list[str]:
    """One sha256 hex digest per row, over its text, second text and label (as held: raw, or ids once aligned).

    Two rows hash alike exactly when they hold the same text, pair and label; data roles compare these sets to find
    shared rows (``Workspace.build``'s overlap check).
    """
    pairs = ds.pairs or [None] * len(ds)
    labels = ds.labels or [None] * len(ds)
    return [hashlib.sha256(json.dumps([t, p, y], ensure_ascii=False, default=str).encode("utf-8")).hexdigest()
            for t, p, y in zip(ds.texts, pairs, labels)]


def content_hash(ds: TextDataset) -> str:
    """sha256 hex digest of ``ds``'s rows in order (text, pair, label each): what a run file records for a data
    role, so two runs can tell whether they read the same rows."""
    digest = hashlib.sha256()
    for row in row_hashes(ds):
        digest.update(row.encode("ascii"))
    return digest.hexdigest()


def data_role(ds: TextDataset, source: str | None, seed: int | None) -> dict:
    """What a run file records of one data role (``Workspace.roles()``, recovery's training rows): the source spec,
    the Hugging Face split read (or None), rows, seed of the draw, content hash (:func:`content_hash`)."""
    return {"source": source, "split": ds.split, "size": len(ds), "seed": seed, "hash": content_hash(ds)}
