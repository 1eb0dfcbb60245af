"""Workspace: one model with its data, calibration/evaluation splits, batches and metrics as loaded.

The CLI (``headprune.cli.common.load_model_and_data``) and the dashboard (``dashboard.store``) both build a
:class:`Workspace`, so they split, shrink and batch the data by one rule.

Split sizes
-----------
A size the user did not choose is a :class:`DefaultSize` and shrinks to fit small data: calibration takes at most
half the rows, evaluation at most what calibration leaves. A size the user chose is kept exactly, and a size that
does not fit is a :class:`~headprune.errors.DataError` naming the sizes that would (never a negative split).

Sharing
-------
A workspace is shared read-only between callers (the dashboard's browser sessions). The loaded model is never
gated, hooked or mutated: the library's computations (a ScoringContext, evaluation under a mask, attention
capture, a LiveEvaluator) each take their own structural copy (``headprune.model.hooks.structural_copy``: new
module objects over the same weight tensors, no hooks) and gate that.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .data import (
    TextDataset,
    align_labels,
    calibration_texts,
    is_choice_data,
    load_data,
    make_batches,
    split_calib_eval,
)
from .errors import DataError
from .evaluation.metrics import Metrics, evaluate, headline_metric
from .model.loading import LoadedModel, load_model
from .model.mask import HeadMask
from .model.task import Task, TaskError, is_language_model, task_of
from .scoring import ScoringContext

Progress = Callable[[float, str], None]

DEFAULT_CALIB_SIZE = 128
DEFAULT_EVAL_SIZE = 500


class DefaultSize(int):
    """A split size the user did not choose: shrunk to fit a small dataset instead of rejected."""

    def __repr__(self) -> str:
        return f"DefaultSize({int(self)})"


def fit_split_sizes(n_rows: int, calib_size: int, eval_size: int | None) -> tuple[int, int | None]:
    """The (calibration, evaluation) sizes to split ``n_rows`` rows into.

    Parameters
    ----------
    n_rows : rows in the dataset.
    calib_size : calibration examples; a :class:`DefaultSize` shrinks to ``n_rows // 2`` and to what a chosen
        evaluation size leaves.
    eval_size : evaluation examples, None for every row calibration leaves; a :class:`DefaultSize` shrinks to
        ``n_rows - calibration``.

    Returns
    -------
    (calibration size, evaluation size or None), summing to at most ``n_rows``.

    Raises
    ------
    DataError when a chosen size is negative or the chosen sizes do not fit ``n_rows``.
    """
    for name, size in (("calibration", calib_size), ("evaluation", eval_size)):
        if size is not None and size < 0:
            raise DataError(f"The {name} size must be 0 or more; got {size}.")
    if n_rows == 0:
        raise DataError("The data has no rows: nothing to split into calibration and evaluation examples.")
    calib = int(calib_size)
    if isinstance(calib_size, DefaultSize):
        chosen_eval = eval_size is not None and not isinstance(eval_size, DefaultSize)
        calib = min(calib, n_rows // 2, max(n_rows - eval_size, 0) if chosen_eval else n_rows)
    if calib > n_rows:
        raise DataError(f"Calibration size {calib} does not fit: the data has only {n_rows} rows. Choose at most "
                        f"{n_rows - 1} (one row is left for evaluation), or leave the default, which shrinks to "
                        f"{n_rows // 2} here.")
    left = n_rows - calib
    if eval_size is None:
        return calib, None
    evals = min(eval_size, left) if isinstance(eval_size, DefaultSize) else int(eval_size)
    if evals > left:
        raise DataError(f"Asked for {calib} calibration + {evals} evaluation examples, but the data has only "
                        f"{n_rows} rows. Choose sizes that sum to at most {n_rows} (evaluation at most {left} "
                        f"with this calibration size), or leave the defaults, which shrink to fit.")
    return calib, evals


@dataclass
class Workspace:
    """A loaded model, its data and the calibration/evaluation batches (read-only once built).

    Build with :meth:`build`. ``dense`` here always means *the model as loaded*: for a model written by
    ``headprune prune`` the heads cut out of its weights are already gone (see :attr:`cut_mask`).
    """

    loaded: LoadedModel
    dataset: TextDataset
    calib: TextDataset
    eval: TextDataset
    calib_batches: list[dict]
    eval_batches: list[dict]
    seed: int = 0
    max_length: int = 128
    task: Task = Task("classification")   # what the model's head computes (headprune.task.task_of)
    _dense: Metrics | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(cls, model: str, data: str, *, text_col: str | None = None, pair_col: str | None = None,
              label_col: str | None = None, calib_size: int = DefaultSize(DEFAULT_CALIB_SIZE),
              eval_size: int | None = DefaultSize(DEFAULT_EVAL_SIZE), max_length: int = 128, batch_size: int = 32,
              seed: int = 0, device: str = "auto", loaded: LoadedModel | None = None,
              progress: Progress | None = None, device_map: str | dict | None = None,
              dtype: str | None = None, task: str | None = None, context_col: str | None = None,
              choices_col: str | None = None, answer_col: str | None = None) -> Workspace:
        """Load ``model`` and ``data``, split and batch them.

        Parameters
        ----------
        model, data : specs as ``headprune.models.load_model`` / ``headprune.data.load_data`` take them.
        text_col, pair_col, label_col : column names (None: auto-detect).
        calib_size, eval_size : split sizes (see :func:`fit_split_sizes`; eval None = every row left).
        max_length, batch_size : tokenization.
        seed : seed of the split.
        device : "auto" | "cpu" | "cuda" (ignored when ``loaded`` is given).
        device_map, dtype : placement through accelerate and weight dtype (``headprune.models.load_model``).
        loaded : an already loaded model (the dashboard's process-wide cache); loaded from ``model`` if None.
        progress : ``(fraction, message)`` callback.
        task : "lm" | "classification" | None (detected from the model's head); a task the head cannot compute is
            a ``headprune.task.TaskError``. Language-model data needs no label column.
        context_col, choices_col, answer_col : columns of multiple-choice data (``headprune.data.choice``; None:
            a field map's). Multiple-choice data (named, or columns that fit a field map) is read and checked
            BEFORE the model loads, and makes the task "multiple_choice" (the model must be a causal LM).

        Returns
        -------
        The workspace. Metrics of the model as loaded are computed on first use (:meth:`dense`).
        """
        report = progress or (lambda f, m: None)
        choice = None
        if is_choice_data(data, context_col, choices_col, answer_col):  # bad rows refused before the model loads
            choice = load_data(data, context_col=context_col, choices_col=choices_col, answer_col=answer_col)
        if loaded is None:
            report(0.05, f"loading model {model}")
            loaded = load_model(model, device, device_map=device_map, dtype=dtype)
        kind = task_of(loaded.model, task)
        report(0.5, "reading data")
        if choice is not None:
            if not is_language_model(loaded.model):
                raise TaskError(f"{data} is multiple-choice data, scored by a causal language model's log-likelihood "
                                f"of each choice, but {model} is a classifier. Load a *ForCausalLM model.")
            kind, dataset = Task("multiple_choice"), choice
        else:
            dataset = align_labels(load_data(data, text_col, pair_col, label_col,
                                             task="lm" if kind.is_lm else "classification"), loaded.id2label)
        calib_n, eval_n = fit_split_sizes(len(dataset), calib_size, eval_size)
        calib, evals = split_calib_eval(dataset, calib_n, eval_n, seed)
        report(0.8, "tokenizing")
        calib_batches, eval_batches = (make_batches(loaded.tokenizer, part, batch_size, max_length) if len(part)
                                       else [] for part in (calib, evals))
        report(1.0, "ready")
        return cls(loaded, dataset, calib, evals, calib_batches, eval_batches, seed=seed, max_length=max_length,
                   task=kind)

    # -- the model ----------------------------------------------------------------------------------------
    @property
    def adapter(self):
        return self.loaded.adapter

    @property
    def shape(self) -> tuple[int, int]:
        return self.adapter.grid_shape

    @property
    def tied(self) -> bool:
        return self.adapter.tied

    @property
    def n_units(self) -> int:
        """Heads in the grid, cut ones included (the denominator of every "heads left" count)."""
        return self.shape[0] * self.shape[1]

    @property
    def cut_mask(self) -> HeadMask:
        """0 for heads already cut out of the loaded weights (a model saved by ``prune``), 1 elsewhere."""
        return HeadMask(self.adapter.live_grid().to(torch.float32))

    @property
    def n_cut(self) -> int:
        return self.cut_mask.n_pruned

    # -- data ---------------------------------------------------------------------------------------------
    def calib_texts(self) -> list:
        """Raw calibration texts (pairs as tuples), in batch order."""
        return calibration_texts(self.calib, self.calib_batches)

    def scoring_context(self, mask: HeadMask | None, progress: Progress | None = None,
                        memory_budget: int | str | None = None):
        """A ``ScoringContext`` (which takes its own private copy of the model) on the calibration batches;
        ``memory_budget`` as ``headprune.model.memory.resolve_budget`` reads it (None: a share of free memory)."""
        if not self.calib_batches:
            raise DataError("Scoring needs calibration examples: choose a calibration size of at least 1.")
        return ScoringContext(self.loaded.model, self.calib_batches, mask, self.loaded.device,
                              self.loaded.tokenizer, self.calib_texts(), seed=self.seed, progress=progress,
                              memory_budget=memory_budget)

    # -- metrics of the model as loaded --------------------------------------------------------------------
    def dense(self, progress: Progress | None = None) -> Metrics:
        """Metrics of the model as loaded on the evaluation split (computed once, then shared)."""
        with self._lock:
            if self._dense is None:
                if not self.eval_batches:
                    raise DataError("The evaluation split is empty: choose an evaluation size of at least 1.")
                self._dense = evaluate(self.loaded.model, self.eval_batches, progress=progress, task=self.task)
            return self._dense

    @property
    def metric(self) -> str:
        """Name of the headline metric (``evaluate.headline_metric``)."""
        return headline_metric(self.dense())[0]

    @property
    def higher_is_better(self) -> bool:
        return headline_metric(self.dense())[1]

    def metric_of(self, metrics: Metrics | dict) -> float:
        """The headline metric's value in ``metrics``."""
        values = metrics if isinstance(metrics, dict) else metrics.to_dict()
        return float(values[self.metric])

    def info(self) -> dict:
        """JSON-ready facts: model, arch, grid, heads cut in the weights, data columns, task, sizes, seed, device."""
        return {"model": self.loaded.spec, "model_source": self.loaded.source, "arch": self.adapter.arch,
                "grid": list(self.shape), "cut_heads": self.n_cut, "data": self.dataset.source,
                "columns": self.dataset.columns, "task": self.dataset.task, "calib_size": len(self.calib),
                "eval_size": len(self.eval), "seed": self.seed, "device": str(self.loaded.device)}
