"""What the dashboard loads: the ``Setup`` (model, data and its roles, columns, split sizes, device) of each
browser session.

Start-up defaults come from the environment (HEADPRUNE_MODEL, HEADPRUNE_DATA, HEADPRUNE_CALIB_SIZE,
HEADPRUNE_EVAL_SIZE, HEADPRUNE_SELECT_SIZE, HEADPRUNE_MAX_LENGTH) or else the demo. A demo evaluates on its split
as set here (HEADPRUNE_EVAL_SIZE: a classroom's smaller one), never on a size timed at start-up. Split sizes the
user has not changed are ``workspace.DefaultSize``: they shrink to fit small data by the same rule as the CLI. The
data roles (``calib_data``, ``select_data``, ``eval_data``: None = the rows of ``data``) are part of the workspace
key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import streamlit as st

from headprune.data import NAMED_DATA
from headprune.model.memory import parse_budget
from headprune.workspace import DEFAULT_CALIB_SIZE, DEFAULT_EVAL_SIZE, DEFAULT_SELECT_SIZE, DefaultSize


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
    calib_size: int = field(default_factory=lambda: DefaultSize(_env_int("HEADPRUNE_CALIB_SIZE", DEFAULT_CALIB_SIZE)))
    eval_size: int = field(default_factory=lambda: DefaultSize(_env_int("HEADPRUNE_EVAL_SIZE", DEFAULT_EVAL_SIZE)))
    max_length: int = field(default_factory=lambda: _env_int("HEADPRUNE_MAX_LENGTH", 128))
    batch_size: int = 32
    seed: int = 0
    device: str = "auto"
    # accelerate placement ("auto" or a JSON map {module: device}; None: all on ``device``) and weight dtype
    # ("fp32" | "bf16" | "fp16"; None: the checkpoint's own), as ``headprune.models.load_model`` takes them
    device_map: str | None = None
    dtype: str | None = None
    # data roles (``Workspace.build``): each a data spec, None = rows of ``data``; the selection size; how labels
    # the model names only by position are matched (a JSON label map, or by position); an untrained head accepted
    calib_data: str | None = None
    select_data: str | None = None
    eval_data: str | None = None
    select_size: int = field(
        default_factory=lambda: DefaultSize(_env_int("HEADPRUNE_SELECT_SIZE", DEFAULT_SELECT_SIZE)))
    label_map: str | None = None
    labels_by_position: bool = False
    allow_untrained_head: bool = False
    # the evaluation rows a link (or a lesson) names: the first ``live_rows`` rows of the evaluation split, so a
    # link shows the same numbers on any server (dashboard/store.py sized_for_clicks); None: a demo's whole split,
    # another model's rows a click re-evaluates in time here
    live_rows: int | None = None

    @property
    def key(self) -> str:
        # a default size and the same size chosen by hand can split differently (only one may shrink)
        chosen = [not isinstance(size, DefaultSize) for size in (self.calib_size, self.eval_size, self.select_size)]
        text = json.dumps([asdict(self), chosen], sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def size_choice(value: int, current: int) -> int:
    """A split size from a number input: the current one (keeping it a ``DefaultSize``) when left unchanged."""
    return current if int(value) == int(current) else int(value)


# The "?" beside each page's title links to its part of the manual, served offline by `headprune docs` (port 8000
# by default); HEADPRUNE_DOCS_URL points the links elsewhere (another port, a shared server). tests/test_docs_site.py
# checks that every target below exists in the built site.
DOCS_URL = "http://localhost:8000/"
HELP_PAGES = {   # page title -> its page (and section) of the manual
    "headprune": "tutorials/dashboard/",
    "Model & data": "tutorials/dashboard/#model-data",
    "Head scores": "tutorials/dashboard/#head-scores",
    "Roles": "tutorials/dashboard/#roles",
    "Attention": "tutorials/dashboard/#attention",
    "Prune": "tutorials/dashboard/#prune",
    "Recover": "tutorials/dashboard/#recover",
    "Trajectories": "tutorials/dashboard/#trajectories",
    "Export": "tutorials/dashboard/#export",
    "KV cache": "tutorials/dashboard/#kv-cache",
    "Protocol runs": "tutorials/dashboard/#protocol-runs",
    "Lessons": "tutorials/lessons/",
    "Every head at a glance": "tutorials/dashboard/#every-head-at-a-glance",
    "What the pruned model says": "tutorials/dashboard/#what-the-pruned-model-says",
    "Glossary": "tutorials/dashboard/#glossary",
}


def help_url(title: str) -> str:
    """The manual's address for the page titled ``title`` (the manual's home for a page it does not list)."""
    base = os.environ.get("HEADPRUNE_DOCS_URL") or DOCS_URL
    return base.rstrip("/") + "/" + HELP_PAGES.get(title, "")


def current_setup() -> Setup:
    """This browser session's Setup (the start-up defaults on first use)."""
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
    return replace(base, model="demo", data="demo", data_label="demo", text_col=None, pair_col=None, label_col=None,
                   calib_data=None, select_data=None, eval_data=None, label_map=None, labels_by_position=False,
                   allow_untrained_head=False)


SAME_DATA = "(the data above)"
OTHER_DATA = "(a file path or hf:NAME[:CONFIG[:SPLIT]])"


def role_sources(model: str) -> list[str]:
    """The choices a data role is offered: the data above, the named data sets that fit ``model`` (a demo's own
    held-out rows and its training split; else the classifier demo's), then any spec typed in."""
    base = model if model in NAMED_DATA else "demo"
    return [SAME_DATA] + [name for name in (base, f"{base}:train") if name in NAMED_DATA] + [OTHER_DATA]


# -- the session's memory budget (not part of the Setup: changing it reloads nothing, and results do not depend on it)

def memory_budget() -> str | None:
    """This session's memory budget as typed on Model & data ("4GB", "25%"), or None for the planner's default
    (``headprune.model.memory.DEFAULT_SHARE`` of the free memory)."""
    return st.session_state.get("hp_memory_budget")


def use_memory_budget(text: str | None) -> None:
    """Keep ``text`` as this session's memory budget once it reads as one (``MemoryBudgetError`` otherwise); empty
    text restores the default."""
    text = (text or "").strip() or None
    parse_budget(text)
    st.session_state["hp_memory_budget"] = text
