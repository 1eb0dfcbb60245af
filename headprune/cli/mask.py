"""``mask``: turn a score file (``score --out``) into a head-mask file, without loading any model.

    headprune mask --scores scores.json --ratio 0.5 --out mask.json      # round(0.5 N) grid heads pruned
    headprune mask --scores scores.json --count 40 [--inverse]           # 40 heads; most important first
    headprune mask --scores sap.json --sparsity 0.25                     # SAP: that level's best-k selection
    headprune mask --scores sap-cf.json --sparsity 0.25                  # SAP+CF: CF's own selection there

``--ratio`` / ``--count`` prune in the score's order (``ScoreMap.kept_at`` / ``kept_count``: lowest score first,
heads already pruned in the scores count towards the number). ``--sparsity`` reads SAP's own selection at a target
sparsity with the k that performed best there on the selection data (§4.1): from the score file's
``"per_sparsity"`` levels (``score --criterion sap --sap-sparsities 0.25,0.5,0.75``) or its own ``sparsity``
parameter (``"sap_mask"``); for SAP+CF, CF's own selection at that target (``"mask"``: its candidate pool
re-ranked by measured degradation, ``headprune.criteria.sap`` §3.4). A SAP score with ``layer_threshold`` > 0
writes its whole-layer rule into the mask (``"dropped_layers"``), which ``evaluate`` and ``prune`` apply. For a
``kwon`` score file (Kwon et al.) ``--sparsity`` is 1 − its ``budget``: the rearranged mask with the tuned head
scales (``"scales"``) it was scored to.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..criteria.kwon import kwon_mask
from ..criteria.sap import OWN_SELECTION, apply_layer_rule, layer_rule_json
from ..errors import HeadpruneError
from ..limits import UNIT
from ..model.mask import HeadMask
from ..scoring import ScoreMap
from ..userinput import read_user_json
from .output import add_force_arg, check_out_arg, write_out

SAP_CRITERIA = tuple(OWN_SELECTION)
SCORES_ACCEPTED = "the JSON of `python -m headprune score --out FILE`"


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
    check_out_arg(args)
    if not Path(args.scores).is_file():
        raise MaskCommandError(f"--scores {args.scores}: no such file. Accepted: a score file written by "
                               "`python -m headprune score --out FILE`.")


def read_scores(path: str) -> tuple[ScoreMap, dict]:
    """The ScoreMap in score file ``path`` and its raw JSON (MaskCommandError naming the file otherwise)."""
    obj = read_user_json(path, "--scores", SCORES_ACCEPTED, error=MaskCommandError)   # the one safe reader
    try:
        scores = ScoreMap.from_json(obj)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
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
    """The selection of SAP (or SAP+CF) at ``sparsity`` in its score file: {"best_k", "mask" (with
    "dropped_layers"), ...}; SAP+CF's is CF's own at that target (its pool re-ranked by degradation)."""
    if scores.criterion not in OWN_SELECTION:
        raise MaskCommandError(f"--sparsity reads SAP's (or SAP+CF's) per-sparsity selection; this score file is "
                               f"'{scores.criterion}'. Use --ratio or --count, or score with --criterion sap or "
                               "sap-cf.")
    levels = scores.meta.get("per_sparsity") or {}
    if not isinstance(levels, dict) or not all(isinstance(k, str) and number_text(k) for k in levels):
        raise unreadable(scores, '"per_sparsity" is an object {"<sparsity>": level}')
    levels = {float(k): v for k, v in levels.items()}
    mask_key, dropped_key = OWN_SELECTION[scores.criterion]
    own = scores.params.get("sparsity")
    if own is not None and (not isinstance(own, (int, float)) or isinstance(own, bool)):
        raise unreadable(scores, 'its params\' "sparsity" is a number')
    if sparsity in levels:
        level = levels[sparsity]
    elif own is not None and float(own) == sparsity:
        level = {"best_k": scores.meta.get("best_k"), "k_sweep": scores.meta.get("k_sweep", {}),
                 "mask": {**scores.meta[mask_key], "dropped_layers": scores.meta.get(dropped_key, [])}
                 if isinstance(scores.meta.get(mask_key), dict) else None}
    else:
        level = None
    if level is not None:
        if not isinstance(level, dict) or not isinstance(level.get("mask"), dict):
            raise unreadable(scores, f"its level at sparsity {sparsity:g} holds its mask (an object)")
        return level
    have = sorted(set(levels) | ({float(own)} if own is not None else set()))
    raise MaskCommandError(f"--sparsity {sparsity}: this {scores.criterion} score file holds the levels "
                           f"{', '.join(map(str, have)) or 'none'}. Score again with `python -m headprune score "
                           f"--criterion {scores.criterion} --sap-sparsities {sparsity}` (several: "
                           "comma-separated).")


def number_text(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def unreadable(scores: ScoreMap, accepted: str) -> MaskCommandError:
    """The error of a score file whose ``criterion``'s own fields are not what headprune writes."""
    return MaskCommandError(f"--sparsity: this {scores.criterion} score file is not one headprune wrote: "
                            f"{accepted}. Accepted: the JSON of `python -m headprune score --criterion "
                            f"{scores.criterion} --out FILE`; score again.")


