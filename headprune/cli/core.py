"""Core commands: ``demo`` (build or locate the demo model), ``evaluate`` (metrics under a mask), ``prune``
(cut the masked heads out and save the smaller model, as a headprune checkpoint or a stock one: ``--format``)."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext
from pathlib import Path

from ..demos.circuit import demo_circuit_info, ensure_demo_circuit_model
from ..demos.classifier import demo_info, ensure_demo_model
from ..demos.lm import demo_lm_info, ensure_demo_lm_model
from ..demos.needle import demo_long_info, ensure_demo_long_model
from ..errors import HeadpruneError
from ..evaluation.harness import APPLY, HarnessError, HarnessSpec, resolve_tasks, run_lm_eval
from ..evaluation.metrics import evaluate
from ..evaluation.speed import compare_speed, onnx_speed
from ..kvcache.plan import KVPlanError
from ..kvcache.restrict import restricted
from ..model.export import DROPS_LAYERS, FORMATS, ExportError, export_model, round_to_uniform, type_problem
from ..model.layers import skip_layers
from ..model.loading import check_head, is_lm_config, load_model, peek_config
from ..model.mask import HeadMask
from ..model.onnx_export import OnnxExportError, check_runtime, option_problem
from ..model.sizes import size_report
from ..outdir import check_model_folder
from ..provenance import versions
from .common import (
    add_data_args,
    add_mask_arg,
    add_memory_arg,
    add_metric_arg,
    add_model_args,
    build_workspace,
    check_args,
    check_positive,
    load_mask,
    mask_dropped_layers,
    metric_choice,
    summary,
    tqdm_progress,
    warn_user_code,
)
from .kvcache import add_long_context_args, check_long_context, evaluate_long_context, read_plan_arg


def cmd_demo(args) -> dict:
    if sum(map(bool, (args.lm, args.circuit, args.long))) > 1:
        raise HeadpruneError("Choose one demo: --lm, --circuit or --long, not two of them.")
    if args.long:
        path = ensure_demo_long_model(progress=tqdm_progress("long-context demo training"))
        info = demo_long_info()
        return {"model_path": str(path), **{k: info[k] for k in (
            "heldout_accuracy", "context", "rope_theta", "parameters", "train_cpu_seconds", "build_seconds")}}
    if args.circuit:
        path = ensure_demo_circuit_model(progress=tqdm_progress("circuit demo training"))
        info = demo_circuit_info()
        return {"model_path": str(path), **{k: info[k] for k in (
            "next_token_accuracy", "chance", "eval_rows", "steps", "parameters", "build_seconds")}}
    if args.lm:
        path = ensure_demo_lm_model(progress=tqdm_progress("LM demo training"))
        info = demo_lm_info()
        return {"model_path": str(path), **{k: info[k] for k in (
            "perplexity", "unigram_perplexity", "perplexity_ratio", "next_token_accuracy", "heldout_size",
            "train_size", "train_tokens", "build_seconds")}}

    path = ensure_demo_model(progress=tqdm_progress("demo fine-tuning"))
    info = demo_info()
    return {"model_path": str(path), "accuracy": info["accuracy"], "heldout_size": info["heldout_size"],
            "finetune_size": info["finetune_size"]}


def cmd_evaluate(args) -> dict:
    if args.long_context:
        return evaluate_long_context(args)
    check_long_context(args)   # its options without it are refused
    if args.lm_eval:
        return _evaluate_lm_eval(args)
    given = [option for option, value in (("--lm-eval-limit", args.lm_eval_limit), ("--num-fewshot", args.num_fewshot),
                                          ("--lm-eval-include", args.lm_eval_include)) if value is not None]
    if given:
        raise HarnessError(f"{', '.join(given)} set without --lm-eval: name the lm-eval tasks to run, e.g. "
                           "--lm-eval arc_easy, or leave the lm-eval options out.")
    check_args(args, evaluation="evaluation")
    plan = read_plan_arg(args.kv_plan, args.model)
    # nothing is scored or chosen: only the evaluation rows are read; a calibration or selection role is read (and
    # recorded, and overlap-checked) only when --calib-data / --select-data names it
    ws = build_workspace(args, calib_size=None if args.calib_data else 0,
                         select_size=None if args.select_data else 0)
    loaded, evals, info = ws.loaded, ws.eval_batches, {**ws.info(), "model": args.model, "data": args.data}
    mask = load_mask(args, loaded)
    names, head = metric_choice(args, ws)
    dropped = mask_dropped_layers(args, loaded)
    if plan is not None:
        plan.check_fits(loaded.adapter)
    with skip_layers(loaded.adapter, dropped), \
            (restricted(loaded.model, plan) if plan is not None else nullcontext(loaded.model)) as model:
        # SAP's whole-layer rule travels with its mask file; a KV plan's streaming heads see sink + window only
        metrics = evaluate(model, evals, mask, progress=tqdm_progress("evaluate"), memory_budget=args.memory_budget)
    values = metrics.to_dict()
    # heads gone either way: cut out of a saved pruned model, or gated by --mask
    gone = ~loaded.adapter.live_grid()
    if mask is not None:
        gone |= ~mask.keep_bool()
    # every metric that applies at the top level (as before); the task's set and its headline said explicitly
    return {**values, "metric_set": list(names), "headline": head, "metrics": {m: values[m] for m in names},
            **summary(info), "mask": args.mask, "pruned_heads": int(gone.sum()),
            **kv_plan_report(args.kv_plan, plan), **({"dropped_layers": dropped} if dropped else {})}


def kv_plan_report(path: str | None, plan) -> dict:
    """What an evaluation says about the KV plan it ran under ({} without one)."""
    if plan is None:
        return {}
    return {"kv_plan": path, "kv_plan_full_kv_heads": int(plan.full.sum()), "kv_plan_sink": plan.sink,
            "kv_plan_window": plan.window, **({"kv_plan_budget_tokens": plan.budget_tokens()} if plan.is_budget
                                              else {})}


def _evaluate_lm_eval(args) -> dict:
    """``evaluate --lm-eval TASKS``: lm-evaluation-harness on the loaded model under ``--mask`` (--data unused).
    Tasks, their data and the mask file are checked before the model loads."""
    spec = harness_spec(args, tuple(args.lm_eval.split(",")))
    check_args(args)
    config = peek_config(args.model)   # a classifier is named before its weights load or any task is resolved
    if config is not None and not is_lm_config(config):
        raise HarnessError(f"--lm-eval runs lm-evaluation-harness tasks, which score a causal language model's "
                           f"log-likelihoods; {args.model} is a classifier "
                           f"({', '.join(config.get('architectures') or [str(config.get('model_type'))])}). "
                           "Accepted: a *ForCausalLM model (e.g. --model demo-lm), or leave --lm-eval out to "
                           "evaluate the classifier on --data.")
    plan = read_plan_arg(args.kv_plan, args.model)
    if plan is not None and args.mask and args.lm_eval_apply == "cut":
        # the plan maps the loaded model's key/value heads; cutting heads afterwards would renumber them
        raise KVPlanError("--kv-plan with --lm-eval-apply cut is not supported: the plan is applied to the loaded "
                          "model's heads. Use --lm-eval-apply gate (the default) with --mask, or save the pruned "
                          "model first (headprune prune) and make its plan with headprune kvplan.")
    warn_user_code(spec)   # before resolve_tasks: checking a task's data already imports its helpers
    tasks = resolve_tasks(spec)
    loaded = load_model(args.model, args.device, device_map=args.device_map, dtype=args.dtype)
    mask = load_mask(args, loaded)
    if plan is not None:
        plan.check_fits(loaded.adapter)
    # a KV plan goes through the lm-eval bridge like a mask: lm-eval scores the restricted private copy
    with restricted(loaded.model, plan) if plan is not None else nullcontext(loaded.model) as model:
        result = run_lm_eval(model, loaded.tokenizer, tasks, mask, progress=tqdm_progress("lm-eval"),
                             dropped_layers=mask_dropped_layers(args, loaded))
    return {"model": args.model, "mask": args.mask, "device": str(loaded.device), "dtype": args.dtype,
            "device_map": args.device_map, "lm_eval": result, "software": versions("lm_eval"),
            **kv_plan_report(args.kv_plan, plan)}


def cmd_prune(args) -> dict:
    out = Path(args.out)
    check_prune_out(args.out, "--out", args.format, args.model)
    check_args(args)
    if args.format not in DROPS_LAYERS and (HeadMask.read_file(args.mask) or {}).get("dropped_layers"):
        raise ExportError(f"--mask {args.mask} drops whole layers (SAP's layer rule); only --format "
                          f"{' or '.join(DROPS_LAYERS)} carries a dropped layer.")
    if args.format == "onnx" and option_problem(args.device_map, args.dtype):
        raise OnnxExportError(option_problem(args.device_map, args.dtype))
    check_positive(args.benchmark_repeats, "--benchmark-repeats", "repeats", "timed forwards per measurement, "
                   "each of them at every batch and length", at_most=1000)
    check_positive(args.benchmark_threads, "--benchmark-threads", "threads", "torch CPU threads while timing",
                   at_most=1024)
    # loaded as it was scored (--dtype, --device-map): a model too big for one device is cut where it fits
    loaded = load_model(args.model, "cpu" if args.device_map is None else "auto", device_map=args.device_map,
                        dtype=args.dtype)
    check_head(loaded, args.allow_untrained_head)
    mask = load_mask(args, loaded)
    result = {"out": str(out), "model": args.model, "format": args.format}
    pruned, written = export_pruned(loaded, mask, out, args.format, dropped_layers=mask_dropped_layers(args, loaded))
    result.update(written)
    if args.benchmark and args.format == "onnx":   # the graph's own speed: onnxruntime, dense graph beside it
        result["speed"] = onnx_speed(loaded.model, mask, {**written["onnx"], "model": pruned},
                                     repeats=args.benchmark_repeats, threads=args.benchmark_threads or 2,
                                     progress=tqdm_progress("benchmark"))
    elif args.benchmark:  # opt-in: timing takes seconds to minutes
        result["speed"] = compare_speed(loaded.model, pruned, repeats=args.benchmark_repeats,
                                        threads=args.benchmark_threads, progress=tqdm_progress("benchmark"))
    return result


def check_prune_out(out: str, option: str, format: str, model: str) -> None:
    """A pruned-model folder and format, refused before the model loads: ``out`` (given as ``option``) must be new
    or an empty folder (``outdir.check_model_folder``), and a ``uniform`` export needs a family a stock config can
    cut."""
    check_model_folder(out, option)
    if format == "uniform":
        _check_uniform_family(model)
    if format == "onnx":
        check_runtime()


def export_pruned(loaded, mask: HeadMask, out: str | Path, format: str, extra: dict | None = None,
                  dropped_layers: list[int] | None = None) -> tuple[object, dict]:
    """Write ``loaded``'s model cut by ``mask`` to ``out`` in ``format`` (``model.export.FORMATS``; ``uniform``
    rounds the mask to the nearest uniform one first, saying what changed), skipping ``dropped_layers`` for good
    (SAP's layer rule; headprune format only). Returns (the written model, a JSON report: heads, where it loads,
    note, sizes)."""
    report = {}
    if format == "uniform":   # any mask is rounded to the nearest one a stock config can describe
        rounding = round_to_uniform(loaded.model, mask)
        print(f"note: {rounding.describe()}", file=sys.stderr)
        report["uniform_rounding"] = rounding.to_json()
        mask = rounding.mask
    written = export_model(loaded.model, loaded.tokenizer, mask, out, format,
                           extra={"source_model": loaded.source, "mask": mask.to_json(), **(extra or {})},
                           dropped_layers=dropped_layers or ())
    if not written["saves_compute"]:
        print(f"note: {written['note']}", file=sys.stderr)
    report.update({**({"dropped_layers": list(dropped_layers)} if dropped_layers else {}),
                   "pruned_heads": mask.n_pruned, "kept_heads": mask.n_kept, "loads_in": written["loads_in"],
                   "note": written["note"], "sizes": size_report(loaded.model, written["model"]),
                   **({"onnx": written["onnx"]} if "onnx" in written else {})})
    return written["model"], report


def _check_uniform_family(spec: str) -> None:
    """A model folder whose config.json names a family no stock config can cut is refused before it loads."""
    config_file = Path(spec).expanduser() / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return   # a named model, a hub id or an unreadable config: checked once the model is loaded
    model_type = (config.get("text_config") or {}).get("model_type") or config.get("model_type")
    problem = type_problem(str(model_type)) if model_type else None
    if problem:
        raise ExportError(problem)


def harness_spec(args, tasks: tuple[str, ...]) -> HarnessSpec:
    """The lm-eval settings of a command (``add_harness_options``) for ``tasks``, checked before any model loads."""
    return HarnessSpec(tasks=tasks, limit=args.lm_eval_limit, include=tuple(args.lm_eval_include or ()),
                       num_fewshot=args.num_fewshot, batch_size=args.batch_size, apply=args.lm_eval_apply,
                       seed=args.seed)


def add_lm_eval_args(p) -> None:
    g = p.add_argument_group("lm-evaluation-harness (extra 'eval')")
    g.add_argument("--lm-eval", metavar="TASKS",
                   help="run lm-evaluation-harness tasks instead of --data, comma-separated (hellaswag,arc_easy,"
                        "arc_challenge need the network once; demo_lm_cloze ships offline), on the model as loaded "
                        "(--device, --device-map, --dtype) under --mask; prints lm-eval's results verbatim")
    add_harness_options(g)


def add_harness_options(g) -> None:
    """How lm-eval runs (``harness_spec``): evaluate --lm-eval, and trajectory --metric lm-eval:TASK/METRIC."""
    g.add_argument("--lm-eval-limit", type=int, default=None, metavar="N", help="examples per task (default: all)")
    g.add_argument("--lm-eval-include", action="append", default=None, metavar="DIR",
                   help="a folder of lm-eval task YAMLs (e.g. offline tasks reading local JSONL); repeatable")
    g.add_argument("--num-fewshot", type=int, default=None, metavar="K",
                   help="examples in each prompt (default: the task's own, 0 for most)")
    g.add_argument("--lm-eval-apply", default="gate", choices=APPLY,
                   help="how the mask's heads are removed: gate (headprune's gating on a copy: exact, no extra "
                        "memory; default) or cut (a smaller copy by surgery: faster forwards, a second copy of "
                        "the weights while it runs)")


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="build (once, offline) or locate the demo sentiment model")
    p.add_argument("--lm", action="store_true",
                   help="the decoder demo instead: a small Llama-style causal LM with grouped-query attention, "
                        "trained offline on the demo reviews (model 'demo-lm', data 'demo-lm')")
    p.add_argument("--circuit", action="store_true",
                   help="the circuit demo: a 3-layer Llama LM trained to copy repeated word blocks, whose induction "
                        "circuit is known (model 'demo-circuit', data 'demo-circuit')")
    p.add_argument("--long", action="store_true",
                   help="the long-context demo: a 3-layer Llama LM trained to retrieve a key over 1k-4k tokens of "
                        "filler, for KV plans at long contexts (model 'demo-long', data 'demo-long'; evaluate "
                        "--long-context passkey)")
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("evaluate", help="the task's metric set (accuracy, F1, macro-F1, MCC; Pearson, Spearman; "
                                        "loss, perplexity) of a model, optionally under a mask")
    add_model_args(p)
    add_data_args(p)
    add_mask_arg(p)
    add_memory_arg(p)
    add_metric_arg(p, "printed as 'headline'")
    add_lm_eval_args(p)
    p.add_argument("--kv-plan", help="KV cache plan file (headprune kvplan): its streaming heads attend to their "
                                     "sink + window keys only, exactly as with the plan's cache")
    add_long_context_args(p)
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser("prune", help="remove the heads of a mask from the weights and save the smaller model")
    add_model_args(p)
    add_mask_arg(p, required=True)
    p.add_argument("--out", required=True, help="folder to save the pruned model in")
    p.add_argument("--format", default="headprune", choices=tuple(FORMATS),
                   help="headprune: cut, any mask, loads in headprune (default); masked: original architecture with "
                        "the pruned heads zeroed, loads in plain transformers and any runtime, saves no compute; "
                        "uniform: cut to the same head count in every layer with a stock config (Llama, Mistral, "
                        "Qwen2, Qwen3, Gemma 3, Phi-3), loads in plain transformers; a non-uniform mask is rounded "
                        "to the nearest uniform one first (what changed is printed); onnx: the cut model as one "
                        "ONNX graph (model.onnx, opset 17, dynamic batch and sequence) with the tokenizer beside "
                        "it, for onnxruntime: encoder classifiers and causal LMs without a cache, any mask")
    p.add_argument("--benchmark", action="store_true",
                   help="also time the dense and the pruned model (latency at batch 1, throughput at batch 32, "
                        "lengths 64 and 256, on the auto device) next to the ideal speed-up from FLOPs; with "
                        "--format onnx: both graphs in onnxruntime (batch 8 x 128 tokens, 2 threads unless "
                        "--benchmark-threads), the pruned/dense latency ratio beside the ideal from FLOPs")
    p.add_argument("--benchmark-repeats", type=int, default=5, help="timed forwards per measurement (default: 5)")
    p.add_argument("--benchmark-threads", type=int, default=None,
                   help="torch CPU threads while timing (default: torch's; 1 gives steadier numbers on a busy machine)")
    p.set_defaults(handler=cmd_prune)
