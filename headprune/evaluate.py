"""Predictions and metrics of a classifier under a HeadMask.

Classification metrics (y = true ids, ŷ = argmax of the logits, n examples, classes k):
    accuracy   = (1/n) Σ_i [ŷ_i = y_i]
    macro-F1   = mean over classes present in y or ŷ of F1_k = 2 TP_k / (2 TP_k + FP_k + FN_k)
    MCC        = (c·s − Σ_k p_k t_k) / sqrt((s² − Σ_k p_k²)(s² − Σ_k t_k²))       (Gorodkin 2004, R_K)
                 with C the confusion matrix, c = trace C, s = n, t_k = true count, p_k = predicted count;
                 0 when a factor of the denominator is 0 (one class predicted or present). Binary: phi.
    loss       = mean cross-entropy −(1/n) Σ_i log softmax(z_i)[y_i]
Regression head (one output, STS-B style): Pearson r, Spearman ρ (Pearson of average ranks), and
    loss = MSE = (1/n) Σ_i (z_i − y_i)².
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import rankdata

from .data import model_inputs
from .device import autocast, resolve_device
from .errors import DataError
from .gating import gate_heads
from .mask import HeadMask


@dataclass
class Metrics:
    n: int
    loss: float
    accuracy: float | None = None
    macro_f1: float | None = None
    mcc: float | None = None
    pearson: float | None = None
    spearman: float | None = None
    mse: float | None = None

    def to_dict(self) -> dict:
        """The metrics that apply to this task (classification or regression)."""
        return {k: v for k, v in asdict(self).items() if v is not None}


# what each metric means for "better": the one place the dashboard, trajectories and summaries read it
HIGHER_IS_BETTER = {"accuracy": True, "macro_f1": True, "mcc": True, "pearson": True, "spearman": True,
                    "loss": False, "mse": False}


def headline_metric(metrics: Metrics | dict) -> tuple[str, bool]:
    """The metric a summary leads with, and whether higher is better.

    Accuracy for a classifier, Pearson r for a regression head (one output); a metrics dict with neither falls
    back to the loss (lower is better).

    Parameters
    ----------
    metrics : ``Metrics`` or its ``to_dict()``.

    Returns
    -------
    (name, higher_is_better).
    """
    values = metrics.to_dict() if isinstance(metrics, Metrics) else metrics
    name = next((m for m in ("accuracy", "pearson") if values.get(m) is not None), "loss")
    return name, HIGHER_IS_BETTER[name]


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


def _dataset_order(batches: list[dict]) -> torch.Tensor:
    """Permutation putting concatenated batch rows in dataset order (batch order when batches carry no index)."""
    if all("index" in b for b in batches):
        return torch.as_tensor(np.argsort([i for b in batches for i in b["index"]], kind="stable"))
    return torch.arange(sum(len(b["input_ids"]) for b in batches))


@torch.no_grad()
def predict(model, batches: list[dict], mask: HeadMask | None = None, device=None,
            progress=None) -> torch.Tensor:
    """Logits (n, num_labels), float32 on CPU, in dataset order (by each batch's ``index``).

    Runs on ``device`` (moving the model there if it is elsewhere; default: where the model is), under
    ``mask`` via gate_heads, with bf16/fp16 autocast on GPU only.
    """
    if not batches:
        raise DataError("No batches to run: the evaluation set is empty.")
    dev = resolve_device(device) if device is not None else _model_device(model)
    if _model_device(model) != dev:
        model.to(dev)
    logits = []
    with gate_heads(model, mask), autocast(dev):
        for i, batch in enumerate(batches):
            inputs = {k: v.to(dev) for k, v in model_inputs(batch).items()}
            logits.append(model(**inputs).logits.float().cpu())
            if progress is not None:
                progress((i + 1) / len(batches), f"batch {i + 1}/{len(batches)}")
    return torch.cat(logits)[_dataset_order(batches)]


def gather_labels(batches: list[dict]) -> torch.Tensor:
    """Labels of ``batches`` in dataset order (the order ``predict`` returns)."""
    if any("labels" not in b for b in batches):
        raise DataError("These batches have no labels; evaluation needs a labelled dataset (--label-col).")
    return torch.cat([b["labels"] for b in batches])[_dataset_order(batches)]


def metrics_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> Metrics:
    n = len(labels)
    if logits.shape[-1] == 1:
        z, y = logits[:, 0].double(), labels.double()
        mse = float(torch.mean((z - y) ** 2))
        return Metrics(n=n, loss=mse, pearson=pearson(z.numpy(), y.numpy()), spearman=spearman(z.numpy(), y.numpy()),
                       mse=mse)
    y = labels.long()
    y_hat = logits.argmax(-1).numpy()
    loss = float(F.cross_entropy(logits.double(), y))
    return Metrics(n=n, loss=loss, accuracy=accuracy(y.numpy(), y_hat), macro_f1=macro_f1(y.numpy(), y_hat),
                   mcc=mcc(y.numpy(), y_hat))


def evaluate(model, batches: list[dict], mask: HeadMask | None = None, device=None, progress=None) -> Metrics:
    """Metrics of ``model`` (gated by ``mask``) on labelled ``batches``; see the module doc for the equations."""
    labels = gather_labels(batches)
    return metrics_from_logits(predict(model, batches, mask, device, progress), labels)
