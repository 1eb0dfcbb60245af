"""The circuit demo's multiple-choice set: questions whose right answer is the induction circuit's next word.

Uses the cached circuit demo (built once, like tests/test_circuit.py) and 64 of the questions.
"""

from __future__ import annotations

import pytest
import torch

from headprune.data import load_data
from headprune.demos import circuit
from headprune.evaluation.metrics import evaluate
from headprune.model.mask import HeadMask
from headprune.workspace import Workspace

INDUCTION = {"1": [0, 1, 4, 5, 6, 7]}   # docs/tutorials/circuit.md: the six induction heads of layer 1
N = 64


@pytest.fixture(scope="module")
def workspace():
    torch.set_num_threads(1)
    return Workspace.build("demo-circuit", "demo-circuit-choice", calib_size=0, eval_size=N, select_size=0,
                           device="cpu")


def test_questions_are_induction_steps_with_distractors_from_the_block():
    ds = load_data("demo-circuit-choice")
    assert ds.task == "multiple_choice" and len(ds) == circuit.CHOICE_ROWS
    blocks = [t.split()[:len(t.split()) // 2] for t in circuit.repeat_rows(circuit.vocabulary(), len(ds),
                                                                          circuit.CHOICE_SEED).texts]
    answers = set()
    for context, choices, answer, block in zip(ds.texts, ds.choices, ds.labels, blocks):
        words = context.split()
        n, j = len(block), len(words) - len(block)
        assert words[:n] == block and words[n:] == block[:j] and 1 <= j < n   # "r r[:j]"
        assert len(choices) == circuit.CHOICE_OPTIONS == len(set(choices))   # distinct
        assert set(choices) <= set(block)                                     # every choice is a word of the block
        assert choices[answer] == block[j]                                    # the right one follows r[j-1]
        answers.add(answer)
    assert answers == set(range(circuit.CHOICE_OPTIONS))                      # the order is shuffled
    assert ds.texts == load_data("demo-circuit-choice").texts                 # seeded


def test_dense_model_answers_and_pruning_the_induction_heads_drops_it_near_chance(workspace):
    assert workspace.task.is_choice and len(workspace.eval) == N
    model, batches = workspace.loaded.model, workspace.eval_batches
    dense = evaluate(model, batches)
    assert dense.n == N and dense.acc > 0.9 and dense.acc_norm > 0.9          # measured 1.000 on 256
    pruned = evaluate(model, batches, HeadMask.from_pruned(INDUCTION, workspace.shape))
    assert pruned.acc < 0.5                                                   # chance 0.25; measured 0.203 on 256
    other = evaluate(model, batches, HeadMask.from_pruned({"2": [0, 2, 4, 6, 7], "1": [3]}, workspace.shape))
    assert other.acc > 0.9                                                    # six non-circuit heads: no harm
