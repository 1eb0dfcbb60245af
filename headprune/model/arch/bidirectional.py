"""Encoders beyond the BERT layout: MPNet, Longformer, XLM and Nystromformer (found by the shape of their cores).

MPNet (``attention.attn`` with ``q/k/v/o``; the encoder holds ``relative_attention_bias``)
    The relative-position bias B (batch, H, T, T) is computed ONCE by the encoder, one column of
    ``relative_attention_bias`` per head, and handed to every layer: score_h = q_h k_hᵀ / sqrt(d) + B_h. A layer
    cut to heads K must add B_K, the bias of its own kept heads (original ids, ``headprune_layout``), while the
    shared table keeps all H columns for the other layers: the cut core's forward (:func:`_mpnet_forward`)
    selects them. O is inside the core. Probabilities only when asked (``output_attentions``).
Longformer (``attention.self`` with ``query/key/value`` and ``query_global/key_global/value_global``)
    Local attention in a window of ``attention_window`` tokens, plus global tokens (the classifier's [CLS]) that
    attend to, and are attended by, every token through their own projections. A head is its rows in all six
    projections (the global ones are ``extra_rows``) and its O columns (in the sibling ``attention.output``).
    The stock forward reshapes the heads' context to the hidden size, so a cut core runs
    :func:`_longformer_forward` (the same computation, reshaped to the live heads). Its probabilities come in a
    banded form (per query: the global keys, then the 2w+1 window); :func:`longformer_maps` scatters them into
    (B, H, T, T) maps, the global tokens' own rows included. The model pads the sequence to a multiple of the
    window inside its forward, so maps and activations are T_pad long; readers crop them to the batch's T (the
    padding is masked: it neither attends nor is attended). Its projections see (T, B, features). The Taylor
    criterion, which needs the gradient at the maps the model computes with, is refused (``refuses``).
XLM (``attentions``: a ModuleList of cores with ``q_lin/k_lin/v_lin/out_lin`` and ``n_heads``)
    Attention, FFN and norms live in parallel ModuleLists of the model, not in one module per layer, so there is
    no per-layer module to replay from (``layer_modules`` None: callers run whole passes, as for ALBERT).
    Causal when its config says so (XLM-CLM).
Nystromformer (``attention.self`` with ``query/key/value``, ``num_landmarks`` and a depthwise ``conv``)
    A convolution over each head's values along the sequence (``groups`` = heads) is added to the context: its
    kernel per head is sliced with the head (``head_params``) and its channel counts set. headprune covers the
    exact softmax configuration (``num_landmarks == segment_means_seq_len``). The Nyström approximation
    (fewer landmarks) is refused: its pseudo-inverse starts from 1 / max over ALL heads and examples of a column
    sum, which couples heads (gated != cut) and examples, and it needs inputs of exactly
    ``segment_means_seq_len`` tokens.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ...errors import UnsupportedArchitecture
from .base import (
    AttentionBlock,
    ModelAdapter,
    empty_context,
    find_layers,
    make_block,
    own_attention_refusal,
    submodule,
)
from .registry import family


def _blocks(model: nn.Module, parts: list[tuple], n_heads: int, head_size: int, empty, **behaviour):
    """One multi-head block per ``(core, query, key, value, output)`` in ``parts``; ``behaviour``: functions of
    the core giving the block's further fields."""
    return [make_block(model, i, core, tuple(qkvo), head_size, n_heads, n_heads, set_counts=_set_heads,
                       empty_forward=empty, **{k: f(core) for k, f in behaviour.items()})
            for i, (core, *qkvo) in enumerate(parts)]


def _tuple_layer(hidden: torch.Tensor):
    """These encoders' layers return (hidden states, attention weights); the encoder reads item 0."""
    return hidden, None


def _set_heads(core: nn.Module, n_query: int, _n_kv: int) -> None:
    """Head counts the cores read (MPNet and Nystromformer also size their context by ``all_head_size``)."""
    for attr in ("num_attention_heads", "num_heads", "n_heads"):
        if hasattr(core, attr):
            setattr(core, attr, n_query)
    if hasattr(core, "all_head_size"):
        core.all_head_size = n_query * core.attention_head_size
    conv = getattr(core, "conv", None)
    if conv is not None and n_query:   # Nystromformer's depthwise convolution: one channel (group) per head
        conv.in_channels = conv.out_channels = conv.groups = n_query


