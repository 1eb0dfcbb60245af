"""Workspace: one model with its data roles (calibration, selection, evaluation), batches and metrics as loaded.

The CLI (``headprune.cli.common.load_model_and_data``) and the dashboard (``dashboard.store``) both build a
:class:`Workspace`, so they split, shrink and batch the data by one rule.

Data roles
----------
``calib`` is what criteria score heads on, ``select`` where choices are made (HIES's α, SAP's k and candidate
filtering: never the evaluation rows), ``eval`` what is reported. Each role reads ``calib_data`` /
``select_data`` / ``eval_data``, or ``data`` when not given. Roles that read the same source are disjoint subsets
of one seeded permutation of it: evaluation takes its first rows, calibration the next, selection the next
(so adding a selection subset never moves the other two, and one ``data`` splits exactly as before). Roles read
from different sources are compared by content hash of the rows used (``data.row_hashes``): shared rows are a
DataError unless ``allow_overlap``. ``Workspace.roles()`` records each role's source, split, size, seed and the
content hash of its rows.

Split sizes
-----------
A size the user did not choose is a :class:`DefaultSize` and shrinks to fit small data: calibration takes at most
half the rows, evaluation at most what calibration leaves, selection at most what both leave (0 when nothing is
left: choices are then made on the calibration rows, as before roles existed). A role alone on its source takes
at most all of it. A size the user chose is kept exactly, and a size that does not fit is a
:class:`~headprune.errors.DataError` naming the sizes that would (never a negative split).

Sharing
-------
A workspace is shared read-only between callers (the dashboard's browser sessions). The loaded model is never
gated, hooked or mutated: the library's computations (a ScoringContext, evaluation under a mask, attention
capture, a LiveEvaluator) each take their own structural copy (``headprune.model.hooks.structural_copy``: new
module objects over the same weight tensors, no hooks) and gate that.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from .data import (
    ROLES,
    TextDataset,
    align_labels,
    calibration_texts,
    data_role,
    is_choice_data,
    label_note,
    load_data,
    make_batches,
    parse_hf_spec,
    redraw_calibration,
    row_hashes,
)
from .errors import DataError
from .evaluation.metrics import HIGHER_IS_BETTER, Metrics, evaluate, headline, metric_set
from .model.loading import LoadedModel, check_head, is_lm_config, load_model, peek_config
from .model.mask import HeadMask
from .model.task import Task, TaskError, is_language_model, task_of
from .scoring import ScoringContext

Progress = Callable[[float, str], None]

DEFAULT_CALIB_SIZE = 128
DEFAULT_EVAL_SIZE = 500
DEFAULT_SELECT_SIZE = 128
ROLE_ORDER = ("eval", "calib", "select")   # the order roles sharing a source take rows from its permutation


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


def fit_role_sizes(n_rows: int, sizes: dict[str, int | None]) -> dict[str, int]:
    """How many rows each role reading one source of ``n_rows`` rows takes.

    ``sizes`` holds the roles that read this source ("calib", "select", "eval") with their sizes as given (None
    for evaluation: every row left). Calibration and evaluation together follow :func:`fit_split_sizes`; a role
    alone on its source takes its size, a :class:`DefaultSize` shrinking to the rows there. A chosen selection
    size is set aside first; a default one takes what the others leave (possibly 0). Raises DataError when a
    chosen size does not fit, naming the sizes that would.
    """
    select = sizes.get("select")
    if select is not None and select < 0:
        raise DataError(f"The selection size must be 0 or more; got {select}.")
    chosen_select = select is not None and not isinstance(select, DefaultSize)
    if chosen_select and select > n_rows:
        raise DataError(f"Selection size {select} does not fit: its data has only {n_rows} rows. Choose at most "
                        f"{n_rows}, or leave the default, which shrinks to what the other roles leave.")
    room = n_rows - (int(select) if chosen_select else 0)   # a chosen selection size is set aside first
    out: dict[str, int] = {}
    if "calib" in sizes and "eval" in sizes:
        try:
            calib, evals = fit_split_sizes(room, sizes["calib"], sizes["eval"])
        except DataError as exc:
            if not chosen_select:
                raise
            raise DataError(f"{exc} (These are the rows left of {n_rows} after the {select} selection examples "
                            "are set aside.)") from None
        out = {"calib": calib, "eval": max(room, 0) - calib if evals is None else evals}
    else:
        for role in ("calib", "eval"):
            if role in sizes:
                size = sizes[role]
                if n_rows == 0:
                    raise DataError("The data has no rows: nothing to draw the "
                                    f"{ROLES[role]} examples from.")
                if size is not None and size < 0:
                    raise DataError(f"The {ROLES[role]} size must be 0 or more; got {size}.")
                if size is not None and not isinstance(size, DefaultSize) and size > room:
                    aside = f" left of {n_rows} after the {select} selection examples" if chosen_select else ""
                    raise DataError(f"{ROLES[role].capitalize()} size {size} does not fit: its data has only {room} "
                                    f"rows{aside}. Choose at most that, or leave the default, which shrinks to fit.")
                out[role] = room if size is None else min(int(size), room)
    if "select" in sizes:   # a chosen size was set aside above; a default takes at most what is left
        out["select"] = int(select) if chosen_select else min(int(select or 0), n_rows - sum(out.values()))
    return out


def split_roles(ds: TextDataset, sizes: dict[str, int], seed: int) -> dict[str, TextDataset]:
    """Disjoint seeded subsets of ``ds``, one per role in ``sizes`` (fitted sizes), from one permutation: the
    roles take consecutive rows in ``ROLE_ORDER`` (evaluation first, as ``data.split_calib_eval`` does)."""
    order = np.random.default_rng(seed).permutation(len(ds))
    parts, start = {}, 0
    for role in ROLE_ORDER:
        if role in sizes:
            parts[role] = ds.subset(order[start:start + sizes[role]])
            start += sizes[role]
    return parts


def check_overlap(parts: dict[str, TextDataset], sources: dict[str, str], allow: bool = False) -> None:
    """Refuse roles read from different sources that share rows (same text, pair and label), unless ``allow``.

    Roles read from one source are disjoint by construction (one permutation), so only roles whose source specs
    differ are compared, on the rows each one uses.
    """
    if allow:
        return
    hashes = {role: set(row_hashes(part)) for role, part in parts.items() if len(part)}
    roles = [r for r in ROLE_ORDER if r in hashes]
    for i, a in enumerate(roles):
        for b in roles[i + 1:]:
            shared = hashes[a] & hashes[b] if sources[a] != sources[b] else set()
            if shared:
                raise DataError(f"The {ROLES[a]} rows ({sources[a]}) and the {ROLES[b]} rows ({sources[b]}) share "
                                f"{len(shared)} row(s) (same text and label, by content hash): "
                                f"{ROLES[b]} on rows the {ROLES[a]} also uses is not held-out. Use disjoint "
                                "sources (e.g. a named split: hf:NAME:CONFIG:SPLIT, demo:train), or pass "
                                "--allow-overlap (allow_overlap=True) to go on anyway.")


@dataclass
class Workspace:
    """A loaded model, its data and the calibration/evaluation batches (read-only once built).

    Build with :meth:`build`. ``dense`` here always means *the model as loaded*: for a model written by
    ``headprune prune`` the heads cut out of its weights are already gone (see :attr:`cut_mask`).
    """

    loaded: LoadedModel
    dataset: TextDataset                  # the evaluation role's source, labels aligned (every row)
    calib: TextDataset
    eval: TextDataset
    calib_batches: list[dict]
    eval_batches: list[dict]
    seed: int = 0
    max_length: int = 128
    task: Task = Task("classification")   # what the model's head computes (headprune.task.task_of)
    batch_size: int = 32
    select: TextDataset | None = None     # where choices are made (HIES α, SAP k / CF); empty: none carved
    select_batches: list[dict] = field(default_factory=list)
    sources: dict = field(default_factory=dict)   # role -> data spec it was read from
    source_data: dict = field(default_factory=dict, repr=False)   # data spec -> its rows, aligned (repeats redraw)
    notes: list[str] = field(default_factory=list)  # what was chosen for the user: splits, label mappings
    eval_note: str = ""   # why evaluation uses fewer rows or smaller batches than asked (``with_eval_rows``)
    _dense: Metrics | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def build(cls, model: str, data: str, *, calib_data: str | None = None, select_data: str | None = None,
              eval_data: str | None = None, text_col: str | None = None, pair_col: str | None = None,
              label_col: str | None = None, calib_size: int = DefaultSize(DEFAULT_CALIB_SIZE),
              eval_size: int | None = DefaultSize(DEFAULT_EVAL_SIZE),
              select_size: int = DefaultSize(DEFAULT_SELECT_SIZE), label_map: dict | None = None,
              labels_by_position: bool = False, allow_untrained_head: bool = False, allow_overlap: bool = False,
              max_length: int = 128, batch_size: int = 32, seed: int = 0, device: str = "auto",
              loaded: LoadedModel | None = None, progress: Progress | None = None,
              device_map: str | dict | None = None, dtype: str | None = None, task: str | None = None,
              context_col: str | None = None, choices_col: str | None = None,
              answer_col: str | None = None) -> Workspace:
        """Load ``model`` and the data of each role, split and batch them.

        Parameters
        ----------
        model, data : specs as ``headprune.models.load_model`` / ``headprune.data.load_data`` take them.
        calib_data, select_data, eval_data : the source of each role (any data spec); None: ``data``. Roles with
            one source are disjoint subsets of it (module doc); roles whose rows overlap across sources are a
            DataError unless ``allow_overlap``.
        text_col, pair_col, label_col : column names (None: auto-detect), for every source.
        calib_size, eval_size, select_size : role sizes (see :func:`fit_role_sizes`; eval None = every row left).
        label_map, labels_by_position : how labels the model's names do not match are mapped
            (``data.align_labels``).
        allow_untrained_head : go on with a task head initialised on load (else UntrainedHeadError).
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
        wanted = {"eval": eval_size, "calib": calib_size, "select": select_size}
        # a role is read only when it takes rows (a size of 0 reads nothing, so it cannot be refused for rows it
        # never uses); evaluation's source is always read: it is the workspace's dataset
        sources = {role: spec for role, spec in
                   (("eval", eval_data or data), ("calib", calib_data or data), ("select", select_data or data))
                   if role == "eval" or wanted[role] is None or int(wanted[role]) > 0}
        # multiple-choice data is read and checked BEFORE the model loads (a bad row costs no loading); a run's
        # roles are all multiple choice or none (a question set cannot calibrate a classifier, nor text a question)
        choices = {spec: load_data(spec, context_col=context_col, choices_col=choices_col, answer_col=answer_col)
                   for spec in dict.fromkeys(sources.values())
                   if is_choice_data(spec, context_col, choices_col, answer_col)}
        if choices and len(choices) < len(set(sources.values())):
            mixed = ", ".join(f"{role} {spec}" for role, spec in sources.items() if spec not in choices)
            raise DataError(f"Some data roles are multiple-choice data ({', '.join(choices)}) and some are not "
                            f"({mixed}). Accepted: every role multiple choice, or none.")
        columns = {"text_col": text_col, "pair_col": pair_col, "label_col": label_col}
        # the other roles are read, split and compared BEFORE the weights load too, when the config says which
        # task the rows are for (rows shared by two sources cost no loading); the check runs again on aligned rows
        hint = None if choices else _task_hint(model, task, loaded)
        raw = _read_roles(sources, wanted, columns, hint, seed, allow_overlap) if hint else {}
        if loaded is None:
            report(0.05, f"loading model {model}")
            loaded = load_model(model, device, device_map=device_map, dtype=dtype)
        check_head(loaded, allow_untrained_head)
        kind = task_of(loaded.model, task)
        report(0.5, "reading data")
        if choices:
            if not is_language_model(loaded.model):
                raise TaskError(f"{data} is multiple-choice data, scored by a causal language model's log-likelihood "
                                f"of each choice, but {model} is a classifier. Load a *ForCausalLM model.")
            kind = Task("multiple_choice")
        parts: dict[str, TextDataset] = {}
        datasets: dict[str, TextDataset] = {}
        notes: list[str] = []
        for spec in dict.fromkeys(sources[r] for r in ROLE_ORDER if r in sources):
            roles = [r for r in ROLE_ORDER if sources.get(r) == spec]
            if spec in choices:
                ds = choices[spec]
            else:
                read_as = "lm" if kind.is_lm else "classification"
                rows = raw[spec] if hint == read_as else \
                    load_data(spec, **columns, task=read_as, role=_deciding_role(roles, wanted))
                ds = align_labels(rows, loaded.id2label, label_map=label_map, by_position=labels_by_position)
                if ds.task == "multiple_choice":   # hf: data whose columns fit a field map, read as the LM's data
                    kind = Task("multiple_choice")
            datasets[spec] = ds
            notes += [n for n in (_split_note(spec, ds, _deciding_roles(roles, wanted)), label_note(ds)) if n]
            parts.update(split_roles(ds, fit_role_sizes(len(ds), {r: wanted[r] for r in roles}), seed))
        for role in ROLE_ORDER:   # a role that reads nothing: empty, and recorded without a source
            parts.setdefault(role, TextDataset([], task=parts["eval"].task))
        check_overlap(parts, sources, allow_overlap)
        report(0.8, "tokenizing")
        batches = {role: make_batches(loaded.tokenizer, part, batch_size, max_length) if len(part) else []
                   for role, part in parts.items()}
        report(1.0, "ready")
        return cls(loaded, datasets[sources["eval"]], parts["calib"], parts["eval"], batches["calib"],
                   batches["eval"], seed=seed, max_length=max_length, task=kind, batch_size=batch_size,
                   select=parts["select"], select_batches=batches["select"], sources=sources, source_data=datasets,
                   notes=notes)

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
                              memory_budget=memory_budget, select=self.select_batches or None)

    def calibration_draw(self, repeat: int) -> tuple[TextDataset, list[dict]]:
        """Repeat ``repeat``'s calibration rows and batches: repeat 0 is this workspace's own calibration set;
        others are re-drawn, of the same size, from the calibration source's rows that evaluation does not read
        (``data.redraw_calibration``), so every repeat is judged on the same evaluation rows. The selection rows
        stay as they are; a later repeat may calibrate on some of them (a choice made on rows the criterion also
        saw, never on evaluation rows), since a default selection set takes every row the others leave."""
        if repeat == 0:
            return self.calib, self.calib_batches
        spec = self.sources["calib"]
        source = self.source_data[spec]
        taken = set(row_hashes(self.eval)) if self.sources.get("eval") == spec else set()
        exclude = [i for i, h in enumerate(row_hashes(source)) if h in taken]
        calib = redraw_calibration(source, len(self.calib), self.seed, repeat, exclude)
        return calib, make_batches(self.loaded.tokenizer, calib, self.batch_size, self.max_length)

    def with_eval_rows(self, rows: int, batch_rows: int, note: str = "") -> Workspace:
        """This workspace evaluating on the first ``rows`` rows of its evaluation split (a seeded random draw
        already: the split is a slice of one permutation), batched ``batch_rows`` a batch; the calibration and
        selection rows are unchanged, the metrics of the model as loaded are computed anew on those rows.
        ``note`` joins :attr:`notes` (what was chosen and why)."""
        if rows >= len(self.eval) and batch_rows >= self.batch_size:
            return self
        part = self.eval.subset(range(min(rows, len(self.eval))))
        batches = make_batches(self.loaded.tokenizer, part, batch_rows, self.max_length) if len(part) else []
        return dataclasses.replace(self, eval=part, eval_batches=batches, notes=self.notes + ([note] if note else []),
                                   eval_note=note, _dense=None, _lock=threading.Lock())

    # -- metrics of the model as loaded --------------------------------------------------------------------
    def dense(self, progress: Progress | None = None) -> Metrics:
        """Metrics of the model as loaded on the evaluation split (computed once, then shared)."""
        with self._lock:
            if self._dense is None:
                if not self.eval_batches:
                    raise DataError("The evaluation split is empty: choose an evaluation size of at least 1.")
                self._dense = evaluate(self.loaded.model, self.eval_batches, progress=progress, task=self.task)
            return self._dense

    def metric_set(self) -> tuple[str, ...]:
        """The metrics every run on this workspace reports (``evaluation.metrics.metric_set``: the task's own, or
        GLUE's for a data spec naming a GLUE task)."""
        return metric_set(self.task, self.dataset.source, n_classes=self.n_classes)

    @property
    def n_classes(self) -> int | None:
        return int(self.loaded.model.config.num_labels) if self.task.kind == "classification" else None

    @property
    def metric(self) -> str:
        """Name of the headline metric (``evaluation.metrics.headline``: GLUE's for a GLUE task, else the
        task's)."""
        return headline(self.task, None, self.dataset.source, n_classes=self.n_classes)

    @property
    def higher_is_better(self) -> bool:
        return HIGHER_IS_BETTER[self.metric]

    def metric_of(self, metrics: Metrics | dict) -> float:
        """The headline metric's value in ``metrics``."""
        values = metrics if isinstance(metrics, dict) else metrics.to_dict()
        return float(values[self.metric])

    def roles(self) -> dict:
        """Each data role as a run file records it: {"calib" | "select" | "eval": {"source": spec, "split": the
        Hugging Face split read or None, "size": rows, "seed": seed of the draw, "hash": sha256 of the rows}}."""
        parts = {"calib": self.calib, "select": self.select, "eval": self.eval}
        return {role: data_role(TextDataset([]) if part is None else part,
                                self.sources.get(role, part.source if part is not None and len(part) else None),
                                self.seed)
                for role, part in parts.items()}

    def label_mapping(self) -> dict | None:
        """How the evaluation data's labels were matched to the model's ids (``TextDataset.label_match``)."""
        return self.dataset.label_match

    def info(self) -> dict:
        """JSON-ready facts: model, arch, grid, heads cut in the weights, data columns, task, sizes, seed, device,
        the data roles (:meth:`roles`) and how labels were matched."""
        return {"model": self.loaded.spec, "model_source": self.loaded.source, "arch": self.adapter.arch,
                "grid": list(self.shape), "cut_heads": self.n_cut, "data": self.dataset.source,
                "columns": self.dataset.columns, "task": self.dataset.task, "calib_size": len(self.calib),
                "eval_size": len(self.eval), "select_size": len(self.select) if self.select is not None else 0,
                "seed": self.seed, "device": str(self.loaded.device), "roles": self.roles(),
                "labels": self.label_mapping(), "untrained_head": self.loaded.untrained_head}


