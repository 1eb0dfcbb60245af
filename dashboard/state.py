"""What the dashboard has loaded, what each session is doing, and the cached computations behind the pages.

Process-wide (shared by every browser session, never mutated):
    * models: ``st.cache_resource`` per (spec, device) -- the cached original is only ever gated by hooks under
      ``model_lock`` or copied (LiveEvaluator's structural copy, surgery's deep copy), never changed;
    * a keyed LRU ``ResultStore`` for workspaces (data + batches + dense metrics), score maps, dependency arcs
      and syntactic profiles. A score is keyed by model + data + criterion + parameters + mask.
      (Streamlit's ``st.cache_data`` would replay progress bars drawn inside the cached function; the store
      lets long computations report progress and still be computed once.)
Per session (``st.session_state``, survives page switches and reruns): ``SessionData`` -- the current mask and
its undo history, the selected head, computed scores, trajectories, the live evaluator. It is tied to the
workspace key and starts afresh when another model or data set is loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import streamlit as st

from headprune.criteria import ScoreMap, ScoringContext
from headprune.data import TextDataset, align_labels, batch_texts, load_data, make_batches, split_calib_eval
from headprune.evaluate import Metrics, evaluate
from headprune.mask import HeadMask
from headprune.models import LoadedModel, load_model
from headprune.surgery import parameter_counts

Progress = Callable[[float, str], None]


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


@dataclass(frozen=True)
class Setup:
    """Everything that decides what is loaded; its ``key`` names a workspace."""

    # start-up defaults: the demo, unless HEADPRUNE_MODEL / HEADPRUNE_DATA name another model or data set
    model: str = field(default_factory=lambda: os.environ.get("HEADPRUNE_MODEL") or "demo")
    data: str = field(default_factory=lambda: os.environ.get("HEADPRUNE_DATA") or "demo")
    data_label: str = field(default_factory=lambda: Path(os.environ.get("HEADPRUNE_DATA") or "demo").name)
    text_col: str | None = None
    pair_col: str | None = None
    label_col: str | None = None
    calib_size: int = field(default_factory=lambda: _env_int("HEADPRUNE_CALIB_SIZE", 128))
    eval_size: int = field(default_factory=lambda: _env_int("HEADPRUNE_EVAL_SIZE", 500))
    max_length: int = field(default_factory=lambda: _env_int("HEADPRUNE_MAX_LENGTH", 128))
    batch_size: int = 32
    seed: int = 0
    device: str = "auto"

    @property
    def key(self) -> str:
        return hashlib.sha1(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Workspace:
    """A loaded model with its data split, batches and dense metrics (shared, read-only)."""

    setup: Setup
    loaded: LoadedModel
    dataset: TextDataset
    calib: TextDataset
    eval: TextDataset
    calib_batches: list[dict]
    eval_batches: list[dict]
    dense: Metrics
    counts: dict

    @property
    def key(self) -> str:
        return self.setup.key

    @property
    def adapter(self):
        return self.loaded.adapter

    @property
    def shape(self) -> tuple[int, int]:
        return self.adapter.grid_shape

    @property
    def tied(self) -> bool:
        return self.adapter.tied

    @property
    def metric(self) -> str:
        """The headline metric: accuracy for classifiers, Pearson r for a regression head."""
        return "accuracy" if self.dense.accuracy is not None else "pearson"

    def metric_of(self, metrics: Metrics | dict) -> float:
        values = metrics if isinstance(metrics, dict) else metrics.to_dict()
        return float(values[self.metric])

    def calib_texts(self) -> list[str]:
        return [t for rows in batch_texts(self.calib, self.calib_batches) for t in rows]

    def context(self, mask: HeadMask | None, progress: Progress | None = None) -> ScoringContext:
        return ScoringContext(self.loaded.model, self.calib_batches, mask, self.loaded.device, self.loaded.tokenizer,
                              self.calib_texts(), seed=self.setup.seed, progress=progress)


# -- process-wide caches ------------------------------------------------------------------------------------------

class ResultStore:
    """Thread-safe LRU of computed results by string key."""

    def __init__(self, max_entries: int = 128):
        self._items: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()
        self.max_entries = max_entries

    def get(self, key: str):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        return None

    def put(self, key: str, value) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.max_entries:
                self._items.popitem(last=False)

    def memo(self, key: str, compute: Callable[[], object]):
        value = self.get(key)
        if value is None:
            value = compute()
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@st.cache_resource(show_spinner=False)
def store() -> ResultStore:
    return ResultStore()


@st.cache_resource(show_spinner=False)
def _locks() -> dict:
    return {}


def model_lock(setup: Setup) -> threading.RLock:
    """One lock per cached model: gating hooks on a shared model must not interleave between sessions."""
    return _locks().setdefault((setup.model, setup.device), threading.RLock())


@st.cache_resource(show_spinner=False, max_entries=3)
def cached_model(spec: str, device: str) -> LoadedModel:
    return load_model(spec, device)


def mask_key(mask: HeadMask | None) -> str:
    return "dense" if mask is None or mask.n_pruned == 0 else json.dumps(mask.to_json()["pruned"], sort_keys=True)


def build_workspace(setup: Setup, progress: Progress | None = None) -> Workspace:
    """Load (or fetch from the store) the workspace of ``setup``; HeadpruneError on any bad input."""
    cached = store().get(f"ws|{setup.key}")
    if cached is not None:
        return cached
    report = progress or (lambda f, m: None)
    if setup.model == "demo":
        from headprune.demo import ensure_demo_model

        report(0.02, "demo model (built once, a few minutes the very first time)")
        ensure_demo_model(progress=lambda f, m: report(0.02 + 0.5 * f, f"building the demo model: {m}"))
    report(0.55, f"loading model {setup.model}")
    loaded = cached_model(setup.model, setup.device)
    report(0.6, f"reading data {setup.data_label}")
    ds = align_labels(load_data(setup.data, setup.text_col, setup.pair_col, setup.label_col), loaded.id2label)
    calib, evals = split_calib_eval(ds, setup.calib_size, setup.eval_size, setup.seed)
    if len(evals) == 0:
        from headprune.errors import DataError

        raise DataError("The evaluation split is empty: choose an evaluation size of at least 1.")
    report(0.65, "tokenizing")
    calib_batches = make_batches(loaded.tokenizer, calib, setup.batch_size, setup.max_length) if len(calib) else []
    eval_batches = make_batches(loaded.tokenizer, evals, setup.batch_size, setup.max_length)
    with model_lock(setup):
        dense = evaluate(loaded.model, eval_batches,
                         progress=lambda f, m: report(0.7 + 0.3 * f, f"dense evaluation: {m}"))
    ws = Workspace(setup, loaded, ds, calib, evals, calib_batches, eval_batches, dense, parameter_counts(loaded.model))
    store().put(f"ws|{setup.key}", ws)
    report(1.0, "ready")
    return ws


def save_upload(name: str, data: bytes) -> str:
    """Write an uploaded file under a content-addressed temp folder (same bytes -> same path -> same cache key)."""
    digest = hashlib.sha1(data).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "headprune-uploads" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(name).name
    if not path.exists():
        path.write_bytes(data)
    return str(path)


# -- per-session state ----------------------------------------------------------------------------------------------

@dataclass
class SessionData:
    key: str
    mask: HeadMask
    history: list = field(default_factory=list)          # earlier masks, for undo
    head: tuple[int, int] | None = None                   # the selected head (layer/block, head)
    scores: dict = field(default_factory=dict)            # criterion -> ScoreMap (last computed set)
    params: dict = field(default_factory=dict)            # criterion -> parameters as entered
    trajectories: list = field(default_factory=list)
    spreads: list = field(default_factory=list)
    tolerance: float | None = None
    live: object | None = None                            # LiveEvaluator on the evaluation batches
    live_stable: object | None = None                     # LiveEvaluator on perturbed batches (stability)
    grid_version: int = 0                                 # bumped to reset a clickable grid's selection
    exports: dict = field(default_factory=dict)           # built downloads (PNG bytes, pruned-model zip) by key
    last_change: str = ""

    def set_mask(self, mask: HeadMask, what: str = "") -> None:
        if mask != self.mask:
            self.history.append(self.mask)
            self.mask = mask
            self.last_change = what
        self.grid_version += 1

    def undo(self) -> None:
        if self.history:
            self.mask = self.history.pop()
            self.last_change = "undo"
        self.grid_version += 1

    def reset(self) -> None:
        self.set_mask(HeadMask.ones(self.mask.shape), "reset")


def session(ws: Workspace) -> SessionData:
    """This browser session's data for ``ws`` (fresh when the workspace changed)."""
    sd = st.session_state.get("hp_session")
    if sd is None or sd.key != ws.key:
        sd = SessionData(ws.key, HeadMask.ones(ws.shape))
        st.session_state["hp_session"] = sd
    return sd


