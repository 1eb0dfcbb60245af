"""The browser's address bar is the view: ``headprune.viewstate.ViewState`` bound to ``st.query_params``.

The one owner of the query string, both ways (nothing else in the dashboard reads ``st.query_params``). ``follow``
reads it on a session's first run (a shared link, a lesson step's link, or F5: a reload is a fresh session), loads
the model and data it names and records the lesson step followed; ``apply`` puts the rest (mask, head, criteria,
ratio, sentence, role letters, KV plan) on the loaded workspace and says in one warning what it
dropped; ``publish`` writes the view back at once. ``publish`` is called by every page's frame on a full run, by
each grid click's callback and at the end of every run of a fragment that changes the view (``ui.view_fragment``,
the full run's included: the one way a fragment may fill the sidebar's link slots on its own reruns):
``st.query_params`` sends its change to the browser from whatever run sets it, a fragment's included, so the
address bar never lags a click.

A link names only the registered demos (or the model / data the server was started on): never a file or hub id.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import streamlit as st

from headprune.criteria import available
from headprune.data import NAMED_DATA
from headprune.kvcache.scores import RULES
from headprune.markdown import inert
from headprune.model.loading import NAMED_MODELS
from headprune.model.mask import HeadMask
from headprune.viewstate import CONTROL, MAX_CRITERIA, MAX_SENTENCE, MAX_STEP, KVView, ViewState, ViewStateError
from headprune.viewstate import LESSON as LESSON_NAME

from .config import Setup, current_setup, use_setup
from .store import workspace_of

READ = "hp_link_read"          # session key: the query string was read (a session reads it once)
PENDING = "hp_link_params"     # session key: the link's keys, applied once a workspace is loaded
PAGE = "hp_page_url"           # session key: the url path of the page drawn last (None: Home)
SLOT = "hp_link_slot"          # session key: the sidebar's place for the link and its QR code (ui.share_box)
SHOW = "hp_link_show"          # session key: how the sidebar draws a link (ui.show_link), set by the page frame
ROLE_MARKS = "show-role-marks"  # the sidebar's role-letters toggle (its widget key)
LESSON = "hp_lesson"           # (lesson name, step from 1) of the lesson followed: ``follow`` reads it from a link
# widget keys the view reads and sets (the pages own the widgets; these are their keys)
CRITERIA, PRUNE_CRITERION = "scores-criteria", "prune-crit"
RATIOS = {"prune": "prune-ratio"}   # the page whose ratio slider a link's ratio is; others: Head scores' slider
SCORES_RATIO = "scores-ratio"
SOURCE, TYPED, TYPE_ONE = "att-source", "att-typed", "type one"
KV_WIDGETS = ("kv-rule", "kv-sink", "kv-window", "kv-length")     # and the plan's kind: a share, or budgets
KV_KIND, KV_SHARE, KV_BUDGET, KV_BETA = "kv-kind", "kv-share", "kv-budget", "kv-beta"
KV_STREAMING, KV_BUDGETS = "full / streaming", "budgets (HeadKV)"    # the KV page's "Plan" choices
# Streamlit ignores a whole query string over these (streamlit.runtime.state.query_params): said, not silent
QUERY_CHARACTERS, QUERY_FIELDS = 512 * 1024, 1000


def link_models() -> list[str]:
    """Model names a link may load: the registered demos, and the model this server was started on."""
    return sorted(set(NAMED_MODELS) | {Setup().model})


def link_data() -> list[str]:
    return sorted(set(NAMED_DATA) | {Setup().data})


def _names(pages: list[str]) -> dict:
    return dict(pages=pages, models=link_models(), data=link_data(), criteria=available(), kv_rules=RULES)


def _params() -> dict[str, str]:
    return {key: st.query_params[key] for key in st.query_params}


# Streamlit drops a whole query string over 1,000 fields or 512 Ki characters before any app code sees it (a line
# in the server's log only: streamlit.runtime.state.query_params), and its server does not pass the page's address
# to a script run. So the browser says it: this script reads the address the page was loaded with (the navigation
# entry, which later address changes do not touch) and, when Streamlit read none of it for its size, shows the
# notice in this element. Static text and numbers only (textContent): nothing of the link becomes HTML.
IGNORED_NOTICE = """
<div id="hp-link-ignored" style="display:none; padding:0.75rem 1rem; border-radius:0.5rem;
     background:rgba(255,189,69,0.2); color:inherit">🔗 </div>
