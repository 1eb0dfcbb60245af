"""What the Export page hands out: the session's run file, figures as PNG, and the pruned model (zipped) in one of
``headprune.model.export.FORMATS``: a headprune checkpoint, a masked stock checkpoint, a uniform stock cut or an ONNX
graph (with its onnxruntime check on the evaluation rows and, on request, its speed in onnxruntime: ``time_onnx``);
and lm-evaluation-harness's numbers for the current mask beside the dense ones (``run_harness``).

Built downloads are kept in the session (``SessionData.exports``), keyed by what they depend on, so a page rerun
hands out the same bytes without building them again.
"""

from __future__ import annotations

import io
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from headprune import viz
from headprune.estimate import TimeEstimate, estimate_harness
from headprune.evaluation.harness import HarnessError, HarnessSpec, Tasks, lm_eval_version, resolve_tasks, run_lm_eval
from headprune.evaluation.metrics import evaluate
from headprune.evaluation.speed import onnx_speed
from headprune.model.export import FORMATS, UNIFORM_TYPES, export_model, family_problem, round_to_uniform
from headprune.model.onnx_export import logits_gap, open_session, runtime_problem
from headprune.model.sizes import size_report

from .config import memory_budget
from .session import SessionData
from .store import DashboardWorkspace, mask_key, store
from .threads import compute_slot

Progress = Callable[[float, str], None]


def run_file(ws: DashboardWorkspace, sd: SessionData) -> dict:
    """Everything this session produced, as JSON (reopened by ``headprune.trajectory.read_run_file``)."""
    live = sd.live
    current = live.metrics().to_dict() if live is not None and live.mask == sd.mask and live.has_labels else None
    return {"headprune_run": 1, "setup": asdict(ws.setup), "arch": ws.adapter.arch, "grid": list(ws.shape),
            "dense": ws.dense().to_dict(), "cut_heads": ws.cut_mask.to_json()["pruned"], "mask": sd.mask.to_json(),
            "metrics_under_mask": current, "scores": {name: s.to_json() for name, s in sd.scores.items()},
            "trajectories": [t.to_json() for t in sd.trajectories], "spreads": sd.spreads}


def _png_key(sd: SessionData, figure: str) -> str:
    return f"png|{figure}|{mask_key(sd.mask)}|{len(sd.scores)}|{len(sd.trajectories)}"


def rendered_png(sd: SessionData, figure: str) -> bytes | None:
    """The PNG of ``figure`` if this session rendered it for the current mask, scores and trajectories."""
    return sd.exports.get(_png_key(sd, figure))


def render_png(sd: SessionData, figure: str, fig) -> bytes:
    """Render ``fig`` (called ``figure``) to PNG with kaleido and keep it (RuntimeError when kaleido cannot)."""
    png = sd.exports[_png_key(sd, figure)] = viz.figure_png(fig)
    return png


def export_formats(ws: DashboardWorkspace) -> dict[str, dict]:
    """Per format: {"label", "what", "loads_in", "saves_compute", "problem"} -- ``problem`` (None when the format
    fits this model) says why the loaded model cannot be exported that way (a cut model, a tied-head-size family)."""
    cut = (f"The loaded model already has {ws.n_cut} heads cut out, so it is not the original architecture any "
           "more; load the original model to export a stock checkpoint.") if ws.n_cut else None
    problems = {"headprune": None, "masked": cut, "uniform": cut or family_problem(ws.loaded.model),
                "onnx": runtime_problem()}
    labels = {"headprune": "headprune checkpoint (smaller, any mask)",
              "masked": "masked stock checkpoint (original size, loads anywhere)",
              "uniform": "uniform stock cut (smaller, loads anywhere)",
              "onnx": "ONNX graph (smaller, any mask, onnxruntime)"}
    return {name: {"label": labels[name], **info, "problem": problems[name]} for name, info in FORMATS.items()}


def runtime_rows() -> list[dict]:
    """Which runtime loads which export (docs/how-to/exports.md's table)."""
    return [{"format": name, "what it is": info["what"], "saves compute": "yes" if info["saves_compute"] else "no",
             "loads in": info["loads_in"]} for name, info in FORMATS.items()] + [
        {"format": "(non-uniform mask)", "what it is": "different head counts per layer",
         "saves compute": "yes", "loads in": "as a checkpoint, headprune only (transformers 5.23's per_layer_config "
                                            f"is read by none of {', '.join(UNIFORM_TYPES.values())}); as an "
                                            "onnx graph, onnxruntime"}]


def uniform_preview(ws: DashboardWorkspace, sd: SessionData) -> dict:
    """The nearest uniform mask to the session mask (``export.round_to_uniform``, head scores of the first
    criterion computed, if any, break ties) as {"rounding": UniformRounding, "text": what changed}."""
    scores = next(iter(sd.scores.values())).scores if sd.scores else None
    rounding = round_to_uniform(ws.loaded.model, sd.mask, scores)
    return {"rounding": rounding, "text": rounding.describe()}


