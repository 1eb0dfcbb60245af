"""Attention capture that works whatever attention implementation the model was loaded with.

Under ``sdpa`` transformers returns no attention probabilities, so for the duration of a capture the model is
switched to ``eager`` (restored afterwards) and a forward hook on every attention core records the
probabilities its eager kernel returns. Heads removed by surgery, or gated to 0 by ``mask``, come back as
all-zero maps in their original position, so an L x H grid is always drawable. Padded query rows and key
columns are zeroed.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from .arch import ModelAdapter, adapt
from .gating import gate_heads
from .mask import HeadMask


@dataclass
class AttentionMaps:
    probs: list[torch.Tensor]      # per forward layer: (B, H, T, T), float32, on CPU unless keep_device
    live: torch.Tensor             # (n_layers, H) bool: head present and not gated to 0
    attention_mask: torch.Tensor   # (B, T) 1 for real tokens
    logits: torch.Tensor           # (B, C) the model's output for the same forward pass

    @property
    def stacked(self) -> torch.Tensor:
        """(n_layers, B, H, T, T)."""
        return torch.stack(self.probs)


@contextmanager
def eager_attention(model):
    """Temporarily run ``model`` with the eager attention kernel (the only one that returns probabilities)."""
    config = model.config
    previous = getattr(config, "_attn_implementation", None)
    if previous == "eager":
        yield model
        return
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if setter is not None:
            setter("eager")
        else:
            config._attn_implementation = "eager"
        yield model
    finally:
        if setter is not None and previous is not None:
            setter(previous)
        else:
            config._attn_implementation = previous


@contextmanager
def record_attention(model, adapter: ModelAdapter | None = None):
    """Yield a list that fills with (B, H_live, T, T) probability tensors (graph kept) in forward-layer order.

    Use inside your own forward/backward code (criteria need gradients through the probabilities); for a plain
    snapshot call :func:`capture_attention`.
    """
    adapter = adapter or adapt(model)
    records: list[tuple[int, torch.Tensor | None]] = []
    handles = []
    for block in adapter.blocks:
        def hook(module, args, output, _block=block):
            weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            records.append((_block.index, weights))
        handles.append(block.core.register_forward_hook(hook))
    try:
        with eager_attention(model):
            yield records
    finally:
        for h in handles:
            h.remove()


def expand_heads(weights: torch.Tensor | None, kept: list[int], n_heads: int, like: torch.Tensor) -> torch.Tensor:
    """Place live-head maps (B, h_live, T, T) into their original slots of a (B, H, T, T) zero tensor."""
    b, t = like.shape[0], like.shape[1]
    full = torch.zeros(b, n_heads, t, t, dtype=torch.float32, device=like.device)
    if weights is not None and kept:
        full[:, kept] = weights.float()
    return full


@torch.no_grad()
def capture_attention(model, batch: dict, mask: HeadMask | None = None, keep_device: bool = False) -> AttentionMaps:
    """One forward pass over ``batch`` returning every layer's attention probabilities (see module doc)."""
    adapter = adapt(model)
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    attn = inputs["attention_mask"]
    with gate_heads(model, mask, adapter), record_attention(model, adapter) as records:
        logits = model(**inputs).logits
    valid = attn.bool()
    pair = (valid[:, None, :, None] & valid[:, None, None, :]).to(logits.device)
    probs = []
    live = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.bool)
    gates = mask.keep_bool() if mask is not None else torch.ones(adapter.grid_shape, dtype=torch.bool)
    for layer, (block_index, weights) in enumerate(records):
        block = adapter.blocks[block_index]
        full = expand_heads(weights, block.kept, adapter.n_heads, attn)
        alive = torch.zeros(adapter.n_heads, dtype=torch.bool)
        alive[block.kept] = True
        alive &= gates[block_index]
        full[:, ~alive.to(full.device)] = 0.0
        full = full * pair
        probs.append(full if keep_device else full.cpu())
        live[layer] = alive
    return AttentionMaps(probs, live, attn.cpu(), logits.float().cpu())
