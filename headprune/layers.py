"""Running an encoder from layer l up: the one place that records layer inputs and swaps the layer list.

Removing or gating a head of layer l leaves layers 0..l-1 unchanged, so their output (layer l's input) can be
cached once and the model re-run from l only. The model's own forward still does the rest (embeddings are
recomputed and ignored, the classifier tail runs as usual): the encoder's ``ModuleList`` of layers is
temporarily replaced by ``[Replay(cached input of l), layer l, ..., layer L-1]``. Used by KL ablation
(criteria/kl.py) and live re-evaluation (live.py). ALBERT has no per-layer list (one tied block), so callers
fall back to full passes there.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn


def owner_slot(model: nn.Module, target: nn.Module) -> tuple[nn.Module, str]:
    """The module holding ``target`` as a direct child, and the attribute name it holds it under."""
    for module in model.modules():
        for name, child in module.named_children():
            if child is target:
                return module, name
    raise RuntimeError("module has no owner inside the model")


class Replay(nn.Module):
    """Stands in for layers 0..l-1: returns layer l's cached input, whatever the encoder hands it."""

    def __init__(self, hidden: torch.Tensor):
        super().__init__()
        self.hidden = hidden

    def forward(self, *args, **kwargs):
        return self.hidden


@contextmanager
def layer_stack(model: nn.Module, layer_modules: nn.ModuleList, modules: list[nn.Module]):
    """Within the block, the encoder runs ``modules`` instead of ``layer_modules``; restored on exit."""
    owner, name = owner_slot(model, layer_modules)
    setattr(owner, name, nn.ModuleList(modules))
    try:
        yield
    finally:
        setattr(owner, name, layer_modules)


@contextmanager
def start_at_layer(model: nn.Module, layer_modules: nn.ModuleList, layer: int, hidden: torch.Tensor):
    """Within the block, a forward of ``model`` runs encoder layers ``layer``.. on ``hidden`` (their input)."""
    if layer == 0:
        yield
        return
    with layer_stack(model, layer_modules, [Replay(hidden), *list(layer_modules)[layer:]]):
        yield


@contextmanager
def record_layer_inputs(layer_modules: nn.ModuleList):
    """Yield a list that fills with the hidden states entering each encoder layer, in forward order."""
    inputs: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        inputs.append(args[0] if args else kwargs["hidden_states"])

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in layer_modules]
    try:
        yield inputs
    finally:
        for h in handles:
            h.remove()
