"""Inside llama-cpp-python's own environment (``bench_runtimes.py --runtime llamacpp`` calls it): tokens per second
of GGUF files in llama.cpp, prompt processing (pp: one batch of ``--prompt`` tokens) and generation (tg: ``--gen``
tokens one at a time after that prompt, as a chat answer is produced), with ``--threads`` threads.

The files are timed in turn within every repeat (dense, cut 1, cut 2, ... then again), so a change in the load of a
shared machine hits all of them alike; each figure is the best of ``--repeats`` (as ``timing.best_of``: on a
shared machine another process can only slow a run down). The token ids are seeded
random ids below the smallest vocabulary (speed does not depend on which tokens; no sampling is timed: the next
token is fixed). Besides wall-clock tokens/s, tokens per second of the process's CPU time (all its threads): on a
machine shared with other work, the CPU a run was given, not the time it waited for it, and with one thread no
spin-waiting counts in it. Never imports headprune or torch. Prints one JSON object:
{file: {"pp_tok_s", "tg_tok_s", "pp_cpu_tok_s", "tg_cpu_tok_s"}}.
Usage: python llamacpp_speed.py FILE... [--threads 2] [--prompt 128] [--gen 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from llama_cpp import Llama


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("files", nargs="+")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    models = {f: Llama(model_path=f, n_ctx=args.prompt + args.gen + 8, n_batch=args.prompt, n_ubatch=args.prompt,
                       n_threads=args.threads, n_threads_batch=args.threads, verbose=False) for f in args.files}
    vocab = min(m.n_vocab() for m in models.values())
    ids = np.random.default_rng(0).integers(3, vocab, args.prompt + args.gen).tolist()
    prompt, answer = ids[: args.prompt], ids[args.prompt:]
    pp = {f: [] for f in models}
    tg = {f: [] for f in models}
    for repeat in range(args.repeats + 1):   # round 0 warms caches and is not kept
        for f, llm in models.items():
            llm.reset()
            start, cpu_start = time.perf_counter(), time.process_time()
            llm.eval(prompt)
            middle, cpu_middle = time.perf_counter(), time.process_time()
            for token in answer:
                llm.eval([token])
            end, cpu_end = time.perf_counter(), time.process_time()
            if repeat:
                pp[f].append((args.prompt / (middle - start), args.prompt / (cpu_middle - cpu_start)))
                tg[f].append((args.gen / (end - middle), args.gen / (cpu_end - cpu_middle)))
    print(json.dumps({f: {"pp_tok_s": max(w for w, _ in pp[f]), "tg_tok_s": max(w for w, _ in tg[f]),
                          "pp_cpu_tok_s": max(c for _, c in pp[f]), "tg_cpu_tok_s": max(c for _, c in tg[f])}
                      for f in models}))


if __name__ == "__main__":
    main()
