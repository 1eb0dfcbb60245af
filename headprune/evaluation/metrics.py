"""Predictions and metrics of a model (classifier, regression head or language model) under a HeadMask.

Classification metrics (y = true ids, ŷ = argmax of the logits, n examples, classes k):
    accuracy   = (1/n) Σ_i [ŷ_i = y_i]
    F1         = 2 TP / (2 TP + FP + FN) of the positive class (label 1), binary tasks only: GLUE's MRPC/QQP F1
                 (0 when the class is neither present nor predicted, as scikit-learn's zero_division default)
    macro-F1   = mean over classes present in y or ŷ of F1_k = 2 TP_k / (2 TP_k + FP_k + FN_k)
    MCC        = (c·s − Σ_k p_k t_k) / sqrt((s² − Σ_k p_k²)(s² − Σ_k t_k²))       (Gorodkin 2004, R_K)
                 with C the confusion matrix, c = trace C, s = n, t_k = true count, p_k = predicted count;
                 0 when a factor of the denominator is 0 (one class predicted or present). Binary: phi.
    loss       = mean cross-entropy −(1/n) Σ_i log softmax(z_i)[y_i]
Regression head (one output, STS-B style): Pearson r, Spearman ρ (Pearson of average ranks), and
    loss = MSE = (1/n) Σ_i (z_i − y_i)².
Language model (``headprune.task``, token-weighted over every real next-token target of every row):
    loss = Σ ℓ / Σ n_b (mean next-token cross-entropy), perplexity = exp(loss), next-token accuracy; lower
    perplexity is better.
Multiple choice (``headprune.model.task`` module doc, lm-evaluation-harness's definitions): each choice scored by
    the summed log-likelihood of its continuation tokens; acc = argmax of the sums, acc_norm = argmax of sum /
    len(choice) in characters, acc_bytes = sum / UTF-8 bytes, each with the standard error of the mean of the 0/1
    correctness (sample standard deviation / √Q); loss = mean −ll of the right choices; n = questions.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass
from functools import cache

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata

from ..data import model_inputs
from ..errors import DataError, HeadpruneError
from ..model.device import autocast, resolve_device
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from ..model.mask import HeadMask
from ..model.memory import plan_for, planned_batches
from ..model.task import (
    BYTES_KEY,
    CHARS_KEY,
    CHOICE_KEY,
    CHOICE_METRICS,
    GOLD_KEY,
    IGNORE_INDEX,
    Task,
    choice_metrics,
    lm_metrics,
    lm_row_stats,
    task_for,
)
from ..model.task import HIGHER_IS_BETTER as TASK_HIGHER_IS_BETTER


@dataclass
class Metrics:
    n: int
    loss: float
    accuracy: float | None = None
    f1: float | None = None            # binary classification: F1 of the positive class (label 1)
    macro_f1: float | None = None
    mcc: float | None = None
    pearson: float | None = None
    spearman: float | None = None
    mse: float | None = None
    perplexity: float | None = None
    next_token_accuracy: float | None = None
    tokens: int | None = None          # LM: next-token targets the loss averages over
    acc: float | None = None           # multiple choice (lm-eval's names): argmax of summed log-likelihoods
    acc_norm: float | None = None      # ... of log-likelihood / choice length in characters
    acc_bytes: float | None = None     # ... of log-likelihood / choice length in UTF-8 bytes
    acc_stderr: float | None = None
    acc_norm_stderr: float | None = None
    acc_bytes_stderr: float | None = None

    def to_dict(self) -> dict:
        """The metrics that apply to this task (classification, regression or language modelling)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# what each metric means for "better" (defined with the task kinds in headprune.task): the one place the
# dashboard, trajectories and summaries read it
HIGHER_IS_BETTER = TASK_HIGHER_IS_BETTER


def headline_metric(metrics: Metrics | dict) -> tuple[str, bool]:
    """The metric a summary leads with, and whether higher is better.

    Accuracy for a classifier, acc for multiple choice, Pearson r for a regression head (one output), perplexity
    for a language model (lower is better); a metrics dict with none of these falls back to the loss (lower is
    better).

    Parameters
    ----------
    metrics : ``Metrics`` or its ``to_dict()``.

    Returns
    -------
    (name, higher_is_better).
    """
    values = metrics.to_dict() if isinstance(metrics, Metrics) else metrics
    name = next((m for m in ("accuracy", "acc", "pearson", "perplexity") if values.get(m) is not None), "loss")
    return name, HIGHER_IS_BETTER[name]


