"""Labels: mapping a data set's labels (names or ids, as found) onto a model's ``id2label``.

A match by *position* (the data's labels are words, e.g. a ClassLabel's names, but only their order can be
matched to the model's ids, because the model names its labels ``LABEL_0..k`` or other names the data does not
use) is never made silently: it needs ``by_position=True`` (CLI ``--labels-by-position``) or a ``label_map``
(``--label-map '{"negative": 0, "positive": 1}'``). Integer labels without names (a CSV of 0/1) are taken as ids
without confirmation: there are no words that could disagree with the model's order.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np

from ..errors import DataError
from ..userinput import json_or_file
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


POSITIONAL = re.compile(r"(LABEL_)?\d+")   # model label names that say only a position


LABEL_MAP_ACCEPTED = ("a JSON object from the data's labels to the model's ids or label names, e.g. "
                      "'{\"negative\": 0, \"positive\": 1}', or a file holding one")


def parse_label_map(text: str) -> dict[str, int | str]:
    """A label map from a JSON object, or from a file holding one: {data label: model id or model label name}.

    Raises DataError naming what is accepted (checked by the CLI before a model loads).
    """
    obj, source = json_or_file(text, "label map", LABEL_MAP_ACCEPTED, DataError)
    raw = json.dumps(obj)
    if not isinstance(obj, dict) or not obj or not all(
            isinstance(v, (int, str)) and not isinstance(v, bool) for v in obj.values()):
        raise DataError(f"The {source} must be a non-empty JSON object from the data's labels to the model's ids "
                        f"or label names; got {raw.strip()[:80]}. Accepted: {LABEL_MAP_ACCEPTED}.")
    return {str(k): v for k, v in obj.items()}


def _map_target(value, names: list[str]) -> int | None:
    """A label map's value as a model id (an id in range, or one of the model's names, any case), else None."""
    i = _as_int(value)
    if i is not None:
        return i if 0 <= i < len(names) else None
    folded = [n.strip().casefold() for n in names]
    key = str(value).strip().casefold()
    return folded.index(key) if key in folded else None


def _listed(names: list[str]) -> str:
    return ", ".join(f"{i}={n}" for i, n in enumerate(names))


def align_labels(ds: TextDataset, id2label: dict[int, str], label_map: dict | None = None,
                 by_position: bool = False) -> TextDataset:
    """Map ``ds.labels`` onto the model's label ids; ``ds.label_match`` records how (and the mapping).

    A model with one output is a regression head: labels become float targets. Otherwise, for the whole
    dataset at once:

    1. with a ``label_map`` ({data label: model id or name}, keys matched ignoring case), the map; a data label
       it does not cover is a DataError listing them;
    2. if every distinct label *name* (a ClassLabel int is named by the dataset) equals one of the model's
       names ignoring case, names are used;
    3. else if every label is an integer id the model has: ids, when the data has no label names; when it has
       (a ClassLabel), matching them by position needs ``by_position`` (else a DataError showing the mapping it
       would use);
    4. else the unknown labels are reported.

    Deciding per dataset, not per row, keeps "0"/"1" files and named files unambiguous, and maps e.g. MNLI
    datasets onto models whose label order differs.
    """
    if ds.task in ("lm", "multiple_choice"):
        return ds  # language-model data is its own target; a multiple-choice answer is an index into its choices
    if ds.labels is None:
        raise DataError(f"{ds.source} has no labels; evaluation and label-based criteria need a label column.")
    names = [str(id2label[i]) for i in sorted(id2label)]
    if len(names) == 1:
        return replace(ds, labels=[_as_float(v, ds.source) for v in ds.labels], label_names=names, task="regression",
                       label_match={"by": "regression", "mapping": {}})

    def name_of(v):
        i = _as_int(v)
        return ds.label_names[i] if ds.label_names and i is not None and 0 <= i < len(ds.label_names) else str(v)

    by_name = {n.strip().casefold(): i for i, n in enumerate(names)}
    distinct = list(dict.fromkeys(ds.labels))
    in_range = all(_as_int(v) is not None and 0 <= _as_int(v) < len(names) for v in distinct)
    if label_map is not None:
        by, lookup = "map", _by_map(ds, distinct, name_of, label_map, names)
    elif all(name_of(v).strip().casefold() in by_name for v in distinct):
        by, lookup = "names", {v: by_name[name_of(v).strip().casefold()] for v in distinct}
    elif in_range and (ds.label_names is None or by_position):
        by, lookup = ("ids" if ds.label_names is None else "position"), {v: _as_int(v) for v in distinct}
    elif in_range:
        shown = ", ".join(f"{name_of(v)} -> {_as_int(v)} ({names[_as_int(v)]})" for v in sorted(distinct, key=_as_int))
        raise DataError(f"{ds.source}: its labels are words ({', '.join(ds.label_names)}) that the model's labels "
                        f"({_listed(names)}) do not name, so they could be matched only by position: {shown}. "
                        "Confirm that order with --labels-by-position, or say which is which with --label-map "
                        f"'{{\"{name_of(distinct[0])}\": {_as_int(distinct[0])}, ...}}'.")
    else:
        unknown = [v for v in distinct if name_of(v).strip().casefold() not in by_name
                   and not (_as_int(v) is not None and 0 <= _as_int(v) < len(names))]
        positional = all(POSITIONAL.fullmatch(n.strip()) for n in names)
        hint = ("The model names its labels only by position: say which data label is which id with --label-map "
                f"'{{\"{unknown[0]}\": 0, ...}}'." if positional else
                "Give labels as these names (any case) or ids, or map them with --label-map.")
        raise DataError(f"{ds.source}: labels {', '.join(map(repr, unknown[:10]))} are not known to the model. "
                        f"It knows: {_listed(names)}. {hint}")
    mapping = {name_of(v): lookup[v] for v in distinct}
    return replace(ds, labels=[lookup[v] for v in ds.labels], label_names=names, task="classification",
                   label_match={"by": by, "mapping": dict(sorted(mapping.items(), key=lambda kv: kv[1]))})


def _by_map(ds: TextDataset, distinct: list, name_of, label_map: dict, names: list[str]) -> dict:
    """{data label: model id} from a user's label map; DataError for labels it misses or targets the model lacks."""
    keys = {str(k).strip().casefold(): v for k, v in label_map.items()}
    bad = {k: v for k, v in label_map.items() if _map_target(v, names) is None}
    if bad:
        raise DataError(f"The label map sends {', '.join(f'{k!r} to {v!r}' for k, v in bad.items())}, which the "
                        f"model does not have. It knows: {_listed(names)} (give ids or these names).")

    def target(v):
        for key in (name_of(v), str(v)):
            if key.strip().casefold() in keys:
                return _map_target(keys[key.strip().casefold()], names)
        return None

    lookup = {v: target(v) for v in distinct}
    missing = [name_of(v) for v, i in lookup.items() if i is None]
    if missing:
        raise DataError(f"{ds.source}: the label map does not cover the labels {', '.join(map(repr, missing[:10]))}. "
                        f"It maps {', '.join(map(repr, label_map))}; add every label the data has.")
    return lookup


def label_note(ds: TextDataset) -> str | None:
    """A line saying which data label went to which model id, when that was not by matching names (a position
    confirmed by the user, or their label map); None otherwise."""
    match = ds.label_match or {}
    if match.get("by") not in ("position", "map"):
        return None
    how = "by position (--labels-by-position)" if match["by"] == "position" else "by the label map"
    names = ds.label_names or []
    pairs = ", ".join(f"{k} -> {i} ({names[i] if i < len(names) else i})" for k, i in match["mapping"].items())
    return f"{ds.source}: labels matched {how}: {pairs}"
