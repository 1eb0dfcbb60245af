"""lm-evaluation-harness's loader for the shipped ``demo_lm_cloze`` task (``custom_dataset: !function
cloze_rows.load`` in the YAML beside this file).

lm-eval resolves a relative ``data_files`` path against the working directory, not the YAML, and refuses a
top-level ``data_files``; this helper reads the JSONL from its own folder instead, so the task works wherever lm-eval
runs. lm-eval calls it with the task's metadata and dataset_kwargs as keywords; none are needed.
"""

from pathlib import Path

import datasets

ROWS = Path(__file__).resolve().parent / "demo_lm_cloze.jsonl"


def load(**_task_metadata):
    """{"test": the cloze questions} -- context, choices (four endings), answer (index of the review's own)."""
    return datasets.load_dataset("json", data_files={"test": str(ROWS)})
