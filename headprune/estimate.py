"""Time told before long work: a measured forward pass turned into the expected duration of a run.

One batch is timed (``forward_rate``: a forward pass without autograd over the first batch, cut to the rows the
memory planner allows, after a one-row warm-up), giving r seconds per token. A run's work is counted in forward
passes over its data (``Criterion.work``: 1 for a forward-only criterion, ``GRADIENT_PASS`` = 3 with a backward,
KL's intact pass plus its partial ablated passes, HIES's α sweep), so

    scoring       t ≈ r · (N_calib · W + N_select · W_sel)  N: tokens of the batches (padding included), W: work,
                                                           W_sel: passes over the selection batches
                                                           (``Criterion.selection_work``: SAP's k sweep,
                                                           candidate filtering's evaluations; 0 for most)
    live warm-up  t ≈ r · N_eval                           one full pass over the evaluation batches
    trajectory    t ≈ seeds · (r · (N_calib · W + N_select · W_sel) · S_score
                           + r · N_eval · (1 + LIVE_STEP · n_steps))
    role ablation t ≈ r · N_eval · (seeds + 1)               the role's set and ``seeds`` random sets, each a live
                                                           re-evaluation from its lowest changed layer: counted
                                                           as a full pass (random sets almost always reach an
                                                           early layer), plus one pass for a missing evaluator
    lm-eval       t ≈ r · N_requests          N_requests: tokens of every request lm-eval will score (context +
                                              continuation of each choice, ``harness.count_requests``)

A click's live re-evaluation on a big model (``live_size``, issue 36): a click in layer 0 costs about one full
pass, r · N_eval, so the dashboard evaluates on the evaluation rows that pass takes at most ``LIVE_CLICK_SECONDS``
(15 s, for an exact number within 20 s), in batches that take at most ``LIVE_FIRST_SECONDS`` each (1 s, for a
first running estimate within 2 s: it comes after the first batch); models whose whole split fits keep it and its
batches (the demos).

with S_score = 1 for a static criterion and n_steps / 2 for one re-scored after every step on a model that shrinks
to nothing (a mean of half the model), and LIVE_STEP = 1/2: a step's re-evaluation runs the layers from the first
changed one up, half the model on average over layers (``LiveEvaluator``). The first pass of a trajectory is
skipped when an evaluator is shared (``evaluator=True``). These are estimates from one measured batch, good to
a factor of about two (the attention's T² term and the backward are counted, not timed); ``TimeEstimate.text``
says "about 48 min on this CPU". Past ``LONG`` seconds the dashboard suggests smaller sizes.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from .data import model_inputs
from .evaluation.harness import Tasks, count_requests
from .model.arch import adapt
from .model.device import autocast, synchronise
from .model.memory import plan_for, split_batch
from .scoring import ScoringContext, get
from .trajectory import TrajectorySpec

LIVE_STEP = 0.5      # share of a full pass one trajectory step re-evaluates (module doc)
# issue 36's targets are 20 s to a click's exact number and 2 s to its first; the budgets leave room for what a
# click costs besides the model (the page's rerun and drawing, the browser)
LIVE_CLICK_SECONDS = 15.0   # a full pass over the live rows, at most (module doc, ``live_size``)
LIVE_FIRST_SECONDS = 1.0    # one evaluation batch, at most: the first running estimate follows it
MIN_LIVE_ROWS = 16          # fewer rows than this say too little about a metric to be worth the wait saved
# a batch is the running estimate's sampled unit: batches of one row gave "1.000 ± 0.000 · 2/22 batches" (issue 45);
# four rows a batch cost the first number four single-row forwards at most
MIN_BATCH_ROWS = 4
LONG = 600.0         # seconds: past this the dashboard suggests smaller sizes


@dataclass(frozen=True)
class TimeEstimate:
    """Expected seconds of a run, what it is, where it runs and what was measured to say so."""

    seconds: float
    what: str            # "kl on this model"
    device: str          # "this CPU" | "this GPU"
    basis: str = ""      # "one forward of 8 rows × 128 tokens: 1.93 s"

    @property
    def long(self) -> bool:
        return self.seconds > LONG

    @property
    def text(self) -> str:
        """"kl on this model: about 48 min on this CPU"."""
        return f"{self.what}: {human_duration(self.seconds)} on {self.device}"

    def __str__(self) -> str:
        return self.text


def human_duration(seconds: float) -> str:
    """"under a second", "about 20 s", "about 48 min", "about 2.5 h" (two significant figures at most)."""
    if seconds < 1:
        return "under a second"
    if seconds < 90:
        return f"about {seconds:.0f} s"
    if seconds < 90 * 60:
        return f"about {seconds / 60:.0f} min"
    return f"about {seconds / 3600:.1f} h"


def tokens(batches: list[dict]) -> int:
    """Token positions run (padding included: it is computed too)."""
    return sum(int(b["input_ids"].numel()) for b in batches)


def device_name(model) -> str:
    return "this GPU" if next(model.parameters()).device.type == "cuda" else "this CPU"


@torch.no_grad()
def forward_rate(model, batches: list[dict], memory_budget: int | str | None = None,
                 idle: bool = False) -> tuple[float, str]:
    """(seconds per token, what was timed) of a forward pass: the first batch, cut to the rows the memory planner
    allows for a forward under ``memory_budget``, timed once after a one-row warm-up.

    ``idle``: the rate of this machine when nothing else runs. On a CPU that is the CPU time of the thread that
    runs the forward (``time.thread_time``): other processes' load stretches the clock, not the time this thread
    computes (torch's pool threads share the work, and the calling thread works and waits beside them, as long as
    the whole forward on an idle machine); on a GPU the clock (its thread may sleep while the device works)."""
    device = next(model.parameters()).device
    batch = batches[0]
    plan = plan_for(model, memory_budget, device)
    piece = split_batch(batch, plan.rows("forward", int(batch["input_ids"].shape[1]), len(batch["input_ids"])))[0]
    inputs = {k: v.to(device) for k, v in model_inputs(piece).items()}
    with autocast(device):
        model(**{k: v[:1] for k, v in inputs.items()})   # warm-up: first-call allocations are not the rate
        synchronise(device)
        start, computed = time.perf_counter(), time.thread_time()
        model(**inputs)
        synchronise(device)
        seconds, computed = time.perf_counter() - start, time.thread_time() - computed
    rows, length = inputs["input_ids"].shape
    timed = f"{seconds:.2f} s"
    if idle and device.type == "cpu" and computed < seconds:
        timed, seconds = f"{computed:.2f} s of CPU ({seconds:.2f} s on the busy clock)", computed
    return seconds / max(rows * length, 1), f"one forward of {rows} rows × {length} tokens: {timed}"


@dataclass(frozen=True)
class LiveSize:
    """How many evaluation rows a live click re-evaluates, in batches of how many rows (``live_size``)."""

    rows: int
    batch_rows: int
    seconds_per_row: float   # a full forward of one row at the measured rate
    shrunk: bool             # whether the rule took fewer rows or smaller batches than it was given

    def note(self, of_rows: int, basis: str) -> str:
        """The sentence a page shows: what was chosen, why, and how to get all rows."""
        if not self.shrunk:
            return ""
        click = self.rows * self.seconds_per_row
        # past the limit only when the fewest rows worth a number already take longer ("about 16 s here (at most
        # 15 s" contradicted itself)
        limit = (f"at most {LIVE_CLICK_SECONDS:.0f} s" if click <= LIVE_CLICK_SECONDS else
                 f"the fewest rows worth a number, {MIN_LIVE_ROWS}, even past {LIVE_CLICK_SECONDS:.0f} s")
        return (f"Live numbers use {self.rows} of the {of_rows} evaluation rows, {self.batch_rows} a batch: chosen "
                f"so a click's exact number takes {human_duration(click)} here ({limit}; {basis}). Set the "
                "evaluation examples on Model & data for more.")


def live_size(seconds_per_token: float, tokens_per_row: float, n_rows: int, batch_rows: int,
              click_seconds: float | None = None, first_seconds: float | None = None) -> LiveSize:
    """The module doc's rule: all ``n_rows`` when a full pass over them fits ``click_seconds``, else as many as fit
    (at least ``MIN_LIVE_ROWS``, at most ``n_rows``); ``batch_rows`` a batch when one fits ``first_seconds``, else
    as many as fit (at least ``MIN_BATCH_ROWS``). None: ``LIVE_CLICK_SECONDS`` / ``LIVE_FIRST_SECONDS`` (read at
    the call)."""
    click_seconds = LIVE_CLICK_SECONDS if click_seconds is None else click_seconds
    first_seconds = LIVE_FIRST_SECONDS if first_seconds is None else first_seconds
    per_row = max(seconds_per_token * tokens_per_row, 1e-12)
    rows = n_rows if per_row * n_rows <= click_seconds else \
        min(n_rows, max(MIN_LIVE_ROWS, int(click_seconds // per_row)))
    batch = batch_rows if per_row * batch_rows <= first_seconds else \
        max(min(MIN_BATCH_ROWS, batch_rows), int(first_seconds // per_row))
    batch = min(batch, max(rows, 1))
    return LiveSize(rows, batch, per_row, rows < n_rows or batch < batch_rows)


RATE_ROWS = 4   # rows of the first evaluation batch ``measure_live_size`` times (a big model: about a second)


def measure_live_size(model, eval_batches: list[dict], batch_rows: int) -> tuple[LiveSize, str]:
    """``live_size`` at this machine's idle rate (``forward_rate(idle=True)``: on a CPU the forward's own CPU time,
    which a busy server does not stretch; issue 45 item 3: the clock shrank a split to 22 of 500 rows on a loaded
    machine): a forward of ``RATE_ROWS`` rows of the first batch timed three times, the fastest kept (a fresh
    process's first calls are not the machine's rate), tokens per row counted with padding (what a pass computes);
    (size, what was timed). The demos are never sized by a timing (``dashboard/store.py``)."""
    first = eval_batches[0]
    piece = {k: v[:RATE_ROWS] if torch.is_tensor(v) else v for k, v in first.items()}
    seconds_per_token, basis = min(forward_rate(model, [piece], idle=True) for _ in range(3))
    n_rows = sum(len(b["input_ids"]) for b in eval_batches)
    return live_size(seconds_per_token, tokens(eval_batches) / max(n_rows, 1), n_rows, batch_rows), basis


def _rate(model, batches, rate, memory_budget):
    return rate if rate is not None else forward_rate(model, batches, memory_budget)


def scoring_work(ctx: ScoringContext, names: list[str], params_by_name: dict | None = None) -> float:
    """Forward passes over the calibration set that scoring ``names`` on ``ctx`` costs: each criterion's
    ``work``, criteria sharing one pass (``shares_pass``) counted once, at the dearest of them."""
    params_by_name = params_by_name or {}
    shared, alone = 0.0, 0.0
    for name in names:
        crit = get(name)
        work = crit.work(ctx, crit.resolve_params(params_by_name.get(name)))
        if crit.shares_pass:
            shared = max(shared, work)
        else:
            alone += work
    return shared + alone


def selection_work(ctx: ScoringContext, names: list[str], params_by_name: dict | None = None) -> float:
    """Forward passes over the selection batches (``ctx.selection``) that scoring ``names`` costs beyond
    ``scoring_work``: each criterion's ``selection_work`` (SAP's k sweep, candidate filtering)."""
    params_by_name = params_by_name or {}
    return sum(get(name).selection_work(ctx, get(name).resolve_params(params_by_name.get(name))) for name in names)


def scoring_tokens(ctx: ScoringContext, names: list[str], params_by_name: dict | None = None) -> float:
    """Token-passes of scoring ``names`` on ``ctx``: N_calib · W plus N_select · W_select (module doc)."""
    return tokens(ctx.calib) * scoring_work(ctx, names, params_by_name) + \
        tokens(ctx.selection) * selection_work(ctx, names, params_by_name)


def estimate_scoring(ctx: ScoringContext, names: list[str], params_by_name: dict | None = None,
                     rate: tuple[float, str] | None = None) -> TimeEstimate:
    """Expected duration of scoring ``names`` on ``ctx`` (module doc); ``rate`` reuses a ``forward_rate``."""
    per_token, basis = _rate(ctx.model, ctx.calib, rate, ctx.memory_budget)
    seconds = per_token * scoring_tokens(ctx, names, params_by_name)
    return TimeEstimate(seconds, f"{', '.join(names)} on this model", device_name(ctx.model), basis)


def estimate_evaluation(model, batches: list[dict], what: str = "evaluation",
                        rate: tuple[float, str] | None = None,
                        memory_budget: int | str | None = None) -> TimeEstimate:
    """Expected duration of one full pass over ``batches`` (an evaluation, a live evaluator's warm-up)."""
    per_token, basis = _rate(model, batches, rate, memory_budget)
    return TimeEstimate(per_token * tokens(batches), what, device_name(model), basis)


def trajectory_steps(spec: TrajectorySpec, n_units: int, already: int = 0) -> int:
    return math.ceil(max(spec.target(n_units, already) - already, 0) / spec.step)


def estimate_trajectory(spec: TrajectorySpec, model, calib: list[dict], eval_batches: list[dict], seeds: int = 1,
                        evaluator: bool = False, rate: tuple[float, str] | None = None,
                        memory_budget: int | str | None = None, select: list[dict] | None = None) -> TimeEstimate:
    """Expected duration of ``seeds`` trajectories of ``spec`` (module doc); ``evaluator``: a first pass over the
    evaluation batches exists already (shared), so it is not counted; ``select``: the selection batches the
    criterion's choices are made on (None: the calibration batches, as ``run_trajectory``)."""
    per_token, basis = _rate(model, calib or eval_batches, rate, memory_budget)
    ctx = ScoringContext(model, calib, memory_budget=memory_budget, select=select)
    rows, heads = adapt(model).grid_shape
    steps = trajectory_steps(spec, rows * heads, int((~adapt(model).live_grid()).sum()))
    scoring = per_token * scoring_tokens(ctx, [spec.criterion.name], {spec.criterion.name: dict(spec.params)}) \
        * (max(steps, 1) / 2 if spec.criterion.dynamic else 1)
    evaluation = per_token * tokens(eval_batches) * (LIVE_STEP * steps * (2 if spec.stability else 1))
    first = 0.0 if evaluator else per_token * tokens(eval_batches)
    seconds = first + seeds * (scoring + evaluation)
    return TimeEstimate(seconds, f"trajectory of {spec.criterion.name} ({steps} steps)", device_name(model), basis)


def estimate_harness(model, tokenizer, tasks: Tasks, batches: list[dict], rate: tuple[float, str] | None = None,
                     memory_budget: int | str | None = None) -> TimeEstimate:
    """Expected duration of an lm-eval run of ``tasks`` on ``model`` (module doc): the rate timed on ``batches``
    (any batches of this model), times the tokens of the requests the tasks will score."""
    per_token, basis = _rate(model, batches, rate, memory_budget)
    n_requests, n_tokens = count_requests(tasks, tokenizer)
    return TimeEstimate(per_token * n_tokens, f"lm-eval {', '.join(tasks.spec.tasks)} ({n_requests} requests)",
                        device_name(model), basis)


def estimate_role_ablation(model, eval_batches: list[dict], seeds: int = 10, evaluator: bool = True,
                           rate: tuple[float, str] | None = None,
                           memory_budget: int | str | None = None) -> TimeEstimate:
    """Expected duration of ``roles.role_ablation`` (module doc): the role's set and ``seeds`` random sets, one pass
    each over the evaluation batches; ``evaluator``: the session's live evaluator exists (else its first pass is
    counted too)."""
    per_token, basis = _rate(model, eval_batches, rate, memory_budget)
    passes = seeds + 1 + (0 if evaluator else 1)
    return TimeEstimate(per_token * tokens(eval_batches) * passes, f"the role and {seeds} random sets",
                        device_name(model), basis)
