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

import torch
from torch import nn

from .base import (
    ModelAdapter,
    empty_context,
    find_layers,
    make_block,
    out_features,
    own_attention_refusal,
    rotary_attention,
    submodule,
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


OUT_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")
O_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


def _adapter(model: nn.Module, core_of, needs: tuple[str, ...], names: tuple[str, str, str, str], *,
             kinds=None, accept=None, **options) -> ModelAdapter | None:
    """The adapter of a model whose layers' cores (``core_of(layer)``) have Q/K/V/O as attributes ``names`` and
    every attribute of ``needs`` (and pass ``accept(core)``), or None. One multi- or grouped-query block per
    layer, head counts from the config (a cut core holds fewer). ``kinds(cores)``: each layer's attention kind;
    ``options`` split between the block's behaviour (``norm_spans_heads``, ``counted_forward``, ``head_params`` as
    attribute names) and the adapter's (``layer_output``, ``refuses``)."""
    layers = find_layers(model, core_of, names + needs)
    if layers is None or (accept is not None and not accept(core_of(layers[0]))):
        return None
    cores = [core_of(layer) for layer in layers]
    config = getattr(model.config, "text_config", None) or model.config
    n_heads = config.num_attention_heads
    n_kv = getattr(config, "num_key_value_heads", None) or n_heads
    head_params = options.pop("head_params", ())
    block_options = {k: options.pop(k) for k in ("norm_spans_heads", "counted_forward") if k in options}
    blocks = [make_block(model, i, core, tuple(getattr(core, n) for n in names), core.head_dim, n_heads, n_kv,
                         set_counts=set_counts, empty_forward=empty_forward(names[3]),
                         head_params=[(core, p) for p in head_params], **block_options) for i, core in enumerate(cores)]
    kinds = [k.replace("_attention", "") for k in (kinds(cores) if kinds else [])]
    return ModelAdapter(str(model.config.model_type), model, blocks, n_heads, len(blocks), False,
                        list(range(len(blocks))), layers, core_applies_output=True, causal=True,
                        layer_kinds=kinds if len(set(kinds)) > 1 else None, **options)


def _tuple_layer(hidden: torch.Tensor):
    """GPT-J and GPT-Neo blocks return (hidden states, attention weights); the model reads item 0."""
    return hidden, None


def _config_kinds(model: nn.Module):
    """Each layer's attention kind as the config lists it (``layer_types``: sliding / full), for ``_adapter``."""
    config = getattr(model.config, "text_config", None) or model.config
    return lambda _cores: list(getattr(config, "layer_types", None) or [])


@family("gptj", "GPT-J: partial rotary, attention and MLP in parallel")
def gptj(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("attn"), ("rotary_dim", "embed_positions"), OUT_PROJ,
                    layer_output=_tuple_layer, refuses={"kv": own_attention_refusal("GPT-J")})


@family("gpt-neo", "GPT-Neo: alternating global and local (windowed) layers")
def gpt_neo(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("attn.attention"), ("attention_type",), OUT_PROJ,
                    kinds=lambda cores: ["full" if c.attention_type == "global" else "sliding" for c in cores],
                    layer_output=_tuple_layer, refuses={"kv": own_attention_refusal("GPT-Neo")})


@family("opt", "OPT")
def opt(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("self_attn"), ("enable_bias",), OUT_PROJ)


@family("phi", "Phi-1, Phi-1.5, Phi-2: partial rotary, biases, parallel block")
def phi(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("self_attn"), ("rotary_ndims",), ("q_proj", "k_proj", "v_proj", "dense"))


def _norm_spans_heads(core: nn.Module) -> bool:
    weight = getattr(core.q_norm, "weight", None)
    return weight is not None and weight.numel() == out_features(core.q_proj) and weight.numel() != core.head_dim


@family("olmo2", "OLMo 2, OLMo 3, OLMoE: a query/key RMSNorm over all heads (cut exactly, Q/K rows kept for it)")
def olmo2(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("self_attn"), ("q_norm", "k_norm"), O_PROJ, accept=_norm_spans_heads,
                    kinds=_config_kinds(model), norm_spans_heads=True, counted_forward=_all_head_norm_forward)


@family("gpt-oss", "gpt-oss: learned per-head attention sinks, sliding and full layers, mixture of experts")
def gpt_oss(model: nn.Module) -> ModelAdapter | None:
    return _adapter(model, submodule("self_attn"), ("sinks",), O_PROJ, kinds=_config_kinds(model),
                    head_params=("sinks",))


def _all_head_norm_forward(core, _inner, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                           **kwargs):
    """Olmo2Attention.forward (transformers 5.23; OLMo 3 and OLMoE add a sliding window and ``clip_qkv``) on a cut
    core whose Q/K rows hold every original head (module doc): norms over all heads, then the kept query heads
    and the key heads of the groups the core holds (``headprune_layout``, original ids) attend."""
    kept, sources = core.headprune_layout
    hidden_shape = (*hidden_states.shape[:-1], -1, core.head_dim)
    query = core.q_norm(core.q_proj(hidden_states))
    key = core.k_norm(core.k_proj(hidden_states))
    value = core.v_proj(hidden_states)
    clip = getattr(core.config, "clip_qkv", None)
    if clip is not None:
        for states in (query, key, value):
            states.clamp_(min=-clip, max=clip)

    def heads(states, ids):
        return states.view(hidden_shape).index_select(-2, torch.tensor(ids, device=states.device)).transpose(1, 2)

    window = core.sliding_window if hasattr(core, "sliding_window") else getattr(core.config, "sliding_window", None)
    out, weights = rotary_attention(core, heads(query, kept), heads(key, sources),
                                    value.view(hidden_shape).transpose(1, 2), position_embeddings, attention_mask,
                                    past_key_values, window, **kwargs)
    return core.o_proj(out), weights
