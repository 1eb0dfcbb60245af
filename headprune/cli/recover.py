"""``recover``: train a pruned model back (fine-tuning, LoRA or distillation), the pruned heads kept pruned.

    python -m headprune recover --model demo --mask mask.json --epochs 1 --out recovered/
    python -m headprune recover --model pruned/ --method lora --out recovered/          (a folder written by prune)

Every argument is checked before a model loads: the spec (epochs, steps, lr, LoRA rank, temperature), the output
folder, the training data (read first: a classifier's training rows need labels), a ``--teacher`` folder's label
count or vocabulary, and what a pruned folder can be written as. Per-epoch checkpoints go to ``OUT.work/``
(``--resume`` continues from the last one; it is deleted once the output is written); the output is written whole
or not at all (``model.loading.write_staged``), with the run file ``OUT.run.json`` beside it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

from ..data import TextDataset, align_labels, load_data, row_hashes
from ..errors import DataError
from ..model.export import FORMATS, round_to_uniform, type_problem
from ..model.loading import LoadedModel, is_lm_config, load_model, peek_config
from ..model.mask import HeadMask
from ..model.onnx_export import check_runtime
from ..model.task import REQUESTABLE, task_of
from ..outdir import check_model_folder
from ..recovery import (
    DEFAULT_LR,
    METHODS,
    RecoveryError,
    RecoveryRun,
    RecoverySpec,
    check_teacher,
    data_role,
    export_recovered,
    run_record,
    stage_metrics,
    teacher_problem,
)
from ..recovery.workdir import check_work_dir
from ..workspace import DefaultSize, Workspace, fit_role_sizes, split_roles
from .common import DATA_HELP, add_mask_arg, add_memory_arg, add_model_args, check_args, load_mask, tqdm_progress
from .output import add_force_arg, checked_out_file, write_json

# the fine-tuning split of a named demo: its default training data, so recovery works offline
DEFAULT_TRAIN = {"demo": "demo:train", "demo-lm": "demo-lm:train"}
DEFAULTS = RecoverySpec()   # the flags' defaults are the spec's (the measured recipe, recovery/spec.py)


def _count_or_all(text: str) -> int | None:
    return None if text.lower() == "all" else int(text)


def spec_of(args) -> RecoverySpec:
    """The RecoverySpec the arguments name (raises RecoveryError before anything loads)."""
    return RecoverySpec(method=args.method, epochs=args.epochs, steps=args.steps, lr=args.lr,
                        batch_size=args.batch_size, seed=args.seed, lora_rank=args.lora_rank,
                        lora_alpha=args.lora_alpha, temperature=args.temperature, alpha=args.alpha,
                        max_length=args.max_length, weight_decay=args.weight_decay, warmup=args.warmup,
                        freeze_embeddings=args.freeze_embeddings, dropout=args.dropout)


def paths_of(out: str) -> tuple[Path, Path, Path]:
    """(output folder, work folder of checkpoints, run file) for ``--out``."""
    path = Path(out).expanduser()
    return path, path.with_name(path.name + ".work"), path.with_name(path.name + ".run.json")


def check_out_paths(args) -> None:
    """The paths ``--out`` names, refused before anything is created or loaded when they are not this run's
    (``headprune.outdir``): the model folder new or empty, the run file new or written by headprune (or
    ``--force``); the work folder's states are judged by ``recovery.workdir.check_work_dir``."""
    out, _, run_file = paths_of(args.out)
    check_model_folder(out, "--out")
    checked_out_file(str(run_file), args.force, "--out (its run file)")


def read_train_data(args, lm: bool) -> tuple[TextDataset, str]:
    """The training rows (a seeded ``--train-size`` draw) and their source; refuses a classifier's unlabelled data."""
    source = args.train_data or DEFAULT_TRAIN.get(args.model)
    if source is None:
        raise DataError(f"--train-data is needed for {args.model}: the rows to train on. Accepted: {DATA_HELP}; "
                        f"the demos default to their fine-tuning split ({', '.join(DEFAULT_TRAIN.values())}).")
    ds = load_data(source, args.text_col, args.pair_col, args.label_col, task="lm" if lm else "classification")
    if not lm and ds.labels is None:
        raise DataError(f"--train-data {source} has no label column, but the model is a classifier: training it "
                        "needs labels. Accepted: a .csv/.tsv/.jsonl/hf: dataset with a label column (--label-col).")
    if args.train_size is not None:
        if args.train_size > len(ds):
            raise DataError(f"--train-size {args.train_size}: {source} has only {len(ds)} rows. Choose at most "
                            f"{len(ds)}, or all.")
        ds = ds.subset(np.sort(np.random.default_rng(args.seed).permutation(len(ds))[:args.train_size]))
    return ds, source


