"""GPU check: headprune on CUDA (bf16/fp16 autocast where the library uses it) against CPU float32, plus timings.

    python benchmarks/gpu_check.py                         # the demo model: CUDA vs CPU float32
    python benchmarks/gpu_check.py --llama-1b              # + timings on a random ~1B-parameter Llama-style model
    python benchmarks/gpu_check.py --device cpu --tiny     # dry run, CPU vs CPU on tiny models (the test suite)

What is compared (reference = the model on CPU in float32; target = a copy on ``--device``):

* every criterion of ``headprune.criteria`` (its default parameters): Spearman rank correlation of the target's
  scores with the reference's over the heads both score, ≥ 0.99 (identical maps pass, also when constant);
* live evaluation (``headprune.live.LiveEvaluator``): accuracy after the first pass and after each of
  ``--toggles`` seeded head toggles, |Δ accuracy| ≤ 0.5 points at every step;
* a trajectory (``headprune.trajectory.run_trajectory``, criterion ``random`` with a fixed seed, so both devices
  remove heads in the same order and only evaluation differs) to half the heads, |Δ accuracy| ≤ 0.5 points at
  every step;
* device auto-selection (``device.resolve_device("auto")``) picks the target's device type;
* surgery on the target device: logits of the model gated by a mask (``evaluate.predict`` with ``mask``, autocast
  as the library runs it) against the logits of the cut copy (``surgery.prune_model``), max |Δ logit| ≤ 1e-2 ×
  max |logit| (bf16 tolerance; float32 on CPU agrees to ~1e-6).

Every step is timed on both devices. ``--llama-1b`` builds a randomly initialised Llama-style classifier with
hidden 2048, 16 layers, 32 query heads sharing 8 key/value heads (GQA), MLP 8192, vocabulary 32,000: 1.03 B
parameters, no download; it times scoring (one criterion), live evaluation and surgery on the target device only
(a 1B model on CPU float32 would take the run hostage) and checks gated == cut there. With ``--tiny`` it builds
the same architecture at toy size. It stops with a clear message when this checkout's ``headprune.arch.adapt``
does not support Llama.

Exit status 0 when every check passes, 1 otherwise; ``--json`` writes the full report.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import platform
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared benchmark helpers (timing.py)

from timing import clock  # noqa: E402

from headprune import criteria  # noqa: E402
from headprune.errors import UnsupportedArchitecture  # noqa: E402
from headprune.evaluation.live import LiveEvaluator  # noqa: E402
from headprune.evaluation.metrics import predict, spearman  # noqa: E402
from headprune.model.arch import adapt  # noqa: E402
from headprune.model.device import resolve_device  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402
from headprune.model.surgery import prune_model  # noqa: E402
from headprune.trajectory import TrajectorySpec, run_trajectory  # noqa: E402

RANK_CORRELATION_MIN = 0.99
ACCURACY_POINTS_MAX = 0.5
LOGIT_TOLERANCE = 1e-2
LLAMA_1B = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=2048)
LLAMA_TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=120, max_position_embeddings=64)


@dataclass
class Side:
    """One side of the comparison: a name for the report, its device, its model and its batches there."""

    name: str
    device: str
    model: torch.nn.Module
    calib: list[dict]
    evals: list[dict]


def side(name: str, device: str, model, calib: list[dict], evals: list[dict]) -> Side:
    def moved(batches):
        return [{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in batches]

    return Side(name, device, model, moved(calib), moved(evals))


class Report:
    """Checks (name, value, limit, passed) and timings (step -> seconds per device), JSON-ready."""

    def __init__(self, header: dict):
        self.data = {**header, "checks": [], "timings": {}}

    def check(self, name: str, value: float, limit: float, passed: bool, note: str = "") -> None:
        self.data["checks"].append({"check": name, "value": value, "limit": limit, "passed": bool(passed),
                                    **({"note": note} if note else {})})
        print(f"  {'ok  ' if passed else 'FAIL'} {name}: {value:.4g} (limit {limit:g}){' ' + note if note else ''}",
              flush=True)

    def time(self, step: str, name: str, fn: Callable, /, *args, **kwargs):
        """Run ``fn`` and record its seconds under ``step`` / ``name`` (CUDA synchronised around it)."""
        start = clock()
        result = fn(*args, **kwargs)
        self.record(step, name, clock() - start)
        return result

    @contextlib.contextmanager
    def crash_is_a_failure(self, name: str):
        """A step that raises is one failed check (its exception named), and the checks after it still run."""
        try:
            yield
        except Exception as exc:  # noqa: BLE001 - the report names every crash and goes on
            where = traceback.extract_tb(exc.__traceback__)[-1]
            self.check(f"{name}: runs", 0.0, 1, False,
                       f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})")

    def skip(self, name: str, why: str) -> None:
        self.data.setdefault("skipped", {})[name] = why
        print(f"  skip {name}: {why}", flush=True)

    def record(self, step: str, name: str, seconds: float) -> None:
        self.data["timings"].setdefault(step, {})[name] = round(seconds, 4)

    @property
    def passed(self) -> bool:
        return all(c["passed"] for c in self.data["checks"])


# -- models and data ----------------------------------------------------------------------------------------

def random_batches(n_batches: int, batch_size: int, seq_len: int, vocab_size: int, num_labels: int,
                   seed: int) -> list[dict]:
    """Seeded token ids and labels, no padding, each batch with its dataset ``index`` (what ``predict`` orders by)."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(5, vocab_size, (batch_size, seq_len), generator=g),
             "attention_mask": torch.ones(batch_size, seq_len, dtype=torch.long),
             "labels": torch.randint(0, num_labels, (batch_size,), generator=g),
             "index": torch.arange(b * batch_size, (b + 1) * batch_size)} for b in range(n_batches)]


