"""KV cache commands: ``kvplan`` (choose which key/value heads keep the whole cache, write a plan file; with
``--trajectory`` stream the groups one step at a time in the rule's order, measuring each plan: ``kvcache.stream``) and
``generate`` (generate under a plan with the mixed cache, beside the full cache: measured bytes and speed).
``evaluate --kv-plan`` (in ``core``) evaluates under a plan; ``evaluate --long-context passkey|perplexity
--lengths 16,32,64`` (here) measures a long-context task per context length, dense and under the plan. Every
argument and the plan file are checked before a model loads; an encoder is refused by what its name or config.json
says, before its weights load."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import numpy as np
import transformers
from transformers import AutoConfig

from ..kvcache.budgets import BETA_DEFAULT, TEMPERATURE_DEFAULT, budget_plan, check_allocation
from ..kvcache.cache import compile_problem, generate
from ..kvcache.duo import DEFAULTS as DUO_DEFAULTS
from ..kvcache.duo import THRESHOLD, check_duo_params
from ..kvcache.exports import check_duo_folder, read_duo_folder, tsv_folder, write_duo_folder
from ..kvcache.longctx import DEPTH, DEPTHS, ROWS, TASKS, TOKENS, check_lengths, check_task, measure, parse_numbers
from ..kvcache.plan import (
    FULL_SHARE,
    KVPlan,
    KVPlanError,
    check_decoder,
    check_full_share,
    check_window,
    read_plan_file,
)
from ..kvcache.restrict import restricted
from ..kvcache.scores import (
    RAZOR_ECHO_SHARE,
    RAZOR_INDUCTION_SHARE,
    REDUCE,
    RULES,
    check_rule,
    group_scores,
    head_scores,
    plan_from_scores,
    razor_share_plan,
    razor_stripes,
)
from ..kvcache.stream import FORMAT, StreamSpec, run_stream, run_stream_seeds
from ..limits import SEED, TOKENS_PER_ROW, Interval
from ..model.device import DEVICES, resolve_device
from ..model.loading import declared_causal, declared_refusal, load_model, peek_config
from ..model.tokenizer import declared_context, model_context
from ..outdir import signed, write_atomic
from ..provenance import versions
from ..roles.base import PROBE_ROWS
from ..trajectory import spread
from ..userinput import shown
from ..workspace import DefaultSize
from .common import (
    add_data_args,
    add_mask_arg,
    add_metric_arg,
    add_model_args,
    build_workspace,
    check_args,
    checked,
    load_mask,
    load_model_and_data,
    metric_choice,
    summary,
    tqdm_progress,
)
from .output import checked_out_file, write_json

# generate's limits: new tokens are also bounded by the model's positions once it is loaded; below 0.01 the
# logits / T overflow in the sampler (greedy decoding, without --sample, is the limit T -> 0)
NEW_TOKENS = Interval(1, 1_048_576, integer=True, why="tokens to generate; the model's positions bound it too")
TEMPERATURE = Interval(0.01, 100, why="for the most likely token, decode greedily (leave out --sample)")
RANDOM_ORDERS = Interval(0, 1000, integer=True, why="each random order is a whole trajectory, run one after another")
RANDOM_ORDERS_DEFAULT = 3


def refuse_encoder(model: str) -> None:
    """An encoder named by ``--model`` is refused before it loads (it keeps no KV cache), and so is a decoder whose
    family a plan cannot reach (GPT-J, BLOOM, Falcon, MPT, ...: ``loading.declared_refusal``)."""
    if declared_causal(model) is False:
        raise KVPlanError(f"--model {model} is an encoder: a KV cache plan needs a decoder (an encoder keeps no "
                          "key/value cache; every query sees every key of the row at once). Use a causal LM such "
                          "as demo-lm or demo-circuit.")
    refused = declared_refusal(model, "kv")
    if refused:
        raise KVPlanError(f"--model {model} cannot take a KV cache plan: {refused}")


def read_plan_arg(path: str | None, model: str) -> KVPlan | None:
    """``--kv-plan`` read and validated (format, sink, window) before the model loads; None without one. An empty
    value is refused (it would run without a plan, as if the option were not given), and a plan whose shape is not
    the model's grid (read from its config.json) is refused before the plan's grid is even built."""
    if path is None:
        return None
    if not path.strip():
        raise KVPlanError("--kv-plan is empty: give the plan file (headprune kvplan --out FILE), or leave --kv-plan "
                          "out to run without a plan.")
    refuse_encoder(model)
    obj = read_plan_file(path)
    check_plan_shape(obj, model)
    return KVPlan.from_json(obj)


def check_plan_shape(obj, model: str) -> None:
    """The plan's declared ``shape`` and ``n_heads`` against the grid ``model``'s config.json declares (nothing to
    compare for a hub id: ``KVPlan.check_fits`` compares once it loads)."""
    config = peek_config(model)
    if not isinstance(obj, dict) or config is None:
        return
    config = config.get("text_config") or config
    layers, n_heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    n_kv = config.get("num_key_value_heads") or n_heads
    shape, plan_heads = obj.get("shape"), obj.get("n_heads")
    if not (isinstance(shape, list) and len(shape) == 2) or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in (layers, n_heads, n_kv, *shape)) \
            or (shape == [layers, n_kv] and plan_heads == n_heads):
        return   # a malformed shape is KVPlan.from_json's to refuse (its bounds)
    raise KVPlanError(f"This KV plan is for {shape[0]} blocks x {shape[1]} key/value heads "
                      f"({shown(repr(plan_heads))} query heads); the model has {layers} x {n_kv} ({n_heads} query "
                      f"heads, as --model {model}'s config.json says). Make a plan for this model (headprune kvplan).")


DUO_OPTIONS = (("--duo-steps", "duo_steps", "steps"), ("--duo-lr", "duo_lr", "lr"),
               ("--duo-reg", "duo_reg", "reg_weight"), ("--duo-batch", "duo_batch", "batch_size"),
               ("--duo-length", "duo_length", "length"))


def duo_options(args) -> dict:
    """``--duo-*`` as ``duo.train_gates`` keywords (checked here, before anything loads); only with ``--rule duo``."""
    given = {key: getattr(args, name) for _, name, key in DUO_OPTIONS if getattr(args, name) is not None}
    if given and args.rule != "duo":
        flags = [flag for flag, name, _ in DUO_OPTIONS if getattr(args, name) is not None]
        raise KVPlanError(f"{', '.join(flags)} train DuoAttention's gates: they apply to --rule duo only, not "
                          f"--rule {args.rule}.")
    check_duo_params(**{**DUO_DEFAULTS, **{k: v for k, v in given.items() if k != "length"}})
    if "length" in given and TOKENS_PER_ROW(given["length"]):
        raise KVPlanError(f"--duo-length {given['length']!r} {TOKENS_PER_ROW(given['length'])} (tokens per passkey "
                          "row of the gates' training).")
    # rows longer than the model's positions would train the gates on positions it has no embedding for
    declared = declared_context(peek_config(args.model) or {}) if "length" in given else None
    if declared is not None and given["length"] > declared:
        raise KVPlanError(f"--duo-length {given['length']} is longer than --model {args.model}'s {declared} "
                          f"positions: the gates would train on rows past them. Accepted: --duo-length up to "
                          f"{declared}, or leave it out (the longest calibration row, at most {declared}).")
    return given


def razor_shares(args) -> dict:
    """``--echo-share`` / ``--induction-share`` (RazorAttention's own selection; the other takes the reference's
    default) as ``scores.razor_share_plan`` keywords, checked before anything loads; {} when neither is given."""
    given = {k: v for k, v in (("echo_share", args.echo_share), ("induction_share", args.induction_share))
             if v is not None}
    if not given:
        return {}
    if args.rule != "razor":
        raise KVPlanError(f"--echo-share and --induction-share are RazorAttention's (--rule razor), not --rule "
                          f"{args.rule}'s.")
    if args.full_share is not None:
        raise KVPlanError("--echo-share / --induction-share choose RazorAttention's heads by its own two shares; "
                          "--full-share keeps a share of max(echo, induction) instead. Give one or the other.")
    shares = {"echo_share": RAZOR_ECHO_SHARE, "induction_share": RAZOR_INDUCTION_SHARE, **given}
    for name, value in shares.items():
        problem = FULL_SHARE(value)
        if problem:
            raise KVPlanError(f"--{name.replace('_', '-')} {value!r} {problem} (a share of all query heads).")
    return shares


def model_config(model: str, why: str) -> dict:
    """The model's config.json as a dict, read without loading weights (a hub id's through AutoConfig)."""
    config = peek_config(model)
    if config is None:
        try:
            config = AutoConfig.from_pretrained(model).to_dict()
        except (OSError, ValueError) as exc:
            raise KVPlanError(f"--model {model}: its config.json could not be read to check {why} ({exc}).") from None
    return config


def model_grid(model: str, why: str = "the DuoAttention folder's grid") -> tuple[int, int, int]:
    """(layers, key/value heads, query heads) from the model's config.json, read without loading weights."""
    config = model_config(model, why)
    config = config.get("text_config") or config
    n_heads = config.get("num_attention_heads")
    layers = config.get("num_hidden_layers")
    if not (isinstance(n_heads, int) and isinstance(layers, int)):
        raise KVPlanError(f"--model {model}: its config.json names no num_attention_heads / num_hidden_layers.")
    return layers, config.get("num_key_value_heads") or n_heads, n_heads


