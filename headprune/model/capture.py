"""Attention capture that works whatever attention implementation the model was loaded with.

Under ``sdpa`` transformers returns no attention probabilities, so for the duration of a capture the model is
switched to ``eager`` (restored afterwards) and a forward hook on every attention core records the
probabilities its eager kernel returns; families whose core returns them only on request (DeBERTa,
``adapter.needs_output_attentions``) are asked through ``config.output_attentions``, a core whose output is another
form (Longformer's bands) is read through ``adapter.attention_probs``, and a live core that still
returns none raises :class:`CaptureError` rather than yielding all-zero maps. Heads removed by surgery, or
gated to 0 by ``mask``, come back as all-zero maps in their original position, so an L x H grid is always
drawable. Padded query rows and key columns are zeroed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..errors import HeadpruneError
from .arch import ModelAdapter, adapt, supported
from .device import input_device
from .gating import gate_heads
from .hooks import attached, post_hook, structural_copy
from .mask import HeadMask


class CaptureError(HeadpruneError):
    """A model's attention core gave no probabilities: refusing to draw all-zero maps in their place."""


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
    """Temporarily run ``model`` with the eager attention kernel (the only one that returns probabilities).

    A registered attention function may name its own eager twin (``fn.eager_name``: the KV plan's restricted
    attention does), so a capture keeps what the function changes and still gets probabilities.
    """
    config = model.config
    previous = getattr(config, "_attn_implementation", None)
    function = ALL_ATTENTION_FUNCTIONS.get(previous) if previous else None
    target = getattr(function, "eager_name", "eager")
    if previous == target:
        yield model
        return
    setter = getattr(model, "set_attn_implementation", None)
    try:
        if setter is not None:
            setter(target)
        else:
            config._attn_implementation = target
        yield model
    finally:
        if setter is not None and previous is not None:
            setter(previous)
        else:
            config._attn_implementation = previous


@contextmanager
def record_attention(model, adapter: ModelAdapter | None = None,
                     on_record: Callable[[int, torch.Tensor | None], None] | None = None):
    """Yield a list that fills with (block index, (B, H_live, T, T) probabilities) (graph kept), in forward-layer
    order; with ``on_record`` each pair is handed to it as the layer runs instead (nothing is kept).

    Use inside your own forward/backward code (criteria need gradients through the probabilities); for a plain
    snapshot call :func:`capture_attention`, for one layer at a time :func:`stream_attention`.
    """
    adapter = adapter or adapt(model)
    records: list[tuple[int, torch.Tensor | None]] = []

    def recorder(block):
        def record(module, args, kwargs, output):
            if adapter.attention_probs is not None:   # a core whose own output is not the (B, h, T, T) map
                weights = adapter.attention_probs(block, args, kwargs, output)
            else:
                weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if weights is None and block.kept:  # zero-head cores legitimately return none
                raise CaptureError(
                    f"The attention core of block {block.index} ({type(module).__name__}, family "
                    f"'{adapter.family}') returned no attention probabilities under eager attention; headprune "
                    f"cannot draw or score its heads' attention. Supported families: {supported()}.")
            if on_record is None:
                records.append((block.index, weights))
            else:
                on_record(block.index, weights)
        return post_hook(block.core, record, f"record attention of block {block.index}")

    with attached(recorder(b) for b in adapter.blocks), eager_attention(model), \
            _asking_for_attentions(model, adapter.needs_output_attentions):
        yield records


@contextmanager
def _asking_for_attentions(model, needed: bool):
    """Within the block the model's forward returns attention probabilities without being asked per call.

    DeBERTa's core computes them but returns them only when its forward receives ``output_attentions=True``,
    which the model reads from ``config.output_attentions`` when the caller passes nothing: setting the config
    flag (eager is on already) reaches every caller's forward, the criteria's included.
    """
    config = model.config
    previous = config.output_attentions
    if not needed or previous:
        yield
        return
    config.output_attentions = True
    try:
        yield
    finally:
        config.output_attentions = previous


def expand_heads(weights: torch.Tensor | None, kept: list[int], n_heads: int, like: torch.Tensor) -> torch.Tensor:
    """Place live-head maps (B, h_live, T, T) into their original slots of a (B, H, T, T) zero tensor."""
    b, t = like.shape[0], like.shape[1]
    full = torch.zeros(b, n_heads, t, t, dtype=torch.float32, device=like.device)
    if weights is not None and kept:
        full[:, kept] = crop(weights, t).float()
    return full


def crop(tensor: torch.Tensor, length: int, dims: tuple[int, ...] = (-2, -1)) -> torch.Tensor:
    """``tensor`` cut to the batch's ``length`` along ``dims``. A model that pads the sequence inside its forward
    (Longformer, to a multiple of its window) hands out longer maps and activations; the positions it added are
    masked (they neither attend nor are attended), so cutting them off loses nothing."""
    for dim in dims:
        if tensor.shape[dim] > length:
            tensor = tensor.narrow(dim, 0, length)
    return tensor


@torch.no_grad()
def stream_attention(model, batch: dict, on_layer: Callable[[int, torch.Tensor], None],
                     mask: HeadMask | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass over ``batch`` handing each layer's attention to ``on_layer`` *while the layer runs*.

    ``on_layer(layer, probs)`` receives (B, H, T, T) float32 probabilities on the layer's own device, in original
    head slots (absent or gated-off heads all zero, padded rows/columns zero); nothing is kept after the call
    returns, so a long input holds one layer's H·T² map at a time, never L·H·T² (reduce it, move it to CPU or
    write it out inside ``on_layer``). Returns (logits, live): the model's output and the (n_layers, H) bool grid
    of heads present and not gated to 0. ``model`` itself is never hooked or switched to eager attention: the pass
    runs on a private copy (``hooks.structural_copy``), so other threads may use the same model meanwhile.
    """
    model = structural_copy(model)
    adapter = adapt(model)
    device = input_device(model)      # a batch built on the CPU meets a model on a GPU
    inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items() if k != "labels"}
    valid = inputs["attention_mask"].bool()
    live = torch.zeros(adapter.n_layers, adapter.n_heads, dtype=torch.bool)
    gates = mask.keep_bool() if mask is not None else torch.ones(adapter.grid_shape, dtype=torch.bool)
    layer_of_call = iter(range(adapter.n_layers))

    def on_record(block_index: int, weights: torch.Tensor | None) -> None:
        layer = next(layer_of_call)
        block = adapter.blocks[block_index]
        device = weights.device if weights is not None else valid.device
        full = expand_heads(weights, block.kept, adapter.n_heads, valid.to(device))
        alive = torch.zeros(adapter.n_heads, dtype=torch.bool)
        alive[block.kept] = True
        alive &= gates[block_index]
        full[:, ~alive.to(device)] = 0.0
        v = valid.to(device)
        full *= v[:, None, :, None] & v[:, None, None, :]
        live[layer] = alive
        on_layer(layer, full)

    with gate_heads(model, mask, adapter), record_attention(model, adapter, on_record):
        logits = model(**inputs).logits
    return logits, live


@torch.no_grad()
def capture_attention(model, batch: dict, mask: HeadMask | None = None, keep_device: bool = False) -> AttentionMaps:
    """One forward pass over ``batch`` returning every layer's attention probabilities (see module doc).

    Holds L·H·T² floats: for long inputs use :func:`stream_attention`.
    """
    probs: list[torch.Tensor] = []
    logits, live = stream_attention(model, batch, lambda _layer, p: probs.append(p if keep_device else p.cpu()),
                                    mask)
    return AttentionMaps(probs, live, batch["attention_mask"].cpu(), logits.float().cpu())
