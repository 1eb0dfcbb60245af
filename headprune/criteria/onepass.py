"""The shared pass: AE, AD, HIS, Taylor and Gnorm from one forward (and backward) over the calibration set.

Every activation-based criterion reads the same forward pass: the attention probabilities A of every head,
the input x and output of each block's Q/K/V projections, and the concatenated head contexts c entering each
block's output projection O (after gating). Gradients are taken with ``torch.autograd.grad`` with respect to
those activations only, so no parameter gradient is ever formed; there is one backward per distinct
objective o (the task loss for HIS and Taylor, ‖logits‖₂ for Gnorm by default).

Per-example values come from the whole batch at once. Examples never interact in an encoder classifier, so
the gradient of Σ_b o_b with respect to example b's activations is the gradient of o_b alone, and

    HIS    ∂o_b/∂m_h   = Σ_t ⟨c_bth, ∂o_b/∂c_bth⟩           (gate m_h scales c_h before O; HIES eq. 2)
    Taylor             = Σ_ij A_bhij ∂o_b/∂A_bhij             (Greedy-Gnorm eq. 8)
    Gnorm  ∂o_b/∂W_h   = Σ_t g_bth x_btᵀ                     (W_h: head h's rows of W_Q, W_K or W_V; g = ∂o_b/∂(x Wᵀ))

Padded positions are excluded everywhere (their rows and columns of A, their x). DeBERTa-v3 (share_att_key)
also multiplies its relative-position table by W_Q and W_K, once for the whole batch: that term of ∂o/∂W_h
has no per-example split, so Gnorm counts the token path Σ_t g_bth x_btᵀ only (with separate position
projections, as in DeBERTa-v2, those are other weights and the token path is the whole W_Q/W_K gradient).
For ALBERT one block runs in every layer, so a tied head's contributions are summed over layers before the
absolute value or norm (its gate and weights are shared) and its entropies are averaged over layers.

Decoders (causal attention, language-model heads):
* entropy: row t of a causal map spreads over the t + 1 keys it may see. Rows are not rescaled to a common length:
  eq. (3) sums every real row's entropy and divides by the sentence's n rows, so a head that spreads evenly over
  its prefix scores higher (less important) than one that looks at a single token, whatever the row's length;
  AD divides by n log n as written (log n is the entropy of the longest, last row spread evenly).
* HIS, Taylor, Gnorm with the LM loss: per row, the mean next-token cross-entropy over the row's real targets
  (``headprune.task``); rows are independent, so per-example gradients are exact as for encoders.
* Gnorm on grouped-query attention: a K/V block shared by a group is credited in full to every query head of the
  group (see ``_gnorm_stat``).

Quantities are named by tuples, cached in ``ScoringContext.cache["onepass"]`` and computed together:
    ("entropy", form, eps)     mean over sentences of eq. (3) with form A, B or C (Greedy-Gnorm §3.3)
    ("deficit",)               mean over sentences of AD (HIES App. A.2.1)
    ("his", objective)         mean over sentences of |∂o/∂m_h|
    ("taylor", objective)      mean over sentences of |Σ A ⊙ ∂o/∂A|
    ("gnorm", objective, reduction)   (3, L, H): G_Q, G_K, G_V (Greedy-Gnorm eqs. 13-16)
    ("fisher", objective, G)   the same over mini-batches of G examples in calibration order (the last one
                               shorter): Σ_B ḡ_B ḡ_Bᵀ / n, ḡ_B the gradient of the batch's MEAN loss (the mean of its
                               examples' g), as Kwon et al.'s reference squares each 32-example batch's gradient
    ("fisher", objective)      (L, H, H): mean over sentences of g gᵀ within each block, g = ∂o/∂m of the block's
                               heads (signed, the same per-example mask gradient as HIS): the block-diagonal
                               empirical Fisher information of the head masks (Kwon et al. 2022, eq. 6; its
                               diagonal is Σ g² / n)
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import contextmanager, nullcontext

import numpy as np
import torch

from ..data import model_inputs
from ..errors import CriterionError
from ..model.arch import PARTS, adapt
from ..model.capture import crop, record_attention
from ..model.gating import AFTER_GATE, gate_heads
from ..model.hooks import Stage, attached, post_hook, pre_hook
from ..model.memory import plan_for, planned_batches
from ..model.task import GOLD_KEY, Task
from ..scoring import Criterion, Param, ScoreMap, ScoringContext, get

OBJECTIVES = ("loss", "logits_norm")
GRADIENT_KINDS = ("his", "taylor", "gnorm", "fisher")


# -- objectives ------------------------------------------------------------------------------------------------

def objective_value(logits: torch.Tensor, labels: torch.Tensor | None, objective: str,
                    attention_mask: torch.Tensor | None = None, gold: torch.Tensor | None = None) -> torch.Tensor:
    """The scalar backpropagated for ``objective``.

    "loss" and "logits_norm" are sums over examples of per-example terms (cross-entropy, or squared error for a
    one-output regression head; ‖z_b‖₂), so per-example gradients are those of the example's own term.
    "batch_logits_norm" is ‖Z‖_F of the whole batch, as in the Greedy-Gnorm reference code.

    Language models (logits (B, T, V)): rows never interact in a causal decoder either, so the same holds with
    per-row terms averaged over the row's real positions -- "loss" is the row-mean next-token cross-entropy
    L_b of ``headprune.task`` (labels = the input ids), "logits_norm" is (1/n_b) Σ_t ‖z_bt‖₂ over the row's n_b
    real positions, "batch_logits_norm" is ‖Z‖_F over the real positions of the batch. Multiple-choice rows
    (``gold`` given: which row holds the right choice): "loss" is the right choice's −ll, the other rows 0.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if objective == "loss":  # the task's own per-example loss (headprune.task), summed over the batch
        kind = "lm" if logits.ndim == 3 else "regression" if logits.shape[-1] == 1 else "classification"
        if gold is not None:
            kind = "multiple_choice"
        return Task(kind).per_example_loss(logits, {"labels": labels, GOLD_KEY: gold}).sum()
    if logits.ndim == 3:
        real = attention_mask.to(logits.device).bool()
        norms = logits.norm(dim=-1) * real
        if objective == "logits_norm":
            return (norms.sum(-1) / real.sum(-1).clamp(min=1)).sum()
        return norms.square().sum().sqrt()
    if objective == "logits_norm":
        return logits.norm(dim=-1).sum()
    return logits.norm()  # batch_logits_norm


