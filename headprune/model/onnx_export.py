"""The ``onnx`` export: headprune's cut model as one ONNX graph that onnxruntime runs, smaller and faster.

What is written
---------------
A folder holding ``model.onnx`` and the tokenizer's files. The graph is the cut model of the ``headprune`` format
(``surgery.prune_model``: any mask, a different number of heads in every layer, a tuned mask's scales baked into
the O columns) traced once: every layer is a plain sequence of matrix products whose Q/K/V/O matrices simply
have fewer rows or columns, so no runtime needs to know about heads or about headprune.

    inputs   input_ids, attention_mask (int64, batch x sequence), and token_type_ids where the model embeds
             segment types (``type_vocab_size`` > 1: BERT, ALBERT, ELECTRA)
    output   logits: batch x labels (a classifier) or batch x sequence x vocabulary (a causal LM; no key/value
             cache: every position's next-token logits in one pass)
    axes     batch and sequence are dynamic (named "batch" and "sequence"); a sequence may be as long as the
             model's position table (``max_position_embeddings``)
    opset    :data:`OPSET` (17: LayerNormalization is one operator; onnxruntime implements opset 17 from 1.13 on)

The file's metadata (``metadata_props``) says the opset, the inputs, the task, the kept heads per layer, the mask,
the source model and the check below, so a reader needs no headprune to know what it holds.

The exporter
------------
torch 2.13 offers two: the TorchScript exporter (``torch.onnx.export(..., dynamo=False)``: traces one forward,
needs nothing beyond torch) and the dynamo exporter (``dynamo=True``: ``torch.export`` plus onnxscript, a further
package). Both were tried on tiny cut models of every family headprune adapts (uneven masks, a layer with no heads,
padded rows, two batch sizes and lengths; 2026-11-28): the TorchScript graphs matched the cut model within 2e-6 of
the logits' scale for all 14 families, at 0.3 to 3 seconds an export; the dynamo exporter took 14 to 59 seconds a
model, and its ModernBERT graph was wrong for a left-padded batch (2.5e-1 of the scale). So this module traces with
the TorchScript exporter. Tracing follows the Python of one call, so the trace is fed a batch whose second row is
padded (the mask path, not a shortcut for unpadded rows, is what gets recorded), and the written file is then run
in onnxruntime at two shapes and compared with the cut model before the folder appears (:data:`TOLERANCE`): a
family whose trace did not generalise is refused with nothing written, rather than exported wrong.

What is traced is a private copy: ``structural_copy`` (no torch hook, no headprune Hook, no temporary forward
wrapper another caller has on the shared model) cut by ``prune_model`` (a deep copy, so baking scales or moving it
to the CPU in float32 never touches the caller's tensors). Surgery's own permanent forwards (a core with no heads
left, Phi-3's per-core counts) and a mask's dropped layers are part of the cut model and are traced as such; the
attention implementation is the model's own (sdpa or eager: both trace to the same graph of MatMul and Softmax).

A model over 2 GiB is written by the exporter with its weights in further files beside ``model.onnx`` (ONNX's
external data: protobuf's 2 GiB limit); onnxruntime reads them from the same folder. (Not tried here: no such
model fits this project's test machine.)
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import statistics
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import HeadpruneError
from ..outdir import write_atomic
from ..provenance import versions
from .arch import adapt
from .hooks import structural_copy
from .layers import drop_layers
from .loading import write_staged
from .mask import HeadMask
from .surgery import prune_model

OPSET = 17
ONNX_FILE = "model.onnx"
PACKAGES = ("onnx", "onnxruntime")            # both needed: the metadata is written with onnx, the check runs in ort
INSTALL = "pip install onnx==1.23.2 onnxruntime==1.32.0"
TOLERANCE = 1e-4      # max |onnxruntime - cut model| / max |cut model| over the checked logits
TRACE_BATCH, TRACE_LENGTH = 2, 16             # the traced call: two rows, the second one padded
CHECK_BATCH, CHECK_LENGTH = 3, 11             # a second shape the written graph must match at too
AXES = {0: "batch", 1: "sequence"}
# the TorchScript exporter keeps its settings (opset, export mode) in module globals and the warning filters are
# process-wide: two exports at once (two dashboard sessions) would read each other's, so one traces at a time
_TRACING = threading.Lock()

Progress = Callable[[float, str], None]


class OnnxExportError(HeadpruneError):
    """The ONNX export cannot be made: a package missing, a mask or option it cannot carry, a graph that failed
    its check."""


# -- what the export needs, asked before any model loads ------------------------------------------------------

def runtime_problem() -> str | None:
    """Why this Python cannot write an ONNX export (onnx or onnxruntime not installed), or None."""
    missing = [name for name, version in versions(*PACKAGES).items() if name in PACKAGES and version is None]
    if missing:
        return (f"--format onnx needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not "
                f"installed. Install them with `{INSTALL}` (headprune's dev extra has them), or choose another "
                "format.")
    return None


def check_runtime() -> None:
    problem = runtime_problem()
    if problem:
        raise OnnxExportError(problem)


def option_problem(device_map, dtype: str | None) -> str | None:
    """Why loading options cannot apply to an ONNX export (a device map, half precision), or None."""
    if device_map is not None:
        return (f"--device-map {device_map} with --format onnx: the export traces one forward on the CPU with every "
                "weight in memory, so a model spread over devices or offloaded to disk cannot be exported. Leave "
                "--device-map out (the model loads on the CPU).")
    if dtype not in (None, "fp32"):
        return (f"--dtype {dtype} with --format onnx: the ONNX graph is written in float32 whatever the weights "
                "were loaded as (a half-precision graph is a conversion of its own, e.g. onnxconverter-common's "
                "float16 converter, applied to this file). Accepted: --dtype fp32 or no --dtype.")
    return None


# -- the graph ----------------------------------------------------------------------------------------------------

def _forward_takes(model: nn.Module, name: str) -> bool:
    return name in inspect.signature(model.forward).parameters


def graph_inputs(model: nn.Module) -> tuple[str, ...]:
    """The graph's inputs for ``model`` (module docstring): token types only where the model embeds them."""
    config = model.config
    segments = int(getattr(config, "type_vocab_size", 0) or 0) > 1 and _forward_takes(model, "token_type_ids")
    return ("input_ids", "attention_mask") + (("token_type_ids",) if segments else ())


