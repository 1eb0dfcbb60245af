"""``mask``: turn a score file (``score --out``) into a head-mask file, without loading any model.

    headprune mask --scores scores.json --ratio 0.5 --out mask.json      # round(0.5 N) grid heads pruned
    headprune mask --scores scores.json --count 40 [--inverse]           # 40 heads; most important first
    headprune mask --scores sap.json --sparsity 0.25                     # SAP: that level's best-k selection

``--ratio`` / ``--count`` prune in the score's order (``ScoreMap.kept_at`` / ``kept_count``: lowest score first,
heads already pruned in the scores count towards the number). ``--sparsity`` reads SAP's own selection at a target
sparsity with the k that performed best there on the selection data (§4.1): from the score file's
``"per_sparsity"`` levels (``score --criterion sap --sap-sparsities 0.25,0.5,0.75``) or its own ``sparsity``
parameter (``"sap_mask"``). A SAP score with ``layer_threshold`` > 0 writes its whole-layer rule into the mask
(``"dropped_layers"``), which ``evaluate`` and ``prune`` apply.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..criteria.sap import apply_layer_rule, layer_rule_json
from ..errors import HeadpruneError
from ..limits import UNIT
from ..model.mask import HeadMask
from ..scoring import ScoreMap
from .output import checked_out_file, write_json

SAP_CRITERIA = ("sap", "sap-cf")


class MaskCommandError(HeadpruneError):
    pass


def _checked(args) -> None:
    """Every argument, before the score file is read."""
    chosen = [name for name in ("ratio", "count", "sparsity") if getattr(args, name) is not None]
    if len(chosen) != 1:
        raise MaskCommandError("Give exactly one of --ratio R (a pruned share of the grid in [0, 1]), --count N (heads "
                               "pruned) or --sparsity S (SAP's selection at that target sparsity).")
    for name in ("ratio", "sparsity"):
        value = getattr(args, name)
        if value is not None and UNIT(value):
            raise MaskCommandError(f"--{name} {value}: {UNIT(value)}. Accepted: a number in [0, 1], e.g. 0.5.")
    if args.count is not None and args.count < 0:
        raise MaskCommandError(f"--count {args.count}: a head count is 0 or more.")
    if args.sparsity is not None and args.inverse:
        raise MaskCommandError("--inverse applies to --ratio / --count (an order); SAP's --sparsity selection has "
                               "none.")
    checked_out_file(args.out)
    if not Path(args.scores).is_file():
        raise MaskCommandError(f"--scores {args.scores}: no such file. Accepted: a score file written by "
                               "`python -m headprune score --out FILE`.")


def read_scores(path: str) -> tuple[ScoreMap, dict]:
    """The ScoreMap in score file ``path`` and its raw JSON (MaskCommandError naming the file otherwise)."""
    try:
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
        scores = ScoreMap.from_json(obj)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise MaskCommandError(f"--scores {path} is not a headprune score file ({type(exc).__name__}: {exc}). "
                               "Accepted: the JSON of `python -m headprune score --out FILE`.") from None
    check_finite_scores(obj, scores, path)
    return scores, obj


def check_finite_scores(obj: dict, scores: ScoreMap, path: str) -> None:
    """Refuse scores that would order heads silently wrong: a NaN or infinite number in the file (a score file
    writes ``null`` for a head already pruned, never NaN, which the order would also read as pruned), or no
    finite score at all (every head would count as already pruned, and any ratio would prune the whole grid)."""
    bad = [(layer, head, v) for layer, row in enumerate(obj["scores"]) for head, v in enumerate(row)
           if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        listed = ", ".join(f"layer {layer} head {head}: {v}" for layer, head, v in bad[:3])
        raise MaskCommandError(f"--scores {path} holds {len(bad)} non-finite score(s) ({listed}"
                               f"{', ...' if len(bad) > 3 else ''}): a head's place in the order would be a guess. "
                               "Accepted: finite numbers, null for a head already pruned; score again.")
    if np.isnan(scores.scores).all():
        raise MaskCommandError(f"--scores {path} holds no score: every head is null (already pruned), so any "
                               "--ratio or --count would prune the whole grid. Accepted: a score file with a finite "
                               "score for each live head; score again.")


def sap_level(scores: ScoreMap, sparsity: float) -> dict:
    """SAP's selection at ``sparsity`` in a SAP score file: {"best_k", "mask" (with "dropped_layers"), ...}."""
    if scores.criterion != "sap":   # sap-cf's mask is chosen by a tolerance, not at a sparsity
        raise MaskCommandError(f"--sparsity reads SAP's per-sparsity selection; this score file is "
                               f"'{scores.criterion}'. Use --ratio or --count, or score with --criterion sap.")
    levels = {float(k): v for k, v in (scores.meta.get("per_sparsity") or {}).items()}
    if sparsity in levels:
        return levels[sparsity]
    if scores.params.get("sparsity") is not None and float(scores.params["sparsity"]) == sparsity:
        return {"best_k": scores.meta.get("best_k"), "k_sweep": scores.meta.get("k_sweep", {}),
                "mask": {**scores.meta["sap_mask"], "dropped_layers": scores.meta.get("sap_dropped_layers", [])}}
    have = sorted(set(levels) | ({float(scores.params["sparsity"])} if "sparsity" in scores.params else set()))
    raise MaskCommandError(f"--sparsity {sparsity}: this SAP score file holds the levels "
                           f"{', '.join(map(str, have)) or 'none'}. Score again with `python -m headprune score "
                           f"--criterion sap --sap-sparsities {sparsity}` (several: comma-separated).")