def cmd_from_duo(args) -> dict:
    """``kvplan --from-duo DIR``: DuoAttention's folder read with its loader's steps and deployed by
    ``--full-share`` or ``--threshold`` into a plan file (``exports.read_duo_folder``); no weights load."""
    others = [flag for flag, value in (("--rule", args.rule), ("--export-duo", args.export_duo),
                                       ("--mask", args.mask), ("--compensation", args.compensation or None))
              if value is not None]
    others += [flag for flag, name, _ in DUO_OPTIONS if getattr(args, name) is not None]
    if others:
        raise KVPlanError(f"--from-duo reads a learned pattern; {', '.join(others)} cannot apply to it.")
    refuse_encoder(args.model)
    for option in (args.out, args.head_ids):
        checked_out_file(option)
    if args.tsv:
        tsv_folder(args.tsv)
    layers, n_kv, n_heads = model_grid(args.model)
    plan = read_duo_folder(args.from_duo, n_heads, (layers, n_kv), share=args.full_share, threshold=args.threshold)
    plan.meta.update(model=args.model, versions=versions())
    return write_plan_files(args, plan, {"rule": "duo-folder", "from_duo": args.from_duo})


def write_plan_files(args, plan: KVPlan, summary_: dict) -> dict:
    plan.write(args.out)
    if args.tsv:   # DuoAttention's TSV never leaves without its config.json (the continuous scores, S, W)
        write_duo_folder(plan, tsv_folder(args.tsv), "--tsv")
    if args.head_ids:
        write_atomic(checked_out_file(args.head_ids), json.dumps(signed(plan.head_ids(), "kvplan"), indent=1),
                     "--head-ids")
    if getattr(args, "export_duo", None):
        write_duo_folder(plan, args.export_duo)
    return {"out": args.out, **summary_, "full_kv_heads": int(plan.full.sum()), "kv_heads": plan.full.numel(),
            "sink": plan.sink, "window": plan.window, "compensation": plan.compensation,
            "head_ids": plan.head_ids()["full_kv_heads"],
            "tsv": args.tsv, "head_ids_file": args.head_ids, "export_duo": getattr(args, "export_duo", None)}


