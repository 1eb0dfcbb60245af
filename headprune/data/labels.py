"""Labels: mapping a data set's labels (names or ids, as found) onto a model's ``id2label``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..errors import DataError
from .dataset import TextDataset


def _as_int(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _as_float(value, source: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise DataError(f"{source}: label {value!r} is not a number; a regression model (one output) needs "
                        "numeric targets.") from None


def align_labels(ds: TextDataset, id2label: dict[int, str]) -> TextDataset:
    """Map ``ds.labels`` onto the model's label ids.

    A model with one output is a regression head: labels become float targets. Otherwise, for the whole
    dataset at once: if every distinct label *name* (a ClassLabel int is named by the dataset) equals one of
    the model's names ignoring case, names are used; else if every label is an integer id the model has, ids
    are used; else the unknown labels are reported. Deciding per dataset, not per row, keeps "0"/"1" files and
    named files unambiguous, and maps e.g. MNLI datasets onto models whose label order differs.
    """
    if ds.task in ("lm", "multiple_choice"):
        return ds  # language-model data is its own target; a multiple-choice answer is an index into its choices
    if ds.labels is None:
        raise DataError(f"{ds.source} has no labels; evaluation and label-based criteria need a label column.")
    names = [str(id2label[i]) for i in sorted(id2label)]
    if len(names) == 1:
        return replace(ds, labels=[_as_float(v, ds.source) for v in ds.labels], label_names=names, task="regression")

    def name_of(v):
        i = _as_int(v)
        return ds.label_names[i] if ds.label_names and i is not None and 0 <= i < len(ds.label_names) else str(v)

    by_name = {n.strip().casefold(): i for i, n in enumerate(names)}
    distinct = list(dict.fromkeys(ds.labels))
    if all(name_of(v).strip().casefold() in by_name for v in distinct):
        lookup = {v: by_name[name_of(v).strip().casefold()] for v in distinct}
    elif all(_as_int(v) is not None and 0 <= _as_int(v) < len(names) for v in distinct):
        lookup = {v: _as_int(v) for v in distinct}
    else:
        unknown = [v for v in distinct if name_of(v).strip().casefold() not in by_name
                   and not (_as_int(v) is not None and 0 <= _as_int(v) < len(names))]
        raise DataError(f"{ds.source}: labels {', '.join(map(repr, unknown[:10]))} are not known to the model. "
                        f"It knows: {', '.join(f'{i}={n}' for i, n in enumerate(names))}; give labels as these "
                        "names (any case) or ids.")
    return replace(ds, labels=[lookup[v] for v in ds.labels], label_names=names, task="classification")