def compared_metrics(sd: SessionData) -> dict | None:
    """``compare_uniform``'s result for the current mask, if this session computed it."""
    return sd.exports.get(f"uniform-metrics|{mask_key(sd.mask)}")


def compare_uniform(ws: DashboardWorkspace, sd: SessionData, progress: Progress | None = None) -> dict:
    """Headline metric on the evaluation split under the session mask and under its nearest uniform mask
    ({"mask": m, "uniform": m_u}); kept for ``compared_metrics``."""
    report = progress or (lambda f, m: None)
    rounding = uniform_preview(ws, sd)["rounding"]
    with compute_slot():
        mine = evaluate(ws.loaded.model, ws.eval_batches, sd.mask, progress=lambda f, m: report(0.5 * f, m))
        uniform = evaluate(ws.loaded.model, ws.eval_batches, rounding.mask,
                           progress=lambda f, m: report(0.5 + 0.5 * f, m))
    report(1.0, "done")
    result = sd.exports[f"uniform-metrics|{mask_key(sd.mask)}"] = {"mask": ws.metric_of(mine),
                                                                   "uniform": ws.metric_of(uniform)}
    return result


def built_model(sd: SessionData, format: str = "headprune") -> dict | None:
    """The pruned model this session built for its current mask in ``format``, if any (``build_pruned_model``)."""
    return sd.exports.get(f"model|{format}|{mask_key(sd.mask)}")


def build_pruned_model(ws: DashboardWorkspace, sd: SessionData, progress: Progress | None = None,
                       format: str = "headprune") -> dict:
    """Export the session mask's model in ``format`` (a copy; the shared model is untouched), zip it and evaluate
    the exported model; kept for ``built_model``. A uniform export first rounds the mask (``uniform_preview``).

    Returns {"zip": bytes, "size": sizes.size_report, "metric": headline metric of the exported model,
    "note": what the format is and saves, "loads_in": which runtimes load it, "rounding": text or None, "onnx": for
    an ONNX graph, onnxruntime's logits against the cut model's on up to :data:`ONNX_CHECK_BATCHES` evaluation
    batches (``onnx_export.logits_gap``), else None}.
    """
    built = sd.exports[f"model|{format}|{mask_key(sd.mask)}"] = _exported_zip(ws, sd, format, progress)
    return built


def _exported_zip(ws: DashboardWorkspace, sd: SessionData, format: str, progress: Progress | None = None) -> dict:
    report = progress or (lambda f, m: None)
    mask, rounding = sd.mask, None
    if format == "uniform":
        preview = uniform_preview(ws, sd)
        mask, rounding = preview["rounding"].mask, preview["text"]
    report(0.05, "writing the model")
    with tempfile.TemporaryDirectory() as tmp, compute_slot():
        written = export_model(ws.loaded.model, ws.loaded.tokenizer, mask, Path(tmp) / "pruned", format,
                               extra={"mask": mask.to_json(), "source_model": ws.setup.model,
                                      "dense": ws.dense().to_dict(), "data": ws.setup.data_label})
        report(0.3, "evaluating the exported model")
        metrics = evaluate(written["model"], ws.eval_batches, progress=lambda f, m: report(0.3 + 0.5 * f, m))
        checked = None
        if format == "onnx":   # the file itself, run in onnxruntime on the rows the metric was computed on
            report(0.8, "running the graph in onnxruntime")
            checked = logits_gap(open_session(written["onnx"]["file"]), written["model"],
                                 ws.eval_batches[:ONNX_CHECK_BATCHES])
        report(0.85, "zipping")
        folder = Path(written["out"])
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    zf.write(f, Path(f"headprune-{format}-model") / f.relative_to(folder))
    report(1.0, "done")
    return {"zip": buffer.getvalue(), "size": size_report(ws.loaded.model, written["model"]),
            "metric": ws.metric_of(metrics), "note": written["note"], "loads_in": written["loads_in"],
            "rounding": rounding, "onnx": checked}


ONNX_CHECK_BATCHES = 4   # evaluation batches the built graph is run on in onnxruntime (seconds, not minutes)
# what benchmarks/bench_runtimes.py measured (docs/how-to/exports.md has the table, the command and the conditions)
ONNX_MEASURED = ("Measured with half the heads cut (benchmarks/bench_runtimes.py, 2026-11-28, onnxruntime 1.32 on 2 "
                 "CPU threads): the pruned graph took 0.77 of the dense graph's time on the demo and 0.78 on a "
                 "BERT-base-shaped classifier (ideal from FLOPs: 0.82 for both).")


def onnx_timing(sd: SessionData) -> dict | None:
    """``time_onnx``'s result for the current mask, if this session measured it."""
    return sd.exports.get(f"onnx-speed|{mask_key(sd.mask)}")


