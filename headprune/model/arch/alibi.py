"""Decoders that compute attention in their own code, with ALiBi position biases: BLOOM, Falcon, MPT.

ALiBi (Press et al., "Train Short, Test Long", ICLR 2022, eq. in §3; the paper is not in /work/shared/papers):
head h adds m_h · (j - i) to the logit of query i and key j, with a fixed slope m_h per head (a geometric series in
h). The model builds that bias once per forward for *all* heads from the shared config (BLOOM, Falcon: a
(B·H, 1, T) tensor; Falcon adds it to a per-head (B, H, T, T) mask too; MPT: (H, 1, S)) and hands it to every
layer. After a cut a layer holds fewer heads, in surgery's order, so each kept head must still get *its own*
slope: the core gets a forward (``hooks.wrap_forward``, installed by surgery) that slices those tensors to the
layer's kept heads (``core.headprune_layout[0]``, in weight order) before the stock forward runs. Reading the kept
heads from the core, not the config, is what lets every layer keep a different set.

BLOOM (``BloomForCausalLM``)
    ``self_attention.query_key_value`` interleaved per head [q_h, k_h, v_h] ("grouped" layout, one query head per
    group); the core applies O (``dense``), dropout and the residual itself, and reads its head count from
    ``num_heads``. With ``pretraining_tp > 1`` and ``slow_but_exact`` it multiplies O's weight in slices without
    calling O, so no gate could reach the heads: such a config is refused by name.
Falcon (``FalconForCausalLM``)
    Three layouts of ``query_key_value``, all one description: the new decoder architecture (Falcon-40B/180B)
    groups per key/value head [q_1 .. q_g, k, v] ("grouped", g = H / H_kv); the old one is per head [q, k, v]
    (multi-head, Falcon-RW) or all query heads then one key and one value head (multi-query, Falcon-7B:
    "blocks" with H_kv = 1). The new architecture broadcasts each group's key/value to its query heads, so a
    cut's key/value heads are the groups surgery keeps (``num_kv_heads``). Rotary or ALiBi; attention and MLP in
    parallel or in sequence; O is ``dense``.
MPT (``MptForCausalLM``)
    ``Wqkv`` holds Q | K | V ("blocks"); ``clip_qkv`` clamps every feature of its output to [-c, c] one by one,
    so slicing rows before the clamp is the clamp of the sliced rows. ALiBi always; O is ``out_proj``; the head
    count is the core's ``n_heads``.

None of the three calls transformers' attention functions, where a KV cache plan's restriction runs
(``headprune.kvcache.restrict``), and ALiBi biases are built from positions over the whole mask: a plan would be
ignored, so every KV path refuses them by name (``ModelAdapter.refuses["kv"]``), before weights load where the
model is a local folder (``loading.declared_refusal``). Their blocks return ``(hidden, attention)`` pairs
(``layer_output``); eager attention returns the probabilities (capture switches to it).
"""

from __future__ import annotations

import sys

import torch
from torch import nn

from ...errors import UnsupportedArchitecture
from .base import ModelAdapter, empty_context, find_layers, own_attention_refusal
from .fused import counts_setter, empty_dense, fused_decoder
from .registry import family


def _refuses(name: str, alibi: bool) -> dict[str, str]:
    """The paths a family of this module refuses: KV cache plans (module doc), said with ALiBi's own reason too."""
    why = (" Its ALiBi biases are also built from token positions over the whole attention mask, which a streaming "
           "head's ring of S + W keys would not match.") if alibi else ""
    return {"kv": own_attention_refusal(name) + why}


def _fold_kept(bias: torch.Tensor, kept: list[int], batch: int) -> torch.Tensor:
    """The ``kept`` heads' rows of an ALiBi tensor, in that order: (B·H, 1, T) rows folded into the batch ->
    (B·h, 1, T); (B, H, 1, T) -> (B, h, 1, T) (Falcon unfolds it when it adds it to the mask)."""
    if bias.ndim == 4:
        return bias[:, kept]
    return bias.view(batch, -1, *bias.shape[1:])[:, kept].flatten(0, 1)


def _pair_output(hidden: torch.Tensor):
    return hidden, None


# -- BLOOM ----------------------------------------------------------------------------------------------------------

def _bloom_forward(core, inner, hidden_states, *args, alibi, **kwargs):
    """BloomAttention.forward with the ALiBi rows of this core's kept heads (module doc)."""
    return inner(hidden_states, *args, alibi=_fold_kept(alibi, core.headprune_layout[0], hidden_states.shape[0]),
                 **kwargs)