def check_budget_args(args) -> None:
    """``kvplan --budget``: its options checked, and the options it cannot apply refused, before anything loads."""
    if args.budget is None:
        given = [o for o, v in (("--beta", args.beta), ("--temperature", args.temperature)) if v is not None]
        if given:
            raise KVPlanError(f"{', '.join(given)} shape a budget plan's allocation: add --budget TOKENS, or leave "
                              "them out.")
        return
    cannot = [o for o, v in (("--full-share", args.full_share), ("--trajectory", args.trajectory or None),
                             ("--tsv", args.tsv), ("--export-duo", args.export_duo), ("--from-duo", args.from_duo),
                             ("--threshold", args.threshold), ("--echo-share", args.echo_share),
                             ("--induction-share", args.induction_share)) if v is not None]
    if cannot:
        raise KVPlanError(f"{', '.join(cannot)} cannot apply to a budget plan (--budget: every group streams at its "
                          "own window; DuoAttention's TSV and a trajectory know one window). Leave them out, or "
                          "leave --budget out for a full / streaming plan.")
    args.beta = BETA_DEFAULT if args.beta is None else args.beta
    args.temperature = TEMPERATURE_DEFAULT if args.temperature is None else args.temperature
    config = peek_config(args.model) or {}
    layers, kv = config.get("num_hidden_layers"), config.get("num_key_value_heads",
                                                             config.get("num_attention_heads"))
    # the group count is known before the weights load for named models and folders (a hub id: after loading)
    check_allocation(args.budget, layers * kv if isinstance(layers, int) and isinstance(kv, int) else 1,
                     args.sink, args.beta, args.temperature)


def check_compensation(args) -> None:
    """``--compensation`` (RazorAttention's compensation token) belongs to --rule razor, and to an output that can
    hold it (the plan JSON, --head-ids): DuoAttention's TSV and folder have no place for it."""
    if not args.compensation:
        return
    if args.rule != "razor":
        raise KVPlanError(f"--compensation is RazorAttention's compensation token (--rule razor), not --rule "
                          f"{args.rule}'s.")
    cannot = [flag for flag, value in (("--tsv", args.tsv), ("--export-duo", args.export_duo)) if value]
    if cannot:
        raise KVPlanError(f"{', '.join(cannot)}: DuoAttention's files have no compensation token, so the plan "
                          "would stream without it there. Leave them out, or leave --compensation out.")


