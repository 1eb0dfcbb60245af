"""Text data for classifiers and language models: loading, label alignment, calibration/evaluation split, batching.

Sources (``load_data(spec, task=...)``)
    "demo"                          the held-out Rotten Tomatoes rows of the demo model (headprune.demo)
    "demo-lm"                       the same held-out rows as unlabelled text (the LM demo, headprune.demo_lm)
    FILE.csv | .tsv | .jsonl        a text column, an optional second text column (sentence pairs), a label column
                                    (no label column needed with ``task="lm"``)
    FILE.txt                        unlabelled text, one document per line (blank lines skipped): LM data
    hf:NAME[:CONFIG[:SPLIT]]        a Hugging Face dataset: a hub name, a local folder written by
                                    ``save_to_disk``, or any local path ``datasets.load_dataset`` takes

Language-model data (``task="lm"``) has no labels: a batch's ``labels`` are its input ids with padding masked
(``headprune.task.lm_labels``), and the loss shifts them by one position. Decoders often have no pad token: the
rule (``prepare_tokenizer``) is the tokenizer's pad token, else its EOS, else its UNK; padding is masked by the
attention mask, so a real EOS is still a target.

A loaded dataset keeps its labels as found (names or ints); ``align_labels`` maps them onto the model's
``id2label``. ``split_calib_eval`` draws a seeded calibration set (for scoring heads) and a disjoint evaluation
set (for accuracy). ``make_batches`` tokenizes once, truncates, sorts by length and pads each batch only to its
own longest row, so little compute is spent on padding.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from .errors import DataError

TEXT_COLUMNS = ("text", "sentence", "review", "content", "document", "comment", "tweet", "utterance", "query")
PAIR_COLUMNS = (("premise", "hypothesis"), ("sentence1", "sentence2"), ("question1", "question2"),
                ("question", "sentence"), ("text_a", "text_b"), ("text1", "text2"))
LABEL_COLUMNS = ("label", "labels", "category", "class", "target", "sentiment", "score", "y")
FILE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".txt": "txt"}
ACCEPTED = "'demo', 'demo-lm', a .csv/.tsv/.jsonl/.txt file, or hf:NAME[:CONFIG[:SPLIT]]"
# tokenizer.model_max_length above this is transformers' "no limit known" sentinel, not a context length
_UNBOUNDED_CONTEXT = 10**6


class TruncationWarning(UserWarning):
    """Rows longer than the model's context were cut to it (the CLI prints this on stderr)."""
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

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, indices) -> TextDataset:
        pick = [int(i) for i in indices]
        return replace(self, texts=[self.texts[i] for i in pick],
                       pairs=None if self.pairs is None else [self.pairs[i] for i in pick],
                       labels=None if self.labels is None else [self.labels[i] for i in pick])


# -- reading ---------------------------------------------------------------------------------------------------

