"""Scoring commands: ``criteria`` (what is available), ``score`` (one ScoreMap), ``trajectory`` (prune step by step
and measure), ``select-alpha`` (HIES α by wAUC on the selection rows, else the calibration split)."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..criteria import REGISTRY, ScoringContext, get
from ..criteria.hies import DEFAULT_ALPHAS, select_alpha, sweep_specs
from ..criteria.sap import levels_json
from ..data import calibration_texts, content_hash
from ..errors import CriterionError
from ..estimate import estimate_harness, estimate_scoring, estimate_trajectory
from ..evaluation.harness import harness_metrics, is_harness_metric, metric_tasks, resolve_tasks
from ..evaluation.stability import STABILITY_METRICS
from ..limits import UNIT
from ..model.export import FORMATS
from ..model.loading import declared_refusal
from ..trajectory import (
    RUNS,
    CalibrationDraw,
    TrajectoryError,
    TrajectorySpec,
    measure_points,
    point_steps,
    repeat_summary,
    run_repeats,
    spread,
)
from .common import (
    add_data_args,
    add_mask_arg,
    add_memory_arg,
    add_metric_arg,
    add_model_args,
    build_workspace,
    check_args,
    load_mask,
    load_model_and_data,
    metric_choice,
    summary,
    tqdm_progress,
)
from .core import add_harness_options, check_prune_out, export_pruned, harness_spec
from .output import add_force_arg, check_out_arg, checked_out_file, write_json, write_out


def _params(pairs: list[str] | None) -> dict:
    """``--param k=v`` pairs as a dict (values parsed by each criterion's Param)."""
    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CriterionError(f"--param {pair!r}: expected KEY=VALUE, e.g. --param alpha=0.3.")
        out[key.strip()] = value.strip()
    return out


def _checked(args, evaluation: str | None = None, extra_metrics: tuple[str, ...] = ()) -> tuple:
    """Criterion and parameters, sizes, mask file and the ``--out`` path, validated before any model is loaded."""
    check_args(args, calib="scoring", evaluation=evaluation, extra_metrics=extra_metrics)
    check_out_arg(args)
    crit = get(args.criterion)
    params = _params(args.param)
    crit.resolve_params(params)
    refused = declared_refusal(args.model, crit.name)   # a family that cannot take it, said before loading
    if refused:
        raise CriterionError(f"--criterion {crit.name} cannot run on {args.model}: {refused}")
    return crit, params


def sap_levels(text: str | None, crit, params: dict | None = None) -> list[float]:
    """``--sap-sparsities 0.25,0.5,0.75`` as target sparsities, checked before any model loads (with ``params``:
    the criterion's parameters at each level, e.g. a sap-cf ``pool`` that must hold every target)."""
    if not text:
        return []
    if not hasattr(crit, "per_sparsity"):
        raise CriterionError(f"--sap-sparsities selects SAP's best k per target sparsity; criterion '{crit.name}' "
                             "has no such selection. Accepted with: --criterion sap or sap-cf.")
    try:
        levels = [crit.params["sparsity"].parse("sparsity", float(x)) for x in text.split(",")]
    except ValueError:
        raise CriterionError(f"--sap-sparsities {text!r}: expected comma-separated numbers in [0, 1), e.g. "
                             "0.25,0.5,0.75.") from None
    for level in levels:
        crit.resolve_params({**(params or {}), "sparsity": level})
    return levels


def cmd_criteria(args) -> dict:
    return {"criteria": [
        {"name": c.name, "description": c.description, "reference": c.reference, "latex": c.latex,
         "dynamic": c.dynamic, "needs_labels": c.needs_labels, "needs_gradients": c.needs_gradients,
         "needs_parser": c.needs_parser, "equivalent_to": c.equivalent_to or None,
         "params": {k: {"default": p.default, "doc": p.doc, "choices": p.choices} for k, p in c.params.items()}}
        for _, c in sorted(REGISTRY.items())]}


def cmd_score(args) -> dict:
    crit, params = _checked(args)
    levels = sap_levels(args.sap_sparsities, crit, params)
    if not levels and "sparsity" in crit.params and "sparsity" not in params:
        # no sweep gives a sparsity later: the default is the one that runs, so the parameters are checked at it
        # (sap-cf's cf_pool = 'widened' applies to a target sparsity; without one it would be ignored)
        crit.resolve_params({**params, "sparsity": crit.params["sparsity"].default})
    loaded, calib, _, info = load_model_and_data(args)
    texts = calibration_texts(info["calib_data"], calib)
    start = time.perf_counter()
    ctx = ScoringContext(loaded.model, calib, load_mask(args, loaded), loaded.device, loaded.tokenizer, texts,
                         seed=args.seed, memory_budget=args.memory_budget, select=info["select_batches"] or None)
    if calib:   # the expected duration, on its own line before the bar starts
        print(f"estimate: {estimate_scoring(ctx, [crit.name], {crit.name: params})}", file=sys.stderr, flush=True)
    ctx.progress = tqdm_progress(f"scoring {crit.name}")
    scores = crit(ctx, params)
    if levels:   # SAP as the paper runs it: its own selection and best k at each level (§4.1, Fig. 7)
        ctx.progress = tqdm_progress("SAP per sparsity")
        scores.meta["per_sparsity"] = levels_json(crit.per_sparsity(ctx, levels, params))
    for warning in scores.meta.get("warnings", []):   # in the JSON too; stderr so a reader of the terminal sees it
        print(f"warning: {warning}", file=sys.stderr)
    result = {**scores.to_json(), "model": args.model, "data": summary(info),
              "seconds": time.perf_counter() - start}
    return write_out(result, args)


def save_mask_points(text: str | None, option: str = "--save-mask") -> list[float | str]:
    """``--save-mask 0.25,0.5`` / ``stop`` (or ``--at``) as points (ratios in [0, 1], or "stop"), checked before any
    model loads."""
    if not text:
        return []
    points: list[float | str] = []
    for item in text.split(","):
        item = item.strip()
        try:
            point = "stop" if item == "stop" else float(item)
        except ValueError:
            point = None
        if point is None or (point != "stop" and UNIT(point)):
            raise TrajectoryError(f"{option} {text!r}: {item!r} is neither a pruned ratio in [0, 1] nor 'stop'. "
                                  "Accepted: comma-separated ratios and/or stop, e.g. 0.25,0.5,stop.")
        points.append(point)
    return points


def mask_path(out: Path, point, repeat: int) -> Path:
    """Where ``--save-mask`` writes the mask at ``point`` of run ``repeat``: next to ``out`` (``run.json`` ->
    ``run.mask-0.5.json``, with ``.r<repeat>`` for repeats after the first)."""
    tag = f".r{repeat}" if repeat else ""
    return out.with_name(f"{out.stem}{tag}.mask-{point}{out.suffix or '.json'}")


def _mask_files(runs: list, points: list, args) -> dict:
    """Write the mask of every run at every point (``mask_path``); returns {point: [file, ...]}."""
    written: dict[str, list[str]] = {}
    for run in runs:
        for point in points:
            index = run.stop_index() if point == "stop" else run.point_at_ratio(point)
            mask, state = run.mask_at(index), (run.steps[index - 1]["metrics"] if index else run.dense)
            path = mask_path(Path(args.out), point, run.repeat)
            at_step = {name: row["value"] for name, rows in run.points.items() for row in rows
                       if row["step"] == index}   # lm-eval numbers measured at this step (--metric lm-eval:...)
            write_json({**mask.to_json(), "criterion": run.criterion, "step": index, "point": point,
                        "ratio": float(run.ratios()[index]), "metrics": {**{m: state[m] for m in run.metric_set
                                                                            if m in state}, **at_step},
                        run.metric: state[run.metric], "repeat": run.repeat}, str(path), args.force, args.command)
            written.setdefault(str(point), []).append(str(path))
    return written


DEFAULT_AT = tuple(round(0.1 * i, 1) for i in range(1, 11))   # lm-eval points when neither --at nor --save-mask


def harness_points(args) -> tuple[list[str], list[float | str]]:
    """(lm-eval metric names, points) of ``trajectory --metric lm-eval:TASK/METRIC[,...] [--at R,...]``: an lm-eval
    number is measured only at chosen points (one lm-eval run each), never every step. ([], []) for a headprune
    metric. The points: --at, else the --save-mask points, else every 10 % of the grid the run reaches."""
    names = [n.strip() for n in (args.metric or "").split(",") if n.strip()]
    if not any(is_harness_metric(n) for n in names):
        if args.at:
            raise TrajectoryError("--at names the points where an lm-eval metric is measured: give --metric "
                                  "lm-eval:TASK/METRIC too (every step already records the task's metrics).")
        return [], []
    if not all(is_harness_metric(n) for n in names):
        raise TrajectoryError(f"--metric {args.metric!r}: either one headprune metric (read at every step) or "
                              "lm-eval metrics lm-eval:TASK/METRIC[,...] (read at --at points), not both.")
    if args.tolerance is not None:
        raise TrajectoryError("--tolerance reads its metric after every step; an lm-eval metric is measured only at "
                              "--at points. Accepted: a tolerance on the task's own metric (--metric accuracy, "
                              "acc, perplexity...) or lm-eval metrics without --tolerance.")
    metric_tasks(names)   # every name is TASK/METRIC
    return names, save_mask_points(args.at, "--at") or save_mask_points(args.save_mask) or list(DEFAULT_AT)


def cmd_trajectory(args) -> dict:
    lm_names, at = harness_points(args)
    if lm_names:   # the steps record the task's own metrics (headline: the task's); lm-eval's at the points
        args = argparse.Namespace(**{**vars(args), "metric": None})
    crit, params = _checked(args, evaluation="a trajectory", extra_metrics=STABILITY_METRICS)
    points = save_mask_points(args.save_mask)
    lm_tasks = resolve_tasks(harness_spec(args, metric_tasks(lm_names))) if lm_names else None
    # every setting is checked here, before the model loads (a bad --step or --tolerance costs no waiting)
    for option, value in (("--seeds", args.seeds), ("--repeats", args.repeats)):
        if RUNS(value):
            raise TrajectoryError(f"{option} {value!r} must be a positive integer, at most {RUNS.high:,} "
                                  f"({RUNS.why}).")
    if args.seeds > 1 and args.repeats > 1:
        raise TrajectoryError("Choose --seeds (criterion seeds on one calibration draw) or --repeats (re-drawn "
                              "calibration and criterion seeds), not both.")
    if points and not args.out:
        raise TrajectoryError("--save-mask writes its masks next to the run file: give --out FILE too.")
    for repeat in range(max(args.seeds, args.repeats)) if points else ():   # every file it writes, checked now
        for point in points:
            checked_out_file(str(mask_path(Path(args.out), point, repeat)), args.force, "--save-mask")
    if args.prune_out:
        check_prune_out(args.prune_out, "--prune-out", args.format, args.model)
    spec = TrajectorySpec(criterion=crit, params=params, inverse=args.inverse, step=args.step, budget=args.budget,
                          count=args.count, tolerance=args.tolerance, metric=args.metric, seed=args.seed,
                          stability=args.stability, drop=args.drop, model_name=args.model,
                          independent=crit.name == "random" and args.repeats > 1)
    ws = build_workspace(args)
    names, head = metric_choice(args, ws, extra=STABILITY_METRICS)
    info = {**ws.info(), "model": args.model, "data": args.data}
    spec = replace(spec, metric=head, metric_set=names, data_info=info)
    n_runs = max(args.seeds, args.repeats)
    if ws.calib_batches and ws.eval_batches:   # the expected duration, on its own line before the bar starts
        told = estimate_trajectory(spec, ws.loaded.model, ws.calib_batches, ws.eval_batches, n_runs,
                                   memory_budget=args.memory_budget)
        print(f"estimate: {told}", file=sys.stderr, flush=True)
        if lm_tasks is not None:   # at most one lm-eval run per point (and the start) of each run
            once = estimate_harness(ws.loaded.model, ws.loaded.tokenizer, lm_tasks, ws.eval_batches,
                                    memory_budget=args.memory_budget)
            print(f"estimate: lm-eval at up to {len(set(at)) + 1} points per run, {once} each", file=sys.stderr,
                  flush=True)
    draws = [ws.calibration_draw(r) for r in range(args.repeats)]
    draws = [CalibrationDraw(batches, calibration_texts(calib, batches), content_hash(calib))
             for calib, batches in draws] * (args.seeds if args.repeats == 1 else 1)
    hashes = [d.hash for d in draws]
    if args.repeats > 1 and len(set(hashes)) < len(hashes):
        print("warning: some repeats drew the same calibration rows (the calibration size takes every row the "
              "evaluation set leaves); choose a smaller --calib-size for distinct draws.", file=sys.stderr)
    runs = run_repeats(spec, ws.loaded.model, draws, ws.eval_batches, device=ws.loaded.device,
                       tokenizer=ws.loaded.tokenizer, progress=tqdm_progress(f"trajectory {crit.name}"),
                       memory_budget=args.memory_budget, select=ws.select_batches or None)
    if lm_names:
        measure_points(runs, at, lm_names,
                       lambda mask: harness_metrics(ws.loaded.model, ws.loaded.tokenizer, mask, lm_names,
                                                    tasks=lm_tasks),
                       progress=tqdm_progress("lm-eval points"))
    if len(runs) == 1:
        result = runs[0].to_json()
    else:
        aucs = [r.auc() for r in runs]
        result = {"criterion": crit.name, "seeds": [r.seed for r in runs], "repeats": args.repeats,
                  "runs": [r.to_json() for r in runs],
                  "spread": spread(runs, band=args.repeats > 1 and crit.name != "random"),
                  "auc_mean": sum(aucs) / len(aucs), "auc_min": min(aucs), "auc_max": max(aucs)}
        if args.repeats > 1:
            result["summary"] = repeat_summary(runs)
    if lm_names:
        result["lm_eval_points"] = {"metrics": lm_names, "at": at, "steps": [point_steps(r, at) for r in runs],
                                    "settings": {k: v for k, v in vars(lm_tasks.spec).items() if k != "tasks"}}
    if points:
        result["masks"] = _mask_files(runs, points, args)
    if args.prune_out:   # Algorithm 1's F: the first run's model at the last --save-mask point (default: stop)
        run, point = runs[0], points[-1] if points else "stop"
        index = run.stop_index() if point == "stop" else run.point_at_ratio(point)
        _, report = export_pruned(ws.loaded, run.mask_at(index), args.prune_out, args.format,
                                  extra={"trajectory_step": index, "point": point})
        result["pruned_model"] = {"out": args.prune_out, "format": args.format, "step": index, "point": point,
                                  **{k: v for k, v in report.items() if k != "sizes"}}
    return write_out(result, args)


def cmd_select_alpha(args) -> dict:
    try:
        alphas = [float(a) for a in args.alphas.split(",")]
    except ValueError:
        raise CriterionError(f"--alphas {args.alphas!r}: expected comma-separated numbers in [0, 1].") from None
    check_args(args, calib="the α sweep (it scores heads on the calibration rows)")
    sweep_specs(alphas, args.budget, 1 if args.step is None else args.step, args.metric)  # the model picks no step
    check_out_arg(args)
    loaded, calib, _, info = load_model_and_data(args)
    result = select_alpha(loaded.model, calib, alphas, args.budget, args.step, args.metric, loaded.device,
                          tqdm_progress("HIES α sweep"), select=info["select_batches"] or None)
    return write_out({**result, "model": args.model, "data": summary(info)}, args)


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
    p.add_argument("--sap-sparsities", metavar="S[,S]",
                   help="SAP: also its own selection at each of these target sparsities, with the k that performs "
                        "best there on the selection data (the paper's protocol); `mask --sparsity S` reads them")
    p.add_argument("--out", help="also write the JSON result to this file")
    add_force_arg(p)
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
    add_metric_arg(p, "for the tolerance, AUC and plots; or agreement (%% of answers as the starting model's, "
                      "recorded at every step of a classifier or multiple choice) or stability (%% unchanged "
                      "under word drop, with --stability); or lm-eval:TASK/METRIC[,...]: lm-eval numbers "
                      "measured at the --at points only")
    p.add_argument("--seeds", type=int, default=1,
                   help="runs with criterion seeds seed..seed+N-1 on one calibration draw (random: the spread)")
    p.add_argument("--repeats", type=int, default=1,
                   help="independent runs: each re-draws the calibration rows (evaluation rows fixed) and re-seeds "
                        "the criterion; prints mean ± sd per step (random: independent masks at each rate)")
    p.add_argument("--save-mask", metavar="R[,R]|stop",
                   help="write the mask at these pruned ratios and/or at the stopping point (stop: the last step, "
                        "or the last within --tolerance) next to --out: RUN.mask-0.5.json")
    p.add_argument("--prune-out", metavar="DIR",
                   help="also save the pruned model at the last --save-mask point (default: stop) in this folder")
    p.add_argument("--format", default="headprune", choices=tuple(FORMATS),
                   help="format of --prune-out, as prune --format (default: headprune)")
    p.add_argument("--stability", action="store_true", help="also measure stability under seeded word drop")
    p.add_argument("--drop", type=float, default=0.1, help="word-drop probability for --stability (default: 0.1)")
    p.add_argument("--out", help="also write the run file (JSON) here")
    g = p.add_argument_group("lm-eval metrics at chosen points (--metric lm-eval:TASK/METRIC[,...]; extra 'eval')")
    g.add_argument("--at", metavar="R[,R]|stop",
                   help="pruned ratios (and/or stop) where the lm-eval metrics are measured, with the start "
                        "(default: the --save-mask points, else 0.1,0.2,...,1.0 up to where the run ends)")
    add_harness_options(g)
    add_force_arg(p)
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
    add_force_arg(p)
    p.set_defaults(handler=cmd_select_alpha)