def backward_objective(key: tuple) -> str | None:
    """Which backward pass a quantity reads (None: forward only)."""
    if key[0] == "gnorm":
        return "batch_logits_norm" if key[1:] == ("logits_norm", "batch") else key[1]
    return key[1] if key[0] in GRADIENT_KINDS else None


# -- per-example pieces ----------------------------------------------------------------------------------------

def entropy_terms(p: torch.Tensor, form: str, eps: float) -> torch.Tensor:
    """Elementwise terms of the entropy forms (Greedy-Gnorm eqs. 18-20): A −a log a (0 log 0 = 0),
    B −a log(a+ε), C −(a+ε) log(a+ε)."""
    if form == "A":
        return -torch.special.xlogy(p, p)
    if form == "B":
        return -p * torch.log(p + eps)
    return -(p + eps) * torch.log(p + eps)


def per_example_sq_norms(x: torch.Tensor, g: torch.Tensor, n_heads: int, method: str | None = None) -> torch.Tensor:
    """‖Σ_t g_bth x_btᵀ‖_F² for every example b and head block h of g: (B, n_heads).

    x (B, T, D) are a Linear's inputs, g (B, T, n_heads·d_h) the gradients of its outputs, so Σ_t g_bth x_btᵀ is
    example b's gradient of the head's d_h x D weight block. Either
        "gram":   ‖·‖² = Σ_{t,s} (g_bth·g_bsh)(x_bt·x_bs)       cost ∝ T²(D + D_out)
        "direct": form the (d_h x D) gradient per example       cost ∝ T·D·D_out
    whichever is cheaper (``method`` forces one).
    """
    b, t, d = x.shape
    g = g.reshape(b, t, n_heads, -1)
    d_out = g.shape[2] * g.shape[3]
    if (method or ("gram" if t * (d + d_out) < d * d_out else "direct")) == "gram":
        gg = torch.einsum("bthk,bshk->bhts", g, g)
        return torch.einsum("bhts,bts->bh", gg, x @ x.transpose(1, 2)).clamp_min(0)
    return torch.einsum("bthk,btd->bhkd", g, x).square().sum((-1, -2))


