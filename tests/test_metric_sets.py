"""Paper metrics: binary F1 of the positive class, MCC, Pearson and Spearman against scikit-learn / scipy on random
predictions; metric sets and headlines per task and per GLUE name; `evaluate` prints every metric of the set."""

import json
import shutil

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn import metrics as sk

from headprune.cli import main
from headprune.evaluation.metrics import (
    MetricError,
    binary_f1,
    glue_task,
    headline,
    macro_f1,
    mcc,
    metric_set,
    metrics_from_logits,
    pearson,
    spearman,
)
from headprune.model.task import Task


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_equal_sklearn_on_random_predictions(seed):
    rng = np.random.default_rng(seed)
    y, y_hat = rng.integers(0, 2, 300), rng.integers(0, 2, 300)
    assert binary_f1(y, y_hat) == pytest.approx(sk.f1_score(y, y_hat))            # positive class = label 1
    assert binary_f1(y, y_hat) != pytest.approx(sk.f1_score(y, y_hat, pos_label=0))
    assert mcc(y, y_hat) == pytest.approx(sk.matthews_corrcoef(y, y_hat))
    assert macro_f1(y, y_hat) == pytest.approx(sk.f1_score(y, y_hat, average="macro"))
    y3, y3_hat = rng.integers(0, 3, 300), rng.integers(0, 3, 300)
    assert mcc(y3, y3_hat) == pytest.approx(sk.matthews_corrcoef(y3, y3_hat))
    assert macro_f1(y3, y3_hat) == pytest.approx(sk.f1_score(y3, y3_hat, average="macro"))


def test_binary_f1_degenerate_cases_follow_sklearn_zero_division():
    y, none = np.array([0, 0, 0]), np.array([0, 0, 0])
    assert binary_f1(y, none) == sk.f1_score(y, none, zero_division=0.0) == 0.0
    assert binary_f1(np.array([1, 1]), np.array([1, 1])) == 1.0


@pytest.mark.parametrize("seed", range(5))
def test_correlations_equal_scipy_on_random_predictions(seed):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=200), rng.normal(size=200)
    y_tied = np.round(y)            # ties: Spearman of average ranks, as scipy
    assert pearson(x, y) == pytest.approx(stats.pearsonr(x, y).statistic)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic)
    assert spearman(x, y_tied) == pytest.approx(stats.spearmanr(x, y_tied).statistic)


def test_metrics_from_logits_report_f1_for_two_classes_only():
    rng = np.random.default_rng(0)
    logits, y = torch.tensor(rng.normal(size=(100, 2))), torch.tensor(rng.integers(0, 2, 100))
    m = metrics_from_logits(logits, y)
    assert m.f1 == pytest.approx(sk.f1_score(y.numpy(), logits.argmax(-1).numpy()))
    assert "f1" in m.to_dict()
    three = metrics_from_logits(torch.tensor(rng.normal(size=(100, 3))), torch.tensor(rng.integers(0, 3, 100)))
    assert three.f1 is None and "f1" not in three.to_dict() and three.mcc is not None


@pytest.mark.parametrize("spec, task", [
    ("hf:glue:mrpc", "mrpc"), ("hf:nyu-mll/glue:qqp:validation", "qqp"), ("hf:glue:sst2", "sst2"),
    ("data/SST-2/dev.tsv", "sst2"), ("/tmp/glue/sts-b", "stsb"), ("hf:glue:stsb", "stsb"), ("cola_dev.tsv", "cola"),
    ("hf:glue:mnli:validation_matched", "mnli"), ("~/data/RTE", "rte"), ("demo", None), ("reviews.csv", None),
    ("hf:imdb", None), ("corolla.csv", None), (None, None)])
def test_glue_task_names_by_the_documented_rule(spec, task):
    assert glue_task(spec) == task


def test_metric_sets_and_headlines():
    cls, reg, lm = Task("classification"), Task("regression"), Task("lm")
    assert metric_set(cls) == ("accuracy", "f1", "macro_f1", "mcc")
    assert metric_set(cls, n_classes=3) == ("accuracy", "macro_f1", "mcc")
    assert metric_set(reg) == ("pearson", "spearman", "mse")
    assert metric_set(lm, "demo-lm") == ("loss", "perplexity", "next_token_accuracy")
    assert metric_set(cls, "hf:glue:mrpc") == ("f1", "accuracy") == metric_set(cls, "hf:nyu-mll/glue:qqp")
    assert metric_set(cls, "hf:glue:cola") == ("mcc",)
    assert metric_set(cls, "hf:glue:mnli") == ("accuracy",)
    assert metric_set(reg, "hf:glue:stsb") == ("pearson", "spearman")
    assert metric_set(cls, "hf:glue:stsb") == metric_set(cls)   # an STS-B spec on a classifier: its own set
    assert headline(cls, None, "hf:glue:cola") == "mcc"
    assert headline(cls, None, "hf:glue:mrpc") == "f1"
    assert headline(reg, None, "hf:glue:stsb") == "pearson"
    assert headline(cls, None, "hf:glue:sst2") == headline(cls) == "accuracy"
    assert headline(lm) == "perplexity"
    assert headline(cls, "mcc", "hf:glue:sst2") == "mcc"           # --metric wins
    with pytest.raises(MetricError, match="Accepted: accuracy, f1"):
        headline(cls, "perplexity")
    with pytest.raises(MetricError, match="macro_f1, mcc, loss"):
        headline(cls, "f1", n_classes=3)


def _run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_evaluate_prints_every_metric_of_the_set(tiny_model_dir, tiny_csv, tmp_path, capsys):
    rc, out, _ = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--eval-size", 40], capsys)
    assert rc == 0 and out["metric_set"] == ["accuracy", "f1", "macro_f1", "mcc"] and out["headline"] == "accuracy"
    assert set(out["metrics"]) == set(out["metric_set"]) and all(out[m] == out["metrics"][m] for m in out["metrics"])
    # the same rows in a folder named after MRPC: GLUE's set (f1, accuracy), F1 the headline; labels neg/pos -> 0/1
    glue = tmp_path / "mrpc"
    glue.mkdir()
    shutil.copy(tiny_csv, glue / "dev.csv")
    rc, mrpc, _ = _run(["evaluate", "--model", tiny_model_dir, "--data", glue / "dev.csv", "--eval-size", 40], capsys)
    assert rc == 0 and mrpc["metric_set"] == ["f1", "accuracy"] and mrpc["headline"] == "f1"
    assert mrpc["metrics"]["f1"] == pytest.approx(out["f1"])
    rc, chosen, _ = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--eval-size", 40,
                          "--metric", "mcc"], capsys)
    assert rc == 0 and chosen["headline"] == "mcc"


def test_a_bad_metric_is_refused(tiny_model_dir, tiny_csv, capsys):
    # a name no task reports: refused before the model loads (nothing on stderr before the error line)
    rc, _, err = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--metric", "bleu"], capsys)
    assert rc == 2 and err.startswith("error: --metric 'bleu' is unknown; accepted: accuracy")
    # a metric of another task: known once the model's head is (after loading)
    rc, _, err = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--metric", "perplexity"], capsys)
    assert rc == 2 and "error: --metric perplexity: not reported for a classification task" in err
