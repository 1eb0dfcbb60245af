"""The dashboard's computations: scores, trajectories, arcs, syntactic profiles, live evaluation and speed.

A page calls one function here per computation; the maths is the library's, this module only decides what is
stored (``store.py``: one result per key, shared by every session) and runs each computation inside a
``threads.compute_slot``. The shared model is never hooked: every library call used here gates its own private
structural copy.
"""

from __future__ import annotations

import io
import os
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from headprune.criteria import ScoreMap, get
from headprune.criteria.onepass import score_many
from headprune.criteria.sap import OWN_SELECTION
from headprune.data import NAMED_DATA, align_labels, load_data, make_batches
from headprune.estimate import (
    TimeEstimate,
    device_name,
    estimate_evaluation,
    estimate_role_ablation,
    estimate_scoring,
    estimate_trajectory,
    forward_rate,
    scoring_tokens,
    tokens,
)
from headprune.evaluation.example import compare_classifier, compare_lm, example_row
from headprune.evaluation.live import LiveEvaluator
from headprune.evaluation.metrics import HIGHER_IS_BETTER, Metrics, choice_rows
from headprune.evaluation.progressive import visit_order
from headprune.evaluation.speed import compare_speed
from headprune.evaluation.stability import perturb_batches, same_answers
from headprune.kvcache import KVPlan
from headprune.kvcache.duo import DEFAULTS as DUO_DEFAULTS
from headprune.kvcache.scores import RULES, group_scores, head_scores
from headprune.kvcache.tasks import metric_under_plan
from headprune.lessons import ENV as LESSONS_ENV
from headprune.lessons import folders_stamp, lesson_folders, load_lessons
from headprune.model.capture import capture_attention
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.recovery import RecoveryRun, RecoverySpec, export_recovered, stage_metrics
from headprune.roles import RoleReport, RoleSpec, head_roles, kept_by_role, kept_curve, role_ablation
from headprune.scoring.protocol import GRADIENT_PASS
from headprune.syntax import ParserError, build_arcs, syntactic_profile
from headprune.syntax.parse import language_problem
from headprune.trajectory import Trajectory, TrajectorySpec, run_trajectory, spread

from .config import memory_budget
from .session import SessionData
from .store import DashboardWorkspace, mask_key, params_key, store
from .threads import compute_slot

Progress = Callable[[float, str], None]


# -- scores, arcs, profiles -------------------------------------------------------------------------------------

def _score_key(ws: DashboardWorkspace, name: str, params: dict[str, dict], mask: HeadMask | None) -> str:
    return f"score|{ws.key}|{name}|{params_key(params.get(name))}|{mask_key(mask)}"


def _live_key(ws: DashboardWorkspace, name: str) -> str:
    return f"live|{ws.key}|{name}"


def compute_scores(ws: DashboardWorkspace, names: list[str], params: dict[str, dict], mask: HeadMask | None,
                   progress: Progress | None = None) -> dict[str, ScoreMap]:
    """Score maps of ``names`` under ``mask``: from the store when known, the rest in one shared pass.

    ``progress`` is called between batches; an exception from it (a Cancel click's rerun, ``errors.Cancelled``)
    stops the pass and nothing is stored."""
    def key(name):
        return _score_key(ws, name, params, mask)

    out = {name: store().get(key(name)) for name in names}
    missing = [n for n in names if out[n] is None]
    if missing:
        with compute_slot():
            fresh = score_many(missing, ws.scoring_context(mask, progress, memory_budget()),
                               {n: params.get(n) or {} for n in missing})
        for name, score in fresh.items():
            store().put(key(name), score)
            out[name] = score
    return out


def criterion_mask(ws: DashboardWorkspace, sd: SessionData, name: str, ratio: float,
                   progress: Progress | None = None) -> tuple[HeadMask, str]:
    """The session's mask with ``ratio`` of the grid pruned by criterion ``name``, and what was done in words.

    Most criteria: the lowest scores (``ScoreMap.kept_at``). SAP (§4.1): its own selection at that target sparsity
    with the k that performs best there on the selection batches (the selection role, else the calibration
    batches: ``ScoringContext.selection``), plus the heads of the layers its whole-layer rule drops (the live
    evaluation gates heads; ``evaluate`` and ``prune`` on the exported mask also skip those layers' feed-forward
    blocks). SAP+CF likewise: CF's own selection at that target (its pool re-ranked by measured degradation,
    ``headprune.criteria.sap`` §3.4)."""
    if name in OWN_SELECTION and 0 < ratio < 1:
        params = sd.params.get(name) or {}

        def compute():
            ctx = ws.scoring_context(sd.mask, progress, memory_budget())
            with compute_slot():
                return get(name).per_sparsity(ctx, [ratio], params)[ratio]

        result = store().memo(f"{name}-level|{ws.key}|{params_key(params)}|{mask_key(sd.mask)}|{ratio}", compute)
        dropped = f", layers {result.dropped_layers} dropped" if result.dropped_layers else ""
        label = "SAP+CF" if name == "sap-cf" else "SAP"
        return result.mask & sd.mask, f"{label} at {ratio:.0%} (best k = {result.k}{dropped})"
    score = compute_scores(ws, [name], sd.params, sd.mask, progress)[name]
    keep = score.kept_at(ratio)
    return HeadMask(np.where(keep, sd.mask.values.numpy(), 0.0)), f"pruned the lowest {ratio:.0%} by {name}"


