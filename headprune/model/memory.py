"""The memory planner: batch sizes and KL's ablations per pass from the model's shapes and a memory budget.

Evaluation and scoring hold, besides the weights, tensors whose size is known from the shapes alone. With
T the (padded) sequence length of a batch, L layers, H query heads per layer, D the hidden size, I the MLP's
intermediate size, V the width of the output (the vocabulary of a language model, the classes of a classifier),
e the bytes of an activation element (the weights' dtype) and f = 4 (vocabulary-wide reductions run in float32),
the planner counts per row of a batch:

    logits           T·V·e                               the model's output (a classifier: T = 1)
    layer            T·(6D + 3I)·e + 2·H·T²·e           one layer's transient activations in a forward without graph
                                                         (residual, norms, Q/K/V/O, MLP gate/up/act, scores + probs)
    graph            L·(T·(12D + 5I)·e + 3·H·T²·e)      what autograd saves for the backward, every layer
    attention        L·H·T²·f                            attention probabilities recorded from every layer
    layer inputs     L·T·D·e                             KL's cache of every layer's input

and plans, for a budget B (bytes beyond the weights):

    forward   (evaluate)        rows·(logits + layer) + 3·T·V·f                          ≤ B
    attention (AE, AD, entropy) rows·(logits + layer + attention) + 3·T·V·f              ≤ B
    gradient  (HIS, Taylor, …)  rows·(graph + 4·logits + attention + 2·L·T·D·e)           ≤ B
    kl                          rows·(logits + layer inputs) + p·rows·(logits + layer) + 3·T·V·f   ≤ B

where rows is the rows per pass and p KL's ablations per pass (each ablation repeats the rows once), and the
counts may fill ``HEADROOM`` = 90% of B less, on the CPU, ``RUNTIME`` = 0.5 GB: what the interpreter, torch and
transformers keep resident (measured 0.43 GB with headprune imported, before any model), since a peak measured in
RSS holds them too; the rest of the 10% is allocator slack. The last
term of forward / attention / kl is the one-row slab a vocabulary-wide reduction (log-softmax, cross-entropy,
KL) works on: those are reduced row by row, never for the whole batch or for every ablation at once. The counts
are upper bounds (what eager attention and the float32 copies could hold); benchmarks/bench_memory.py measures
the real peaks. A budget too small even for one row (one ablation) still runs one row: the budget is a plan,
not a guarantee.

The budget defaults to ``DEFAULT_SHARE`` of the device's free memory (``psutil.virtual_memory().available`` on
CPU, ``torch.cuda.mem_get_info`` on a GPU), measured when the plan is made; a user sets it as bytes or text
("4GB", "512MiB", "25%" of free memory): ``--memory-budget`` in the CLI, the Model & data page.

Splitting a batch never changes a result beyond float rounding: every quantity planned here is a sum over rows
(per-row losses, per-example gradients, per-row KL). The one exception, Gnorm's whole-batch gradient norm
(reduction "batch"), is a norm of a batch sum: its batches are kept as given (``headprune.criteria.onepass``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import psutil
import torch

from ..errors import HeadpruneError
from .arch import adapt
from .task import is_language_model

DEFAULT_SHARE = 0.25        # of the free memory, when no budget is given
HEADROOM = 0.9              # share of the budget the counted tensors may fill (the rest: allocator slack)
RUNTIME = 500 * 10**6       # bytes the interpreter, torch and transformers hold resident on the CPU (0.43 GB measured)
REDUCE_BYTES = 4            # vocabulary-wide reductions run in float32
KINDS = ("forward", "attention", "gradient")
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12,
          "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


class MemoryBudgetError(HeadpruneError):
    """A memory budget that is not a size (e.g. ``--memory-budget lots``)."""


def parse_budget(text: str | int | float | None) -> int | float | None:
    """A budget as given: None (the default share), bytes (int), or a share of free memory (float in (0, 1]).

    Text: "4GB", "4 G", "512MiB", "1.5e9" (bytes; k/M/G/T are powers of 10, KiB/MiB/GiB/TiB of 2) or "25%".
    """
    if text is None or text == "":
        return None
    if isinstance(text, bool):
        raise MemoryBudgetError(f"Memory budget {text!r} is not a size.")
    if isinstance(text, (int, float)):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z%]*)\s*", str(text).lower())
        unit = match.group(2) if match else None
        if match is None or (unit not in _UNITS and unit != "%"):
            raise MemoryBudgetError(f"Memory budget {text!r} is not a size. Accepted: bytes with a unit, e.g. "
                                    "4GB, 512MB, 2GiB, or a share of the free memory, e.g. 25%.")
        number = float(match.group(1))
        if unit == "%":
            if not 0 < number <= 100:
                raise MemoryBudgetError(f"Memory budget {text!r}: a share must lie in (0%, 100%].")
            return number / 100
        value = number * _UNITS[unit]
    if isinstance(value, float) and not float(value).is_integer() and value <= 1:
        if not 0 < value <= 1:
            raise MemoryBudgetError(f"Memory budget {text!r}: a share must lie in (0, 1].")
        return float(value)
    if not value >= 1:
        raise MemoryBudgetError(f"Memory budget {text!r} must be positive (bytes, e.g. 4GB, or a share, e.g. 25%).")
    return int(value)


def on_gpu(device=None) -> bool:
    """Whether ``device``'s memory is a GPU's (a CUDA device that exists); else the budget is the system's RAM."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    return device.type == "cuda" and torch.cuda.is_available()


