"""Exact streaming heads: each streaming head's attention restricted to the first S and last W keys.

Two attention functions are registered with transformers' ``AttentionInterface`` (and the eager float mask with
its ``AttentionMaskInterface``, so the model builds its causal + padding mask as usual):

``headprune_kv``        torch's scaled-dot-product attention with a per-head boolean mask (no probabilities)
``headprune_kv_eager``  transformers' eager arithmetic, op for op, with the restriction added to the mask; it
                        returns the probabilities, so ``model.capture`` records them (its ``eager_name``)

Each reads the plan of its layer from the model's config (``config.headprune_kv``, set only on a private copy by
:func:`restricted`): per physical query position whether it streams, plus S and W. The keys it receives are
either one tensor (B, H_kv, T_k, d) at positions 0..T_k-1 -- the ordinary cache or none: the restriction is a mask
-- or a :class:`SplitKV` from ``cache.MixedCache``, where streaming heads hold only their S + W keys with their
positions. A budget plan's groups each stream at their own window W_g; the restriction is per query head. Queries
are the last T_q positions. Rows are right-padded (headprune's batches), so a position is a token index.

A plan with ``compensation`` (RazorAttention's compensation token, Tang et al. 2024, arXiv 2407.15891, §3.3): a
streaming head at query q also attends to one extra entry standing for the keys it dropped, D(q) = {p : S <= p <= q
- W}: key k^ and value v^ the means of the dropped keys and values (Eq. 4), its exponentiated logit weighted by N_d =
|D(q)| (Eq. 5: N_d exp(q k^) beside exp(q k_m) of each kept key), i.e. logit q k^ x scaling + log N_d. Keys are
taken after the rotary embedding, as the paper's Algorithm 1 does. The dense path sums D(q) by prefix sums over the
positions; the mixed cache keeps the running sums of what its rings dropped (``cache.Ring``), so both attend the
same entry. Computed with the eager arithmetic (SDPA has no extra per-query entry); returned probabilities are
those of the real keys (the entry's share is the rest).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

from ..model.arch import adapt
from ..model.hooks import structural_copy
from .plan import KVPlan, KVPlanError

SDPA, EAGER = "headprune_kv", "headprune_kv_eager"
CONFIG_KEY = "headprune_kv"


@dataclass
class Dropped:
    """What a mixed cache's streaming heads have dropped from their rings: the sums of those keys and values
    (B, n, d), float64, and how many positions each head dropped (n,), float64 (the compensation token's running
    state; heads of a budget plan drop at their own windows, so the counts differ per head)."""

    k_sum: torch.Tensor
    v_sum: torch.Tensor
    count: torch.Tensor


@dataclass
class SplitKV:
    """One layer of a mixed cache as the attention function reads it (``cache.MixedLayer.update``).

    ``full``: (keys, values) (B, n_f, K_f, d) of the full heads -- every position 0..K_f-1 (a static buffer's slots
    past the last token are hidden by the model's causal mask) -- or None; ``stream``: (keys, values) (B, n_s, K_s,
    d) of the streaming heads (their padded ring, or ring + chunk while a prompt goes in), or None; ``positions``
    (n_s, P <= K_s): each streaming key's token position, -1 an empty or padding slot; ``windows`` (n_s,): each
    streaming head's W; ``q_pos`` (T_q,): the queries' positions; ``entry`` (n_s, T_q, K_s - P): the additive mask of
    the compensation entries that close the streaming keys (log N_d, -inf where a query dropped nothing) or None;
    ``rows(groups)``: the query rows of the full and the streaming heads and the order putting them back."""

    full: tuple | None
    stream: tuple | None
    positions: torch.Tensor | None
    windows: torch.Tensor | None
    sink: int
    q_pos: torch.Tensor
    entry: torch.Tensor | None
    rows: object
    length: object


def window_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Bool (T_q, T_k): key position p is visible to query position q for a streaming head (causal, sink, window)."""
    q, k = q_pos[:, None], k_pos[None, :]
    return (k <= q) & ((k < sink) | (k > q - window))


def dropped_by(q_pos: torch.Tensor, k_pos: torch.Tensor, sink: int, window) -> torch.Tensor:
    """Bool (T_q, T_k): key position p is one a streaming head dropped at query q (S <= p <= q - W)."""
    q, k = q_pos[:, None], k_pos[None, :]
    return (k >= sink) & (k <= q - window)


