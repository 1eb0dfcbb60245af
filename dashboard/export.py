"""What the Export page hands out: the session's run file and the surgically pruned model (zipped)."""

from __future__ import annotations

import io
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from headprune.evaluate import evaluate
from headprune.mask import HeadMask

from .compute import compute_slot
from .session import SessionData
from .store import DashboardWorkspace

Progress = Callable[[float, str], None]


def run_file(ws: DashboardWorkspace, sd: SessionData) -> dict:
    """Everything this session produced, as JSON (reopened by ``headprune.trajectory.read_run_file``)."""
    live = sd.live
    current = live.metrics().to_dict() if live is not None and live.mask == sd.mask and live.has_labels else None
    return {"headprune_run": 1, "setup": asdict(ws.setup), "arch": ws.adapter.arch, "grid": list(ws.shape),
            "dense": ws.dense().to_dict(), "cut_heads": ws.cut_mask.to_json()["pruned"], "mask": sd.mask.to_json(),
            "metrics_under_mask": current, "scores": {name: s.to_json() for name, s in sd.scores.items()},
            "trajectories": [t.to_json() for t in sd.trajectories], "spreads": sd.spreads}


def build_pruned_model(ws: DashboardWorkspace, mask: HeadMask, progress: Progress | None = None) -> dict:
    """Cut ``mask``'s heads from a copy of the model, save it HF-style, zip it, and evaluate the cut model.

    Returns {"zip": bytes, "size": surgery.size_report, "metric": headline metric of the cut model}.
    """
    from headprune.models import save_pruned
    from headprune.surgery import prune_model, size_report

    report = progress or (lambda f, m: None)
    report(0.05, "cutting heads")
    with compute_slot():
        pruned = prune_model(ws.loaded.model, mask)  # a deep copy: the shared model is untouched
        report(0.3, "evaluating the cut model")
        metrics = evaluate(pruned, ws.eval_batches, progress=lambda f, m: report(0.3 + 0.5 * f, m))
    report(0.85, "saving")
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pruned(pruned, ws.loaded.tokenizer, Path(tmp) / "pruned",
                             extra={"mask": mask.to_json(), "source_model": ws.setup.model,
                                    "dense": ws.dense().to_dict(), "pruned": metrics.to_dict(),
                                    "data": ws.setup.data_label})
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    zf.write(f, Path("headprune-pruned-model") / f.relative_to(folder))
    report(1.0, "done")
    return {"zip": buffer.getvalue(), "size": size_report(ws.loaded.model, pruned), "metric": ws.metric_of(metrics)}
