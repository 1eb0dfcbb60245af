"""Shared fixtures: the real demo model (built once per machine) and a tiny BERT classifier saved to a folder
with a word-level tokenizer, so file/CLI tests run in milliseconds."""

from __future__ import annotations

import csv
import random

import pytest

WORDS = ["good", "bad", "movie", "great", "awful", "the", "a", "plot", "is", "was", "not", "very", "acting",
         "boring", "fun", "story", "and", "but", "film", "cast"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_LABELS = {0: "neg", 1: "pos"}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run ~50x faster on one thread than on two contended ones (the shared CI box)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def demo_model_path():
    from headprune.demos.classifier import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def demo(demo_model_path):
    from headprune.model.loading import load_model

    return load_model("demo", "cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import BertTokenizer

    return BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})


def sentences(n: int, seed: int = 0, min_words: int = 1, max_words: int = 12) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words))) for _ in range(n)]


def write_csv(path, header: list[str], rows: list[list], delimiter: str = ",") -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A 3-layer x 4-head BERT sentiment classifier (labels neg/pos) saved like a user's model folder."""
    from headprune.testing import tiny_model

    return save_classifier(tiny_model("bert", num_labels=2), tiny_tokenizer, tmp_path_factory.mktemp("tiny_bert"))


def save_classifier(model, tokenizer, out):
    """``model`` labelled neg/pos (TINY_LABELS) saved with ``tokenizer`` in the folder ``out``; returns ``out``."""
    model.config.id2label = dict(TINY_LABELS)
    model.config.label2id = {v: k for k, v in TINY_LABELS.items()}
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> str:
    """60 labelled rows (text, label = neg/pos) for the tiny model."""
    texts = sentences(60, seed=1)
    labels = ["pos" if i % 3 else "neg" for i in range(60)]
    return write_csv(tmp_path_factory.mktemp("data") / "tiny.csv", ["text", "label"], list(zip(texts, labels)))


def trajectory(model, calib, evals, criterion: str, params: dict | None = None, *, tokenizer=None, texts=None,
               evaluator=None, **spec):
    """``run_trajectory`` for a criterion name: the rest of the keywords build the TrajectorySpec."""
    from headprune.criteria import get
    from headprune.trajectory import TrajectorySpec, run_trajectory

    return run_trajectory(TrajectorySpec(criterion=get(criterion), params=params or {}, **spec), model, calib, evals,
                          tokenizer=tokenizer, texts=texts, evaluator=evaluator)
