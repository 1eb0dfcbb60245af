"""How much faster is the pruned model? FLOPs accounting (the ideal) and measured latency / throughput (the real).

FLOPs (one forward of a sequence of T tokens, batch 1; a multiply-add counts 2 FLOPs)
--------------------------------------------------------------------------------
Counted, not derived from a formula per architecture: one forward runs on a hook-carrying *structural copy* of
the model (``hooks.structural_copy``: the caller's model gets no hooks) and every call of a matrix product is
charged from the shapes it actually sees, so cut blocks (fewer rows in Q/K/V, fewer columns in O), fused Q|K|V
modules, grouped-query attention (K/V with H_kv < H heads), ALBERT's one block reused by every layer, and
classifier heads that read one token are all counted as they run:

    projection  (nn.Linear or transformers' Conv1D, d_in -> d_out, applied to n token vectors)
                F = 2 · n · d_in · d_out                    (Q, K, V, O of every block, feed-forward, pooler, head)
    attention   per call of a block's attention core with h = len(block.kept) query heads of size d_h over T
                tokens: scores S = Q Kᵀ and context P V, each 2 · h · T · T · d_h, so
                F = 4 · h · T² · d_h
                (with GQA the K/V of a group are shared, but every query head still forms its own T x T scores;
                a causal decoder's kernels still compute all T² scores and mask half of them, so T² is kept).

    attention FLOPs   = Σ over calls of Q, K, V, O projections (a fused Q|K|V module counted once per call)
                        + Σ attention-core FLOPs
    total FLOPs       = attention FLOPs + every other projection.
Not counted: embeddings (look-ups), LayerNorm, softmax, activations, residual adds: O(T·d) elementwise work
against O(T·d²) for a projection. They are the main reason a measured saving falls short of the FLOPs saving.

Ideal speed-up of a pruned model over its dense original: F_dense / F_pruned; ideal time saving
ΔF / F_dense = 1 − F_pruned / F_dense. Realised share of the ideal saving:

    share = (1 − t_pruned / t_dense) ÷ (ΔF / F_dense)         (1 = the clock saves exactly what FLOPs predict)

Timing
------
``time_forward`` times one full forward (no labels, ``torch.inference_mode``) of a seeded batch of random token
ids with no padding: ``warmup`` untimed calls, then the median of ``repeats`` timed calls (CUDA synchronised).
``compare_speed`` interleaves the dense and the pruned model call by call (A B A B ...), so a change in the load
of a shared machine hits both alike. Latency = median seconds at batch 1; throughput = batch / median seconds
at batch 32 (sequences per second). The torch thread count is part of every report.
"""

from __future__ import annotations

import copy
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import HeadpruneError
from ..model.arch import adapt
from ..model.device import resolve_device, synchronise
from ..model.hooks import attached, post_hook, structural_copy
from ..model.mask import HeadMask
from ..model.onnx_export import compare_sessions, export_onnx
from ..model.surgery import prune_model

Progress = Callable[[float, str], None]
LENGTHS = (64, 256)
LATENCY_BATCH = 1
THROUGHPUT_BATCH = 32


class SpeedError(HeadpruneError):
    """A speed measurement was asked for with settings it cannot use."""


@dataclass
class FlopCount:
    """Matrix-product FLOPs of one forward of one sequence of ``seq_len`` tokens (see the module docstring)."""

    seq_len: int
    attention_projections: float   # Q, K, V, O
    attention_scores: float        # Q Kᵀ and P V
    other: float                   # every other projection: feed-forward, pooler, classifier

    @property
    def attention(self) -> float:
        return self.attention_projections + self.attention_scores

    @property
    def total(self) -> float:
        return self.attention + self.other

    def to_dict(self) -> dict:
        return {"seq_len": self.seq_len, "total_gflops": self.total / 1e9, "attention_gflops": self.attention / 1e9,
                "attention_share": self.attention / self.total if self.total else 0.0}


