"""The dashboard's computations: scores, trajectories, arcs, syntactic profiles and live evaluation.

Thread policy (the one place it is decided)
-------------------------------------------
Browser sessions compute in parallel, each on its own structural copy of the shared model
(``Workspace.private_model``), so no lock is held around a computation. Every computation runs inside
:func:`compute_slot`. torch's intra-op thread pool is process-wide (``torch.set_num_threads`` in one thread
changes it for all), so the slot resizes that one pool whenever a computation starts or ends:

    torch threads = max(1, cores // active computations)

where ``cores`` is the CPUs this process may use (``os.sched_getaffinity``; HEADPRUNE_CPU_THREADS overrides).
Two sessions computing at once on 16 cores get 8 threads each instead of 16 each fighting over 16 cores; one
session alone gets them all. Results do not depend on the thread count beyond float rounding of reductions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import contextmanager

import torch

from headprune.criteria import ScoreMap
from headprune.mask import HeadMask

from .store import DashboardWorkspace, mask_key, params_key, store

Progress = Callable[[float, str], None]


def available_cores() -> int:
    """CPUs this process may use (HEADPRUNE_CPU_THREADS overrides)."""
    try:
        return max(1, int(os.environ["HEADPRUNE_CPU_THREADS"]))
    except (KeyError, ValueError):
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


class _Slots:
    def __init__(self):
        self.active = 0
        self.lock = threading.Lock()

    def resize(self, delta: int) -> None:
        with self.lock:
            self.active += delta
            torch.set_num_threads(max(1, available_cores() // max(self.active, 1)))


_SLOTS = _Slots()


@contextmanager
def compute_slot():
    """Run one computation under the thread policy of this module's docstring."""
    _SLOTS.resize(+1)
    try:
        yield
    finally:
        _SLOTS.resize(-1)


def active_computations() -> int:
    return _SLOTS.active


# -- scores, arcs, profiles -------------------------------------------------------------------------------------

def compute_scores(ws: DashboardWorkspace, names: list[str], params: dict[str, dict], mask: HeadMask | None,
                   progress: Progress | None = None) -> dict[str, ScoreMap]:
    """Score maps of ``names`` under ``mask``: from the store when known, the rest in one shared pass."""
    from headprune.criteria.onepass import score_many

    def key(name):
        return f"score|{ws.key}|{name}|{params_key(params.get(name))}|{mask_key(mask)}"

    out = {name: store().get(key(name)) for name in names}
    missing = [n for n in names if out[n] is None]
    if missing:
        with compute_slot():
            fresh = score_many(missing, ws.scoring_context(mask, progress), {n: params.get(n) or {} for n in missing})
        for name, score in fresh.items():
            store().put(key(name), score)
            out[name] = score
    return out


def arcs_for(ws: DashboardWorkspace, text, mask: HeadMask):
    """Dependency arcs of ``text`` with every head's attention under ``mask`` (stored per text and mask)."""
    from headprune.syntax import build_arcs

    def compute():
        with compute_slot():
            return build_arcs(ws.private_model(), ws.loaded.tokenizer, text, mask=mask,
                              max_length=ws.setup.max_length)

    return store().memo(f"arcs|{ws.key}|{text}|{mask_key(mask)}", compute)


def profile_for(ws: DashboardWorkspace, mask: HeadMask, progress: Progress | None = None):
    """Syntactic profile of every head over the calibration texts under ``mask`` (stored per mask)."""
    from headprune.syntax import syntactic_profile

    def compute():
        texts = list(zip(ws.calib.texts, ws.calib.pairs)) if ws.calib.pairs is not None else ws.calib.texts
        with compute_slot():
            return syntactic_profile(ws.private_model(), ws.loaded.tokenizer, texts, mask=mask,
                                     max_length=ws.setup.max_length, progress=progress)

    return store().memo(f"profile|{ws.key}|{mask_key(mask)}", compute)


# -- live evaluation ----------------------------------------------------------------------------------------------

def live_evaluator(ws: DashboardWorkspace, batches: list[dict], mask: HeadMask, progress: Progress | None = None,
                   name: str = "evaluation"):
    """A session's LiveEvaluator on ``batches`` (called ``name``), at ``mask``.

    It is a fork of one evaluator per workspace and ``name`` at the model as loaded (built once, kept in the
    store): a session costs no pass over the data to start, and memory only for the layers from its lowest
    changed layer up. Each fork gates its own hook-free structural copy of the model.
    """
    from headprune.live import LiveEvaluator

    def source() -> LiveEvaluator:
        with compute_slot():
            return LiveEvaluator(ws.loaded.model, batches, mask=ws.cut_mask, progress=progress)

    live = store().memo(f"live|{ws.key}|{name}", source).fork()
    if live.mask != mask:
        move_live(live, mask, progress)
    return live


