"""How big a model is and would be: parameter accounting by module group, before and after cutting heads.

``parameter_counts`` / ``size_report`` count what a model holds (Greedy-Gnorm paper, Table 2: embeddings, encoder,
pooler, classifier, and the attention Q/K/V/O share); ``parameters_left`` and ``cut_summary`` say what
``surgery.prune_model`` *would* leave without cutting anything (surgery's own plan, ``surgery.plan_block``), so a
page can show the size of a mask on every click. Shared tensors count once.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from .arch import adapt, in_features, out_features
from .mask import HeadMask
from .surgery import plan_block


def parameters_left(model: nn.Module, mask: HeadMask) -> int:
    """Parameters of ``surgery.prune_model(model, mask)`` without cutting anything.

    Per block, surgery's own plan (``surgery.plan_block``) gives the query heads and key/value heads it would
    keep; every query head removed deletes d_h rows of W_Q (and of per-head projections on the query side, e.g.
    DeBERTa's ``pos_key_proj``) with their bias entries and d_h columns of W_O, every key/value head removed d_h
    rows of W_K and W_V -- and under grouped-query attention an uneven cut may *add* key/value rows (a group held
    more than once), which counts as negative removal. Per-head parameters (``head_params``: gpt-oss's sinks,
    Nystromformer's convolution kernels) go with their query head; where Q and K feed a norm over all heads
    (OLMo 2) their rows stay. Shared tensors count once, as in ``parameter_counts``.
    """
    adapter = adapt(model)
    keep = mask.keep_bool()
    removed = 0
    for block in adapter.blocks:
        d = block.head_size
        new_query, new_kv = plan_block(block, [h for h in block.kept if keep[block.index, h]])
        fewer_query, fewer_kv = block.n_live - len(new_query), block.n_kv_live - len(new_kv)

        qk_rows = not block.norm_spans_heads   # else surgery keeps every head's Q/K rows for the norm
        removed += fewer_query * ((head_rows(block.query, d) if qk_rows else 0) + d * out_features(block.output))
        removed += fewer_kv * ((head_rows(block.key, d) if qk_rows else 0) + head_rows(block.value, d))
        removed += sum((fewer_query if side == "query" else fewer_kv) * head_rows(module, d)
                       for module, side in block.extra_rows)
        removed += sum(fewer_query * (getattr(module, name).numel() // block.n_live)
                       for module, name in block.head_params if block.n_live)
    return sum(p.numel() for p in model.parameters()) - removed


def head_rows(module: nn.Module, d: int) -> int:
    """Parameters in d output rows of ``module`` (one head's rows), bias entries included."""
    return d * (in_features(module) + (1 if getattr(module, "bias", None) is not None else 0))


def cut_summary(model: nn.Module, mask: HeadMask) -> list[dict]:
    """How ``prune_model(model, mask)`` would cut each changed block, without cutting (for the Prune page / CLI).

    Per block whose kept heads change: ``kind`` is "whole groups" (only entire key/value groups removed),
    "equal per group" (every kept group loses the same number of query heads), "uneven" (key/value rows will be
    held more than once, ``kv_copies`` extra copies), or "heads" (multi-head attention: any set cuts cleanly);
    ``query_heads`` and ``kv_heads`` after the cut; ``kv_held``: {group: times its K/V rows are held} for the
    groups held more than once, and ``kv_copy_parameters``: what those extra copies add (W_K and W_V rows with
    their biases, d_h rows each per copy).
    """
    adapter = adapt(model)
    keep = mask.keep_bool()
    out = []
    for block in adapter.blocks:
        kept = [h for h in block.kept if keep[block.index, h]]
        if kept == block.kept:
            continue
        new_query, sources = plan_block(block, kept)
        groups = Counter(block.group_of(h) for h in new_query)
        if block.n_kv_heads == block.n_heads:
            kind = "heads"
        elif all(count == block.group_size for count in groups.values()):
            kind = "whole groups"
        elif len(set(groups.values())) <= 1:
            kind = "equal per group"
        else:
            kind = "uneven"
        copies = len(sources) - len(set(sources))
        out.append({"block": block.index, "kind": kind, "query_heads": len(new_query), "kv_heads": len(sources),
                    "kv_copies": copies,
                    "kv_held": {g: n for g, n in sorted(Counter(sources).items()) if n > 1},
                    "kv_copy_parameters": copies * (head_rows(block.key, block.head_size)
                                                    + head_rows(block.value, block.head_size))})
    return out


def layout_report(model: nn.Module) -> list[dict]:
    """Per block: query heads, key/value heads held, distinct groups, and whether key/value rows repeat."""
    out = []
    for b in adapt(model).blocks:
        out.append({"block": b.index, "query_heads": b.n_live, "kv_heads": b.n_kv_live,
                    "kv_groups": len(set(b.kv_sources)), "kv_copies": b.n_kv_live - len(set(b.kv_sources))})
    return out


# -- size report (Greedy-Gnorm paper, Table 2) ------------------------------------------------------------

def _group_of(param_name: str) -> str:
    parts = param_name.split(".")
    if {"embeddings", "embeddings_project", "embed_tokens", "wte", "wpe", "embed_in", "word_embeddings",
            "word_embeddings_layernorm"} & set(parts):   # embed_in: GPT-NeoX; word_embeddings: BLOOM, Falcon
        return "embeddings"
    if {"encoder", "transformer", "layers", "h"} & set(parts):  # decoders keep their layers here too
        return "encoder"
    if "pooler" in parts:
        return "pooler"
    return "classifier"


def parameter_counts(model: nn.Module) -> dict[str, dict[str, float]]:
    """Parameters and MB (at the stored dtype) by module group, plus the attention Q/K/V/O share."""
    groups: dict[str, dict[str, float]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters(remove_duplicate=True):
        if id(p) in seen:
            continue
        seen.add(id(p))
        g = groups.setdefault(_group_of(name), {"params": 0, "mb": 0.0})
        g["params"] += p.numel()
        g["mb"] += p.numel() * p.element_size() / 2**20
    attention = {"params": 0, "mb": 0.0}
    counted: set[int] = set()
    for block in adapt(model).blocks:
        for module in (block.query, block.key, block.value, block.output, *(m for m, _ in block.extra_rows)):
            if id(module) in counted:  # fused Q|K|V: one module
                continue
            counted.add(id(module))
            for p in module.parameters():
                attention["params"] += p.numel()
                attention["mb"] += p.numel() * p.element_size() / 2**20
        for module, name in block.head_params:   # per-head parameters (sinks; DeBERTa v1's q_bias, v_bias)
            p = getattr(module, name)
            if id(p) not in counted and id(module) not in counted:
                counted.add(id(p))
                attention["params"] += p.numel()
                attention["mb"] += p.numel() * p.element_size() / 2**20
    total = {"params": sum(g["params"] for g in groups.values()), "mb": sum(g["mb"] for g in groups.values())}
    out = {k: groups[k] for k in ("embeddings", "encoder", "pooler", "classifier") if k in groups}
    out["attention_qkvo"] = attention
    out["total"] = total
    return {k: {"params": int(v["params"]), "mb": round(v["mb"], 3)} for k, v in out.items()}


def size_report(before: nn.Module, after: nn.Module) -> dict:
    """Before/after table: {group: {"before": {...}, "after": {...}, "removed_params": n}}."""
    b, a = parameter_counts(before), parameter_counts(after)
    return {k: {"before": b[k], "after": a.get(k, {"params": 0, "mb": 0.0}),
                "removed_params": b[k]["params"] - a.get(k, {"params": 0})["params"]} for k in b}