def _projection_shape(module: nn.Module) -> tuple[int, int] | None:
    """(d_in, d_out) of an nn.Linear or of transformers' Conv1D (weight stored d_in x d_out); else None."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        d_in, d_out = module.weight.shape
        return int(d_in), int(d_out)
    return None


def _hidden_of(args: tuple, kwargs: dict) -> torch.Tensor | None:
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    return hidden if isinstance(hidden, torch.Tensor) else None


def dummy_batch(model: nn.Module, batch_size: int, seq_len: int, seed: int = 0,
                device: torch.device | str = "cpu") -> dict:
    """``batch_size`` rows of ``seq_len`` random token ids (ids 5.. avoid the usual special tokens), no padding."""
    vocab = int(getattr(model.config, "vocab_size", 1000))
    limit = getattr(model.config, "max_position_embeddings", None)
    if limit is not None and seq_len > limit:
        raise SpeedError(f"Sequence length {seq_len} is longer than this model accepts ({limit} positions); "
                         f"choose a length <= {limit}.")
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, vocab - 1), vocab, (batch_size, seq_len), generator=generator)
    return {"input_ids": ids.to(device), "attention_mask": torch.ones_like(ids, device=device)}


def count_flops(model: nn.Module, seq_len: int) -> FlopCount:
    """Count the matrix-product FLOPs of one forward of one ``seq_len``-token sequence (module docstring).

    Runs that forward on a structural copy (shared weights, own hooks): ``model`` is not changed.
    """
    counted = structural_copy(model)
    adapter = adapt(counted)
    attention_modules = {id(m) for b in adapter.blocks for m in (b.query, b.key, b.value, b.output)}
    heads_of_core = {id(b.core): (b.n_live, b.head_size) for b in adapter.blocks}
    counts = {"attention_projections": 0.0, "attention_scores": 0.0, "other": 0.0}

    def on_projection(module, args, _kwargs, _output):
        d_in, d_out = _projection_shape(module)
        tokens = args[0].numel() // d_in if d_in else 0
        key = "attention_projections" if id(module) in attention_modules else "other"
        counts[key] += 2.0 * tokens * d_in * d_out

    def on_core(module, args, kwargs, _output):
        hidden = _hidden_of(args, kwargs)
        if hidden is None:
            return
        n_heads, head_size = heads_of_core[id(module)]
        rows, length = hidden.shape[0], hidden.shape[-2]
        counts["attention_scores"] += 4.0 * rows * n_heads * length * length * head_size

    counters = [post_hook(m, on_projection, f"count FLOPs of {name}") for name, m in counted.named_modules()
                if _projection_shape(m) is not None]
    counters += [post_hook(b.core, on_core, f"count attention FLOPs of block {b.index}")
                 for b in {id(b.core): b for b in adapter.blocks}.values()]
    device = next(counted.parameters()).device
    with attached(counters), torch.inference_mode():
        counted(**dummy_batch(counted, 1, seq_len, device=device))
    return FlopCount(seq_len, **counts)


def ideal_speedup(dense: FlopCount, pruned: FlopCount) -> dict:
    """FLOPs removed by pruning: share of the dense total (the ideal time saving) and F_dense / F_pruned."""
    removed = dense.total - pruned.total
    return {"dense_gflops": dense.total / 1e9, "pruned_gflops": pruned.total / 1e9,
            "removed_flops_share": removed / dense.total if dense.total else 0.0,
            "ideal_speedup": dense.total / pruned.total if pruned.total else float("inf")}


def realised_share(t_dense: float, t_pruned: float, removed_flops_share: float) -> float | None:
    """(1 − t_pruned / t_dense) ÷ (ΔF / F): the share of the FLOPs-predicted time saving the clock shows."""
    if removed_flops_share <= 0:
        return None
    return (1.0 - t_pruned / t_dense) / removed_flops_share


@contextmanager
def _threads(n: int | None):
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def time_rounds(models: Sequence[nn.Module], batch: dict, repeats: int = 5, warmup: int = 1,
                clock: str = "wall") -> list[list[float]]:
    """Seconds of one forward of ``batch`` per model and round: ``[model][round]``, the models called in turn
    (A B A B ...), so round r of every model saw the same machine load.

    ``clock="wall"`` times elapsed time (what a user waits for). ``clock="cpu"`` times this process's CPU
    seconds (``time.process_time``), which a busy shared machine cannot inflate by descheduling us; with one
    torch thread on CPU it equals the wall time of an idle machine (with n threads it sums them: not a latency).
    """
    if repeats < 1 or warmup < 0:
        raise SpeedError(f"repeats must be >= 1 and warmup >= 0 (got repeats={repeats}, warmup={warmup}).")
    if clock not in CLOCKS:
        raise SpeedError(f"Unknown clock '{clock}'; accepted: {', '.join(CLOCKS)}.")
    now = CLOCKS[clock]
    device = batch["input_ids"].device
    times: list[list[float]] = [[] for _ in models]
    with torch.inference_mode():
        for round_ in range(warmup + repeats):
            for i, model in enumerate(models):
                synchronise(device)
                start = now()
                model(**batch)
                synchronise(device)
                if round_ >= warmup:
                    times[i].append(now() - start)
    return times


def time_forwards(models: Sequence[nn.Module], batch: dict, repeats: int = 5, warmup: int = 1,
                  clock: str = "wall") -> list[float]:
    """Median seconds of one forward of ``batch`` for each model (``time_rounds``)."""
    return [statistics.median(t) for t in time_rounds(models, batch, repeats, warmup, clock)]


def _runnable_on(model: nn.Module, device: torch.device) -> nn.Module:
    """An eval-mode copy of ``model`` on ``device``: structural (shared weights) when already there, else deep,
    because ``.to`` on a structural copy would move the shared parameters of the caller's model too."""
    if next(model.parameters()).device == device:
        return structural_copy(model).eval()
    return copy.deepcopy(model).to(device).eval()