def _decode(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8-sig")
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


def _pick_split(obj, split: str | None, spec: str):
    """A DatasetDict's split: the one asked for, else validation > test > train > the first."""
    splits = list(obj.keys())
    if split is None:
        split = next((s for s in ("validation", "test", "train") if s in splits), splits[0] if splits else None)
    if split not in splits:
        raise DataError(f"{spec}: no split '{split}'. Splits found: {', '.join(splits) or 'none'}.")
    return obj[split]


def _read_hf(spec: str) -> tuple[list[str], dict[str, list], dict[str, list[str]]]:
    """Columns of a Hugging Face dataset, plus the class names of its ClassLabel columns."""
    import datasets

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
    if isinstance(obj, (datasets.DatasetDict, dict)):
        obj = _pick_split(obj, split, spec)
    elif saved and split is not None:
        raise DataError(f"{spec}: {local} holds a single split; drop ':{split}' from the spec.")
    class_names = {c: list(f.names) for c, f in obj.features.items() if isinstance(f, datasets.ClassLabel)}
    return list(obj.column_names), {c: list(obj[c]) for c in obj.column_names}, class_names


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


def load_data(spec: str, text_col: str | None = None, pair_col: str | None = None,
              label_col: str | None = None, task: str | None = None) -> TextDataset:
    """Load ``spec`` ("demo", "demo-lm", a CSV/TSV/JSONL/TXT file, or hf:NAME[:CONFIG[:SPLIT]]) as a TextDataset.

    Column names are matched case-insensitively; unnamed columns are auto-detected (see TEXT_COLUMNS,
    PAIR_COLUMNS, LABEL_COLUMNS). Labels are kept as found: call ``align_labels`` before batching.
    ``task="lm"`` (or a .txt file, or "demo-lm") loads unlabelled text for a language model: the text column
    only, no pairs, no labels, ``ds.task == "lm"``. Any other ``task`` loads labelled data as before.
    """
    unlabelled = spec == "demo-lm" or (not spec.startswith("hf:") and Path(spec).suffix.lower() == ".txt")
    if unlabelled and task not in (None, "lm"):
        raise DataError(f"{spec} is unlabelled text (language-model data), but the task is {task}, which needs "
                        "labels. Use a language model (--task lm), or a .csv/.tsv/.jsonl/hf: dataset with a label "
                        "column.")
    lm = task == "lm" or unlabelled
    if spec == "demo-lm":
        from .demo_lm import demo_lm_dataset

        return demo_lm_dataset()
    if spec == "demo":
        from .demo import demo_dataset

        return as_lm_data(demo_dataset()) if lm else demo_dataset()
    class_names: dict[str, list[str]] = {}
    if spec.startswith("hf:"):
        header, columns, class_names = _read_hf(spec)
    else:
        path = Path(spec).expanduser()
        if path.is_dir():
            raise DataError(f"{spec} is a folder, not a data file. Accepted: {ACCEPTED} (a dataset folder written "
                            f"by save_to_disk is read as hf:{spec}).")
        if not path.is_file():
            raise DataError(f"Data file not found: {spec}. Accepted: {ACCEPTED}.")
        header, columns = _read_file(path)
    text, pair, label = _pick_columns(header, text_col, pair_col, label_col, spec, need_label=not lm)
    if lm:
        pair = label = None  # a language model reads one text per row and predicts its tokens: no labels
    ds = TextDataset(texts=_texts(columns[text], text, spec),
                     pairs=_texts(columns[pair], pair, spec) if pair else None,
                     labels=list(columns[label]) if label else None, label_names=class_names.get(label),
                     source=spec, columns={"text": text, "pair": pair, "label": label},
                     task="lm" if lm else "classification")
    if len(ds) == 0:
        raise DataError(f"{spec} has no rows: a dataset needs at least one "
                        f"{'document' if lm else 'labelled example'}.")
    return ds


def as_lm_data(ds: TextDataset) -> TextDataset:
    """``ds`` as language-model data: its texts only (labels and pairs dropped), ``task="lm"``."""
    return replace(ds, pairs=None, labels=None, label_names=None, task="lm",
                   columns={**ds.columns, "pair": None, "label": None})


# -- labels ------------------------------------------------------------------------------------------------------

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
    if ds.task == "lm":
        return ds  # language-model data is its own target
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


# -- split -------------------------------------------------------------------------------------------------------

def split_calib_eval(ds: TextDataset, calib_size: int, eval_size: int | None,
                     seed: int = 0) -> tuple[TextDataset, TextDataset]:
    """Disjoint seeded (calibration, evaluation) subsets.

    One permutation of the rows; evaluation takes its first ``eval_size`` rows (None = all rows the
    calibration set leaves) and calibration the next ``calib_size``, so the evaluation set does not move when
    only the calibration size changes.
    """
    n = len(ds)
    if n == 0:
        raise DataError(f"{ds.source} is empty: nothing to split.")
    if calib_size < 0 or (eval_size is not None and eval_size < 0):
        raise DataError(f"Split sizes must be >= 0; got calibration {calib_size}, evaluation {eval_size}.")
    if calib_size + (eval_size or 0) > n:
        raise DataError(f"Asked for {calib_size} calibration + {eval_size} evaluation examples, but {ds.source} "
                        f"has only {n}. Choose sizes that sum to at most {n}.")
    if eval_size is None:
        eval_size = n - calib_size
    order = np.random.default_rng(seed).permutation(n)
    return ds.subset(order[eval_size:eval_size + calib_size]), ds.subset(order[:eval_size])


# -- batches -----------------------------------------------------------------------------------------------------

def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def model_context(model) -> int | None:
    """Longest input the model's position embeddings allow (``max_position_embeddings`` or GPT-2's
    ``n_positions``), or None when its config names none."""
    config = getattr(model.config, "text_config", None) or model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def prepare_tokenizer(tokenizer, model) -> None:
    """Fit ``tokenizer`` to ``model`` (in place; call once at load time): a pad token and the context length.

    Pad rule: the tokenizer's own pad token, else its EOS token, else its UNK token; with none of these there is
    nothing safe to pad with and batching several rows is refused (a DataError). Padding is masked by the
    attention mask, so reusing EOS for it does not hide real EOS tokens from the loss. A classifier whose config
    has no ``pad_token_id`` gets the tokenizer's, since decoder classifiers (``*ForSequenceClassification``)
    pool the last token that is not padding and find it by that id (with EOS as pad, a trailing real EOS counts as
    padding there, so such a classifier pools the token before it, as transformers does for GPT-2).
    ``tokenizer.model_max_length`` is capped at ``model_context(model)``, so ``make_batches`` truncates (and
    warns) at the model's context.
    """
    if tokenizer.pad_token is None:
        tokenizer.pad_token = pad_token_of(tokenizer)
    if getattr(model.config, "pad_token_id", None) is None and not _is_language_model(model):
        model.config.pad_token_id = tokenizer.pad_token_id
    context = model_context(model)
    if context is not None and not tokenizer.model_max_length <= context:
        tokenizer.model_max_length = context


def pad_token_of(tokenizer) -> str:
    """The pad rule: the tokenizer's pad token, else its EOS token, else its UNK token (DataError: none)."""
    token = tokenizer.pad_token or tokenizer.eos_token or tokenizer.unk_token
    if token is None:
        raise DataError(f"{type(tokenizer).__name__} has no pad, EOS or UNK token to pad batches with. Give the "
                        "model folder a tokenizer that defines one of them.")
    return token


def _is_language_model(model) -> bool:
    from .task import is_language_model

    return is_language_model(model)


def _context_of(tokenizer) -> int | None:
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < _UNBOUNDED_CONTEXT else None


def _encode(tokenizer, ds: TextDataset, max_length: int) -> dict:
    """Tokenize ``ds`` truncated to ``max_length`` and to the model's context; warn (TruncationWarning) about
    rows longer than that context, which is not the user's choice the way ``max_length`` is."""
    context = _context_of(tokenizer)
    if context is None or context >= max_length:
        return tokenizer(ds.texts, ds.pairs, truncation=True, max_length=max_length)
    # One token more than fits shows which rows overflow without tokenizing every row twice.
    enc = tokenizer(ds.texts, ds.pairs, truncation=True, max_length=context + 1)
    long_rows = [i for i, ids in enumerate(enc["input_ids"]) if len(ids) > context]
    if long_rows:
        import warnings

        cut = tokenizer([ds.texts[i] for i in long_rows],
                        None if ds.pairs is None else [ds.pairs[i] for i in long_rows],
                        truncation=True, max_length=context)
        for key in enc:
            for row, values in zip(long_rows, cut[key]):
                enc[key][row] = values
        warnings.warn(f"{ds.source}: {len(long_rows)} of {len(ds)} rows are longer than the model's context of "
                      f"{context} tokens and were truncated to it (--max-length {max_length} asked for more).",
                      TruncationWarning, stacklevel=3)
    return enc


def make_batches(tokenizer, ds: TextDataset, batch_size: int = 32, max_length: int = 128,
                 sort_by_length: bool = True) -> list[dict]:
    """Tokenized batches: input_ids, attention_mask, (token_type_ids), labels, and ``index`` (dataset rows).

    Rows are truncated to ``max_length`` tokens, and to the model's context (``tokenizer.model_max_length`` as
    ``prepare_tokenizer`` set it) with a TruncationWarning, and, with ``sort_by_length``, grouped by length so
    each batch is padded (on the right, with the pad token of ``prepare_tokenizer``'s rule) only to its own
    longest row. Labels are a LongTensor, or a FloatTensor for regression; for language-model data (``ds.task ==
    "lm"``) they are the input ids with padding set to -100 (``headprune.task.lm_labels``); other data without
    labels gives batches without "labels". Pass ``model_inputs(batch)`` to a model, not the batch itself.
    """
    if len(ds) == 0:
        raise DataError(f"{ds.source} is empty: nothing to batch.")
    if batch_size < 1 or max_length < 2:
        raise DataError(f"batch_size must be >= 1 and max_length >= 2; got {batch_size} and {max_length}.")
    if ds.labels is not None and any(not isinstance(v, (int, float)) for v in ds.labels):
        raise DataError(f"{ds.source}: labels are names, not ids; call align_labels(ds, model.config.id2label).")
    enc = _encode(tokenizer, ds, max_length)
    lengths = [len(ids) for ids in enc["input_ids"]]
    order = sorted(range(len(ds)), key=lambda i: lengths[i]) if sort_by_length else list(range(len(ds)))
    pad_id = tokenizer.pad_token_id
    if pad_id is None:  # a tokenizer prepare_tokenizer has not seen: the same rule
        pad_id = tokenizer.convert_tokens_to_ids(pad_token_of(tokenizer))
    pad_values = {"input_ids": pad_id, "attention_mask": 0, "token_type_ids": 0}
    label_dtype = torch.float32 if ds.task == "regression" else torch.long
    batches = []
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batch = {k: _pad([enc[k][i] for i in index], v) for k, v in pad_values.items() if k in enc}
        if ds.task == "lm":
            from .task import lm_labels

            batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
        elif ds.labels is not None:
            batch["labels"] = torch.tensor([ds.labels[i] for i in index], dtype=label_dtype)
        batch["index"] = index
        batches.append(batch)
    return batches


def model_inputs(batch: dict) -> dict:
    """The keys of ``batch`` a model takes (drops labels and row indices)."""
    return {k: v for k, v in batch.items() if k not in NON_INPUT_KEYS}


def batch_texts(ds: TextDataset, batches: list[dict]) -> list[list[str | tuple[str, str]]]:
    """Raw texts of each batch, row for row (for code that needs words, e.g. syntax): a row of a sentence-pair
    dataset is its ``(text, pair)`` tuple, the two texts the model read, so a parser sees both."""
    if ds.pairs is None:
        return [[ds.texts[i] for i in b["index"]] for b in batches]
    return [[(ds.texts[i], ds.pairs[i]) for i in b["index"]] for b in batches]


def calibration_texts(ds: TextDataset, batches: list[dict]) -> list[str | tuple[str, str]]:
    """``batch_texts`` flattened in batch order: the ``texts`` a ScoringContext over ``batches`` takes."""
    return [t for rows in batch_texts(ds, batches) for t in rows]