def _scatter(values: torch.Tensor, kept: list[int], n_heads: int) -> torch.Tensor:
    """(..., h_live) values of the physically present heads -> (..., H) in original head ids (0 elsewhere)."""
    full = values.new_zeros(*values.shape[:-1], n_heads)
    full[..., kept] = values
    return full


@contextmanager
def _capture(model, adapter, probs: bool, projections: bool, contexts: bool):
    """Record, with their autograd graph, what the requested quantities read (lists in forward-layer order)."""
    rec = {"probs": [], "qkv": defaultdict(list), "ctx": defaultdict(list)}

    def ensure_graph(module, args, kwargs, out):
        # Frozen parameters would leave no graph to differentiate; activations need one either way.
        return out if out.requires_grad else out.requires_grad_()

    hooks = [post_hook(model.get_input_embeddings(), ensure_graph, "onepass: graph from the embeddings",
                       Stage.CHANGE)]
    for block in adapter.blocks:
        # Only a projection's first call within each call of its core reads the tokens; DeBERTa (share_att_key)
        # then projects its relative-position table through the same Q/K weights, once for the whole batch, so
        # that path has no per-example gradient and is left out of Gnorm (module doc).
        fresh: set[str] = set()
        if projections:
            hooks.append(pre_hook(block.core, lambda *_, _fresh=fresh: _fresh.update(PARTS),
                                  f"onepass: new call of block {block.index}"))
        for name in PARTS if projections else ():
            # A fused Q|K|V module's output is recorded whole (its slices are not on the path to the loss:
            # the model slices it its own way); the gradient is sliced afterwards by ``block.part`` (the
            # adapter's one description of where each head's rows lie, interleaved or not).
            def on_projection(module, args, kwargs, out, _i=block.index, _n=name, _fresh=fresh):
                if _n in _fresh:
                    _fresh.discard(_n)
                    rec["qkv"][_i, _n].append((args[0], out))
            hooks.append(post_hook(getattr(block, name), on_projection, f"onepass: {name} of block {block.index}"))
        if contexts:
            def on_context(module, args, kwargs, _i=block.index):
                rec["ctx"][_i].append(args[0])
            hooks.append(pre_hook(block.output, on_context, f"onepass: context of block {block.index}", AFTER_GATE))
    with attached(hooks), record_attention(model, adapter) if probs else nullcontext([]) as records:
        rec["probs"] = records
        yield rec


# -- the pass --------------------------------------------------------------------------------------------------

def splittable(keys) -> bool:
    """Whether every quantity of ``keys`` is a sum over examples, so a batch may be cut into smaller ones without
    changing it: all but Gnorm's whole-batch gradient norm (a norm of the batch's summed gradient)."""
    return not any(k[0] == "gnorm" and (k[2] == "batch" or k[1] == "batch_logits_norm") for k in keys)


