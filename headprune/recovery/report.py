"""After a recovery run: the metric set dense / pruned / recovered, the export, and the run file's record.

``recover_cell`` is the whole thing in one call for a protocol runner (``headprune run``): a model, a mask, data
and a spec in, the three metric sets and the record out.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from ..data import TextDataset
from ..evaluation.metrics import evaluate
from ..model.export import export_model
from ..model.loading import save_pruned
from ..model.mask import HeadMask
from ..model.task import Task
from ..provenance import versions
from .spec import RecoverySpec
from .train import Progress, RecoveryResult, RecoveryRun


def stage_metrics(dense: nn.Module, mask: HeadMask | None, result: RecoveryResult, batches: list[dict], *,
                  task: Task, dense_is_original: bool = True, memory_budget=None,
                  progress: Progress | None = None) -> dict[str, dict | None]:
    """{"dense", "pruned", "recovered"}: the metric set of each on ``batches`` (evaluation data).

    dense: the model as loaded (None when it had heads cut already: ``dense_is_original`` False); pruned: it under
    ``mask`` (gated: exactly the cut model's outputs); recovered: the trained model (its pruned heads are absent,
    or zero and gated).
    """
    def run(model, gates, share):
        return evaluate(model, batches, gates, task=task, memory_budget=memory_budget,
                        progress=None if progress is None else lambda f, m: progress(share + f / 3, m)).to_dict()

    dense_metrics = run(dense, None, 0.0) if dense_is_original else None
    pruned = run(dense, mask, 1 / 3) if mask is not None or not dense_is_original else dense_metrics
    recovered = run(result.model, mask if result.mode == "gated" else None, 2 / 3)
    return {"dense": dense_metrics, "pruned": pruned, "recovered": recovered}


def export_recovered(result: RecoveryResult, dense: nn.Module, tokenizer, out: str | Path, format: str,
                     extra: dict | None = None) -> dict:
    """Write the recovered model to the folder ``out`` in ``format`` (``model.export.FORMATS``), atomically.

    A cut run is written as it was trained (headprune: its own layout; uniform: its config made stock); a gated
    run starts from the original architecture with the pruned heads zero (masked: written as is; headprune and
    uniform: cut now). Returns ``export_model``'s dict (without the model).
    """
    if result.mask is None:   # a folder pruned before (or no mask): the model as trained, in headprune format
        save_pruned(result.model, tokenizer, out, extra=extra)
        return {"format": "headprune", "out": str(out), "saves_compute": True}
    if result.mode == "cut":
        written = export_model(dense, tokenizer, result.mask, out, format, extra=extra, cut=result.model)
    else:
        written = export_model(result.model, tokenizer, result.mask, out, format, extra=extra)
    return {k: v for k, v in written.items() if k != "model"}


def run_record(spec: RecoverySpec, result: RecoveryResult, metrics: dict, roles: dict, *, model: str,
               teacher: str | None = None, format: str | None = None, out: str | None = None) -> dict:
    """The run file: model, method and hyper-parameters, mask, data roles (source, size, seed, hash), the plan,
    losses, the metric sets before and after, time and versions."""
    return {"model": model, "method": spec.method, "spec": spec.to_json(), "seed": spec.seed,
            "teacher": teacher if spec.distill else None, "mode": result.mode,
            "mask": result.mask.to_json() if result.mask is not None else None,
            "pruned_heads": result.mask.n_pruned if result.mask is not None else None,
            "data": roles, "plan": result.plan, "steps": result.steps, "train_seconds": round(result.seconds, 2),
            "resumed_from": result.resumed_from, "losses": result.losses, "metrics": metrics,
            "format": format, "out": out, "versions": versions("peft", "accelerate")}


def recover_cell(spec: RecoverySpec, model: nn.Module, tokenizer, mask: HeadMask | None, train: TextDataset,
                 eval_batches: list[dict], *, work_dir: str | Path, task: Task, roles: dict | None = None,
                 model_name: str = "", progress: Progress | None = None, resume: bool = False,
                 memory_budget=None) -> tuple[RecoveryResult, dict]:
    """One protocol cell: recover ``model`` pruned by ``mask`` on ``train``, evaluate dense / pruned / recovered
    on ``eval_batches``. Returns (result, run record); nothing is written besides the work folder's checkpoints."""
    run = RecoveryRun(spec, model, tokenizer, mask, train, work_dir=work_dir, task=task, memory_budget=memory_budget)
    result = run.run(resume=resume, progress=progress)
    metrics = stage_metrics(model, mask, result, eval_batches, task=task, memory_budget=memory_budget)
    return result, run_record(spec, result, metrics, roles or {}, model=model_name)


def headline_gain(metrics: dict, name: str) -> float | None:
    """Share of the lost ``name`` that recovery regained: (recovered − pruned) / (dense − pruned), or None."""
    dense, pruned, recovered = (metrics.get(k) or {} for k in ("dense", "pruned", "recovered"))
    if name not in dense or name not in pruned or name not in recovered or dense[name] == pruned[name]:
        return None
    return (recovered[name] - pruned[name]) / (dense[name] - pruned[name])


__all__ = ["export_recovered", "headline_gain", "recover_cell", "run_record", "stage_metrics"]