<script>
(() => {
  const entry = performance.getEntriesByType("navigation")[0];
  const query = new URL(entry ? entry.name : window.location.href).search.slice(1);
  const fields = query ? query.split("&").length : 0, characters = query.length;
  const why = characters > CHARACTERS
    ? `is ${characters.toLocaleString("en")} characters long (at most ${(CHARACTERS).toLocaleString("en")})`
    : fields > FIELDS ? `has ${fields.toLocaleString("en")} fields (at most ${(FIELDS).toLocaleString("en")})` : null;
  const box = document.getElementById("hp-link-ignored");
  if (!why || !box) return;
  box.textContent += `This link named what cannot be opened here: its query string ${why}, so none of it was read `
    + "and the default view is shown.";
  box.style.display = "block";
})();
</script>
""".replace("CHARACTERS", str(QUERY_CHARACTERS)).replace("FIELDS", str(QUERY_FIELDS))


def follow(pages: list[str]) -> str | None:
    """On a session's first run: load the model and data the query string names (at the evaluation rows it names)
    and keep its other keys for ``apply``. Returns the url path of the page it names (None: stay)."""
    if st.session_state.get(READ):
        return None
    st.session_state[READ] = True
    params = _params()
    if not params:      # none, or more than Streamlit reads: the browser says which (IGNORED_NOTICE)
        st.html(IGNORED_NOTICE, unsafe_allow_javascript=True)
        return None
    state, _ = ViewState.from_query(params, **_names(pages))    # what it dropped is said by ``apply``
    if state.lesson is not None and state.step is not None:
        # the lesson step followed (ui.lesson_panel draws it); its sentence is ``apply``'s, like any link's
        st.session_state[LESSON] = (state.lesson, state.step)
    setup = current_setup()
    if state.model or state.data:
        model = state.model or setup.model
        # a linked demo without data: that demo's own data
        data = state.data or (model if state.model and model in link_data() else setup.data)
        setup = replace(setup, model=model, data=data, data_label=Path(data).name, text_col=None, pair_col=None,
                        label_col=None, live_rows=None)
    if state.rows is not None:
        # the numbers on the linked screen were measured on its first ``rows`` evaluation rows: the same rows here
        # (config.Setup.live_rows), unless the workspace without that setting, loaded already, has them anyway
        plain = workspace_of(replace(setup, live_rows=None))
        setup = replace(setup, live_rows=None if plain is not None and len(plain.eval) == state.rows else
                        state.rows)
    use_setup(setup)
    st.session_state[PENDING] = params
    return state.page


def apply(ws, sd, pages: list[str], lessons: Callable[[], dict[str, int]] | None = None) -> None:
    """Put a link read by ``follow`` on the loaded workspace (once), with one warning naming what was dropped:
    values no link accepts, and what this server cannot honour (a lesson step it does not have, more evaluation
    rows than it has; ``lessons()``: each lesson's number of steps, asked only when the link names one)."""
    params = st.session_state.pop(PENDING, None)
    if params is None:
        return
    kv_shape = (ws.adapter.n_layers, ws.adapter.n_kv_heads) if ws.adapter.causal else None
    state, problems = ViewState.from_query(params, **_names(pages), shape=ws.shape, kv_shape=kv_shape)
    if state.lesson is not None and lessons is not None:
        known = lessons()
        steps = known.get(state.lesson)
        if steps is None or not 1 <= state.step <= steps:
            have = (f"step {state.step} of lesson {state.lesson!r}, which has {steps} steps" if steps is not None else
                    f"lesson {state.lesson!r}, which this server does not have (its lessons: "
                    f"{', '.join(sorted(known)) or 'none'})")
            problems.append(f"lesson={state.lesson!r} step={state.step} dropped: {have}.")
            st.session_state.pop(LESSON, None)
    if state.rows is not None and state.rows != len(ws.eval):
        problems.append(f"rows={state.rows} dropped: {ws.setup.data_label} has {len(ws.eval)} evaluation rows here, "
                        f"so the numbers are measured on all {len(ws.eval)}.")
    if state.mask is not None:
        cut = [(layer, head) for layer, head in state.mask if sd.is_cut((layer, head))]
        pruned: dict[int, list[int]] = {}
        for layer, head in state.mask:
            pruned.setdefault(layer, []).append(head)
        sd.set_mask(HeadMask.from_pruned(pruned, ws.shape) & sd.base, "opened from a link")
        if cut:
            problems.append(f"{len(cut)} linked heads were already cut out of this model's weights.")
    if state.head is not None:
        sd.head = state.head
    if state.criteria:
        st.session_state[CRITERIA] = list(state.criteria)
        st.session_state[PRUNE_CRITERION] = state.criteria[0]
    if state.criterion:
        st.session_state[PRUNE_CRITERION] = state.criterion
    if state.ratio is not None:
        percent = int(round(state.ratio * 20)) * 5      # the sliders move in steps of 5%
        st.session_state[RATIOS["prune"]] = percent
        st.session_state[SCORES_RATIO] = min(max(percent, 5), 95)
    if state.sentence is not None:
        st.session_state[SOURCE], st.session_state[TYPED] = TYPE_ONE, state.sentence
    if state.roles is not None:
        st.session_state[ROLE_MARKS] = state.roles
    if state.kv is not None:
        if kv_shape is None:
            problems.append(f"kv dropped: {ws.setup.model} keeps no key/value cache (an encoder).")
        else:
            _apply_kv(ws, state.kv, kv_shape)
    if problems:
        st.warning("This link named what cannot be opened here; the rest of it is shown. "   # a link's values: inert
                   + " ".join(inert(problem) for problem in problems), icon="🔗")


def _apply_kv(ws, kv: KVView, kv_shape: tuple[int, int]) -> None:
    for key, value in zip(KV_WIDGETS, (kv.rule, kv.sink, kv.window, kv.length)):
        st.session_state[key] = value
    if kv.budget is not None:
        st.session_state[KV_KIND], st.session_state[KV_BUDGET], st.session_state[KV_BETA] = \
            KV_BUDGETS, kv.budget, kv.beta
        return
    st.session_state[KV_KIND], st.session_state[KV_SHARE] = KV_STREAMING, kv.share
    if kv.full is not None:
        full = np.zeros(kv_shape, dtype=bool)
        for layer, group in kv.full:
            full[layer, group] = True
        # the KV page starts from its rule's top share only when these settings are new (its "kv-basis")
        st.session_state["kv-basis"] = (ws.key, kv.rule, kv.share, kv.sink, kv.window)
        st.session_state["kv-full"] = full


def current(ws, sd) -> ViewState:
    """The view on screen now, from the session (mask, head) and the widgets' state."""
    get = st.session_state.get
    page = get(PAGE)
    gated = (sd.mask.values == 0) & (sd.base.values != 0)
    model_ok = ws.setup.model in link_models() and ws.setup.data in link_data()
    criteria = get(CRITERIA) or list(sd.scores) or None
    ratio = get(RATIOS.get(page, SCORES_RATIO))
    # a pasted tab or newline is a space in the link (a link never carries control characters)
    sentence = CONTROL.sub(" ", get(TYPED) or "").strip()[:MAX_SENTENCE] if get(SOURCE) == TYPE_ONE else ""
    return ViewState(
        page=page, model=ws.setup.model if model_ok else None, data=ws.setup.data if model_ok else None,
        mask=tuple(map(tuple, gated.nonzero().tolist())) if bool(gated.any()) else None, head=sd.head,
        criteria=tuple(criteria)[:MAX_CRITERIA] if criteria else None,
        criterion=get(PRUNE_CRITERION) if page == "prune" else None,
        ratio=None if ratio is None else int(ratio) / 100, rows=len(ws.eval) or None,
        sentence=sentence or None, roles=False if get(ROLE_MARKS) is False else None,
        kv=_kv_view() if page == "kv-cache" else None, **_lesson(get(LESSON)))


def _kv_view() -> KVView | None:
    """The KV page's plan from its widgets (None before they exist): a share and the heads clicked full, or a
    budget plan's total and beta."""
    get = st.session_state.get
    if not all(key in st.session_state for key in KV_WIDGETS):
        return None
    common = dict(rule=get("kv-rule"), sink=int(get("kv-sink")), window=int(get("kv-window")),
                  length=int(get("kv-length")))
    if get(KV_KIND) == KV_BUDGETS:
        if KV_BUDGET not in st.session_state or KV_BETA not in st.session_state:
            return None
        return KVView(**common, share=None, budget=int(get(KV_BUDGET)), beta=float(get(KV_BETA)))
    if KV_SHARE not in st.session_state:
        return None
    full = get("kv-full")
    heads = tuple(map(tuple, np.argwhere(full).tolist())) if full is not None else None
    return KVView(**common, share=int(get(KV_SHARE)), full=heads)


def _lesson(followed) -> dict:
    """The lesson keys of the view: the lesson followed, if its name and step are ones a link can carry."""
    if not isinstance(followed, tuple) or len(followed) != 2:
        return {}
    name, step = followed
    if not (isinstance(name, str) and LESSON_NAME.fullmatch(name) and isinstance(step, int) and 0 <= step <= MAX_STEP):
        return {}
    return {"lesson": name, "step": step}


def link_query() -> dict[str, str]:
    """The query string's keys of the view on screen ({} before a workspace is loaded)."""
    ws, sd = st.session_state.get("hp_workspace"), st.session_state.get("hp_session")
    if ws is None or sd is None or sd.key != ws.key:
        return {}
    kv_full = st.session_state.get("kv-full")
    try:
        view = current(ws, sd)
    except ViewStateError:     # a widget value no link accepts (none known): keep the address bar as it is
        return {}
    return view.to_query(ws.shape, None if kv_full is None else kv_full.shape)


def publish(draw: bool = True, fragment: bool = False) -> None:
    """Write the view on screen to the address bar now (nothing when it is there already), and with ``draw`` (not
    from a widget's callback, which runs before any element exists) redraw the sidebar's link; ``fragment``: from
    the end of a fragment's run (``ui.view_fragment``), which writes the link's slots on every run."""
    params = link_query()
    if params and {k: st.query_params.get(k) for k in st.query_params} != params:
        st.query_params.from_dict(params)
    show = st.session_state.get(SHOW)
    if draw and show is not None:
        show(params, fragment)


def remember(ws, page_url: str | None) -> None:
    """The page being drawn and its workspace, for ``publish`` from callbacks and fragments."""
    st.session_state[PAGE] = page_url
    st.session_state["hp_workspace"] = ws