def arcs_for(ws: DashboardWorkspace, text, mask: HeadMask):
    """Dependency arcs of ``text`` with every head's attention under ``mask`` (stored per text and mask)."""
    def compute():
        with compute_slot():
            return build_arcs(ws.loaded.model, ws.loaded.tokenizer, text, mask=mask, max_length=ws.setup.max_length)

    return store().memo(f"arcs|{ws.key}|{text}|{mask_key(mask)}", compute)


def head_maps(ws: DashboardWorkspace, text) -> tuple[list[str], np.ndarray]:
    """Tokens of ``text`` and every head's attention on it, (forward layers, H, T, T), under the model as loaded
    (no session mask: a pruned head is drawn greyed with what it would look at; stored per text)."""
    def compute():
        row = example_row(text, "lm" if ws.task.kind == "lm" else "classification")
        batch = make_batches(ws.loaded.tokenizer, row, batch_size=1, max_length=ws.setup.max_length)[0]
        with compute_slot():
            maps = capture_attention(ws.loaded.model, batch)
        keep = batch["attention_mask"][0].bool()
        ids = batch["input_ids"][0][keep]
        attention = maps.stacked[:, 0][:, :, keep][:, :, :, keep].numpy()
        return [ws.loaded.tokenizer.decode([int(i)]) for i in ids], attention

    return store().memo(f"headmaps|{ws.key}|{text}", compute)


def example_comparison(ws: DashboardWorkspace, text, mask: HeadMask, targets_from: int | None = None,
                       top_k: int = 5):
    """``text`` through the model as loaded and under ``mask``: per-token losses and top-k guesses of a language
    model (``evaluation.example.compare_lm``), label probabilities of a classifier (stored per text and mask)."""
    def compute():
        with compute_slot():
            if ws.task.kind == "lm":
                return compare_lm(ws.loaded.model, ws.loaded.tokenizer, text, mask, top_k=top_k,
                                  max_length=ws.setup.max_length, targets_from=targets_from)
            return compare_classifier(ws.loaded.model, ws.loaded.tokenizer, text, mask,
                                      max_length=ws.setup.max_length)

    return store().memo(f"example|{ws.key}|{text}|{targets_from}|{top_k}|{mask_key(mask)}", compute)


LANGUAGE_CHECK_TEXTS = 64   # evaluation texts the parser's language check reads (parsed once per workspace)


def syntax_problem(ws: DashboardWorkspace) -> str | None:
    """Why this workspace's data gets no syntax views (dependency arcs, syntactic profile), or None.

    A named data set says whether its rows are a language (``NamedData.language``: demo-circuit's random word
    blocks are not); for any other data the parser's own language check decides (``syntax.language_problem``
    over the first LANGUAGE_CHECK_TEXTS evaluation texts, stored per workspace). Without a parser there is no
    problem to report here: drawing the arcs then says the parser is missing."""
    for spec in (ws.setup.data, ws.setup.calib_data):
        named = NAMED_DATA.get(spec or "")
        if named is not None and not named.language:
            return (f"The data ({spec}: {named.description}) is not a language, so a dependency parse of it would "
                    "be meaningless: no arcs or syntactic profile are drawn. The word-level attention is shown.")
    if NAMED_DATA.get(ws.setup.data) is not None:
        return None

    def check():
        texts = [t for t in ws.eval.texts[:LANGUAGE_CHECK_TEXTS] if isinstance(t, str)]
        try:
            return language_problem(texts)
        except ParserError:
            return None

    problem = store().memo(f"language|{ws.key}", check)
    return None if problem is None else (f"The parser's language check: {problem}. Its dependency arcs would be "
                                         "noise, so no arcs or syntactic profile are drawn; the word-level "
                                         "attention is shown.")


def _profile_key(ws: DashboardWorkspace, mask: HeadMask) -> str:
    return f"profile|{ws.key}|{mask_key(mask)}"


def stored_profile(ws: DashboardWorkspace, mask: HeadMask):
    """The syntactic profile under ``mask`` if some session computed it already, else None."""
    return store().get(_profile_key(ws, mask))


def profile_for(ws: DashboardWorkspace, mask: HeadMask, progress: Progress | None = None):
    """Syntactic profile of every head over the calibration texts under ``mask`` (stored per mask)."""
    def compute():
        texts = list(zip(ws.calib.texts, ws.calib.pairs)) if ws.calib.pairs is not None else ws.calib.texts
        with compute_slot():
            return syntactic_profile(ws.loaded.model, ws.loaded.tokenizer, texts, mask=mask,
                                     max_length=ws.setup.max_length, progress=progress)

    return store().memo(_profile_key(ws, mask), compute)


# -- lessons ------------------------------------------------------------------------------------------------------

