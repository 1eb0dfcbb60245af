"""Process-wide state shared by every browser session: loaded models, workspaces and computed results.

* models: ``st.cache_resource`` per (spec, device). A cached model is never gated, hooked or changed: every
  computation runs on ``Workspace.private_model()`` (a structural copy), so sessions need no lock to read it;
* a keyed LRU ``ResultStore`` for workspaces, score maps, dependency arcs and trajectories. A score is keyed by
  workspace + criterion + parameters + mask. (Streamlit's ``st.cache_data`` would replay progress bars drawn
  inside the cached function; the store lets long computations report progress and still be computed once.)
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from headprune.data import ROLES, parse_label_map
from headprune.estimate import measure_live_size
from headprune.model.loading import NAMED_MODELS, LoadedModel, load_model
from headprune.model.mask import HeadMask
from headprune.model.sizes import parameter_counts
from headprune.workspace import DefaultSize, Workspace

from .config import Setup
from .threads import compute_slot

Progress = Callable[[float, str], None]


@dataclass
class DashboardWorkspace(Workspace):
    """The library ``Workspace`` plus the dashboard ``Setup`` it was built from and its parameter counts."""

    setup: Setup | None = None
    counts: dict | None = None

    @property
    def key(self) -> str:
        return self.setup.key

    def role_rows(self) -> list[dict]:
        """One row per data role for a table: role, source, split, size, seed and the head of its content hash."""
        return [{"role": ROLES[role], "source": info["source"], "split": info["split"] or "", "rows": info["size"],
                 "seed": info["seed"], "content hash": info["hash"][:16]} for role, info in self.roles().items()]

    def mapping_line(self) -> str | None:
        """How the evaluation data's labels were matched to the model's ids, in words (None for LM data)."""
        match = self.label_mapping()
        if not match or match["by"] == "regression":
            return None
        names = self.dataset.label_names or []
        how = {"names": "by name", "ids": "as ids (integer labels)", "position": "by position (confirmed)",
               "map": "by the label map"}[match["by"]]
        pairs = ", ".join(f"{k} → {i} ({names[i] if i < len(names) else i})" for k, i in match["mapping"].items())
        return f"Labels matched {how}: {pairs}"


class ResultStore:
    """Thread-safe LRU of computed results by string key; one computation per key at a time."""

    def __init__(self, max_entries: int = 128):
        self._items: OrderedDict[str, object] = OrderedDict()
        self._lock = threading.Lock()
        self._computing: dict[str, threading.Lock] = {}
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
        """The stored value of ``key``, else ``compute()`` stored; sessions asking at once compute it once."""
        value = self.get(key)
        if value is not None:
            return value
        with self._lock:
            key_lock = self._computing.setdefault(key, threading.Lock())
        try:
            with key_lock:
                value = self.get(key)
                if value is None:
                    value = compute()
                    self.put(key, value)
        finally:
            with self._lock:
                self._computing.pop(key, None)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()


@st.cache_resource(show_spinner=False)
def store() -> ResultStore:
    return ResultStore()


@st.cache_resource(show_spinner=False, max_entries=3)
def cached_model(spec: str, device: str, device_map: str | None = None, dtype: str | None = None) -> LoadedModel:
    return load_model(spec, device, device_map=device_map, dtype=dtype)


def mask_key(mask: HeadMask | None) -> str:
    return "dense" if mask is None or mask.n_pruned == 0 else json.dumps(mask.to_json()["pruned"], sort_keys=True)


def params_key(params: dict | None) -> str:
    return json.dumps(params or {}, sort_keys=True, default=str)


def workspace_of(setup: Setup) -> DashboardWorkspace | None:
    """The workspace of ``setup`` if it is loaded already."""
    return store().get(f"ws|{setup.key}")


def build_workspace(setup: Setup, progress: Progress | None = None) -> DashboardWorkspace:
    """Load (or fetch from the store) the workspace of ``setup``; HeadpruneError on any bad input."""
    report = progress or (lambda f, m: None)

    def build() -> DashboardWorkspace:
        label_map = parse_label_map(setup.label_map) if setup.label_map else None   # refused before any loading
        if setup.model in NAMED_MODELS:  # a demo: built once, with its progress shown here
            report(0.02, f"{setup.model} model (built once, a few minutes the very first time)")
            NAMED_MODELS[setup.model].build(
                progress=lambda f, m: report(0.02 + 0.5 * f, f"building the {setup.model} model: {m}"))
        report(0.55, f"loading model {setup.model}")
        loaded = cached_model(setup.model, setup.device, setup.device_map, setup.dtype)
        ws = DashboardWorkspace.build(
            setup.model, setup.data, calib_data=setup.calib_data, select_data=setup.select_data,
            eval_data=setup.eval_data, text_col=setup.text_col, pair_col=setup.pair_col, label_col=setup.label_col,
            calib_size=setup.calib_size, eval_size=setup.eval_size, select_size=setup.select_size,
            label_map=label_map,
            labels_by_position=setup.labels_by_position, allow_untrained_head=setup.allow_untrained_head,
            max_length=setup.max_length, batch_size=setup.batch_size, seed=setup.seed, loaded=loaded,
            progress=lambda f, m: report(0.6 + 0.1 * f, f"{setup.data_label}: {m}"))
        ws = sized_for_clicks(ws, setup)
        ws.setup, ws.counts = setup, parameter_counts(loaded.model)
        with compute_slot():
            ws.dense(progress=lambda f, m: report(0.7 + 0.3 * f, f"evaluating the model as loaded: {m}"))
        report(1.0, "ready")
        return ws

    return store().memo(f"ws|{setup.key}", build)


def sized_for_clicks(ws: DashboardWorkspace, setup: Setup) -> DashboardWorkspace:
    """``ws`` evaluating on what a click re-evaluates.

    * A demo: its split, as the setup sizes it, in batches of ``batch_size`` -- fixed by the demo, never by a timing:
      the same demo shows the same numbers on any server, however loaded (issue 45 item 3: a start-up timing on a
      busy server shrank the demo to 22 of its 500 rows, and its dense number with it).
    * Another model: what a click can re-evaluate in time on this machine when it is idle
      (``estimate.measure_live_size``): a default evaluation size shrinks to the rows a full pass covers in
      ``estimate.LIVE_CLICK_SECONDS``, batches to what one forward covers in ``LIVE_FIRST_SECONDS``; a size the user
      chose is kept (its batches may still shrink).
    * ``setup.live_rows`` (a link's or a lesson's ``rows``): the first that many rows of the split, on any model --
      the rows the linked screen measured its numbers on (all of them when the split has fewer; the link's notice
      says so, ``urlstate.apply``)."""
    if not ws.eval_batches:
        return ws
    if setup.model in NAMED_MODELS:
        rows, batch_rows, note = len(ws.eval), ws.batch_size, ""
    else:
        with compute_slot():
            size, basis = measure_live_size(ws.loaded.model, ws.eval_batches, ws.batch_size)
        rows = size.rows if isinstance(setup.eval_size, DefaultSize) else len(ws.eval)
        batch_rows, note = size.batch_rows, size.note(len(ws.eval), basis)
    if setup.live_rows is not None:
        rows = min(setup.live_rows, len(ws.eval))
        note = "" if rows == len(ws.eval) else (
            f"Live numbers use {rows} of the {len(ws.eval)} evaluation rows, {min(batch_rows, rows)} a batch: the "
            "rows the link names, so that it shows the same numbers on any server.")
    return ws.with_eval_rows(rows, batch_rows, note)


def save_upload(name: str, data: bytes) -> str:
    """Write an uploaded file under a content-addressed temp folder (same bytes -> same path -> same cache key)."""
    digest = hashlib.sha1(data).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "headprune-uploads" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(name).name
    if not path.exists():
        path.write_bytes(data)
    return str(path)
