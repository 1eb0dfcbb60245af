import math

import numpy as np
import pytest
import torch
from conftest import sentences

from headprune.data import TextDataset, make_batches
from headprune.errors import DataError, MaskError
from headprune.evaluation.metrics import (
    Metrics,
    accuracy,
    evaluate,
    gather_labels,
    macro_f1,
    mcc,
    metrics_from_logits,
    pearson,
    predict,
    spearman,
)
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import tiny_model

# -- metrics against hand computations -------------------------------------------------------------------------------

Y = np.array([0, 0, 1, 1, 2, 2])
Y_HAT = np.array([0, 1, 1, 1, 2, 0])


def test_three_class_metrics_by_hand():
    assert accuracy(Y, Y_HAT) == pytest.approx(4 / 6)
    # F1: class 0 TP1 FP1 FN1 -> 1/2; class 1 TP2 FP1 FN0 -> 4/5; class 2 TP1 FP0 FN1 -> 2/3
    assert macro_f1(Y, Y_HAT) == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)
    # C = [[1,1,0],[0,2,0],[1,0,1]]: t = (2,2,2), p = (2,3,1), c = 4, s = 6
    assert mcc(Y, Y_HAT) == pytest.approx((4 * 6 - (2 * 2 + 3 * 2 + 1 * 2)) / math.sqrt((36 - 14) * (36 - 12)))


def test_binary_mcc_is_phi_and_degenerate_cases_are_zero():
    y, y_hat = np.array([1, 1, 1, 0, 0, 0, 0, 1]), np.array([1, 1, 0, 0, 0, 1, 0, 1])
    tp, tn, fp, fn = 3, 3, 1, 1
    phi = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
    assert mcc(y, y_hat) == pytest.approx(phi)
    assert mcc(y, np.ones_like(y)) == 0.0  # one class predicted
    assert macro_f1(np.array([1, 1]), np.array([1, 1])) == 1.0  # classes never seen do not count
    assert macro_f1(np.array([0, 0]), np.array([1, 1])) == 0.0


def test_against_sklearn_when_present():
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    y, y_hat = rng.integers(0, 4, 200), rng.integers(0, 4, 200)
    assert macro_f1(y, y_hat) == pytest.approx(sk.f1_score(y, y_hat, average="macro"))
    assert mcc(y, y_hat) == pytest.approx(sk.matthews_corrcoef(y, y_hat))


def test_correlations_by_hand():
    x, y = np.array([1.0, 2, 3, 4]), np.array([2.0, 4, 5, 4])
    # x - 2.5 = (-1.5,-.5,.5,1.5), y - 3.75 = (-1.75,.25,1.25,.25): cov 3.5, Sxx 5, Syy 4.75
    assert pearson(x, y) == pytest.approx(3.5 / math.sqrt(5 * 4.75))
    # ranks of y, ties averaged: 2 -> 1, the two 4s -> 2.5, 5 -> 4; ranks of x are x itself
    assert spearman(x, y) == pytest.approx(pearson(x, np.array([1, 2.5, 4, 2.5])))
    assert math.isnan(pearson(x, np.ones(4)))


def test_loss_is_mean_cross_entropy():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    expected = -np.mean([2 - np.log(np.exp(2) + 1), 0 - np.log(1 + np.e), -np.log(2)])
    m = metrics_from_logits(logits, labels)
    assert m.loss == pytest.approx(expected) and m.accuracy == pytest.approx(1 / 3) and m.n == 3  # ties go to class 0
    assert set(m.to_dict()) == {"n", "loss", "accuracy", "f1", "macro_f1", "mcc"}  # binary: f1 too


# -- running a model -------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def setup(tiny_tokenizer):
    model = tiny_model("bert", num_labels=3)
    ds = TextDataset(texts=sentences(19, seed=5), labels=[i % 3 for i in range(19)])
    return model, ds, make_batches(tiny_tokenizer, ds, batch_size=4, max_length=32)


def test_predict_returns_dataset_order_matching_unpadded_forwards(setup, tiny_tokenizer):
    model, ds, batches = setup
    logits = predict(model, batches)
    assert logits.shape == (19, 3)
    with torch.no_grad():
        for i in (0, 7, 18):
            alone = tiny_tokenizer(ds.texts[i], return_tensors="pt")
            torch.testing.assert_close(logits[i], model(**alone).logits[0], atol=1e-5, rtol=1e-5)
    assert gather_labels(batches).tolist() == ds.labels


def test_evaluate_under_a_mask_equals_the_pruned_model(setup):
    model, _, batches = setup
    before = [p.clone() for p in model.parameters()]
    mask = HeadMask.from_pruned({0: [1, 2], 2: [0, 1, 2, 3]}, (3, 4))
    gated = evaluate(model, batches, mask)
    cut = evaluate(prune_model(model, mask), batches)
    for key in ("accuracy", "macro_f1", "mcc"):
        assert getattr(gated, key) == getattr(cut, key)
    assert gated.loss == pytest.approx(cut.loss, abs=1e-5)
    assert gated.loss != pytest.approx(evaluate(model, batches).loss, abs=1e-6)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bad_mask_leaves_the_model_intact(setup):
    model, _, batches = setup
    reference = evaluate(model, batches)
    with pytest.raises(MaskError, match="does not fit"):
        evaluate(model, batches, HeadMask.ones((2, 4)))
    assert evaluate(model, batches) == reference


def test_regression_metrics(tiny_tokenizer):
    model = tiny_model("bert", num_labels=1)
    targets = [float(i % 5) for i in range(12)]
    ds = TextDataset(texts=sentences(12, seed=6), labels=targets, task="regression")
    batches = make_batches(tiny_tokenizer, ds, batch_size=5)
    m = evaluate(model, batches)
    z = predict(model, batches)[:, 0].numpy()
    assert m.mse == pytest.approx(np.mean((z - np.array(targets)) ** 2), rel=1e-5) and m.loss == m.mse
    assert m.pearson == pytest.approx(np.corrcoef(z, targets)[0, 1], rel=1e-5)
    assert set(m.to_dict()) == {"n", "loss", "pearson", "spearman", "mse"}


def test_unlabelled_or_empty_batches(setup, tiny_tokenizer):
    model = setup[0]
    unlabelled = make_batches(tiny_tokenizer, TextDataset(texts=["good film"]))
    with pytest.raises(DataError, match="no labels"):
        evaluate(model, unlabelled)
    with pytest.raises(DataError, match="empty"):
        predict(model, [])


def test_progress_reaches_one(setup):
    model, _, batches = setup
    seen = []
    predict(model, batches, progress=lambda f, m: seen.append(f))
    assert seen[-1] == 1.0 and len(seen) == len(batches)
    assert isinstance(evaluate(model, batches), Metrics)


def test_demo_accuracy_on_held_out_sample(demo):
    from headprune.data import align_labels, load_data, split_calib_eval

    ds = align_labels(load_data("demo"), demo.id2label)
    _, evals = split_calib_eval(ds, 0, 200, seed=0)
    m = evaluate(demo.model, make_batches(demo.tokenizer, evals, 64, 64))
    assert m.n == 200 and m.accuracy > 0.75 and m.mcc > 0.4
