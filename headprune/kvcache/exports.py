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
A plan whose full heads are not its highest scores (heads switched by hand on the dashboard) keeps its scores and
its head set: full heads' values are mapped into the upper half [0.5, 1], streaming heads' into the lower half, each
in score order, and ordered as the plan keeps, so the written sparsity keeps the plan's heads. A plan without scores
(made by hand in a file) writes its 0/1 grid, ordered the same way. Every export writes both files -- ``kvplan
--export-duo DIR``, ``kvplan --tsv DIR/full_attention_heads.tsv`` and the dashboard's zip (:func:`duo_folder_zip`)
-- so no 0/1 TSV without its config.json leaves headprune.

:func:`read_duo_folder` repeats steps 1-2 and deploys by threshold or by share (``plan.top_share``), refusing a
grid that is not the model's, a missing or non-positive recent size, a negative sink size, and values that are
not numbers, before any weights load.
"""

from __future__ import annotations

import io
import json
import zipfile
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
    doc); the 0/1 grid twice when the plan records no scores. Scores outside [0, 1] are mapped affinely into it;
    when the plan keeps full other heads than its highest scores, full heads go to [0.5, 1] and streaming ones to
    [0, 0.5)."""
    grid = plan.full.numpy().astype(float)
    scores = plan.meta.get("group_scores")
    if scores is None:
        return grid, grid
    raw = np.array([[-np.inf if v is None or v != v else float(v) for v in row] for row in scores], dtype=float)
    if raw.shape != plan.shape:
        raise KVPlanError(f"The plan's group scores are {raw.shape[0]} x {raw.shape[1]}; its grid is "
                          f"{plan.shape[0]} x {plan.shape[1]}.")
    finite = np.isfinite(raw)
    values = raw.copy()
    if finite.any() and (raw[finite].min() < 0 or raw[finite].max() > 1):
        low, high = raw[finite].min(), raw[finite].max()
        values = np.where(finite, (raw - low) / (high - low if high > low else 1.0), raw)
    values = np.where(finite, values, 0.0)
    if not torch.equal(top_share(torch.as_tensor(raw), int(plan.full.sum()) / plan.full.numel()), plan.full):
        values = np.where(grid > 0, 0.5 + values / 2, values / 2 * (1 - 1e-3))   # streaming stays below 0.5
    return values, raw


def duo_tsv_values(plan: KVPlan) -> np.ndarray:
    """(L, H_kv) what the TSV holds: :func:`plan_values` ordered as the plan keeps (module doc)."""
    values, raw = plan_values(plan)
    n = values.size
    if STEP * n >= 0.5:
        raise KVPlanError(f"A plan of {n} key/value heads is too large to order within DuoAttention's TSV precision.")
    # the plan's keep order: its full heads first, then by score high first, ties lower flat index first (for a
    # plan of its highest scores, ``plan.top_share``'s order)
    full = plan.full.numpy().ravel()
    order = sorted(range(n), key=lambda i: (not full[i], -raw.ravel()[i], i))
    rank = np.empty(n, dtype=float)
    rank[order] = np.arange(n)
    out = values.ravel() * (1 - STEP * n) + STEP * (n - 1 - rank)
    return out.reshape(values.shape)


def check_duo_folder(folder: str | Path, flag: str = "--export-duo") -> Path:
    """A folder ``write_duo_folder`` may write into (before any work): missing, empty of DuoAttention's files, or
    holding a folder headprune wrote (its config.json says so); a user's own files are never overwritten."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise KVPlanError(f"{flag} {folder} is a file; give a folder (created when missing).")
    if not folder.parent.is_dir():
        raise KVPlanError(f"{flag} {folder}: its parent folder {folder.parent} does not exist.")
    config = folder / CONFIG
    if (folder / TSV).exists() or config.exists():
        try:
            ours = read_user_json(config, "--export-duo config.json", "DuoAttention's config.json",
                                  error=KVPlanError).get("source") == SOURCE
        except (KVPlanError, AttributeError):
            ours = False
        if not ours:
            raise KVPlanError(f"{flag} {folder} already holds a DuoAttention pattern or a config.json headprune did "
                              "not write; give a new folder (nothing of yours is overwritten).")
    return folder


def tsv_folder(path: str | Path) -> Path:
    """``kvplan --tsv PATH``: DuoAttention's loader reads ``DIR/full_attention_heads.tsv`` beside
    ``DIR/config.json``, so the TSV is written with its config.json into PATH's folder (:func:`check_duo_folder`);
    any other file name is refused."""
    path = Path(path)
    if path.name != TSV:
        raise KVPlanError(f"--tsv {path}: DuoAttention's loader reads {TSV} beside a config.json in one folder, and "
                          f"--tsv writes both there. Name the file {TSV} (its folder gets config.json), or give the "
                          "folder with --export-duo DIR.")
    return check_duo_folder(path.parent if str(path.parent) else Path("."), "--tsv")


def duo_folder_files(plan: KVPlan) -> tuple[dict, dict[str, str]]:
    """(what config.json says, {file name: text}) of DuoAttention's folder (module doc): one window for every
    streaming head, no compensation token, so a budget plan or a plan with the token is refused."""
    if plan.is_budget:
        raise KVPlanError("DuoAttention's folder holds one window for every streaming head; a budget plan's groups "
                          "each have their own. Export its JSON (the budgets) instead.")
    plan.refuse_compensation("DuoAttention's folder")
    values = duo_tsv_values(plan)
    n_full = int(plan.full.sum())
    config = {"sink_size": plan.sink, "recent_size": plan.window, "sparsity": 1 - n_full / plan.full.numel(),
              "threshold": None, "num_layers": plan.shape[0], "num_key_value_heads": plan.shape[1],
              "num_attention_heads": plan.n_heads, "full_kv_heads": n_full,
              "source": SOURCE, "rule": plan.meta.get("rule"), "model": plan.meta.get("model"),
              "note": "values: the plan's group scores in [0, 1], ordered as the plan keeps them; load with "
                      "--sparsity <sparsity> for the plan's own head set"}
    tsv = "\n".join("\t".join(repr(float(v)) for v in row) for row in values) + "\n"
    return config, {TSV: tsv, CONFIG: json.dumps(config, indent=1)}


def write_duo_folder(plan: KVPlan, folder: str | Path, flag: str = "--export-duo") -> dict:
    """DuoAttention's folder (module doc): ``full_attention_heads.tsv`` and ``config.json``. Files are written
    beside their final names and renamed into place; returns what config.json says."""
    config, files = duo_folder_files(plan)
    folder = check_duo_folder(folder, flag)
    folder.mkdir(exist_ok=True)
    for name, text in files.items():
        # the one writer of outputs: a uniquely named temporary beside the file, renamed over it (a user's
        # ".full_attention_heads.tsv.tmp" is never touched)
        write_atomic(folder / name, text, what=f"{flag} folder")
    return config


def duo_folder_zip(plan: KVPlan, folder: str = "duo_attention_pattern") -> bytes:
    """The same two files in a zip, inside ``folder/`` (the dashboard's download: one file for a browser)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, text in duo_folder_files(plan)[1].items():
            archive.writestr(f"{folder}/{name}", text)
    return buffer.getvalue()


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
