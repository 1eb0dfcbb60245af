"""Head surgery: the one place where heads are physically cut out of the weights.

For a block with head size d_h, keeping heads K (original ids) slices
    W_Q, W_K, W_V  rows     [h*d_h : (h+1)*d_h] for h in K   (and their biases)
    W_O            columns  [h*d_h : (h+1)*d_h] for h in K   (its bias is untouched)
which is exactly what a 0 gate on the removed heads computes (see gating.py). A block with no heads left
contributes only O's bias (plus whatever the architecture adds around it); its attention core is replaced
by ``_empty_core_forward``. The kept heads are recorded in ``config.headprune_kept_heads`` so that a saved
model loads back through ``headprune.models.load_model``.

Surgery works on a deep copy unless ``inplace=True``: a cached original model is never mutated.
"""

from __future__ import annotations

import copy
import types
import warnings

import torch
from torch import nn

from .arch import AttentionBlock, ModelAdapter, adapt
from .layers import owner_slot
from .mask import HeadMask


def _slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping ``index`` along weight dim 0 (output rows) or 1 (input columns)."""
    weight = linear.weight.detach().index_select(dim, index.to(linear.weight.device)).clone()
    bias = None
    if linear.bias is not None:
        bias = linear.bias.detach()
        bias = bias.index_select(0, index.to(bias.device)).clone() if dim == 0 else bias.clone()
    out_f, in_f = weight.shape
    with warnings.catch_warnings():  # zero-width layers (all heads cut) warn that init is a no-op
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(in_f, out_f, bias=bias is not None, device="meta")
    new.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias, requires_grad=linear.bias.requires_grad)
    return new


def _empty_core_forward(self, hidden_states, attention_mask=None, **kwargs):
    """Forward of an attention core with zero heads: the context is empty, so O yields only its bias."""
    context = hidden_states.new_zeros(*hidden_states.shape[:-1], 0)
    if hasattr(self, "out_lin"):  # DistilBERT: the core applies O itself
        return self.out_lin(context), None
    if hasattr(self, "LayerNorm") and hasattr(self, "dense"):  # ALBERT: O, dropout, residual, LayerNorm
        return self.LayerNorm(hidden_states + self.output_dropout(self.dense(context))), None
    return context, None  # BERT family: O lives in the sibling SelfOutput module


def _cut_block(model: nn.Module, block: AttentionBlock, keep: list[int]) -> None:
    positions = [block.kept.index(h) for h in keep]
    d = block.head_size
    index = torch.tensor([p * d + i for p in positions for i in range(d)], dtype=torch.long)
    core = block.core
    for attr_block, dim in (("query", 0), ("key", 0), ("value", 0), ("output", 1)):
        old = getattr(block, attr_block)
        new = _slice_linear(old, index, dim)
        owner, name = owner_slot(model, old)
        setattr(owner, name, new)
        setattr(block, attr_block, new)
    n = len(keep)
    for attr in ("num_attention_heads", "n_heads"):
        if hasattr(core, attr):
            setattr(core, attr, n)
    if hasattr(core, "all_head_size"):
        core.all_head_size = n * d
    if n == 0:
        core.forward = types.MethodType(_empty_core_forward, core)
    block.kept = list(keep)


def record_kept_heads(adapter: ModelAdapter) -> None:
    adapter.model.config.headprune_kept_heads = {str(b.index): list(b.kept) for b in adapter.blocks}


def prune_model(model: nn.Module, mask: HeadMask | dict, inplace: bool = False) -> nn.Module:
    """Remove every head whose gate is 0 in ``mask`` (original ids; heads already gone are ignored).

    Returns the pruned model: a deep copy unless ``inplace``. Soft gates (0 < m < 1) are not surgery's
    business and raise MaskError: apply them with ``gate_heads``.
    """
    from .errors import MaskError

    target = model if inplace else copy.deepcopy(model)
    adapter = adapt(target)
    if isinstance(mask, dict):
        mask = HeadMask.from_json(mask, adapter.grid_shape) if "pruned" in mask else \
            HeadMask.from_pruned(mask, adapter.grid_shape)
    if mask.shape != adapter.grid_shape:
        raise MaskError(f"Mask shape {mask.shape} does not fit this model's {adapter.grid_shape} heads.")
    if not mask.is_binary:
        raise MaskError("Surgery needs a binary mask (0 = remove, 1 = keep); soft gates are applied by gating.")
    keep_grid = mask.keep_bool()
    for block in adapter.blocks:
        keep = [h for h in block.kept if keep_grid[block.index, h]]
        if keep != block.kept:
            _cut_block(target, block, keep)
    record_kept_heads(adapter)
    return target


def restore_empty_cores(model: nn.Module) -> None:
    """Re-install the zero-head forward on blocks with no heads (after building a model from a config)."""
    for block in adapt(model).blocks:
        if not block.kept:
            block.core.forward = types.MethodType(_empty_core_forward, block.core)


# -- size report (Greedy-Gnorm paper, Table 2) ------------------------------------------------------------

def _group_of(param_name: str) -> str:
    parts = param_name.split(".")
    if "embeddings" in parts or "embeddings_project" in parts:
        return "embeddings"
    if "encoder" in parts or "transformer" in parts:
        return "encoder"
    if "pooler" in parts:
        return "pooler"
    return "classifier"


def parameter_counts(model: nn.Module) -> dict[str, dict[str, float]]:
    """Parameters and MB (at the stored dtype) by module group, plus the attention Q/K/V/O share."""
    groups: dict[str, dict[str, float]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen:
            continue
        seen.add(id(p))
        g = groups.setdefault(_group_of(name), {"params": 0, "mb": 0.0})
        g["params"] += p.numel()
        g["mb"] += p.numel() * p.element_size() / 2**20
    attention = {"params": 0, "mb": 0.0}
    for block in adapt(model).blocks:
        for lin in (block.query, block.key, block.value, block.output):
            for p in lin.parameters():
                attention["params"] += p.numel()
                attention["mb"] += p.numel() * p.element_size() / 2**20
    total = {"params": sum(g["params"] for g in groups.values()), "mb": sum(g["mb"] for g in groups.values())}
    out = {k: groups[k] for k in ("embeddings", "encoder", "pooler", "classifier") if k in groups}
    out["attention_qkvo"] = attention
    out["total"] = total
    return {k: {"params": int(v["params"]), "mb": round(v["mb"], 3)} for k, v in out.items()}


def size_report(before: nn.Module, after: nn.Module) -> dict:
    """Before/after table: {group: {"before": {...}, "after": {...}, "removed_params": n}}."""
    b, a = parameter_counts(before), parameter_counts(after)
    return {k: {"before": b[k], "after": a.get(k, {"params": 0, "mb": 0.0}),
                "removed_params": b[k]["params"] - a.get(k, {"params": 0})["params"]} for k in b}
