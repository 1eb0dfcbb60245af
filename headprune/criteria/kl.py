"""KL-ablation head importance with recursive layer smoothing.

Source: kl-recursive-head-importance.txt, Algorithm 1 ("Recursive Computation of Attention Head Importance").

    line 4   Imp_raw(l, i) = (1/N) Σ_x D_KL( p(x; θ) ‖ p(x; θ \\ head_i^l) ),   D_KL(p‖q) = Σ_c p_c (log p_c − log q_c)
    line 6   Imp(l, i) = (Imp_raw(l, i) − min_j Imp_raw(l, j)) / (max_j Imp_raw(l, j) − min_j Imp_raw(l, j))
    line 9   for l > 1:  Imp(l, i) ← α · Imp(l−1, i) + (1 − α) · Imp_raw(l, i)

p is the model's output class distribution (softmax of the logits, ``Task.output_log_probs``) under the current
mask; "θ without head i" gates that head to 0 (``headprune.model.gating``), which equals cutting it out. The
mean over the calibration inputs (line 4 is written for one input x) is our reading of "importance over a
dataset".

Language models: p is the next-token distribution at every real position of a row (the last position included:
a distribution needs no target); a row's D_KL is the mean over its real positions, and rows are averaged as
above, so every row counts once whatever its length (as in the row loss of ``headprune.task``).

Open choices, documented:
* ``variant="normalized"`` (default) enters the current layer with its min-max normalised value:
  Imp(l, i) ← α Imp(l−1, i) + (1 − α) Imp_norm(l, i), which keeps every layer on the same [0, 1] scale.
  ``variant="as-written"`` follows line 9 literally: the current layer enters with its *raw* KL, so for l > 1
  the normalisation of line 6 is overwritten and only layer 1 stays in [0, 1]. Why not the literal default,
  measured on the demo (128 calibration reviews, α = 0.5): raw KL is ~1e-3, so as written each layer is half the
  layer below plus a negligible own term; the layer means decay 0.45 → 0.23 → 0.11 → 0.058 → 0.029 → 0.015 (a
  global order prunes the top layer first whatever its heads do), the final scores of layers 2-6 have rank
  correlation 0.98-1.00 with layer 1's at the same head index and only 0.18, 0.36, −0.31, 0.11, 0.13 with their
  own KL. Normalized: own-KL correlations 0.74, 0.66, 0.24, 0.71, 0.44, layer means 0.45 → 0.37 → 0.29 → 0.21 →
  0.26 → 0.23. Pruning curves (1,000 held-out demo reviews, 6 heads per step), accuracy at 25 / 50 / 75 % of
  heads pruned: normalized 0.815 / 0.800 / 0.714, as written 0.809 / 0.569 / 0.569 (below the random order's
  0.751 ± 0.022 at 50 %). Two normalized layers still fall below ρ = 0.5 (0.24, 0.44), hence the warnings below.
* Every ScoreMap reports, per layer, the Spearman ρ between the final score and that layer's own raw KL
  (``meta["own_kl_spearman"]``) and a warning (``meta["warnings"]``) for each layer with ρ < 0.5, whichever the
  variant: the recursion mixes in the layer below at the same head index, an unrelated head there, and the user
  should see how much of a layer's order that is.
* Imp(l−1, i) is the already-smoothed value of the layer below (the loop runs upwards), so smoothing compounds.
* A layer whose raw values are all equal normalises to zeros (line 6 would divide by zero).
* Heads already pruned get NaN; min and max run over the live heads of a layer, and a pruned head passes 0 on to
  the layer above (it contributes nothing).
* ALBERT (tied): one block serves every layer, so ablating tied head i removes it from all layers at once; the
  grid has one row and line 9 never applies.

Cost: L·H ablations. Ablating a head of layer l leaves the inputs of layers ≤ l unchanged, so one dense pass per
batch records every layer's input (forward pre-hooks) and an ablation of layer l re-runs layers l..L−1 only:
layers 0..l−1 are stood in for by a replay (layer 0 returns the cached input of layer l, layers 1..l−1 pass it
through), while the model's own forward runs the embeddings (discarded) and the classifier tail. Several
ablations share one pass: the batch is repeated along the batch dimension and each copy gets its own gates
(per-example gates of ``gate_heads``). ALBERT has no per-layer modules, so it falls back to full passes.
benchmarks/bench_kl.py measures the saving against L·H plain full passes.

Memory: how many rows one intact pass takes and how many ablations share a pass is the memory planner's choice
(``headprune.model.memory``, MemoryPlan.kl) under the context's memory budget. The ablated distributions are
reduced to D_KL one (T, V) row of one ablation at a time, so a language model with a 152k vocabulary never holds
log q for all ablations at once (benchmarks/bench_memory.py). Results do not depend on the plan beyond float
rounding: every term is a per-row sum.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

from ..data import model_inputs
from ..errors import CriterionError
from ..evaluation.metrics import spearman
from ..limits import NON_NEGATIVE, UNIT
from ..model.arch import adapt
from ..model.gating import gate_heads
from ..model.hooks import structural_copy
from ..model.layers import record_layer_inputs, start_at_layer
from ..model.mask import HeadMask
from ..model.memory import Shapes, plan_for, seq_len, split_batch
from ..model.task import task_for
from ..scoring import Criterion, Param, ScoreMap, ScoringContext, register

VARIANTS = ("as-written", "normalized")
LOW_CORRELATION = 0.5   # below this ρ(final, own KL) a layer's order is mostly inherited: warned in the meta


# -- raw KL importance --------------------------------------------------------------------------------------------

def _repeat(inputs: dict, times: int) -> dict:
    return {k: v.repeat(times, *[1] * (v.ndim - 1)) for k, v in inputs.items()}


def _row_kl(log_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """(T,) D_KL(p ‖ q) = Σ_c p_c (log p_c − log q_c) at every position of one language-model row, from its log p
    (T, V) and the ablated logits (T, V); q's log-softmax is taken for this row only (module doc: memory)."""
    log_q = F.log_softmax(logits_q.float(), dim=-1)
    return F.kl_div(log_q, log_p, log_target=True, reduction="none").sum(-1)


