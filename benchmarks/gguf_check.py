"""Inside llama-cpp-python's own environment (``gguf_check.sh``): does llama.cpp, unmodified, compute what headprune's
cut model computes from the GGUF files ``prune --format gguf`` wrote? Never imports headprune or torch: the GGUF
files and the reference logits (``gguf_check_write.py``) are all that crosses.

For every logits case: llama.cpp evaluates each real row (token ids as headprune tokenized it) with every
position's logits kept, and the error is max |logits_llama.cpp - logits_headprune| / max |logits_headprune| over the
row; an f32 case must stay within 1e-3 (the issue's bar; f16 / q8_0 cases are reported, since llama.cpp then also
rounds activations). For every tokenizer case: llama.cpp's tokenizer on each text (with its special tokens) must
give headprune's ids exactly. Prints one JSON line; exit 1 on any mismatch.
Usage: python gguf_check.py WORK_DIR [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama


def row_error(llm: Llama, ids: list[int], want: np.ndarray) -> float:
    llm.reset()
    llm.eval(ids)
    got = np.asarray(llm.scores[: llm.n_tokens], dtype=np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("work")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    work = Path(args.work)
    spec = json.loads((work / "cases.json").read_text())
    start = time.perf_counter()
    results, failed = [], []
    for case in spec["logits"]:
        try:
            llm = Llama(model_path=case["file"], n_ctx=128, n_batch=128, n_threads=args.threads, logits_all=True,
                        verbose=False)
        except ValueError as exc:   # llama.cpp refused the file: a failure of the export, reported with the rest
            results.append({"case": case["name"], "loaded": False, "error": str(exc), "ok": False})
            failed.append(case["name"])
            continue
        refs = np.load(work / f"{case['name']}.npz")
        errors = [row_error(llm, ids, refs[f"arr_{i}"]) for i, ids in enumerate(case["rows"])]
        ok = case["bound"] is None or max(errors) <= case["bound"]
        results.append({"case": case["name"], "type": case["tensor_type"], "head_count": case["head_count"],
                        "head_count_kv": case["head_count_kv"], "null_head_layers": case["null_head_layers"],
                        "rows": len(errors), "max_error": max(errors), "bound": case["bound"], "ok": ok})
        if not ok:
            failed.append(case["name"])
        del llm
    for case in spec["tokenizers"]:
        llm = Llama(model_path=case["file"], n_ctx=16, vocab_only=True, verbose=False)
        got = [llm.tokenize(t.encode("utf-8"), add_bos=True, special=False) for t in case["llama_cpp_texts"]]
        wrong = [i for i, (a, b) in enumerate(zip(got, case["ids"])) if a != b]
        results.append({"case": case["name"], "texts": len(got), "same_ids": len(got) - len(wrong),
                        "first_difference": None if not wrong else {"text": case["texts"][wrong[0]],
                                                                    "llama_cpp": got[wrong[0]],
                                                                    "headprune": case["ids"][wrong[0]]},
                        "ok": not wrong})
        if wrong:
            failed.append(case["name"])
        del llm
    print(json.dumps({"llama_cpp_python": llama_cpp.__version__, "threads": args.threads, "results": results,
                      "failed": failed, "check_s": round(time.perf_counter() - start, 1)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