def kwon_level(scores: ScoreMap, sparsity: float) -> dict:
    """Kwon et al.'s final mask (rearranged, with tuned scales) in a ``kwon`` score file scored at budget
    1 − ``sparsity``; MaskCommandError naming the budget it holds otherwise."""
    budget = scores.params.get("budget")
    if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not 0 < budget <= 1:
        raise unreadable(scores, 'its params\' "budget" is a number in (0, 1]')
    if "kwon_mask" in scores.meta and not isinstance(scores.meta["kwon_mask"], dict):
        raise unreadable(scores, 'its "kwon_mask" is a mask (an object)')
    mask = kwon_mask(scores, sparsity)
    if mask is None:
        budget = scores.params.get("budget")
        raise MaskCommandError(f"--sparsity {sparsity}: this kwon score file was scored at budget {budget} (sparsity "
                               f"{1 - float(budget):g}); its tuned mask exists at that sparsity only. Score again with "
                               f"`--criterion kwon --param budget={1 - sparsity:g}`, or use --ratio (the order).")
    return mask.to_json()


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
    if args.sparsity is not None and scores.criterion == "kwon":
        obj = kwon_level(scores, args.sparsity)
    elif args.sparsity is not None:
        level = sap_level(scores, args.sparsity)
        obj, how["best_k"] = dict(level["mask"]), level.get("best_k")
    else:
        obj = mask_from_scores(scores, ratio=args.ratio, count=args.count, inverse=args.inverse)
    n_pruned = sum(len(v) for v in obj["pruned"].values())
    result = {**obj, "criterion": scores.criterion, "scores": str(args.scores),
              **{k: v for k, v in how.items() if v is not None and v is not False},
              "pruned_heads": n_pruned, "kept_heads": scores.scores.size - n_pruned}
    return write_out(result, args)


def add_commands(sub) -> None:
    p = sub.add_parser("mask", help="turn a score file into a head-mask file at a ratio, a head count or (SAP) a "
                                    "target sparsity; loads no model")
    p.add_argument("--scores", required=True, help="score file from `python -m headprune score --out FILE`")
    p.add_argument("--ratio", type=float, help="prune this share of the grid's heads, in [0, 1], lowest score first")
    p.add_argument("--count", type=int, help="prune this many heads (heads already pruned in the scores count)")
    p.add_argument("--sparsity", type=float,
                   help="SAP / SAP+CF: its own selection at this target sparsity with the best k there (from the "
                        "score file's --sap-sparsities levels or its own sparsity parameter); kwon: its tuned mask "
                        "at 1 - budget")
    p.add_argument("--inverse", action="store_true", help="prune the most important heads first")
    p.add_argument("--out", help="write the mask file here (loads with --mask in evaluate and prune)")
    add_force_arg(p)
    p.set_defaults(handler=cmd_mask)