def entry_parts(k_sum: torch.Tensor, v_sum: torch.Tensor, count: torch.Tensor, dtype: torch.dtype):
    """RazorAttention's entry from the dropped keys' and values' sums (.., d) and their count (..): (mean key, mean
    value, log N_d) -- log 0 = -inf where nothing was dropped (the entry then weighs 0). Tensor ops only (a decode
    step calls it)."""
    mean = lambda total: (total / count.clamp(min=1)[..., None]).to(dtype)  # noqa: E731
    log_weight = torch.where(count > 0, count.double().log(), float("-inf"))
    return mean(k_sum), mean(v_sum), log_weight


def compensation_entry(k_sum: torch.Tensor, v_sum: torch.Tensor, count: torch.Tensor, dtype: torch.dtype):
    """:func:`entry_parts` of sums (B, n, T_q, d) and counts (.., n, T_q), or None when no query dropped anything
    (the plain restriction, exactly)."""
    if not bool((count > 0).any()):
        return None
    return entry_parts(k_sum, v_sum, count, dtype)


def dense_compensation(spec: dict, key: torch.Tensor, value: torch.Tensor, t_q: int):
    """The compensation entry per streaming key/value head and query over a full key tensor (positions 0..T_k-1):
    D(q) = S..q - W_h is a prefix of the positions, so its sums are read from cumulative sums (float64)."""
    t_k, sink = key.shape[2], spec["sink"]
    stream = torch.tensor(spec["kv_stream"], dtype=torch.bool, device=key.device)
    windows = torch.tensor(spec["kv_windows"], dtype=torch.long, device=key.device)
    q_pos = torch.arange(t_k - t_q, t_k, device=key.device)
    last = q_pos[None, :] - windows[:, None]                                   # (n, T_q): the last dropped p
    count = torch.where(stream[:, None], (last - sink + 1).clamp(min=0), 0)    # (n, T_q)
    if not bool((count > 0).any()):
        return None
    index = (last - sink).clamp(min=0)[None, :, :, None]                       # (1, n, T_q, 1)

    def sums(states):
        prefix = states[:, :, sink:].double().cumsum(-2)
        if prefix.shape[-2] == 0:
            return states.new_zeros(*states.shape[:2], t_q, states.shape[-1], dtype=torch.float64)
        taken = prefix.gather(-2, index.clamp(max=prefix.shape[-2] - 1).expand(states.shape[0], -1, -1,
                                                                                 states.shape[-1]))
        return taken * (count > 0)[None, :, :, None]

    return compensation_entry(sums(key), sums(value), count[None], key.dtype)


def head_window_allowed(q_pos: torch.Tensor, positions: torch.Tensor, sink: int, windows: torch.Tensor):
    """Bool (n, T_q, K): for each streaming head (its window ``windows`` (n,), its keys at ``positions`` (n, K), -1
    an empty slot), is key k visible to query position q (causal, sink, window)?"""
    q, k, w = q_pos[None, :, None], positions[:, None, :], windows[:, None, None]
    return (k >= 0) & (k <= q) & ((k < sink) | (k > q - w))


def chunk_entries(dropped: Dropped, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor,
                  q_pos: torch.Tensor, sink: int, windows: torch.Tensor):
    """The compensation entry of each streaming head for each query of a chunk: what the head dropped before
    (``dropped``) plus the keys at ``positions`` (n, K) that the query drops (S <= p <= q - W_h). Returns (mean keys
    (B, n, T_q, d), mean values, additive mask (n, T_q, T_q): log N_d on the diagonal -- each query reads its own
    entry -- and -inf elsewhere)."""
    k, q, w = positions[:, None, :], q_pos[None, :, None], windows[:, None, None]
    drop = ((k >= sink) & (k <= q - w)).double()                                         # (n, T_q, K)
    k_sum = dropped.k_sum[:, :, None] + torch.einsum("hqj,bhjd->bhqd", drop, keys.double())
    v_sum = dropped.v_sum[:, :, None] + torch.einsum("hqj,bhjd->bhqd", drop, values.double())
    mean_k, mean_v, log_weight = entry_parts(k_sum, v_sum, dropped.count[:, None] + drop.sum(-1), keys.dtype)
    eye = torch.eye(len(q_pos), dtype=torch.bool, device=keys.device)
    return mean_k, mean_v, torch.where(eye, log_weight[:, :, None], float("-inf"))