def shared_with_eval(args, train: TextDataset, lm: bool) -> int:
    """How many training rows (same text, pair and label, as loaded) are among the evaluation rows ``eval_data``
    will draw: the same source, seeded draw and size, read before the model loads."""
    source = args.eval_data or args.data
    rows = load_data(source, args.text_col, args.pair_col, args.label_col, task="lm" if lm else "classification")
    size = None if args.eval_size is None else DefaultSize(args.eval_size)
    evals = split_roles(rows, fit_role_sizes(len(rows), {"eval": size}), args.seed)["eval"]
    return len(set(row_hashes(train)) & set(row_hashes(evals)))


def eval_data(args, loaded: LoadedModel) -> tuple[TextDataset, list[dict], dict]:
    """(evaluation rows, their batches, their data role) for ``--eval-data`` (default ``--data``): the evaluation
    role of a ``Workspace`` over the loaded model (the same seeded draw, label alignment and batching as
    ``evaluate``), recorded by ``Workspace.roles()``."""
    ws = Workspace.build(args.model, args.data, eval_data=args.eval_data, text_col=args.text_col,
                         pair_col=args.pair_col, label_col=args.label_col, calib_size=0, select_size=0,
                         eval_size=args.eval_size if args.eval_size is None else DefaultSize(args.eval_size),
                         allow_untrained_head=True, max_length=args.max_length, batch_size=args.batch_size,
                         seed=args.seed, loaded=loaded, task=args.task)
    for note in ws.notes:
        print(f"note: {note}", file=sys.stderr)
    return ws.eval, ws.eval_batches, ws.roles()["eval"]


def check_recover_args(args) -> tuple[RecoverySpec, dict | None]:
    """Everything that can be refused before a model loads; returns the spec and the model's config.json."""
    spec = spec_of(args)
    check_args(args)
    if args.eval_size is not None and args.eval_size < 1:
        raise DataError(f"--eval-size {args.eval_size}: the recovered model needs at least one example to be "
                        "evaluated on. Accepted: an integer >= 1, or all.")
    if args.train_size is not None and args.train_size < 1:
        raise DataError(f"--train-size {args.train_size}: recovery needs at least one training row. Accepted: an "
                        "integer >= 1, or all.")
    check_out_paths(args)
    if args.format == "onnx":   # onnx and onnxruntime missing: said now, not after the training
        check_runtime()
    _, work, _ = paths_of(args.out)
    # every state of OUT.work (a file, a foreign folder, a broken spec, nothing to resume, other settings, pickles)
    # refused before a model loads; the checkpoint's model is compared with the student's once it is built
    check_work_dir(work, resume=args.resume, wanted=spec.to_json(), strict=True)
    config = peek_config(args.model)
    if config is not None:
        pruned_before = bool(config.get("headprune_kept_heads"))
        if pruned_before and args.format != "headprune":
            raise RecoveryError(f"{args.model} was pruned before (its cut heads are gone): it can be written only as "
                                "a headprune checkpoint (--format headprune). For a stock export, start from the "
                                "original model with --mask.")
        if pruned_before and spec.distill and not args.teacher:
            raise RecoveryError(f"--method {spec.method} on {args.model}, which was pruned before: the dense teacher "
                                "is not in it. Pass --teacher with the model before pruning.")
        model_type = (config.get("text_config") or {}).get("model_type") or config.get("model_type")
        problem = type_problem(str(model_type)) if args.format == "uniform" and model_type else None
        if problem:
            raise RecoveryError(problem)
        if args.teacher:
            teacher_config = peek_config(args.teacher)
            problem = teacher_problem(config, teacher_config) if teacher_config is not None else None
            if problem:
                raise RecoveryError(f"--teacher {args.teacher} cannot be distilled from: {problem}. Accepted: a "
                                    "teacher of the student's family, tokenizer and vocabulary (and label set, for "
                                    "a classifier); default: the model before pruning.")
    if args.teacher and not spec.distill:
        print(f"note: --teacher is used by distillation only; --method {spec.method} ignores it", file=sys.stderr)
    return spec, config


