"""Scoring commands: ``criteria`` (what is available), ``score`` (one ScoreMap), ``trajectory`` (prune step by step
and measure), ``select-alpha`` (HIES α by wAUC on the selection rows, else the calibration split)."""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from ..criteria import REGISTRY, ScoringContext, get
from ..criteria.hies import DEFAULT_ALPHAS, select_alpha, sweep_specs
from ..data import calibration_texts
from ..errors import CriterionError
from ..estimate import estimate_scoring, estimate_trajectory
from ..limits import POSITIVE_INT
from ..trajectory import TrajectoryError, TrajectorySpec, run_seeds, spread
from .common import (
    add_data_args,
    add_mask_arg,
    add_memory_arg,
    add_model_args,
    check_args,
    load_mask,
    load_model_and_data,
    summary,
    tqdm_progress,
)
from .output import checked_out_file, write_json


def _params(pairs: list[str] | None) -> dict:
    """``--param k=v`` pairs as a dict (values parsed by each criterion's Param)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CriterionError(f"--param {pair!r}: expected KEY=VALUE, e.g. --param alpha=0.3.")
        out[key.strip()] = value.strip()
    return out


def _checked(args, evaluation: str | None = None) -> tuple:
    """Criterion and parameters, sizes, mask file and the ``--out`` path, validated before any model is loaded."""
    check_args(args, calib="scoring", evaluation=evaluation)
    checked_out_file(args.out)
    crit = get(args.criterion)
    params = _params(args.param)
    crit.resolve_params(params)
    return crit, params


def cmd_criteria(args) -> dict:
    return {"criteria": [
        {"name": c.name, "description": c.description, "reference": c.reference, "latex": c.latex,
         "dynamic": c.dynamic, "needs_labels": c.needs_labels, "needs_gradients": c.needs_gradients,
         "needs_parser": c.needs_parser, "equivalent_to": c.equivalent_to or None,
         "params": {k: {"default": p.default, "doc": p.doc, "choices": p.choices} for k, p in c.params.items()}}
        for _, c in sorted(REGISTRY.items())]}


def cmd_score(args) -> dict:
    crit, params = _checked(args)
    loaded, calib, _, info = load_model_and_data(args)
    texts = calibration_texts(info["calib_data"], calib)
    start = time.perf_counter()
    ctx = ScoringContext(loaded.model, calib, load_mask(args, loaded), loaded.device, loaded.tokenizer, texts,
                         seed=args.seed, memory_budget=args.memory_budget, select=info["select_batches"] or None)
    if calib:   # the expected duration, on its own line before the bar starts
        print(f"estimate: {estimate_scoring(ctx, [crit.name], {crit.name: params})}", file=sys.stderr, flush=True)
    ctx.progress = tqdm_progress(f"scoring {crit.name}")
    scores = crit(ctx, params)
    for warning in scores.meta.get("warnings", []):   # in the JSON too; stderr so a reader of the terminal sees it
        print(f"warning: {warning}", file=sys.stderr)
    result = {**scores.to_json(), "model": args.model, "data": summary(info),
              "seconds": time.perf_counter() - start}
    return write_json(result, args.out)


def cmd_trajectory(args) -> dict:
    crit, params = _checked(args, evaluation="a trajectory")
    # every setting is checked here, before the model loads (a bad --step or --tolerance costs no waiting)
    spec = TrajectorySpec(criterion=crit, params=params, inverse=args.inverse, step=args.step, budget=args.budget,
                          count=args.count, tolerance=args.tolerance, metric=args.metric, seed=args.seed,
                          stability=args.stability, drop=args.drop, model_name=args.model)
    if POSITIVE_INT(args.seeds):
        raise TrajectoryError(f"Number of seeds {args.seeds!r} must be a positive integer.")
    loaded, calib, evals, info = load_model_and_data(args)
    if calib and evals:   # the expected duration, on its own line before the bar starts
        told = estimate_trajectory(spec, loaded.model, calib, evals, args.seeds, memory_budget=args.memory_budget)
        print(f"estimate: {told}", file=sys.stderr, flush=True)
    runs = run_seeds(replace(spec, data_info=summary(info)), loaded.model, calib, evals, seeds=args.seeds,
                     device=loaded.device, tokenizer=loaded.tokenizer,
                     texts=calibration_texts(info["calib_data"], calib),
                     progress=tqdm_progress(f"trajectory {crit.name}"), memory_budget=args.memory_budget,
                     select=info["select_batches"] or None)
    if len(runs) == 1:
        return write_json(runs[0].to_json(), args.out)
    aucs = [r.auc() for r in runs]
    result = {"criterion": crit.name, "seeds": [r.seed for r in runs], "runs": [r.to_json() for r in runs],
              "spread": spread(runs), "auc_mean": sum(aucs) / len(aucs), "auc_min": min(aucs), "auc_max": max(aucs)}
    return write_json(result, args.out)


def cmd_select_alpha(args) -> dict:
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        raise CriterionError(f"--alphas {args.alphas!r}: expected comma-separated numbers in [0, 1].") from None
    check_args(args, calib="the α sweep (it scores heads on the calibration rows)")
    sweep_specs(alphas, args.budget, 1 if args.step is None else args.step, args.metric)  # the model picks no step
    checked_out_file(args.out)
    loaded, calib, _, info = load_model_and_data(args)
    result = select_alpha(loaded.model, calib, alphas, args.budget, args.step, args.metric, loaded.device,
                          tqdm_progress("HIES α sweep"), select=info["select_batches"] or None)
    return write_json({**result, "model": args.model, "data": summary(info)}, args.out)


def add_commands(sub) -> None:
    p = sub.add_parser("criteria", help="list the head-importance criteria with their descriptions")
    p.set_defaults(handler=cmd_criteria)

    p = sub.add_parser("score", help="score every head with one criterion (higher = more important)")
    add_model_args(p)
    add_data_args(p, eval_size=0)
    add_mask_arg(p)
    add_memory_arg(p)
    p.add_argument("--criterion", required=True, help="criterion name (see: python -m headprune criteria)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="criterion parameter (repeatable)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.set_defaults(handler=cmd_score)

    p = sub.add_parser("trajectory", help="prune heads one step at a time in a criterion's order, measuring each step")
    add_model_args(p)
    add_data_args(p)
    add_memory_arg(p)
    p.add_argument("--criterion", required=True, help="criterion name (see: python -m headprune criteria)")
    p.add_argument("--param", action="append", metavar="KEY=VALUE", help="criterion parameter (repeatable)")
    p.add_argument("--inverse", action="store_true", help="prune the most important heads first")
    p.add_argument("--step", type=int, default=1, help="heads removed per step (default: 1)")
    p.add_argument("--budget", type=float, help="stop at this pruned ratio of all heads, in (0, 1]")
    p.add_argument("--count", type=int, help="stop after this many heads")
    p.add_argument("--tolerance", type=float, help="stop once the metric falls below T x the dense metric")
    p.add_argument("--metric", help="metric for the tolerance and AUC (default: accuracy; pearson for regression)")
    p.add_argument("--seeds", type=int, default=1, help="runs with seeds seed..seed+N-1 (random: the spread)")
    p.add_argument("--stability", action="store_true", help="also measure stability under seeded word drop")
    p.add_argument("--drop", type=float, default=0.1, help="word-drop probability for --stability (default: 0.1)")
    p.add_argument("--out", help="also write the run file (JSON) here")
    p.set_defaults(handler=cmd_trajectory)

    p = sub.add_parser("select-alpha", help="choose HIES's α by wAUC of its pruning curve on the selection rows "
                                            "(--select-data, else a disjoint share of --data, else calibration)")
    add_model_args(p)
    add_data_args(p, eval_size=0)
    p.add_argument("--alphas", default=",".join(map(str, DEFAULT_ALPHAS)),
                   help="comma-separated α grid (default: the paper's [0, 1) in steps of 0.1)")
    p.add_argument("--budget", type=float, default=0.5, help="pruned ratio each curve reaches (default: 0.5)")
    p.add_argument("--step", type=int, help="heads removed per step (default: 5%% of the heads, as hies alpha=auto)")
    p.add_argument("--metric", help="metric of the curves (default: accuracy)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.set_defaults(handler=cmd_select_alpha)