class MetricError(HeadpruneError):
    """A metric name the task does not report (``--metric``)."""


# what each task kind reports (module doc); f1 only when the classifier has two classes
KIND_METRICS = {"classification": ("accuracy", "f1", "macro_f1", "mcc"),
                "regression": ("pearson", "spearman", "mse"),
                "lm": ("loss", "perplexity", "next_token_accuracy"),
                "multiple_choice": CHOICE_METRICS}
METRIC_NAMES = tuple(dict.fromkeys([m for names in KIND_METRICS.values() for m in names] + ["loss"]))
# GLUE's metrics per task, headline first (Wang et al. 2019, Table 1); module doc gives the naming rule
GLUE_METRICS = {"cola": ("mcc",), "sst2": ("accuracy",), "mrpc": ("f1", "accuracy"), "qqp": ("f1", "accuracy"),
                "stsb": ("pearson", "spearman"), "mnli": ("accuracy",), "qnli": ("accuracy",),
                "rte": ("accuracy",), "wnli": ("accuracy",)}


def glue_task(dataset_source: str | None) -> str | None:
    """The GLUE task a data spec names (module doc: its first word that is a GLUE task name), or None."""
    text = re.sub(r"(sst|sts)[-_ ]?(2|b)", r"\1\2", (dataset_source or "").lower())
    return next((word for word in re.split(r"[^a-z0-9]+", text) if word in GLUE_METRICS), None)


def metric_set(task: Task, dataset_source: str | None = None, *, n_classes: int | None = None) -> tuple[str, ...]:
    """The metrics every run on ``task`` reports (module doc), headline first for a GLUE task.

    ``dataset_source``: the data spec (a GLUE name gives GLUE's set); ``n_classes``: the classifier's outputs when
    known (f1 applies to two only). A GLUE set whose kind does not match the model's head (e.g. an STS-B spec on a
    classifier) is ignored: the kind's own set is reported.
    """
    own = tuple(m for m in KIND_METRICS[task.kind] if m != "f1" or n_classes in (None, 2))
    glue = GLUE_METRICS.get(glue_task(dataset_source) or "", ())
    return glue if glue and set(glue) <= set(own) else own


def headline(task: Task, metric: str | None = None, dataset_source: str | None = None, *,
             n_classes: int | None = None, extra: tuple[str, ...] = ()) -> str:
    """The metric tolerances, stopping rules and plots read: ``metric`` when given (it must be one the task
    reports: its set or its loss, or one of ``extra`` -- a trajectory's stability measures -- for a task that gives
    answers: a classifier or multiple choice), else GLUE's headline for a named GLUE task, else the task's own
    (``Task.headline``). Raises MetricError naming the accepted metrics."""
    reported = metric_set(task, dataset_source, n_classes=n_classes)
    if metric is None:
        return reported[0] if reported == GLUE_METRICS.get(glue_task(dataset_source) or "") else task.headline
    answered = task.kind in ("classification", "multiple_choice")
    accepted = tuple(dict.fromkeys(KIND_METRICS[task.kind] + ("loss",) + (extra if answered else ())))
    accepted = tuple(m for m in accepted if m != "f1" or n_classes in (None, 2))
    if metric not in accepted:
        raise MetricError(f"--metric {metric}: not reported for a {task.kind} task. Accepted: "
                          f"{', '.join(accepted)}.")
    return metric


def check_metric_name(metric: str | None, extra: tuple[str, ...] = ()) -> None:
    """Refuse, before any model loads, a ``--metric`` no task reports (MetricError listing every name; ``extra``:
    names this command reports besides, e.g. a trajectory's stability measures)."""
    if metric is not None and metric not in METRIC_NAMES + extra:
        raise MetricError(f"--metric '{metric}' is unknown; accepted: {', '.join(METRIC_NAMES + extra)}.")