def demo_setup(args) -> tuple:
    from headprune.data import align_labels, calibration_texts, load_data, make_batches, split_calib_eval
    from headprune.model.loading import load_model

    loaded = load_model("demo", "cpu")
    ds = align_labels(load_data("demo"), loaded.id2label)
    calib, evals = split_calib_eval(ds, args.calib_size, args.eval_size, args.seed)
    calib_batches = make_batches(loaded.tokenizer, calib, args.batch_size, args.max_length)
    eval_batches = make_batches(loaded.tokenizer, evals, args.batch_size, args.max_length)
    return loaded.model, loaded.tokenizer, calib_batches, eval_batches, calibration_texts(calib, calib_batches)


def tiny_setup(args) -> tuple:
    from headprune.testing import tiny_model

    model = tiny_model("bert", num_labels=2)
    return (model, None, random_batches(2, 8, 12, 120, 2, args.seed),
            random_batches(3, 8, 12, 120, 2, args.seed + 1), None)


def llama_model(shape: dict, device: torch.device, seed: int):
    """A randomly initialised Llama-style sequence classifier (2 labels), built directly on ``device``."""
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    config = LlamaConfig(num_labels=2, pad_token_id=0, **shape)
    torch.manual_seed(seed)
    with device:
        model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
    return model.eval()


# -- the comparisons ------------------------------------------------------------------------------------------

def rank_agreement(reference: np.ndarray, target: np.ndarray) -> float:
    """Spearman correlation over heads both maps score (finite); 1.0 for equal maps (also constant ones)."""
    both = np.isfinite(reference) & np.isfinite(target)
    if not both.any() or np.allclose(reference[both], target[both], rtol=1e-6, atol=1e-9):
        return 1.0
    value = spearman(reference[both], target[both])
    return float(value) if np.isfinite(value) else 0.0


def check_criteria(report: Report, sides: list[Side], tokenizer, texts, names: list[str], seed: int) -> None:
    for name in names:
        crit = criteria.get(name)
        if crit.needs_parser and (tokenizer is None or texts is None):
            report.skip(name, "parses text, and this model has no tokenizer/texts")
            continue
        if crit.needs_parser and importlib.util.find_spec("spacy") is None:
            # a GPU machine may have no spaCy (the syntax extra): its criteria are skipped and said so, not failed
            report.skip(name, "parses text with spaCy, which is not installed here (pip install 'headprune[syntax]')")
            continue
        maps = []
        for sd in sides:
            ctx = criteria.ScoringContext(sd.model, sd.calib, device=torch.device(sd.device), tokenizer=tokenizer,
                                          texts=texts, seed=seed)
            with report.crash_is_a_failure(f"criterion {name} on {sd.name}"):
                maps.append(report.time(f"score {name}", sd.name, crit, ctx).scores)
        if len(maps) < len(sides):
            continue
        agreement = rank_agreement(*maps)
        report.check(f"criterion {name}: rank correlation", agreement, RANK_CORRELATION_MIN,
                     agreement >= RANK_CORRELATION_MIN)


