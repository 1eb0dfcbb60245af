"""Multiple-choice data: rows of (context, choices, right answer), the context/continuation split, and batches.

Rows
    A question is a context, a list of at least two choices and the index of the right one (``TextDataset`` with
    ``task="multiple_choice"``: ``texts`` the contexts, ``choices`` the choice lists, ``labels`` the indices).
    Field maps read the common sets as they are published (raw fields, no prompt template):
        hellaswag   ctx / endings (a list) / label
        arc         question / choices.text (a list inside a dict) / answerKey (a letter or digit, looked up in
                    choices.label, else A=0, B=1, ... or the digit itself)
        piqa        goal / sol1, sol2 (one column per choice) / label
        generic     context / choices / answer (the names ``--context-col --choices-col --answer-col`` default to)
    A CSV cell holding the choices is a JSON list. ``--choices-col a,b`` names one column per choice.

The split rule (one function, :func:`split_context_continuation`, for headprune's path and lm-evaluation-harness's)
    lm-eval (``api/model.py`` ``_encode_pair``) scores the continuation ``separator + choice`` given the context:
    the context's trailing whitespace moves onto the continuation, context + continuation is encoded as one string
    and split at the length of the context's own encoding, so the continuation's first token is the one the model
    reads after the context in running text. Both encodes use ``add_special_tokens=False``: a tokenizer whose
    post-processor adds an end token to every encode (the LM demo's reads ``<bos> $A <eos>``) would otherwise put
    an <eos> inside the context's count, drop the choice's first token and score the <eos>. The context is then
    preceded by the prefix token lm-eval uses for an empty context (``HFLM.prefix_token_id``: BOS, else EOS), so a
    model trained on ``<bos> text`` sees the start it was trained on. lm-eval through headprune gets the same ids
    by calling this function (the demo tokenizer is not retrained or changed).

Batches (:func:`make_choice_batches`)
    One row per (question, choice): prefix + context + continuation tokens; ``labels`` are the continuation's
    token ids and IGNORE_INDEX elsewhere (context and padding), so the next-token loss of ``headprune.model.task``
    sums over the continuation only. Rows longer than ``max_length`` lose context tokens from the left, as lm-eval
    truncates. A question's rows stay together in one batch (questions sorted by their longest row, then packed
    whole into batches of at most ``batch_size`` rows, one question at least), so a running estimate over batches
    counts whole questions. Per-row keys: ``index`` (the question), ``choice``, ``gold``, ``choice_chars``,
    ``choice_bytes`` (``headprune.model.task.CHOICE_KEYS``).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass

import torch

from ..errors import DataError
from ..model.task import BYTES_KEY, CHARS_KEY, CHOICE_KEY, GOLD_KEY, IGNORE_INDEX
from ..model.tokenizer import context_of, pad_token_of
from ..userinput import MAX_JSON_DEPTH, json_depth
from .dataset import TextDataset

SEPARATOR = " "   # lm-eval's default target_delimiter between the context and a choice


@dataclass(frozen=True)
class ChoiceFields:
    """Where a data set keeps a question: its context column, its choices (one list column, ``col.key`` for a
    list inside a dict column, or one column per choice) and its answer column."""

    name: str
    context: str
    choices: tuple[str, ...]
    answer: str

    def columns(self) -> list[str]:
        return [self.context, *(c.split(".")[0] for c in self.choices), self.answer]


FIELD_MAPS = (ChoiceFields("hellaswag", "ctx", ("endings",), "label"),
              ChoiceFields("arc", "question", ("choices.text",), "answerKey"),
              ChoiceFields("piqa", "goal", ("sol1", "sol2"), "label"),
              ChoiceFields("generic", "context", ("choices",), "answer"))
GENERIC = FIELD_MAPS[-1]


class ChoiceWarning(UserWarning):
    """Multiple-choice rows longer than the context were cut from the left (the CLI prints this on stderr)."""


# -- the split rule -----------------------------------------------------------------------------------------------

def prefix_token_id(tokenizer) -> int:
    """The token put before every context: BOS, else EOS (lm-eval's ``HFLM.prefix_token_id``)."""
    token = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    if token is None:
        raise DataError("Multiple-choice scoring puts a start token before the context, but this tokenizer has "
                        "neither a BOS nor an EOS token.")
    return int(token)


def split_context_continuation(tokenizer, context: str, continuation: str,
                               separator: str = SEPARATOR) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) of ``continuation`` after ``context`` (module doc, lm-eval's ``_encode_pair``).

    The continuation is ``separator + continuation``; trailing whitespace of the context moves onto it; the
    context ids start with :func:`prefix_token_id`; neither part holds any other special token.
    """
    continuation = separator + continuation
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tokenizer.encode(context + continuation, add_special_tokens=False)
    context_ids = tokenizer.encode(context, add_special_tokens=False) if context else []
    return [prefix_token_id(tokenizer), *context_ids], list(whole[len(context_ids):])


# -- rows from columns ----------------------------------------------------------------------------------------------

def _find(header: list[str], name: str) -> str | None:
    by_lower = {c.lower(): c for c in header}
    return name if name in header else by_lower.get(name.lower())


def choice_fields(header: list[str], context_col: str | None = None, choices_col: str | None = None,
                  answer_col: str | None = None, source: str = "") -> ChoiceFields | None:
    """The field map of a multiple-choice data set with columns ``header`` (None: not multiple choice).

    Named columns win (``choices_col`` "a,b" = one column per choice); the rest come from the first field map
    whose columns all exist, else the generic names. A named column that is missing is a DataError listing the
    columns found.
    """
    given = any((context_col, choices_col, answer_col))
    found = next((f for f in FIELD_MAPS if all(_find(header, c) for c in f.columns())), None)
    if not given:
        return found
    base = found or GENERIC
    fields = ChoiceFields("custom", context_col or base.context,
                          tuple(c.strip() for c in choices_col.split(",")) if choices_col else base.choices,
                          answer_col or base.answer)
    for role, names in (("context", [fields.context]), ("choices", [c.split(".")[0] for c in fields.choices]),
                        ("answer", [fields.answer])):
        for name in names:
            if _find(header, name) is None:
                raise DataError(f"{source} has no {role} column '{name}'. Columns found: {', '.join(header)}. "
                                f"Name the columns with --context-col, --choices-col (a list column, or "
                                "several columns separated by commas) and --answer-col.")
    return fields


def _as_list(value, row: int, column: str, source: str) -> list:
    if isinstance(value, str):   # a CSV cell: the choices as a JSON list
        try:
            value = json.loads(value) if json_depth(value) <= MAX_JSON_DEPTH else None
        except json.JSONDecodeError:
            raise DataError(f"{source}: row {row}, choices column '{column}' is not a JSON list: {value[:80]!r}. "
                            'Write the choices as a JSON list, e.g. ["first", "second"].') from None
    if not isinstance(value, (list, tuple)):
        raise DataError(f"{source}: row {row}, choices column '{column}' holds {type(value).__name__}, not a list "
                        "of choices.")
    return list(value)


def _choices_of(columns: dict[str, list], header: list[str], fields: ChoiceFields, row: int,
                source: str) -> tuple[list, list | None]:
    """(choices, their labels or None) of one row."""
    if len(fields.choices) > 1:
        return [columns[_find(header, c)][row] for c in fields.choices], None
    column, _, key = fields.choices[0].partition(".")
    value = columns[_find(header, column)][row]
    if key:  # ARC: {"text": [...], "label": ["A", ...]}
        if isinstance(value, str) and value.strip().startswith("{"):
            try:   # a cell that is not JSON (or nests past the limit) is no object: said below
                value = json.loads(value) if json_depth(value) <= MAX_JSON_DEPTH else value
            except json.JSONDecodeError:
                pass
        if not isinstance(value, dict) or key not in value:
            raise DataError(f"{source}: row {row}, column '{column}' has no '{key}' entry (expected an object "
                            f"like {{\"{key}\": [...], \"label\": [...]}}).")
        labels = value.get("label")
        return _as_list(value[key], row, fields.choices[0], source), None if labels is None else list(labels)
    return _as_list(value, row, column, source), None


def _answer_index(value, labels: list | None, n: int, row: int, column: str, source: str) -> int:
    """A right answer as an index: an int, a digit string, a choice label (ARC's answerKey), or a letter."""
    text = str(value).strip()
    if labels is not None and text in [str(lab) for lab in labels]:
        index = [str(lab) for lab in labels].index(text)
    elif isinstance(value, bool):
        index = -1
    elif isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        index = int(value)
    elif text.lstrip("-").isdigit():
        index = int(text)
    elif len(text) == 1 and text.isalpha():
        index = ord(text.upper()) - ord("A")
    else:
        raise DataError(f"{source}: row {row}, answer {value!r} in column '{column}' is not an index, a digit or a "
                        "letter (A = the first choice).")
    if not 0 <= index < n:
        raise DataError(f"{source}: row {row}, answer {value!r} (index {index}) is out of range for its {n} "
                        f"choices. Accepted: 0..{n - 1}, or A..{chr(ord('A') + n - 1)}.")
    return index


def choice_dataset(header: list[str], columns: dict[str, list], fields: ChoiceFields, source: str) -> TextDataset:
    """The multiple-choice TextDataset of ``columns`` read through ``fields``; every row checked (a context that is
    text, at least two choices that are text beyond whitespace, an answer that names one of them)."""
    context_col, answer_col = _find(header, fields.context), _find(header, fields.answer)
    contexts, choices, answers = [], [], []
    for row, context in enumerate(columns[context_col]):
        if not isinstance(context, str):
            raise DataError(f"{source}: row {row}, context column '{context_col}' is {context!r}, not text.")
        options, labels = _choices_of(columns, header, fields, row, source)
        if len(options) < 2:
            raise DataError(f"{source}: row {row} has {len(options)} choice(s); a multiple-choice question needs "
                            "at least two.")
        # a choice of spaces only is scored as an empty continuation (its tokens are whitespace), so it is refused
        # like an empty one
        if any(not isinstance(o, str) or not o.strip() for o in options):
            raise DataError(f"{source}: row {row}: every choice must be text with a visible character (not empty, "
                            f"not whitespace only); got {options!r}.")
        answers.append(_answer_index(columns[answer_col][row], labels, len(options), row, answer_col, source))
        contexts.append(context)
        choices.append(list(options))
    if not contexts:
        raise DataError(f"{source} has no rows: a multiple-choice data set needs at least one question.")
    return TextDataset(texts=contexts, labels=answers, choices=choices, source=source, task="multiple_choice",
                       columns={"context": fields.context, "choices": ",".join(fields.choices),
                                "answer": fields.answer, "field_map": fields.name})


# -- batches --------------------------------------------------------------------------------------------------------

def question_rows(tokenizer, context: str, choices: list[str], max_length: int) -> tuple[list[list[int]], list[int],
                                                                                        bool]:
    """(token ids of each choice's row, continuation length of each, whether any row was cut) of one question."""
    rows, n_cont, cut = [], [], False
    for choice in choices:
        context_ids, continuation_ids = split_context_continuation(tokenizer, context, choice)
        if len(continuation_ids) >= max_length:
            raise DataError(f"A choice of {len(continuation_ids)} tokens does not fit --max-length {max_length} "
                            f"with any context: {choice[:60]!r}. Raise --max-length.")
        ids = context_ids + continuation_ids
        cut |= len(ids) > max_length
        rows.append(ids[-max_length:])
        n_cont.append(len(continuation_ids))
    return rows, n_cont, cut


def make_choice_batches(tokenizer, ds: TextDataset, batch_size: int = 32, max_length: int = 128,
                        sort_by_length: bool = True) -> list[dict]:
    """Batches of (question, choice) rows keeping each question whole (module doc).

    Each batch: input_ids, attention_mask (B, T) padded on the right; labels (B, T) the continuation ids, -100
    elsewhere; index (B,) list of question rows of ``ds``; choice, choice_chars, choice_bytes (B,) long; gold (B,)
    bool.
    """
    context = context_of(tokenizer)
    limit = max_length if context is None else min(max_length, context)
    questions, n_cut = [], 0
    for q, (text, options) in enumerate(zip(ds.texts, ds.choices)):
        rows, n_cont, cut = question_rows(tokenizer, text, options, limit)
        n_cut += cut
        questions.append((q, rows, n_cont))
    if n_cut:
        warnings.warn(f"{ds.source}: {n_cut} of {len(ds)} questions are longer than {limit} tokens; their contexts "
                      "were cut from the left.", ChoiceWarning, stacklevel=3)
    if sort_by_length:
        questions.sort(key=lambda item: max(len(r) for r in item[1]))
    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        pad_id = tokenizer.convert_tokens_to_ids(pad_token_of(tokenizer))
    groups, current = [], []
    for item in questions:
        if current and sum(len(i[1]) for i in current) + len(item[1]) > batch_size:
            groups.append(current)
            current = []
        current.append(item)
    groups.append(current)
    return [_choice_batch(ds, group, pad_id) for group in groups]


def _choice_batch(ds: TextDataset, group: list, pad_id: int) -> dict:
    rows = [(q, c, ids, n) for q, ids_list, n_cont in group for c, (ids, n) in enumerate(zip(ids_list, n_cont))]
    width = max(len(ids) for _, _, ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    for r, (_, _, ids, n) in enumerate(rows):
        input_ids[r, :len(ids)] = torch.tensor(ids)
        attention[r, :len(ids)] = 1
        labels[r, len(ids) - n:len(ids)] = torch.tensor(ids[len(ids) - n:])
    options = [ds.choices[q][c] for q, c, _, _ in rows]
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels,
            "index": [q for q, _, _, _ in rows],
            CHOICE_KEY: torch.tensor([c for _, c, _, _ in rows]),
            GOLD_KEY: torch.tensor([c == ds.labels[q] for q, c, _, _ in rows]),
            CHARS_KEY: torch.tensor([len(o) for o in options]),
            BYTES_KEY: torch.tensor([len(o.encode("utf-8")) for o in options])}