@torch.no_grad()
def kl_raw_importance(model, batches: list[dict], mask: HeadMask | None = None, cached: bool = True,
                      ablations_per_pass: int | None = None,
                      progress: Callable[[float, str], None] | None = None,
                      memory_budget: int | str | None = None) -> np.ndarray:
    """Imp_raw (n_blocks, H): mean over the inputs of D_KL(p ‖ p without head) (Algorithm 1, line 4).

    ``cached`` runs an ablation of layer l from layer l up (see the module doc); ``ablations_per_pass`` heads are
    ablated in one batched pass (default: as many as ``memory_budget`` holds, at most all heads of a layer), over
    as many rows of a batch as the budget holds (``headprune.model.memory``: MemoryPlan.kl; default budget: a share
    of the free memory). ``cached=False, ablations_per_pass=1`` is the naive method: one full forward pass per
    head. Heads already pruned in ``mask`` get NaN. ``progress`` is called after every batched pass; an exception
    it raises (``errors.Cancelled``) stops the run.

    Memory: the intact pass's log p (rows, T, V) is held while its ablations run; the ablated log q is computed and
    reduced one row of one ablation at a time, so no (ablations, rows, T, V) log-probabilities ever exist.
    """
    model = structural_copy(model)  # gated and stood in below: never the caller's (maybe shared) model
    adapter = adapt(model)
    task = task_for(model, batches)   # multiple-choice batches: the continuation positions' distributions
    device = next(model.parameters()).device
    plan = plan_for(model, memory_budget, device)
    base = (mask.values if mask is not None else torch.ones(adapter.grid_shape)).to(device)
    live = (base != 0).cpu() & adapter.live_grid()
    incremental = cached and adapter.layer_modules is not None
    units = [(b, [h for h in range(adapter.n_heads) if live[b, h]]) for b in range(adapter.grid_shape[0])]
    pieces = []   # (rows of one intact pass, ablations per pass), planned per batch at its own length
    for batch in batches:
        rows, per_pass = plan.kl(seq_len(batch), len(batch["input_ids"]), adapter.n_heads)
        pieces += [(piece, ablations_per_pass or per_pass) for piece in split_batch(batch, rows)]
    total = torch.zeros(adapter.grid_shape, dtype=torch.float64)
    chunked = [[(b, heads[i:i + k]) for b, heads in units for i in range(0, len(heads), k)] for _, k in pieces]
    n_rows, done, n_steps = 0, 0, sum(len(c) for c in chunked)
    for (batch, _), chunks in zip(pieces, chunked):
        inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
        rows = inputs["input_ids"].shape[0]
        layer_inputs: list[torch.Tensor] = []
        with gate_heads(model, base, adapter):
            if incremental:
                with record_layer_inputs(adapter.layer_modules) as layer_inputs:
                    logits = model(**inputs).logits
            else:
                logits = model(**inputs).logits
        if logits.shape[-1] < 2:
            raise CriterionError("KL importance needs a class distribution, but this model has a single output "
                                 "(regression). Use a gradient or entropy criterion for regression models.")
        log_p, real = task.output_log_probs(logits, inputs)   # real: an LM's real positions, else None
        del logits
        for block, heads in chunks:
            gates = base.expand(len(heads), *base.shape).clone()
            gates[torch.arange(len(heads)), block, heads] = 0.0
            gates = gates.repeat_interleave(rows, dim=0)  # copy j of the batch gets ablation j
            repeated = _repeat(inputs, len(heads))
            with gate_heads(model, gates, adapter):
                if incremental:
                    hidden = layer_inputs[block].repeat(len(heads), 1, 1)
                    with start_at_layer(adapter, block, hidden):
                        ablated = model(**repeated).logits
                else:
                    ablated = model(**repeated).logits
            ablated = ablated.view(len(heads), rows, *ablated.shape[1:])
            if task.is_lm:   # one (T, V) row of one ablation at a time
                kl = torch.stack([torch.stack([_row_kl(log_p[r], ablated[j, r]) for r in range(rows)])
                                  for j in range(len(heads))])       # (ablations, rows, T)
            else:            # (ablations, rows, C): a few classes, all at once
                kl = F.kl_div(F.log_softmax(ablated.double(), dim=-1), log_p.expand(len(heads), *log_p.shape),
                              log_target=True, reduction="none").sum(-1)
            del ablated
            if real is not None:  # LM: mean over the row's real positions (module doc)
                kl = (kl * real).sum(-1) / real.sum(-1).clamp(min=1)
            total[block, heads] += kl.sum(-1).double().cpu()
            done += 1
            if progress is not None:
                progress(done / n_steps, f"KL ablation: block {block}, heads {heads[0]}-{heads[-1]}")
        n_rows += rows
    raw = (total / max(n_rows, 1)).numpy()
    raw[~live.numpy()] = np.nan
    return raw