def current_setup() -> Setup:
    setup = st.session_state.get("hp_setup")
    if setup is None:
        setup = Setup()
        st.session_state["hp_setup"] = setup
    return setup


def use_setup(setup: Setup) -> None:
    st.session_state["hp_setup"] = setup


def demo_setup(current: Setup | None = None) -> Setup:
    """The demo model and data, keeping the sizes, seed and device already chosen."""
    base = current or Setup()
    return replace(base, model="demo", data="demo", data_label="demo", text_col=None, pair_col=None, label_col=None)


# -- cached computations ----------------------------------------------------------------------------------------------

def params_key(params: dict | None) -> str:
    return json.dumps(params or {}, sort_keys=True, default=str)


def compute_scores(ws: Workspace, names: list[str], params: dict[str, dict], mask: HeadMask | None,
                   progress: Progress | None = None) -> dict[str, ScoreMap]:
    """Score maps of ``names`` under ``mask``: from the store when known, the rest in one shared pass."""
    from headprune.criteria.onepass import score_many

    def key(name):
        return f"score|{ws.key}|{name}|{params_key(params.get(name))}|{mask_key(mask)}"

    out = {name: store().get(key(name)) for name in names}
    missing = [n for n in names if out[n] is None]
    if missing:
        if not ws.calib_batches:
            from headprune.errors import DataError

            raise DataError("Scoring needs calibration examples: set a calibration size of at least 1 "
                            "on the Model & data page.")
        with model_lock(ws.setup):
            fresh = score_many(missing, ws.context(mask, progress), {n: params.get(n) or {} for n in missing})
        for name, score in fresh.items():
            store().put(key(name), score)
            out[name] = score
    return out


