"""Decoder language models: Llama-style attention (Llama, Qwen2, Qwen3, Mistral, Gemma 3), GPT-2, Phi-3.

All are causal (query t attends to keys <= t) and, except GPT-2, may use grouped-query attention. The stock
attention code pairs query head p with key/value head p // ``num_key_value_groups`` and infers head counts from
tensor shapes (``view(..., -1, head_dim)``), so after surgery only the per-core counts need setting -- except
Phi-3, whose forward reads the *shared* ``config.num_attention_heads`` to split its fused ``qkv_proj``: a cut
Phi-3 core gets :func:`_phi3_forward` (same computation, per-core counts) through ``modwrap``.

Found from modules: a ``ModuleList`` of layers whose ``self_attn`` has ``q_proj/k_proj/v_proj/o_proj``
(Llama style) or ``qkv_proj/o_proj`` (Phi-3), or GPT-2 blocks whose ``attn`` has ``c_attn/c_proj`` (Conv1D).
Works for the ``*ForCausalLM``, ``*ForSequenceClassification`` and base models alike.
"""

from __future__ import annotations

from torch import nn

from .base import AttentionBlock, ModelAdapter, empty_context, kept_heads, kv_sources, out_features, rotary_attention
from .registry import family


def _layer_list(model: nn.Module, attn_attr: str, needs: tuple[str, ...]) -> nn.ModuleList | None:
    for module in model.modules():
        for child in module.children():
            if isinstance(child, nn.ModuleList) and len(child) > 0:
                attn = getattr(child[0], attn_attr, None)
                if attn is not None and all(hasattr(attn, a) for a in needs):
                    return child
    return None


def _set_counts(core: nn.Module, n_query: int, n_kv: int) -> None:
    """Per-core head counts that the stock decoder attention reads (the rest it infers from shapes)."""
    if n_query and n_kv:
        core.num_key_value_groups = n_query // n_kv
    for attr, value in (("num_heads", n_query), ("num_attention_heads", n_query), ("num_key_value_heads", n_kv)):
        if hasattr(core, attr):
            setattr(core, attr, value)
    if hasattr(core, "split_size"):  # GPT-2 splits its fused c_attn output by split_size
        core.split_size = n_query * core.head_dim
    core.headprune_counts = (n_query, n_kv)  # read by _phi3_forward


def _empty_decoder(core, _inner, *args, **kwargs):
    """A decoder core with no heads: what O makes of an empty context -- its bias, or zeros.

    Computed directly: transformers' Conv1D cannot multiply a zero-width input.
    """
    out_module = getattr(core, "o_proj", None) or core.c_proj
    context = empty_context(args, kwargs)
    out = context.new_zeros(*context.shape[:-1], out_features(out_module))
    return (out if out_module.bias is None else out + out_module.bias), None


def _empty_gpt2(core, inner, *args, **kwargs):
    out, _ = _empty_decoder(core, inner, *args, **kwargs)
    return core.resid_dropout(out), None


def _decoder_adapter(arch, model, layers, cores, parts, n_heads, n_kv, head_dim, empty, counted=None):
    blocks = []
    for i, core in enumerate(cores):
        q, k, v, o = parts(core)
        kept = kept_heads(model, i, n_heads)
        blocks.append(AttentionBlock(i, core, q, k, v, o, head_dim, kept, n_heads, n_kv,
                                     kv_sources(model, i, n_heads, n_kv, kept), set_counts=_set_counts,
                                     empty_forward=empty, counted_forward=counted))
    kinds = list(getattr(model.config, "layer_types", None) or []) or None
    if kinds is not None and len(set(kinds)) < 2:
        kinds = None
    return ModelAdapter(arch, model, blocks, n_heads, len(blocks), False, list(range(len(blocks))), layers,
                        core_applies_output=True, causal=True,
                        layer_kinds=[k.replace("_attention", "") for k in kinds] if kinds else None)


def _text_config(model: nn.Module):
    config = model.config
    return getattr(config, "text_config", None) or config


@family("llama", "Llama, Qwen2, Qwen3, Mistral, Gemma 3 (text), OLMo decoders, with or without grouped-query "
        "attention")
def llama_like(model: nn.Module) -> ModelAdapter | None:
    layers = _layer_list(model, "self_attn", ("q_proj", "k_proj", "v_proj", "o_proj"))
    if layers is None:
        return None
    config = _text_config(model)
    n_heads, n_kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or \
        config.num_attention_heads
    head_dim = layers[0].self_attn.head_dim
    cores = [layer.self_attn for layer in layers]
    return _decoder_adapter(str(config.model_type), model, layers, cores,
                            lambda c: (c.q_proj, c.k_proj, c.v_proj, c.o_proj), n_heads, n_kv, head_dim,
                            _empty_decoder)


@family("phi3", "Phi-3 (fused qkv_proj)")
def phi3(model: nn.Module) -> ModelAdapter | None:
    layers = _layer_list(model, "self_attn", ("qkv_proj", "o_proj"))
    if layers is None:
        return None
    config = _text_config(model)
    n_heads, n_kv = config.num_attention_heads, config.num_key_value_heads
    cores = [layer.self_attn for layer in layers]
    return _decoder_adapter(str(config.model_type), model, layers, cores,
                            lambda c: (c.qkv_proj, c.qkv_proj, c.qkv_proj, c.o_proj), n_heads, n_kv,
                            cores[0].head_dim, _empty_decoder, _phi3_forward)


@family("gpt2", "GPT-2 (fused c_attn Conv1D)")
def gpt2(model: nn.Module) -> ModelAdapter | None:
    layers = _layer_list(model, "attn", ("c_attn", "c_proj", "split_size"))
    if layers is None:
        return None
    n_heads = model.config.n_head
    cores = [layer.attn for layer in layers]
    return _decoder_adapter("gpt2", model, layers, cores, lambda c: (c.c_attn, c.c_attn, c.c_attn, c.c_proj),
                            n_heads, n_heads, cores[0].head_dim, _empty_gpt2)


def _phi3_forward(core, _inner, hidden_states, position_embeddings, attention_mask, past_key_values=None,
                  **kwargs):
    """Phi3Attention.forward (transformers 5.23) with the query/key split read from this core's own counts."""
    hidden_shape = (*hidden_states.shape[:-1], -1, core.head_dim)
    qkv = core.qkv_proj(hidden_states)
    n_query, n_kv = core.headprune_counts
    query_pos, kv_size = n_query * core.head_dim, n_kv * core.head_dim
    query = qkv[..., :query_pos].view(hidden_shape).transpose(1, 2)
    key = qkv[..., query_pos:query_pos + kv_size].view(hidden_shape).transpose(1, 2)
    value = qkv[..., query_pos + kv_size:].view(hidden_shape).transpose(1, 2)
    out, weights = rotary_attention(core, query, key, value, position_embeddings, attention_mask, past_key_values,
                                    getattr(core.config, "sliding_window", None), **kwargs)
    return core.o_proj(out), weights
