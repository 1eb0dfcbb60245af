"""Inside kvpress's own environment (``kvpress_check.sh``): does kvpress, through ``HeadprunePlanPress``, stream
exactly the heads a headprune plan file streams? Never imports headprune: the plan file is all that crosses.

On a random Llama of the plan's grid (layers, query and key/value heads), with kvpress 0.5.5's press context and a
prefill of ``--tokens`` tokens, it checks:
1. ``press.streaming_mask`` is the plan's streaming grid, and sink / recent sizes are the plan's;
2. after the prefill, every layer's ``masked_key_indices`` (the keys kvpress hides from later queries) are exactly
   the streaming heads' positions in [sink, T - recent), and none of a full head;
3. at head_compression_ratio 0.5 the press streams the half of the groups with the lowest plan scores (the plan's
   group scores, ties lower index first: what ``headprune kvplan --full-share 0.5`` keeps, computed here by hand).
Prints a JSON line; exit 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch
from kvpress_headprune_press import HeadprunePlanPress, read_plan
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("plan")
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args()
    start = time.perf_counter()
    plan = read_plan(args.plan)
    layers, n_kv = plan["full"].shape
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=8 * plan["n_heads"], intermediate_size=64,
                         num_hidden_layers=layers, num_attention_heads=plan["n_heads"], num_key_value_heads=n_kv,
                         max_position_embeddings=max(256, args.tokens))
    model = LlamaForCausalLM(config).eval()
    model.set_attn_implementation("sdpa")
    ids = torch.randint(0, 128, (1, args.tokens))
    press = HeadprunePlanPress(plan_file=args.plan)
    with torch.no_grad(), press(model):
        model(input_ids=ids, past_key_values=DynamicCache())
    checks = {"streaming_mask": bool(np.array_equal(press.streaming_mask.cpu().numpy(), ~plan["full"])),
              "sink_recent": (press.sink_size, press.recent_size) == (plan["sink"], plan["window"])}
    exact = True
    t, s, w = args.tokens, plan["sink"], plan["window"]
    for layer in model.model.layers:
        got = getattr(layer.self_attn, "masked_key_indices", None)
        want = {(0, h, p) for h in np.flatnonzero(~plan["full"][layer.self_attn.layer_idx]) for p in range(s, t - w)}
        have = set() if got is None else set(zip(*(x.tolist() for x in got)))
        exact &= have == want
    checks["masked_keys"] = bool(exact)
    if plan["scores"] is not None:
        flat = plan["scores"].ravel()
        keep = sorted(range(flat.size), key=lambda i: (-flat[i], i))[:round(0.5 * flat.size)]
        want = np.ones(flat.size, dtype=bool)
        want[keep] = False
        half = HeadprunePlanPress(plan_file=args.plan, head_compression_ratio=0.5)
        half.post_init_from_model(model)
        checks["half_share"] = bool(np.array_equal(half.streaming_mask.cpu().numpy().ravel(), want))
    import kvpress
    import transformers
    print(json.dumps({"checks": checks, "streaming_kv_heads": int((~plan["full"]).sum()), "kv_heads":
                      int(plan["full"].size), "kvpress": kvpress.__version__ if hasattr(kvpress, "__version__")
                      else "0.5.5", "transformers": transformers.__version__, "torch": torch.__version__,
                      "seconds": round(time.perf_counter() - start, 2)}))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