def toggle_masks(grid_shape: tuple[int, int], toggles: int, seed: int) -> list[HeadMask]:
    """Seeded sequence of masks, each one head different from the last (pruned, or restored if already pruned)."""
    rng = np.random.default_rng(seed)
    mask, masks = HeadMask.ones(grid_shape), []
    for _ in range(toggles):
        layer, head = int(rng.integers(grid_shape[0])), int(rng.integers(grid_shape[1]))
        mask = mask.restore(layer, head) if mask.values[layer, head] == 0 else mask.prune(layer, head)
        masks.append(mask)
    return masks


def timed_toggles(report: Report, step: str, name: str, live: LiveEvaluator, masks: list[HeadMask]) -> list:
    """Metrics after each mask in turn; the mean seconds per toggle go to the report."""
    start = clock()
    metrics = [live.set_mask(m) for m in masks]
    report.record(step, name, (clock() - start) / max(1, len(masks)))
    return metrics


def check_live(report: Report, sides: list[Side], toggles: int, seed: int) -> None:
    curves = []
    for sd in sides:
        live = report.time("live evaluation: first pass", sd.name, LiveEvaluator, sd.model, sd.evals)
        first = live.metrics().accuracy
        masks = toggle_masks(live.adapter.grid_shape, toggles, seed)
        after = timed_toggles(report, "live evaluation: per toggle", sd.name, live, masks)
        curves.append(np.array([first] + [m.accuracy for m in after]))
    gap = 100 * float(np.max(np.abs(np.subtract(*curves))))
    report.check(f"live evaluation: max |Δ accuracy| over {toggles} toggles (points)", gap, ACCURACY_POINTS_MAX,
                 gap <= ACCURACY_POINTS_MAX)