def _empty_bloom(core, _inner, *args, **kwargs):
    """BLOOM with no heads: O of an empty context (its bias), then BLOOM's own dropout and residual add."""
    residual = args[1] if len(args) > 1 else kwargs["residual"]
    out = core.dense(empty_context(args, kwargs))
    return sys.modules[type(core).__module__].dropout_add(out, residual, core.hidden_dropout, core.training), None


@family("bloom", "BLOOM: ALiBi, fused head-interleaved query_key_value")
def bloom(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "self_attention", None),
                         ("query_key_value", "dense", "slow_but_exact", "pretraining_tp"))
    if layers is None:
        return None
    cores = [layer.self_attention for layer in layers]
    if cores[0].pretraining_tp > 1 and cores[0].slow_but_exact:
        raise UnsupportedArchitecture(
            f"This BLOOM config has slow_but_exact with pretraining_tp={cores[0].pretraining_tp}: its attention "
            "multiplies the output projection's weight in slices without calling the projection, where headprune "
            "gates each head, so a mask would be ignored. Accepted: slow_but_exact false (the default; the same "
            "function up to rounding) -- set it in config.json.")
    n_heads = model.config.n_head
    return fused_decoder(model, layers, cores, lambda c: (c.query_key_value, c.dense), n_heads, n_heads,
                         cores[0].head_dim, layout="grouped", empty=_empty_bloom, counted=_bloom_forward,
                         set_counts=counts_setter("num_heads"), layer_output=_pair_output,
                         refuses=_refuses("BLOOM", alibi=True))


# -- Falcon ---------------------------------------------------------------------------------------------------------

def _falcon_forward(core, inner, hidden_states, *args, alibi=None, attention_mask=None, **kwargs):
    """FalconAttention.forward with the ALiBi rows -- and the per-head mask Falcon adds them to -- of this core's
    kept heads; unchanged for rotary Falcons (no ALiBi, a mask shared by all heads)."""
    if alibi is not None:
        kept = core.headprune_layout[0]
        alibi = _fold_kept(alibi, kept, hidden_states.shape[0])
        if attention_mask is not None and attention_mask.ndim == 4 and attention_mask.shape[1] > 1:
            attention_mask = attention_mask[:, kept]
    return inner(hidden_states, *args, alibi=alibi, attention_mask=attention_mask, **kwargs)


@family("falcon", "Falcon: old and new decoder architecture, multi-query and grouped, fused QKV, rotary or ALiBi")
def falcon(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "self_attention", None),
                         ("query_key_value", "dense", "new_decoder_architecture", "multi_query", "num_kv_heads"))
    if layers is None:
        return None
    cores = [layer.self_attention for layer in layers]
    config = model.config
    n_heads = config.num_attention_heads
    n_kv = config.num_kv_heads if config.new_decoder_architecture else 1 if config.multi_query else n_heads
    layout = "blocks" if not config.new_decoder_architecture and config.multi_query else "grouped"
    return fused_decoder(model, layers, cores, lambda c: (c.query_key_value, c.dense), n_heads, n_kv,
                         cores[0].head_dim, layout=layout, empty=empty_dense, counted=_falcon_forward,
                         set_counts=counts_setter("num_heads", "num_kv_heads"), layer_output=_pair_output,
                         refuses=_refuses("Falcon", alibi=bool(config.alibi)))


# -- MPT ------------------------------------------------------------------------------------------------------------

def _mpt_forward(core, inner, hidden_states, position_bias, *args, **kwargs):
    """MptAttention.forward with the ALiBi rows (H, 1, S) of this core's kept heads."""
    if position_bias is not None:
        position_bias = position_bias[core.headprune_layout[0]]
    return inner(hidden_states, position_bias, *args, **kwargs)


def _empty_mpt(core, _inner, *args, **kwargs):
    return core.out_proj(empty_context(args, kwargs)), None


@family("mpt", "MPT: ALiBi, fused Wqkv, clip_qkv")
def mpt(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "attn", None), ("Wqkv", "out_proj", "clip_qkv"))
    if layers is None:
        return None
    cores = [layer.attn for layer in layers]
    n_heads = model.config.n_heads
    return fused_decoder(model, layers, cores, lambda c: (c.Wqkv, c.out_proj), n_heads, n_heads,
                         cores[0].head_dim, layout="blocks", empty=_empty_mpt, counted=_mpt_forward,
                         set_counts=counts_setter("n_heads"), layer_output=_pair_output,
                         refuses=_refuses("MPT", alibi=True))
