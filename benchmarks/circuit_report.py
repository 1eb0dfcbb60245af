"""The circuit demo's four measurements (docs/tutorials/circuit.md; tests/test_circuit.py checks the first three).

    python benchmarks/circuit_report.py [--calib 64] [--eval 192] [--seeds 10]

1. the role detectors' previous-token and induction heads, per layer;
2. repeated-half next-token accuracy with the induction heads pruned, against 10 random sets of as many heads drawn
   from the heads outside the circuit (neither induction nor previous-token);
3. induction scores of a freshly initialised copy (same config, seed 0);
4. for every criterion, the share of the circuit's induction and previous-token heads it keeps with 25 / 50 / 75%
   of all heads pruned, in the order of its trajectory (one step per head, so criteria that re-score while
   pruning, greedy-gnorm and hies, are read in the order they really prune).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from transformers import LlamaForCausalLM

from headprune.data import calibration_texts, load_data, make_batches, split_calib_eval
from headprune.evaluation.live import LiveEvaluator
from headprune.model.loading import load_model
from headprune.roles import RoleSpec, head_roles, kept_by_role, role_ablation
from headprune.scoring import REGISTRY
from headprune.trajectory import TrajectorySpec, run_trajectory


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calib", type=int, default=64)
    parser.add_argument("--eval", type=int, default=192)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model("demo-circuit", device="cpu")
    calib_ds, eval_ds = split_calib_eval(load_data("demo-circuit"), args.calib, args.eval, seed=0)
    calib = make_batches(loaded.tokenizer, calib_ds, 32)
    evals = make_batches(loaded.tokenizer, eval_ds, 64)
    report = head_roles(loaded.model, loaded.tokenizer, calib, RoleSpec(parser=None))
    out: dict = {"counts": report.counts()}
    for role in ("previous-token", "induction"):
        heads = report.heads_with(role)
        out[role] = {f"layer {layer}": np.flatnonzero(heads[layer]).tolist() for layer in range(heads.shape[0])}
        out[f"{role} scores"] = np.round(report.scores[role].scores, 2).tolist()

    live = LiveEvaluator(loaded.model, evals)
    ablation = role_ablation(live, report, "induction", seeds=args.seeds, metric="next_token_accuracy",
                             exclude=["previous-token"])
    out["ablation"] = {k: ablation[k] for k in ("base", "role_value", "random_mean", "random_sd", "n_heads",
                                                "random_pool", "random_values")}
    out["ablation"]["random_kept_share"] = ablation["random_mean"] / ablation["base"]

    torch.manual_seed(0)
    fresh = LlamaForCausalLM._from_config(loaded.model.config, attn_implementation="sdpa").eval()
    fresh_report = head_roles(fresh, loaded.tokenizer, calib, RoleSpec(parser=None))
    out["fresh_max_induction"] = float(np.nanmax(fresh_report.scores["induction"].scores))

    texts = calibration_texts(calib_ds, calib)
    orders, errors = {}, {}
    for name, crit in sorted(REGISTRY.items()):
        spec = TrajectorySpec(criterion=crit, step=1, budget=0.75, seed=0)
        try:
            traj = run_trajectory(spec, loaded.model, calib, evals, tokenizer=loaded.tokenizer, texts=texts,
                                  evaluator=live)
        except Exception as exc:   # noqa: BLE001 - a criterion that cannot run here is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {exc}"
            continue
        orders[name] = traj.order()
    table = {str(r): kept_by_role(orders, report, r) for r in (0.25, 0.5, 0.75)}
    out["kept"] = {name: {r: {role: table[r][name]["kept_share"][role] for role in ("induction", "previous-token")}
                          for r in table} for name in orders}
    out["criterion_errors"] = errors
    print(json.dumps(out, indent=1))
    print(f"\n{'criterion':14} " + " ".join(f"{'ind/prev @' + r:>16}" for r in table))
    for name in orders:
        cells = [f"{table[r][name]['kept_share']['induction']:.2f}/{table[r][name]['kept_share']['previous-token']:.2f}"
                 for r in table]
        print(f"{name:14} " + " ".join(f"{c:>16}" for c in cells))


if __name__ == "__main__":
    main()
