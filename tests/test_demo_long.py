"""The long-context demo (issue 37 item 5): its data generator is seeded and well-formed, its haystack texts are
filler only, and the passkey task runs plans at >= 1k tokens (on a tiny random model: the demo's build takes CPU
minutes and is not rebuilt here)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprune.cli import main
from headprune.demos import needle
from headprune.demos.circuit import make_tokenizer
from headprune.kvcache.longctx import KEY_TOKENS, measure, passkey_rows
from headprune.kvcache.plan import KVPlan
from headprune.kvcache.restrict import restricted
from headprune.model.task import IGNORE_INDEX
from headprune.testing import tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")

STAGES = (needle.Stage(50, 3, 4, "adjacent"), needle.Stage(96, 3, 4, gap=8), needle.Stage(300, 3, 4, blocks=3))


def is_key(ids):
    return (ids >= needle.FIRST_KEY) & (ids < needle.FIRST_KEY + needle.KEY_WORDS)


def test_training_batches_are_seeded_and_every_target_is_answerable_by_induction():
    batches = needle.training_batches(STAGES, seed=3)
    again, other = needle.training_batches(STAGES, seed=3), needle.training_batches(STAGES, seed=4)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
               for a, b in zip(batches, again))
    assert not all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, other))
    assert [tuple(b["input_ids"].shape) for b in batches] == [(4, 50)] * 3 + [(4, 96)] * 3 + [(4, 300)] * 3
    targets = 0
    for stage, batch in zip([s for s in STAGES for _ in range(s.steps)], batches):
        for ids, labels in zip(batch["input_ids"].numpy(), batch["labels"].numpy()):
            assert ids[0] == 1 and bool((ids[1:] >= needle.FIRST_FILLER).all())
            keys = ids[is_key(ids)]
            _, counts = np.unique(keys, return_counts=True)
            assert keys.size and bool((counts == 2).all())            # every key word: its copy and its repeat
            labelled = np.flatnonzero(labels != IGNORE_INDEX)
            assert bool((labels[labelled] == ids[labelled]).all()) and bool(is_key(ids[labelled]).all())
            for t in labelled:                                        # the previous key's earlier copy is followed
                first = np.flatnonzero(ids[:t - 1] == ids[t - 1])     # by this token: induction answers it
                assert len(first) == 1 and ids[first[0] + 1] == ids[t] and is_key(ids[t - 1])
                targets += 1
            # targets are repeat words only; each repeated block's first word is not one (nothing predicts it)
            repeats = [t for t in range(1, len(ids)) if is_key(ids[t]) and (ids[:t] == ids[t]).any()]
            blocks = 1 if stage.kind == "adjacent" else stage.blocks
            assert set(labelled.tolist()) <= set(repeats) and len(repeats) - blocks <= len(labelled) < len(repeats)
            if stage.kind == "adjacent":
                n = len(keys) // 2
                assert (ids[1:1 + n] == ids[1 + n:1 + 2 * n]).all()
            elif stage.gap is not None:                               # the repeat within `gap` filler words
                first_copy = np.flatnonzero(is_key(ids))[0]
                n = len(keys) // 2
                assert np.flatnonzero(is_key(ids))[n] - (first_copy + n) <= stage.gap
    assert targets > 0


def test_filler_texts_are_seeded_filler_words_only():
    texts = needle.filler_texts(3, 50, seed=2)
    assert texts == needle.filler_texts(3, 50, seed=2) != needle.filler_texts(3, 50, seed=5)
    tok = make_tokenizer(needle.vocabulary(), context=needle.CONTEXT)
    ids = tok(texts, add_special_tokens=False)["input_ids"]
    assert all(len(row) == 50 and all(needle.FIRST_FILLER <= t < needle.FIRST_KEY for t in row) for row in ids)
    assert len(tok) == len(needle.SPECIAL_TOKENS) + needle.FILLER_WORDS + needle.KEY_WORDS


def test_passkey_at_1k_tokens_runs_plans_on_a_tiny_random_model():
    """At 1,024 tokens on the demo's vocabulary: rows hold the key twice, drawn from the key words (the filler has
    every filler word); a window covering the row gives exactly the dense logits, S = 4, W = 64 (with and without
    RazorAttention's compensation token) moves them, and ``measure`` runs each plan per depth."""
    tok = make_tokenizer(needle.vocabulary(), context=needle.CONTEXT)
    model = tiny_decoder("llama", vocab_size=len(tok), max_positions=1024)
    texts = needle.filler_texts(8, 200)
    rows = passkey_rows(tok, texts, 1024, 2, seed=0, depths=(0.0, 1.0))
    ids = rows.input_ids
    assert ids.shape == (2, 1024) and bool(is_key(ids[:, -KEY_TOKENS:]).all())
    grid = torch.zeros(4, 2, dtype=torch.bool)
    grid[1, 0] = True
    plans = {"wide": KVPlan(grid, 8, sink=4, window=1024), "W64": KVPlan(grid, 8, sink=4, window=64),
             "W64+token": KVPlan(grid, 8, sink=4, window=64, compensation=True)}
    with torch.no_grad():
        dense = model(input_ids=ids, logits_to_keep=5).logits
        got = {}
        for name, plan in plans.items():
            with restricted(model, plan) as copy:
                got[name] = copy(input_ids=ids, logits_to_keep=5).logits
    assert torch.equal(got["wide"], dense)
    assert not torch.allclose(got["W64"], dense, atol=1e-4)
    assert not torch.allclose(got["W64+token"], got["W64"], atol=1e-4)
    table = measure(model, tok, "passkey", [1024], {"dense": None, "W64+token": plans["W64+token"]}, texts, rows=2,
                    depths=(0.0, 1.0), batch_size=1)
    assert [r["plan"] for r in table] == ["dense", "W64+token"]
    assert all(set(r["by_depth"]) == {"0", "1"} and r["rows"] == 2 and r["length"] == 1024 for r in table)


def test_demo_flags_are_one_at_a_time(capsys):
    assert main(["demo", "--long", "--circuit"]) == 2
    assert "Choose one demo" in capsys.readouterr().err
