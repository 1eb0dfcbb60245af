"""Running a model from layer l up: the one place that records layer inputs and replays them.

Removing or gating a head of layer l leaves layers 0..l-1 unchanged, so their output (layer l's input) can be
cached once and the model re-run from l only. The model's own forward still does the rest (embeddings are
recomputed and ignored, masks and rotary tables are built as usual, the head runs as usual): inside
:func:`start_at_layer` the entries 0..l-1 of the layer list are :class:`headprune.modwrap.StandIn` modules --
entry 0 returns layer l's cached input, entries 1..l-1 pass their input through -- and every layer keeps its
list position. That matters: Qwen2, Qwen3, Gemma 3 and ModernBERT choose each layer's attention mask, sliding
window and rotary table by position (``config.layer_types[i]``) or by the layer's own ``attention_type``
attribute, which a stand-in reads through to the layer it replaces. Modules the adapter lists in
``replay_bypass`` (DeBERTa-v2's convolution after layer 0) are skipped while replaying.

Used by KL ablation (criteria/kl.py), SAP's whole-layer rule and live re-evaluation (evaluation/live.py). ALBERT has no
per-layer list (one tied block), so callers fall back to full passes there. Everything here changes the module
tree for the length of a ``with`` block: call it on a private copy (``hooks.structural_copy``), never on a model
other threads can see.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from ..errors import CriterionError
from .hooks import StandIn, attached, pre_hook, standing_in, wrap_forward, wrapped_forward


def _needs_layers(adapter) -> nn.ModuleList:
    if adapter.layer_modules is None:
        raise CriterionError("Running from a layer up needs one module per layer; ALBERT shares one layer across "
                             "its depth, so only whole-model passes are possible there.")
    return adapter.layer_modules


def input_of(args: tuple, kwargs: dict) -> torch.Tensor:
    return args[0] if args else kwargs["hidden_states"]


def replay(adapter, layer: int, hidden: torch.Tensor) -> StandIn:
    """Stand-in for layer ``layer`` that ignores its input and returns ``hidden`` as that layer's output."""
    return StandIn(adapter.layer_modules[layer], lambda *args, **kwargs: adapter.layer_output(hidden))


def identity_stand_in(adapter, layer: int) -> StandIn:
    """Stand-in for layer ``layer`` that returns its input unchanged, in the layer's output format."""
    return StandIn(adapter.layer_modules[layer],
                   lambda *args, **kwargs: adapter.layer_output(input_of(args, kwargs)))


@contextmanager
def layer_stand_ins(adapter, stand_ins: dict[int, nn.Module], bypass: bool = False) -> Iterator[None]:
    """Within the block entry i of the layer list is ``stand_ins[i]``; ``bypass`` also skips ``replay_bypass``."""
    layers = _needs_layers(adapter)
    with ExitStack() as stack:
        if bypass and adapter.replay_bypass:
            stack.enter_context(wrapped_forward(dict(adapter.replay_bypass)))
        stack.enter_context(standing_in(layers, stand_ins))
        yield


def replay_stand_ins(adapter, layer: int, hidden: torch.Tensor) -> dict[int, nn.Module]:
    """Stand-ins for entries 0..layer-1 so that a forward starts at ``layer`` with input ``hidden``."""
    if layer == 0:
        return {}
    return {0: replay(adapter, layer, hidden), **{i: identity_stand_in(adapter, i) for i in range(1, layer)}}


@contextmanager
def start_at_layer(adapter, layer: int, hidden: torch.Tensor) -> Iterator[None]:
    """Within the block, a forward of the adapter's model runs layers ``layer``.. on ``hidden`` (their input)."""
    if layer == 0:
        yield
        return
    with layer_stand_ins(adapter, replay_stand_ins(adapter, layer, hidden), bypass=True):
        yield


@contextmanager
def skip_layers(adapter, layers: Iterable[int]) -> Iterator[None]:
    """Within the block the given layers are skipped: each returns its input hidden states unchanged."""
    layers = sorted(set(layers))
    if not layers:
        yield
        return
    _needs_layers(adapter)
    with layer_stand_ins(adapter, {i: identity_stand_in(adapter, i) for i in layers}):
        yield


DROPPED_LAYERS_KEY = "headprune_dropped_layers"   # config attribute of a checkpoint with layers dropped whole


def drop_layers(adapter, layers: Iterable[int]) -> None:
    """Skip ``layers`` of ``adapter``'s model for good (SAP's whole-layer rule written into a checkpoint): each
    returns its input unchanged, through a permanent forward wrap (copies keep it), and the config records them
    under ``headprune_dropped_layers`` so ``load_model`` rebuilds a saved model the same way."""
    layers = sorted({int(i) for i in layers})
    if not layers:
        return
    modules = _needs_layers(adapter)
    layer_output = adapter.layer_output

    def skip(module, inner, *args, **kwargs):
        return layer_output(input_of(args, kwargs))

    config = adapter.model.config
    done = set(getattr(config, DROPPED_LAYERS_KEY, None) or [])
    for i in layers:
        if i not in done:
            wrap_forward(modules[i], skip)
    setattr(config, DROPPED_LAYERS_KEY, sorted(done | set(layers)))


@contextmanager
def record_layer_inputs(layer_modules: nn.ModuleList):
    """Yield a list that fills with the hidden states entering each layer, in forward order."""
    inputs: list[torch.Tensor] = []

    def record(module, args, kwargs):
        inputs.append(input_of(args, kwargs))

    with attached(pre_hook(m, record, f"record input of layer {i}") for i, m in enumerate(layer_modules)):
        yield inputs