def binary_f1(y_true: np.ndarray, y_pred: np.ndarray, positive: int = 1) -> float:
    """F1 of class ``positive``: 2 TP / (2 TP + FP + FN); 0 when that class is neither true nor predicted."""
    y_true, y_pred = np.asarray(y_true) == positive, np.asarray(y_pred) == positive
    tp = int(np.sum(y_true & y_pred))
    denominator = 2 * tp + int(np.sum(~y_true & y_pred)) + int(np.sum(y_true & ~y_pred))
    return 2 * tp / denominator if denominator else 0.0


# -- metrics on numpy arrays ------------------------------------------------------------------------------------

def accuracy(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    return float(np.mean(np.asarray(y_true) == np.asarray(y_pred)))


def confusion(y_true: np.ndarray, y_pred: np.ndarray) -> np.ndarray:
    """C[a, b] = number of examples of true class a predicted as b (classes 0..max id seen)."""
    y_true, y_pred = np.asarray(y_true, dtype=int), np.asarray(y_pred, dtype=int)
    k = int(max(y_true.max(), y_pred.max())) + 1
    matrix = np.zeros((k, k), dtype=np.int64)
    np.add.at(matrix, (y_true, y_pred), 1)
    return matrix


def macro_f1(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    c = confusion(y_true, y_pred)
    tp = np.diag(c)
    fp, fn = c.sum(axis=0) - tp, c.sum(axis=1) - tp
    seen = (c.sum(axis=0) + c.sum(axis=1)) > 0
    f1 = 2 * tp[seen] / (2 * tp[seen] + fp[seen] + fn[seen])
    return float(f1.mean())


def mcc(y_true: np.ndarray, y_pred: np.ndarray) -> float:
    c = confusion(y_true, y_pred).astype(np.float64)
    t, p, s = c.sum(axis=1), c.sum(axis=0), c.sum()
    denominator = np.sqrt((s**2 - p @ p) * (s**2 - t @ t))
    return float((np.trace(c) * s - p @ t) / denominator) if denominator > 0 else 0.0


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """r = Σ (x−x̄)(y−ȳ) / sqrt(Σ (x−x̄)² Σ (y−ȳ)²); NaN when either side is constant."""
    dx, dy = np.asarray(x, float) - np.mean(x), np.asarray(y, float) - np.mean(y)
    denominator = np.sqrt((dx @ dx) * (dy @ dy))
    return float(dx @ dy / denominator) if denominator > 0 else float("nan")


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return pearson(rankdata(x), rankdata(y))


# -- running the model --------------------------------------------------------------------------------------------

def _model_device(model) -> torch.device:
    return next(model.parameters()).device


def dataset_order(batches: list[dict]) -> torch.Tensor:
    """Permutation putting concatenated batch rows in dataset order (batch order when batches carry no index)."""
    if all("index" in b for b in batches):
        # read on the CPU: batches may live on a GPU (a caller moved them there), numpy cannot read those
        index = np.concatenate([torch.as_tensor(b["index"]).cpu().numpy().reshape(-1) for b in batches])
        return torch.as_tensor(np.argsort(index, kind="stable"))
    return torch.arange(sum(len(b["input_ids"]) for b in batches))


def scored_tail(batch: dict) -> int | None:
    """How many trailing positions of an LM ``batch`` have logits that score a label: every position from the one
    before the first labelled token on (the logits at t predict the token at t + 1). None when that is every
    position (plain text: labels from position 1) or the batch has no (B, T) labels. Multiple-choice rows label
    only their continuation, so the context's positions need no vocabulary-wide logits."""
    labels = batch.get("labels")
    if labels is None or labels.dim() != 2:
        return None
    labelled = labels != IGNORE_INDEX
    rows = labelled.any(-1)
    if not bool(rows.any()):
        return None
    first = int(labelled.int().argmax(-1)[rows].min())   # the earliest first labelled position over the rows
    keep = labels.shape[1] - max(first - 1, 0)
    return keep if keep < labels.shape[1] else None


@cache
def _takes_logits_to_keep(model_class: type) -> bool:
    """Whether a model class's forward takes ``logits_to_keep`` (asked once per class: this runs per batch)."""
    try:
        return "logits_to_keep" in inspect.signature(model_class.forward).parameters
    except (TypeError, ValueError):
        return False


def evaluation_inputs(model, batch: dict, device) -> dict:
    """The model inputs of ``batch`` on ``device`` for an evaluation pass; for an LM batch whose labels start late
    (multiple choice), ``logits_to_keep`` = ``scored_tail(batch)`` when the model's forward takes it: the output
    head then runs on those positions only (``lm_row_stats`` aligns the labels to the logits it gets). The head and
    its log-softmax over the vocabulary were ~28 % of a pass of the LM demo on its cloze set."""
    inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
    keep = scored_tail(batch)
    if keep is not None and _takes_logits_to_keep(type(model)):
        inputs["logits_to_keep"] = keep
    return inputs


def _batch_logits(model, batches: list[dict], mask: HeadMask | None, device, progress, memory_budget=None):
    """(batch, logits) per batch, logits as the model returns them (on its device), under ``mask``.

    Runs on ``device`` (moving the model there if it is elsewhere; default: where the model is), under
    ``mask`` via gate_heads, with bf16/fp16 autocast on GPU only. Batches are cut to the rows the memory planner
    allows under ``memory_budget`` (``headprune.model.memory``; the yielded batch is the piece run). ``progress``
    is called after every batch; an exception it raises (``errors.Cancelled``) stops the run.
    """
    if not batches:
        raise DataError("No batches to run: the evaluation set is empty.")
    dev = resolve_device(device) if device is not None else _model_device(model)
    if _model_device(model) != dev:
        model.to(dev)
    batches = planned_batches(batches, plan_for(model, memory_budget, dev), "forward")
    if mask is not None:  # gate a private copy: the caller's model may be shared with other threads
        model = structural_copy(model)
    with torch.no_grad(), gate_heads(model, mask), autocast(dev):
        for i, batch in enumerate(batches):
            yield batch, model(**evaluation_inputs(model, batch, dev)).logits
            if progress is not None:
                progress((i + 1) / len(batches), f"batch {i + 1}/{len(batches)}")


def predict(model, batches: list[dict], mask: HeadMask | None = None, device=None,
            progress=None, memory_budget=None) -> torch.Tensor:
    """Logits (n, num_labels), float32 on CPU, in dataset order (by each batch's ``index``); see
    ``_batch_logits`` for device, mask, autocast and memory."""
    logits = [z.float().cpu() for _, z in _batch_logits(model, batches, mask, device, progress, memory_budget)]
    return torch.cat(logits)[dataset_order(batches)]


def lm_stats(model, batches: list[dict], mask: HeadMask | None = None, device=None,
             progress=None, memory_budget=None) -> torch.Tensor:
    """(n, 3) per-row next-token sums [Σ ℓ, targets, correct] (``task.lm_row_stats``) in dataset order: what
    ``metrics_from_lm_stats`` needs, without holding any batch's (B, T, V) logits longer than its forward.
    The vocabulary-wide cross-entropy runs one row at a time."""
    stats = [torch.cat([lm_row_stats(z[r:r + 1], batch["labels"][r:r + 1].to(z.device)) for r in range(len(z))])
             for batch, z in _batch_logits(model, batches, mask, device, progress, memory_budget)]
    return torch.cat(stats)[dataset_order(batches)]


def metrics_from_lm_stats(stats: torch.Tensor) -> Metrics:
    """Token-weighted LM metrics (module doc) from ``lm_stats`` rows."""
    return Metrics(**lm_metrics(stats))


def choice_rows(batches: list[dict]) -> dict[str, np.ndarray]:
    """Per-row facts of multiple-choice ``batches`` in dataset order (the order ``lm_stats`` returns): question,
    choice, gold, chars, bytes, each (R,)."""
    order = dataset_order(batches).numpy()
    rows = {"question": np.asarray([q for b in batches for q in b["index"]])}
    for name, key in (("choice", CHOICE_KEY), ("gold", GOLD_KEY), ("chars", CHARS_KEY), ("bytes", BYTES_KEY)):
        rows[name] = torch.cat([b[key] for b in batches]).numpy()
    return {k: v[order] for k, v in rows.items()}


def metrics_from_choice_stats(stats: torch.Tensor, batches: list[dict]) -> Metrics:
    """Multiple-choice metrics (module doc) from ``lm_stats`` rows of ``batches`` (row log-likelihood = −Σ ℓ)."""
    rows = choice_rows(batches)
    return Metrics(**choice_metrics(-stats[:, 0].numpy(), rows["question"], rows["gold"], rows["chars"],
                                    rows["bytes"]))


def choice_predictions(stats: torch.Tensor, batches: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(picked, right), each (Q,) in question order: the choice with the highest summed log-likelihood (acc's pick,
    the first of tied maxima) of each question, and the right choice."""
    rows = choice_rows(batches)
    ll, q = -stats[:, 0].numpy(), rows["question"]
    cuts = np.flatnonzero(q[1:] != q[:-1]) + 1
    picked = np.asarray([int(np.argmax(part)) for part in np.split(ll, cuts)])
    right = np.asarray([int(np.flatnonzero(part)[0]) for part in np.split(rows["gold"], cuts)])
    return picked, right


def _require_labels(batches: list[dict]) -> None:
    if not batches:
        raise DataError("Evaluation needs at least one example, but the evaluation set is empty. Accepted: an "
                        "evaluation size of 1 or more (--eval-size N or all).")
    if any("labels" not in b for b in batches):
        raise DataError("These batches have no labels; evaluation needs a labelled dataset (--label-col), or "
                        "language-model data (--task lm) for a language model.")


def gather_labels(batches: list[dict]) -> torch.Tensor:
    """Labels of ``batches`` in dataset order (the order ``predict`` returns): (n,) for a classifier; (n, T) for
    language-model batches, each row right-padded with IGNORE_INDEX to the widest batch's T."""
    _require_labels(batches)
    labels = [b["labels"].cpu() for b in batches]   # metrics are computed on the CPU (numpy), wherever batches are
    if labels[0].dim() == 2:
        width = max(y.shape[1] for y in labels)
        labels = [F.pad(y, (0, width - y.shape[1]), value=IGNORE_INDEX) for y in labels]
    return torch.cat(labels)[dataset_order(batches)]


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> Metrics:
    logits, labels = logits.cpu(), labels.cpu()   # numpy below; a no-op for the CPU tensors most callers pass
    n = len(labels)
    if logits.shape[-1] == 1:
        z, y = logits[:, 0].double(), labels.double()
        mse = float(torch.mean((z - y) ** 2))
        return Metrics(n=n, loss=mse, pearson=pearson(z.numpy(), y.numpy()), spearman=spearman(z.numpy(), y.numpy()),
                       mse=mse)
    y = labels.long()
    y_hat = logits.argmax(-1).numpy()
    loss = float(F.cross_entropy(logits.double(), y))
    f1 = binary_f1(y.numpy(), y_hat) if logits.shape[-1] == 2 else None
    return Metrics(n=n, loss=loss, accuracy=accuracy(y.numpy(), y_hat), f1=f1, macro_f1=macro_f1(y.numpy(), y_hat),
                   mcc=mcc(y.numpy(), y_hat))


def evaluate(model, batches: list[dict], mask: HeadMask | None = None, device=None, progress=None,
             task: Task | None = None, memory_budget: int | str | None = None) -> Metrics:
    """Metrics of ``model`` (gated by ``mask``) on labelled ``batches`` (LM batches: labels = input ids); see the
    module doc for the equations. ``task`` defaults to the one the data and the model's head make
    (``task.task_for``: multiple choice for (question, choice) batches).
    ``memory_budget``: bytes beyond the weights a batch may hold (``headprune.model.memory``; default: a share of
    the free memory); batches are cut to fit it."""
    _require_labels(batches)
    task = task or task_for(model, batches)
    if task.is_choice:
        return metrics_from_choice_stats(lm_stats(model, batches, mask, device, progress, memory_budget), batches)
    if task.is_lm:
        return metrics_from_lm_stats(lm_stats(model, batches, mask, device, progress, memory_budget))
    labels = gather_labels(batches)
    return metrics_from_logits(predict(model, batches, mask, device, progress, memory_budget), labels)
