"""The data layer: texts in, model-ready batches out (classifier and language-model data alike).

    sources.py   named data sets (registered by the demos), CSV/TSV/JSONL/TXT files, Hugging Face datasets
    labels.py    labels as found -> the model's label ids (or float targets for a regression head)
    batches.py   seeded calibration/evaluation split; tokenized, length-sorted, padded batches
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
from .dataset import NON_INPUT_KEYS, TextDataset, as_lm_data, content_hash
from .labels import align_labels
from .sources import (
    LABEL_COLUMNS,
    NAMED_DATA,
    PAIR_COLUMNS,
    TEXT_COLUMNS,
    NamedData,
    accepted,
    columns_of,
    load_data,
    parse_hf_spec,
    register_dataset,
)

__all__ = ["LABEL_COLUMNS", "NAMED_DATA", "NON_INPUT_KEYS", "PAIR_COLUMNS", "TEXT_COLUMNS", "NamedData",
           "TextDataset", "TruncationWarning", "accepted", "align_labels", "as_lm_data", "batch_texts",
           "calibration_texts", "columns_of", "content_hash", "load_data", "make_batches", "model_inputs",
           "parse_hf_spec", "redraw_calibration", "register_dataset", "split_calib_eval"]
