"""Head roles cost: ``head_roles`` against one plain attention capture over the same probes and calibration texts.

    python benchmarks/bench_roles.py [--models demo demo-lm demo-circuit] [--calib 128] [--repeats 3]

Target (issue 15): all seven role scores cost ≤ 1.5x one capture pass (``model.capture.stream_attention``) over the
probe batch and the calibration texts. The texts are parsed once beforehand (spaCy's cost is the parser's, and
``syntactic_profile``/SAP pay it the same way); the reference pass runs the same texts through the same capture
with nothing read. Best of ``--repeats`` runs of each; prints the ratio per model.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import best_of  # noqa: E402

from headprune.data import load_data, make_batches, model_inputs, split_calib_eval  # noqa: E402
from headprune.model.arch import adapt  # noqa: E402
from headprune.model.capture import stream_attention  # noqa: E402
from headprune.model.loading import load_model  # noqa: E402
from headprune.roles import RoleSpec, head_roles, make_probes  # noqa: E402
from headprune.syntax import parse_dataset  # noqa: E402
from headprune.syntax.align import encode  # noqa: E402


def measure(name: str, calib_size: int, repeats: int) -> tuple[float, float]:
    """(seconds of one capture pass, seconds of head_roles) on ``name``'s probes and calibration texts."""
    loaded = load_model(name, device="cpu")
    model, tokenizer = loaded.model, loaded.tokenizer
    data = replace(load_data(name), labels=None, label_names=None)    # roles read no labels
    calib, _ = split_calib_eval(data, min(calib_size, len(data) // 2), None, seed=0)
    batches = make_batches(tokenizer, calib, 16)
    texts = [calib.texts[i] for b in batches for i in b["index"]]
    parse_dataset(texts)                      # parses are cached: both timings below start from them
    spec = RoleSpec()
    probes = make_probes(model, tokenizer, spec.probe_length, spec.probe_rows, spec.seed, adapt(model).causal)

    def capture_only():
        stream_attention(model, probes.batch, lambda layer, probs: None)
        for start in range(0, len(texts), 16):
            enc = encode(tokenizer, texts[start:start + 16], None, spec.max_length)
            stream_attention(model, model_inputs({k: enc[k] for k in ("input_ids", "attention_mask")}),
                             lambda layer, probs: None)

    def roles():
        head_roles(model, tokenizer, batches, spec, texts=texts)

    return best_of(capture_only, repeats), best_of(roles, repeats)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", nargs="+", default=["demo", "demo-lm", "demo-circuit"])
    parser.add_argument("--calib", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{'model':14} {'capture s':>10} {'roles s':>10} {'ratio':>6}  (target ≤ 1.5; {args.calib} calibration "
          f"texts, parsed beforehand; best of {args.repeats}; {args.threads} threads)")
    for name in args.models:
        base, full = measure(name, args.calib, args.repeats)
        print(f"{name:14} {base:10.2f} {full:10.2f} {full / base:6.2f}", flush=True)


if __name__ == "__main__":
    main()