# -- Algorithm 1, lines 6-11 ----------------------------------------------------------------------------------

def min_max(values: np.ndarray) -> np.ndarray:
    """Line 6 on one layer, ignoring NaN (pruned heads); a constant layer gives zeros."""
    lo, hi = np.nanmin(values), np.nanmax(values)
    return values * 0.0 if hi == lo else (values - lo) / (hi - lo)     # * 0.0 keeps NaN


def recursive_importance(raw: np.ndarray, alpha: float = 0.5, variant: str = "normalized") -> np.ndarray:
    """Imp (L, H) from Imp_raw by Algorithm 1 lines 6-11; ``variant`` chooses the current-layer term (module doc)."""
    if variant not in VARIANTS:
        raise CriterionError(f"Unknown variant '{variant}'; accepted: {', '.join(VARIANTS)}.")
    imp = np.full(raw.shape, np.nan)
    for layer in range(raw.shape[0]):
        if np.isnan(raw[layer]).all():
            continue
        normalised = min_max(raw[layer])
        if layer == 0:
            imp[layer] = normalised
            continue
        current = raw[layer] if variant == "as-written" else normalised
        imp[layer] = alpha * np.nan_to_num(imp[layer - 1]) + (1 - alpha) * current
    return imp


def own_kl_correlation(scores: np.ndarray, raw: np.ndarray) -> list[float | None]:
    """Per layer l: Spearman ρ between the final Imp(l, ·) and that layer's own Imp_raw(l, ·) over its live heads.

    ρ near 1: the layer's heads are ordered by their own ablation effect. As written (line 9 mixes in the layer
    below at the same head index i, which names an unrelated head there) ρ can fall near 0 or below. None where a
    layer has fewer than 3 live heads or a constant side (ρ undefined).
    """
    out: list[float | None] = []
    for final, own in zip(scores, raw):
        live = ~np.isnan(final) & ~np.isnan(own)
        rho = spearman(final[live], own[live]) if live.sum() >= 3 else float("nan")
        out.append(None if np.isnan(rho) else round(float(rho), 4))
    return out