def available_lessons(pages: list[str]) -> tuple[dict, list[str]]:
    """The shipped lessons and those of the folder HEADPRUNE_LESSONS names (``headprune.lessons``), with the error
    lines of files that could not be used; re-read when a file changes (kept per folder listing and times)."""
    folders = lesson_folders(os.environ.get(LESSONS_ENV))
    stamp = folders_stamp(folders)     # a dangling link or a FIFO in the folder is stamped, never stat'ed into a crash
    return store().memo(f"lessons|{stamp}|{pages}", lambda: load_lessons(folders, pages=pages))


def lesson_values(ws: DashboardWorkspace, mask: HeadMask) -> dict[str, object]:
    """The live values a lesson step's placeholders quote (``headprune.lessons.PLACEHOLDERS``) with ``mask``: the
    metrics of the model as loaded and under ``mask`` on this workspace's evaluation rows, measured as the Prune page
    measures them (its live evaluator at that mask, kept in the store: a class opening one step computes it once)."""
    dense = ws.dense().to_dict()
    pruned = dense if mask == ws.cut_mask else live_evaluator(ws, ws.eval_batches, mask).metrics().to_dict()
    values: dict[str, object] = {"metric": ws.metric, "dense": dense[ws.metric], "pruned": pruned[ws.metric],
                                 "change": pruned[ws.metric] - dense[ws.metric], "heads": ws.n_units,
                                 "heads_left": ws.n_units - int(mask.n_pruned), "rows": len(ws.eval)}
    values.update({f"dense_{name}": value for name, value in dense.items()})
    values.update({f"pruned_{name}": value for name, value in pruned.items()})
    return values


# -- head roles ---------------------------------------------------------------------------------------------------

def _roles_key(ws: DashboardWorkspace, mask: HeadMask | None) -> str:
    return f"roles|{ws.key}|{mask_key(mask)}"


def stored_roles(ws: DashboardWorkspace, mask: HeadMask | None = None) -> RoleReport | None:
    """The head roles under ``mask`` if some session computed them already, else None."""
    return store().get(_roles_key(ws, mask))


def roles_for(ws: DashboardWorkspace, mask: HeadMask | None = None, progress: Progress | None = None) -> RoleReport:
    """Every head's role scores and labels (``roles.head_roles``) on the calibration texts (stored per mask)."""
    def compute():
        with compute_slot():
            return head_roles(ws.loaded.model, ws.loaded.tokenizer, ws.calib_batches,
                              RoleSpec(seed=ws.setup.seed, max_length=ws.setup.max_length),
                              texts=ws.calib_texts(), mask=mask, progress=progress)

    return store().memo(_roles_key(ws, mask), compute)


def role_table(scores: dict[str, ScoreMap], report: RoleReport, ratio: float) -> dict:
    """Which roles each criterion keeps at ``ratio`` (``roles.kept_by_role``)."""
    return kept_by_role(scores, report, ratio)


def role_curves(scores: dict[str, ScoreMap], report: RoleReport, ratios: list[float]) -> dict:
    """Share of each role kept by each criterion over ``ratios`` (``roles.kept_curve``)."""
    return kept_curve(scores, report, ratios)


def ablate_role(ws: DashboardWorkspace, sd: SessionData, report: RoleReport, role: str, mode: str,
                progress: Progress | None = None) -> dict:
    """The metric with ``role`` pruned / alone kept vs 10 equal-sized random sets, from the session's mask, on a
    fork of the session's evaluator (``roles.role_ablation``; stored per mask, role and mode)."""
    start = 0.0
    if sd.live is None:   # the session's evaluator first: the bar's first share (one pass of seeds + 2)
        start = 1 / (ABLATION_SEEDS + 2)
        sd.live = live_evaluator(ws, ws.eval_batches, sd.mask, _part(progress, 0.0, start))

    def compute():
        move_live(sd.live, sd.mask)
        with compute_slot():
            return role_ablation(sd.live, report, role, mode, seeds=ABLATION_SEEDS, seed=ws.setup.seed,
                                 progress=_part(progress, start, 1.0))

    return store().memo(_ablation_key(ws, sd, role, mode), compute)


ABLATION_SEEDS = 10   # random sets a role is measured against


def live_role_heads(report: RoleReport, mask: HeadMask, role: str) -> int:
    """How many heads with ``role`` are in use under ``mask`` (what ``ablate_role`` can prune or keep)."""
    return int((report.heads_with(role) & report.live & mask.keep_bool().numpy()).sum())


def _part(progress: Progress | None, start: float, end: float) -> Progress | None:
    """``progress`` for one part of a job: its fractions 0..1 drawn from ``start`` to ``end`` of the bar."""
    return None if progress is None else (lambda f, m: progress(start + (end - start) * f, m))


def _ablation_key(ws: DashboardWorkspace, sd: SessionData, role: str, mode: str) -> str:
    return f"ablation|{ws.key}|{mask_key(sd.mask)}|{role}|{mode}"


def stored_ablation(ws: DashboardWorkspace, sd: SessionData, role: str, mode: str) -> dict | None:
    """``ablate_role``'s result for the session's mask, ``role`` and ``mode`` if any session measured it."""
    return store().get(_ablation_key(ws, sd, role, mode))


def ablation_estimate(ws: DashboardWorkspace, sd: SessionData) -> TimeEstimate:
    """How long ``ablate_role`` takes here (``estimate.estimate_role_ablation``)."""
    return estimate_role_ablation(ws.loaded.model, ws.eval_batches, ABLATION_SEEDS, evaluator=sd.live is not None,
                                  rate=_rate(ws, "eval"), memory_budget=memory_budget())


