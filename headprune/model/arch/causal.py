"""Decoders beyond the Llama layout: GPT-J, GPT-Neo, OPT, Phi-1/1.5/2, OLMo 2 (also OLMo 3, OLMoE) and gpt-oss.

All are causal language models; each is found by the shape of its attention core, never by its name:

GPT-J (``attn`` with ``q_proj/k_proj/v_proj/out_proj`` and ``rotary_dim``)
    Rotary on the first ``rotary_dim`` features of each head (partial rotary), attention and MLP in parallel off
    one LayerNorm. Both are per head or per token, so a cut is exact with the count ``num_attention_heads`` set.
    Its attention is computed in its own code (``GPTJAttention._attn``), not through transformers' registered
    attention functions, so a KV cache plan -- which replaces those functions -- is refused by name
    (``refuses["kv"]``).
GPT-Neo (``attn.attention`` with ``q_proj/k_proj/v_proj/out_proj`` and ``attention_type``)
    Global and local (a causal window of ``window_size`` keys) layers alternate; ``layer_kinds`` marks them
    "full" / "sliding" on the grid. No 1/sqrt(d) scaling (as trained). Own attention code: no KV plan.
OPT (``self_attn`` with ``q_proj/k_proj/v_proj/out_proj`` and ``enable_bias``)
    Biases everywhere; the query is scaled before the registered attention function (called with scaling 1).
Phi-1/1.5/2 (``self_attn`` with ``q_proj/k_proj/v_proj/dense`` and ``rotary_ndims``)
    Partial rotary, biases, a parallel block, optional per-head q/k LayerNorms (over one head's features, so
    per head).
OLMo 2 (``self_attn`` with a ``q_norm`` whose weight spans every head's query features)
    ``q_norm`` / ``k_norm`` are RMSNorms over all heads at once: head h's query is divided by
    sqrt(mean over ALL heads' query features² + eps). Removing head g's Q rows would change every kept head's
    query, so a cut that slices Q/K like other families is not exact (tests/test_more_families.py shows by how
    much). headprune cuts exactly instead: the Q and K rows of every original head stay (with the norms); V rows
    and O columns of the removed heads go, and the cut core's forward (:func:`_all_head_norm_forward`) computes
    the norms over all heads and then attends with the kept heads only (``AttentionBlock.norm_spans_heads``).
    What the cut saves: the removed heads' V and O parameters and their whole attention (scores, softmax,
    context); the Q/K projections keep their size. Gating needs nothing special (a zero gate on the context
    leaves the norms' inputs as they are). The same forward serves OLMo 3 (sliding layers) and OLMoE
    (``clip_qkv``), which share the layout.
gpt-oss (``self_attn`` with ``q_proj/k_proj/v_proj/o_proj`` and ``sinks``)
    A learned per-head sink logit joins each softmax (``s_aux``): sliced with the heads (``head_params``).
    Sliding and full layers alternate (``layer_types``); the MLP is a mixture of experts, untouched by head
    work. transformers has no sdpa kernel for it: eager only.
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from .base import (
    AttentionBlock,
    ModelAdapter,
    empty_context,
    find_layers,
    kept_heads,
    kv_sources,
    out_features,
    own_attention_refusal,
)
from .registry import family


def set_counts(core: nn.Module, n_query: int, n_kv: int) -> None:
    """The per-core head counts these cores read (every other size they infer from tensor shapes)."""
    if n_query and n_kv and hasattr(core, "num_key_value_groups"):
        core.num_key_value_groups = n_query // n_kv
    for attr, value in (("num_heads", n_query), ("num_attention_heads", n_query), ("num_key_value_heads", n_kv)):
        if hasattr(core, attr):
            setattr(core, attr, value)


def empty_forward(output_name: str):
    """The forward of a core left with no heads: what its O (``output_name``) makes of an empty context -- its
    bias or zeros, computed directly (a zero-width matmul is not needed) -- through the core's residual dropout
    where it has one, and no attention probabilities."""

    def forward(core, _inner, *args, **kwargs):
        out_module = getattr(core, output_name)
        context = empty_context(args, kwargs)
        out = context.new_zeros(*context.shape[:-1], out_features(out_module))
        out = out if out_module.bias is None else out + out_module.bias
        dropout = getattr(core, "resid_dropout", None)
        return (out if dropout is None else dropout(out)), None

    return forward


def _adapter(model: nn.Module, layers: nn.ModuleList, cores: list[nn.Module], names: tuple[str, str, str, str],
             n_heads: int, n_kv: int, *, kinds: list[str] | None = None, **options) -> ModelAdapter:
    """One block per layer: Q/K/V/O are the core's attributes ``names``; ``options`` split between the block's
    behaviour (``norm_spans_heads``, ``counted_forward``, ``head_params`` as attribute names) and the adapter's
    (``layer_output``, ``refuses``)."""
    head_params = options.pop("head_params", ())
    block_options = {k: options.pop(k) for k in ("norm_spans_heads", "counted_forward") if k in options}
    blocks = []
    for i, core in enumerate(cores):
        kept = kept_heads(model, i, n_heads)
        blocks.append(AttentionBlock(i, core, *(getattr(core, n) for n in names), core.head_dim, kept, n_heads, n_kv,
                                     kv_sources(model, i, n_heads, n_kv, kept), set_counts=set_counts,
                                     empty_forward=empty_forward(names[3]),
                                     head_params=[(core, p) for p in head_params], **block_options))
    kinds = [k.replace("_attention", "") for k in kinds] if kinds and len(set(kinds)) > 1 else None
    return ModelAdapter(str(model.config.model_type), model, blocks, n_heads, len(blocks), False,
                        list(range(len(blocks))), layers, core_applies_output=True, causal=True, layer_kinds=kinds,
                        **options)


def _tuple_layer(hidden: torch.Tensor):
    """GPT-J and GPT-Neo blocks return (hidden states, attention weights); the model reads item 0."""
    return hidden, None


@family("gptj", "GPT-J: partial rotary, attention and MLP in parallel")
def gptj(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "attn", None),
                         ("q_proj", "k_proj", "v_proj", "out_proj", "rotary_dim", "embed_positions"))
    if layers is None:
        return None
    n_heads = model.config.num_attention_heads   # the config's: a cut core holds fewer
    return _adapter(model, layers, [layer.attn for layer in layers], ("q_proj", "k_proj", "v_proj", "out_proj"),
                    n_heads, n_heads, layer_output=_tuple_layer, refuses={"kv": own_attention_refusal("GPT-J")})


def _neo_core(layer: nn.Module) -> nn.Module | None:
    return getattr(getattr(layer, "attn", None), "attention", None)


@family("gpt-neo", "GPT-Neo: alternating global and local (windowed) layers")
def gpt_neo(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _neo_core, ("q_proj", "k_proj", "v_proj", "out_proj", "attention_type"))
    if layers is None:
        return None
    cores = [_neo_core(layer) for layer in layers]
    kinds = ["full" if core.attention_type == "global" else "sliding" for core in cores]
    n_heads = model.config.num_attention_heads
    return _adapter(model, layers, cores, ("q_proj", "k_proj", "v_proj", "out_proj"), n_heads, n_heads, kinds=kinds,
                    layer_output=_tuple_layer, refuses={"kv": own_attention_refusal("GPT-Neo")})


def _self_attn(layer: nn.Module) -> nn.Module | None:
    return getattr(layer, "self_attn", None)


@family("opt", "OPT")
def opt(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _self_attn, ("q_proj", "k_proj", "v_proj", "out_proj", "enable_bias"))
    if layers is None:
        return None
    n_heads = model.config.num_attention_heads
    return _adapter(model, layers, [layer.self_attn for layer in layers], ("q_proj", "k_proj", "v_proj", "out_proj"),
                    n_heads, n_heads)


def _config_heads(model: nn.Module) -> tuple[int, int]:
    config = getattr(model.config, "text_config", None) or model.config
    n_heads = config.num_attention_heads
    return n_heads, getattr(config, "num_key_value_heads", None) or n_heads


@family("phi", "Phi-1, Phi-1.5, Phi-2: partial rotary, biases, parallel block")
def phi(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _self_attn, ("q_proj", "k_proj", "v_proj", "dense", "rotary_ndims"))
    if layers is None:
        return None
    return _adapter(model, layers, [layer.self_attn for layer in layers], ("q_proj", "k_proj", "v_proj", "dense"),
                    *_config_heads(model))


def _norm_spans_heads(core: nn.Module) -> bool:
    norm = getattr(core, "q_norm", None)
    weight = getattr(norm, "weight", None)
    return weight is not None and weight.numel() == out_features(core.q_proj) and weight.numel() != core.head_dim


@family("olmo2", "OLMo 2, OLMo 3, OLMoE: a query/key RMSNorm over all heads (cut exactly, Q/K rows kept for it)")
def olmo2(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _self_attn, ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm"))
    if layers is None or not _norm_spans_heads(layers[0].self_attn):
        return None
    config = getattr(model.config, "text_config", None) or model.config
    return _adapter(model, layers, [layer.self_attn for layer in layers], ("q_proj", "k_proj", "v_proj", "o_proj"),
                    *_config_heads(model), kinds=list(getattr(config, "layer_types", None) or []),
                    norm_spans_heads=True, counted_forward=_all_head_norm_forward)


@family("gpt-oss", "gpt-oss: learned per-head attention sinks, sliding and full layers, mixture of experts")
def gpt_oss(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _self_attn, ("q_proj", "k_proj", "v_proj", "o_proj", "sinks"))
    if layers is None:
        return None
    config = getattr(model.config, "text_config", None) or model.config
    return _adapter(model, layers, [layer.self_attn for layer in layers], ("q_proj", "k_proj", "v_proj", "o_proj"),
                    *_config_heads(model), kinds=list(getattr(config, "layer_types", None) or []),
                    head_params=("sinks",))


def _all_head_norm_forward(core, _inner, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                           **kwargs):
    """Olmo2Attention.forward (transformers 5.23; OLMo 3 and OLMoE add a sliding window and ``clip_qkv``) on a cut
    core whose Q/K rows hold every original head (module doc): norms over all heads, then the kept query heads
    and the key heads of the groups the core holds (``headprune_layout``, original ids) attend."""
    mod = sys.modules[type(core).__module__]
    kept, sources = core.headprune_layout
    input_shape = hidden_states.shape[:-1]
    hidden_shape = (*input_shape, -1, core.head_dim)
    query = core.q_norm(core.q_proj(hidden_states))
    key = core.k_norm(core.k_proj(hidden_states))
    value = core.v_proj(hidden_states)
    clip = getattr(core.config, "clip_qkv", None)
    if clip is not None:
        for states in (query, key, value):
            states.clamp_(min=-clip, max=clip)

    def heads(states, ids):
        return states.view(hidden_shape).index_select(-2, torch.tensor(ids, device=states.device)).transpose(1, 2)

    query, key, value = heads(query, kept), heads(key, sources), value.view(hidden_shape).transpose(1, 2)
    cos, sin = position_embeddings
    query, key = mod.apply_rotary_pos_emb(query, key, cos, sin)
    if past_key_values is not None:
        key, value = past_key_values.update(key, value, core.layer_idx)
    interface = mod.ALL_ATTENTION_FUNCTIONS.get_interface(core.config._attn_implementation,
                                                          mod.eager_attention_forward)
    window = core.sliding_window if hasattr(core, "sliding_window") else getattr(core.config, "sliding_window", None)
    out, weights = interface(core, query, key, value, attention_mask,
                             dropout=0.0 if not core.training else core.attention_dropout, scaling=core.scaling,
                             **({"sliding_window": window} if window is not None else {}), **kwargs)
    return core.o_proj(out.reshape(*input_shape, -1).contiguous()), weights
