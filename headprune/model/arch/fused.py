"""Decoders with one fused Q/K/V projection whose heads' rows interleave: GPT-NeoX (Pythia), and the builder the
ALiBi-era decoders of ``alibi.py`` (BLOOM, Falcon, MPT) share with it.

GPT-NeoX / Pythia (``GPTNeoXForCausalLM``, ``GPTNeoXForSequenceClassification``)
    ``attention.query_key_value`` holds, per head h, [q_h, k_h, v_h] (d_h rows each): the forward views its
    output as (..., H, 3 d_h) and chunks the last axis in three -- the "grouped" layout with one query head per
    group (``base.LAYOUTS``), which surgery keeps at any head count. Rotary positions touch only the first
    ``rotary_ndims`` features of each head (partial rotary, 25% in Pythia), head by head, so a cut changes no
    kept head's rotation. Attention and MLP read the same layer input and are summed (parallel residual): the
    attention's contribution still enters through ``attention.dense`` (O), where gating scales each head. The
    core infers its head count from the tensor shape and calls transformers' attention functions, so a cut sets
    no attribute, a KV plan's restricted attention applies, and only a core left with no heads needs its own
    forward (O of an empty context: its bias).

Found from modules: a ``ModuleList`` of layers whose ``attention`` has ``query_key_value``, ``dense`` and
``rotary_ndims``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from ...errors import ModelLoadError
from .base import ModelAdapter, empty_context, find_layers, make_block, out_features
from .registry import family


def fused_decoder(model: nn.Module, layers: nn.ModuleList, cores: list[nn.Module], parts, n_heads: int, n_kv: int,
                  head_size: int, *, layout: str, empty: Callable, counted: Callable | None = None,
                  set_counts: Callable | None = None, layer_output: Callable | None = None,
                  refuses: dict[str, str] | None = None) -> ModelAdapter:
    """A causal adapter with one block per layer, Q/K/V fused in one module of ``layout``; ``parts(core)`` gives
    (fused Q/K/V, O). These families derive the head size as hidden / heads, so a config whose heads do not divide
    the hidden size (or whose key/value heads do not divide the heads) is refused here, by what it says."""
    hidden = out_features(parts(cores[0])[1])
    if hidden % n_heads or n_heads % n_kv:
        raise ModelLoadError(
            f"This {model.config.model_type} config has hidden size {hidden}, {n_heads} attention heads and {n_kv} "
            "key/value heads: its head size is hidden / heads, so the heads must divide the hidden size and the "
            "key/value heads must divide the heads. Accepted: a config.json whose counts divide (the one the "
            "checkpoint was trained with).")
    blocks = []
    for i, core in enumerate(cores):
        qkv, out = parts(core)
        blocks.append(make_block(model, i, core, (qkv, qkv, qkv, out), head_size, n_heads, n_kv,
                                 set_counts=set_counts, empty_forward=empty, counted_forward=counted, layout=layout))
    extra = {} if layer_output is None else {"layer_output": layer_output}
    return ModelAdapter(str(model.config.model_type), model, blocks, n_heads, len(blocks), False,
                        list(range(len(blocks))), layers, core_applies_output=True, causal=True,
                        refuses=dict(refuses or {}), **extra)


def counts_setter(query_attr: str, kv_attr: str | None = None) -> Callable[[nn.Module, int, int], None]:
    """A ``set_counts`` writing the query (and key/value) head counts a family's core reads into those attributes."""

    def set_counts(core: nn.Module, n_query: int, n_kv: int) -> None:
        setattr(core, query_attr, n_query)
        if kv_attr is not None:
            setattr(core, kv_attr, n_kv)

    return set_counts


def empty_dense(core, _inner, *args, **kwargs):
    """A core with no heads whose O is ``core.dense``: O of an empty context (its bias, or zeros), no weights."""
    return core.dense(empty_context(args, kwargs)), None


@family("gpt-neox", "GPT-NeoX, Pythia: fused head-interleaved query_key_value, partial rotary, parallel residual")
def gpt_neox(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "attention", None),
                         ("query_key_value", "dense", "rotary_ndims"))
    if layers is None:
        return None
    cores = [layer.attention for layer in layers]
    n_heads = model.config.num_attention_heads
    return fused_decoder(model, layers, cores, lambda c: (c.query_key_value, c.dense), n_heads, n_heads,
                         cores[0].head_size, layout="grouped", empty=empty_dense)
