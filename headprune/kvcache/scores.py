"""Scores that choose a cache plan: which key/value heads need the whole cache (higher = keep it full).

Rules (``RULES``; any registered pruning criterion's name works too):

``razor``   RazorAttention (Tang et al. 2024, §3.2): retrieval heads are echo heads (attend to the earlier copy of
            the query's own token) and induction heads (attend to the token after it). Measured as headprune's
            duplicate-token and induction stripes on repeated random-token probes [BOS] + r + r whose block r is
            longer than the window (``roles.probes``), so the copy a head reads lies outside its window.
            Score = max(echo, induction) per query head. With separate shares (``razor_share_plan``, the
            reference's own selection: the top 1 % of heads by echo and the top 14 % by induction by default,
            mindspore_gs ``RAConfig``) the plan is the union of the two sets instead of a top share of the max.
            Its compensation token (§3.3) is an option of the plan (``KVPlan.compensation``, ``restrict``).
``duo``     DuoAttention's identification as published (Xiao et al. 2024, arXiv 2410.10819, §3.2; ``duo``
            module): one gate per key/value group mixing full and streaming attention, learned by distillation
            (final hidden states' L2 error on passkey answer tokens + L1 on the gates) on synthetic passkeys in
            the calibration rows' text; the score is the learned gate (every query head of a group gets it).
``far-mass`` a proxy for DuoAttention's question, measured instead of learned (a streaming head must not need
            what lies outside its sink + recent window): the attention mass a head puts on keys outside the
            first S and last W, averaged over real query rows that have such keys (q >= S + W). kvpress calls
            the same measure DuoAttention's on-the-fly approximation (``DuoAttentionPress(on_the_fly_scoring=
            True)``); it is not the published method.
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
from .duo import train_gates
from .plan import FULL_SHARE, KVPlan, KVPlanError, check_full_share, check_window, top_share

RULES = ("razor", "duo", "far-mass", "random")
# RazorAttention's reference defaults (mindspore_gs ``RAConfig``): 1 % echo heads, 14 % induction heads
RAZOR_ECHO_SHARE, RAZOR_INDUCTION_SHARE = 0.01, 0.14
# what each rule is: the published method, or a proxy of it (the dashboard's cards say which); a criterion is a proxy
RULE_KINDS = {"razor": "published (RazorAttention, Tang et al. 2024, §3.2: echo and induction scores; one share of "
                       "max(echo, induction), or the reference's own two shares with --echo-share / "
                       "--induction-share; its compensation token for the streaming heads with --compensation)",
              "duo": "published (DuoAttention, Xiao et al. 2024: gates learned by distillation on passkeys)",
              "far-mass": "proxy (attention mass outside sink + window: DuoAttention's question asked directly, "
                          "kvpress's on-the-fly kind of approximation, not DuoAttention's learned gates)",
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


def far_mass_scores(model, calib: list[dict], sink: int, window: int, mask=None) -> np.ndarray:
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


def razor_stripes(model, tokenizer, window: int, rows: int = 8, seed: int = 0, mask=None) -> tuple[np.ndarray,
                                                                                                   np.ndarray]:
    """((L, H) echo, (L, H) induction) on probes whose repeated block is longer than ``window`` (module doc); NaN
    for cut or gated heads."""
    adapter = adapt(model)
    probes = make_probes(model, tokenizer, max(window + 1, 20), rows, seed, causal=True)
    if probes.n <= window:
        raise KVPlanError(f"RazorAttention's probes need a repeated block longer than the window ({window}); this "
                          f"model's context holds blocks of {probes.n} tokens. Use a smaller --window.")
    echo, induction = np.full(adapter.grid_shape, np.nan), np.full(adapter.grid_shape, np.nan)

    def on_layer(layer, probs):
        e, i, count = repeat_stripes(probs, probes.start, probes.n)
        echo[adapter.layer_to_block[layer]] = (e / count).cpu().numpy()
        induction[adapter.layer_to_block[layer]] = (i / count).cpu().numpy()

    _, alive = stream_attention(model, probes.batch, on_layer, mask)
    for layer, block in enumerate(adapter.layer_to_block):
        echo[block][~alive[layer].numpy()] = np.nan
        induction[block][~alive[layer].numpy()] = np.nan
    return echo, induction


def razor_scores(model, tokenizer, window: int, rows: int = 8, seed: int = 0, mask=None) -> np.ndarray:
    """(L, H) max(echo, induction) on probes whose repeated block is longer than ``window`` (module doc)."""
    return np.fmax(*razor_stripes(model, tokenizer, window, rows, seed, mask))


def razor_share_plan(echo: np.ndarray, induction: np.ndarray, n_kv_heads: int, sink: int, window: int,
                     echo_share: float = RAZOR_ECHO_SHARE, induction_share: float = RAZOR_INDUCTION_SHARE,
                     meta: dict | None = None) -> KVPlan:
    """RazorAttention's selection with separate shares (reference: ``mindspore_gs`` ``RAConfig`` defaults
    ``echo_head_ratio=0.01``, ``induction_head_ratio=0.14``; ``RazorAttention._select_top_heads`` then the union):
    the ``echo_share`` of all query heads with the highest echo scores and the ``induction_share`` with the highest
    induction scores are retrieval heads; a group keeps the whole cache when any of its query heads is one (GQA)."""
    check_window(sink, window)
    for name, share in (("echo share", echo_share), ("induction share", induction_share)):
        problem = FULL_SHARE(share)
        if problem:
            raise KVPlanError(f"RazorAttention {name} {share!r} {problem} (a share of all query heads).")
    heads = torch.zeros(echo.shape, dtype=torch.bool)
    for scores, share in ((echo, echo_share), (induction, induction_share)):
        heads |= top_share(torch.as_tensor(np.nan_to_num(scores, nan=-np.inf)), share)
    full = heads.view(heads.shape[0], n_kv_heads, -1).any(-1)
    grouped = group_scores(np.fmax(echo, induction), echo.shape[1] // n_kv_heads)
    readable = [[float(v) if np.isfinite(v) else None for v in row] for row in grouped]
    return KVPlan(full, echo.shape[1], sink, window, {**(meta or {}), "echo_share": echo_share,
                                                      "induction_share": induction_share,
                                                      "retrieval_query_heads": heads.nonzero().tolist(),
                                                      "group_scores": readable})


def live_heads(model, mask=None) -> np.ndarray:
    """Bool (L, H): heads present (not cut) and not gated off by ``mask``."""
    live = adapt(model).live_grid()
    if mask is not None:
        live = live & mask.keep_bool()
    return live.numpy()


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
                seed: int = 0, mask=None, probe_rows: int = 8, duo_options: dict | None = None,
                duo_out: list | None = None) -> np.ndarray:
    """(L, H) query-head scores of ``rule`` (module doc). ``duo_options``: ``duo.train_gates``'s training
    parameters; ``duo_out``: a list the learned :class:`duo.DuoGates` is appended to (its loss and cost)."""
    check_rule(rule)
    if rule == "razor":
        return razor_scores(model, tokenizer, window, probe_rows, seed, mask)
    if rule == "far-mass":
        return far_mass_scores(model, calib, sink, window, mask)
    if rule == "duo":
        learned = train_gates(model, tokenizer, calib, sink=sink, window=window, seed=seed, mask=mask,
                              **(duo_options or {}))
        if duo_out is not None:
            duo_out.append(learned)
        return learned.query_scores(adapt(model).n_heads, live_heads(model, mask))
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