def run_pass(model, batches: list[dict], keys, mask=None, device=None, progress=None,
             memory_budget: int | str | None = None) -> dict[tuple, np.ndarray]:
    """Compute every quantity named in ``keys`` (see module doc) in one forward per batch and one backward per
    distinct objective. Returns {key: array}, (L, H) or (3, L, H) for Gnorm; absent heads hold 0.

    Batches are cut to the rows the memory planner allows under ``memory_budget`` (``headprune.model.memory``:
    a pass with a backward keeps every layer's graph, one without keeps only the attention probabilities and runs
    without autograd); ``splittable`` keys only. ``progress`` is called after every batch; an exception it raises
    (``errors.Cancelled``) stops the pass.
    """
    keys = set(keys)
    adapter = adapt(model)
    refused = sorted({k[0] for k in keys} & set(adapter.refuses))
    if refused:
        raise CriterionError(f"{refused[0]} cannot run on {adapter.family}: {adapter.refuses[refused[0]]}")
    n_blocks, n_heads = adapter.grid_shape
    device = torch.device(device) if device is not None else next(model.parameters()).device
    layers_per_block = np.bincount(adapter.layer_to_block, minlength=n_blocks).clip(min=1)
    objectives = sorted({o for k in keys if (o := backward_objective(k))})
    if splittable(keys):
        batches = planned_batches(batches, plan_for(model, memory_budget, device),
                                  "gradient" if objectives else "attention")
    want = {kind: any(k[0] == kind for k in keys) for kind in ("entropy", "deficit", *GRADIENT_KINDS)}
    shapes = {"gnorm": (3, n_blocks, n_heads), "fisher": (n_blocks, n_heads, n_heads)}
    totals = {k: torch.zeros(shapes.get(k[0], (n_blocks, n_heads)), dtype=torch.float64) for k in keys}
    chunks = {k: [] for k in keys if k[0] == "fisher" and len(k) > 2}   # per-batch Fisher: examples' g not yet
    n_examples = 0                                                       # squared (their batch is not full)
    for i, batch in enumerate(batches):
        inputs = {k: v.to(device) for k, v in model_inputs(batch).items()}
        labels = batch["labels"].to(device) if "labels" in batch else None
        valid = inputs["attention_mask"].to(torch.float32)
        # no backward: no graph (the attention statistics read detached probabilities)
        with torch.enable_grad() if objectives else torch.no_grad(), gate_heads(model, mask, adapter), \
                _capture(model, adapter, want["entropy"] or want["deficit"] or want["taylor"], want["gnorm"],
                         want["his"] or want["fisher"]) as rec:
            logits = model(**inputs).logits
        for key in keys:
            if key[0] in ("entropy", "deficit"):
                totals[key] += _attention_stat(key, rec["probs"], adapter, valid, layers_per_block)
        for j, objective in enumerate(objectives):
            mine = [k for k in keys if backward_objective(k) == objective]
            if objective == "loss" and labels is None:
                raise CriterionError("The task loss needs labels, but the calibration data has none.")
            tensors = _differentiated(rec, mine)
            if not tensors:  # every head is gone
                continue
            value = objective_value(logits, labels, objective, inputs["attention_mask"], batch.get(GOLD_KEY))
            grads = torch.autograd.grad(value, tensors,
                                        retain_graph=j < len(objectives) - 1, allow_unused=True)
            grad_of = {id(t): (torch.zeros_like(t) if g is None else g) for t, g in zip(tensors, grads)}
            for key in mine:
                if key in chunks:
                    chunks[key].extend(mask_gradients(rec, grad_of, adapter, valid))
                    totals[key] += batch_fisher(chunks[key], key[2], final=False)
                else:
                    totals[key] += _gradient_stat(key, rec, grad_of, adapter, valid)
        n_examples += len(valid)
        if progress is not None:
            progress((i + 1) / len(batches), f"scoring batch {i + 1}/{len(batches)}")
    for key, pending in chunks.items():   # the last, shorter batch
        totals[key] += batch_fisher(pending, key[2], final=True)
    return {k: (v / max(n_examples, 1)).numpy() for k, v in totals.items()}


def mask_gradients(rec, grad_of, adapter, valid) -> list[torch.Tensor]:
    """Per example of this batch, its signed mask gradient g (L, H) (0 for absent heads)."""
    g = torch.zeros((len(valid), *adapter.grid_shape), dtype=torch.float64)
    for block_index, values in _his_terms(rec, grad_of, adapter, valid).items():
        g[:, block_index] = _scatter(values.detach().double().cpu(), adapter.blocks[block_index].kept,
                                     adapter.n_heads)
    return list(g)


def batch_fisher(pending: list, size: int, final: bool) -> torch.Tensor:
    """(L, H, H): Σ over the full batches of ``size`` examples at the head of ``pending`` (all that remain when
    ``final``) of ḡ ḡᵀ per block, ḡ the batch's mean gradient; the examples used are taken off ``pending``."""
    out = None
    while pending and (len(pending) >= size or final):
        batch, pending[:] = pending[:size], pending[size:]
        mean = torch.stack(batch).mean(0)                                # (L, H)
        term = torch.einsum("lh,lk->lhk", mean, mean)
        out = term if out is None else out + term
    return 0 if out is None else out


def _differentiated(rec: dict, keys: list[tuple]) -> list[torch.Tensor]:
    kinds = {k[0] for k in keys}
    tensors = []
    if "taylor" in kinds:
        tensors += [w for _, w in rec["probs"] if w is not None]
    if kinds & {"his", "fisher"}:
        tensors += [c for cs in rec["ctx"].values() for c in cs]
    if "gnorm" in kinds:
        tensors += [out for pairs in rec["qkv"].values() for _, out in pairs]
    unique = {id(t): t for t in tensors if t.requires_grad}
    return list(unique.values())


