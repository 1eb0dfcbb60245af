"""Where data comes from: named data sets, CSV/TSV/JSONL/TXT files and Hugging Face datasets.

Sources (``load_data(spec, task=...)``)
    a named data set                registered with :func:`register_dataset` by the code that builds it: the demos
                                    register "demo" (held-out Rotten Tomatoes reviews, labelled), "demo-lm" (the
                                    same rows as unlabelled text) and "demo-circuit" (headprune.demos)
    FILE.csv | .tsv | .jsonl        a text column, an optional second text column (sentence pairs), a label column
                                    (no label column needed with ``task="lm"``)
    FILE.txt                        unlabelled text, one document per line (blank lines skipped): LM data
    hf:NAME[:CONFIG[:SPLIT]]        a Hugging Face dataset: a hub name, a local folder written by
                                    ``save_to_disk``, or any local path ``datasets.load_dataset`` takes; without
                                    a split, :func:`pick_split`'s rule chooses one (never train for evaluation)
    multiple choice                 a file or hf: data set whose columns fit a field map of
                                    ``headprune.data.choice`` (HellaSwag, ARC, PIQA, generic context/choices/answer)
                                    or named by ``context_col``/``choices_col``/``answer_col``: ``task`` becomes
                                    "multiple_choice" (the data decides; a named set registers its own task)

Column names are matched case-insensitively; unnamed columns are auto-detected (TEXT_COLUMNS, PAIR_COLUMNS,
LABEL_COLUMNS). A loaded dataset keeps its labels as found (names or ints): ``labels.align_labels`` maps them onto
a model's ``id2label``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError
from ..userinput import (
    MAX_JSON_DEPTH,
    is_dir,
    is_file,
    json_depth,
    kind_of,
    read_user_bytes,
    shown,
    user_path,
)
from .choice import choice_dataset, choice_fields
from .dataset import TextDataset, as_lm_data

TEXT_COLUMNS = ("text", "sentence", "review", "content", "document", "comment", "tweet", "utterance", "query")
PAIR_COLUMNS = (("premise", "hypothesis"), ("sentence1", "sentence2"), ("question1", "question2"),
                ("question", "sentence"), ("text_a", "text_b"), ("text1", "text2"))
LABEL_COLUMNS = ("label", "labels", "category", "class", "target", "sentiment", "score", "y")
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}


# -- named data sets ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NamedData:
    """A data set known by name: ``load()`` returns it; ``labelled`` False for language-model text."""

    name: str
    description: str
    load: Callable[[], TextDataset]
    labelled: bool = True
    task: str | None = None     # "multiple_choice" for a set of questions (read as is, whatever the task asked)
    # False for rows that are no language (demo-circuit's random word blocks): a dependency parse of them is
    # meaningless, so no syntax view (arcs, syntactic profile) is drawn for them
    language: bool = True


NAMED_DATA: dict[str, NamedData] = {}


def register_dataset(name: str, description: str, load: Callable[[], TextDataset], labelled: bool = True,
                     task: str | None = None, language: bool = True) -> None:
    """Make ``load_data(name)`` return ``load()`` (labelled data is also readable as LM text with task="lm";
    ``task="multiple_choice"``: a set of questions, see ``headprune.data.choice``; ``language=False``: the rows
    are not sentences of a language, ``NamedData.language``)."""
    NAMED_DATA[name] = NamedData(name, description, load, labelled, task, language)


def accepted() -> str:
    """What a data spec may be, in words (for error messages)."""
    names = ", ".join(f"'{n}'" for n in NAMED_DATA)
    return f"{names + ', ' if names else ''}a .csv/.tsv/.jsonl/.txt file, or hf:NAME[:CONFIG[:SPLIT]]"


# -- reading ---------------------------------------------------------------------------------------------------

MAX_DATA_BYTES = 2 * 2**30   # a data file is read whole into rows: larger ones belong in a hf: dataset on disk


def _decode(path: Path) -> str:
    # the one safe reader: a FIFO or a device named as data is refused before it is opened, the size bounded
    raw = read_user_bytes(path, "Data file", "a UTF-8 .csv/.tsv/.jsonl/.txt file of at most 2 GiB",
                          max_bytes=MAX_DATA_BYTES, error=DataError)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path} is not UTF-8 text (byte {exc.start}: {exc.reason}). "
                        "Save it as UTF-8 CSV, TSV or JSONL.") from None


def _read_delimited(path: Path, delimiter: str) -> tuple[list[str], list[dict]]:
    reader = csv.DictReader(io.StringIO(_decode(path), newline=""), delimiter=delimiter)
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise DataError(f"{path} is not a valid {'TSV' if delimiter == chr(9) else 'CSV'} file: {exc}.") from None
    header = list(reader.fieldnames or [])
    if not header:
        raise DataError(f"{path} is empty: expected a header row naming the columns, then one row per example.")
    for line, row in enumerate(rows, start=2):
        if None in row or any(v is None for v in row.values()):
            raise DataError(f"{path}, row {line}: its number of fields differs from the header's {len(header)} "
                            f"({', '.join(header)}). Quote fields that contain the delimiter.")
    return header, rows


def _read_jsonl(path: Path) -> tuple[list[str], list[dict]]:
    header: dict[str, None] = {}
    rows = []
    for line, raw in enumerate(_decode(path).splitlines(), start=1):
        if not raw.strip():
            continue
        if json_depth(raw) > MAX_JSON_DEPTH:   # the parser recurses: refused before it is asked
            raise DataError(f"{path}, line {line} nests arrays or objects {json_depth(raw)} deep, over the "
                            f"{MAX_JSON_DEPTH} levels read. JSONL means one JSON object per line.")
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}, line {line} is not JSON ({exc.msg}). JSONL means one JSON object "
                            "per line.") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}, line {line}: expected a JSON object per line, got {type(row).__name__}.")
        header.update(dict.fromkeys(row))
        rows.append(row)
    return list(header), rows


def _read_txt(path: Path) -> tuple[list[str], list[dict]]:
    """One document per non-blank line, as a single "text" column."""
    return ["text"], [{"text": line.strip()} for line in _decode(path).splitlines() if line.strip()]


def _read_file(path: Path) -> tuple[list[str], dict[str, list]]:
    fmt = FILE_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise DataError(f"{path}: unsupported file type '{path.suffix or '(none)'}'. Accepted: .csv, .tsv "
                        "(tab-separated), .jsonl (one JSON object per line), .txt (one document per line, for "
                        "language models), or hf:NAME for a Hugging Face dataset.")
    if fmt == "txt":
        header, rows = _read_txt(path)
    elif fmt == "jsonl":
        header, rows = _read_jsonl(path)
    else:
        header, rows = _read_delimited(path, "," if fmt == "csv" else "\t")
    return header, {c: [row.get(c) for row in rows] for c in header}


def parse_hf_spec(spec: str) -> tuple[str, str | None, str | None]:
    """``hf:NAME[:CONFIG[:SPLIT]]`` -> (name, config or None, split or None)."""
    parts = spec[len("hf:"):].split(":")
    if not parts[0] or len(parts) > 3:
        raise DataError(f"Bad Hugging Face dataset spec '{spec}'. Accepted: hf:NAME[:CONFIG[:SPLIT]], "
                        "e.g. hf:glue:sst2:validation or hf:/path/saved_with_save_to_disk.")
    parts += [""] * (3 - len(parts))
    return parts[0], parts[1] or None, parts[2] or None


ROLES = {"calib": "calibration", "select": "selection", "eval": "evaluation"}
# the split an hf: spec without one reads: the first of these the dataset has (GLUE's MNLI has
# validation_matched / validation_mismatched, no plain validation), then "test" only when it holds labels (GLUE's
# test labels are all -1), then "train" for calibration or selection only: evaluating on training rows must be said
EVAL_SPLITS = ("validation", "validation_matched", "validation_mismatched", "dev")


def _labelled(split_obj, label_col: str | None) -> bool:
    """Whether a split holds real labels: a label column (``label_col`` or an auto-detected name) with at least one
    value that is neither missing nor -1 (GLUE writes -1 for the hidden test labels)."""
    by_lower = {c.lower(): c for c in split_obj.column_names}
    name = by_lower.get(label_col.lower()) if label_col else next(
        (by_lower[c] for c in LABEL_COLUMNS if c in by_lower), None)
    return name is not None and any(v is not None and v != -1 for v in split_obj[name])


def pick_split(splits: dict, split: str | None, spec: str, role: str = "eval", label_col: str | None = None,
               lm: bool = False) -> str:
    """The name of the split of a DatasetDict (``splits``: name -> split) that ``spec`` reads for ``role``.

    The rule, when ``spec`` names no split: the first of ``EVAL_SPLITS`` present (validation, validation_matched,
    validation_mismatched, dev); else "test" when it holds labels (or for language-model text, which needs none);
    else "train" for the calibration or selection role only. The evaluation role never falls back to train: it
    is refused with the splits found and the spec that names train explicitly. A named split that does not exist
    is a DataError listing the splits found.
    """
    names = list(splits)
    found = ", ".join(names) or "none"
    if split is not None:
        if split not in names:
            raise DataError(f"{spec}: no split '{split}'. Splits found: {found}.")
        return split
    chosen = next((s for s in EVAL_SPLITS if s in names), None)
    if chosen is None and "test" in names and (lm or _labelled(splits["test"], label_col)):
        chosen = "test"
    if chosen is None and "train" in names and role != "eval":
        chosen = "train"
    if chosen is None:
        name, config, _ = parse_hf_spec(spec)
        train = f" To evaluate on the training split, say so: hf:{name}:{config or ''}:train." \
            if "train" in names else ""
        raise DataError(f"{spec}: no split to use for {ROLES.get(role, role)} (looked for "
                        f"{', '.join(EVAL_SPLITS)}, then a labelled test split). Splits found: {found}. Name one: "
                        f"hf:NAME:CONFIG:SPLIT.{train}")
    return chosen


def _read_hf(spec: str, role: str = "eval", label_col: str | None = None,
             lm: bool = False) -> tuple[list[str], dict[str, list], dict[str, list[str]], str | None]:
    """Columns of a Hugging Face dataset, the class names of its ClassLabel columns, and the split read (None for
    a single-split dataset); ``role``, ``label_col`` and ``lm`` decide the split when the spec names none
    (:func:`pick_split`)."""
    import datasets  # deferred: a 1.5 s import that only hf: specs need

    name, config, split = parse_hf_spec(spec)
    local = Path(name).expanduser()
    saved = local.is_dir() and any((local / f).is_file() for f in ("dataset_dict.json", "state.json"))
    try:
        if saved:
            obj = datasets.load_from_disk(str(local))
        else:
            obj = datasets.load_dataset(name, config, split=split)
    except (OSError, ValueError) as exc:  # not found, offline (ConnectionError), bad config or split
        raise DataError(f"Could not load Hugging Face dataset '{spec}': {exc}. Accepted: hf:NAME[:CONFIG[:SPLIT]] "
                        "with a hub name (needs the network) or a local dataset folder.") from None
    chosen = split
    if isinstance(obj, (datasets.DatasetDict, dict)):
        chosen = pick_split(obj, split, spec, role, label_col, lm)
        obj = obj[chosen]
    elif saved and split is not None:
        raise DataError(f"{spec}: {local} holds a single split; drop ':{split}' from the spec.")
    class_names = {c: list(f.names) for c, f in obj.features.items() if isinstance(f, datasets.ClassLabel)}
    return list(obj.column_names), {c: list(obj[c]) for c in obj.column_names}, class_names, chosen


# -- columns -----------------------------------------------------------------------------------------------------

def _named(header: list[str], wanted: str, role: str, source: str) -> str:
    """The column called ``wanted`` (ignoring case); a DataError listing the columns when there is none."""
    by_lower = {c.lower(): c for c in header}
    if wanted.lower() not in by_lower:
        raise DataError(f"{source} has no {role} column '{wanted}'. Columns found: {', '.join(header)}.")
    return wanted if wanted in header else by_lower[wanted.lower()]


def _pick_columns(header, text_col, pair_col, label_col, source,
                  need_label: bool = True) -> tuple[str, str | None, str | None]:
    """Named columns win; otherwise the first known pair, else the first known single text column.

    A pair is auto-detected only together with the text column, so naming ``text_col`` alone means single
    sentences. Without ``need_label`` (language-model data) no label column is looked for: the label is None.
    """
    by_lower = {c.lower(): c for c in header}
    text = _named(header, text_col, "text", source) if text_col else None
    pair = _named(header, pair_col, "pair", source) if pair_col else None
    if text is None:
        found = next(((by_lower[a], by_lower[b]) for a, b in PAIR_COLUMNS if a in by_lower and b in by_lower), None)
        if found:
            text, pair = found[0], pair or found[1]
        else:
            text = next((by_lower[c] for c in TEXT_COLUMNS if c in by_lower), None)
    if text is None:
        raise DataError(f"{source}: no text column found. Columns found: {', '.join(header) or 'none'}. Name one "
                        f"with --text-col (auto-detected names: {', '.join(TEXT_COLUMNS)}).")
    if label_col:
        return text, pair, _named(header, label_col, "label", source)
    if not need_label:
        return text, pair, None
    label = next((by_lower[c] for c in LABEL_COLUMNS if c in by_lower), None)
    if label is None:
        raise DataError(f"{source}: no label column found. Columns found: {', '.join(header)}. Name one with "
                        f"--label-col (auto-detected names: {', '.join(LABEL_COLUMNS)}).")
    return text, pair, label


def _texts(values: list, column: str, source: str) -> list[str]:
    for i, v in enumerate(values):
        if not isinstance(v, str):
            raise DataError(f"{source}: row {i} of text column '{column}' is {v!r}, not text.")
    return values


def columns_of(path: str | Path) -> list[str]:
    """The column names of a CSV/TSV/JSONL/TXT file, read by the same readers as ``load_data`` (DataError when
    the file cannot be read as one of these)."""
    return _read_file(Path(path).expanduser())[0]


def check_source(spec: str) -> None:
    """Refuse, without reading it, a data spec that cannot name data: not a named data set, not ``hf:...`` of the
    accepted form, and not an existing file of a supported type (a folder is named as ``hf:FOLDER``). The CLI
    calls this for every data role before a model loads; ``load_data`` gives the same messages."""
    if spec in NAMED_DATA:
        return
    if spec.startswith("hf:"):
        parse_hf_spec(spec)
        return
    path = user_path(spec, "Data", accepted(), DataError)
    if is_dir(path):
        raise DataError(f"{spec} is a folder, not a data file. Accepted: {accepted()} (a dataset folder written "
                        f"by save_to_disk is read as hf:{spec}).")
    if kind_of(path) == "other":   # said as what it is: "not found" would send the user looking for it
        raise DataError(f"{shown(spec)} is not a regular file (a FIFO, a device or a socket); nothing is read from "
                        f"it. Accepted: {accepted()}.")
    if not is_file(path):
        raise DataError(f"Data file not found: {shown(spec)}. Accepted: {accepted()}.")


def is_choice_data(spec: str, context_col: str | None = None, choices_col: str | None = None,
                   answer_col: str | None = None) -> bool:
    """Whether ``spec`` is multiple-choice data, from its name or its file's columns, without a model (so the CLI
    and the workspace read it, and refuse bad rows, before any model loads); hf: data counts when a choice column
    is named (reading it to look costs a download)."""
    if any((context_col, choices_col, answer_col)):
        return True
    named = NAMED_DATA.get(spec)
    if named is not None:
        return named.task == "multiple_choice"
    path = Path(spec).expanduser()
    if spec.startswith("hf:") or not is_file(path) or FILE_FORMATS.get(path.suffix.lower()) in (None, "txt"):
        return False
    return choice_fields(columns_of(path)) is not None


def load_data(spec: str, text_col: str | None = None, pair_col: str | None = None,
              label_col: str | None = None, task: str | None = None, role: str = "eval", *,
              context_col: str | None = None, choices_col: str | None = None,
              answer_col: str | None = None) -> TextDataset:
    """Load ``spec`` (a named data set, a CSV/TSV/JSONL/TXT file, or hf:NAME[:CONFIG[:SPLIT]]) as a TextDataset.

    Column names are matched case-insensitively; unnamed columns are auto-detected (see TEXT_COLUMNS,
    PAIR_COLUMNS, LABEL_COLUMNS). Labels are kept as found: call ``align_labels`` before batching.
    ``task="lm"`` (or a .txt file, or an unlabelled named data set such as "demo-lm") loads unlabelled text for a
    language model: the text column only, no pairs, no labels, ``ds.task == "lm"``. Any other ``task`` loads
    labelled data as before. ``role`` ("calib" | "select" | "eval") is what the rows are for: an ``hf:`` spec that
    names no split picks one by :func:`pick_split`'s rule, which never reads train for evaluation; the split read
    is ``ds.split``. Multiple-choice data (a named set registered as such, columns that fit a field map,
    or ``context_col``/``choices_col``/``answer_col`` given) loads as questions, ``ds.task == "multiple_choice"``,
    unless ``task="classification"`` asks for a classifier's labelled rows.
    """
    named = NAMED_DATA.get(spec)
    if named is not None and named.task == "multiple_choice":
        return named.load()
    unlabelled = (named is not None and not named.labelled) or \
        (named is None and not spec.startswith("hf:") and Path(spec).suffix.lower() == ".txt")
    if unlabelled and task not in (None, "lm"):
        raise DataError(f"{spec} is unlabelled text (language-model data), but the task is {task}, which needs "
                        "labels. Use a language model (--task lm), or a .csv/.tsv/.jsonl/hf: dataset with a label "
                        "column.")
    lm = task == "lm" or unlabelled
    if named is not None:
        ds = named.load()
        return as_lm_data(ds) if lm and ds.task != "lm" else ds
    class_names: dict[str, list[str]] = {}
    split = None
    check_source(spec)
    if spec.startswith("hf:"):
        header, columns, class_names, split = _read_hf(spec, role, label_col, lm)
    else:
        header, columns = _read_file(Path(spec).expanduser())
    fields = choice_fields(header, context_col, choices_col, answer_col, spec) if task != "classification" else None
    if fields is not None:
        ds = choice_dataset(header, columns, fields, spec)
        ds.split = split
        return ds
    text, pair, label = _pick_columns(header, text_col, pair_col, label_col, spec, need_label=not lm)
    if lm:
        pair = label = None  # a language model reads one text per row and predicts its tokens: no labels
    ds = TextDataset(texts=_texts(columns[text], text, spec),
                     pairs=_texts(columns[pair], pair, spec) if pair else None,
                     labels=list(columns[label]) if label else None, label_names=class_names.get(label),
                     source=spec, columns={"text": text, "pair": pair, "label": label},
                     task="lm" if lm else "classification", split=split)
    if len(ds) == 0:
        raise DataError(f"{spec} has no rows: a dataset needs at least one "
                        f"{'document' if lm else 'labelled example'}.")
    return ds