def low_correlation_warnings(correlations: list[float | None], floor: float = LOW_CORRELATION) -> list[str]:
    """One warning per layer whose final score ranks its heads unlike its own KL (ρ < ``floor``)."""
    return [f"layer {l}: the final KL score has rank correlation {rho:.2f} with this layer's own KL (< {floor}); "
            "its head order comes mostly from the layers below (a lower alpha weighs the own layer more)."
            for l, rho in enumerate(correlations) if rho is not None and rho < floor]


@register
class KLAblation(Criterion):
    name = "kl"
    description = ("KL divergence of the output distribution when a head is ablated, smoothed across layers; "
                   "reports how far each layer's order is its own.")
    reference = "kl-recursive-head-importance.txt, Algorithm 1 (lines 4, 6, 9)"
    latex = (r"\mathrm{Imp}_{raw}(l,i)=\tfrac1N\sum_x D_{KL}\big(p(x;\theta)\,\|\,p(x;\theta\setminus h_i^l)\big),\quad"
             r"\mathrm{Imp}(l,i)\leftarrow\alpha\,\mathrm{Imp}(l-1,i)+(1-\alpha)\,\mathrm{Imp}_{raw}(l,i)")
    params = {
        "alpha": Param(0.5, "balancing factor α between the layer below and the current layer", float,
                       UNIT),
        "variant": Param("normalized", "current-layer term of the recursion: the min-max normalised KL "
                         "(default) or the raw KL (as written in Algorithm 1, line 9)", str, choices=VARIANTS),
        "ablations_per_pass": Param(0, "heads ablated together in one batched pass (0 = as many as the memory "
                                    "budget holds, at most all heads of a layer)",
                                    int, NON_NEGATIVE),
    }

    def work(self, ctx: ScoringContext, params: dict) -> float:
        """Forward passes over the calibration set: 1 intact pass, and per live head of layer l an ablated pass
        from layer l up, costing ((L − l)·P_layer + P_out) / (L·P_layer + P_out) of a forward, with the weights a
        token meets per layer P_layer ≈ 4D² + 3DI and in the output layer P_out = V·D (FLOPs ∝ weights per token;
        attention's T² term left out). ALBERT replays nothing: one whole pass per tied head."""
        adapter = adapt(ctx.model)
        live = adapter.live_grid()
        if ctx.mask is not None:
            live &= ctx.mask.keep_bool()
        if adapter.layer_modules is None:
            return 1.0 + float(live.sum())
        s = Shapes.of(ctx.model)
        per_layer, out = 4 * s.hidden ** 2 + 3 * s.hidden * s.intermediate, s.outputs * s.hidden
        full = s.layers * per_layer + out
        return 1.0 + sum(float(live[b].sum()) * ((s.layers - b) * per_layer + out) / full
                         for b in range(live.shape[0]))

    def score(self, ctx: ScoringContext, alpha: float, variant: str, ablations_per_pass: int) -> ScoreMap:
        raw = kl_raw_importance(ctx.model, ctx.calib, ctx.mask, cached=True,
                                ablations_per_pass=ablations_per_pass or None, progress=ctx.progress,
                                memory_budget=ctx.memory_budget)
        scores = recursive_importance(raw, alpha, variant)
        incremental = adapt(ctx.model).layer_modules is not None
        correlations = own_kl_correlation(scores, raw)
        meta = {"raw_kl": [[None if np.isnan(v) else float(v) for v in row] for row in raw],
                "own_kl_spearman": correlations, "warnings": low_correlation_warnings(correlations),
                "evaluation": "cached layer inputs" if incremental else "full passes (tied ALBERT layers)"}
        return ScoreMap(scores, self.name, {"alpha": alpha, "variant": variant}, meta)