class _Logits(nn.Module):
    """``model``'s logits for positional inputs named ``names`` (what the tracer feeds), with no cache."""

    def __init__(self, model: nn.Module, names: Sequence[str]):
        super().__init__()
        self.model = model
        self.names = tuple(names)
        # the exporter restores the wrapper's mode recursively after tracing: a new module's default (training)
        # would leave the model with dropout on
        self.training = model.training
        self.options = {"use_cache": False} if _forward_takes(model, "use_cache") else {}

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)), **self.options).logits


def export_copy(model: nn.Module, mask: HeadMask | None, cut: nn.Module | None = None,
                dropped_layers: Sequence[int] = ()) -> nn.Module:
    """The model the graph is traced from: ``model`` cut by ``mask`` (or ``cut``, a cut made already), as a
    private float32 CPU copy in eval mode with no hooks and no temporary wrappers (module docstring)."""
    if cut is None:
        private = prune_model(structural_copy(model), mask)        # a deep copy of the hook-free copy
    else:
        private = copy.deepcopy(structural_copy(cut))              # own tensors: .to() below moves only these
    drop_layers(adapt(private), dropped_layers)
    return private.to(device="cpu", dtype=torch.float32).eval()


def example_batch(model: nn.Module, names: Sequence[str], batch_size: int, length: int, seed: int = 0,
                  padded: bool = True) -> dict:
    """``batch_size`` rows of ``length`` seeded random token ids (ids 5.. avoid the usual special tokens); with
    ``padded`` every row after the first has its last quarter padded (mask 0, the pad id); token types 0 then 1
    (two segments)."""
    config = model.config
    vocab = int(config.vocab_size)
    length = max(2, min(length, int(getattr(config, "max_position_embeddings", None) or length)))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(min(5, vocab - 1), vocab, (batch_size, length), generator=generator)
    attention = torch.ones_like(ids)
    if padded:
        attention[1:, length - max(1, length // 4):] = 0
    pad = getattr(config, "pad_token_id", None)
    if pad is not None:
        ids[attention == 0] = int(pad)
    batch = {"input_ids": ids, "attention_mask": attention}
    if "token_type_ids" in names:
        types = torch.zeros_like(ids)
        types[:, length // 2:] = 1
        batch["token_type_ids"] = types * attention
    return batch


def _logits(model: nn.Module, names: Sequence[str], batch: dict) -> np.ndarray:
    with torch.inference_mode():
        return _Logits(model, names)(*(batch[n] for n in names)).float().cpu().numpy()


def open_session(path: str | Path, threads: int | None = None):
    """An onnxruntime CPU session on ``path``; ``threads``: its intra-op threads (default: onnxruntime's)."""
    import onnxruntime as ort  # optional (dev extra), and 0.2 s to import: only where a graph is run

    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = int(threads)
        options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def feed(session, batch: dict) -> dict:
    """The arrays ``session`` takes from ``batch`` (a tokenizer's or headprune's batch: extra keys ignored), int64."""
    return {i.name: np.asarray(batch[i.name].cpu() if isinstance(batch[i.name], torch.Tensor) else batch[i.name],
                               dtype=np.int64) for i in session.get_inputs()}


def logits_gap(session, model: nn.Module, batches: Sequence[dict]) -> dict:
    """How far ``session``'s logits are from ``model``'s on ``batches``: the largest absolute difference, the
    largest absolute logit (the scale) and their ratio, over every row (a classifier) or every real, unpadded
    position (an LM's per-position logits), and the number of rows compared."""
    names = [i.name for i in session.get_inputs()]
    worst, scale, rows = 0.0, 0.0, 0
    for batch in batches:
        batch = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}   # a GPU's rows
        expected = _logits(model, names, batch)
        got = session.run(["logits"], feed(session, batch))[0]
        if got.shape != expected.shape:
            raise OnnxExportError(f"The ONNX graph returned logits of shape {got.shape} for a batch whose cut-model "
                                  f"logits have shape {expected.shape}.")
        if expected.ndim == 3:   # per position: padded positions are not anyone's prediction
            real = np.asarray(batch["attention_mask"]).astype(bool)
            expected, got = expected[real], got[real]
        worst = max(worst, float(np.abs(got - expected).max()))
        scale = max(scale, float(np.abs(expected).max()))
        rows += len(batch["input_ids"])
    return {"rows": rows, "max_abs_diff": worst, "scale": scale, "relative": worst / scale if scale else worst}


def _metadata(model: nn.Module, names: Sequence[str], outputs: int, mask: HeadMask | None, check: dict,
              extra: dict | None) -> dict[str, str]:
    adapter = adapt(model)
    config = model.config
    task = "lm" if outputs == 3 else "classification"
    info = {"headprune.opset": OPSET, "headprune.inputs": ",".join(names), "headprune.task": task,
            "headprune.logits": "batch x sequence x vocabulary" if task == "lm" else "batch x labels",
            "headprune.kept_heads": {str(b.index): list(b.kept) for b in adapter.blocks},
            "headprune.heads_kept": int(adapter.live_grid().sum()),
            "headprune.heads_original": math.prod(adapter.grid_shape),
            "headprune.check": check, "headprune.versions": versions(*PACKAGES),
            "headprune.model_type": config.model_type}
    if mask is not None:
        info["headprune.mask"] = mask.to_json()
    if task == "classification":
        info["id2label"] = {str(k): v for k, v in (getattr(config, "id2label", None) or {}).items()}
    info.update({f"headprune.{key}": value for key, value in (extra or {}).items()})
    return {key: value if isinstance(value, str) else json.dumps(value) for key, value in info.items()}


def read_metadata(path: str | Path) -> dict[str, str]:
    """The ``metadata_props`` of the ONNX file ``path`` (strings, as written), without loading its weights."""
    import onnx  # optional (dev extra), and 0.5 s to import: only where a graph is written or read

    return {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}


def export_onnx(model: nn.Module, tokenizer, mask: HeadMask | None, out: str | Path, *, cut: nn.Module | None = None,
                dropped_layers: Sequence[int] = (), extra: dict | None = None,
                progress: Progress | None = None) -> dict:
    """Write ``model`` cut by ``mask`` as ``model.onnx`` (+ ``tokenizer``'s files) into the new or empty folder
    ``out`` (module docstring). ``mask`` None or all ones: the dense model. ``cut``: ``prune_model(model, mask)``
    made already (recovery trains it), exported in its place. ``dropped_layers`` (a mask's whole-layer rule) are
    left out of the graph. ``extra``: further metadata (JSON values) under ``headprune.<key>``.

    The folder appears whole or not at all (``loading.write_staged``; the file itself through
    ``outdir.write_atomic``), and only once the written graph's logits matched the cut model's within
    :data:`TOLERANCE` at two shapes. ``model`` is never changed, hooked or moved. Returns {"file", "opset",
    "inputs", "outputs", "dynamic_axes", "check", "export_seconds", "model": the cut model the graph holds}.
    Raises OnnxExportError.
    """
    check_runtime()
    report = progress or (lambda f, m: None)
    if mask is not None:
        if mask.shape != adapt(model).grid_shape:
            raise OnnxExportError(f"Mask shape {mask.shape} does not fit this model's {adapt(model).grid_shape} "
                                  "heads.")
        if not mask.is_binary:
            raise OnnxExportError("An ONNX export needs a binary mask (0 = remove, 1 = keep, a tuned mask's scales "
                                  "on kept heads are baked in); soft gates between 0 and 1 exist only at run time.")
    start = time.perf_counter()
    report(0.0, "cutting a private copy")
    private = export_copy(model, mask if mask is not None else HeadMask.ones(adapt(model).grid_shape), cut,
                          dropped_layers)
    names = graph_inputs(private)
    traced = example_batch(private, names, TRACE_BATCH, TRACE_LENGTH)
    checked = example_batch(private, names, CHECK_BATCH, CHECK_LENGTH, seed=1)
    outputs = _logits(private, names, traced).ndim
    axes = {name: dict(AXES) for name in names} | {"logits": dict(AXES) if outputs == 3 else {0: AXES[0]}}
    result = {}

    def write(folder: Path) -> None:
        import onnx  # optional (dev extra), and 0.5 s to import: only where a graph is written or read

        path = folder / ONNX_FILE
        report(0.1, "tracing the cut model")
        with _TRACING, warnings.catch_warnings():   # the tracer's notes on Python branches: the check settles them
            warnings.simplefilter("ignore")
            try:
                torch.onnx.export(_Logits(private, names), tuple(traced[n] for n in names), str(path),
                                  dynamo=False, opset_version=OPSET, input_names=list(names),
                                  output_names=["logits"], dynamic_axes=axes, do_constant_folding=True)
            except RuntimeError as exc:   # an operator opset 17 lacks (torch's UnsupportedOperatorError), a trace
                raise OnnxExportError(   # that broke: this model's code, not the user's input, so said as such
                    f"torch's ONNX exporter cannot write this {private.config.model_type} model ({exc}). Nothing was "
                    "written. Export it with format 'headprune'.") from exc
        report(0.7, "checking the graph in onnxruntime")
        check = logits_gap(open_session(path), private, [traced, checked])
        if not check["relative"] <= TOLERANCE:
            raise OnnxExportError(
                f"The ONNX graph of this {private.config.model_type} model does not reproduce the cut model: its "
                f"logits differ by {check['relative']:.1e} of their scale (accepted: {TOLERANCE:g}) at batch x "
                f"length {TRACE_BATCH} x {traced['input_ids'].shape[1]} or {CHECK_BATCH} x "
                f"{checked['input_ids'].shape[1]}. Nothing was written. Export it with format 'headprune'.")
        check = {**check, "shapes": [list(traced["input_ids"].shape), list(checked["input_ids"].shape)],
                 "tolerance": TOLERANCE}
        proto = onnx.load(str(path), load_external_data=False)
        onnx.helper.set_model_props(proto, _metadata(private, names, outputs, mask, check, extra))
        write_atomic(path, proto.SerializeToString(), "--out folder")
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        result.update(check=check)

    write_staged(out, write)
    report(1.0, "done")
    return {"file": str(Path(out) / ONNX_FILE), "opset": OPSET, "inputs": list(names), "outputs": ["logits"],
            "dynamic_axes": {k: {str(a): n for a, n in v.items()} for k, v in axes.items()},
            "check": result["check"], "export_seconds": round(time.perf_counter() - start, 2), "model": private}


# -- speed in onnxruntime -----------------------------------------------------------------------------------------

def time_sessions(sessions: Sequence, inputs: dict, repeats: int = 20, warmup: int = 2) -> list[list[float]]:
    """Wall seconds of one ``session.run`` on ``inputs`` per session and round, ``[session][round]``: the sessions
    called in turn (A B A B ...), so round r of every session saw the same machine load; ``warmup`` rounds first,
    untimed (onnxruntime allocates its buffers on the first runs)."""
    feeds = [feed(s, inputs) for s in sessions]
    times: list[list[float]] = [[] for _ in sessions]
    for round_ in range(warmup + repeats):
        for i, (session, arrays) in enumerate(zip(sessions, feeds)):
            begin = time.perf_counter()
            session.run(["logits"], arrays)
            if round_ >= warmup:
                times[i].append(time.perf_counter() - begin)
    return times


def compare_sessions(dense_file: str | Path, pruned_file: str | Path, model: nn.Module, *, batch_size: int = 8,
                     seq_len: int = 128, threads: int = 2, repeats: int = 20, warmup: int = 2) -> dict:
    """The pruned/dense ratio of batch latency in onnxruntime (CPU, ``threads`` intra-op threads), the two graphs
    timed in turn on one seeded batch of ``batch_size`` x ``seq_len`` unpadded tokens of ``model``'s vocabulary.
    "ratio" is the median over rounds of t_pruned / t_dense within the round (paired: a change in the load of a
    shared machine between rounds cancels), "spread" its interquartile range, "dense_s" / "pruned_s" the median
    seconds. Returns {"runtime", "threads", "batch", "length", "repeats", "dense_s", "pruned_s", "ratio",
    "spread"}."""
    sessions = [open_session(dense_file, threads), open_session(pruned_file, threads)]
    names = [i.name for i in sessions[0].get_inputs()]
    batch = example_batch(model, names, batch_size, seq_len, seed=2, padded=False)
    dense, pruned = time_sessions(sessions, batch, repeats, warmup)
    ratios = sorted(p / d for p, d in zip(pruned, dense))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return {"runtime": f"onnxruntime {versions('onnxruntime')['onnxruntime']}", "threads": threads,
            "batch": batch_size, "length": int(batch["input_ids"].shape[1]), "repeats": repeats,
            "dense_s": statistics.median(dense), "pruned_s": statistics.median(pruned),
            "ratio": statistics.median(ratios), "spread": [quartiles[0], quartiles[2]]}