def _empty_inner_output(output_name: str):
    """A core applying O itself, left with no heads: O of an empty context (its bias), and no probabilities (the
    callers read item 1 only when they asked for probabilities, and then take None as a layer without maps)."""

    def forward(core, _inner, *args, **kwargs):
        return getattr(core, output_name)(empty_context(args, kwargs)), None

    return forward


def _empty_sibling(core, _inner, *args, **kwargs):
    """O in the sibling output module: an empty context, to which O adds only its bias; no probabilities."""
    return empty_context(args, kwargs), None


def _sibling_output(layer: nn.Module, core: nn.Module) -> tuple:
    """Q/K/V in the core, O in the layer's ``attention.output`` (BERT's layout)."""
    return core.query, core.key, core.value, layer.attention.output.dense


def _encoder(model: nn.Module, core_of, needs: tuple[str, ...], parts_of, empty, *, accept=None, block=None,
             **options) -> ModelAdapter | None:
    """The adapter of an encoder whose layers' cores (``core_of(layer)``) have every attribute of ``needs``, or
    None; ``parts_of(layer, core)`` gives Q/K/V/O, ``accept(core)`` may refuse the model by name, ``block`` the
    blocks' further behaviour (each a function of the core), ``options`` the adapter's. Layers return tuples and
    the cores give probabilities only when asked, in all four families."""
    layers = find_layers(model, core_of, needs)
    if layers is None:
        return None
    cores = [core_of(layer) for layer in layers]
    if accept is not None:
        accept(cores[0])
    n_heads = model.config.num_attention_heads   # the config's: a cut core holds fewer
    head_size = getattr(cores[0], "attention_head_size", None) or cores[0].head_dim
    blocks = _blocks(model, [(c, *parts_of(layer, c)) for layer, c in zip(layers, cores)], n_heads, head_size,
                     empty, **(block or {}))
    return ModelAdapter(str(model.config.model_type), model, blocks, n_heads, len(blocks), False,
                        list(range(len(blocks))), layers, layer_output=_tuple_layer, needs_output_attentions=True,
                        **options)


# -- MPNet ----------------------------------------------------------------------------------------------------

@family("mpnet", "MPNet (sentence-transformers' encoders): a per-head relative-position bias shared by all layers")
def mpnet(model: nn.Module) -> ModelAdapter | None:
    return _encoder(model, submodule("attention.attn"), ("q", "k", "v", "o", "attention_head_size"),
                    lambda _layer, c: (c.q, c.k, c.v, c.o), _empty_inner_output("o"), core_applies_output=True,
                    block={"counted_forward": lambda _core: _mpnet_forward})


def _mpnet_forward(core, inner, hidden_states, attention_mask=None, position_bias=None, *args, **kwargs):
    """MPNetSelfAttention on a cut core: the shared bias of its own kept heads (original ids)."""
    if position_bias is not None:
        kept = torch.tensor(core.headprune_layout[0], device=position_bias.device)
        position_bias = position_bias.index_select(1, kept)
    return inner(hidden_states, attention_mask, position_bias, *args, **kwargs)


# -- Longformer -----------------------------------------------------------------------------------------------

@family("longformer", "Longformer: local windowed and global attention, each with its own projections")
def longformer(model: nn.Module) -> ModelAdapter | None:
    return _encoder(model, submodule("attention.self"),
                    ("query", "key", "value", "query_global", "key_global", "value_global"), _sibling_output,
                    _empty_longformer, core_applies_output=False, attention_probs=longformer_maps,
                    sequence_first=True, refuses={"taylor": TAYLOR_REFUSAL},
                    block={"counted_forward": lambda _core: _longformer_forward,
                           "extra_rows": lambda c: [(c.query_global, "query"), (c.key_global, "key"),
                                                    (c.value_global, "key")]})


TAYLOR_REFUSAL = ("Taylor (Σ A ∂o/∂A) needs the gradient at the attention map the model computes with; Longformer "
                  "computes with banded probabilities and headprune assembles its T x T maps from them afterwards, so "
                  "the gradient never reaches those maps. Every other criterion runs on Longformer (his is the "
                  "closest: the gradient at each head's gate).")