# -- live evaluation ----------------------------------------------------------------------------------------------

def source_evaluator(ws: DashboardWorkspace, name: str = "evaluation", batches: list[dict] | None = None,
                     progress: Progress | None = None) -> LiveEvaluator:
    """The workspace's LiveEvaluator called ``name`` at the model as loaded (built once, kept in the store):
    what sessions and trajectories fork instead of running their own first pass."""
    def source() -> LiveEvaluator:
        with compute_slot():
            return LiveEvaluator(ws.loaded.model, ws.eval_batches if batches is None else batches,
                                 mask=ws.cut_mask, progress=progress)

    return store().memo(_live_key(ws, name), source)


def live_evaluator(ws: DashboardWorkspace, batches: list[dict], mask: HeadMask, progress: Progress | None = None,
                   name: str = "evaluation"):
    """A session's LiveEvaluator on ``batches`` (called ``name``), at ``mask``.

    It is a fork of one evaluator per workspace and ``name`` (``source_evaluator``): a session costs no pass over
    the data to start, and memory only for the layers from its lowest changed layer up. Each fork gates its own
    hook-free structural copy of the model.
    """
    source = source_evaluator(ws, name, batches, progress)
    if source.mask == mask:
        return source.fork()

    def at_mask() -> LiveEvaluator:
        live = source.fork()
        move_live(live, mask, progress)
        return live

    # sessions opening one link start at one mask (a lesson step: a class of 30 at once): its evaluator is
    # computed once, kept in the store, and every such session forks it instead of re-running the model itself
    return store().memo(f"{_live_key(ws, name)}|{mask_key(mask)}", at_mask).fork()


def move_live(live, mask: HeadMask, progress: Progress | None = None, on_estimate=None):
    """``live.set_mask(mask)`` inside a compute slot; metrics under ``mask``.

    ``on_estimate(Estimate)`` gets the running headline metric after every batch (``LiveEvaluator.set_mask``);
    a page draws it there, and a click that interrupts the drawing leaves the run for the next call to finish.
    """
    with compute_slot():
        return live.set_mask(mask, progress, on_estimate)


def session_metrics(ws: DashboardWorkspace, sd: SessionData, on_estimate=None,
                    progress: Progress | None = None) -> tuple[Metrics | None, float | None]:
    """Metrics (and stability, when tracked) under the session's mask, through the session's LiveEvaluator.

    The evaluator is made on first use (``progress`` reports that one pass); ``on_estimate(Estimate)`` is called
    after every re-evaluated batch, so a page shows a number long before the last batch is in.
    """
    if sd.live is None:
        sd.live = live_evaluator(ws, ws.eval_batches, sd.mask, progress)
    metrics = move_live(sd.live, sd.mask, on_estimate=on_estimate)
    stability = None
    if sd.live_stable is not None:
        move_live(sd.live_stable, sd.mask)
        stability = same_answers(sd.live.predictions(), sd.live_stable.predictions())
    return metrics, stability


def tracks_stability(ws: DashboardWorkspace) -> bool:
    """Whether stability applies: a classifier's labels, or the picked choice of multiple-choice data."""
    return ws.task.kind in ("classification", "multiple_choice")


def choice_table(ws: DashboardWorkspace, sd: SessionData, question: int) -> dict | None:
    """Evaluation question ``question`` of multiple-choice data: its context, and per choice the summed
    log-likelihood of the model as loaded and under the session's mask (and per character: acc_norm's score), which
    choice each picks, and the right one. None for other tasks or before the live evaluation exists.

    Read from the per-row sums the live evaluators keep already (the workspace's source at the model as loaded, the
    session's at its mask): no forward pass."""
    if not ws.task.is_choice or sd.live is None:
        return None
    rows = choice_rows(ws.eval_batches)["question"] == question
    dense = -source_evaluator(ws).logits[:, 0].numpy()[rows]
    pruned = -sd.live.logits[:, 0].numpy()[rows]
    choices = ws.eval.choices[question]
    chars = [len(c) for c in choices]
    return {"context": ws.eval.texts[question], "right": int(ws.eval.labels[question]),
            "table": {"choice": choices,
                      "right": [c == ws.eval.labels[question] for c in range(len(choices))],
                      "log-likelihood, as loaded": dense.tolist(),
                      "log-likelihood, pruned": pruned.tolist(),
                      "per character, pruned": (pruned / chars).tolist(),
                      "picked as loaded": [c == int(dense.argmax()) for c in range(len(choices))],
                      "picked pruned": [c == int(pruned.argmax()) for c in range(len(choices))]}}


def perturbed_batches(ws: DashboardWorkspace) -> list[dict]:
    """The evaluation batches with 10% of their words dropped (seeded by the workspace seed; stored)."""
    return store().memo(f"perturbed|{ws.key}",
                        lambda: perturb_batches(ws.eval_batches, ws.loaded.tokenizer, seed=ws.setup.seed))


