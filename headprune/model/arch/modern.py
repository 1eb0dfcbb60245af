"""Modern encoders: DeBERTa v1, v2 and v3 (disentangled attention) and ModernBERT (fused Wqkv, rotary, local/global).

DeBERTa-v2/v3 (``DebertaV2ForSequenceClassification``)
    Disentangled attention (He et al., DeBERTa, eq. 4; the paper is not in /work/shared/papers, the form below is
    what transformers' ``DisentangledSelfAttention`` computes): per head, with relative distance δ bucketed,
        A_ij = ( q_i k_jᵀ  +  q_i (k^r_δ(i,j))ᵀ  +  k_j (q^r_δ(j,i))ᵀ ) / sqrt(3 d_h)      (content, c2p, p2c)
    where k^r, q^r project the shared relative-position table (``encoder.rel_embeddings``) through each head's own
    rows: with ``share_att_key`` (v3's default) through ``query_proj``/``key_proj`` themselves, otherwise through
    ``pos_key_proj`` (c2p) and ``pos_query_proj`` (p2c). Cutting head h must drop its rows of every one of these
    projections: the position projections are the block's ``extra_rows``, each sliced like the side it is
    multiplied with (c2p pairs query head h with position-key head h, p2c key head h with position-query head h).
    The core splits heads by its ``num_attention_heads`` and ``all_head_size``, which surgery sets. There is only
    an eager kernel, and the core returns its probabilities only when the forward is called with
    ``output_attentions=True`` (``needs_output_attentions``: capture asks). O sits in the sibling
    ``attention.output`` as in BERT, so gating is the usual pre-hook on it; the BERT live fast paths switch
    themselves off (the layer has no ``feed_forward_chunk``). Layers return ``(hidden, attn)`` tuples
    (``layer_output``), and a convolution over the embeddings is added to layer 0's output before layer 1
    (``encoder.conv``): a replay from a layer above 0 skips it (``replay_bypass``), since the recorded input of
    that layer already contains it. When SAP's whole-layer rule skips layer 0 the convolution branch stays: it
    belongs to the encoder, and layer 0 skipped means "layer 0 is the identity".
    Gnorm: with ``share_att_key`` the position table also goes through W_Q and W_K, once for the whole batch; that
    term has no per-example split, so Gnorm counts the token path only (criteria/onepass.py).

DeBERTa v1 (``DebertaForSequenceClassification``)
    The same disentangled attention with Q, K and V fused in ``in_proj`` (no bias): the core views its output as
    (..., H, 3 d_h) per head and chunks it in three, i.e. per head [q_h, k_h, v_h] -- the "grouped" layout with
    one query head per group (``base.LAYOUTS``). Biases live outside it: ``q_bias`` and ``v_bias`` (H d_h each, head
    by head) are added to each head's query and value, and are cut with them (the block's ``head_params``). The
    position projections are ``pos_proj`` (c2p, query side) and ``pos_q_proj`` (p2c, key side, with a bias).
    ``talking_head`` configs mix heads inside the attention and are refused by name.

ModernBERT (``ModernBertForSequenceClassification``)
    One fused ``Wqkv`` (Q heads, then K heads, then V heads) and ``Wo``, both without biases by default; the core
    infers its head count from the tensor shape, so surgery sets no attribute, and a core left with no heads runs
    ``_empty_modernbert``. Rotary tables and the attention mask are chosen per layer from
    ``layer.attention_type``, which the run-from-layer stand-ins read through: ``full_attention`` layers attend
    globally, ``sliding_attention`` layers within a local window. ``layer_kinds`` carries that split to the grid
    (do local heads matter less than global ones?). Eager and sdpa attention (capture switches to eager).
    In float64 the stock eager forward gives NaN logits for padded rows: its softmax runs in float32, where the
    float64 mask minimum becomes -inf, so a padded query whose local window holds only padding gets an all -inf
    row (NaN), and later layers read that NaN as a key. float32/bf16, what checkpoints run in, are unaffected.
"""

from __future__ import annotations

from torch import nn

from ...errors import UnsupportedArchitecture
from ..hooks import passthrough
from .base import AttentionBlock, ModelAdapter, empty_context, find_layers, kept_heads, kv_sources
from .encoders import empty_sibling_output, set_encoder_counts
from .registry import family


def _blocks(model: nn.Module, parts: list[tuple], n_heads: int, head_size: int, **behaviour) -> list[AttentionBlock]:
    """One multi-head block per ``(core, query, key, value, output, extra_rows)`` (no grouped-query attention)."""
    blocks = []
    for i, (core, q, k, v, o, extra) in enumerate(parts):
        kept = kept_heads(model, i, n_heads)
        blocks.append(AttentionBlock(i, core, q, k, v, o, head_size, kept, n_heads, n_heads,
                                     kv_sources(model, i, n_heads, n_heads, kept), extra_rows=extra, **behaviour))
    return blocks