def cmd_recover(args) -> dict:
    spec, config = check_recover_args(args)
    lm = args.task == "lm" or (args.task is None and config is not None and is_lm_config(config))
    train, train_source = read_train_data(args, lm)   # read before the model: unlabelled rows are refused first
    shared = shared_with_eval(args, train, lm)
    if shared and not args.allow_overlap:
        raise DataError(f"The training rows ({train_source}) and the evaluation rows ({args.eval_data or args.data}) "
                        f"share {shared} row(s) (same text and label, by content hash): the recovered model would "
                        "be reported on rows it was trained on. Use disjoint sources (e.g. demo:train to train, "
                        "demo to evaluate), or pass --allow-overlap to go on anyway (recorded in the run file).")
    out, work, run_file = paths_of(args.out)

    loaded = load_model(args.model, args.device, device_map=args.device_map, dtype=args.dtype)
    task = task_of(loaded.model, args.task)
    train = align_labels(train, loaded.id2label) if not task.is_lm else train
    mask = load_mask(args, loaded)
    if mask is None and loaded.adapter.live_grid().all():   # a dense model and no mask: plain fine-tuning
        mask = HeadMask.ones(loaded.adapter.grid_shape)
    result_note = None
    if args.format == "uniform" and mask is not None:   # rounded as prune rounds it, before any training
        rounding = round_to_uniform(loaded.model, mask)
        result_note = rounding.describe()
        print(f"note: {result_note}", file=sys.stderr)
        mask = rounding.mask
    teacher = teacher_tok = None
    if args.teacher and spec.distill:
        teacher_loaded = load_model(args.teacher, loaded.device)
        check_teacher(loaded.model, loaded.tokenizer, teacher_loaded.model, teacher_loaded.tokenizer)
        teacher, teacher_tok = teacher_loaded.model, teacher_loaded.tokenizer
    _, eval_batches, eval_role = eval_data(args, loaded)

    run = RecoveryRun(spec, loaded.model, loaded.tokenizer, mask, train, work_dir=work, teacher=teacher,
                      teacher_tokenizer=teacher_tok, gated_export=args.format == "masked",
                      memory_budget=args.memory_budget, task=task)
    estimate = run.estimate()
    print(f"estimate: {estimate.text} ({estimate.basis}; {run.plan()['steps']} steps of "
          f"{run.micro_batch} x {run.accumulation} rows)", file=sys.stderr)
    result = run.run(resume=args.resume, progress=tqdm_progress("recover"))
    dense_is_original = not (~loaded.adapter.live_grid()).any()
    metrics = stage_metrics(loaded.model, mask, result, eval_batches, task=task, dense_is_original=dense_is_original,
                            memory_budget=args.memory_budget, progress=tqdm_progress("evaluate"))
    roles = {"train": data_role(train, train_source, args.seed), "eval": eval_role}
    record = run_record(spec, result, metrics, roles, model=args.model, teacher=args.teacher or args.model,
                        format=args.format, out=str(out))
    record.update({"estimate_seconds": round(estimate.seconds, 1), "uniform_rounding": result_note,
                   "train_eval_overlap": {"rows": shared, "allowed": bool(args.allow_overlap)}})
    written = export_recovered(result, loaded.model, loaded.tokenizer, out, args.format,
                               extra={"source_model": loaded.source, "recovery": str(run_file)})
    write_json(record, str(run_file), args.force, args.command)
    shutil.rmtree(work, ignore_errors=True)   # the output is whole: the checkpoints are no longer needed
    return {"out": str(out), "run_file": str(run_file), "format": written["format"], "method": spec.method,
            "mode": result.mode, "steps": result.steps, "train_seconds": round(result.seconds, 1),
            "trainable_parameters": result.trainable_parameters, "metrics": metrics}


