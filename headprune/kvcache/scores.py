"""Scores that choose a cache plan: which key/value heads need the whole cache (higher = keep it full).

Rules (``RULES``; any registered pruning criterion's name works too):

``razor``   RazorAttention (Tang et al. 2024, §3.2): retrieval heads are echo heads (attend to the earlier copy of
            the query's own token) and induction heads (attend to the token after it). Measured as headprune's
            duplicate-token and induction stripes on repeated random-token probes [BOS] + r + r whose block r is
            longer than the window (``roles.probes``), so the copy a head reads lies outside its window.
            Score = max(echo, induction) per query head.
``duo``     DuoAttention's question asked directly on calibration rows (Xiao et al. 2024, §3: a streaming head
            must not need what lies outside its sink + recent window): the attention mass a head puts on keys
            outside the first S and last W, averaged over real query rows that have such keys (q >= S + W).
``random``  a seeded uniform score (the baseline band).
criterion   any pruning criterion (``headprune criteria``): its importance score, on the same calibration rows.

GQA: a query head's needs decide its group; a group's score is the ``max`` (default: the group streams only if
none of its query heads needs the far keys) or the ``mean`` of its query heads. Heads that are cut or gated off
score NaN and count as not needing anything; a group with no live head scores -inf.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from ..criteria import REGISTRY, ScoringContext, get
from ..data import model_inputs
from ..errors import CriterionError
from ..model.arch import adapt
from ..model.capture import stream_attention
from ..roles.probes import make_probes
from ..roles.stats import repeat_stripes
from .plan import KVPlan, KVPlanError, check_full_share, check_window, top_share

RULES = ("razor", "duo", "random")
# what each rule is: the published method, or a proxy of it (the dashboard's cards say which); a criterion is a proxy
RULE_KINDS = {"razor": "published (RazorAttention, Tang et al. 2024, §3.2: echo and induction scores; here one share "
                       "for both kinds and no compensation token)",
              "duo": "proxy (attention mass outside sink + window: DuoAttention's question asked directly, kvpress's "
                     "on-the-fly approximation, not DuoAttention's gates learned by distillation)",
              "random": "baseline (seeded)"}
CRITERION_KIND = "proxy (a head-pruning criterion's importance read as the group's need for far keys)"
REDUCE = ("max", "mean")


def outside_mass(probs: torch.Tensor, valid: torch.Tensor, sink: int, window: int) -> tuple[torch.Tensor, int]:
    """(H,) summed attention mass outside sink + window over the real query rows that have such keys, and their
    count. probs (B, H, T, T), valid (B, T) bool (right padding)."""
    t = probs.shape[-1]
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    outside = ((k >= sink) & (k <= q - window)).to(probs.device)            # (T, T); causal rows end at q
    rows = valid.to(probs.device) & (torch.arange(t, device=probs.device) >= sink + window)[None]  # (B, T)
    mass = (probs * outside).sum(-1)                                         # (B, H, T)
    return (mass * rows[:, None]).sum((0, 2)).cpu(), int(rows.sum())


def duo_scores(model, calib: list[dict], sink: int, window: int, mask=None) -> np.ndarray:
    """(L, H) mean attention mass outside sink + window (module doc); NaN for cut or gated heads."""
    adapter = adapt(model)
    sums = torch.zeros(adapter.grid_shape, dtype=torch.float64)
    counts = torch.zeros(adapter.grid_shape[0], dtype=torch.float64)
    live = torch.ones(adapter.grid_shape, dtype=torch.bool)
    for batch in calib:
        valid = batch["attention_mask"].bool()

        def on_layer(layer, probs, valid=valid):
            block = adapter.layer_to_block[layer]
            mass, rows = outside_mass(probs, valid, sink, window)
            sums[block] += mass.double()
            counts[block] += rows

        _, alive = stream_attention(model, model_inputs(batch), on_layer, mask)
        for layer, block in enumerate(adapter.layer_to_block):
            live[block] &= alive[layer]
    if not bool(counts.any()):
        # no query row has a key outside sink + window: every score would be 0 and the plan an arbitrary tie-break
        longest = max((int(b["attention_mask"].sum(-1).max()) for b in calib), default=0)
        raise KVPlanError(f"The attention mass outside sink + window needs rows longer than S + W = {sink + window} "
                          f"tokens; the longest calibration row has {longest}. Use a smaller --sink / --window, or "
                          "longer rows.")
    scores = (sums / counts.clamp(min=1)[:, None]).numpy()
    return np.where(live.numpy(), scores, np.nan)


def razor_scores(model, tokenizer, window: int, rows: int = 8, seed: int = 0, mask=None) -> np.ndarray:
    """(L, H) max(echo, induction) on probes whose repeated block is longer than ``window`` (module doc)."""
    adapter = adapt(model)
    probes = make_probes(model, tokenizer, max(window + 1, 20), rows, seed, causal=True)
    if probes.n <= window:
        raise KVPlanError(f"RazorAttention's probes need a repeated block longer than the window ({window}); this "
                          f"model's context holds blocks of {probes.n} tokens. Use a smaller --window.")
    scores = np.full(adapter.grid_shape, np.nan)

    def on_layer(layer, probs):
        echo, induction, count = repeat_stripes(probs, probes.start, probes.n)
        scores[adapter.layer_to_block[layer]] = (torch.maximum(echo, induction) / count).cpu().numpy()

    _, alive = stream_attention(model, probes.batch, on_layer, mask)
    for layer, block in enumerate(adapter.layer_to_block):
        scores[block][~alive[layer].numpy()] = np.nan
    return scores


def random_scores(shape: tuple[int, int], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random(shape)


def criterion_scores(model, calib: list[dict], name: str, *, tokenizer=None, seed: int = 0, params=None,
                     mask=None) -> np.ndarray:
    """(L, H) a pruning criterion's importance (its ScoreMap values; the criterion scores a private copy)."""
    crit = get(name)
    ctx = ScoringContext(model, calib, mask, next(model.parameters()).device, tokenizer, seed=seed)
    return np.asarray(crit(ctx, dict(params or {})).scores, dtype=float)


