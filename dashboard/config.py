"""What the dashboard loads: the ``Setup`` (model, data and its roles, columns, split sizes, device) of each
browser session.

Start-up defaults come from the environment (HEADPRUNE_MODEL, HEADPRUNE_DATA, HEADPRUNE_CALIB_SIZE,
HEADPRUNE_EVAL_SIZE, HEADPRUNE_SELECT_SIZE, HEADPRUNE_MAX_LENGTH) or else the demo. Split sizes the user has not
changed are ``workspace.DefaultSize``: they shrink to fit small data by the same rule as the CLI. The data roles
(``calib_data``, ``select_data``, ``eval_data``: None = the rows of ``data``) are part of the workspace key.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import streamlit as st

from headprune.data import NAMED_DATA
from headprune.model.loading import NAMED_MODELS
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


# -- shareable views: the URL query string ------------------------------------------------------------------------
# ?model=demo&data=demo&page=prune&criteria=ae,his&ratio=0.5&mask=0.3,2.5&head=1.4
# model and data may only name the registered demos (or what HEADPRUNE_MODEL / HEADPRUNE_DATA started the server
# on): a link never names a file or a hub id. mask lists pruned heads as layer.head; head is the selected one.
LINK_KEYS = ("model", "data", "page", "criteria", "ratio", "mask", "head")


@dataclass
class Link:
    """What a query string asks for, checked; ``problems`` says what was refused and what is accepted."""

    model: str | None = None
    data: str | None = None
    page: str | None = None
    criteria: list[str] | None = None
    ratio: float | None = None
    pruned: list[tuple[int, int]] | None = None
    head: tuple[int, int] | None = None
    problems: list[str] = field(default_factory=list)


def _heads(text: str) -> list[tuple[int, int]]:
    heads = []
    for item in filter(None, text.split(",")):
        layer, dot, head = item.partition(".")
        if not dot or not layer.isdigit() or not head.isdigit():
            raise ValueError(item)
        heads.append((int(layer), int(head)))
    return heads


def parse_link(params: dict, models: list[str], data: list[str], pages: list[str], criteria: list[str]) -> Link:
    """The ``Link`` a query string (``st.query_params``) asks for; values outside the accepted ones are dropped
    with a message naming them (``models``/``data``: the names a link may load; ``pages``: url paths)."""
    link = Link()

    def choose(key: str, accepted: list[str]):
        value = params.get(key)
        if value is None:
            return None
        if value not in accepted:
            link.problems.append(f"{key}={value!r} is not one of: {', '.join(accepted)}.")
            return None
        return value

    link.model, link.data, link.page = choose("model", models), choose("data", data), choose("page", pages)
    if params.get("criteria"):
        names = [n for n in params["criteria"].split(",") if n]
        unknown = [n for n in names if n not in criteria]
        if unknown:
            link.problems.append(f"criteria {', '.join(unknown)} unknown; known: {', '.join(criteria)}.")
        link.criteria = [n for n in names if n in criteria] or None
    if params.get("ratio") is not None:
        try:
            link.ratio = float(params["ratio"])
            if not 0 <= link.ratio <= 1:
                raise ValueError
        except ValueError:
            link.problems.append(f"ratio={params['ratio']!r} must be a number in [0, 1].")
            link.ratio = None
    for key in ("mask", "head"):
        if params.get(key) is None:
            continue
        try:
            heads = _heads(params[key])
            if key == "head" and len(heads) != 1:
                raise ValueError(params[key])
        except ValueError:
            link.problems.append(f"{key}={params[key]!r}: expected heads as layer.head"
                                 f"{', comma-separated (e.g. 0.3,2.5)' if key == 'mask' else ' (e.g. 1.4)'}.")
            continue
        if key == "mask":
            link.pruned = heads
        else:
            link.head = heads[0]
    return link


def link_models() -> list[str]:
    """Model names a link may load: the registered demos, and the model this server was started on."""
    return sorted(set(NAMED_MODELS) | {Setup().model})


def link_data() -> list[str]:
    return sorted(set(NAMED_DATA) | {Setup().data})


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
