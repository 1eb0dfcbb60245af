"""Core commands: ``demo`` (build or locate the demo model), ``evaluate`` (metrics under a mask), ``prune``
(cut the masked heads out and save the smaller model)."""

from __future__ import annotations

from pathlib import Path

from ..demos.classifier import demo_info, ensure_demo_model
from ..demos.lm import demo_lm_info, ensure_demo_lm_model
from ..errors import HeadpruneError
from ..evaluation.metrics import evaluate
from ..evaluation.speed import compare_speed
from ..model.loading import load_model, save_pruned
from ..model.sizes import size_report
from ..model.surgery import prune_model
from .common import (
    add_data_args,
    add_mask_arg,
    add_memory_arg,
    add_model_args,
    load_mask,
    load_model_and_data,
    summary,
    tqdm_progress,
)


def cmd_demo(args) -> dict:
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
    loaded, _, evals, info = load_model_and_data(args, calib_size=0)
    mask = load_mask(args, loaded)
    metrics = evaluate(loaded.model, evals, mask, progress=tqdm_progress("evaluate"), memory_budget=args.memory_budget)
    # heads gone either way: cut out of a saved pruned model, or gated by --mask
    gone = ~loaded.adapter.live_grid()
    if mask is not None:
        gone |= ~mask.keep_bool()
    return {**metrics.to_dict(), **summary(info), "mask": args.mask, "pruned_heads": int(gone.sum())}


def cmd_prune(args) -> dict:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise HeadpruneError(f"--out {out} is a file; give a folder (created if missing) for the pruned model.")
    loaded = load_model(args.model, "cpu")  # surgery is cheap anywhere; the saved weights are device-free
    mask = load_mask(args, loaded)
    pruned = prune_model(loaded.model, mask)
    save_pruned(pruned, loaded.tokenizer, out, extra={"source_model": loaded.source, "mask": mask.to_json()})
    result = {"out": str(out), "model": args.model, "pruned_heads": mask.n_pruned, "kept_heads": mask.n_kept,
              "sizes": size_report(loaded.model, pruned)}
    if args.benchmark:  # opt-in: timing takes seconds to minutes
        result["speed"] = compare_speed(loaded.model, pruned, repeats=args.benchmark_repeats,
                                        threads=args.benchmark_threads, progress=tqdm_progress("benchmark"))
    return result


def add_commands(sub) -> None:
    p = sub.add_parser("demo", help="build (once, offline) or locate the demo sentiment model")
    p.add_argument("--lm", action="store_true",
                   help="the decoder demo instead: a small Llama-style causal LM with grouped-query attention, "
                        "trained offline on the demo reviews (model 'demo-lm', data 'demo-lm')")
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("evaluate", help="accuracy, macro-F1, MCC and loss of a model, optionally under a mask")
    add_model_args(p)
    add_data_args(p)
    add_mask_arg(p)
    add_memory_arg(p)
    p.set_defaults(handler=cmd_evaluate)

    p = sub.add_parser("prune", help="remove the heads of a mask from the weights and save the smaller model")
    add_model_args(p)
    add_mask_arg(p, required=True)
    p.add_argument("--out", required=True, help="folder to save the pruned model in")
    p.add_argument("--benchmark", action="store_true",
                   help="also time the dense and the pruned model (latency at batch 1, throughput at batch 32, "
                        "lengths 64 and 256, on the auto device) next to the ideal speed-up from FLOPs")
    p.add_argument("--benchmark-repeats", type=int, default=5, help="timed forwards per measurement (default: 5)")
    p.add_argument("--benchmark-threads", type=int, default=None,
                   help="torch CPU threads while timing (default: torch's; 1 gives steadier numbers on a busy machine)")
    p.set_defaults(handler=cmd_prune)