def compare_speed(dense: nn.Module, pruned: nn.Module, lengths: Sequence[int] = LENGTHS,
                  latency_batch: int = LATENCY_BATCH, throughput_batch: int = THROUGHPUT_BATCH, repeats: int = 5,
                  warmup: int = 1, device: str | torch.device = "auto", threads: int | None = None,
                  seed: int = 0, progress: Progress | None = None) -> dict:
    """Measured and ideal speed-up of ``pruned`` over ``dense``, per sequence length: a JSON-ready dict.

    Both models are moved to ``device`` as eval-mode structural copies (the callers' models stay where they
    are). Per length: FLOPs (ideal speed-up and removed share), latency at ``latency_batch`` (ms), throughput at
    ``throughput_batch`` (sequences/s), the measured speed-ups and the realised share of the ideal saving at
    each batch size. ``threads`` sets torch's CPU threads for the measurement (default: leave as is). Lengths
    beyond the model's position limit are listed under "skipped_lengths" instead of timed.
    """
    device = resolve_device(device)
    models = [_runnable_on(m, device) for m in (dense, pruned)]
    limit = getattr(dense.config, "max_position_embeddings", None)
    skipped = [n for n in lengths if limit is not None and n > limit]
    lengths = [n for n in lengths if n not in skipped]
    report = {"device": str(device), "torch_threads": threads or torch.get_num_threads(), "repeats": repeats,
              "warmup": warmup, "latency_batch": latency_batch, "throughput_batch": throughput_batch,
              "lengths": {}}
    if skipped:  # a short-context model still gets the lengths it accepts, and is told which it does not
        report["skipped_lengths"] = {str(n): f"longer than the model's {limit} positions" for n in skipped}
    steps = max(1, len(lengths) * 2)
    with _threads(threads):
        for i, length in enumerate(lengths):
            flops = [count_flops(m, length) for m in models]
            entry = {**ideal_speedup(*flops), "attention_share": flops[0].to_dict()["attention_share"]}
            for j, (name, batch_size) in enumerate((("latency", latency_batch), ("throughput", throughput_batch))):
                if progress:
                    progress((2 * i + j) / steps, f"timing length {length}, batch {batch_size}")
                t_dense, t_pruned = time_forwards(models, dummy_batch(models[0], batch_size, length, seed, device),
                                                  repeats, warmup)
                if name == "latency":
                    entry.update(latency_ms_dense=1e3 * t_dense, latency_ms_pruned=1e3 * t_pruned)
                else:
                    entry.update(throughput_dense=batch_size / t_dense, throughput_pruned=batch_size / t_pruned)
                entry[f"{name}_speedup"] = t_dense / t_pruned
                entry[f"{name}_realised_share"] = realised_share(t_dense, t_pruned, entry["removed_flops_share"])
            report["lengths"][str(length)] = entry
    if progress:
        progress(1.0, "timed")
    return report