def time_onnx(ws: DashboardWorkspace, sd: SessionData, progress: Progress | None = None) -> dict:
    """The session mask's cut and the dense model exported to ONNX and timed in onnxruntime (``speed.onnx_speed``:
    batch 8 x 128 tokens, 2 threads, the pruned/dense latency ratio beside the ideal one from FLOPs); kept for
    ``onnx_timing``."""
    with compute_slot():
        timed = sd.exports[f"onnx-speed|{mask_key(sd.mask)}"] = onnx_speed(ws.loaded.model, sd.mask,
                                                                           progress=progress)
    return timed


# -- lm-evaluation-harness on the current mask --------------------------------------------------------------------

HARNESS_TASKS = "demo_lm_cloze"   # offline, shipped with headprune; hellaswag,arc_easy,arc_challenge need the network


def harness_problem(ws: DashboardWorkspace) -> str | None:
    """Why lm-eval cannot run on this workspace (lm-eval missing, not a language model), or None."""
    try:
        lm_eval_version()
    except HarnessError as exc:
        return str(exc)
    if not ws.adapter.causal or ws.loaded.model.get_output_embeddings() is None:
        return ("lm-evaluation-harness scores the answers of a language model (a causal LM head); the loaded model "
                "is a classifier.")
    return None


def harness_tasks(ws: DashboardWorkspace, names: str, limit: int | None) -> Tasks:
    """The tasks ``names`` ("demo_lm_cloze", "arc_easy,hellaswag") checked against lm-eval's index (HarnessError
    names an unknown one), kept for every session: lm-eval's own index takes seconds to build."""
    spec = HarnessSpec.from_text(names, limit=limit, batch_size=ws.setup.batch_size, seed=ws.setup.seed)
    return store().memo(f"lmeval-tasks|{spec}", lambda: resolve_tasks(spec))


def _harness_key(ws: DashboardWorkspace, tasks: Tasks, mask) -> str:
    return f"lmeval|{ws.key}|{tasks.spec}|{mask_key(mask)}"


def harness_runs(ws: DashboardWorkspace, sd: SessionData, tasks: Tasks) -> dict:
    """{"dense": run_lm_eval result or None, "mask": ... or None}: what some session computed already."""
    return {"dense": store().get(_harness_key(ws, tasks, None)), "mask": store().get(_harness_key(ws, tasks, sd.mask))}


def harness_estimate(ws: DashboardWorkspace, sd: SessionData, tasks: Tasks) -> TimeEstimate:
    """Expected duration of the runs ``run_harness`` still has to do (dense and/or under the mask)."""
    one = store().memo(f"lmeval-estimate|{ws.key}|{tasks.spec}", lambda: estimate_harness(
        ws.loaded.model, ws.loaded.tokenizer, tasks, ws.eval_batches or ws.calib_batches,
        memory_budget=memory_budget()))
    done = harness_runs(ws, sd, tasks)
    runs = sum(done[name] is None for name in (("dense", "mask") if sd.mask.n_pruned else ("dense",)))
    return TimeEstimate(one.seconds * runs, one.what + (" dense and under the mask" if runs == 2 else ""),
                        one.device, one.basis)


def run_harness(ws: DashboardWorkspace, sd: SessionData, tasks: Tasks, progress: Progress | None = None) -> dict:
    """lm-eval on the loaded model as it is (dense) and under the session mask, each stored once computed (a
    Cancel stops between two batches and stores nothing of the run it stopped). Returns ``harness_runs``."""
    report = progress or (lambda f, m: None)
    masks = (None, sd.mask) if sd.mask.n_pruned else (None,)
    todo = [mask for mask in masks if store().get(_harness_key(ws, tasks, mask)) is None]
    with compute_slot():
        for i, mask in enumerate(todo):
            what = "under the mask" if mask is not None else "dense"
            result = run_lm_eval(ws.loaded.model, ws.loaded.tokenizer, tasks, mask,
                                 progress=lambda f, m, i=i, what=what: report((i + f) / len(todo), f"{what}: {m}"))
            store().put(_harness_key(ws, tasks, mask), result)
    report(1.0, "done")
    return harness_runs(ws, sd, tasks)


def harness_rows(runs: dict) -> list[dict]:
    """One row per task and metric: dense, under the mask, change (None where a run is missing)."""
    dense, masked = runs.get("dense"), runs.get("mask")
    first = dense or masked
    if first is None:
        return []
    rows = []
    for task, values in first["results"].items():
        for key in values:
            metric, _, filtered = key.partition(",")
            if not filtered or "_stderr" in metric:
                continue
            pair = [None if r is None else _number(r["results"][task].get(key)) for r in (dense, masked)]
            stderr = None if masked is None else _number(masked["results"][task].get(f"{metric}_stderr,{filtered}"))
            rows.append({"task": task, "metric": metric, "dense": pair[0], "under the mask": pair[1],
                         "change": None if None in pair else pair[1] - pair[0], "± (under the mask)": stderr})
    return rows


def _number(value) -> float | None:
    """A value of lm-eval's results as a float ("N/A", a standard error it did not compute, as None)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