def base_allowed(attention_mask: torch.Tensor | None, t_q: int, k_pos: torch.Tensor) -> torch.Tensor:
    """Bool (B or 1, 1, T_q, T_k): what the model's own mask allows (causal and padding) at key positions
    ``k_pos``; without a mask, causal over the last T_q positions."""
    if attention_mask is None:
        q_pos = torch.arange(int(k_pos.max()) + 1 - t_q, int(k_pos.max()) + 1, device=k_pos.device)
        return (k_pos[None, :] <= q_pos[:, None])[None, None]
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., k_pos]
    return attention_mask[..., k_pos] > torch.finfo(attention_mask.dtype).min / 2


def refuse_left_padding(allowed: torch.Tensor, t_q: int) -> None:
    """``allowed`` (B, 1, T_q, T_k) from the model's mask, keys at positions 0..T_k-1. A real token's query sees its
    own key; a pad's does not. A pad before a real token (left padding) would put the sinks on pads and shift every
    window: positions are token indices here, so such a row is refused, not attended wrongly. Checked within the
    queries of each forward (a whole prompt, or each chunk of one fed in chunks)."""
    if t_q < 2:   # a decode step: its prompt's forward already checked the row
        return
    real = torch.diagonal(allowed[:, 0, :, allowed.shape[-1] - t_q:], dim1=-2, dim2=-1)   # (B, T_q)
    if bool((~real[:, :-1] & real[:, 1:]).any()):
        raise KVPlanError("A KV plan reads key positions as token indices, so rows must be right-padded (real "
                          "tokens first); this batch has padding before real tokens (left padding). Pad on the right "
                          "(tokenizer.padding_side = 'right'), or run each row on its own.")


def layer_spec(module) -> dict:
    specs = getattr(module.config, CONFIG_KEY, None)
    if specs is None:
        raise KVPlanError("A headprune_kv attention function ran on a model without a KV plan; use "
                          "kvcache.restricted(model, plan).")
    return specs[module.layer_idx]


def repeat_kv(states: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, H_kv, T, d) -> (B, H_kv * groups, T, d), each key/value head repeated for its query heads (stock)."""
    if groups == 1:
        return states
    b, h, t, d = states.shape
    return states[:, :, None].expand(b, h, groups, t, d).reshape(b, h * groups, t, d)


def dense_allowed(spec: dict, query: torch.Tensor, t_k: int, attention_mask) -> torch.Tensor:
    """Bool (B, H, T_q, T_k): the model's mask, and for streaming query heads the sink + window restriction (each
    query head at its group's window: a budget plan's windows differ per group)."""
    t_q = query.shape[2]
    k_pos = torch.arange(t_k, device=query.device)
    q_pos = k_pos[t_k - t_q:]
    stream = torch.tensor(spec["stream"], dtype=torch.bool, device=query.device)[None, :, None, None]
    windows = torch.tensor(spec["windows"], dtype=torch.long, device=query.device)[:, None, None]
    near = window_allowed(q_pos, k_pos, spec["sink"], windows)[None]
    base = base_allowed(attention_mask, t_q, k_pos)
    if attention_mask is not None:
        refuse_left_padding(base, t_q)
    return base & (~stream | near)


# arguments the model's attention passes that these functions apply (softcap, s_aux) or that the model's mask already
# carries (sliding_window: the model builds its sliding causal mask, read through ``attention_mask``); others that
# only describe the call (and flags: True / False switches such as output_router_logits); any other value is refused
# by name instead of being swallowed (e.g. packed-sequence offsets, ALiBi slopes)
APPLIED = ("softcap", "s_aux", "sliding_window")
DESCRIPTIVE = ("position_ids", "cache_position", "use_cache", "output_attentions", "is_causal", "past_key_values",
               "position_embeddings", "layer_idx")


def check_arguments(kwargs: dict) -> None:
    unknown = sorted(k for k, v in kwargs.items()
                     if v is not None and not isinstance(v, bool) and k not in APPLIED + DESCRIPTIVE)
    if unknown:
        raise KVPlanError(f"This model's attention passes {', '.join(unknown)}, which a KV plan's restricted "
                          f"attention does not implement (implemented: {', '.join(APPLIED)}); refused rather than "
                          "ignored. Use a model without them, or no --kv-plan.")


def capped_logits(query, key, allowed, scaling: float, softcap):
    """(query heads per key/value head, QK^T x scaling soft-capped where the model caps, the additive mask of
    ``allowed``, a bool mask or an additive one): the steps :func:`eager_core` and :func:`compensated_core` share,
    in transformers' order."""
    groups = query.shape[1] // key.shape[1]
    if allowed.dtype == torch.bool:
        mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        mask.masked_fill_(~allowed, torch.finfo(query.dtype).min)
    else:   # already additive (the mixed cache's masks: 0 visible, -inf / min hidden, log N_d for an entry)
        mask = allowed
    weights = torch.matmul(query, repeat_kv(key, groups).transpose(2, 3)) * scaling
    if softcap is not None:
        weights = torch.tanh(weights / softcap) * softcap
    return groups, weights, mask