def group_scores(scores: np.ndarray, group_size: int, reduce: str = "max") -> np.ndarray:
    """(L, H) query-head scores -> (L, H_kv) group scores (``max`` or ``mean`` over each group's live heads)."""
    if reduce not in REDUCE:
        raise KVPlanError(f"Group reduction {reduce!r} is not known; accepted: {', '.join(REDUCE)}.")
    grouped = scores.reshape(scores.shape[0], -1, group_size)
    dead = np.isnan(grouped).all(-1)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # a cut group's mean of nothing: -inf below
        safe = np.where(np.isnan(grouped), -np.inf if reduce == "max" else np.nan, grouped)
        out = safe.max(-1) if reduce == "max" else np.nanmean(safe, -1)
    return np.where(dead, -np.inf, out)


def check_rule(rule: str) -> None:
    """A rule is one of ``RULES`` or a criterion name (refused before anything loads)."""
    if rule not in RULES:
        try:
            get(rule)
        except CriterionError:
            raise KVPlanError(f"Unknown KV plan rule {rule!r}; accepted: {', '.join(RULES)} or a criterion: "
                              f"{', '.join(sorted(REGISTRY))}.") from None


def head_scores(rule: str, model, *, calib: list[dict], tokenizer=None, sink: int = 4, window: int = 64,
                seed: int = 0, mask=None, probe_rows: int = 8) -> np.ndarray:
    """(L, H) query-head scores of ``rule`` (module doc)."""
    check_rule(rule)
    if rule == "razor":
        return razor_scores(model, tokenizer, window, probe_rows, seed, mask)
    if rule == "duo":
        return duo_scores(model, calib, sink, window, mask)
    if rule == "random":
        return random_scores(adapt(model).grid_shape, seed)
    return criterion_scores(model, calib, rule, tokenizer=tokenizer, seed=seed, mask=mask)


def plan_from_scores(scores: np.ndarray, n_kv_heads: int, share: float, sink: int, window: int,
                     reduce: str = "max", meta: dict | None = None) -> KVPlan:
    """The plan keeping the ``share`` of groups with the highest group scores full (ties: lower index first).
    scores (L, H) per query head; the plan's grid is (L, ``n_kv_heads``)."""
    check_window(sink, window)
    check_full_share(share)
    n_heads = scores.shape[1]
    grouped = group_scores(scores, n_heads // n_kv_heads, reduce)
    full = top_share(torch.as_tensor(np.nan_to_num(grouped, nan=-np.inf)), share)
    readable = [[float(v) if np.isfinite(v) else None for v in row] for row in grouped]   # JSON has no NaN
    return KVPlan(full, n_heads, sink, window, {**(meta or {}), "group_reduce": reduce, "group_scores": readable})
