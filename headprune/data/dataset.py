"""TextDataset: rows of text (and optional second text) with labels, as loaded or aligned to a model."""

from __future__ import annotations

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