def eager_core(module, query, key, value, allowed, scaling: float, dropout: float, softcap=None, s_aux=None,
               entry=None):
    """transformers' eager arithmetic op for op (Gemma 2's logit soft-capping before the mask; gpt-oss's learned
    sink logit as one extra column of the softmax, dropped after it), ``allowed`` as the mask; ``entry``: a
    compensation entry (:func:`compensation_entry`), one more column per query (``compensated_core``)."""
    if entry is not None:
        return compensated_core(module, query, key, value, allowed, scaling, dropout, softcap, s_aux, entry)
    groups, weights, mask = capped_logits(query, key, allowed, scaling, softcap)
    weights = weights + mask
    if s_aux is not None:
        sinks = s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1)
        combined = torch.cat([weights, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        weights = F.softmax(combined, dim=-1, dtype=combined.dtype)[..., :-1].to(value.dtype)
    else:
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = F.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, repeat_kv(value, groups))
    return out.transpose(1, 2).contiguous(), weights


def compensated_core(module, query, key, value, allowed, scaling, dropout, softcap, s_aux, entry):
    """:func:`eager_core` with RazorAttention's entry as one more softmax column: logit (q . k^) x scaling (soft-capped
    like the others) + log N_d, its probability times v^ added to the output (module doc)."""
    mean_k, mean_v, log_weight = entry
    groups, weights, mask = capped_logits(query, key, allowed, scaling, softcap)
    extra = (query * repeat_kv(mean_k, groups)).sum(-1, keepdim=True) * scaling      # (B, H, T_q, 1)
    if softcap is not None:
        extra = torch.tanh(extra / softcap) * softcap
    extra = extra + log_weight.repeat_interleave(groups, dim=1)[..., None].to(extra.dtype)
    columns = [weights + mask, extra]
    if s_aux is not None:
        columns.append(s_aux.reshape(1, -1, 1, 1).expand(query.shape[0], -1, query.shape[-2], -1))
    combined = torch.cat(columns, dim=-1)
    probs = F.softmax(combined - combined.max(dim=-1, keepdim=True).values, dim=-1, dtype=torch.float32)
    probs = F.dropout(probs.to(query.dtype), p=dropout, training=module.training)
    t_k = key.shape[2]
    out = torch.matmul(probs[..., :t_k], repeat_kv(value, groups)) + probs[..., t_k:t_k + 1] * repeat_kv(mean_v,
                                                                                                         groups)
    return out.transpose(1, 2).contiguous(), probs[..., :t_k]


def eager_kv_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                       softcap=None, s_aux=None, **kwargs):
    """transformers' eager attention (repeat_kv, QK^T x scaling + mask, float32 softmax, x V) with the plan's
    restriction in the mask. query (B, H, T_q, d), key/value (B, H_kv, T_k, d) -> ((B, T_q, H, d), (B, H, T_q, T_k))."""
    check_arguments(kwargs)
    if isinstance(key, SplitKV):   # generation over a mixed cache: outputs only (probabilities need the full cache)
        return split_attention(module, query, key, attention_mask, scaling, softcap, s_aux), None
    spec = layer_spec(module)
    allowed = dense_allowed(spec, query, key.shape[2], attention_mask)
    entry = dense_compensation(spec, key, value, query.shape[2]) if spec.get("compensation") else None
    return eager_core(module, query, key, value, allowed, scaling, dropout, softcap, s_aux, entry)