def run_trajectories(ws: Workspace, names: list[str], params: dict[str, dict], inverse: bool, seeds: int, step: int,
                     budget: float, tolerance: float, stability: bool,
                     progress: Progress | None = None) -> tuple[list, list[dict]]:
    """Trajectories of ``names`` (and their inverse orders) plus ``seeds`` random orders, from the dense model.

    Curves run to ``budget`` without stopping early; ``tolerance`` is recorded so the stop point can be marked.
    Each run is kept in the store, so re-running the same settings is instant.
    """
    from headprune.live import structural_copy
    from headprune.stability import perturb_batches
    from headprune.trajectory import run_trajectory, spread

    report = progress or (lambda f, m: None)
    jobs = [(n, False, ws.setup.seed) for n in names] + ([(n, True, ws.setup.seed) for n in names] if inverse else [])
    jobs += [("random", False, ws.setup.seed + i) for i in range(seeds)]
    with model_lock(ws.setup):  # copy while no other session's gating hooks sit on the shared model
        model = structural_copy(ws.loaded.model)
    perturbed = None
    runs = []
    for i, (name, inv, seed) in enumerate(jobs):
        label = ("inverse " if inv else "") + name + (f" (seed {seed})" if name == "random" else "")
        key = (f"traj|{ws.key}|{name}|{params_key(params.get(name))}|{inv}|{seed}|{step}|{budget}|{stability}")

        def compute(name=name, inv=inv, seed=seed, label=label, i=i):
            nonlocal perturbed
            if stability and perturbed is None:
                perturbed = perturb_batches(ws.eval_batches, ws.loaded.tokenizer, seed=ws.setup.seed)
            return run_trajectory(model, ws.calib_batches, ws.eval_batches, name, params=params.get(name) or {},
                                  inverse=inv, step=step, budget=budget, seed=seed,
                                  stability=perturbed if stability else False, device=ws.loaded.device,
                                  tokenizer=ws.loaded.tokenizer, model_name=ws.setup.model, texts=ws.calib_texts(),
                                  data_info={"data": ws.setup.data_label, "eval_size": len(ws.eval),
                                             "calib_size": len(ws.calib), "seed": ws.setup.seed},
                                  progress=lambda f, m: report((i + f) / len(jobs), f"{label}: {m}"))

        traj = store().memo(key, compute)
        traj.tolerance = tolerance
        runs.append(traj)
        report((i + 1) / len(jobs), f"{label} done")
    randoms = [t for t in runs if t.criterion == "random"]
    spreads = [{**spread(randoms), "name": f"random ({len(randoms)} seeds)"}] if len(randoms) > 1 else []
    return runs, spreads