def mask_from_scores(scores: ScoreMap, *, ratio: float | None = None, count: int | None = None,
                     inverse: bool = False) -> dict:
    """The mask file pruning ``ratio`` of the grid (or ``count`` heads) in ``scores``'s order: ``kept_at`` /
    ``kept_count`` as a HeadMask JSON, with SAP's whole-layer rule when the score carries a ``layer_threshold``."""
    kept = scores.kept_at(ratio, inverse) if ratio is not None else scores.kept_count(count, inverse)
    mask = HeadMask(kept.astype(np.float32))
    threshold = int(scores.params.get("layer_threshold", 0) or 0) if scores.criterion in SAP_CRITERIA else 0
    if threshold > 0:
        return layer_rule_json(*apply_layer_rule(mask, threshold))
    return mask.to_json()


def cmd_mask(args) -> dict:
    _checked(args)
    scores, _ = read_scores(args.scores)
    if args.count is not None and args.count > scores.scores.size:
        raise MaskCommandError(f"--count {args.count}: the score grid has {scores.scores.size} heads.")
    how = {"ratio": args.ratio, "count": args.count, "sparsity": args.sparsity, "inverse": args.inverse}
    if args.sparsity is not None:
        level = sap_level(scores, args.sparsity)
        obj, how["best_k"] = dict(level["mask"]), level.get("best_k")
    else:
        obj = mask_from_scores(scores, ratio=args.ratio, count=args.count, inverse=args.inverse)
    n_pruned = sum(len(v) for v in obj["pruned"].values())
    result = {**obj, "criterion": scores.criterion, "scores": str(args.scores),
              **{k: v for k, v in how.items() if v is not None and v is not False},
              "pruned_heads": n_pruned, "kept_heads": scores.scores.size - n_pruned}
    return write_json(result, args.out)


def add_commands(sub) -> None:
    p = sub.add_parser("mask", help="turn a score file into a head-mask file at a ratio, a head count or (SAP) a "
                                    "target sparsity; loads no model")
    p.add_argument("--scores", required=True, help="score file from `python -m headprune score --out FILE`")
    p.add_argument("--ratio", type=float, help="prune this share of the grid's heads, in [0, 1], lowest score first")
    p.add_argument("--count", type=int, help="prune this many heads (heads already pruned in the scores count)")
    p.add_argument("--sparsity", type=float,
                   help="SAP only: its selection at this target sparsity with the best k there (from the score "
                        "file's --sap-sparsities levels or its own sparsity parameter)")
    p.add_argument("--inverse", action="store_true", help="prune the most important heads first")
    p.add_argument("--out", help="write the mask file here (loads with --mask in evaluate and prune)")
    p.set_defaults(handler=cmd_mask)
