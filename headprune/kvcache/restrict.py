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
    """What a streaming part has dropped outside the keys it hands over: the sums of those keys and values
    (B, n, d), float64, and how many positions they hold (the compensation token's running state)."""

    k_sum: torch.Tensor
    v_sum: torch.Tensor
    count: int


@dataclass
class KVPart:
    """Keys and values of some physical key/value heads of one layer: (B, n, K, d) at ``positions`` (K,);
    ``window``: None for full heads (every position 0..T-1), else their streaming window W; ``dropped``: with a
    compensation token, the keys dropped before these (the attention adds those of ``positions`` a query drops)."""

    heads: list[int]
    k: torch.Tensor
    v: torch.Tensor
    positions: torch.Tensor
    window: int | None
    dropped: Dropped | None = None


@dataclass
class SplitKV:
    """Keys and values of one layer of a mixed cache, returned by ``MixedLayer.update`` to the attention function:
    one :class:`KVPart` for the full heads and one per distinct streaming window; ``length``: T (tokens seen)."""

    parts: list[KVPart]
    length: int


def window_allowed(q_pos: torch.Tensor, k_pos: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Bool (T_q, T_k): key position p is visible to query position q for a streaming head (causal, sink, window)."""
    q, k = q_pos[:, None], k_pos[None, :]
    return (k <= q) & ((k < sink) | (k > q - window))


def dropped_by(q_pos: torch.Tensor, k_pos: torch.Tensor, sink: int, window) -> torch.Tensor:
    """Bool (T_q, T_k): key position p is one a streaming head dropped at query q (S <= p <= q - W)."""
    q, k = q_pos[:, None], k_pos[None, :]
    return (k >= sink) & (k <= q - window)


def compensation_entry(k_sum: torch.Tensor, v_sum: torch.Tensor, count: torch.Tensor, dtype: torch.dtype):
    """RazorAttention's entry from the dropped keys' and values' sums (B, n, T_q, d) and their count (.., n, T_q):
    (mean key, mean value, log N_d) -- log 0 = -inf where a query dropped nothing (the entry then weighs 0) -- or
    None when no query dropped anything (the plain restriction, exactly)."""
    if not bool((count > 0).any()):
        return None
    mean = lambda total: (total / count.clamp(min=1)[..., None]).to(dtype)  # noqa: E731
    log_weight = torch.where(count > 0, count.double().log(), float("-inf"))
    return mean(k_sum), mean(v_sum), log_weight


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


def split_compensation(part: KVPart, q_pos: torch.Tensor, sink: int, dtype: torch.dtype):
    """The compensation entry of a mixed cache's streaming part: what it dropped before (``part.dropped``) plus
    the positions it hands over that each query drops."""
    drop = dropped_by(q_pos, part.positions.to(q_pos.device), sink, part.window).double()   # (T_q, K)
    k_sum = part.dropped.k_sum[:, :, None] + drop @ part.k.double()
    v_sum = part.dropped.v_sum[:, :, None] + drop @ part.v.double()
    count = (part.dropped.count + drop.sum(-1))[None, None].expand(1, part.k.shape[1], -1)
    return compensation_entry(k_sum, v_sum, count, dtype)


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
    ``allowed``): the steps :func:`eager_core` and :func:`compensated_core` share, in transformers' order."""
    groups = query.shape[1] // key.shape[1]
    mask = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
    mask.masked_fill_(~allowed, torch.finfo(query.dtype).min)
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


def split_attention(module, query: torch.Tensor, kv: SplitKV, attention_mask, scaling: float, softcap=None,
                    s_aux=None) -> torch.Tensor:
    """Attention over a mixed cache: query heads of full groups over every key, those of streaming groups over
    their S + W keys (masked to the exact window of each query position); SDPA per part, or the eager arithmetic
    where the model soft-caps logits or adds a sink logit (SDPA has neither). -> (B, T_q, H, d)."""
    spec = layer_spec(module)
    t_q = query.shape[2]
    groups = query.shape[1] // sum(len(part.heads) for part in kv.parts)
    out = torch.empty_like(query)
    q_pos = torch.arange(kv.length - t_q, kv.length, device=query.device)
    if attention_mask is not None and t_q > 1:
        refuse_left_padding(base_allowed(attention_mask, t_q, torch.arange(kv.length, device=query.device)), t_q)
    for part in kv.parts:
        if not part.heads:
            continue
        k_pos = part.positions.to(query.device)
        rows = torch.tensor([h * groups + i for h in part.heads for i in range(groups)], device=query.device)
        allowed = base_allowed(attention_mask, t_q, k_pos)
        if part.window is not None:
            allowed = allowed & window_allowed(q_pos, k_pos, spec["sink"], part.window)[None, None]
        entry = None if part.dropped is None else split_compensation(part, q_pos, spec["sink"], query.dtype)
        if softcap is not None or s_aux is not None or entry is not None:
            sinks = None if s_aux is None else s_aux[rows]
            out[:, rows] = eager_core(module, query[:, rows], part.k, part.v, allowed, scaling, 0.0, softcap,
                                      sinks, entry)[0].transpose(1, 2)
            continue
        # a decode step usually sees every key it holds: no mask then lets SDPA take its fastest kernel
        out[:, rows] = F.scaled_dot_product_attention(query[:, rows], part.k, part.v,
                                                      attn_mask=None if bool(allowed.all()) else allowed,
                                                      scale=scaling, enable_gqa=groups > 1)
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