def parse_run_file(data: bytes, name: str) -> tuple[list, list[dict]]:
    """Trajectories (and random-seed spreads) from a run file: one trajectory, a CLI multi-seed file
    ({"runs": [...], "spread": {...}}) or this dashboard's export ({"trajectories": [...], "spreads": [...]})."""
    from headprune.trajectory import Trajectory, TrajectoryError

    accepted = ("Accepted: a run file from `python -m headprune trajectory --out FILE` or from the dashboard's "
                "download.")
    try:
        obj = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TrajectoryError(f"{name} is not UTF-8 JSON ({exc}). {accepted}") from None
    spreads: list[dict] = []
    if isinstance(obj, dict) and "trajectories" in obj:
        items, spreads = obj["trajectories"], list(obj.get("spreads") or [])
    elif isinstance(obj, dict) and "runs" in obj:
        items = obj["runs"]
        if obj.get("spread"):
            spreads = [{**obj["spread"], "name": f"{obj.get('criterion', 'random')} ({len(items)} seeds)"}]
    elif isinstance(obj, dict) and "steps" in obj:
        items = [obj]
    elif isinstance(obj, list):
        items = obj
    else:
        raise TrajectoryError(f"{name} holds no trajectories. {accepted}")
    try:
        trajs = [Trajectory.from_json(item) for item in items]
        for t in trajs:
            t.values(), t.ratios()
    except (TypeError, KeyError, ValueError, AttributeError) as exc:
        raise TrajectoryError(f"{name} is not a headprune run file ({type(exc).__name__}: {exc}). {accepted}") from None
    for s in spreads:
        if not all(k in s for k in ("ratios", "min", "q1", "median", "q3", "max")):
            raise TrajectoryError(f"{name}: a random-seed spread lacks its quartiles. {accepted}")
    return trajs, spreads


def run_file(ws: Workspace, sd: SessionData) -> dict:
    """Everything this session produced, as JSON (reopened by ``parse_run_file``)."""
    live = sd.live
    current = live.metrics().to_dict() if live is not None and live.mask == sd.mask and live.has_labels else None
    return {"headprune_run": 1, "setup": asdict(ws.setup), "arch": ws.adapter.arch, "grid": list(ws.shape),
            "dense": ws.dense.to_dict(), "mask": sd.mask.to_json(), "metrics_under_mask": current,
            "scores": {name: s.to_json() for name, s in sd.scores.items()},
            "trajectories": [t.to_json() for t in sd.trajectories], "spreads": sd.spreads}


def build_pruned_model(ws: Workspace, mask: HeadMask, progress: Progress | None = None) -> dict:
    """Cut ``mask``'s heads from a copy of the model, save it HF-style, zip it, and evaluate the cut model.

    Returns {"zip": bytes, "size": surgery.size_report, "metric": headline metric of the cut model}.
    """
    import io
    import zipfile

    from headprune.models import save_pruned
    from headprune.surgery import prune_model, size_report

    report = progress or (lambda f, m: None)
    report(0.05, "cutting heads")
    with model_lock(ws.setup):
        pruned = prune_model(ws.loaded.model, mask)
    report(0.3, "evaluating the cut model")
    metrics = evaluate(pruned, ws.eval_batches, progress=lambda f, m: report(0.3 + 0.5 * f, m))
    report(0.85, "saving")
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_pruned(pruned, ws.loaded.tokenizer, Path(tmp) / "pruned",
                             extra={"mask": mask.to_json(), "source_model": ws.setup.model,
                                    "dense": ws.dense.to_dict(), "pruned": metrics.to_dict(),
                                    "data": ws.setup.data_label})
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(folder.rglob("*")):
                if f.is_file():
                    zf.write(f, Path("headprune-pruned-model") / f.relative_to(folder))
    report(1.0, "done")
    return {"zip": buffer.getvalue(), "size": size_report(ws.loaded.model, pruned), "metric": ws.metric_of(metrics)}
