"""Kwon et al.'s retrain-free pruning of attention heads: Fisher mask search, mask rearrangement, mask tuning.

Woosuk Kwon, Sehoon Kim, Michael W. Mahoney, Joseph Hassoun, Kurt Keutzer, Amir Gholami, "A Fast Post-Training
Pruning Framework for Transformers", NeurIPS 2022 (arXiv 2204.09656); reference code
github.com/WoosukKwon/retraining-free-pruning (``prune/fisher.py``, ``search.py``, ``rearrange.py``, ``rescale.py``).
This is our own implementation for attention heads only (headprune prunes no feed-forward neurons).

§4.1 Fisher information of the masks. With a mask variable m_i on every head (all ones: the dense model) and g_b =
     ∂L_b/∂m the gradient of example b's loss (the task's per-example loss, ``headprune.task``; the per-example
     mask gradient HIS reads, ``onepass``), the empirical Fisher information is I = Σ_b g_b g_bᵀ (eq. 6; we divide by
     the number of examples, which changes no choice). The search reads its diagonal I_ii = Σ_b g_bi² (the loss
     increase of pruning head i alone, to second order); rearrangement the block-diagonal approximation (heads of one
     layer interact, heads of different layers do not, §4.2). One forward + backward of the shared pass
     (``onepass``, quantity ("fisher", "loss")), cached in the context: every budget scored on it reuses it.
§4.1 Mask search (Algorithm 1) under a head budget: keep the mask with the least summed diagonal Fisher of the pruned
     heads. The paper's constraint is FLOPs (or latency) over heads and neurons; with heads only and every head of a
     model the same size, each head costs the same FLOPs (its Q/K/V/O slices and its attention), so a FLOPs budget
     over heads is a head count and Algorithm 1 (per layer sorted Fisher, how many heads per layer) reduces to keeping
     the ``n_keep`` heads of largest I_ii over all layers -- the reference's ``search_mac`` with no neurons. We
     implement that reduction, n_keep = N − round((1 − budget)·N) of the N grid heads (heads already pruned count
     as pruned, as ``ScoreMap.kept_at`` counts them), ties broken by (layer, head).
§4.2 Mask rearrangement (Algorithm 2): within each layer, the number of heads kept stays, and which heads is chosen to
     lower the block-diagonal Fisher loss of the pruned set P, Σ_b (Σ_{i∈P} g_bi)² = 1_Pᵀ I 1_P. The reference's
     greedy (``greedy_rearrange``): P starts as the layer's lowest-I_ii heads; each other head, in ascending I_ii,
     joins P, and the member whose removal leaves the smallest 1ᵀ I 1 over the rest leaves P.
§4.3 Mask tuning: layer by layer (l = 0..L−1), the kept heads' mask values become real numbers s that make the
     pruned model's attention sublayer reproduce the dense one's on the calibration tokens:
         min_s ‖ Σ_{h kept} s_h W_O,h c_h(x_S) + x_S − (W_O c(x_T) + x_T) ‖²    over every real token,
     x_S / x_T the layer's input in the pruned model (layers < l already tuned) / the dense model, c_h head h's
     context, W_O,h its O columns (O's bias is on both sides and cancels). That is linear least squares A s ≈ B;
     as the reference (``rescale.py``, ``lsmr_cupy_solver``) we solve for δ = s − 1 on the normal equations with
     damping, min_δ ‖AᵀA δ − (AᵀB − AᵀA 1)‖² + damp² ‖δ‖², the problem LSMR solves (here in closed form, float64),
     and stop tuning (that layer and every later one keeps s = 1) when a scale leaves [−max_scale, max_scale] or
     the solve fails (the reference's ``break`` at |s| > 10). The residual is
     the layer's input, as in every supported family's attention sublayer (Gemma 3's post-attention norm makes the
     match approximate there). ALBERT (one block tied across its depth) cannot be tuned layer by layer: ``tune``
     is refused there. The tuned scales go into the mask (``HeadMask.scales``): gating multiplies a kept head by
     its scale and every export bakes it into the head's O columns.

The reference's choices (its ``main.py``, ``prune/fisher.py``, ``prune/rescale.py``), each a parameter, each ON by
default (``kwon`` follows the reference code; turn one off for the paper's text):
    fisher_batch = 32    the Fisher squares the gradient of each 32-example mini-batch's mean loss (``collect_mask_
                         grads`` + ``compute_fisher_info``: Σ_B ḡ_B ḡ_Bᵀ), batches in calibration order; 1 is eq. 6
                         per example. It changes which heads are kept: per-batch gradients cancel across examples.
    teacher = "partial"  tuning matches the model pruned by the search at budget^(1/2) (the first step of the
                         reference's two-step schedule, ``get_pruning_schedule(target, 2)[0]``), not the dense one:
                         "dense" matches the model as given (the paper's §4.3 wording).
    skip_first_layer     layer 0's kept heads keep scale 1 (``rescale_mask``: ``layer_idx != 0``).
    bias_column          each layer's least squares gets a constant column of ones (one number added to every token
                         and output dimension of the heads' sum), solved from 1 with the scales and dropped.
    Not applicable to heads-only pruning, so not offered: the reference also rescales the FFN neurons of every layer
    towards the teacher (headprune's masks have no neuron scales), and it samples 2,048 training rows (with
    replacement, ``np.random.choice``): the rows are the caller's calibration set (a protocol's ``data.calib.size``).

ScoreMap: with ``rearrange`` off, the diagonal Fisher itself (so ``kept_at(1 − budget)`` is the search's mask and
other ratios are the search at other budgets); with it on, the pruning order the final mask implies (pruned heads
first, then kept ones, each by ascending I_ii), so ``kept_at(1 − budget)`` is the rearranged mask. ``meta["kwon_mask"]``
is the final mask with its scales (a protocol cell at sparsity 1 − budget and ``mask --sparsity`` use it).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data import model_inputs
from ..errors import CriterionError
from ..limits import NON_NEGATIVE, POSITIVE, Interval
from ..model.arch import adapt, out_axis
from ..model.capture import crop
from ..model.gating import BEFORE_GATE, gate_heads
from ..model.hooks import attached, post_hook, pre_hook
from ..model.layers import input_of, start_at_layer
from ..model.mask import HeadMask
from ..scoring import Criterion, Param, ScoreMap, ScoringContext, register
from ..scoring.protocol import GRADIENT_PASS
from .onepass import grid_json, live_heads, shared_pass

BUDGET = Interval(0, 1, closed="right")
FISHER_BATCH = Interval(1, 4096, integer=True, why="examples per Fisher mini-batch; the reference's is 32")
FISHER_KEY = ("fisher", "loss")


# -- §4.1 Fisher information and mask search ----------------------------------------------------------------------

def fisher_information(ctx: ScoringContext, batch: int = 1) -> np.ndarray:
    """(L, H, H): the block-diagonal empirical Fisher of the head masks on ``ctx.calib``: with ``batch`` = 1 the mean
    over examples of g gᵀ per layer, g the per-example gradient of the task loss wrt the masks at ``ctx.mask``; with
    ``batch`` = G the same over mini-batches of G examples in calibration order, g the gradient of each one's mean
    loss (the reference's, G = 32; module doc, §4.1)."""
    key = FISHER_KEY if batch == 1 else (*FISHER_KEY, batch)
    return shared_pass(ctx, {key})[key]


def diagonal(fisher: np.ndarray) -> np.ndarray:
    """(L, H) diagonal of an (L, H, H) block-diagonal Fisher."""
    return np.diagonal(fisher, axis1=1, axis2=2).copy()


def kept_count(budget: float, n_units: int) -> int:
    """Heads kept at ``budget`` of ``n_units``: N − round((1 − budget) N), as ``ScoreMap.kept_at(1 − budget)``."""
    return n_units - round((1 - budget) * n_units)


def search(diag: np.ndarray, live: np.ndarray, n_keep: int) -> np.ndarray:
    """(L, H) bool: the ``n_keep`` live heads of largest diagonal Fisher (Algorithm 1 for a head budget, module doc);
    ties by (layer, head)."""
    order = ScoreMap(np.where(live, diag, np.nan), "kwon").order(inverse=True)
    keep = np.zeros(diag.shape, bool)
    for layer, head in order[:max(n_keep, 0)]:
        keep[layer, head] = True
    return keep


# -- §4.2 mask rearrangement ----------------------------------------------------------------------------------------

def pruned_loss(block: np.ndarray, pruned: Sequence[int]) -> float:
    """1_Pᵀ I 1_P: the block-diagonal Fisher estimate of the loss increase of pruning the heads ``pruned`` of a layer
    with Fisher block ``block`` (H, H)."""
    idx = list(pruned)
    return float(block[np.ix_(idx, idx)].sum()) if idx else 0.0


def rearrange_layer(block: np.ndarray, keep: np.ndarray, live: np.ndarray) -> np.ndarray:
    """(H,) bool: which of a layer's live heads to keep, as many as ``keep`` keeps, by the reference's greedy
    (module doc, §4.2) on the layer's Fisher block (H, H)."""
    heads = [h for h in np.flatnonzero(live)]
    n_pruned = sum(1 for h in heads if not keep[h])
    if n_pruned == 0 or n_pruned == len(heads):
        return keep.copy()
    ascending = sorted(heads, key=lambda h: (block[h, h], h))
    pruned = ascending[:n_pruned]
    for head in ascending[n_pruned:]:
        pruned.append(head)
        losses = [pruned_loss(block, pruned[:i] + pruned[i + 1:]) for i in range(len(pruned))]
        del pruned[int(np.argmin(losses))]
    out = live.copy()
    out[pruned] = False
    return out


def rearrange(fisher: np.ndarray, keep: np.ndarray, live: np.ndarray) -> np.ndarray:
    """(L, H) bool: ``keep`` rearranged within every layer (Algorithm 2) on the (L, H, H) Fisher blocks."""
    return np.stack([rearrange_layer(fisher[l], keep[l], live[l]) for l in range(len(keep))])


# -- §4.3 mask tuning -----------------------------------------------------------------------------------------------

class _Stop(Exception):
    """Raised by a hook once the layer being tuned has given what it is asked for: the rest of the forward is
    not needed (each layer's pass costs one layer, not the rest of the model)."""


@dataclass
class LayerFit:
    """Layer l's least squares: AᵀA (k, k), AᵀB (k,), BᵀB over the calibration tokens, for its k kept heads."""

    heads: list[int]
    ata: torch.Tensor                # (k + bias, k + bias): a last row / column for the bias column when fitted
    atb: torch.Tensor
    btb: float = 0.0
    bias: bool = False               # the reference's free constant column (one number added to every entry of A s)

    def error(self, scales: torch.Tensor) -> float:
        """‖A s − B‖² for the kept heads' ``scales`` (k,), the heads' columns only (the constant is dropped)."""
        s, k = scales.double(), len(self.heads)
        return float(s @ self.ata[:k, :k] @ s - 2 * s @ self.atb[:k] + self.btb)

    def solve(self, damp: float) -> torch.Tensor:
        """s = 1 + δ, δ = argmin ‖AᵀA δ − (AᵀB − AᵀA 1)‖² + damp² ‖δ‖² (the damped problem LSMR solves; module doc);
        with the bias column the constant is solved with the scales (from 1, as the reference) and dropped."""
        n = len(self.atb)
        ones = torch.ones(n, dtype=torch.float64)
        rhs = self.atb - self.ata @ ones
        normal = self.ata.T @ self.ata + damp ** 2 * torch.eye(n, dtype=torch.float64)
        return (ones + torch.linalg.solve(normal, self.ata.T @ rhs))[:len(self.heads)]


@dataclass
class Tuning:
    scales: torch.Tensor                              # (L, H), 1 where not tuned
    error_before: list[float | None] = field(default_factory=list)   # per layer: ‖A 1 − B‖² / ‖B‖² (None: no heads)
    error_after: list[float | None] = field(default_factory=list)
    stopped_at: int | None = None                     # first layer whose solve was refused (|s| > max_scale)

    def to_json(self) -> dict:
        return {"relative_error_before": self.error_before, "relative_error_after": self.error_after,
                "stopped_at_layer": self.stopped_at}


def _output_columns(module) -> torch.Tensor:
    """O's weight as (out features, in features), whatever the module's layout (Linear or GPT-2's Conv1D)."""
    w = module.weight.detach()
    return w if out_axis(module) == 0 else w.T


def _run_layer(model, adapter, layer: int, hidden, inputs: dict, hooks: list, mask) -> torch.Tensor | None:
    """One forward of ``model`` that starts at ``layer`` on ``hidden`` (None: from the embeddings) under ``mask``
    and stops before the next layer; returns that layer's input (None after the last layer)."""
    stop_next = []
    if layer + 1 < len(adapter.layer_modules):
        def stop(module, args, kwargs):
            stop_next.append(input_of(args, kwargs).detach())
            raise _Stop
        hooks = [*hooks, pre_hook(adapter.layer_modules[layer + 1], stop, f"kwon: stop before layer {layer + 1}")]
    with torch.no_grad(), gate_heads(model, mask, adapter), attached(hooks), \
            start_at_layer(adapter, layer, hidden) if hidden is not None else nullcontext():
        try:
            model(**inputs)
        except _Stop:
            pass
    return stop_next[0] if stop_next else None


def _recorders(layer_module, output, seen: dict, what: str) -> list:
    """Hooks that put into ``seen`` the layer's input ("x") and either O's output ("o_out") or the heads' contexts
    entering O before the gate ("c")."""
    def on_input(module, args, kwargs):
        seen.setdefault("x", input_of(args, kwargs).detach())

    def on_context(module, args, kwargs):
        seen.setdefault("c", input_of(args, kwargs).detach())

    def on_output(module, args, kwargs, out):
        seen.setdefault("o_out", out.detach())

    watch = post_hook(output, on_output, "kwon: O output") if what == "o_out" else \
        pre_hook(output, on_context, "kwon: contexts", BEFORE_GATE)
    return [pre_hook(layer_module, on_input, "kwon: layer input"), watch]


def layer_fit(model, adapter, layer: int, batches: Sequence[dict], teacher_in: list, student_in: list,
              teacher_mask, student_mask, device, bias_column: bool = False) -> tuple[LayerFit, list]:
    """Layer ``layer``'s normal equations (module doc, §4.3) over ``batches``, and the dense model's inputs of the
    next layer. ``teacher_in`` / ``student_in``: per batch, the layer's input in the dense / pruned model (None
    for layer 0). Returns (fit, the dense model's input of the next layer per batch)."""
    block = adapter.blocks[adapter.layer_to_block[layer]]
    heads = [h for h in block.kept if bool(student_mask.gates[block.index, h] != 0)]
    positions = [block.kept.index(h) for h in heads]
    d = block.head_size
    weight = _output_columns(block.output).double()          # (D, H_live·d_h)
    k = len(heads)
    n = k + int(bias_column)
    fit = LayerFit(heads, torch.zeros(n, n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64),
                   bias=bias_column)
    next_teacher = []
    for b, batch in enumerate(batches):
        inputs = {key: v.to(device) for key, v in model_inputs(batch).items()}
        real = inputs["attention_mask"].bool()
        seen: dict[str, torch.Tensor] = {}
        teacher_hooks = _recorders(adapter.layer_modules[layer], block.output, seen, "o_out")
        next_teacher.append(_run_layer(model, adapter, layer, teacher_in[b], inputs, teacher_hooks, teacher_mask))

        def tokens(name, _seen=seen, _real=real):   # the batch's real tokens (Longformer pads inside: more)
            return crop(_seen.pop(name), _real.shape[1], (1,))[_real].double()

        target = tokens("o_out") + tokens("x")                              # (n tokens, D), O's bias included
        _run_layer(model, adapter, layer, student_in[b], inputs,
                   _recorders(adapter.layer_modules[layer], block.output, seen, "c"), student_mask)
        x_s, context = tokens("x"), tokens("c")
        bias = block.output.bias.detach().double() if getattr(block.output, "bias", None) is not None else 0.0
        rhs = target - bias - x_s                                            # B: what the kept heads must give
        if k:
            per_head = torch.stack([context[:, p * d:(p + 1) * d] @ weight[:, p * d:(p + 1) * d].T
                                    for p in positions], 1)                  # A: (n tokens, k, D)
            if bias_column:   # the constant column: 1 at every token and output dimension
                per_head = torch.cat([per_head, torch.ones_like(per_head[:, :1])], 1)
            # the (k, k) sums stay on the CPU, where the solve runs in float64, wherever the layer ran
            fit.ata += torch.einsum("nkd,njd->kj", per_head, per_head).cpu()
            fit.atb += torch.einsum("nkd,nd->k", per_head, rhs).cpu()
        fit.btb += float(rhs.square().sum())
    return fit, next_teacher


def tune_masks(model, batches: Sequence[dict], mask: HeadMask, teacher: HeadMask | None = None, damp: float = 1.0,
               max_scale: float = 10.0, device=None, progress=None, skip_first: bool = False,
               bias: bool = False) -> Tuning:
    """Mask tuning (module doc, §4.3): real-valued scales of ``mask``'s kept heads, layer by layer, so that the
    pruned model's attention sublayers match those of the model gated by ``teacher`` (None: dense) on ``batches``.
    ``skip_first``: layer 0 keeps its scales at 1 (the reference's); ``bias``: a free constant column in each
    layer's least squares, solved and dropped (the reference's). ``model`` is hooked and gated while this runs:
    pass a private copy. Raises CriterionError for ALBERT."""
    adapter = adapt(model)
    if adapter.layer_modules is None or adapter.tied:
        raise CriterionError(f"Kwon et al.'s mask tuning fits each layer in turn, but {adapter.family} has no module "
                             "per layer to run one at a time (ALBERT shares one block across its depth, so one scale "
                             "per head would have to serve every layer; XLM keeps attention, feed-forward and norms "
                             "in separate lists). Accepted: tune=false.")
    device = device if device is not None else next(model.parameters()).device
    teacher = teacher if teacher is not None else HeadMask.ones(adapter.grid_shape)
    scales = torch.ones(adapter.grid_shape)
    result = Tuning(scales)
    teacher_in: list = [None] * len(batches)
    student_in: list = [None] * len(batches)
    for layer in range(adapter.n_layers):
        current = mask.with_scales(scales)
        fit, next_teacher = layer_fit(model, adapter, layer, batches, teacher_in, student_in, teacher, current,
                                      device, bias)
        norm = max(fit.btb, 1e-300)
        if fit.heads:
            before = fit.error(torch.ones(len(fit.heads)))
            solved = fit.solve(damp) if result.stopped_at is None and not (skip_first and layer == 0) else None
            ok = solved is not None and bool(torch.isfinite(solved).all()) and float(solved.abs().max()) <= max_scale
            if solved is not None and not ok:
                result.stopped_at = layer
            if ok:
                scales[adapter.layer_to_block[layer], fit.heads] = solved.float()
            after = fit.error(scales[adapter.layer_to_block[layer], fit.heads])
            result.error_before.append(before / norm)
            result.error_after.append(after / norm)
        else:
            result.error_before.append(None)
            result.error_after.append(None)
        teacher_in = next_teacher
        if layer + 1 < adapter.n_layers:   # the next layer's input in the pruned model, this layer tuned
            tuned = mask.with_scales(scales)
            student_in = [_run_layer(model, adapter, layer, student_in[b],
                                     {k: v.to(device) for k, v in model_inputs(batch).items()}, [], tuned)
                          for b, batch in enumerate(batches)]
        if progress is not None:
            progress((layer + 1) / adapter.n_layers, f"mask tuning: layer {layer + 1}/{adapter.n_layers}")
    result.scales = scales
    return result


# -- the criterion --------------------------------------------------------------------------------------------------

@dataclass
class KwonResult:
    fisher: np.ndarray               # (L, H, H), mean over examples
    searched: np.ndarray             # (L, H) bool, Algorithm 1
    kept: np.ndarray                 # (L, H) bool, after Algorithm 2 (= searched without rearrangement)
    mask: HeadMask                   # kept, with the tuned scales (none without tuning)
    tuning: Tuning | None
    seconds: dict[str, float]


def teacher_mask(diag: np.ndarray, live: np.ndarray, budget: float, given: HeadMask | None,
                 kind: str) -> HeadMask | None:
    """The model the tuning matches: "dense" the model as given (``given``; None: every head), "partial" the
    reference's -- the search (Algorithm 1, no rearrangement) at the first step of its two-step pruning schedule,
    budget^(1/2) (``utils/schedule.py``: get_pruning_schedule(target, num_iter=2)[0]), within ``given``."""
    if kind == "dense":
        return given
    keep = search(diag, live, kept_count(budget ** 0.5, live.size))
    return HeadMask(torch.from_numpy(keep).float())


def run_kwon(ctx: ScoringContext, budget: float, rearrange_masks: bool = True, tune: bool = True,
             damp: float = 1.0, max_scale: float = 10.0, fisher_batch: int = 1, teacher: str = "dense",
             skip_first: bool = False, bias: bool = False) -> KwonResult:
    """Fisher (§4.1), search (Algorithm 1), rearrangement (Algorithm 2), tuning (§4.3) on ``ctx`` (module doc)."""
    t0 = time.perf_counter()
    fisher = fisher_information(ctx, fisher_batch)
    t1 = time.perf_counter()
    live = live_heads(ctx.model, ctx.mask)
    searched = search(diagonal(fisher), live, kept_count(budget, live.size))
    t2 = time.perf_counter()
    kept = rearrange(fisher, searched, live) if rearrange_masks else searched
    t3 = time.perf_counter()
    mask = HeadMask(torch.from_numpy(kept).float())
    tuning = None
    if tune:
        target = teacher_mask(diagonal(fisher), live, budget, ctx.mask, teacher)
        tuning = tune_masks(ctx.model, ctx.calib, mask, target, damp, max_scale, ctx.device,
                            progress=lambda f, m: ctx.report(0.5 + 0.5 * f, m), skip_first=skip_first, bias=bias)
        mask = mask.with_scales(tuning.scales)
    t4 = time.perf_counter()
    return KwonResult(fisher, searched, kept, mask, tuning,
                      {"fisher": t1 - t0, "search": t2 - t1, "rearrange": t3 - t2, "tune": t4 - t3})


def pruning_order_scores(diag: np.ndarray, kept: np.ndarray, live: np.ndarray) -> np.ndarray:
    """(L, H): position in the pruning order the mask ``kept`` implies (pruned heads first, then kept ones, each by
    ascending diagonal Fisher; ties by (layer, head)); NaN for heads not live."""
    heads = [(l, h) for l, h in np.argwhere(live).tolist()]
    heads.sort(key=lambda lh: (bool(kept[lh]), diag[lh], lh))
    scores = np.full(diag.shape, np.nan)
    for position, (l, h) in enumerate(heads):
        scores[l, h] = position
    return scores


@register
class Kwon(Criterion):
    name = "kwon"
    description = ("Kwon et al. 2022: Fisher mask search under a head budget, mask rearrangement, least-squares mask "
                   "tuning (retrain-free; real-valued head scales).")
    reference = ("Kwon et al. 2022, 'A Fast Post-Training Pruning Framework for Transformers' (NeurIPS): eq. 6, "
                 "Algorithms 1-2, §4.3")
    latex = (r"\mathcal I=\sum_b g_b g_b^\top,\ g_b=\partial L_b/\partial m;\ \text{keep top } \mathcal I_{ii};\ "
             r"\min_s \|\textstyle\sum_h s_h W_{O,h} c_h + x_S - (W_O c + x_T)\|^2")
    needs_labels = True
    needs_gradients = True
    params = {
        "budget": Param(0.5, "fraction of the heads kept, in (0, 1] (a protocol cell at sparsity s uses 1 - s)", float,
                        BUDGET),
        "rearrange": Param(True, "mask rearrangement within each layer by the block-diagonal Fisher (Algorithm 2)",
                           bool),
        "tune": Param(True, "mask tuning: least-squares scales of the kept heads, layer by layer (§4.3)", bool),
        "damp": Param(1.0, "damping of the tuning's least squares (the reference's LSMR damp)", float, NON_NEGATIVE),
        "max_scale": Param(10.0, "tuning stops at the first layer with a scale beyond ±max_scale", float, POSITIVE),
        # the reference code's choices (module doc, "The reference's choices"), each on by default; off is the paper
        "fisher_batch": Param(32, "examples per mini-batch whose mean-loss gradient is squared for the Fisher (the "
                                  "reference's 32; 1 = per example, eq. 6)", int, FISHER_BATCH),
        "teacher": Param("partial", "the model tuning matches: partial = the search at budget^(1/2), the first step "
                                    "of the reference's pruning schedule; dense = the model as given", str,
                         choices=("partial", "dense")),
        "skip_first_layer": Param(True, "tuning leaves layer 0's heads at scale 1 (the reference's)", bool),
        "bias_column": Param(True, "a free constant column in each layer's least squares, solved and dropped (the "
                                   "reference's)", bool),
    }

    def work(self, ctx: ScoringContext, params: dict) -> float:
        # a forward + backward for the Fisher, then per layer three one-layer passes (dense, pruned, tuned): about
        # three forwards in all
        return GRADIENT_PASS + (3.0 if params.get("tune", True) else 0.0)

    def score(self, ctx: ScoringContext, **p) -> ScoreMap:
        result = run_kwon(ctx, p["budget"], p["rearrange"], p["tune"], p["damp"], p["max_scale"], p["fisher_batch"],
                          p["teacher"], p["skip_first_layer"], p["bias_column"])
        live = live_heads(ctx.model, ctx.mask)
        diag = diagonal(result.fisher)
        scores = np.where(live, diag, np.nan) if not p["rearrange"] else \
            pruning_order_scores(diag, result.kept, live)
        moved = [[int(l), int(h)] for l, h in np.argwhere(result.kept != result.searched).tolist()]
        meta = {"fisher_diagonal": grid_json(diag, live),
                "fisher_blocks": [[[float(v) for v in row] for row in block] for block in result.fisher],
                "searched_mask": HeadMask(torch.from_numpy(result.searched).float()).to_json(),
                "rearranged_heads": moved, "kwon_mask": result.mask.to_json(),
                "tuning": result.tuning.to_json() if result.tuning is not None else None,
                "seconds": result.seconds}
        ctx.report(1.0, f"kwon: {int(result.kept.sum())} heads kept")
        return ScoreMap(scores, self.name, p, meta)


def kwon_mask(scores: ScoreMap, sparsity: float) -> HeadMask | None:
    """The final (rearranged, tuned) mask a ``kwon`` ScoreMap carries when it was scored at budget 1 − ``sparsity``;
    None otherwise (then the order's ``kept_at`` is the search at that sparsity)."""
    if scores.criterion != "kwon" or "kwon_mask" not in scores.meta:
        return None
    if round(1 - float(scores.params.get("budget", -1)), 9) != round(float(sparsity), 9):
        return None
    return HeadMask.from_json(scores.meta["kwon_mask"], scores.shape)