def speed_table(report: dict) -> list[dict]:
    """One row per sequence length of a ``compare_speed`` report, rounded for display (a page or a CLI table)."""
    rows = []
    for length, e in report["lengths"].items():
        rows.append({"length": int(length),
                     "ideal speed-up (FLOPs)": round(e["ideal_speedup"], 2),
                     f"latency dense (ms, batch {report['latency_batch']})": round(e["latency_ms_dense"], 1),
                     "latency pruned (ms)": round(e["latency_ms_pruned"], 1),
                     "latency speed-up": round(e["latency_speedup"], 2),
                     f"throughput dense (seq/s, batch {report['throughput_batch']})": round(e["throughput_dense"], 1),
                     "throughput pruned (seq/s)": round(e["throughput_pruned"], 1),
                     "throughput speed-up": round(e["throughput_speedup"], 2)})
    return rows


def speed_headline(report: dict) -> dict:
    """What a page shows above the ``speed_table``: for the longest sequence length timed, the ideal (FLOPs)
    speed-up, the measured throughput and latency speed-ups, and the realised share of the ideal saving at
    the throughput batch, with the conditions they were measured under (device, threads)."""
    if not report["lengths"]:
        return {"note": "no sequence length could be timed", **report.get("skipped_lengths", {})}
    length, entry = max(report["lengths"].items(), key=lambda item: int(item[0]))
    share = entry["throughput_realised_share"]
    return {"length": int(length), "device": report["device"], "torch_threads": report["torch_threads"],
            "ideal_speedup": round(entry["ideal_speedup"], 2),
            "throughput_speedup": round(entry["throughput_speedup"], 2),
            "latency_speedup": round(entry["latency_speedup"], 2),
            "realised_share": None if share is None else round(share, 2)}


def mask_flops(model: nn.Module, mask: HeadMask, seq_len: int) -> dict:
    """Ideal speed-up of cutting ``mask``'s heads out of ``model`` (FLOPs only; no timing, no copy kept)."""
    return ideal_speedup(count_flops(model, seq_len), count_flops(prune_model(model, mask), seq_len))


def head_count_timings(hidden_size: int, head_size: int, max_heads: int, seq_len: int, batch_size: int = 32,
                       repeats: int = 5, warmup: int = 1, seed: int = 0, clock: str = "wall") -> dict[int, float]:
    """Median seconds of one stand-alone attention block with h = 1..max_heads heads (Q/K/V/O + SDPA).

    Projections d -> h·d_h (three) and h·d_h -> d, softmax(Q Kᵀ / √d_h) V by ``scaled_dot_product_attention``:
    the work a cut block does. Per-head cost flat in h means odd head counts cost nothing extra; a step at
    some h means rounding per-layer head counts (``round_kept_heads``) is worth it. ``clock`` as in
    ``time_forwards``.
    """
    if clock not in CLOCKS:
        raise SpeedError(f"Unknown clock '{clock}'; accepted: {', '.join(CLOCKS)}.")
    now = CLOCKS[clock]
    torch.manual_seed(seed)
    hidden = torch.randn(batch_size, seq_len, hidden_size)
    timings = {}
    with torch.inference_mode():
        for heads in range(1, max_heads + 1):
            width = heads * head_size
            qkv = [nn.Linear(hidden_size, width) for _ in range(3)]
            out = nn.Linear(width, hidden_size)

            def block(x, qkv=qkv, out=out, heads=heads):
                q, k, v = (p(x).view(batch_size, seq_len, heads, head_size).transpose(1, 2) for p in qkv)
                context = torch.nn.functional.scaled_dot_product_attention(q, k, v)
                return out(context.transpose(1, 2).reshape(batch_size, seq_len, heads * head_size))

            samples = []
            for round_ in range(warmup + repeats):
                start = now()
                block(hidden)
                if round_ >= warmup:
                    samples.append(now() - start)
            timings[heads] = statistics.median(samples)
    return timings


