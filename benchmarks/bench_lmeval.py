"""lm-evaluation-harness through headprune against lm-eval alone on the same stock model saved to disk.

    python benchmarks/bench_lmeval.py [--model demo-lm] [--task demo_lm_cloze] [--limit 200] [--threads 2]
                                      [--repeats 2] [--batch-size 32] [--mask MASK.json]

headprune: ``run_lm_eval`` on the model held in memory (HFLM over a structural copy, gated when ``--mask`` is
given). lm-eval alone: ``HFLM(pretrained=folder)`` on the same weights saved with ``save_pretrained`` (the masked
export when ``--mask`` is given). Both run ``simple_evaluate`` on the same task, limit, batch size and seeds, best
of ``--repeats``, the two alternating. Timed: headprune's whole ``run_lm_eval`` (its structural copy and HFLM wrapper
included) against lm-eval's ``simple_evaluate`` on an HFLM built before (loading from disk not counted).
Target: headprune / alone <= 1.1x, identical acc and acc_norm, log-likelihoods within 1e-4.

Measured 2026-11-24 (2 shared cores, load ~20 from other work), a tiny random Llama (4 layers, 8/2 heads, byte-level
BPE of 1,000 tokens whose post-processor appends </s>) on demo_lm_cloze, limit 100, best of 3: 5.91 s vs 5.77 s =
1.03x, identical acc/acc_norm, max log-likelihood difference 0.0.

The saved tokenizer: the LM demo's reads a row as ``<bos> text <eos>``; stock lm-eval then splits each choice
after the context's <eos> and scores the wrong tokens. headprune's split rule (``data.choice``) puts the start
token before the context and no end token; a start-token-only post-processor (Llama's kind) gives stock lm-eval
the same ids, so the folder gets the demo tokenizer with that post-processor (``start_token_only``).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers (timing.py)

from timing import timed  # noqa: E402
from tokenizers import processors  # noqa: E402

from headprune.evaluation.harness import (  # noqa: E402
    HarnessSpec,
    harness_model,
    loglikelihoods,
    resolve_tasks,
    run_lm_eval,
)
from headprune.model.export import export_model  # noqa: E402
from headprune.model.loading import load_model  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402


def start_token_only(tokenizer):
    """A copy of a fast tokenizer whose encode adds the start token only (no end token)."""
    fixed = copy.deepcopy(tokenizer)
    bos = fixed.bos_token
    fixed.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, fixed.bos_token_id)])
    return fixed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo-lm")
    ap.add_argument("--task", default="demo_lm_cloze")
    ap.add_argument("--limit", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--mask", default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from lm_eval import simple_evaluate  # optional extra: the benchmark needs it
    from lm_eval.models.huggingface import HFLM

    loaded = load_model(args.model, args.device)
    mask = None if args.mask is None else HeadMask.load(args.mask, loaded.adapter.grid_shape,
                                                        loaded.adapter.group_grid())
    spec = HarnessSpec(tasks=(args.task,), limit=args.limit, batch_size=args.batch_size, loglikelihoods=True)
    tasks = resolve_tasks(spec)
    kwargs = dict(tasks=[args.task], task_manager=tasks.manager, limit=args.limit, bootstrap_iters=spec.bootstrap_iters,
                  log_samples=True, random_seed=0, numpy_random_seed=0, torch_random_seed=0, fewshot_random_seed=0)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "stock"
        fixed = start_token_only(loaded.tokenizer)
        export_model(loaded.model, fixed, mask or HeadMask.ones(loaded.adapter.grid_shape), folder, "masked")
        alone_lm = HFLM(pretrained=str(folder), device=args.device, batch_size=args.batch_size, dtype="float32")

        results, times = {}, {"headprune": [], "alone": []}

        def through_headprune():
            results["headprune"] = run_lm_eval(loaded.model, loaded.tokenizer, tasks, mask)

        def alone():
            results["alone"] = simple_evaluate(alone_lm, **kwargs)

        runs = {"headprune": through_headprune, "alone": alone}
        for r in range(max(1, args.repeats)):   # who goes first alternates: a warm cache favours the second
            for name in (("headprune", "alone") if r % 2 == 0 else ("alone", "headprune")):
                times[name].append(timed(runs[name]))
        # what headprune adds before simple_evaluate starts: a structural copy and the HFLM wrapper
        wrap = timed(lambda: harness_model(loaded.model, loaded.tokenizer, args.batch_size))

    mine, theirs = results["headprune"], results["alone"]
    row_mine, row_theirs = mine["results"][args.task], theirs["results"][args.task]
    ll_mine = torch.tensor(mine["loglikelihoods"][args.task], dtype=torch.float64)
    ll_theirs = torch.tensor(loglikelihoods(theirs)[args.task], dtype=torch.float64)
    best = {k: min(v) for k, v in times.items()}
    out = {
        "model": args.model, "task": args.task, "limit": args.limit, "batch_size": args.batch_size,
        "threads": args.threads, "mask_pruned_heads": 0 if mask is None else mask.n_pruned,
        "seconds_headprune": times["headprune"], "seconds_alone": times["alone"],
        "ratio_best": best["headprune"] / best["alone"], "wrapper_seconds": wrap,
        "acc": [row_mine["acc,none"], row_theirs["acc,none"]],
        "acc_norm": [row_mine["acc_norm,none"], row_theirs["acc_norm,none"]],
        "identical_metrics": (row_mine["acc,none"], row_mine["acc_norm,none"])
        == (row_theirs["acc,none"], row_theirs["acc_norm,none"]),
        "max_loglikelihood_difference": float((ll_mine - ll_theirs).abs().max()),
    }
    print(json.dumps(out, indent=1))
    print(f"lm-eval through headprune {best['headprune']:.2f} s vs alone {best['alone']:.2f} s: "
          f"{out['ratio_best']:.2f}x (target <= 1.1x); metrics identical: {out['identical_metrics']}")


if __name__ == "__main__":
    main()