def _attention_stat(key, records, adapter, valid, layers_per_block) -> torch.Tensor:
    """Σ over examples of the per-sentence entropy (eq. 3, form/ε of ``key``) or attention deficit, (L, H)."""
    n = valid.sum(1)
    pair = (valid[:, None, :, None] * valid[:, None, None, :])
    out = torch.zeros(adapter.grid_shape, dtype=torch.float64)
    for block_index, weights in records:
        if weights is None:
            continue
        p = crop(weights.detach(), valid.shape[1]).to(torch.promote_types(weights.dtype, torch.float32)) * pair
        if key[0] == "entropy":
            per_sentence = (entropy_terms(p, key[1], key[2]) * pair).sum((-1, -2)) / n[:, None]
        else:  # AD = 1 − (1/(n log n)) Σ_t H(α_t); one-token sentences count as fully concentrated
            rows = entropy_terms(p, "A", 0.0).sum(-1)
            log_n = torch.log(n).clamp_min(math.log(2))
            per_sentence = 1 - (rows * valid[:, None, :]).sum(-1) / (n * log_n)[:, None]
        block = adapter.blocks[block_index]
        out[block_index] += _scatter(per_sentence.sum(0).double().cpu(), block.kept, adapter.n_heads)
    return out / torch.as_tensor(layers_per_block, dtype=torch.float64)[:, None]


def _taylor_terms(rec, grad_of, adapter, valid) -> dict[int, torch.Tensor]:
    """Per block, (B, h_live): Σ over its layers of Σ_ij A_ij ∂o/∂A_ij (real query rows only)."""
    terms = defaultdict(lambda: 0)
    for block_index, w in rec["probs"]:
        if w is not None and id(w) in grad_of:
            product = crop(w * grad_of[id(w)], valid.shape[1])
            terms[block_index] = terms[block_index] + (product.sum(-1) * valid[:, None, :]).sum(-1)
    return terms


def _his_terms(rec, grad_of, adapter, valid) -> dict[int, torch.Tensor]:
    """Per block, (B, h_live): Σ over its layers of Σ_t ⟨c_th, ∂o/∂c_th⟩ (real tokens only)."""
    terms = defaultdict(lambda: 0)
    for block_index, contexts in rec["ctx"].items():
        d_h = adapter.blocks[block_index].head_size
        for c in contexts:
            if id(c) in grad_of:
                inner = (crop(c * grad_of[id(c)], valid.shape[1], (1,)) * valid[..., None]).sum(1)
                terms[block_index] = terms[block_index] + inner.view(len(c), -1, d_h).sum(-1)
    return terms


def _gnorm_stat(key, rec, grad_of, adapter, valid) -> torch.Tensor:
    """(3, L, H): Σ over examples of ‖∂o_b/∂W_P^(h)‖_F, or Σ over this batch's gradient norm ("batch").

    Grouped-query attention: the K and V rows of a key/value head are shared by the query heads of its group, so
    their gradient norm is computed once per key/value head and *every* query head reading it is attributed the
    whole norm (its K/V block is that shared block; splitting it would make a head's G_K depend on how many
    heads share it). Q norms are per query head as usual.
    """
    out = torch.zeros((3, *adapter.grid_shape), dtype=torch.float64)
    t = valid.shape[1]

    def tokens(tensor):   # (B, T, features) of the batch's own T (module doc: Longformer's layout and padding)
        return crop(tensor.transpose(0, 1) if adapter.sequence_first else tensor, t, (1,))

    for (block_index, name), records in rec["qkv"].items():
        block = adapter.blocks[block_index]
        n_part, read = block.part_layout(name)   # rows' head slots; the slot each kept query head reads
        if not block.n_live:
            continue
        x = torch.cat([tokens(x.detach()) for x, _ in records], 1) * valid.repeat(1, len(records))[..., None]
        g = torch.cat([tokens(_part_grad(grad_of, y, block, name)) for _, y in records], 1)
        if key[2] == "batch":
            norms = torch.einsum("btk,btd->kd", g, x).view(n_part, -1).norm(dim=1)
        else:
            norms = per_example_sq_norms(x, g, n_part).sqrt().sum(0)
        norms = norms[read]   # per head slot -> per query head reading it
        out[("query", "key", "value").index(name), block_index] = _scatter(norms.double().cpu(), block.kept,
                                                                          adapter.n_heads)
    return out


def _part_grad(grad_of: dict, y: torch.Tensor, block, name: str) -> torch.Tensor:
    g = grad_of.get(id(y), None)
    g = torch.zeros_like(y) if g is None else g
    return block.part(name, g)


