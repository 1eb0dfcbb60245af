"""The data layer: texts in, model-ready batches out (classifier and language-model data alike).

    sources.py   named data sets (registered by the demos), CSV/TSV/JSONL/TXT files, Hugging Face datasets
    labels.py    labels as found -> the model's label ids (or float targets for a regression head)
    batches.py   seeded calibration/evaluation split; tokenized, length-sorted, padded batches
    choice.py    multiple-choice questions: field maps, the context/continuation split rule, whole-question batches
    dataset.py   TextDataset

The public names are importable from here: ``from headprune.data import load_data, make_batches, ...``.
"""

from .batches import (
    TruncationWarning,
    batch_texts,
    calibration_texts,
    make_batches,
    model_inputs,
    redraw_calibration,
    split_calib_eval,
)
from .choice import (
    FIELD_MAPS,
    ChoiceFields,
    ChoiceWarning,
    choice_dataset,
    choice_fields,
    make_choice_batches,
    prefix_token_id,
    split_context_continuation,
)
from .dataset import NON_INPUT_KEYS, TextDataset, as_lm_data, content_hash, data_role, row_hashes
from .labels import align_labels, label_note, parse_label_map
from .sources import (
    EVAL_SPLITS,
    LABEL_COLUMNS,
    NAMED_DATA,
    PAIR_COLUMNS,
    ROLES,
    TEXT_COLUMNS,
    NamedData,
    accepted,
    check_source,
    columns_of,
    is_choice_data,
    load_data,
    parse_hf_spec,
    pick_split,
    register_dataset,
)

__all__ = ["EVAL_SPLITS", "FIELD_MAPS", "LABEL_COLUMNS", "NAMED_DATA", "NON_INPUT_KEYS", "PAIR_COLUMNS", "ROLES",
           "TEXT_COLUMNS", "ChoiceFields", "ChoiceWarning", "NamedData", "TextDataset", "TruncationWarning", "accepted",
           "align_labels", "as_lm_data", "batch_texts", "calibration_texts", "check_source", "choice_dataset",
           "choice_fields", "columns_of", "content_hash", "data_role", "is_choice_data", "label_note", "load_data",
           "make_batches", "make_choice_batches", "model_inputs", "parse_hf_spec", "parse_label_map", "pick_split",
           "prefix_token_id", "redraw_calibration", "register_dataset", "row_hashes", "split_calib_eval",
           "split_context_continuation"]