def round_kept_heads(mask: HeadMask, multiple: int, scores=None) -> tuple[HeadMask, dict]:
    """Round every block's kept-head count UP to a multiple of ``multiple`` by restoring pruned heads.

    A block keeping k heads (0 < k, k not a multiple) keeps min(H, ⌈k / m⌉·m): the restored heads are the pruned
    ones with the highest ``scores`` (an (n_blocks, H) array, higher = more important; NaN ranks last), or the
    lowest ids when no scores are given. Blocks with no heads stay empty (they skip attention altogether). Rounding
    up never removes a head the user kept, so accuracy can only be judged again, not lost by surprise.
    Returns (new mask, report): the report lists the restored heads per block, for the user to see.

    Measured on the demo's shape (d = 384, d_h = 32; 4096 tokens, one CPU thread, CPU seconds): odd head counts
    cost nothing extra -- a Q/K/V projection costs 862 µs per head at 5 heads, 855 at 6, 756 at 9, 741 at 10 --
    and rounding to a multiple of 2 did not raise the realised share in ``benchmarks/bench_pruned_speed.py``.
    What does cost is narrowness: 739 µs per head at 12 heads, 855 at 6, 1210 at 3, because every projection
    re-reads its whole (tokens x d) input whatever its width. So this is offered for hardware where alignment
    matters (GPUs with tensor cores prefer multiples of 8 in h·d_h), not needed on this CPU.
    """
    if multiple < 1:
        raise SpeedError(f"Head counts can be rounded to a multiple of a positive integer, not {multiple}.")
    keep = mask.keep_bool()
    n_heads = keep.shape[1]
    values = None if scores is None else np.nan_to_num(np.asarray(scores, dtype=float), nan=-np.inf)
    restored: dict[int, list[int]] = {}
    new = mask
    for block in range(keep.shape[0]):
        kept = int(keep[block].sum())
        target = min(n_heads, -(-kept // multiple) * multiple) if kept else 0
        pruned = [h for h in range(n_heads) if not keep[block, h]]
        if values is not None:
            pruned.sort(key=lambda h: -values[block, h])
        chosen = sorted(pruned[:target - kept])
        for head in chosen:
            new = new.restore(block, head)
        if chosen:
            restored[block] = chosen
    report = {"multiple": multiple, "restored": restored, "heads_restored": sum(len(h) for h in restored.values()),
              "kept_per_block_before": keep.sum(1).tolist(), "kept_per_block_after": new.keep_bool().sum(1).tolist()}
    return new, report


ONNX_BATCH, ONNX_LENGTH, ONNX_THREADS = 8, 128, 2


def onnx_speed(model: nn.Module, mask: HeadMask, pruned: dict | None = None, *, batch_size: int = ONNX_BATCH,
               seq_len: int = ONNX_LENGTH, threads: int = ONNX_THREADS, repeats: int = 20, warmup: int = 2,
               progress: Progress | None = None) -> dict:
    """The cut model's speed in onnxruntime: the pruned/dense ratio of median batch latency (``onnx_export.
    compare_sessions``: ``batch_size`` x ``seq_len`` tokens, ``threads`` intra-op threads, the two graphs timed in
    turn) beside the ideal ratio F_pruned / F_dense (:func:`count_flops` at ``seq_len``) and the realised share
    of the ideal saving (:func:`realised_share`).

    The dense graph (and the pruned one, unless ``pruned`` is ``export_onnx``'s result for ``model`` cut by
    ``mask``) is exported to a temporary folder first; ``model`` is not changed.
    """
    report = progress or (lambda f, m: None)
    with tempfile.TemporaryDirectory(prefix="headprune-onnx-") as tmp:
        report(0.0, "exporting the dense graph")
        dense = export_onnx(model, None, None, Path(tmp) / "dense")
        if pruned is None:
            report(0.3, "exporting the pruned graph")
            pruned = export_onnx(model, None, mask, Path(tmp) / "pruned")
        report(0.6, "timing both graphs in onnxruntime")
        timing = compare_sessions(dense["file"], pruned["file"], dense["model"], batch_size=batch_size,
                                  seq_len=seq_len, threads=threads, repeats=repeats, warmup=warmup)
    flops = ideal_speedup(count_flops(dense["model"], timing["length"]), count_flops(pruned["model"], timing["length"]))
    report(1.0, "timed")
    return {**timing, "ideal_ratio": flops["pruned_gflops"] / flops["dense_gflops"],
            "dense_gflops": flops["dense_gflops"], "pruned_gflops": flops["pruned_gflops"],
            "realised_share": realised_share(timing["dense_s"], timing["pruned_s"], flops["removed_flops_share"])}