def sdpa_kv_attention(module, query, key, value, attention_mask, scaling: float, dropout: float = 0.0,
                      softcap=None, s_aux=None, **kwargs):
    """The same restriction on torch's scaled-dot-product attention (no probabilities returned); on a
    :class:`SplitKV` the full and the streaming heads attend over their own keys, each part a GQA call. SDPA has no
    soft-capping or sink logit: with them, the eager arithmetic. query (B, H, T_q, d) -> ((B, T_q, H, d), None)."""
    check_arguments(kwargs)
    if isinstance(key, SplitKV):
        return split_attention(module, query, key, attention_mask, scaling, softcap, s_aux), None
    spec = layer_spec(module)
    allowed = dense_allowed(spec, query, key.shape[2], attention_mask)
    entry = dense_compensation(spec, key, value, query.shape[2]) if spec.get("compensation") else None
    if softcap is not None or s_aux is not None or entry is not None:
        return eager_core(module, query, key, value, allowed, scaling, dropout if module.training else 0.0, softcap,
                          s_aux, entry)[0], None
    groups = query.shape[1] // key.shape[1]
    out = F.scaled_dot_product_attention(query, repeat_kv(key, groups), repeat_kv(value, groups), attn_mask=allowed,
                                         dropout_p=dropout if module.training else 0.0, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def additive(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """The model's mask as an additive float mask (0 visible, the dtype's min hidden); None stays None."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def stream_mask(kv: SplitKV, attention_mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Additive (B or 1, n_s, T_q, K_s) mask of the streaming keys: each head's sink + window and the model's own mask
    (causal, padding, a sliding window) read at each key's position, then the compensation entries' columns. A
    decode step's ring holds exactly the keys its one query sees (``cache.MixedLayer``: the new key overwrote
    position p - W_h), so there the mask is the slots in use; a prompt chunk's keys are masked by position. A fixed
    number of tensor operations, whatever the windows (module doc)."""
    low = torch.finfo(dtype).min
    n, width = kv.positions.shape
    if kv.q_pos.shape[0] == 1:   # a decode step
        allowed = (kv.positions >= 0).view(1, n, 1, width)
    else:
        allowed = head_window_allowed(kv.q_pos, kv.positions, kv.sink, kv.windows)[None]
    if attention_mask is None:
        mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, low)
    else:
        # an empty slot's position -1 reads the mask's last column: it is masked by ``allowed`` anyway
        mask = torch.where(allowed, additive(attention_mask, dtype)[:, 0][..., kv.positions].transpose(1, 2), low)
    if kv.entry is not None:
        mask = torch.cat([mask, kv.entry.to(dtype)[None].expand(mask.shape[0], -1, -1, -1)], dim=-1)
    return mask


def attend(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           scaling: float, softcap=None, s_aux=None) -> torch.Tensor:
    """One attention call over one part of a mixed cache: query (B, n x g, T_q, d) over key/value (B, n, K, d) with
    the additive ``mask`` (B or 1, n or 1, T_q, K) -> (B, n x g, T_q, d). SDPA with the g query heads of a group
    folded into its queries (B, n, g x T_q, d): one kernel over the keys as stored, no repeated copy of them (a
    decode step's mask broadcasts over the g rows as it is); the eager arithmetic (``eager_core``) where the model
    soft-caps logits or adds a sink logit, which SDPA has not."""
    b, heads, t_q, d = query.shape
    n = key.shape[1]
    groups = heads // n
    if softcap is not None or s_aux is not None:
        if mask is None:
            mask = torch.zeros(1, 1, t_q, key.shape[2], dtype=query.dtype, device=query.device)
        if mask.shape[1] > 1:
            mask = mask.repeat_interleave(groups, dim=1)
        return eager_core(module, query, key, value, mask, scaling, 0.0, softcap, s_aux)[0].transpose(1, 2)
    if mask is not None and t_q > 1:
        mask = mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(mask.shape[0], mask.shape[1], groups * t_q, -1)
    out = F.scaled_dot_product_attention(query.reshape(b, n, groups * t_q, d), key, value, attn_mask=mask,
                                         scale=scaling)
    return out.reshape(b, heads, t_q, d)


def split_attention(module, query: torch.Tensor, kv: SplitKV, attention_mask, scaling: float, softcap=None,
                    s_aux=None) -> torch.Tensor:
    """Attention over a mixed cache: the query heads of full groups over every key in one call, those of streaming
    groups over their rings in one more (each head masked to its own sink + window and the model's mask, with the
    compensation entry where the plan has one). No loop over heads or windows, no read of a tensor's value on the
    host: a decode step is a fixed list of operations (``tests/test_kvcache_ops.py`` counts them). -> (B, T_q, H, d)."""
    t_q = query.shape[2]
    if attention_mask is not None and t_q > 1:
        refuse_left_padding(base_allowed(attention_mask, t_q, torch.arange(attention_mask.shape[-1],
                                                                           device=query.device)), t_q)
    groups = query.shape[1] // ((kv.full[0].shape[1] if kv.full else 0) + (kv.stream[0].shape[1] if kv.stream else 0))
    full_rows, stream_rows, order = kv.rows(groups)
    both = kv.full is not None and kv.stream is not None   # fixed per layer by the plan, not by the data
    outs = []
    if kv.full is not None:
        q = query.index_select(1, full_rows) if both else query
        if attention_mask is None:   # causal over the buffer (a static one holds slots past the last token)
            keys = torch.arange(kv.full[0].shape[2], device=query.device)
            mask = additive((keys[None, :] <= kv.q_pos[:, None])[None, None], query.dtype)
        else:
            mask = additive(attention_mask, query.dtype)[..., :kv.full[0].shape[2]]
        outs.append(attend(module, q, *kv.full, mask, scaling, softcap,
                           s_aux[full_rows] if both and s_aux is not None else s_aux))
    if kv.stream is not None:
        q = query.index_select(1, stream_rows) if both else query
        outs.append(attend(module, q, *kv.stream, stream_mask(kv, attention_mask, query.dtype), scaling, softcap,
                           s_aux[stream_rows] if both and s_aux is not None else s_aux))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=1).index_select(1, order)
    return out.transpose(1, 2).contiguous()


