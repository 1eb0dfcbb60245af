"""A plan in the folder DuoAttention loads, and such a folder read back as a plan.

DuoAttention's loader (mit-han-lab/duo-attention ``duo_attn/utils.py``: ``load_attn_pattern`` then
``sparsify_attention_heads``) does, in order:

1. ``np.loadtxt(DIR/full_attention_heads.tsv, dtype=float, delimiter="\\t")``: one line per layer, one value per
   key/value head, then ``np.clip(..., 0, 1)``;
2. ``json.load(DIR/config.json)["sink_size"]`` and ``["recent_size"]``: what a streaming head keeps;
3. adds uniform noise in [0, 1e-6) to break ties, then keeps full every head whose value is ``>=`` a threshold:
   ``--threshold`` (default 0.5), or with ``--sparsity s`` the ``np.quantile(values, s)`` (s >= 1: none full,
   s <= 0: all full).

:func:`write_duo_folder` writes both files. The TSV holds the plan's CONTINUOUS group scores (``meta
["group_scores"]``, which every rule records), not 0/1: a 0/1 file re-thresholded at any sparsity other than
exactly 1 - full share picks heads at random among ties. Scores outside [0, 1] (a criterion's, far-mass's) are
mapped affinely into it; a head with no score (cut, gated off: -inf) is 0. Then each value gets
``STEP x (n - 1 - rank)`` added (rank: the head's place in the plan's own keep order, ``plan.top_share``: score
high first, ties lower index first) after the scores are scaled by 1 - STEP x n: the file keeps the scores to
within STEP x n and orders every pair of heads as the plan does, by more than the loader's 1e-6 noise, so the
loader's ``--sparsity 1 - k / n`` (written into config.json as ``sparsity``) keeps exactly the plan's k full heads.
A plan without scores (made by hand, read from a 0/1 TSV) writes its 0/1 grid, ordered the same way.

:func:`read_duo_folder` repeats steps 1-2 and deploys by threshold or by share (``plan.top_share``), refusing a
grid that is not the model's, a missing or non-positive recent size, a negative sink size, and values that are
not numbers, before any weights load.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from ..limits import NON_NEGATIVE_INT, POSITIVE_INT
from ..outdir import write_atomic
from ..userinput import read_user_json, read_user_text
from .plan import KVPlan, KVPlanError, check_full_share, check_window, top_share

TSV, CONFIG = "full_attention_heads.tsv", "config.json"
SOURCE = "headprune kvplan"
STEP = 2e-6          # > the loader's tie-breaking noise (uniform in [0, 1e-6))


def plan_values(plan: KVPlan) -> tuple[np.ndarray, np.ndarray]:
    """((L, H_kv) the plan's group scores in [0, 1], (L, H_kv) the same as recorded, -inf for none) (module
    doc); the 0/1 grid twice when the plan records no scores or keeps full other heads than its highest scores
    (a plan edited by hand)."""
    grid = plan.full.numpy().astype(float)
    scores = plan.meta.get("group_scores")
    if scores is None:
        return grid, grid
    raw = np.array([[-np.inf if v is None else float(v) for v in row] for row in scores], dtype=float)
    if raw.shape != plan.shape:
        raise KVPlanError(f"The plan's group scores are {raw.shape[0]} x {raw.shape[1]}; its grid is "
                          f"{plan.shape[0]} x {plan.shape[1]}.")
    if not torch.equal(top_share(torch.as_tensor(raw), int(plan.full.sum()) / plan.full.numel()), plan.full):
        return grid, grid
    finite = np.isfinite(raw)
    values = raw.copy()
    if finite.any() and (raw[finite].min() < 0 or raw[finite].max() > 1):
        low, high = raw[finite].min(), raw[finite].max()
        values = np.where(finite, (raw - low) / (high - low if high > low else 1.0), raw)
    return np.where(finite, values, 0.0), raw


def duo_tsv_values(plan: KVPlan) -> np.ndarray:
    """(L, H_kv) what the TSV holds: :func:`plan_values` ordered as the plan keeps (module doc)."""
    values, raw = plan_values(plan)
    n = values.size
    if STEP * n >= 0.5:
        raise KVPlanError(f"A plan of {n} key/value heads is too large to order within DuoAttention's TSV precision.")
    # the plan's keep order (``plan.top_share``): score high first, ties lower flat index first
    order = sorted(range(n), key=lambda i: (-raw.ravel()[i], i))
    rank = np.empty(n, dtype=float)
    rank[order] = np.arange(n)
    out = values.ravel() * (1 - STEP * n) + STEP * (n - 1 - rank)
    return out.reshape(values.shape)


def check_duo_folder(folder: str | Path) -> Path:
    """A folder ``write_duo_folder`` may write into (before any work): missing, empty of DuoAttention's files, or
    holding a folder headprune wrote (its config.json says so); a user's own files are never overwritten."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise KVPlanError(f"--export-duo {folder} is a file; give a folder (created when missing).")
    if not folder.parent.is_dir():
        raise KVPlanError(f"--export-duo {folder}: its parent folder {folder.parent} does not exist.")
    config = folder / CONFIG
    if (folder / TSV).exists() or config.exists():
        try:
            ours = read_user_json(config, "--export-duo config.json", "DuoAttention's config.json",
                                  error=KVPlanError).get("source") == SOURCE
        except (KVPlanError, AttributeError):
            ours = False
        if not ours:
            raise KVPlanError(f"--export-duo {folder} already holds a DuoAttention pattern headprune did not write; "
                              "give a new folder (nothing of yours is overwritten).")
    return folder