def _gradient_stat(key, rec, grad_of, adapter, valid) -> torch.Tensor:
    """Σ over examples of |per-example value| for HIS / Taylor, (L, H); Gnorm via ``_gnorm_stat``."""
    if key[0] == "gnorm":
        return _gnorm_stat(key, rec, grad_of, adapter, valid)
    if key[0] == "fisher":
        return _fisher_stat(rec, grad_of, adapter, valid)
    terms = (_taylor_terms if key[0] == "taylor" else _his_terms)(rec, grad_of, adapter, valid)
    out = torch.zeros(adapter.grid_shape, dtype=torch.float64)
    for block_index, values in terms.items():
        out[block_index] = _scatter(values.detach().abs().sum(0).double().cpu(), adapter.blocks[block_index].kept,
                                    adapter.n_heads)
    return out


def _fisher_stat(rec, grad_of, adapter, valid) -> torch.Tensor:
    """(L, H, H): Σ over examples of g_b g_bᵀ per block, g_b (H,) the signed mask gradient of example b (0 for absent
    heads); Kwon et al. 2022 eq. 6 with the block-diagonal approximation of §4.2 (heads of different layers apart)."""
    n_blocks, n_heads = adapter.grid_shape
    out = torch.zeros((n_blocks, n_heads, n_heads), dtype=torch.float64)
    for block_index, values in _his_terms(rec, grad_of, adapter, valid).items():
        g = _scatter(values.detach().double().cpu(), adapter.blocks[block_index].kept, n_heads)   # (B, H)
        out[block_index] = g.T @ g
    return out


# -- criteria built on the pass --------------------------------------------------------------------------------

def live_heads(model, mask=None) -> np.ndarray:
    """(L, H) bool: head physically present and not gated to 0."""
    live = adapt(model).live_grid()
    if mask is not None:
        live &= mask.keep_bool()
    return live.numpy()


def grid_json(values: np.ndarray, live: np.ndarray) -> list[list[float | None]]:
    """An (L, H) array as JSON rows, None where a head is dead."""
    return [[float(v) if ok else None for v, ok in zip(row, oks)] for row, oks in zip(values, live)]


def shared_pass(ctx: ScoringContext, keys) -> dict[tuple, np.ndarray]:
    """The quantities ``keys`` for ``ctx``, computing in one pass only those not already in ``ctx.cache``."""
    cache = ctx.cache.setdefault("onepass", {})
    missing = set(keys) - set(cache)
    if missing:
        cache.update(run_pass(ctx.model, ctx.calib, missing, ctx.mask, ctx.device, ctx.progress, ctx.memory_budget))
    return {k: cache[k] for k in keys}


class OnePassCriterion(Criterion):
    """A criterion read off the shared pass: ``needs`` names its quantities, ``combine`` turns them into scores
    (higher = more important) and JSON-ready metadata."""

    shares_pass = True

    def needs(self, params: dict) -> set[tuple]:  # pragma: no cover - interface
        raise NotImplementedError

    def combine(self, stats: dict, live: np.ndarray, **params) -> tuple[np.ndarray, dict]:  # pragma: no cover
        raise NotImplementedError

    def score(self, ctx: ScoringContext, **params) -> ScoreMap:
        stats = shared_pass(ctx, self.needs(params))
        live = live_heads(ctx.model, ctx.mask)
        scores, meta = self.combine(stats, live, **params)
        return ScoreMap(np.where(live, scores, np.nan), self.name, params, meta)


def score_many(names, ctx: ScoringContext, params_by_name: dict | None = None) -> dict[str, ScoreMap]:
    """Score several criteria on one context; the one-pass ones share a single pass over ``ctx.calib``.

    Parameters are validated (and labels checked) for every criterion before any compute starts.
    """
    params_by_name = params_by_name or {}
    criteria = {name: get(name) for name in names}
    needed = set()
    for name, crit in criteria.items():
        resolved = crit.prepare(ctx, params_by_name.get(name))
        if isinstance(crit, OnePassCriterion):
            needed |= crit.needs(resolved)
    shared_pass(ctx, needed)
    return {name: crit(ctx, params_by_name.get(name)) for name, crit in criteria.items()}


def objective_param(default: str) -> Param:
    return Param(default, "scalar differentiated: 'loss' (task cross-entropy, needs labels) or 'logits_norm' "
                 "(‖logits‖₂ per sentence, label-free)", str, choices=OBJECTIVES)