def add_commands(sub) -> None:
    p = sub.add_parser("recover", help="fine-tune, LoRA-tune or distil a pruned model back; pruned heads stay pruned")
    add_model_args(p)
    add_mask_arg(p)
    add_memory_arg(p)
    g = p.add_argument_group("data")
    g.add_argument("--train-data", default=None,
                   help=f"rows to train on: {DATA_HELP} (default for the demos: their fine-tuning split, "
                        "demo:train / demo-lm:train; needed otherwise)")
    g.add_argument("--train-size", type=_count_or_all, default=None,
                   help="training rows, a seeded draw (default: all)")
    g.add_argument("--data", default="demo", help="evaluation source when --eval-data is not given (default: demo)")
    g.add_argument("--eval-data", default=None,
                   help=f"what dense / pruned / recovered are evaluated on: {DATA_HELP} (default: --data)")
    g.add_argument("--eval-size", type=_count_or_all, default=500,
                   help="evaluation rows, a seeded draw, or all (default: 500, at most the data)")
    g.add_argument("--allow-overlap", action="store_true",
                   help="go on when training rows are among the evaluation rows (refused by default; the count is "
                        "recorded in the run file)")
    g.add_argument("--text-col", help="text column (default: auto-detect)")
    g.add_argument("--pair-col", help="second text column for sentence pairs (default: auto-detect)")
    g.add_argument("--label-col", help="label column (default: auto-detect)")
    g.add_argument("--task", choices=REQUESTABLE, help="lm or classification (default: detected from the head)")
    g.add_argument("--max-length", type=int, default=128, help="truncate rows to this many tokens (default: 128)")
    g.add_argument("--device", default="auto", help="where to train: auto (CUDA if present), cpu or cuda")
    t = p.add_argument_group("training")
    t.add_argument("--method", default=DEFAULTS.method, choices=METHODS,
                   help="finetune: every kept parameter (SAP's retraining, encoders); lora: peft LoRA adapters on the "
                        "kept heads' projections, merged on export (decoders, large models); distill: fine-tuning "
                        "plus a temperature-scaled KL to the dense teacher's outputs; lora+distill "
                        f"(default: {DEFAULTS.method})")
    t.add_argument("--epochs", type=int, default=DEFAULTS.epochs,
                   help=f"passes over the training rows (default: {DEFAULTS.epochs})")
    t.add_argument("--steps", type=int, default=None, help="optimizer steps instead of epochs")
    t.add_argument("--lr", type=float, default=None,
                   help=f"peak learning rate (default: {DEFAULT_LR['finetune']:g}, LoRA {DEFAULT_LR['lora']:g})")
    t.add_argument("--batch-size", type=int, default=DEFAULTS.batch_size,
                   help=f"rows per optimizer step (default: {DEFAULTS.batch_size}; split into accumulated "
                        "micro-batches when the memory budget asks for it)")
    t.add_argument("--weight-decay", type=float, default=DEFAULTS.weight_decay,
                   help=f"AdamW weight decay (default: {DEFAULTS.weight_decay})")
    t.add_argument("--warmup", type=float, default=DEFAULTS.warmup,
                   help=f"share of the steps warming up (default: {DEFAULTS.warmup})")
    t.add_argument("--freeze-embeddings", action=argparse.BooleanOptionalAction, default=DEFAULTS.freeze_embeddings,
                   help="keep the input embeddings (and a tied LM head) fixed in full training: half a small "
                        f"encoder's parameters (default: {'on' if DEFAULTS.freeze_embeddings else 'off'})")
    t.add_argument("--dropout", action=argparse.BooleanOptionalAction, default=DEFAULTS.dropout,
                   help=f"keep the model's dropout while training (default: {'on' if DEFAULTS.dropout else 'off'})")
    t.add_argument("--seed", type=int, default=0, help="seed of data draws, order, dropout and LoRA (default: 0)")
    t.add_argument("--lora-rank", type=int, default=DEFAULTS.lora_rank,
                   help=f"LoRA rank r (default: {DEFAULTS.lora_rank})")
    t.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default: 2 r)")
    t.add_argument("--teacher", default=None,
                   help="distillation teacher (default: the model before pruning, i.e. --model)")
    t.add_argument("--temperature", type=float, default=DEFAULTS.temperature,
                   help=f"distillation temperature T (default: {DEFAULTS.temperature:g})")
    t.add_argument("--alpha", type=float, default=DEFAULTS.alpha,
                   help=f"weight of the KL term, in [0, 1] (default: {DEFAULTS.alpha:g})")
    t.add_argument("--resume", action="store_true", help="continue an interrupted run from OUT.work/")
    o = p.add_argument_group("output")
    o.add_argument("--out", required=True, help="folder for the recovered model, new or empty (run file: "
                                                "OUT.run.json, checkpoints: OUT.work/)")
    add_force_arg(o, "replace an existing OUT.run.json that headprune did not write (refused by default)")
    o.add_argument("--format", default="headprune", choices=tuple(FORMATS),
                   help="headprune: the cut model (default; trained cut); masked: original architecture, pruned "
                        "heads zero (trained under gates with them held at zero); uniform: stock config, same head "
                        "count per layer (Llama-like decoders; the mask is rounded to the nearest uniform one)")
    p.set_defaults(handler=cmd_recover)


__all__ = ["add_commands", "check_recover_args", "cmd_recover", "eval_data", "paths_of",
           "read_train_data", "spec_of"]