def enable_stability(ws: DashboardWorkspace, sd: SessionData, progress: Progress | None = None) -> None:
    """Give the session a second LiveEvaluator on the word-dropped batches, so stability follows every click."""
    sd.live_stable = live_evaluator(ws, perturbed_batches(ws), sd.mask, progress, name="stability")


# -- speed ----------------------------------------------------------------------------------------------------------

def _speed_key(ws: DashboardWorkspace, mask: HeadMask) -> str:
    return f"speed|{ws.key}|{mask_key(mask)}"


def measured_speed(ws: DashboardWorkspace, mask: HeadMask) -> dict | None:
    """The speed report of ``mask`` if it was measured already (any page, any session)."""
    return store().get(_speed_key(ws, mask))


def measure_speed(ws: DashboardWorkspace, mask: HeadMask, progress: Progress | None = None) -> dict:
    """Measured and ideal speed-up of cutting ``mask`` out of the loaded model (``speed.compare_speed``; stored
    per mask). Three timed repeats per setting keep it to seconds; the page shows the conditions with the result."""
    def compute() -> dict:
        with compute_slot():
            pruned = prune_model(ws.loaded.model, mask)
            return compare_speed(ws.loaded.model, pruned, repeats=3, device=ws.loaded.device, progress=progress)

    return store().memo(_speed_key(ws, mask), compute)


# -- trajectories -------------------------------------------------------------------------------------------------

def _jobs(names: list[str], inverse: bool, seeds: int, seed: int) -> list[tuple[str, bool, int]]:
    """(criterion, inverse, seed) of every run a Trajectories click starts."""
    return [(n, False, seed) for n in names] + ([(n, True, seed) for n in names] if inverse else []) + \
        [("random", False, seed + i) for i in range(seeds)]


LESSON_ROWS = 128   # the Trajectories page's default evaluation rows: the demo's default run in about 2 minutes