def free_memory(device=None) -> int:
    """Bytes free now on ``device``: the GPU's free memory for a CUDA device, else the system's available RAM."""
    if on_gpu(device):
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    return int(psutil.virtual_memory().available)


def resolve_budget(budget: str | int | float | None = None, device=None) -> int:
    """Bytes the computation may hold beyond the weights: ``budget`` as ``parse_budget`` reads it, a share taken
    of ``free_memory(device)``; None = ``DEFAULT_SHARE`` of it."""
    value = parse_budget(budget)
    if isinstance(value, int):
        return value
    return int((DEFAULT_SHARE if value is None else value) * free_memory(device))


def human_bytes(n: float) -> str:
    """1234567890 -> "1.2 GB" (powers of 10, as the budgets are written)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class Shapes:
    """What the planner reads off a model (module doc's symbols)."""

    layers: int              # L: forward layers
    heads: int               # H: query heads per layer (the widest layer)
    hidden: int              # D
    intermediate: int        # I
    outputs: int             # V: vocabulary of a language model, classes of a classifier
    lm: bool                 # logits at every position (T·V per row) or once per row (V)
    element: int             # e: bytes of an activation element

    @classmethod
    def of(cls, model) -> Shapes:
        adapter = adapt(model)
        config = model.config
        hidden = _first(config, ("hidden_size", "n_embd", "d_model", "dim")) or \
            model.get_input_embeddings().embedding_dim
        intermediate = _first(config, ("intermediate_size", "n_inner", "ffn_dim", "hidden_dim")) or 4 * hidden
        lm = is_language_model(model)
        head = model.get_output_embeddings() if lm else None
        outputs = (head.weight.shape[0] if head is not None else int(config.vocab_size)) if lm else \
            max(int(getattr(config, "num_labels", 2)), 1)
        param = next(model.parameters())
        element = param.element_size() if param.is_floating_point() else 4
        return cls(adapter.n_layers, adapter.n_heads, int(hidden), int(intermediate), int(outputs), lm, element)


def _first(config, names) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class MemoryPlan:
    """Rows per pass (and KL's ablations per pass) for ``shapes`` under ``budget`` bytes (module doc)."""

    shapes: Shapes
    budget: int
    runtime: int = 0         # bytes of the budget the process's runtime already holds (``plan_for``: RUNTIME on CPU)

    @property
    def usable(self) -> int:
        """Bytes the counted tensors may fill: ``HEADROOM`` of the budget less ``runtime``. Why both, measured on
        Qwen2.5-0.5B's shape (KL, 8 rows): with the counts filling 90% of the budget and no runtime term, the peak
        RSS was 7.64 GB against 1.98 GB of weights + 5.47 GB of budget; the interpreter and libraries alone hold
        0.43 GB."""
        return max(0, int(HEADROOM * self.budget) - self.runtime)

    # -- the counts of the module doc, per row at sequence length t ---------------------------------------------
    def logits(self, t: int) -> int:
        s = self.shapes
        return (t if s.lm else 1) * s.outputs * s.element

    def slab(self, t: int) -> int:
        """One row's vocabulary-wide reduction: three float32 (T, V) tensors at most."""
        s = self.shapes
        return 3 * (t if s.lm else 1) * s.outputs * REDUCE_BYTES

    def layer(self, t: int) -> int:
        s = self.shapes
        return (t * (6 * s.hidden + 3 * s.intermediate) + 2 * s.heads * t * t) * s.element

    def graph(self, t: int) -> int:
        s = self.shapes
        return s.layers * (t * (12 * s.hidden + 5 * s.intermediate) + 3 * s.heads * t * t) * s.element

    def attention(self, t: int) -> int:
        s = self.shapes
        return s.layers * s.heads * t * t * REDUCE_BYTES

    def layer_inputs(self, t: int) -> int:
        s = self.shapes
        return s.layers * t * s.hidden * s.element

    def row_bytes(self, kind: str, t: int) -> tuple[int, int]:
        """(bytes per row, fixed bytes) of a pass of ``kind`` ("forward", "attention", "gradient")."""
        if kind == "forward":
            return self.logits(t) + self.layer(t), self.slab(t)
        if kind == "attention":
            return self.logits(t) + self.layer(t) + self.attention(t), self.slab(t)
        if kind == "gradient":
            return self.graph(t) + 4 * self.logits(t) + self.attention(t) + 2 * self.layer_inputs(t), 0
        raise ValueError(f"unknown pass kind {kind!r}; accepted: {', '.join(KINDS)}")

    def bytes_for(self, kind: str, rows: int, t: int) -> int:
        per_row, fixed = self.row_bytes(kind, t)
        return rows * per_row + fixed

    def kl_bytes(self, rows: int, per_pass: int, t: int) -> int:
        """KL: the intact pass's log p and layer inputs for ``rows``, ``per_pass`` ablated copies of them, a slab."""
        return rows * (self.logits(t) + self.layer_inputs(t)) + per_pass * rows * (self.logits(t) + self.layer(t)) \
            + self.slab(t)

    # -- choices ------------------------------------------------------------------------------------------------
    def rows(self, kind: str, t: int, at_most: int) -> int:
        """The most rows (≤ ``at_most``, ≥ 1) whose pass of ``kind`` fits the budget at sequence length ``t``."""
        per_row, fixed = self.row_bytes(kind, t)
        return max(1, min(at_most, (self.usable - fixed) // max(per_row, 1)))

    def kl(self, t: int, rows: int, heads: int) -> tuple[int, int]:
        """(rows per intact pass, ablations per pass) for KL with batches of ``rows`` and ``heads`` heads a layer.

        Rows first (each row's log p is held while its ablations run), with room for one ablation; then as many
        ablations per pass as the rest of the budget holds.
        """
        per_row = 2 * self.logits(t) + self.layer_inputs(t) + self.layer(t)
        fit_rows = max(1, min(rows, (self.usable - self.slab(t)) // max(per_row, 1)))
        spare = self.usable - self.kl_bytes(fit_rows, 0, t)
        per_pass = spare // max(fit_rows * (self.logits(t) + self.layer(t)), 1)
        return int(fit_rows), int(max(1, min(heads, per_pass)))


def plan_for(model, budget: str | int | float | None = None, device=None) -> MemoryPlan:
    """The plan for ``model`` under ``budget`` (``resolve_budget``; default: a share of the free memory). In RAM
    the process's own runtime (``RUNTIME``) is paid from the budget: a peak RSS counts it; a GPU's free memory is
    measured with the CUDA context already in it."""
    if device is None:
        device = next(model.parameters()).device
    runtime = 0 if on_gpu(device) else RUNTIME   # the budget is RAM exactly when free_memory reads RAM
    return MemoryPlan(Shapes.of(model), resolve_budget(budget, device), runtime)


def seq_len(batch: dict) -> int:
    return int(batch["input_ids"].shape[1])


def split_batch(batch: dict, rows: int) -> list[dict]:
    """``batch`` cut into consecutive pieces of at most ``rows`` rows (tensors along dim 0, the ``index`` list with
    them); a batch that fits is returned as is."""
    n = len(batch["input_ids"])
    if n <= rows:
        return [batch]
    pieces = []
    for start in range(0, n, rows):
        pieces.append({k: v[start:start + rows] for k, v in batch.items()})
    return pieces


def planned_batches(batches: list[dict], plan: MemoryPlan | None, kind: str) -> list[dict]:
    """``batches`` with each cut to the rows ``plan`` allows for a pass of ``kind`` at its own length (unchanged
    without a plan)."""
    if plan is None:
        return list(batches)
    return [piece for b in batches for piece in split_batch(b, plan.rows(kind, seq_len(b), len(b["input_ids"])))]


def n_pieces(rows: int, size: int) -> int:
    return math.ceil(rows / max(size, 1))