eager_kv_attention.returns_probabilities = True
sdpa_kv_attention.eager_name = EAGER          # model.capture switches to this one to record probabilities
eager_kv_attention.eager_name = EAGER
AttentionInterface.register(SDPA, sdpa_kv_attention)
AttentionInterface.register(EAGER, eager_kv_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(SDPA, eager_mask)
ALL_MASK_ATTENTION_FUNCTIONS.register(EAGER, eager_mask)


def layer_specs(adapter, plan: KVPlan) -> dict[int, dict]:
    """Per forward layer: ``stream`` and ``windows`` (per physical query position: does it stream, at which
    window?), ``kv_stream`` and ``kv_windows`` (per physical key/value head), ``sink``. Surgery's kept heads and
    key/value sources map physical to original."""
    specs, windows = {}, plan.group_windows()
    for layer, block_index in enumerate(adapter.layer_to_block):
        block = adapter.blocks[block_index]
        kv_stream = [not bool(plan.full[block.index, g]) for g in block.kv_sources]
        kv_windows = [int(windows[block.index, g]) for g in block.kv_sources]
        positions = block.kv_of_position()
        specs[layer] = {"stream": [kv_stream[j] for j in positions], "windows": [kv_windows[j] for j in positions],
                        "kv_stream": kv_stream, "kv_windows": kv_windows, "sink": plan.sink,
                        "compensation": plan.compensation}
    return specs


def refuse_sliding(config) -> None:
    """A compensation token sums every key a streaming head drops; a layer whose own sliding window already hides
    keys would need that window in the sums too (the mixed cache keeps one running sum), so such models are refused
    with the token, not compensated for keys they never saw."""
    config = getattr(config, "text_config", None) or config
    types = getattr(config, "layer_types", None) or []
    sliding = any(t != "full_attention" for t in types) if types else \
        bool(getattr(config, "sliding_window", None)) and getattr(config, "use_sliding_window", True) is not False
    if sliding:
        raise KVPlanError("RazorAttention's compensation token (the plan's \"compensation\") is not implemented for "
                          "models with sliding-window attention layers; use the plan without it.")


@contextmanager
def restricted(model, plan: KVPlan, adapter=None):
    """Yield a private copy of ``model`` whose streaming heads see only their sink + window keys.

    ``model`` is never changed (the copy shares its weights: ``hooks.structural_copy``); the copy is gated,
    evaluated, captured or generated with as any model. Eager models get the eager twin (probabilities), others
    the SDPA one.
    """
    adapter = adapter or adapt(model)
    plan.check_fits(adapter)
    if plan.compensation:
        refuse_sliding(model.config)
    copy = structural_copy(model)
    setattr(copy.config, CONFIG_KEY, layer_specs(adapt(copy), plan))
    eager = getattr(model.config, "_attn_implementation", None) == "eager"
    copy.set_attn_implementation(EAGER if eager else SDPA)
    yield copy
