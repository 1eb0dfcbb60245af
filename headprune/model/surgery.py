"""Head surgery: the one place where heads are physically cut out of the weights.

For a block with head size d_h, keeping query heads K (original ids) keeps
    W_Q  rows     [p*d_h : (p+1)*d_h] for the physical position p of every h in K   (and its bias)
    W_O  columns  the same positions                                                (its bias is untouched)
    W_K, W_V rows of the key/value heads the kept query heads read (see "Grouped-query attention" below)
    any further per-head projection the adapter lists in ``extra_rows`` (DeBERTa's position projections,
             Longformer's global projections): its rows with the side (query or key/value) it is multiplied with
    any per-head parameter in ``head_params`` (gpt-oss's attention sinks, Nystromformer's per-head convolution,
             DeBERTa v1's q_bias / v_bias): its entries of the kept query heads
which is exactly what a 0 gate on the removed heads computes (see gating.py). Which rows hold a head is the
adapter's one description (``AttentionBlock.chunks``): a fused Q/K/V module -- Q|K|V blocks (GPT-2 ``c_attn``,
Phi-3 ``qkv_proj``, ModernBERT and MPT ``Wqkv``) or interleaved per key/value group (GPT-NeoX, BLOOM, Falcon,
DeBERTa v1) -- keeps the kept heads' rows in the order its layout has at the new head counts
(``AttentionBlock.rows_after``); Conv1D weights (in x out) along their output axis. Where Q and K pass through a
norm over all heads (OLMo 2, ``AttentionBlock.norm_spans_heads``) a head's Q/K rows also set the kept heads' norm,
so they stay, and only V rows and O columns are cut; the core then attends with the kept heads only. Parameters
are replaced in place on the copy, so module identity (and any accelerate hook on it) is kept. A block with no
heads left contributes only what O adds for an empty context (its bias); its core's forward is replaced by the
adapter's ``empty_forward`` (``headprune.modwrap``).

Grouped-query attention (stock transformers pairs physical query position p with key/value head
p // num_key_value_groups, one count per layer). Let c_g be the number of kept query heads of original group g:
* whole groups cut, or the same number of heads cut from every kept group (all c_g equal to c): each kept group
  keeps its key/value rows once and ``num_key_value_groups`` = c;
* any other mask: with k = gcd(c_g), group g's key/value rows are held c_g / k times and
  ``num_key_value_groups`` = k. This is exact (every kept query head reads its own group's keys and values, as
  gated) and needs no gating at run time, so the model saves and reloads; its price is the repeated key/value
  rows, which ``sizes.parameter_counts`` counts as held (``sizes.layout_report`` says how many copies each layer
  holds).
  Multi-head attention is the case where every head is its own group (all c_g = 1).
Kept query heads are stored grouped by key/value group, in original order within a group.

A tuned mask's scales (``HeadMask.scales``, Kwon et al.'s mask tuning) are baked into the weights before the cut
(:func:`bake_scales`): head h's O input columns are multiplied by its scale s, since O(s c_h) = (s W_O[:, h]) c_h,
so the cut model computes what the gated one does and needs no gate at run time.

The kept query heads and the group each key/value head holds are recorded in ``config.headprune_kept_heads``
and ``config.headprune_kv_sources`` so that a saved model loads back through ``headprune.models.load_model``.
Surgery works on a deep copy unless ``inplace=True``: a cached original model is never mutated.
"""

from __future__ import annotations

import copy
import math
from collections import Counter

import torch
from torch import nn

from ..errors import MaskError
from .arch import AttentionBlock, ModelAdapter, adapt, out_axis
from .hooks import unwrap_forward, wrap_forward
from .mask import HeadMask

GQA_STRATEGY = "kv-gcd-replicate"


def head_features(positions: list[int], d: int, offset: int = 0) -> list[int]:
    """Feature indices of the heads at physical ``positions`` (d features each), from ``offset``."""
    return [offset + p * d + i for p in positions for i in range(d)]