def _longformer_forward(core, _inner, hidden_states, attention_mask=None, is_index_masked=None,
                        is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    """LongformerSelfAttention.forward (transformers 5.23) on a cut core: the same steps through the core's own
    helpers, with the context reshaped to the live heads (the stock forward reshapes it to the hidden size)."""
    hidden_states = hidden_states.transpose(0, 1)
    seq_len, batch_size, _ = hidden_states.size()
    n, d, w = core.num_heads, core.head_dim, core.one_sided_attn_window_size

    def heads(states):
        return states.view(seq_len, batch_size, n, d).transpose(0, 1)

    query, key = heads(core.query(hidden_states) / math.sqrt(d)), heads(core.key(hidden_states))
    value = heads(core.value(hidden_states))
    scores = core._sliding_chunks_query_key_matmul(query, key, w)
    removed = (attention_mask != 0)[:, :, None, None]
    float_mask = removed.type_as(query).masked_fill(removed, torch.finfo(query.dtype).min)
    scores = scores + core._sliding_chunks_query_key_matmul(float_mask.new_ones(size=float_mask.size()), float_mask, w)
    if is_global_attn:
        n_global, global_at, local_global_at, local_empty_at = core._get_global_attn_indices(is_index_global_attn)
        scores = torch.cat((core._concat_with_global_key_attn_probs(
            key_vectors=key, query_vectors=query, max_num_global_attn_indices=n_global,
            is_index_global_attn_nonzero=global_at, is_local_index_global_attn_nonzero=local_global_at,
            is_local_index_no_global_attn_nonzero=local_empty_at), scores), dim=-1)
    probs = nn.functional.softmax(scores, dim=-1, dtype=torch.float32)
    probs = torch.masked_fill(probs, is_index_masked[:, :, None, None], 0.0).type_as(scores)
    probs = nn.functional.dropout(probs, p=core.dropout, training=core.training)
    if is_global_attn:
        out = core._compute_attn_output_with_global_indices(
            value_vectors=value, attn_probs=probs, max_num_global_attn_indices=n_global,
            is_index_global_attn_nonzero=global_at, is_local_index_global_attn_nonzero=local_global_at)
    else:
        out = core._sliding_chunks_matmul_attn_probs_value(probs, value, w)
    out = out.transpose(0, 1).reshape(seq_len, batch_size, n * d).contiguous()
    if is_global_attn:
        global_out, global_probs = core._compute_global_attn_output_from_hidden(
            hidden_states=hidden_states, max_num_global_attn_indices=n_global,
            is_local_index_global_attn_nonzero=local_global_at, is_index_global_attn_nonzero=global_at,
            is_local_index_no_global_attn_nonzero=local_empty_at, is_index_masked=is_index_masked)
        rows = global_out[local_global_at[0], :, local_global_at[1]]
        out[global_at[::-1]] = rows.view(len(local_global_at[0]), -1)
        probs[global_at] = 0
    outputs = (out.transpose(0, 1),) + ((probs,) if output_attentions else ())
    return outputs + (global_probs,) if (is_global_attn and output_attentions) else outputs


def _empty_longformer(core, _inner, hidden_states, attention_mask=None, is_index_masked=None,
                      is_index_global_attn=None, is_global_attn=None, output_attentions=False):
    """A Longformer core with no heads: an empty context (O, in the sibling module, adds its bias) and, when asked,
    zero-head probabilities in the banded shapes the encoder reads from every layer."""
    context = empty_context((hidden_states,), {})
    if not output_attentions:
        return (context,)
    b, t = hidden_states.shape[:2]
    n_global = core._get_global_attn_indices(is_index_global_attn)[0] if is_global_attn else 0
    banded = hidden_states.new_zeros(b, t, 0, n_global + 2 * core.one_sided_attn_window_size + 1)
    return (context, banded) + ((hidden_states.new_zeros(b, 0, n_global, t),) if is_global_attn else ())


def longformer_maps(block: AttentionBlock, args: tuple, kwargs: dict, output) -> torch.Tensor | None:
    """(B, h, T, T) attention probabilities from a Longformer core's banded output (module doc).

    ``output[1]`` is (B, T, h, G + 2w + 1): per query t, its weights on the G global keys (the batch row's global
    positions in order; columns past its own count are padding at weight 0), then on keys t - w .. t + w. The
    global tokens' own rows are zero there and come whole in ``output[2]`` (B, h, G, T). Differentiable.
    """
    if not isinstance(output, tuple) or len(output) < 2 or output[1] is None:
        return None
    banded = output[1]
    b, t, h, width = banded.shape
    w = block.core.one_sided_attn_window_size
    n_global = width - (2 * w + 1)
    rows = torch.arange(t, device=banded.device)[:, None]
    keys = rows + torch.arange(-w, w + 1, device=banded.device)[None, :]
    inside = ((keys >= 0) & (keys < t)).to(banded.dtype)
    local = banded[..., n_global:].permute(0, 2, 1, 3) * inside
    maps = banded.new_zeros(b, h, t, t).scatter_add(-1, keys.clamp(0, t - 1).expand(b, h, t, 2 * w + 1), local)
    if n_global:
        is_global = kwargs["is_index_global_attn"] if "is_index_global_attn" in kwargs else args[2]
        count = is_global.sum(1)
        # the global positions of each row in order (then the others, padding columns at weight 0)
        positions = torch.sort(is_global.int(), dim=1, descending=True, stable=True).indices[:, :n_global]
        real = (torch.arange(n_global, device=banded.device)[None, :] < count[:, None]).to(banded.dtype)
        columns = banded[..., :n_global].permute(0, 2, 1, 3) * real[:, None, None, :]
        maps = maps.scatter_add(-1, positions[:, None, None, :].expand(b, h, t, n_global), columns)
        global_rows = output[2] * real[:, None, :, None]
        maps = maps.scatter_add(2, positions[:, None, :, None].expand(b, h, n_global, t), global_rows)
    return maps


# -- XLM ------------------------------------------------------------------------------------------------------

def _xlm_cores(model: nn.Module) -> nn.ModuleList | None:
    for module in model.modules():
        cores = getattr(module, "attentions", None)
        if isinstance(cores, nn.ModuleList) and len(cores) > 0 and \
                all(hasattr(cores[0], a) for a in ("q_lin", "k_lin", "v_lin", "out_lin", "n_heads")):
            return cores
    return None


@family("xlm", "XLM: per-model lists of attention, FFN and norm modules (no module per layer)")
def xlm(model: nn.Module) -> ModelAdapter | None:
    cores = _xlm_cores(model)
    if cores is None:
        return None
    n_heads = model.config.num_attention_heads   # the config's: a cut core holds fewer
    blocks = _blocks(model, [(c, c.q_lin, c.k_lin, c.v_lin, c.out_lin) for c in cores], n_heads, cores[0].head_dim,
                     _empty_inner_output("out_lin"))
    causal = bool(getattr(model.config, "causal", False))
    return ModelAdapter("xlm", model, blocks, n_heads, len(blocks), False, list(range(len(blocks))), None,
                        core_applies_output=True, causal=causal, needs_output_attentions=True,
                        refuses={"kv": own_attention_refusal("XLM")} if causal else {})


# -- Nystromformer --------------------------------------------------------------------------------------------

NYSTROM_REFUSAL = (
    "This Nystromformer uses the Nyström approximation (num_landmarks {landmarks} < segment_means_seq_len {length}). "
    "Its pseudo-inverse starts from 1 / (the largest column sum over ALL heads and examples), so removing a head "
    "changes every other head's output (a cut could not equal the gated model) and one example's output depends on "
    "the others in its batch; it also needs inputs of exactly {length} tokens. headprune supports Nystromformer "
    "with num_landmarks == segment_means_seq_len (exact softmax attention).")


def _exact_nystromformer(core: nn.Module) -> None:
    if core.num_landmarks != core.seq_len:
        raise UnsupportedArchitecture(NYSTROM_REFUSAL.format(landmarks=core.num_landmarks, length=core.seq_len))


@family("nystromformer", "Nystromformer with exact softmax attention (a per-head convolution over values)")
def nystromformer(model: nn.Module) -> ModelAdapter | None:
    return _encoder(model, submodule("attention.self"), ("query", "key", "value", "num_landmarks", "seq_len"),
                    _sibling_output, _empty_sibling, accept=_exact_nystromformer, core_applies_output=False,
                    block={"head_params": lambda c: [(c.conv, "weight")] if getattr(c, "conv", None) is not None
                           else []})