# -- DeBERTa-v2/v3 -----------------------------------------------------------------------------------------------

def _deberta_core(layer: nn.Module):
    return getattr(getattr(layer, "attention", None), "self", None)


def _deberta_parts(layer: nn.Module, names: tuple[str, str] = ("pos_key_proj", "pos_query_proj"),
                   qkv: tuple[str, ...] = ("query_proj", "key_proj", "value_proj")) -> tuple:
    """Core, Q/K/V, O and the position projections, each sliced like the side it is multiplied with: c2p
    multiplies query head h by the position-key projection's head h (query side), p2c key head h by the
    position-query projection's head h (key side). ``names``: those two projections (v2: pos_key_proj /
    pos_query_proj, v1: pos_proj / pos_q_proj); ``qkv``: the Q, K, V modules (v1: one fused in_proj)."""
    core = layer.attention.self
    position = [(getattr(core, name), side) for name, side in zip(names, ("query", "key")) if hasattr(core, name)]
    q, k, v = (getattr(core, name) for name in (qkv * 3)[:3])
    return core, q, k, v, layer.attention.output.dense, position


def _deberta_adapter(model: nn.Module, layers: nn.ModuleList, parts: list[tuple], **behaviour) -> ModelAdapter:
    n_heads = model.config.num_attention_heads
    blocks = _blocks(model, parts, n_heads, parts[0][0].attention_head_size, set_counts=set_encoder_counts,
                     empty_forward=empty_sibling_output, **behaviour)
    encoder = next(m for m in model.modules() if getattr(m, "layer", None) is layers)
    conv = getattr(encoder, "conv", None)
    bypass = {conv: passthrough(1, "residual_states")} if conv is not None else {}
    return ModelAdapter(str(model.config.model_type), model, blocks, n_heads, len(blocks), False,
                        list(range(len(blocks))), layers, core_applies_output=False,
                        layer_output=lambda hidden: (hidden, None), replay_bypass=bypass,
                        needs_output_attentions=True)


@family("deberta-v2", "DeBERTa-v2/v3: disentangled attention with per-head relative-position projections")
def deberta_v2(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _deberta_core, ("query_proj", "key_proj", "value_proj", "pos_att_type"))
    if layers is None:
        return None
    return _deberta_adapter(model, layers, [_deberta_parts(layer) for layer in layers])


@family("deberta", "DeBERTa (v1): fused head-interleaved in_proj, per-head q_bias / v_bias, relative positions")
def deberta_v1(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, _deberta_core, ("in_proj", "q_bias", "v_bias", "pos_att_type"))
    if layers is None:
        return None
    if layers[0].attention.self.talking_head:
        raise UnsupportedArchitecture(
            "This DeBERTa config has talking_head: its attention mixes the logits and probabilities of all heads "
            "through head x head projections, so a head's removal changes the others and no cut can equal a gate. "
            "Accepted: talking_head false (every released DeBERTa checkpoint).")
    adapter = _deberta_adapter(model, layers, [_deberta_parts(layer, ("pos_proj", "pos_q_proj"), ("in_proj",))
                                               for layer in layers], layout="grouped")
    for block in adapter.blocks:   # added to each head's query and value after in_proj, d_h entries per head
        block.head_params = [(block.core, "q_bias"), (block.core, "v_bias")]
    return adapter


# -- ModernBERT ---------------------------------------------------------------------------------------------------

def _empty_modernbert(core, _inner, *args, **kwargs):
    """A ModernBERT core with no heads: Wo of an empty context (its bias, or zeros), as its forward returns."""
    return core.out_drop(core.Wo(empty_context(args, kwargs))), None


@family("modernbert", "ModernBERT: fused Wqkv, rotary positions, alternating global and local (sliding) layers")
def modernbert(model: nn.Module) -> ModelAdapter | None:
    layers = find_layers(model, lambda layer: getattr(layer, "attn", None), ("Wqkv", "Wo"))
    if layers is None or not hasattr(layers[0], "attention_type"):
        return None
    n_heads = model.config.num_attention_heads
    parts = [(layer.attn, layer.attn.Wqkv, layer.attn.Wqkv, layer.attn.Wqkv, layer.attn.Wo, []) for layer in layers]
    blocks = _blocks(model, parts, n_heads, layers[0].attn.head_dim, empty_forward=_empty_modernbert)
    kinds = [str(layer.attention_type).replace("_attention", "") for layer in layers]
    return ModelAdapter("modernbert", model, blocks, n_heads, len(blocks), False, list(range(len(blocks))), layers,
                        core_applies_output=True, layer_kinds=kinds if len(set(kinds)) > 1 else None)