def write_duo_folder(plan: KVPlan, folder: str | Path) -> dict:
    """DuoAttention's folder (module doc): ``full_attention_heads.tsv`` and ``config.json``. Files are written
    beside their final names and renamed into place; returns what config.json says."""
    plan.refuse_compensation("DuoAttention's folder")
    folder = check_duo_folder(folder)
    folder.mkdir(exist_ok=True)
    values = duo_tsv_values(plan)
    n_full = int(plan.full.sum())
    config = {"sink_size": plan.sink, "recent_size": plan.window, "sparsity": 1 - n_full / plan.full.numel(),
              "threshold": None, "num_layers": plan.shape[0], "num_key_value_heads": plan.shape[1],
              "num_attention_heads": plan.n_heads, "full_kv_heads": n_full,
              "source": SOURCE, "rule": plan.meta.get("rule"), "model": plan.meta.get("model"),
              "note": "values: the plan's group scores in [0, 1], ordered as the plan keeps them; load with "
                      "--sparsity <sparsity> for the plan's own head set"}
    for name, text in ((TSV, "\n".join("\t".join(repr(float(v)) for v in row) for row in values) + "\n"),
                       (CONFIG, json.dumps(config, indent=1))):
        # the one writer of outputs: a uniquely named temporary beside the file, renamed over it (a user's
        # ".full_attention_heads.tsv.tmp" is never touched)
        write_atomic(folder / name, text, what="--export-duo folder")
    return config


def read_duo_values(folder: str | Path, shape: tuple[int, int] | None = None) -> tuple[np.ndarray, int, int]:
    """Steps 1-2 of DuoAttention's loader (module doc): (values (L, H_kv) clipped to [0, 1], sink, recent),
    checked against ``shape`` (the model's [L, H_kv]) when given."""
    folder = Path(folder)
    tsv, config_file = folder / TSV, folder / CONFIG
    for path in (tsv, config_file):
        if not path.is_file():
            raise KVPlanError(f"A DuoAttention folder holds {TSV} and {CONFIG}; {path} is missing.")
    # both files through the one safe reader (regular files only, size and nesting bounded), then parsed
    text = read_user_text(tsv, f"DuoAttention's {TSV}", "a tab-separated table of gate values", error=KVPlanError)
    try:
        values = np.loadtxt(io.StringIO(text), dtype=float, delimiter="\t", ndmin=2)
    except ValueError as exc:
        raise KVPlanError(f"{tsv} is not a tab-separated table of numbers (one line per layer, one value per "
                          f"key/value head): {exc}.") from None
    if not np.isfinite(values).all():
        raise KVPlanError(f"{tsv} holds values that are not finite numbers; accepted: gate values in [0, 1].")
    if shape is not None and values.shape != tuple(shape):
        raise KVPlanError(f"{tsv} is {values.shape[0]} layers x {values.shape[1]} key/value heads; the model has "
                          f"{shape[0]} x {shape[1]}. Use the folder made for this model.")
    config = read_user_json(config_file, f"DuoAttention's {CONFIG}", "a JSON object with sink_size and recent_size",
                            error=KVPlanError)
    if not isinstance(config, dict):
        raise KVPlanError(f"{config_file} must be a JSON object with sink_size and recent_size.")
    sink, recent = config.get("sink_size"), config.get("recent_size")
    if POSITIVE_INT(recent):
        raise KVPlanError(f"{config_file}: recent_size {recent!r} {POSITIVE_INT(recent)} (the last keys a streaming "
                          "head keeps; 0 would keep no recent key, not even the query's own).")
    if NON_NEGATIVE_INT(sink):
        raise KVPlanError(f"{config_file}: sink_size {sink!r} {NON_NEGATIVE_INT(sink)} (the first keys a "
                          "streaming head keeps).")
    return np.clip(values, 0, 1), sink, recent


def read_duo_folder(folder: str | Path, n_heads: int, shape: tuple[int, int] | None = None, *,
                    share: float | None = None, threshold: float | None = None) -> KVPlan:
    """A DuoAttention folder as a plan: groups with value >= ``threshold`` full, or the ``share`` with the highest
    values (ties lower index first: deterministic, where the loader adds noise). One of the two is given."""
    if (share is None) == (threshold is None):
        raise KVPlanError("Deploy a DuoAttention pattern by --full-share or by --threshold, one of the two.")
    values, sink, recent = read_duo_values(folder, shape)
    check_window(sink, recent)
    if share is not None:
        check_full_share(share)
        full = top_share(torch.as_tensor(values), share)
    else:
        full = torch.as_tensor(values >= threshold)
    if n_heads % values.shape[1]:
        raise KVPlanError(f"The model's {n_heads} query heads are not a multiple of the folder's {values.shape[1]} "
                          "key/value heads.")
    return KVPlan(full, n_heads, sink, recent, {"rule": "duo-folder", "source": str(folder), "full_share": share,
                                               "threshold": threshold,
                                               "group_scores": [[float(v) for v in row] for row in values]})
