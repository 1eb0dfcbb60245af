"""A kvpress press that takes a headprune KV plan file (``headprune kvplan --out plan.json``).

kvpress's ``DuoAttentionPress`` (NVIDIA/kvpress 0.5.5, ``kvpress/presses/duo_attention_press.py``) downloads
DuoAttention's patterns for six named checkpoints and has no file argument. :class:`HeadprunePlanPress` is that
press with its ``post_init_from_model`` reading a headprune plan instead: sink and recent sizes from the plan, and
head scores that order the key/value heads as the plan keeps them (its full heads first, then the plan's own group
scores, ties lower index first). With the default ``head_compression_ratio`` (None: the plan's streamed share)
kvpress's ``np.argsort(scores)[:n_pruned]`` streams exactly the plan's streaming heads; another ratio streams the
lowest-ranked heads of the plan's order, as ``headprune kvplan --full-share 1 - ratio`` would keep them.

This file imports kvpress, so it lives outside the headprune package (kvpress 0.5.5 pins transformers < 5.3, which
headprune's pin excludes): run it in kvpress's own environment; the plan file is the only thing that crosses
(``benchmarks/kvpress_check.sh`` does exactly that). It never imports headprune.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
from kvpress import DuoAttentionPress

FORMAT = "headprune-kv-plan"


def read_plan(path: str) -> dict:
    """The plan file's grid (bool array (L, H_kv)), sink, window and group scores (or None)."""
    with open(path) as handle:
        obj = json.load(handle)
    if obj.get("format") != FORMAT:
        raise ValueError(f"{path} is not a headprune KV plan (no \"format\": \"{FORMAT}\").")
    layers, n_kv = obj["shape"]
    full = np.zeros((layers, n_kv), dtype=bool)
    for layer, groups in obj["full"].items():
        full[int(layer), groups] = True
    scores = obj.get("group_scores")
    if scores is not None:
        scores = np.array([[-np.inf if v is None else float(v) for v in row] for row in scores], dtype=float)
    return {"full": full, "sink": int(obj.get("sink", 4)), "window": int(obj.get("window", 64)), "scores": scores,
            "n_heads": int(obj["n_heads"])}


def plan_rank_scores(full: np.ndarray, scores: np.ndarray | None) -> np.ndarray:
    """(L, H_kv) distinct scores, higher = kept full earlier: the plan's full heads first, then its group scores
    (high first), ties lower flat index first."""
    n = full.size
    flat_scores = np.zeros(n) if scores is None else scores.ravel()
    order = sorted(range(n), key=lambda i: (not full.ravel()[i], -flat_scores[i], i))
    ranked = np.empty(n)
    ranked[order] = np.arange(n, 0, -1, dtype=float)        # first kept: highest
    return ranked.reshape(full.shape)


@dataclass
class HeadprunePlanPress(DuoAttentionPress):
    """DuoAttentionPress whose pattern is a headprune plan file (module doc). ``head_compression_ratio`` None:
    the plan's own streamed share."""

    plan_file: str = ""
    head_compression_ratio: float | None = None

    def post_init_from_model(self, model):
        if self.head_compression_ratio is None:
            self.head_compression_ratio = float((~read_plan(self.plan_file)["full"]).mean())
        super().post_init_from_model(model)      # kvpress's own selection, on the scores below

    def load_attention_pattern(self, model):
        """(sink, recent, head scores) from the plan file, where kvpress would download DuoAttention's."""
        plan = read_plan(self.plan_file)
        want = (model.config.num_hidden_layers, model.config.num_key_value_heads)
        if plan["full"].shape != want:
            raise ValueError(f"The plan is for {plan['full'].shape[0]} x {plan['full'].shape[1]} key/value heads; "
                             f"this model has {want[0]} x {want[1]}.")
        return plan["sink"], plan["window"], plan_rank_scores(plan["full"], plan["scores"])