def trajectory_batches(ws: DashboardWorkspace, rows: int | None) -> list[dict]:
    """The evaluation batches a trajectory run measures on: all of them (``rows`` None or at least the split), else
    ``rows`` // batch size batches drawn at random with the workspace seed (the batches are length-sorted, so the
    first ones would be the shortest rows), kept in their order."""
    batches = ws.eval_batches
    size = max(len(batches[0]["input_ids"]), 1) if batches else 1
    if rows is None or rows >= len(ws.eval) or not batches:
        return batches
    keep = sorted(visit_order(len(batches), ws.setup.seed)[:max(1, rows // size)])
    return [batches[i] for i in keep]


def _trajectory_rows(ws: DashboardWorkspace, rows: int | None) -> tuple[str, list[dict]]:
    """(name of the source evaluator, batches) of a trajectory run on ``rows`` evaluation rows."""
    batches = trajectory_batches(ws, rows)
    return ("evaluation" if batches is ws.eval_batches else f"evaluation-{len(batches)}"), batches


def run_trajectories(ws: DashboardWorkspace, names: list[str], params: dict[str, dict], inverse: bool, seeds: int,
                     step: int, budget: float, tolerance: float, stability: bool,
                     progress: Progress | None = None, rows: int | None = None) -> tuple[list[Trajectory], list[dict]]:
    """Trajectories of ``names`` (and their inverse orders) plus ``seeds`` random orders, from the model as loaded.

    Curves run to ``budget`` without stopping early; ``tolerance`` is recorded so the stop point can be marked.
    Each run is kept in the store, so re-running the same settings is instant. Every run starts from the
    workspace's stored evaluator (a fork, no first pass of its own) and reads the shared model (the library
    copies what it hooks), so the jobs share everything but their own steps. ``rows``: evaluate on that many
    evaluation rows (``trajectory_batches``; None: all).
    """
    report = progress or (lambda f, m: None)
    jobs = _jobs(names, inverse, seeds, ws.setup.seed)
    source, eval_batches = _trajectory_rows(ws, rows)
    n_rows = sum(len(b["input_ids"]) for b in eval_batches)
    data_info = {"data": ws.setup.data_label, "eval_size": n_rows, "calib_size": len(ws.calib),
                 "seed": ws.setup.seed, "roles": ws.roles()}
    runs, memory = [], memory_budget()
    for i, (name, inv, seed) in enumerate(jobs):
        label = ("inverse " if inv else "") + name + (f" (seed {seed})" if name == "random" else "")
        key = f"traj|{ws.key}|{name}|{params_key(params.get(name))}|{inv}|{seed}|{step}|{budget}|{stability}" + \
            ("" if source == "evaluation" else f"|{source}")
        # random: independent masks at each rate (the boxes' draws), not the prefixes of one order
        spec = TrajectorySpec(criterion=get(name), params=params.get(name) or {}, inverse=inv, step=step,
                              budget=budget, seed=seed, stability=stability, model_name=ws.setup.model,
                              data_info=data_info, independent=name == "random", metric=ws.metric,
                              metric_set=ws.metric_set())

        def compute(spec=spec, label=label, i=i):
            evaluator = source_evaluator(ws, source, eval_batches)
            with compute_slot():
                return run_trajectory(
                    spec, ws.loaded.model, ws.calib_batches, eval_batches, device=ws.loaded.device,
                    tokenizer=ws.loaded.tokenizer, texts=ws.calib_texts(), evaluator=evaluator,
                    perturbed=perturbed_batches(ws) if stability else None, memory_budget=memory,
                    progress=lambda f, m: report((i + f) / len(jobs), f"{label}: {m}"),
                    select=ws.select_batches or None)

        traj = store().memo(key, compute)
        traj.tolerance = tolerance
        runs.append(traj)
        report((i + 1) / len(jobs), f"{label} done")
    randoms = [t for t in runs if t.criterion == "random"]
    spreads = [{**spread(randoms), "name": f"random ({len(randoms)} seeds)"}] if len(randoms) > 1 else []
    return runs, spreads


def chart_metrics(ws: DashboardWorkspace, trajectories: list[Trajectory]) -> list[str]:
    """Metrics a trajectory chart can show, headline first: the workspace's metric set, then whatever else every
    run recorded with a direction (loss, macro-F1, agreement; stability where every run measured it)."""
    recorded = [m for m in (trajectories[0].dense if trajectories else {}) if m in HIGHER_IS_BETTER
                and all(t.dense.get(m) is not None for t in trajectories)]
    return list(dict.fromkeys([ws.metric, *ws.metric_set(), *recorded]))


def chart_spreads(trajectories: list[Trajectory], spreads: list[dict], metric: str) -> list[dict]:
    """The spreads to draw for ``metric``: those computed for it, and the random runs' boxes recomputed for it
    when they were computed for another metric."""
    keep = [s for s in spreads if s.get("metric") == metric]
    randoms = [t for t in trajectories if t.criterion == "random"]
    if len(randoms) > 1 and not any(s.get("name", "").startswith("random") for s in keep):
        keep.append({**spread(randoms, metric), "name": f"random ({len(randoms)} seeds)"})
    return keep


def open_step(sd: SessionData, trajectory: Trajectory, index: int, label: str) -> None:
    """Make the mask after step ``index`` of ``trajectory`` the session's mask (Prune and Export show that model;
    undo goes back)."""
    sd.set_mask(trajectory.mask_at(index), f"step {index} of {label}")


# -- time told before long work -------------------------------------------------------------------------------------

RETIME_BELOW = 1.0   # seconds: a forward timed faster than this is timed twice more (``_rate``)


def _rate(ws: DashboardWorkspace, batches: str = "calib") -> tuple[float, str]:
    """Seconds per token of one forward on this workspace (``estimate.forward_rate``: one batch timed, stored), on
    the ``batches`` the job runs: "calib" (scoring) or "eval" (live evaluation, role ablation). A token's cost
    depends on the batch's rows: timed on 32-row calibration batches, Roles -> Measure on evaluation batches of
    one row said "about 5 s" and took 46 s."""
    timed = ws.eval_batches if batches == "eval" else ws.calib_batches or ws.eval_batches

    def measure():
        with compute_slot():
            first = forward_rate(ws.loaded.model, timed, memory_budget())
            if first[0] * tokens(timed[:1]) >= RETIME_BELOW:
                return first
            # a short timing is the one a busy moment stretches most (one 1-row batch timed once said "about
            # 23 min" for a 40 s job): the fastest of three, as ``measure_live_size`` keeps
            return min([first] + [forward_rate(ws.loaded.model, timed, memory_budget()) for _ in range(2)])

    return store().memo(f"rate|{batches}|{ws.key}", measure)


def scoring_estimate(ws: DashboardWorkspace, names: list[str], params: dict[str, dict],
                     mask: HeadMask | None) -> TimeEstimate | None:
    """How long ``compute_scores`` would take for the criteria not stored yet (None: all stored, or no data)."""
    missing = [n for n in names if store().get(_score_key(ws, n, params, mask)) is None]
    if not missing or not ws.calib_batches:
        return None
    ctx = ws.scoring_context(mask, memory_budget=memory_budget())
    return estimate_scoring(ctx, missing, {n: params.get(n) or {} for n in missing}, rate=_rate(ws))


def trajectories_estimate(ws: DashboardWorkspace, names: list[str], params: dict[str, dict], inverse: bool,
                          seeds: int, step: int, budget: float, stability: bool,
                          rows: int | None = None) -> TimeEstimate | None:
    """How long ``run_trajectories`` would take with these settings (stored runs cost nothing; None: no data)."""
    if not ws.calib_batches or not ws.eval_batches:
        return None
    total, last = 0.0, None
    source, eval_batches = _trajectory_rows(ws, rows)
    shared = store().get(_live_key(ws, source)) is not None
    for name, inv, seed in _jobs(names, inverse, seeds, ws.setup.seed):
        spec = TrajectorySpec(criterion=get(name), params=params.get(name) or {}, inverse=inv, step=step,
                              budget=budget, seed=seed, stability=stability)
        last = estimate_trajectory(spec, ws.loaded.model, ws.calib_batches, eval_batches, evaluator=shared,
                                   rate=_rate(ws), memory_budget=memory_budget())
        total, shared = total + last.seconds, True
    if last is None:
        return None
    return TimeEstimate(total, "these trajectories", last.device, last.basis)


def live_estimate(ws: DashboardWorkspace) -> TimeEstimate | None:
    """How long the live evaluator's first pass (warm-up) over the evaluation split takes; None once it exists."""
    if store().get(_live_key(ws, "evaluation")) is not None or not ws.eval_batches:
        return None
    return estimate_evaluation(ws.loaded.model, ws.eval_batches, "live evaluation warm-up", rate=_rate(ws, "eval"))


def smaller_sizes(ws: DashboardWorkspace) -> str:
    """What makes a long run shorter here, with the sizes now (time grows with rows and with length)."""
    return (f"To make it shorter, lower the calibration examples (now {len(ws.calib)}), the evaluation examples "
            f"(now {len(ws.eval)}) or the max length (now {ws.setup.max_length} tokens) on Model & data, or choose "
            "fewer criteria.")


# -- recovery after pruning (issue 24) ---------------------------------------------------------------------------

RECOVERY_TRAIN = {"demo": "demo:train", "demo-lm": "demo-lm:train"}   # the demos' fine-tuning split: offline


def recovery_train_source(ws: DashboardWorkspace) -> str:
    """The default training data of the Recover step: a demo's fine-tuning split, else the loaded data."""
    return RECOVERY_TRAIN.get(ws.setup.model, ws.setup.data)


def _recovery_key(sd: SessionData, spec: RecoverySpec, train: str, train_size: int, format: str) -> str:
    return f"recover|{mask_key(sd.mask)}|{params_key(spec.to_json())}|{train}|{train_size}|{format}"


def _recovery_run(ws: DashboardWorkspace, sd: SessionData, spec: RecoverySpec, train: str, train_size: int,
                  format: str, work_dir: str) -> RecoveryRun:
    rows = load_data(train, ws.setup.text_col, ws.setup.pair_col, ws.setup.label_col,
                     task="lm" if ws.task.is_lm else "classification")
    rows = rows.subset(range(min(train_size, len(rows))))
    rows = rows if ws.task.is_lm else align_labels(rows, ws.loaded.id2label)
    return RecoveryRun(spec, ws.loaded.model, ws.loaded.tokenizer, sd.mask, rows, work_dir=work_dir, task=ws.task,
                       gated_export=format == "masked", memory_budget=memory_budget())


def recovery_estimate(ws: DashboardWorkspace, sd: SessionData, spec: RecoverySpec, train: str, train_size: int,
                      format: str) -> TimeEstimate:
    """Expected training time: one timed forward + backward × the run's steps (stored per mask and settings)."""
    def compute():
        with tempfile.TemporaryDirectory() as work, compute_slot():
            return _recovery_run(ws, sd, spec, train, train_size, format, work).estimate()

    return store().memo(f"{_recovery_key(sd, spec, train, train_size, format)}|estimate|{ws.key}", compute)


def stored_recovery(sd: SessionData, spec: RecoverySpec, train: str, train_size: int, format: str) -> dict | None:
    """This session's recovery for its current mask and these settings, if it ran (``run_recovery``)."""
    return sd.exports.get(_recovery_key(sd, spec, train, train_size, format))


def run_recovery(ws: DashboardWorkspace, sd: SessionData, spec: RecoverySpec, train: str, train_size: int,
                 format: str, progress: Progress | None = None, on_loss=None) -> dict:
    """Recover the session mask's model on ``train_size`` rows of ``train`` (a private copy; checkpoints in a
    temporary folder), then evaluate dense / pruned / recovered on the evaluation split. An exception from
    ``progress`` (Cancel) stops training between steps and nothing is stored.

    Returns {"result": RecoveryResult, "metrics": {"dense", "pruned", "recovered"}, "format"} (kept for
    ``stored_recovery``)."""
    report = progress or (lambda f, m: None)
    with tempfile.TemporaryDirectory() as work, compute_slot():
        run = _recovery_run(ws, sd, spec, train, train_size, format, work)
        result = run.run(progress=lambda f, m: report(0.85 * f, m), on_loss=on_loss)
        metrics = stage_metrics(ws.loaded.model, sd.mask, result, ws.eval_batches, task=ws.task,
                                dense_is_original=not ws.n_cut, memory_budget=memory_budget(),
                                progress=lambda f, m: report(0.85 + 0.15 * f, m))
    done = {"result": result, "metrics": metrics, "format": format}
    sd.exports[_recovery_key(sd, spec, train, train_size, format)] = done
    return done


def recovery_table(done: dict) -> list[dict]:
    """One row per metric: dense, pruned, recovered (None where it does not apply)."""
    metrics = done["metrics"]
    names = [k for k in metrics["recovered"] if k not in ("n", "tokens")]
    return [{"metric": name, **{stage: (metrics[stage] or {}).get(name) for stage in ("dense", "pruned", "recovered")}}
            for name in names]


def recovered_zip(ws: DashboardWorkspace, done: dict) -> bytes:
    """The recovered model written in its format (``recovery.export_recovered``), zipped."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "recovered"
        export_recovered(done["result"], ws.loaded.model, ws.loaded.tokenizer, folder, done["format"],
                         extra={"source_model": ws.setup.model, "recovery": done["metrics"]})
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    zf.write(f, Path(f"headprune-recovered-{done['format']}") / f.relative_to(folder))
    return buffer.getvalue()


# -- KV cache plans -------------------------------------------------------------------------------------------------

def _kv_scores_key(ws: DashboardWorkspace, rule: str, sink: int, window: int) -> str:
    return f"kv-scores|{ws.key}|{rule}|{sink}|{window}"


def kv_group_scores(ws: DashboardWorkspace, rule: str, sink: int, window: int, progress: Progress | None = None):
    """(L, H_kv) group scores of a KV plan rule (``kvcache.scores``; group = max of its query heads), stored per
    rule, sink and window (razor and random read no window-dependent rows, but one key keeps this simple).
    DuoAttention's training reports each step to ``progress`` (so Cancel stops it within a step); the other rules
    take one pass."""
    def compute():
        with compute_slot():
            if progress is not None:
                progress(0.0, f"{rule} scores")
            scores = head_scores(rule, ws.loaded.model, calib=ws.calib_batches, tokenizer=ws.loaded.tokenizer,
                                 sink=sink, window=window, seed=ws.setup.seed,
                                 duo_options={"progress": progress} if rule == "duo" and progress else None)
            return group_scores(scores, ws.adapter.n_heads // ws.adapter.n_kv_heads)

    return store().memo(_kv_scores_key(ws, rule, sink, window), compute)


def stored_kv_scores(ws: DashboardWorkspace, rule: str, sink: int, window: int):
    """``kv_group_scores``' result if any session computed it (None: not yet)."""
    return store().get(_kv_scores_key(ws, rule, sink, window))


RAZOR_PROBE_ROWS = 8   # kvcache.scores.head_scores' default probe rows


def kv_scores_work(ws: DashboardWorkspace, rule: str, sink: int, window: int) -> float:
    """Forward-pass tokens of ``kv_group_scores``: razor one pass over its probes (rows of [BOS] + r + r, r longer
    than the window), far-mass one over the calibration rows, DuoAttention its training steps (a teacher pass and a
    student pass with its backward over each step's passkey rows), a criterion its own scoring work, random none."""
    if rule == "random" or not ws.calib_batches:
        return 0.0
    if rule not in RULES:
        return scoring_tokens(ws.scoring_context(None, memory_budget=memory_budget()), [rule], {rule: {}})
    if rule == "razor":
        return RAZOR_PROBE_ROWS * (2 * max(window + 1, 20) + 1)
    if rule == "far-mass":
        return tokens(ws.calib_batches)
    # duo: rows of the longest calibration row's length, 1 + GRADIENT_PASS passes each
    length = max(int(b["attention_mask"].sum(-1).max()) for b in ws.calib_batches)
    return DUO_DEFAULTS["steps"] * DUO_DEFAULTS["batch_size"] * length * (1 + GRADIENT_PASS)


def kv_scores_estimate(ws: DashboardWorkspace, rule: str, sink: int, window: int) -> TimeEstimate | None:
    """How long ``kv_group_scores`` takes here: ``kv_scores_work`` at the measured rate (``estimate.forward_rate``);
    None for random (no work), stored scores or no calibration rows."""
    if rule == "random" or stored_kv_scores(ws, rule, sink, window) is not None or not ws.calib_batches:
        return None
    per_token, basis = _rate(ws)
    return TimeEstimate(per_token * kv_scores_work(ws, rule, sink, window), f"{rule} scores",
                        device_name(ws.loaded.model), basis)


KV_QUICK_CLICKS = 8   # scores costing at most this many head clicks' evaluations start without a button


def kv_scores_at_once(ws: DashboardWorkspace, rule: str, sink: int, window: int, rows: int | None) -> bool:
    """Whether the KV page scores ``rule`` as it opens rather than behind a button: when its work is at most
    KV_QUICK_CLICKS head clicks' evaluations (the plan on ``rows`` evaluation rows). Tokens, not a timing: a busy
    server (or a faster one) never changes what the page does. On demo-lm with 64 rows: random, razor's probes and
    far-mass's one pass start at once; DuoAttention's 30 training steps (15 clicks' work) wait for a click."""
    return rule == "random" or (bool(ws.calib_batches) and kv_scores_work(ws, rule, sink, window)
                                <= KV_QUICK_CLICKS * tokens(trajectory_batches(ws, rows)))


KV_ROWS = 64   # the KV page's default evaluation rows: a head click's new plan is measured in about 2 s on demo-lm


def kv_metrics(ws: DashboardWorkspace, plan: KVPlan | None, mask: HeadMask | None, rows: int | None = None) -> Metrics:
    """The evaluation metrics with ``plan``'s streaming heads restricted (None: the dense model), under ``mask``
    (stored per plan). ``rows``: on that many evaluation rows, the batches ``trajectory_batches`` draws (None: all)."""
    batches = trajectory_batches(ws, rows)
    # a budget plan's per-group windows are part of what the metric depends on
    shape = "dense" if plan is None else (plan.sink, plan.group_windows().flatten().tolist() if plan.is_budget
                                          else plan.window, plan.full.int().flatten().tolist())
    key = f"kv-metric|{ws.key}|{mask_key(mask)}|{shape}|{len(batches)}"

    def compute():
        with compute_slot():
            return metric_under_plan(ws.loaded.model, batches, plan, mask)

    return store().memo(key, compute)
