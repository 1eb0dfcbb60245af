"""The two stability measures (HIES Table 2 / Fig. 5, never defined by the paper; headprune.evaluation.stability):
agreement with the dense model's answers, and answers kept under a seeded word drop. Each equals a hand
computation on a small case, and trajectories and protocols report both."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score
from test_kl import spread_weights

from headprune.evaluation.stability import (
    STABILITY_METRICS,
    dense_agreement,
    drop_words,
    perturb_batches,
    same_answers,
    stability,
)
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.model.task import Task
from headprune.protocol import Protocol, ProtocolError
from headprune.protocol import cells as adapter
from headprune.protocol.run import run_protocol
from headprune.testing import random_batch, tiny_model

MASK = HeadMask.ones((3, 4)).prune(0, 1).prune(0, 2).prune(1, 0).prune(1, 3).prune(2, 2)


@pytest.fixture(scope="module")
def classifier():
    return spread_weights(tiny_model("bert", num_labels=3), 0.3, seed=2).eval()


@pytest.fixture(scope="module")
def batches():
    return [random_batch(batch_size=6, seq_len=9, seed=11), random_batch(batch_size=5, seq_len=7, seed=12)]


def _argmax(model, batches) -> np.ndarray:
    """Answers by plain forwards, batch after batch (no headprune evaluation path)."""
    with torch.no_grad():
        return np.concatenate([model(**{k: v for k, v in b.items() if k in ("input_ids", "attention_mask")}
                                     ).logits.argmax(-1).numpy() for b in batches])


def test_same_answers_by_hand():
    assert same_answers([0, 1, 1, 2], [0, 1, 2, 2]) == 75.0
    assert same_answers([3, 3], [3, 3]) == 100.0 and same_answers([1], [0]) == 0.0


def test_agreement_equals_the_share_of_rows_a_cut_model_answers_as_the_dense_one(classifier, batches):
    dense = _argmax(classifier, batches)
    cut = _argmax(prune_model(copy.deepcopy(classifier), MASK), batches)      # heads physically removed
    by_hand = 100.0 * sum(int(a == b) for a, b in zip(dense, cut)) / len(dense)
    assert 0 < by_hand < 100                                                  # the case tells the rows apart
    assert by_hand == pytest.approx(100.0 * accuracy_score(dense, cut))         # scikit-learn on the same answers
    assert dense_agreement(classifier, batches, MASK) == pytest.approx(by_hand)
    assert dense_agreement(classifier, batches, MASK, dense=dense) == pytest.approx(by_hand)
    assert dense_agreement(classifier, batches, None) == 100.0


def test_stability_equals_the_share_of_answers_kept_under_the_seeded_word_drop(classifier, batches):
    # the drop by hand: a word stays when its uniform draw is >= p (at least one word is kept)
    rng, hand = np.random.default_rng(4), np.random.default_rng(4)
    words = "the cat sat on the warm mat".split()
    kept = [w for w, u in zip(words, hand.random(len(words))) if u >= 0.5]
    assert drop_words(" ".join(words), 0.5, rng) == " ".join(kept)

    perturbed = perturb_batches(batches, None, p=0.3, seed=5)
    assert any(p["input_ids"].shape != b["input_ids"].shape or not torch.equal(p["input_ids"], b["input_ids"])
               for p, b in zip(perturbed, batches))
    cut = prune_model(copy.deepcopy(classifier), MASK)
    clean, noisy = _argmax(cut, batches), _argmax(cut, perturbed)
    by_hand = 100.0 * float(np.mean(clean == noisy))
    assert by_hand == pytest.approx(100.0 * accuracy_score(clean, noisy))      # scikit-learn on the same answers
    assert stability(classifier, batches, perturbed, MASK) == pytest.approx(by_hand)
    assert stability(classifier, batches, batches, MASK) == 100.0


def test_a_trajectory_records_agreement_and_reads_it_as_its_metric(classifier, batches):
    from conftest import trajectory

    labelled = [{**b, "labels": torch.as_tensor(_argmax(classifier, [b]))} for b in batches]
    traj = trajectory(classifier, labelled, labelled, "random", count=5, metric="agreement", stability=True,
                      seed=3)
    assert traj.metric == "agreement" and traj.dense["agreement"] == 100.0
    for i, step in enumerate(traj.steps, start=1):
        mask = traj.mask_at(i)
        assert step["metrics"]["agreement"] == pytest.approx(dense_agreement(classifier, labelled, mask))
        assert step["metrics"]["stability"] == step["stability"]
    # labels are the dense answers here, so agreement is accuracy in percent
    assert np.allclose(traj.values("agreement"), 100 * traj.values("accuracy"))


def test_stability_as_a_trajectory_metric_needs_the_word_drop():
    from headprune.criteria import get
    from headprune.trajectory import TrajectoryError, TrajectorySpec

    with pytest.raises(TrajectoryError, match="stability=True, the CLI's --stability"):
        TrajectorySpec(criterion=get("random"), metric="stability")
    TrajectorySpec(criterion=get("random"), metric="stability", stability=True)


def test_the_stability_measures_are_protocol_metrics_reported_where_the_task_gives_answers():
    assert set(STABILITY_METRICS) <= set(Protocol.parse(
        'models = ["demo"]\nsparsities = [0.5]\nmetrics = ["task", "agreement", "stability"]\n'
        '[data.calib]\nsource = "demo"\n[data.eval]\nsource = "demo"\n[[criteria]]\nname = "random"\n'
    ).models[0].metrics)
    entry = Protocol.parse('models = ["demo"]\nsparsities = [0.5]\nmetrics = ["task", "agreement"]\n'
                           '[data.calib]\nsource = "demo"\n[data.eval]\nsource = "demo"\n[[criteria]]\n'
                           'name = "random"\n').models[0]
    assert adapter.task_metrics(Task("classification"), entry, "hf:nyu-mll/glue:cola:validation", 2) == \
        ("mcc", "agreement")
    assert adapter.task_metrics(Task("regression"), entry, "hf:nyu-mll/glue:stsb:validation", 1) == \
        ("pearson", "spearman")
    with pytest.raises(ProtocolError, match=r"line 1: key 'models\.0\.metrics': agreement: not measured on recovered"):
        Protocol.parse('models = ["demo"]\nsparsities = [0.5]\nmetrics = ["agreement"]\n[recovery]\nsteps = 2\n'
                       '[data.calib]\nsource = "demo"\n[data.eval]\nsource = "demo"\n[data.train]\nsource = '
                       '"demo"\n[[criteria]]\nname = "random"\n', "p.toml")


def test_protocol_cells_report_both_measures_as_evaluated_alone(tmp_path, tiny_model_dir, tiny_csv, one_thread):
    from headprune.model.loading import load_model

    text = (f'name = "st"\nmodels = ["{tiny_model_dir}"]\nsparsities = [0.5]\nbatch_size = 8\nseed = 3\n'
            f'metrics = ["task", "agreement", "stability"]\n\n'
            f'[data.calib]\nsource = "{tiny_csv}"\nsize = 12\n\n[data.eval]\nsource = "{tiny_csv}"\nsize = 20\n\n'
            '[[criteria]]\nname = "random"\n')
    path = tmp_path / "st.toml"
    path.write_text(text, encoding="utf-8")
    protocol = Protocol.read(path)
    out = tmp_path / "out"
    summary = run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())
    loaded = load_model(str(tiny_model_dir), "cpu")
    data = adapter.build_workspace_for(loaded, protocol.models[0], protocol, 0, {})
    perturbed = perturb_batches(data.eval_batches, loaded.tokenizer, 0.1, 3)
    for cell in run["cells"].values():
        mask = HeadMask.from_json(json.loads((out / cell["mask"]).read_text()), (3, 4)) if cell["mask"] else None
        assert cell["metrics"]["agreement"] == pytest.approx(dense_agreement(loaded.model, data.eval_batches, mask))
        assert cell["metrics"]["stability"] == pytest.approx(stability(loaded.model, data.eval_batches, perturbed,
                                                                       mask))
    assert run["cells"][next(k for k in run["cells"] if "dense" in k)]["metrics"]["agreement"] == 100.0
    assert "agreement" in summary["table"].splitlines()[0] and "stability" in summary["table"].splitlines()[0]


def test_stability_measures_asked_of_a_language_model_are_said_to_be_left_out(tmp_path, one_thread):
    """A language model gives no answers to compare: the table leaves the measures out and says why beneath it
    (issue 39: it was silent); a classifier's table in the test above carries no such line."""
    from conftest import save_tiny_lm

    folder, rows = save_tiny_lm(tmp_path / "lm", n=24)
    text = (f'name = "lmst"\nmodels = ["{folder}"]\nsparsities = [0.5]\nbatch_size = 8\n'
            f'metrics = ["task", "agreement", "stability"]\n\n'
            f'[data.calib]\nsource = "{rows}"\nsize = 8\n\n[data.eval]\nsource = "{rows}"\nsize = 8\n\n'
            '[[criteria]]\nname = "random"\n')
    (tmp_path / "lmst.toml").write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    summary = run_protocol(Protocol.read(tmp_path / "lmst.toml"), out, plots=False)
    header = summary["table"].splitlines()[0]
    assert "agreement" not in header and "stability" not in header and "perplexity" in header
    note = f"> **agreement, stability not reported for {folder}:** its task is lm, which gives no answers to compare"
    assert note in summary["table"] and note in (out / "results.md").read_text(encoding="utf-8")