def check_trajectory(report: Report, sides: list[Side], seed: int) -> None:
    curves = []
    for sd in sides:
        n_heads = adapt(sd.model).n_heads
        spec = TrajectorySpec(criterion=criteria.get("random"), step=max(1, n_heads // 2), budget=0.5, seed=seed)
        run = report.time("trajectory (random order, to 50%)", sd.name, run_trajectory, spec, sd.model, sd.calib,
                          sd.evals, device=torch.device(sd.device))
        curves.append(run.values("accuracy"))
    reference, target = curves
    same_length = len(reference) == len(target)
    gap = 100 * float(np.max(np.abs(reference - target))) if same_length else float("inf")
    report.check("trajectory: max |Δ accuracy| over its steps (points)", gap, ACCURACY_POINTS_MAX,
                 gap <= ACCURACY_POINTS_MAX, "" if same_length else "different numbers of steps")


def half_the_heads(grid_shape: tuple[int, int], seed: int) -> HeadMask:
    """Every block loses a seeded half of its heads (the shape surgery meets most often)."""
    rng = np.random.default_rng(seed)
    n_blocks, n_heads = grid_shape
    return HeadMask.from_pruned({b: sorted(int(h) for h in rng.permutation(n_heads)[: n_heads // 2])
                                 for b in range(n_blocks)}, grid_shape)


def check_surgery(report: Report, model, batches: list[dict], device: str, seed: int, label: str = "") -> None:
    """Gated == cut on ``device``: max |Δ logit| ≤ 1e-2 × max |logit| (bf16 tolerance)."""
    mask = half_the_heads(adapt(model).grid_shape, seed)
    gated = report.time(f"{label}predict gated", device, predict, model, batches, mask)
    cut = report.time(f"{label}surgery (prune_model)", device, prune_model, model, mask)
    cut_logits = report.time(f"{label}predict cut", device, predict, cut, batches)
    error = float((gated - cut_logits).abs().max())
    scale = float(gated.abs().max())
    report.check(f"{label}surgery on {device}: max |Δ logit| / max |logit|", error / max(scale, 1e-12),
                 LOGIT_TOLERANCE, error <= LOGIT_TOLERANCE * scale)


# -- the 1B decoder ----------------------------------------------------------------------------------------

def llama_timings(report: Report, device: str, tiny: bool, seed: int) -> None:
    shape = LLAMA_TINY if tiny else LLAMA_1B
    print(f"Llama-style model {'(tiny stand-in) ' if tiny else ''}{shape}")
    model = report.time("llama: build (random init)", device, llama_model, shape, torch.device(device), seed)
    try:
        adapter = adapt(model)
    except UnsupportedArchitecture as exc:
        raise SystemExit(f"--llama-1b: this checkout cannot prune Llama models yet ({exc})") from None
    n_params = sum(p.numel() for p in model.parameters())
    report.data["llama"] = {"parameters": n_params, "grid": list(adapter.grid_shape),
                            "kv_heads": adapter.blocks[0].n_kv_heads if hasattr(adapter.blocks[0], "n_kv_heads")
                            else None, **shape}
    print(f"  {n_params / 1e9:.3f} B parameters, grid {adapter.grid_shape}")
    batch_size, seq_len = (4, 12) if tiny else (8, 128)
    batches = random_batches(2, batch_size, seq_len, shape["vocab_size"], 2, seed)
    on_device = [{k: v.to(device) for k, v in b.items()} for b in batches]
    ctx = criteria.ScoringContext(model, on_device, device=torch.device(device), seed=seed)
    report.time("llama: score gnorm", device, criteria.get("gnorm"), ctx)
    live = report.time("llama: live evaluation first pass", device, LiveEvaluator, model, on_device)
    timed_toggles(report, "llama: live evaluation per toggle", device, live, toggle_masks(adapter.grid_shape, 4, seed))
    check_surgery(report, model, on_device, device, seed, label="llama: ")


# -- main ------------------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="target device (default cuda; cpu = dry run vs itself)")
    p.add_argument("--tiny", action="store_true", help="tiny random models instead of the demo / the 1B model")
    p.add_argument("--llama-1b", action="store_true", help="also time a random ~1B Llama-style model")
    p.add_argument("--criteria", nargs="+", default=None, help="criteria to compare (default: every one)")
    p.add_argument("--calib-size", type=int, default=64)
    p.add_argument("--eval-size", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--toggles", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the report here")
    return p.parse_args(argv)


def run(args: argparse.Namespace) -> Report:
    target = str(torch.device(args.device))
    if target.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("No CUDA GPU here: run with --device cpu --tiny for the dry run.")
    report = Report({"target": target, "reference": "cpu float32", "torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if target.startswith("cuda") else None,
                     "bf16": bool(target.startswith("cuda") and torch.cuda.is_bf16_supported()),
                     "cpu_threads": torch.get_num_threads(), "python": platform.python_version(),
                     "model": "tiny bert" if args.tiny else "demo"})
    auto = resolve_device("auto").type
    report.check(f"device auto-selection picks {torch.device(target).type} (got {auto})", float(auto ==
                 torch.device(target).type), 1, auto == torch.device(target).type)
    model, tokenizer, calib, evals, texts = (tiny_setup if args.tiny else demo_setup)(args)
    # dry run: the same device twice, under two names so that every timing keeps both rows
    target_name = "cpu (target)" if target == "cpu" else target
    sides = [side("cpu", "cpu", model, calib, evals),
             side(target_name, target, copy.deepcopy(model).to(target), calib, evals)]
    print(f"headprune GPU check: {target} vs CPU float32 ({report.data['model']} model)")
    check_criteria(report, sides, tokenizer, texts, args.criteria or criteria.available(), args.seed)
    with report.crash_is_a_failure("live evaluation"):
        check_live(report, sides, args.toggles, args.seed)
    with report.crash_is_a_failure("trajectory"):
        check_trajectory(report, sides, args.seed)
    with report.crash_is_a_failure("surgery"):
        check_surgery(report, sides[1].model, sides[1].evals, target, args.seed)
    if args.llama_1b:
        with report.crash_is_a_failure("llama"):
            llama_timings(report, target, args.tiny, args.seed)
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    print(json.dumps(report.data["timings"], indent=1))
    print("all checks passed" if report.passed else "SOME CHECKS FAILED")
    if args.json:
        Path(args.json).write_text(json.dumps(report.data, indent=1), encoding="utf-8")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