def cmd_kvplan(args) -> dict:
    check_budget_args(args)
    if args.trajectory:
        return cmd_kv_trajectory(args)
    given = [o for o, v in (("--step", args.step), ("--random-orders", args.random_orders),
                            ("--tolerance", args.tolerance), ("--metric", args.metric)) if v is not None]
    if given:
        raise KVPlanError(f"{', '.join(given)} belong to a streaming trajectory: add --trajectory, or leave them out "
                          "to write one plan.")
    if args.threshold is not None and args.full_share is not None:
        raise KVPlanError("--threshold and --full-share are two ways to deploy gates; give one of them.")
    if args.threshold is not None and THRESHOLD(args.threshold):
        raise KVPlanError(f"--threshold {args.threshold!r} {THRESHOLD(args.threshold)}.")
    if args.from_duo:
        if args.threshold is None and args.full_share is None:
            args.full_share = PLAN_SHARE
        if args.full_share is not None:
            check_full_share(args.full_share)
        return cmd_from_duo(args)
    args.rule = args.rule or DEFAULT_RULE
    check_compensation(args)
    shares = razor_shares(args)
    if args.threshold is not None and args.rule != "duo":
        raise KVPlanError(f"--threshold deploys DuoAttention's learned gates (--rule duo or --from-duo); --rule "
                          f"{args.rule} keeps a --full-share.")
    args.full_share = PLAN_SHARE if args.full_share is None and args.threshold is None and not shares \
        else args.full_share
    check_window(args.sink, args.window)
    if args.full_share is not None:
        check_full_share(args.full_share)
    check_rule(args.rule)
    options = duo_options(args)
    refuse_encoder(args.model)
    for option in (args.out, args.head_ids):
        checked_out_file(option)
    if args.tsv:
        tsv_folder(args.tsv)
    if args.export_duo:
        check_duo_folder(args.export_duo)
    needs_rows = args.rule not in ("razor", "random")
    check_args(args, calib="this rule" if needs_rows else None)
    loaded, calib, _, info = load_model_and_data(args, calib_size=None if needs_rows else 0)
    check_decoder(loaded.adapter)
    start = time.perf_counter()
    learned = []
    scores = head_scores(args.rule, loaded.model, calib=calib, tokenizer=loaded.tokenizer, sink=args.sink,
                         window=args.window, seed=args.seed, mask=load_mask(args, loaded), probe_rows=args.probe_rows,
                         duo_options={**options, "progress": tqdm_progress("DuoAttention gates")} if args.rule == "duo"
                         else None, duo_out=learned)
    meta = {"rule": args.rule, "full_share": args.full_share, "model": args.model, "data": summary(info),
            "mask": args.mask, "seed": args.seed, "query_scores": [[None if s != s else float(s) for s in row]
                                                                   for row in scores],
            "versions": versions()}
    if learned:
        meta["duo_training"] = learned[0].to_json()
    extra = {"rule": args.rule, "group_reduce": args.group}
    if learned:
        extra["duo_training"] = {k: v for k, v in learned[0].to_json().items() if k != "gates"}
    if args.budget is not None:
        grouped = group_scores(scores, loaded.adapter.n_heads // loaded.adapter.n_kv_heads, args.group)
        readable = [[float(v) if np.isfinite(v) else None for v in row] for row in grouped]   # JSON has no NaN
        del meta["full_share"]
        plan = budget_plan(grouped, loaded.adapter.n_heads, args.budget, args.sink, args.beta, args.temperature,
                           {**meta, "group_reduce": args.group, "group_scores": readable})
        plan.compensation = args.compensation
        extra.update(budget=plan.budget, budgets=plan.to_json()["budgets"], beta=args.beta,
                     temperature=args.temperature)
        return write_plan_files(args, plan, {**extra, "seconds": time.perf_counter() - start})
    share = args.full_share
    if shares:   # RazorAttention's own selection: the union of its echo and induction shares
        echo, induction = razor_stripes(loaded.model, loaded.tokenizer, args.window, args.probe_rows, args.seed,
                                        load_mask(args, loaded))
        plan = razor_share_plan(echo, induction, loaded.adapter.n_kv_heads, args.sink, args.window, meta=meta,
                                **shares)
        plan.compensation = args.compensation
        return write_plan_files(args, plan, {"rule": "razor", **shares, "seconds": time.perf_counter() - start})
    if args.threshold is not None:   # DuoAttention's deploy by threshold: the share of groups at or above it
        grouped = np.nan_to_num(learned[0].gates, nan=-np.inf)
        share = float((grouped >= args.threshold).mean())
        meta["threshold"] = args.threshold
    plan = plan_from_scores(scores, loaded.adapter.n_kv_heads, share, args.sink, args.window, args.group, meta)
    plan.compensation = args.compensation
    return write_plan_files(args, plan, {**extra, "seconds": time.perf_counter() - start})


DEFAULT_RULE = "far-mass"
PLAN_SHARE = 0.25   # kvplan's --full-share when not given; a trajectory streams down to 0 unless told
TRAJECTORY_EVAL = 500   # evaluation rows of a trajectory when --eval-size is not given (a plan reads none)


def cmd_kv_trajectory(args) -> dict:
    """``kvplan --trajectory``: stream the key/value groups one ``--step`` at a time in the rule's order (lowest need
    first), the metric under the exact plan after each step, beside ``--random-orders`` seeded random orders (the
    band); the run file records the order (every step's plan follows from it), the rule, data, mask and versions."""
    if args.tsv or args.head_ids or args.export_duo:
        raise KVPlanError("--tsv, --head-ids and --export-duo export one plan; a trajectory's run file records the "
                          "plan at every step (its order). Accepted: --trajectory without them, or one plan without "
                          "--trajectory.")
    one_plan = [flag for flag, value in (("--from-duo", args.from_duo), ("--threshold", args.threshold),
                                         ("--echo-share", args.echo_share),
                                         ("--induction-share", args.induction_share),
                                         ("--compensation", args.compensation or None))
                if value is not None] + [flag for flag, name, _ in DUO_OPTIONS if getattr(args, name) is not None]
    if one_plan:
        raise KVPlanError(f"{', '.join(one_plan)} apply to one plan, not to --trajectory (a trajectory's duo order "
                          "comes from gates trained with the defaults).")
    args.rule = args.rule or DEFAULT_RULE
    spec = StreamSpec(rule=args.rule, sink=args.sink, window=args.window, step=1 if args.step is None else args.step,
                      full_share=0.0 if args.full_share is None else args.full_share, tolerance=args.tolerance,
                      group=args.group, probe_rows=args.probe_rows, seed=args.seed, model_name=args.model)
    orders = RANDOM_ORDERS_DEFAULT if args.random_orders is None else args.random_orders
    problem = RANDOM_ORDERS(orders)
    if problem:
        raise KVPlanError(f"--random-orders {orders!r} {problem} (seeded random streaming orders: the band).")
    refuse_encoder(args.model)
    checked_out_file(args.out)
    needs_rows = args.rule not in ("razor", "random")
    if isinstance(args.eval_size, DefaultSize) and int(args.eval_size) == 0:
        args.eval_size = DefaultSize(TRAJECTORY_EVAL)
    check_args(args, calib="this rule" if needs_rows else None, evaluation="a trajectory")
    # the calibration rows are drawn for every rule, so the evaluation rows (what calibration leaves) are the same
    # whichever rule orders the run: trajectories of razor, duo and random compare on one set of rows
    ws = build_workspace(args, select_size=0)
    loaded = ws.loaded
    check_decoder(loaded.adapter)
    _, head = metric_choice(args, ws)
    info = {**ws.info(), "model": args.model, "data": args.data}
    spec = replace(spec, metric=head, data_info=summary(info))
    mask = load_mask(args, loaded)
    common = dict(tokenizer=loaded.tokenizer, mask=mask)
    run = run_stream(spec, loaded.model, ws.calib_batches, ws.eval_batches,
                     progress=tqdm_progress(f"streaming {args.rule}"), **common)
    result = {"format": FORMAT, "rule": run.to_json(), "mask_file": args.mask}
    if orders:
        randoms = run_stream_seeds(replace(spec, rule="random"), loaded.model, ws.calib_batches, ws.eval_batches,
                                   range(args.seed, args.seed + orders), **common)
        result["random"] = {"seeds": [r.seed for r in randoms], "runs": [r.to_json() for r in randoms],
                            "spread": spread(randoms, band=True)}
        result["random_auc_mean"] = float(np.mean([r.auc() for r in randoms]))
    result["software"] = versions()
    return write_json(result, args.out, command="kvplan")


def check_generate_args(args) -> None:
    """Refuse what ``generate`` cannot do as asked, before any weights load."""
    if args.temperature is not None and not args.sample:
        raise KVPlanError(f"--temperature {args.temperature!r} applies to sampling only: add --sample, or leave it "
                          "out for greedy decoding.")
    for name, value, limit in (("--max-new-tokens", args.max_new_tokens, NEW_TOKENS),
                               ("--temperature", args.temperature, TEMPERATURE)):
        problem = limit(value) if value is not None else None
        if problem:
            raise KVPlanError(f"{name} {value!r} {problem}.")
    try:
        args.prompt.encode("utf-8")
    except UnicodeEncodeError:     # the shell passed bytes that are not UTF-8 (kept as surrogates by Python)
        raise KVPlanError("--prompt is not valid UTF-8 text; pass the prompt as UTF-8.") from None
    if not args.prompt.strip():
        raise KVPlanError("--prompt is empty: give the text to continue (at least one word).")


def check_plan_fits_config(plan: KVPlan, model: str) -> None:
    """A plan of another grid, or whose window is longer than the model's context (its streaming heads would keep
    every key), refused from the model's config.json, before any weights load."""
    layers, n_kv, n_heads = model_grid(model, "the plan's grid")
    if plan.shape != (layers, n_kv) or plan.n_heads != n_heads:
        raise KVPlanError(f"This KV plan is for {plan.shape[0]} blocks x {plan.shape[1]} key/value heads "
                          f"({plan.n_heads} query heads); --model {model} has {layers} x {n_kv} ({n_heads} query "
                          "heads). Make a plan for this model (headprune kvplan).")
    context = declared_context(model_config(model, "the plan's window"))
    if context is not None and bool((~plan.full).any()) and plan.window > context:
        raise KVPlanError(f"The KV plan's window W = {plan.window} is longer than --model {model}'s context of "
                          f"{context} positions: its streaming heads would keep every key, as full heads do. Make the "
                          f"plan with --window below {context + 1}, or keep those heads full.")


def check_compile(args) -> None:
    """``generate --compile``, refused before any weights load where it cannot serve: a model class transformers does
    not mark as compilable as one graph, a device with no compiler backend, or a model spread over devices."""
    if not args.compile:
        return
    if args.device_map:
        raise KVPlanError("--compile captures one decode step on one device; --device-map spreads the model over "
                          "several. Leave one of them out.")
    names = model_config(args.model, "whether it compiles").get("architectures") or []
    model_class = getattr(transformers, names[0], None) if names else None
    problem = compile_problem(resolve_device(args.device), model_class)
    if problem:
        raise KVPlanError(f"--compile: {problem}. Leave --compile out to decode eagerly (the same tokens).")


def cmd_generate(args) -> dict:
    check_generate_args(args)
    refuse_encoder(args.model)
    # the context a folder declares bounds the new tokens before any weights load (the prompt is counted after)
    declared = declared_context(peek_config(args.model) or {})
    if declared is not None and args.max_new_tokens >= declared:
        raise KVPlanError(f"--max-new-tokens {args.max_new_tokens} does not fit the model's {declared} positions "
                          f"with a prompt: ask for at most {declared} minus the prompt's tokens.")
    plan = read_plan_arg(args.kv_plan, args.model)
    if plan is not None:
        check_plan_fits_config(plan, args.model)
    check_compile(args)
    loaded = load_model(args.model, args.device, device_map=args.device_map, dtype=args.dtype)
    check_decoder(loaded.adapter)
    if not hasattr(loaded.model, "get_output_embeddings") or loaded.model.get_output_embeddings() is None:
        raise KVPlanError(f"--model {args.model} has no language-model head to generate with.")
    if plan is not None:
        plan.check_fits(loaded.adapter)
    if args.compile:   # the class loaded (a hub id's config may name another), checked before anything compiles
        problem = compile_problem(loaded.device, type(loaded.model))
        if problem:
            raise KVPlanError(f"--compile: {problem}. Leave --compile out to decode eagerly (the same tokens).")
    ids = loaded.tokenizer(args.prompt, return_tensors="pt")["input_ids"].to(loaded.device)
    context = model_context(loaded.model)
    if context is not None and ids.shape[1] + args.max_new_tokens > context:
        raise KVPlanError(f"--max-new-tokens {args.max_new_tokens} after a prompt of {ids.shape[1]} tokens exceeds "
                          f"the model's {context} positions; ask for at most "
                          f"{max(context - ids.shape[1], 0)}.")
    options = {"sample": args.sample, "temperature": 1.0 if args.temperature is None else args.temperature,
               "seed": args.seed, "compile": args.compile}
    # generation stops at the tokenizer's end of text, as a chat or a completion would (None: runs to the limit)
    stop = {"eos_token_id": loaded.tokenizer.eos_token_id}
    full = generate(loaded.model, ids, args.max_new_tokens, mode="full", **options, **stop)
    decode = lambda tokens: loaded.tokenizer.decode(tokens, skip_special_tokens=True)  # noqa: E731
    result = {"model": args.model, "prompt_tokens": int(ids.shape[1]), "decoding": "sampling" if args.sample
              else "greedy", **options, "full_cache": {**full.to_dict(), "text": decode(full.tokens)}}
    if plan is not None:
        with restricted(loaded.model, plan) as copy:
            mixed = generate(copy, ids, args.max_new_tokens, mode="mixed", **options, **stop)
        block = loaded.adapter.blocks[0]
        length = int(ids.shape[1]) + args.max_new_tokens - 1
        ideal = plan.ideal_bytes(length, block.head_size, next(loaded.model.parameters()).element_size())
        result["kv_plan"] = {**mixed.to_dict(), "text": decode(mixed.tokens), "file": args.kv_plan,
                             "full_kv_heads": int(plan.full.sum()), "kv_heads": plan.full.numel(),
                             "sink": plan.sink, "window": plan.window,
                             **({"budget": plan.budget, "budget_tokens": plan.budget_tokens()} if plan.is_budget
                                else {}),
                             "measured_byte_ratio": mixed.kv_bytes / full.kv_bytes if full.kv_bytes else None,
                             "ideal_byte_ratio": ideal["ratio"],
                             "per_token_speedup": full.per_token_s / mixed.per_token_s if mixed.per_token_s
                             else None}
    result["software"] = versions()
    return result


LONG_DEFAULTS = {"passkey": "16,24,32,48", "perplexity": "16,32,64,128"}
LONG_OPTIONS = (("--lengths", "lengths"), ("--long-rows", "long_rows"), ("--depths", "depths"),
                ("--long-tokens", "long_tokens"))


def check_long_context(args) -> tuple[list[int], list[float]] | None:
    """The long-context options checked before anything loads; None when ``--long-context`` is not set (then none
    of its options may be)."""
    if not args.long_context:
        given = [flag for flag, name in LONG_OPTIONS if getattr(args, name) is not None]
        if given:
            raise KVPlanError(f"{', '.join(given)} set without --long-context: name the task (passkey or "
                              "perplexity), or leave these options out.")
        return None
    check_task(args.long_context)
    if args.lm_eval:
        raise KVPlanError("--long-context and --lm-eval are two different evaluations; run them separately.")
    refuse_encoder(args.model)
    lengths = check_lengths(args.long_context, args.lengths or LONG_DEFAULTS[args.long_context],
                            declared_context(peek_config(args.model) or {}))
    for flag, value, limit in (("--long-rows", args.long_rows, ROWS), ("--long-tokens", args.long_tokens, TOKENS)):
        problem = value is not None and limit(value)
        if problem:
            raise KVPlanError(f"{flag} {value!r} {problem}.")
    depths = parse_numbers(args.depths or ",".join(f"{d:g}" for d in DEPTHS), "--depths", DEPTH, float)
    return lengths, depths


def evaluate_long_context(args) -> dict:
    """``evaluate --long-context TASK``: the task at each of ``--lengths``, dense and (with ``--kv-plan``) under
    the plan, on the texts of the evaluation rows (passkey: its filler; perplexity: the stream cut into rows)."""
    lengths, depths = check_long_context(args)
    check_args(args, evaluation="evaluation")
    plan = read_plan_arg(args.kv_plan, args.model)
    ws = build_workspace(args, calib_size=0, select_size=0)
    loaded = ws.loaded
    check_decoder(loaded.adapter)
    if plan is not None:
        plan.check_fits(loaded.adapter)
    plans = {"dense": None, **({"plan": plan} if plan is not None else {})}
    bar, done = tqdm_progress(f"{args.long_context} per length"), []

    def progress(row):
        done.append(row)
        bar(len(done) / (len(plans) * len(lengths)), f"{row['plan']} at {row['length']}")

    table = measure(loaded.model, loaded.tokenizer, args.long_context, lengths, plans, ws.eval.texts,
                    rows=args.long_rows or 64, seed=args.seed, depths=depths, tokens=args.long_tokens or 4096,
                    mask=load_mask(args, loaded), batch_size=args.batch_size,
                    progress=progress)
    metric = "accuracy" if args.long_context == "passkey" else "perplexity"
    result = {"long_context": args.long_context, "metric": metric, "lengths": lengths, "model": args.model,
              "data": args.data, "text_rows": len(ws.eval), "seed": args.seed, "mask": args.mask,
              "dense": [r for r in table if r["plan"] == "dense"]}
    if args.long_context == "passkey":
        result.update(rows_per_length=args.long_rows or 64, depths=depths)
    else:
        result["tokens"] = args.long_tokens or 4096
    if plan is not None:
        result["kv_plan"] = {"file": args.kv_plan, "full_kv_heads": int(plan.full.sum()), "kv_heads":
                             plan.full.numel(), "sink": plan.sink, "window": plan.window,
                             "table": [r for r in table if r["plan"] == "plan"]}
    result["software"] = versions()
    return result


def add_long_context_args(p) -> None:
    g = p.add_argument_group("long context (KV cache plans)")
    g.add_argument("--long-context", choices=TASKS,
                   help="instead of the task's metrics: passkey (exact retrieval of a needle placed in the "
                        "evaluation rows' text at --depths) or perplexity (the evaluation rows' text concatenated "
                        "and cut into rows of each length), at each of --lengths, dense and under --kv-plan")
    g.add_argument("--lengths", help="context lengths in tokens, comma-separated, up to the model's positions "
                   f"(default: {LONG_DEFAULTS['passkey']} for passkey, {LONG_DEFAULTS['perplexity']} for perplexity)")
    g.add_argument("--long-rows", type=int, help="passkey rows per length (default: 64)")
    g.add_argument("--depths", help="passkey needle depths in [0, 1], comma-separated; 0 = right after BOS "
                   "(farthest), 1 = right before the question (default: 0,0.25,0.5,0.75,1)")
    g.add_argument("--long-tokens", type=int, help="perplexity: tokens of text cut into rows at each length "
                   "(default: 4096)")


def add_commands(sub) -> None:
    p = sub.add_parser("kvplan", help="choose which key/value heads keep the whole KV cache (the rest stream: "
                                      "sink + recent window) and write the plan file")
    add_model_args(p)
    add_data_args(p, eval_size=0)
    add_mask_arg(p)
    p.add_argument("--rule", default=None,
                   help=f"what decides: {', '.join(RULES)} (razor: RazorAttention's echo + induction scores on "
                        "probes longer than the window; duo: DuoAttention's gates, learned by distillation on "
                        "passkeys in the calibration rows' text (the published method; --duo-steps); far-mass: "
                        "attention mass outside sink + window on calibration rows, a proxy of DuoAttention's "
                        "question; random: seeded) or any criterion name (default: far-mass)")
    p.add_argument("--full-share", type=float, default=None,
                   help="share of key/value heads keeping the whole cache, in [0, 1] (default: 0.25; with "
                        "--trajectory, where streaming stops: default 0, every group streams)")
    p.add_argument("--sink", type=int, default=4, help="first keys a streaming head keeps (default: 4)")
    p.add_argument("--window", type=int, default=64, help="last keys a streaming head keeps (default: 64)")
    p.add_argument("--group", default="max", choices=REDUCE,
                   help="GQA: a group's score from its query heads' (default: max, the group streams only if no "
                        "query head of it needs far keys)")
    p.add_argument("--probe-rows", type=checked(PROBE_ROWS, "a probe count"), default=8,
                   help="razor: repeated-token probes (default: 8)")
    p.add_argument("--out", required=True, help="plan file to write (JSON); with --trajectory the run file")
    g = p.add_argument_group("streaming trajectory (--trajectory: stream the next head, measure, repeat)")
    g.add_argument("--trajectory", action="store_true",
                   help="instead of one plan: stream the key/value groups --step at a time in the rule's order "
                        "(lowest need first), measuring the metric on the evaluation rows under the exact plan "
                        "after each step, beside --random-orders seeded random orders (default --eval-size: "
                        f"{TRAJECTORY_EVAL})")
    g.add_argument("--step", type=int, help="groups streamed per step (default: 1)")
    g.add_argument("--random-orders", type=int,
                   help=f"seeded random streaming orders, seeds --seed.. (the band; default: "
                        f"{RANDOM_ORDERS_DEFAULT}, 0 = none)")
    g.add_argument("--tolerance", type=float,
                   help="report the streamed share reached before the metric falls below T x dense")
    add_metric_arg(g, "the trajectory's summaries read")
    g = p.add_argument_group("per-group budgets (HeadKV's allocation; docs/explanation/kv-budgets.md)")
    g.add_argument("--budget", type=int, help="instead of full / streaming groups: a budget plan, every key/value "
                   "group keeping S + W_g tokens, W_g from the rule's scores; TOKENS is the total over all groups "
                   "(HeadKV: a base per group plus a pool shared in proportion to the score)")
    g.add_argument("--beta", type=float, help=f"HeadKV's pool parameter: the pool is floor(b / beta) of each group's "
                   f"mean budget b (default: {BETA_DEFAULT}; larger = more even budgets)")
    g.add_argument("--temperature", type=float, help="HeadKV's temperature on the normalised scores "
                   f"(default: {TEMPERATURE_DEFAULT:g})")
    p.add_argument("--tsv", metavar="DIR/full_attention_heads.tsv",
                   help="also write DuoAttention's full_attention_heads.tsv here, with its config.json beside it (the "
                        "folder --export-duo writes: continuous scores, S, W and the sparsity of this plan)")
    p.add_argument("--head-ids", help="also write a JSON of full / streaming head ids here")
    p.add_argument("--export-duo", metavar="DIR",
                   help="also write DuoAttention's folder here: full_attention_heads.tsv (the continuous group "
                        "scores, ordered as the plan keeps them) and config.json (sink_size, recent_size and the "
                        "sparsity that gives this plan's head set)")
    d = p.add_argument_group("DuoAttention (--rule duo: gates learned by distillation; --from-duo: a learned folder)")
    d.add_argument("--from-duo", metavar="DIR",
                   help="instead of scoring: read DuoAttention's folder (full_attention_heads.tsv + config.json) with "
                        "its loader's steps and deploy it by --full-share or --threshold; no weights load")
    d.add_argument("--threshold", type=float,
                   help="deploy gates by threshold: groups whose gate is >= it keep the whole cache (reference "
                        "default 0.5), instead of --full-share")
    p.add_argument("--echo-share", type=float,
                   help="razor: RazorAttention's own selection, the share of all query heads kept for their echo "
                        f"scores (reference default {RAZOR_ECHO_SHARE}); with --induction-share, instead of "
                        "--full-share")
    p.add_argument("--compensation", action="store_true",
                   help="razor: RazorAttention's compensation token -- each streaming group also attends to one entry "
                        "whose key and value are the means of the keys it dropped, weighted by their number (Tang "
                        "et al. 2024, §3.3); recorded in the plan, applied by evaluate / generate")
    p.add_argument("--induction-share", type=float,
                   help="razor: the share of all query heads kept for their induction scores (reference default "
                        f"{RAZOR_INDUCTION_SHARE}); the plan keeps the union of both sets full")
    d.add_argument("--duo-steps", type=int, help=f"optimizer steps of the gates (default: {DUO_DEFAULTS['steps']})")
    d.add_argument("--duo-lr", type=float, help=f"the gates' learning rate (default: {DUO_DEFAULTS['lr']})")
    d.add_argument("--duo-reg", type=float, help=f"L1 weight on the gates (default: {DUO_DEFAULTS['reg_weight']})")
    d.add_argument("--duo-batch", type=int, help=f"passkey rows per step (default: {DUO_DEFAULTS['batch_size']})")
    d.add_argument("--duo-length", type=int, help="tokens per passkey row (default: the median calibration row)")
    p.set_defaults(handler=cmd_kvplan)

    p = sub.add_parser("generate", help="generate text with the full KV cache and, with --kv-plan, with the plan's "
                                        "mixed cache: tokens, measured KV bytes, time to first / per output token")
    add_model_args(p)
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (default: 32)")
    p.add_argument("--kv-plan", help="cache plan file (headprune kvplan): streaming heads keep sink + window")
    p.add_argument("--sample", action="store_true", help="sample (seeded) instead of greedy decoding")
    p.add_argument("--temperature", type=float, default=None,
                   help=f"sampling temperature, with --sample only, in [{TEMPERATURE.low}, {TEMPERATURE.high:g}] "
                        "(default: 1.0)")
    p.add_argument("--seed", type=checked(SEED, "a seed"), default=0, help="sampling seed (default: 0)")
    p.add_argument("--device", default="auto", choices=DEVICES, help="where to run (default: auto)")
    p.add_argument("--compile", action="store_true",
                   help="compile the decode step with torch.compile (static caches: transformers' StaticCache for the "
                        "full cache, the plan's mixed cache; CUDA graphs on a GPU): the same tokens, faster steps "
                        "after a first step that compiles (its seconds: compile_s)")
    p.set_defaults(handler=cmd_generate)
