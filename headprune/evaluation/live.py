"""Live evaluation under a changing head mask: recompute only what a change can affect.

Why it is exact
---------------
A head in layer l only acts inside layer l, so the input of every layer k <= l is the same before and after
the head is toggled. ``LiveEvaluator`` keeps, for the *current* mask, the input hidden states of every encoder
layer on every evaluation batch. After a mask change whose first changed layer is l it replays the cached input
of layer l and runs layers l..L-1 under the new mask (``headprune.gating.gate_heads``), recording the new inputs
of layers > l as it goes so the cache again describes the current mask. The classifier tail (pooler, head) is
the model's own code: the forward of the model is run with entries 0..l-1 of its layer list standing in for
layer l's cached input (``headprune.layers``: every layer keeps its list position; the embeddings are recomputed
and discarded, they are cheap).

Two further savings, both exact up to float rounding and both checked against the plain forward at start-up
(when the check fails they are switched off, never silently wrong):

* **first token only in the last layer** -- every supported sequence classifier reads only position 0 of the
  last hidden state (BERT/ELECTRA pooler, RoBERTa/ELECTRA head, DistilBERT ``hidden_state[:, 0]``), and in the
  last layer position 0's output depends on the other positions only through their keys and values. So the
  last layer computes K and V for all tokens but Q, O and the feed-forward block for token 0 alone.
* **cached attention context of the toggled layer** -- the concatenated head contexts entering layer l's output
  projection O do not depend on layer l's gates (gating scales that context just before O, see gating.py), so
  they are cached per layer and layer l restarts at O instead of recomputing Q/K/V and the attention.

* **core replay** (decoders, ModernBERT: families whose attention core applies O itself, where the split layers
  above do not apply) -- the same cached context, used by standing in for the toggled layer's core with O of
  that context (``modwrap.wrapped_forward``); the rest of the layer is its own code.
* **chunked LM head** (causal LMs) -- the output head is skipped inside the forward (it returns the hidden states
  it is given) and ``task.lm_row_stats_chunked`` applies it afterwards to the positions with a real next token
  only, ``CHUNK_POSITIONS`` at a time: no (B, T, V) logits and no (B, T, V) log-softmax are materialised. With
  GPT-2's 50,257 words that head and its loss were most of a click (docs/results/live-estimates.md). A model
  that changes the logits after its head (Gemma's soft-capping) fails the start-up check and keeps its own head.

Cost: a toggle in layer l costs roughly (L - l - 1) layers + one O/feed-forward pass + one cheap last layer,
versus L layers for a full evaluation. Memory: two (tokens x hidden) float tensors per layer and evaluation row.

ALBERT (``adapter.layer_modules is None``): one block is shared by all layers, so a tied head acts in every
layer and nothing below a change can be reused; ``LiveEvaluator`` falls back to a full gated forward there.

The evaluator never mutates the model it is given: it runs a *structural* copy (new module objects sharing the
original parameter tensors), so its hooks and layer-list swaps are invisible to other users of the model (the
dashboard shares one cached model between sessions).
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import DataError, MaskError
from ..model.arch import adapt
from ..model.device import autocast
from ..model.gating import BEFORE_GATE, gate_heads
from ..model.hooks import StandIn, attached, passthrough, pre_hook, structural_copy, wrapped_forward
from ..model.layers import input_of, layer_stand_ins, replay_stand_ins
from ..model.mask import HeadMask
from ..model.task import IGNORE_INDEX, Task, lm_row_stats, lm_row_stats_chunked, task_for
from .metrics import (
    Metrics,
    choice_predictions,
    dataset_order,
    evaluation_inputs,
    gather_labels,
    metrics_from_choice_stats,
    metrics_from_lm_stats,
    metrics_from_logits,
)
from .progressive import Estimate, count_estimate, ratio_estimate, visit_order

Progress = Callable[[float, str], None]


def first_changed_layer(old: HeadMask, new: HeadMask, layer_to_block: Sequence[int]) -> int | None:
    """Smallest forward layer whose block has a gate that differs between ``old`` and ``new`` (None: same)."""
    changed = (old.gates != new.gates).any(dim=1)   # a tuned mask's scale change counts too
    for layer, block in enumerate(layer_to_block):
        if bool(changed[block]):
            return layer
    return None


def _eager_default(core: nn.Module):
    return getattr(sys.modules[type(core).__module__], "eager_attention_forward", None)


class _LayerRunner:
    """Pieces of one encoder layer, called separately (BERT-family and DistilBERT layers).

    ``context`` is what enters the O projection (concatenated head contexts); ``finish`` applies O, the
    residual/LayerNorm and the feed-forward block. Both are the layer's own submodules, so gating hooks on O
    apply as in the plain forward.
    """

    def __init__(self, layer: nn.Module, block, config):
        self.layer, self.block, self.config = layer, block, config
        if hasattr(layer, "attention") and hasattr(layer.attention, "self") and hasattr(layer, "feed_forward_chunk"):
            self.kind = "bert"
            self.core = layer.attention.self
        elif hasattr(layer, "sa_layer_norm") and hasattr(layer, "ffn") and hasattr(layer, "output_layer_norm"):
            self.kind = "distilbert"
            self.core = layer.attention
        else:
            raise TypeError(f"no split forward for {type(layer).__name__}")
        self.interface_default = _eager_default(self.core)
        if self.interface_default is None:
            raise TypeError(f"no eager attention function next to {type(self.core).__name__}")

    def context(self, hidden: torch.Tensor, attention_mask, query_rows: slice | None = None) -> torch.Tensor:
        """(B, T_q, H_live * d_h): per-head attention contexts for queries at ``query_rows`` (all by default)."""
        block = self.block
        b, t, _ = hidden.shape
        q_in = hidden if query_rows is None else hidden[:, query_rows]
        tq = q_in.shape[1]
        if not block.kept:  # every head cut by surgery: nothing enters O but its bias
            return hidden.new_zeros(b, tq, 0)
        d = block.head_size
        query = block.query(q_in).view(b, tq, -1, d).transpose(1, 2)
        key = block.key(hidden).view(b, t, -1, d).transpose(1, 2)
        value = block.value(hidden).view(b, t, -1, d).transpose(1, 2)
        mask = attention_mask
        if query_rows is not None and torch.is_tensor(mask) and mask.dim() == 4 and mask.shape[-2] > 1:
            mask = mask[:, :, query_rows, :]
        interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, self.interface_default)
        out, _ = interface(self.core, query, key, value, mask, dropout=0.0, scaling=self.core.scaling)
        return out.reshape(b, tq, -1).contiguous()

    def finish(self, context: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        layer = self.layer
        if self.kind == "bert":
            attention_output = layer.attention.output(context, residual)
            return layer.feed_forward_chunk(attention_output)
        attention_output = layer.sa_layer_norm(self.core.out_lin(context) + residual)
        return layer.output_layer_norm(layer.ffn(attention_output) + attention_output)


class _SplitLayer(nn.Module):
    """Runs one encoder layer from its pieces: from a cached O-input context and/or for token 0 only."""

    def __init__(self, runner: _LayerRunner, context: torch.Tensor | None = None, first_token: bool = False):
        super().__init__()
        self.runner, self.cached_context, self.first_token = runner, context, first_token

    def forward(self, hidden_states, attention_mask=None, *args, **kwargs):
        rows = slice(0, 1) if self.first_token else None
        if self.cached_context is not None:
            context = self.cached_context if rows is None else self.cached_context[:, rows]
        else:
            context = self.runner.context(hidden_states, attention_mask, rows)
        residual = hidden_states if rows is None else hidden_states[:, rows]
        return self.runner.finish(context, residual)


@dataclass
class LiveStats:
    full_runs: int = 0           # evaluations that ran every layer
    partial_runs: int = 0        # evaluations that started at a cached layer
    layers_run: int = 0          # encoder layers executed (summed over evaluations, not batches)
    last_start_layer: int | None = None


class LiveEvaluator:
    """Logits and metrics of ``model`` on ``batches`` under a mask that changes a few heads at a time.

    >>> live = LiveEvaluator(model, batches)          # one plain pass under ``mask``, fills the caches
    >>> live.set_mask(live.mask.prune(3, 7))          # recomputes layers >= 3 only; returns Metrics
    >>> live.logits                                   # == headprune.evaluate.predict(model, batches, mask)

    Metrics are ``headprune.evaluate.metrics_from_logits`` of the logits, so they equal
    ``evaluate(model, batches, mask)`` (tests/test_live.py proves both for random toggle sequences).
    Batches without labels give logits but no metrics. ``fast_paths=False`` keeps only the layer cache (the
    plain layer forwards run everywhere); ``cache_device="cpu"`` keeps the caches off the GPU.
    ``task``: default from the data and the head (``task.task_for``: (question, choice) batches are multiple
    choice, whose rows are kept as an LM's per-row sums and whose metrics are acc / acc_norm / acc_bytes).
    """

    def __init__(self, model: nn.Module, batches: Sequence[dict], mask: HeadMask | None = None,
                 fast_paths: bool = True, cache_device: torch.device | str | None = None,
                 progress: Progress | None = None, seed: int = 0, task: Task | None = None):
        if not batches:
            raise DataError("Live evaluation needs at least one evaluation batch; the evaluation set is empty.")
        self.model = structural_copy(model).eval()
        self.adapter = adapt(self.model)
        self.device = next(model.parameters()).device
        self.cache_device = torch.device(cache_device) if cache_device is not None else self.device
        self.batches = list(batches)
        self.task = task or task_for(self.model, self.batches)
        self._order = dataset_order(self.batches)
        # every run (re)evaluates the batches in a fresh seeded random order, so that the ones done so far are a
        # random sample whose first estimate is not the same batch's error on every click (headprune.progressive);
        # the order is per run only: the caches are per batch, so forks and later runs reuse them in any order.
        # _pending: the (start layer, mask) of a run that did not finish
        self.seed, self.runs, self._stream, self._forks = seed, 0, (seed,), 0
        self.last_order: list[int] = []
        self._pending: tuple[int, HeadMask] | None = None
        self.mask = self._checked(mask if mask is not None else HeadMask.ones(self.adapter.grid_shape))
        self.stats = LiveStats()
        self.incremental = self.adapter.layer_modules is not None
        self.fallback_reason = None if self.incremental else (
            "tied heads (ALBERT): a head acts in every layer, so every change re-runs the whole model")
        self._layers = self.adapter.layer_modules
        self._runners: list[_LayerRunner] | None = None
        self.fast_path_note: str | None = None
        if self.incremental and fast_paths:
            try:
                self._runners = [_LayerRunner(layer, self.adapter.blocks[i], self.model.config)
                                 for i, layer in enumerate(self._layers)]
            except TypeError as exc:
                self.fast_path_note = f"fast paths off: {exc}"
        # decoders (and any family whose attention core applies O itself): the toggled layer's core is stood in
        # for by O of its cached context, so the layer restarts at O; checked at start-up like the split layers
        self._core_replay = self.incremental and fast_paths and self._runners is None and \
            self.adapter.core_applies_output
        self.first_token = False  # the first pass is the model's plain forward: the reference for the checks
        self.chunked_head = False
        # _inputs[b][l]: input of layer l on batch b under self.mask; _contexts[b][l]: context entering O.
        self._inputs: list[list[torch.Tensor | None]] = []
        self._contexts: list[list[torch.Tensor | None]] = []
        self._logits: list[torch.Tensor] = []
        self._run(0, self.mask, progress)
        self._check_fast_paths()
        self._check_chunked_head()

    # -- public ------------------------------------------------------------------------------------------
    @property
    def n_rows(self) -> int:
        return len(self._order)

    @property
    def logits(self) -> torch.Tensor:
        """(n, num_labels) float32 on CPU, in dataset order (as ``headprune.evaluate.predict`` returns them).

        For a language model, (n, 3) per-row next-token sums [Σ ℓ, targets, correct] (``task.lm_row_stats``, as
        ``headprune.evaluate.lm_stats`` returns them): a (B, T, V) logits tensor per batch is never kept."""
        return torch.cat(self._logits)[self._order]

    @property
    def has_labels(self) -> bool:
        return all("labels" in b for b in self.batches)

    def metrics(self) -> Metrics:
        if self.task.is_choice:
            return metrics_from_choice_stats(self.logits, self.batches)
        if self.task.is_lm:
            return metrics_from_lm_stats(self.logits)
        return metrics_from_logits(self.logits, gather_labels(self.batches))

    def predictions(self) -> torch.Tensor:
        """(n,) what the model answers under the current mask: a classifier's class per row, or the picked choice
        per question (multiple choice); what stability compares."""
        if self.task.is_choice:
            return torch.as_tensor(choice_predictions(self.logits, self.batches)[0])
        return self.logits.argmax(-1)

    def set_mask(self, mask: HeadMask, progress: Progress | None = None,
                 on_estimate: Callable[[Estimate], None] | None = None) -> Metrics | None:
        """Move to ``mask`` (recomputing from its first changed layer); metrics under it (None without labels).

        ``on_estimate`` receives the running headline metric with its 95% interval after every batch
        (``headprune.progressive``; the last call is exact); the batches come in a fresh order on every run
        (seeded by ``seed`` and the run's number, ``last_order``). A run cut short (an exception, a browser session
        that moved on) is finished by the next call, which recomputes from the lowest layer either run changed.
        """
        mask = self._checked(mask)
        starts = [first_changed_layer(self.mask, mask, self.adapter.layer_to_block)]
        if self._pending is not None:
            starts += [self._pending[0], first_changed_layer(self._pending[1], mask, self.adapter.layer_to_block)]
        starts = [s for s in starts if s is not None]
        if starts:
            start = min(starts) if self.incremental else 0
            self._pending = (start, mask)
            self._run(start, mask, progress, on_estimate)
            self.mask, self._pending = mask, None
        return self.metrics() if self.has_labels else None

    def toggle(self, layer: int, head: int, progress: Progress | None = None,
               on_estimate: Callable[[Estimate], None] | None = None) -> Metrics | None:
        """Prune head (layer, head) if kept, restore it if pruned; metrics under the new mask."""
        pruned = self.mask.prune(layer, head)  # raises MaskError naming the valid range
        new = pruned if pruned != self.mask else self.mask.restore(layer, head)
        return self.set_mask(new, progress, on_estimate)

    def estimate(self, batches_done: Sequence[int]) -> Estimate | None:
        """Running headline metric over ``batches_done`` (indices into ``batches``); None when the task's
        headline metric is not a ratio of batch totals (regression's Pearson r) or there are no labels."""
        if not self.has_labels or self.task.kind == "regression":
            return None
        sizes = self._units_per_batch
        if self.task.is_choice:  # acc over whole questions (a question's rows never span two batches)
            totals = [int(np.equal(*choice_predictions(self._logits[b][dataset_order([self.batches[b]])],
                                                       [self.batches[b]])).sum()) for b in batches_done]
            return count_estimate(totals, [sizes[b] for b in batches_done], sizes, "acc")
        if self.task.is_lm:  # token-weighted loss, shown as perplexity (progressive.py)
            totals = [float(self._logits[b][:, 0].sum()) for b in batches_done]
            return ratio_estimate(totals, [sizes[b] for b in batches_done], sizes, "perplexity",
                                  bounds=(0.0, math.inf), transform=math.exp)
        totals = [int((self._logits[b].argmax(-1) == self.batches[b]["labels"]).sum()) for b in batches_done]
        return count_estimate(totals, [sizes[b] for b in batches_done], sizes, "accuracy")

    @functools.cached_property
    def _units_per_batch(self) -> list[int]:
        """What each batch's headline metric averages over -- rows, or an LM's next-token targets; fixed by the
        data, so counted once and not again after every batch of every run. Multiple choice: questions."""
        if self.task.is_choice:
            return [len(set(b["index"])) for b in self.batches]
        if self.task.is_lm:
            return [int((b["labels"][:, 1:] != IGNORE_INDEX).sum()) for b in self.batches]
        return [len(b["labels"]) for b in self.batches]

    def cache_megabytes(self) -> float:
        tensors = [t for rows in (self._inputs, self._contexts) for row in rows for t in row if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors) / 2**20

    def fork(self) -> LiveEvaluator:
        """An evaluator at this one's mask sharing its cached tensors, without a pass over the data.

        Runs replace cache entries and never write into a cached tensor, so the two read the same tensors until
        one recomputes a layer: a fork costs memory only from its lowest changed layer up. Each fork gates its own
        structural copy of the model. (The dashboard forks every browser session's evaluator from one per
        workspace, so 16 sessions do not hold 16 full caches.)
        """
        twin = copy.copy(self)
        twin.model = structural_copy(self.model)
        twin.adapter = adapt(twin.model)
        twin._layers = twin.adapter.layer_modules
        if self._runners is not None:
            twin._runners = [_LayerRunner(layer, twin.adapter.blocks[i], twin.model.config)
                             for i, layer in enumerate(twin._layers)]
        twin._inputs = [list(row) for row in self._inputs]
        twin._contexts = [list(row) for row in self._contexts]
        twin._logits = list(self._logits)
        twin.stats = LiveStats()
        # a fork's own stream of orders: seeded by its parent's seed and the number of forks made so far, so two
        # sessions forked from one source do not see the same first batch on their n-th click either
        self._forks += 1
        twin._stream, twin.runs, twin._forks = (*self._stream, self._forks), 0, 0
        return twin

    # -- internals ---------------------------------------------------------------------------------------
    def _inputs_of(self, batch: dict) -> dict:
        return evaluation_inputs(self.model, batch, self.device)

    @staticmethod
    def _logits_of(output) -> torch.Tensor:
        return output.logits

    def _kept_output(self, logits: torch.Tensor, batch: dict) -> torch.Tensor:
        """What is kept of a batch's output: float32 logits on CPU, or an LM's per-row next-token sums (with the
        chunked head, ``logits`` are the hidden states that enter the output head)."""
        if self.chunked_head:
            return lm_row_stats_chunked(logits, self.model.get_output_embeddings(), batch["labels"])
        if self.task.is_lm:
            return lm_row_stats(logits, batch["labels"].to(logits.device))
        return logits.float().cpu()

    def _batch_output(self, b: int, start: int, inputs: dict) -> torch.Tensor:
        """What is kept of batch ``b``'s output (``_kept_output``), run from layer ``start``."""
        skipped = {self.model.get_output_embeddings(): passthrough(0, "input")} if self.chunked_head else {}
        with wrapped_forward(skipped):
            out = self._forward_from(b, start, inputs) if self.incremental else self._logits_of(self.model(**inputs))
        return self._kept_output(out.detach(), self.batches[b])

    def _checked(self, mask: HeadMask) -> HeadMask:
        if not isinstance(mask, HeadMask) or mask.shape != self.adapter.grid_shape:
            got = mask.shape if isinstance(mask, HeadMask) else type(mask).__name__
            raise MaskError(f"Mask {got} does not fit this model's {self.adapter.grid_shape[0]}x"
                            f"{self.adapter.grid_shape[1]} heads (blocks x heads); give a HeadMask of that shape.")
        return mask

    def _stash(self, store: list, b: int, layer: int, tensor: torch.Tensor) -> None:
        store[b][layer] = tensor.detach().to(self.cache_device)

    @torch.no_grad()
    def _run(self, start: int, mask: HeadMask, progress: Progress | None,
             on_estimate: Callable[[Estimate], None] | None = None) -> None:
        """Evaluate every batch under ``mask`` from layer ``start``; refresh caches of layers >= start."""
        n_layers = self.adapter.n_layers
        if not self._logits:
            self._inputs = [[None] * n_layers for _ in self.batches]
            self._contexts = [[None] * n_layers for _ in self.batches]
            self._logits = [None] * len(self.batches)
        order = self.last_order = visit_order(len(self.batches), (*self._stream, self.runs))
        self.runs += 1
        with gate_heads(self.model, mask, self.adapter), autocast(self.device):
            for step, b in enumerate(order):
                self._logits[b] = self._batch_output(b, start, self._inputs_of(self.batches[b]))
                if on_estimate is not None and (estimate := self.estimate(order[:step + 1])) is not None:
                    on_estimate(estimate)
                if progress is not None:
                    progress((step + 1) / len(self.batches), f"layers {start}-{n_layers - 1}, batch {step + 1}")
        self.stats.last_start_layer = start
        self.stats.layers_run += n_layers - start
        if start == 0:
            self.stats.full_runs += 1
        else:
            self.stats.partial_runs += 1

    def _stand_ins(self, b: int, start: int, first_token: bool) -> dict[int, nn.Module]:
        """Stand-ins for the layer list to run layers start..L-1 of batch ``b`` (positions kept, see layers.py)."""
        n = len(self._layers)
        stand_ins = replay_stand_ins(self.adapter, start, self._inputs[b][start].to(self.device)) if start else {}
        for layer in range(start, n):
            reuse = self._runners is not None and layer == start and self._contexts[b][layer] is not None
            fast_last = first_token and layer == n - 1
            if reuse or fast_last:
                context = self._contexts[b][layer].to(self.device) if reuse else None
                split = _SplitLayer(self._runners[layer], context, first_token=fast_last)
                stand_ins[layer] = StandIn(self._layers[layer], split)
        return stand_ins

    def _forward_from(self, b: int, start: int, inputs: dict, first_token: bool | None = None) -> torch.Tensor:
        first_token = self.first_token if first_token is None else first_token
        stand_ins = self._stand_ins(b, start, first_token)
        stashes = []
        for layer in range(start, len(self._layers)):
            if layer > start:  # the start layer's input did not change (layer 0's is recomputed anyway)
                module = stand_ins.get(layer, self._layers[layer])
                stashes.append(pre_hook(
                    module, lambda _m, args, kwargs, _l=layer: self._stash(self._inputs, b, _l, input_of(args, kwargs)),
                    f"live: cache the input of layer {layer}"))
            if self._runners is not None or self._core_replay:  # the context as computed, before the gate scales it
                stashes.append(pre_hook(
                    self.adapter.blocks[layer].output,
                    lambda _m, args, kwargs, _l=layer: self._stash(self._contexts, b, _l, args[0]),
                    f"live: cache the context of block {layer}", BEFORE_GATE))
        replayed_core = {}
        if self._core_replay and self._contexts[b][start] is not None:
            block = self.adapter.blocks[start]
            context = self._contexts[b][start].to(self.device)
            replayed_core = {block.core: lambda core, _inner, *a, **k: (block.output(context), None)}
        with attached(stashes), layer_stand_ins(self.adapter, stand_ins, bypass=start > 0), \
                wrapped_forward(replayed_core):
            return self._logits_of(self.model(**inputs))

    def _check_fast_paths(self) -> None:
        """Re-run batch 0's last layer through the fast paths; switch off any that disagrees with the plain forward.

        The plain forward's logits for batch 0 are in the cache (the first run used the model's own layers).
        """
        if self._core_replay:
            self._check_core_replay()
            if self._core_replay:
                self.fast_path_note = "the toggled layer restarts at O from its cached context (core replay)"
        if self._runners is None:
            return
        last = self.adapter.n_layers - 1
        reference = self._logits[0]
        inputs = self._inputs_of(self.batches[0])
        saved = ([t for t in self._inputs[0]], [t for t in self._contexts[0]])
        # a wrong fast path is off by O(1); float32 rounding is ~1e-6, GPU autocast (bf16) ~1e-2
        tol = 5e-2 if self.device.type == "cuda" else 1e-4
        for first_token, note in ((True, None),
                                  (False, "first-token-only last layer off: the classifier reads more than token 0")):
            with torch.no_grad(), gate_heads(self.model, self.mask, self.adapter), autocast(self.device):
                fast = self._forward_from(0, last, inputs, first_token=first_token).float().cpu()
            self._inputs[0], self._contexts[0] = list(saved[0]), list(saved[1])
            if fast.shape == reference.shape and torch.allclose(fast, reference, atol=tol, rtol=tol):
                self.first_token = first_token
                self.fast_path_note = note
                if first_token:  # the last layer will only ever read token 0's context
                    for contexts in self._contexts:
                        contexts[last] = contexts[last][:, :1].clone()
                return
        self.first_token = False
        self._runners = None
        self.fast_path_note = "fast paths off: the split layer forward disagrees with the model's own forward"

    def _check_core_replay(self) -> None:
        """Re-run batch 0 from its last layer with that layer's core replayed from its cached context; keep the
        shortcut only if it reproduces the plain forward (e.g. a core that applies more than O after the
        attention would not)."""
        agrees = self._replay_agrees()
        if agrees is None:
            self._core_replay = False
            self.fast_path_note = "core replay off: the attention core's callers expect another output"
        elif not agrees:
            self._core_replay = False
            self.fast_path_note = "core replay off: O of the cached context disagrees with the model's own forward"

    def _replay_agrees(self) -> bool | None:
        """Whether batch 0 re-run from its last layer (or in full, without the layer cache) under the current
        shortcuts gives the kept output of the plain first pass; None when the re-run raises. The caches of
        batch 0 are left as they were."""
        start = self.adapter.n_layers - 1 if self.incremental else 0
        saved = ([t for t in self._inputs[0]], [t for t in self._contexts[0]])
        try:
            with torch.no_grad(), gate_heads(self.model, self.mask, self.adapter), autocast(self.device):
                fast = self._batch_output(0, start, self._inputs_of(self.batches[0]))
        except Exception:  # noqa: BLE001 - a module whose callers expect another return shape: no shortcut
            fast = None
        self._inputs[0], self._contexts[0] = list(saved[0]), list(saved[1])
        if fast is None:
            return None
        reference = self._logits[0]
        tol = 5e-2 if self.device.type == "cuda" else 1e-4
        return fast.shape == reference.shape and torch.allclose(fast.double(), reference.double(), atol=tol, rtol=tol)

    def _check_chunked_head(self) -> None:
        """Use the chunked LM head (module doc) if the model has an output head and the re-run agrees."""
        if not self.task.is_lm or self.model.get_output_embeddings() is None:
            return
        self.chunked_head = True
        if not self._replay_agrees():
            self.chunked_head = False
            self.fast_path_note = ((self.fast_path_note + "; ") if self.fast_path_note else "") + \
                "chunked LM head off: the model changes the logits after its output head"