def move_live(live, mask: HeadMask, progress: Progress | None = None, on_estimate=None):
    """``live.set_mask(mask)`` inside a compute slot; metrics under ``mask``.

    ``on_estimate(Estimate)`` gets the running headline metric after every batch (``LiveEvaluator.set_mask``);
    a page draws it there, and a click that interrupts the drawing leaves the run for the next call to finish.
    """
    with compute_slot():
        return live.set_mask(mask, progress, on_estimate)


def _speed_key(ws: DashboardWorkspace, mask: HeadMask) -> str:
    return f"speed|{ws.key}|{mask_key(mask)}"


def measured_speed(ws: DashboardWorkspace, mask: HeadMask) -> dict | None:
    """The speed report of ``mask`` if it was measured already (any page, any session)."""
    return store().get(_speed_key(ws, mask))


def measure_speed(ws: DashboardWorkspace, mask: HeadMask, progress: Progress | None = None) -> dict:
    """Measured and ideal speed-up of cutting ``mask`` out of the loaded model (``speed.compare_speed``; stored
    per mask). Three timed repeats per setting keep it to seconds; the page shows the conditions with the result."""
    from headprune.speed import compare_speed
    from headprune.surgery import prune_model

    def compute() -> dict:
        with compute_slot():
            pruned = prune_model(ws.loaded.model, mask)
            return compare_speed(ws.loaded.model, pruned, repeats=3, device=ws.loaded.device, progress=progress)

    return store().memo(_speed_key(ws, mask), compute)


# -- trajectories -------------------------------------------------------------------------------------------------

def run_trajectories(ws: DashboardWorkspace, names: list[str], params: dict[str, dict], inverse: bool, seeds: int,
                     step: int, budget: float, tolerance: float, stability: bool,
                     progress: Progress | None = None) -> tuple[list, list[dict]]:
    """Trajectories of ``names`` (and their inverse orders) plus ``seeds`` random orders, from the model as loaded.

    Curves run to ``budget`` without stopping early; ``tolerance`` is recorded so the stop point can be marked.
    Each run is kept in the store, so re-running the same settings is instant.
    """
    from headprune.stability import perturb_batches
    from headprune.trajectory import run_trajectory, spread

    report = progress or (lambda f, m: None)
    jobs = [(n, False, ws.setup.seed) for n in names] + ([(n, True, ws.setup.seed) for n in names] if inverse else [])
    jobs += [("random", False, ws.setup.seed + i) for i in range(seeds)]
    perturbed = None
    runs = []
    for i, (name, inv, seed) in enumerate(jobs):
        label = ("inverse " if inv else "") + name + (f" (seed {seed})" if name == "random" else "")
        key = f"traj|{ws.key}|{name}|{params_key(params.get(name))}|{inv}|{seed}|{step}|{budget}|{stability}"

        def compute(name=name, inv=inv, seed=seed, label=label, i=i):
            nonlocal perturbed
            if stability and perturbed is None:
                perturbed = perturb_batches(ws.eval_batches, ws.loaded.tokenizer, seed=ws.setup.seed)
            with compute_slot():
                return run_trajectory(
                    ws.private_model(), ws.calib_batches, ws.eval_batches, name, params=params.get(name) or {},
                    inverse=inv, step=step, budget=budget, seed=seed, stability=perturbed if stability else False,
                    device=ws.loaded.device, tokenizer=ws.loaded.tokenizer, model_name=ws.setup.model,
                    texts=ws.calib_texts(),
                    data_info={"data": ws.setup.data_label, "eval_size": len(ws.eval), "calib_size": len(ws.calib),
                               "seed": ws.setup.seed},
                    progress=lambda f, m: report((i + f) / len(jobs), f"{label}: {m}"))

        traj = store().memo(key, compute)
        traj.tolerance = tolerance
        runs.append(traj)
        report((i + 1) / len(jobs), f"{label} done")
    randoms = [t for t in runs if t.criterion == "random"]
    spreads = [{**spread(randoms), "name": f"random ({len(randoms)} seeds)"}] if len(randoms) > 1 else []
    return runs, spreads