def _keep_features(module: nn.Module, index: list[int], output_side: bool) -> None:
    """Keep ``index`` of the module's output features (``output_side``) or input features, in place."""
    axis = out_axis(module) if output_side else 1 - out_axis(module)
    weight = module.weight
    idx = torch.tensor(index, dtype=torch.long, device=weight.device)
    module.weight = nn.Parameter(weight.detach().index_select(axis, idx).clone(),
                                 requires_grad=weight.requires_grad)
    if output_side and getattr(module, "bias", None) is not None:
        bias = module.bias
        module.bias = nn.Parameter(bias.detach().index_select(0, idx.to(bias.device)).clone(),
                                   requires_grad=bias.requires_grad)
    n = len(index)
    if isinstance(module, nn.Linear):
        if output_side:
            module.out_features = n
        else:
            module.in_features = n
    elif output_side and hasattr(module, "nf"):  # transformers' Conv1D
        module.nf = n


def plan_block(block: AttentionBlock, keep: list[int]) -> tuple[list[int], list[int]]:
    """(new kept query heads in weight order, original group of each new key/value head) for keeping ``keep``."""
    keep = sorted(keep, key=lambda h: (block.group_of(h), block.kept.index(h)))
    counts = Counter(block.group_of(h) for h in keep)
    if not counts:
        return [], []
    k = math.gcd(*counts.values())
    sources = [g for g in dict.fromkeys(block.group_of(h) for h in keep) for _ in range(counts[g] // k)]
    return keep, sources


def apply_layout(block: AttentionBlock, keep: list[int], sources: list[int]) -> None:
    """Slice ``block``'s weights in place to query heads ``keep`` reading key/value groups ``sources``."""
    d = block.head_size
    q_pos = [block.kept.index(h) for h in keep]
    kv_pos = [block.kv_sources.index(g) for g in sources]
    for module in block.projections():
        if block.norm_spans_heads and module is not block.value:   # every head's Q/K rows feed the kept heads' norm
            continue
        _keep_features(module, block.rows_after(module, q_pos, kv_pos), output_side=True)
    for module, side in block.extra_rows:
        _keep_features(module, head_features(q_pos if side == "query" else kv_pos, d), output_side=True)
    for module, name in block.head_params:
        _keep_entries(module, name, q_pos, block.n_live)
    _keep_features(block.output, head_features(q_pos, d), output_side=False)
    block.kept, block.kv_sources = list(keep), list(sources)
    install_forwards(block)


def _keep_entries(module: nn.Module, name: str, positions: list[int], n_live: int) -> None:
    """Keep, in place, the entries of physical query heads ``positions`` in the per-head parameter ``module.<name>``,
    whose dim 0 holds the ``n_live`` present heads' entries head by head, the same number each."""
    param = getattr(module, name)
    width = param.shape[0] // n_live
    idx = torch.tensor(head_features(positions, width), dtype=torch.long, device=param.device)
    setattr(module, name, nn.Parameter(param.detach().index_select(0, idx).clone(), requires_grad=param.requires_grad))


def install_forwards(block: AttentionBlock) -> None:
    """Set the core's head counts and, where needed, the forward that reads them (zero heads, Phi-3, ALiBi).

    The core also gets its layout, ``headprune_layout`` = (kept query heads, key/value group of each physical
    key/value head), original ids: forwards that select heads from something computed for all of them (MPNet's
    shared position bias, OLMo 2's norm over all heads, the ALiBi biases of BLOOM, Falcon and MPT) read it.
    """
    core = block.core
    core.headprune_layout = (list(block.kept), list(block.kv_sources))
    if block.set_counts is not None:
        block.set_counts(core, block.n_live, block.n_kv_live)
    # a second cut replaces the first cut's forward. The wraps are found by their function, not by undo closures
    # kept from the first cut: a cut of a cut works on a deep copy, where such closures would still point at the
    # first cut's modules (unwrapping those, and leaving the copy wrapped twice)
    for wrapper in (block.empty_forward, block.counted_forward):
        if wrapper is not None:
            unwrap_forward(core, wrapper)
    if not block.kept and block.empty_forward is not None:
        wrap_forward(core, block.empty_forward)
    elif block.counted_forward is not None and (block.n_live, block.n_kv_live) != (block.n_heads, block.n_kv_heads):
        wrap_forward(core, block.counted_forward)


def record_kept_heads(adapter: ModelAdapter) -> None:
    config = adapter.model.config
    config.headprune_kept_heads = {str(b.index): list(b.kept) for b in adapter.blocks}
    if any(b.kv_sources != b.kept for b in adapter.blocks):
        config.headprune_kv_sources = {str(b.index): list(b.kv_sources) for b in adapter.blocks}
        config.headprune_gqa_strategy = GQA_STRATEGY


def _as_mask(mask: HeadMask | dict, adapter: ModelAdapter) -> HeadMask:
    if isinstance(mask, dict):
        mask = HeadMask.from_json(mask, adapter.grid_shape, adapter.group_grid()) \
            if {"pruned", "pruned_groups"} & mask.keys() else HeadMask.from_pruned(mask, adapter.grid_shape)
    if mask.shape != adapter.grid_shape:
        raise MaskError(f"Mask shape {mask.shape} does not fit this model's {adapter.grid_shape} heads.")
    if not mask.is_binary:
        raise MaskError("Surgery needs a binary mask (0 = remove, 1 = keep); soft gates are applied by gating.")
    return mask


def bake_scales(model: nn.Module, mask: HeadMask) -> nn.Module:
    """Multiply, in place, the O input columns of every head present in ``model`` by its scale in ``mask`` (module
    doc; heads absent or unscaled are left alone). Returns ``model``."""
    if mask.scales is None:
        return model
    adapter = adapt(model)
    if mask.shape != adapter.grid_shape:
        raise MaskError(f"Mask shape {mask.shape} does not fit this model's {adapter.grid_shape} heads.")
    for block in adapter.blocks:
        for position, head in enumerate(block.kept):
            scale = float(mask.scales[block.index, head])
            if scale != 1.0 and mask.values[block.index, head] != 0:
                _scale_input_features(block.output, head_features([position], block.head_size), scale)
    return model


def _scale_input_features(module: nn.Module, index: list[int], scale: float) -> None:
    axis = 1 - out_axis(module)
    idx = torch.tensor(index, dtype=torch.long, device=module.weight.device)
    with torch.no_grad():
        module.weight.index_copy_(axis, idx, module.weight.index_select(axis, idx) * scale)


def prune_model(model: nn.Module, mask: HeadMask | dict, inplace: bool = False, allow_meta: bool = False) -> nn.Module:
    """Remove every head whose gate is 0 in ``mask`` (original ids; heads already gone are ignored).

    Returns the pruned model: a deep copy unless ``inplace``. A tuned mask's scales are baked into the kept heads'
    O columns (:func:`bake_scales`). Soft gates (0 < m < 1) are not surgery's
    business and raise MaskError: apply them with ``gate_heads``. Weights offloaded by accelerate (on the meta
    device) cannot be sliced; such a model raises a MaskError unless ``allow_meta`` (used when a saved pruned
    model is rebuilt on the meta device before its weights are loaded).
    """
    if not allow_meta and any(p.device.type == "meta" for p in model.parameters()):
        raise MaskError("Surgery needs the weights in memory, but some are offloaded (on the meta device: "
                        "device_map with 'disk' or 'cpu' offload). Load the model without offloading to cut "
                        "heads, or gate them instead (the mask works on an offloaded model).")
    target = model if inplace else copy.deepcopy(model)
    adapter = adapt(target)
    mask = _as_mask(mask, adapter)
    bake_scales(target, mask)
    keep_grid = mask.keep_bool()
    for block in adapter.blocks:
        keep = [h for h in block.kept if keep_grid[block.index, h]]
        if keep != block.kept:
            apply_layout(block, *plan_block(block, keep))
    record_kept_heads(adapter)
    return target