def _deciding_roles(roles: list[str], wanted: dict) -> list[str]:
    """The roles whose needs decide an hf: split for a source read by ``roles``: those that take rows (evaluation
    never reads train unless named; a command that evaluates nothing, e.g. score with --eval-size 0, may score on
    train)."""
    return [r for r in roles if wanted[r] is None or int(wanted[r]) > 0] or roles


def _deciding_role(roles: list[str], wanted: dict) -> str:
    return _deciding_roles(roles, wanted)[0]


def _task_hint(model: str, task: str | None, loaded: LoadedModel | None) -> str | None:
    """"lm" or "classification": what the rows will be read for, known before the weights load (the requested
    task, the loaded model, or the model's config.json), or None when only loading it can tell (a hub id)."""
    if task in ("lm", "classification"):
        return task
    if loaded is not None:
        return "lm" if is_language_model(loaded.model) else "classification"
    config = peek_config(model)
    return None if config is None else "lm" if is_lm_config(config) else "classification"


def _read_roles(sources: dict[str, str], wanted: dict, columns: dict, hint: str, seed: int,
                allow_overlap: bool) -> dict[str, TextDataset]:
    """Every source the roles read, as loaded (labels raw), with the roles' rows split and compared as
    ``Workspace.build`` will split them: shared rows (same text, pair and raw label) are refused here, before any
    weights load. Returns {spec: rows}."""
    raw, parts = {}, {}
    for spec in dict.fromkeys(sources[r] for r in ROLE_ORDER if r in sources):
        roles = [r for r in ROLE_ORDER if sources.get(r) == spec]
        raw[spec] = load_data(spec, **columns, task=hint, role=_deciding_role(roles, wanted))
        parts.update(split_roles(raw[spec], fit_role_sizes(len(raw[spec]), {r: wanted[r] for r in roles}), seed))
    check_overlap(parts, sources, allow_overlap)
    return raw


def _split_note(spec: str, ds: TextDataset, roles: list[str]) -> str | None:
    """"hf:X -> split validation_matched (for evaluation, calibration)" when the split was chosen by the rule,
    not named in the spec; None otherwise."""
    if not spec.startswith("hf:") or ds.split is None or parse_hf_spec(spec)[2] is not None:
        return None
    said = " (the training split: fine for these roles, never chosen for evaluation)" if ds.split == "train" else ""
    return f"{spec} -> split {ds.split} (for {', '.join(ROLES[r] for r in roles)}){said}"
