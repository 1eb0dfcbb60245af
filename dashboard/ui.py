"""Page frame and widgets shared by every page: config, sidebar, auto-load, error guard, progress, pickers."""

from __future__ import annotations

import functools
import html
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlencode

import pandas as pd
import plotly.graph_objects as go
import segno
import streamlit as st

from headprune import viz
from headprune.criteria import Criterion, available, get
from headprune.errors import HeadpruneError
from headprune.evaluation.speed import speed_headline, speed_table
from headprune.glossary import help_for, role_legend
from headprune.lessons import fill, placeholders
from headprune.markdown import inert
from headprune.model.mask import HeadMask
from headprune.model.sizes import cut_summary

from . import urlstate
from .compute import available_lessons, lesson_values, measure_speed, measured_speed, stored_roles
from .config import current_setup, demo_setup, help_url, use_setup
from .session import SessionData, session
from .store import DashboardWorkspace as Workspace
from .store import build_workspace, workspace_of

ABOUT = ("**headprune** scores every attention head of a transformer (a classifier or a language model), shows what "
         "each head looks at, and lets you prune heads and watch accuracy or perplexity move — then exports the "
         "smaller model.")


# -- text a user supplied, shown inert ----------------------------------------------------------------------------

def plain(text, markdown: bool = False) -> str:
    """``text`` a user supplied (a lesson's words, a model or data name, a file or column name, a label, a token, an
    error message quoting any of them) as Markdown that shows it and does nothing else: no HTML, no image fetched
    from another host, no link, icon or colour (``headprune.markdown.inert``; ``markdown=True`` keeps a lesson's
    emphasis, lists and code spans). Every text of a page that can hold such words goes through here; the result
    is never a widget's option (shown as text already) and never put inside backticks."""
    return inert(text, markdown)


# -- errors and progress -----------------------------------------------------------------------------------------

@contextmanager
def guard(what: str = "That did not work"):
    """Show a user's error (HeadpruneError) as st.error with its advice, and keep the page running.

    Anything else is a bug: it is shown with its traceback folded away, and the page still keeps running.
    """
    try:
        yield
    except HeadpruneError as exc:
        st.error(f"**{what}.** {plain(exc)}", icon="⚠️")
    except Exception as exc:  # noqa: BLE001 - a page must survive anything; the traceback is shown for reports
        st.error(f"**{what}** (unexpected {type(exc).__name__}: {plain(exc)}). Please report this.", icon="🐞")
        with st.expander("Details"):
            st.code(traceback.format_exc())


DRAW_EVERY = 1.0   # seconds between two redraws of a progress bar (its last state is always drawn)


def progress_bar(label: str) -> Callable[[float, str], None]:
    """A ``progress(fraction, message)`` callback drawing an st.progress bar (call ``.done()`` to remove it).

    Redrawn at most every DRAW_EVERY seconds, and at the end: a demo build calls it after each of ~280 training
    steps, and every redraw is a message to the browser and a repaint there, CPU taken from the computation on a
    2-core machine: demo-lm's first start took 155-158 s with a redraw per step, 140-142 s with this limit, against
    129-143 s for its CLI build (benchmarks/bench_first_start.py --repeats 2, README layout)."""
    bar = st.progress(0.0, text=label)
    drawn = [0.0]

    def update(fraction: float, message: str = "") -> None:
        now = time.monotonic()
        if fraction < 1.0 and now - drawn[0] < DRAW_EVERY:
            return
        drawn[0] = now
        bar.progress(float(min(max(fraction, 0.0), 1.0)), text=f"{label} — {message}" if message else label)

    update.done = bar.empty
    return update


# -- time told before long work, and a way to stop it ------------------------------------------------------------

CANCELLED = "hp_cancelled"   # session key: the Cancel button clicked last (its note shows on the next run)


def estimate_line(estimate, hint: str = "") -> None:
    """The expected duration (``headprune.estimate.TimeEstimate``) of what the button beside it starts: a caption,
    or past ``estimate.LONG`` a warning followed by ``hint`` (how to make it shorter). Nothing for None."""
    if estimate is None:
        return
    if estimate.long:
        st.warning(f"**{estimate.text}.** {hint}", icon="⏳")
    else:
        st.caption(f"⏱ {estimate.text} (measured: {estimate.basis}).")


def cancel_button(key: str) -> None:
    """A Cancel button for the run starting below it. A click reruns the page, which stops the run at its next
    progress call, between two batches (nothing half-done is stored); ``cancelled_note`` says so afterwards."""
    st.button("Cancel", key=key, icon=":material/stop:", on_click=st.session_state.__setitem__, args=(CANCELLED, key))


def cancelled_note(key: str) -> None:
    """After a click on the Cancel button ``key``: say that the run stopped and stored nothing (once)."""
    if st.session_state.get(CANCELLED) == key:
        del st.session_state[CANCELLED]
        st.info("Cancelled: the run stopped between two batches and stored nothing.", icon=":material/stop:")


RUNNING = "hp_running"      # session key: what a long job was doing when it started; removed when it ends


@contextmanager
def job(what: str):
    """The run of a long job (``what``: "Find head roles"): remembered while it runs, so that a click or a change
    elsewhere that stops it -- Streamlit ends the running script to start the next run -- is said on the next run
    (``stopped_note``), never lost silently (issue 45, "Bad input"). A user's error or a bug ends it as usual."""
    st.session_state[RUNNING] = what
    try:
        yield
    except Exception:
        st.session_state.pop(RUNNING, None)
        raise
    # a rerun stops the script with Streamlit's own exceptions (not Exception subclasses): the mark then stays
    st.session_state.pop(RUNNING, None)


def stopped_note() -> None:
    """On the run after a long job was stopped by another click: say so, once (the Cancel button says its own).
    A Cancel click that reached the server after its job had ended (nothing running to stop: the result is stored
    and shown) is said too, and its mark dropped: left, it silenced the next stopped job's note and told the next
    run of that job it was cancelled."""
    what = st.session_state.pop(RUNNING, None)
    cancelled = st.session_state.get(CANCELLED)
    if cancelled and what is None:
        del st.session_state[CANCELLED]
        st.info("Cancel came after the run had finished: its result is kept.", icon=":material/check:")
        return
    if what is None or cancelled:
        return
    st.warning(f"**{what}** stopped before it finished: a click or a change came while it ran, and each one starts "
               "a new run of the page, which ends the one before. Nothing of it was stored; start it again when "
               "you are ready.", icon="⏹️")


def long_job(key: str, label: str, run: Callable[[Callable[[float, str], None]], object], *, done=None,
             estimate: Callable[[], object] | None = None, hint: str = "", what: str | None = None,
             failed: str = "That did not work"):
    """One way to start any job over a few seconds (issue 35): the expected duration above a button ``label``
    (``estimate``, called only while there is something to run, after the button is drawn; gone once the run
    starts), then while it runs a Cancel button and a bar that moves (``run(progress)``; a Cancel click reruns the
    page, which stops the run at its next progress redraw, within a batch, storing nothing); when it ends the
    button, Cancel and bar are gone.

    ``done``: the stored result for the current inputs; when given nothing is drawn and it is returned, so a result
    stays on the page until its inputs change (and the button only comes back then). Returns the result of a run
    that finished now, else ``done`` (None: nothing to show yet)."""
    if done is not None:
        return done
    told = st.empty()
    cancelled_note(f"{key}-cancel")
    slot = st.empty()
    if not slot.button(label, type="primary", key=key):
        # the button first, its estimate after: measuring it may take a while (Recover times a training step: 19 s
        # of a blank page on a busy server), and the estimate is of no use once the run has started
        if estimate is not None:
            told.caption("⏱ Measuring how long this takes …")
            with told.container(), guard("Could not estimate how long this takes"):
                estimate_line(estimate(), hint)
        return None
    result = None
    with guard(failed), job(label):
        with slot.container():
            cancel_button(f"{key}-cancel")
            bar = progress_bar(what or label)
        result = run(bar)
    slot.empty()
    return result


def rows_choice(where, key: str, quick: int, n_rows: int, what: str, saves: str) -> int | None:
    """The "Evaluation rows" choice of a page whose default is lesson-sized (issue 35): ``quick`` of the ``n_rows``
    evaluation rows (whole batches drawn with the workspace seed), all of them one click away, drawn in ``where``.
    Returns the rows to measure on (None: all; no choice is drawn when the split is no larger than ``quick``)."""
    if n_rows <= quick:
        return None
    choice = where.radio("Evaluation rows", ["quick", "all"], horizontal=True, key=key,
                         format_func={"quick": f"{quick} (quick)", "all": f"all {n_rows}"}.get,
                         help=f"By default {what} is measured on {quick} of the {n_rows} evaluation rows (whole "
                              f"batches drawn with the workspace seed): {saves}. Choose all rows for the final "
                              "numbers.")
    return quick if choice == "quick" else None


# -- page frame -----------------------------------------------------------------------------------------------------

PAGES_DIR = Path(__file__).resolve().parent / "pages"
# Emoji icons, not ":material/...": the open page's icon becomes the favicon, and a material one is fetched as an SVG
# from fonts.gstatic.com (issue 35: offline, every asset comes from the app; an emoji favicon is a data: URI).
PAGES = (  # (file in dashboard/pages, title, icon, url path); dashboard/app.py builds the navigation from this
    ("1_Model_and_data.py", "Model & data", "📂", "model-and-data"),
    ("2_Head_scores.py", "Head scores", "🧮", "head-scores"),
    ("7_Roles.py", "Roles", "🧠", "roles"),
    ("3_Attention.py", "Attention", "👁️", "attention"),
    ("4_Prune.py", "Prune", "✂️", "prune"),
    ("8_Recover.py", "Recover", "🩹", "recover"),
    ("5_Trajectories.py", "Trajectories", "📉", "trajectories"),
    ("6_Export.py", "Export", "📥", "export"),
    ("9_KV_cache.py", "KV cache", "💾", "kv-cache"),
    ("10_Runs.py", "Protocol runs", "📋", "runs"),
    ("11_Lessons.py", "Lessons", "🎓", "lessons"),
    ("12_Model_view.py", "Every head at a glance", "🔲", "heads"),
    ("13_What_it_says.py", "What the pruned model says", "💬", "example"),
    ("14_Glossary.py", "Glossary", "📖", "glossary"),
)
# The navigation's sections, each for its readers (issue 45): a student starts under Learn, a teacher or analyst
# under Analyse and Prune, a researcher running protocols under Research. Every page is in one section (a test
# checks), and the whole list stays unfolded (``st.navigation(expanded=True)``): past ten pages Streamlit folds the
# rest under "View N more", which hid Lessons and Glossary.
SECTIONS = {
    "Learn": ("lessons", "glossary", "heads", "example"),
    "Analyse": ("model-and-data", "head-scores", "roles", "attention"),
    "Prune": ("prune", "recover", "trajectories", "export"),
    "Research": ("kv-cache", "runs"),
}


# Phones (390 px) and small laptops (1280 x 720) are first-class (issue 45). Streamlit's frame leaves 6rem above the
# title: at 720 px that pushed the Prune page's grid below its metric row's screen. Under 640 px Streamlit stacks
# columns one per line: a row of metrics only then stays two a line (four metrics were a whole phone screen), and
# every image, chart or HTML block is held to the column's width (a fixed 672 px atlas hid heads 10-11).
PAGE_CSS = """
[data-testid="stMainBlockContainer"] { padding-top: 3rem; padding-bottom: 3rem; }
[data-testid="stMainBlockContainer"] img, [data-testid="stHtml"] { max-width: 100%; }
@media (max-width: 640px) {
  [data-testid="stMainBlockContainer"] { padding-left: 0.75rem; padding-right: 0.75rem; padding-top: 3.5rem; }
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] [data-testid="stMetric"]) {
    flex-flow: row wrap; gap: 0.5rem 1rem; }
  [data-testid="stHorizontalBlock"]:has(> [data-testid="stColumn"] [data-testid="stMetric"])
    > [data-testid="stColumn"] { flex: 1 1 calc(50% - 1rem) !important; min-width: calc(50% - 1rem) !important; }
  [data-testid="stMetricValue"] { font-size: 1.6rem; }
}
.st-key-hp-tap { display: none; }
"""

# On a touch screen plotly selects a point on tap only if a hover found it before (its click handler reads the
# hovered point first and runs the hover after): the first tap on a grid cell showed its tooltip and changed
# nothing, the second toggled it. A touch that starts on a plot first sends plotly the mouse move a mouse would
# have made, so one tap selects the cell (and a grid's click acts) as a click does. Installed once per browser tab.
TAP_SELECTS = """<script>
if (!window.headpruneTapSelects) {
  window.headpruneTapSelects = true;
  document.addEventListener("touchstart", (event) => {
    const drag = event.target.closest && event.target.closest(".js-plotly-plot .nsewdrag");
    if (!drag || event.touches.length !== 1) return;
    const touch = event.touches[0];
    drag.dispatchEvent(new MouseEvent("mousemove", {clientX: touch.clientX, clientY: touch.clientY,
                                                    bubbles: true, cancelable: true, view: window}));
  }, {capture: true, passive: true});
}
</script>"""


def page_style() -> None:
    """The layout rules of every page (``PAGE_CSS``: a style-only st.html takes no room) and the tap fix
    (``TAP_SELECTS``, in a hidden container: a script runs wherever it sits)."""
    st.html(f"<style>{PAGE_CSS}</style>")
    with st.container(key="hp-tap"):
        st.html(TAP_SELECTS, unsafe_allow_javascript=True)


def page_path(file: str) -> str:
    """Absolute path of a page script: the navigation works whichever entry point (app.py or dashboard/app.py)
    streamlit was started with, and inside an installed wheel."""
    return str(PAGES_DIR / file)


def manual_help(title: str) -> str:
    """The "?" beside a page's title: a link to that page's part of the manual (``headprune docs``)."""
    return (f"[This page in the manual]({help_url(title)}) — `python -m headprune docs` serves the manual offline "
            "(HEADPRUNE_DOCS_URL points the link elsewhere).")


def page(title: str, caption: str | None = None, live_counts: bool = False) -> tuple[Workspace, SessionData]:
    """Title the page, make sure a workspace is loaded (the demo by default), draw the sidebar.

    ``live_counts``: the page changes the mask inside a fragment, which writes the sidebar's counts itself
    (``sidebar_counts``) so they follow a click that reruns only the fragment. Stops the script with an
    explanation when nothing can be loaded.
    """
    st.title(title, help=manual_help(title))
    if caption:
        st.caption(caption)
    stopped_note()
    ws = ensure_workspace()
    if ws is None:
        st.stop()
    sd = session(ws)
    keep_widgets()
    urlstate.remember(ws, PAGE_URLS.get(title))
    urlstate.apply(ws, sd, list(PAGE_URLS.values()), lesson_steps)
    sidebar(ws, sd, counts=not live_counts)
    with st.sidebar:
        share_box(ws)
    urlstate.publish()
    lesson_panel(ws)
    return ws, sd


# The typed sentence, shared by the Attention page, every head at a glance and what the pruned model says (their
# widgets have these keys). Streamlit forgets a widget's value at the end of a run that does not draw it, so the
# sentence typed on Attention was gone on the way to the model view (any page between dropped it too); set again
# by their own key on each run, they are the session's values and outlive pages that do not draw them.
KEPT_WIDGETS = (urlstate.SOURCE, urlstate.TYPED, "att-typed-pair")
MAX_TYPED = 2000   # characters of a typed text (the widgets' max_chars: it is part of a text input's identity)


def keep_widgets() -> None:
    """Keep ``KEPT_WIDGETS``' values through pages that do not draw them (see there)."""
    for key in KEPT_WIDGETS:
        if key in st.session_state:
            st.session_state[key] = st.session_state[key]


# -- shareable views: the address bar holds the view (dashboard/urlstate.py owns it) -------------------------------

PAGE_URLS = {title: url for _, title, _, url in PAGES}


def follow_link() -> str | None:
    """The page file a shared link (or a reload) opens on a session's first run, after loading the model and data
    it names; None to stay on the page asked for."""
    url = urlstate.follow(list(PAGE_URLS.values()))
    return next((file for file, _, _, path in PAGES if path == url), None)


def app_root() -> str:
    """The app's own address (its Home), whichever page is open: the browser's address as the server saw it, less
    the open page's path. A link opens there and names its page in the query (``page=``): a page's own address
    (``/prune?...``) makes Streamlit's start-up probe ask ``/prune/_stcore/health`` and ``/prune/_stcore/host-config``
    first (its frontend tries the path as a base URL before the server's root), two 404s per opened link."""
    base = (st.context.url or "").split("?")[0].rstrip("/")
    head, _, last = base.rpartition("/")
    return (head if last in PAGE_URLS.values() else base) + "/"


def link_url(params: dict[str, str]) -> str:
    """The address that opens ``params`` on this server (at the app's root, ``app_root``)."""
    return app_root() + ("?" + urlencode(params) if params else "")


def share_box(ws: Workspace) -> None:
    """The sidebar's share caption, the link with a copy button and its QR code; redrawn in place by
    ``urlstate.publish`` from a fragment, so it never shows an older view than the address bar."""
    if ws.setup.model not in urlstate.link_models() or ws.setup.data not in urlstate.link_data():
        st.caption("This model or data set is not a demo, so a link does not carry it (a link never names a file "
                   "or a hub id): the link below opens the server's start-up model on this page, with the mask and "
                   "selected head where they fit its heads.")
    else:
        st.caption("Share this view: the link below (and the address bar) opens what is on screen now — page, "
                   "model and data, pruned heads, selected head, criteria, ratio, sentence, role letters and the "
                   "KV plan. A reload keeps it too.")
    link_slots()


def link_slots() -> None:
    """The sidebar's places for the link and its QR code (``show_link`` fills them)."""
    # two one-element slots, each redrawn in place: a fragment that redraws a block (a container) it did not create
    # sends the block's children to a delta path the browser may not have when the server is busy, and the page
    # goes blank ("Cannot set a node at a delta path"; benchmarks/bench_class.py, 10 students at once)
    link = st.empty()
    with st.expander("QR code (for a projector)"):
        st.session_state[urlstate.SLOT] = (link, st.empty())
    # new slots are empty: nothing is drawn in them yet (a memory of "drawn" keyed by id(slots) once matched the new
    # slots of a later run -- CPython reuses a freed tuple's address -- and left the sidebar without its link)
    st.session_state[LINK_DRAWN] = None
    st.session_state[urlstate.SHOW] = show_link      # urlstate.publish draws through it (it cannot import ui)


def share_page(params: dict[str, str], note: str) -> None:
    """The sidebar's share box of a page that loads no model (Protocol runs): ``note`` on what the link opens, the
    link (``params`` at the app's root) and its QR code."""
    with st.sidebar:
        st.caption(note)
        link_slots()
    show_link(params)


LINK_DRAWN = "hp_link_drawn"   # session key: the link show_link drew last in this run's slots (None: none yet)


def show_link(params: dict[str, str], fragment: bool = False) -> None:
    """The link in its sidebar slots: copyable text (the code block's copy button) and a QR code for a projector.

    ``fragment``: drawn from a ``view_fragment``, which writes the slots on every one of its runs (see there)."""
    slots = st.session_state.get(urlstate.SLOT)
    if slots is None:
        return
    url = link_url(params)
    if not fragment and st.session_state.get(LINK_DRAWN) == url:
        return   # drawn in these slots already this run: nothing to resend
    st.session_state[LINK_DRAWN] = url
    link, qr = slots
    link.code(url, language=None, wrap_lines=True)
    qr.image(qr_data_uri(url), caption="Scan to open this view", width=220)


def view_fragment(body: Callable[[], None]) -> Callable[[], None]:
    """``st.fragment`` for the part of a page whose clicks change the view: every run of it -- the full run's
    included -- ends by writing the view to the address bar and to the sidebar's link slots (``urlstate.publish``).

    The page frame creates those slots outside the fragment, and Streamlit lets a fragment rerun fill a container
    created outside it only when that fragment wrote to it on the last full run. A fragment that skipped the write
    on a full run because the link had not changed (Prune after "Apply", Roles after "Find head roles") raised
    StreamlitInvalidLayoutContextError on the next grid click, and from then on the sidebar named an older mask
    (issue 45 item 1). So the write is unconditional here, and in ``finally``: a body that stops (``st.stop``) or
    reruns on a full run still reserves the slots for its later reruns."""
    @functools.wraps(body)
    def run() -> None:
        try:
            stopped_note()      # a job of this fragment (Prune's Apply) stopped by the click that reran it
            body()
        finally:
            urlstate.publish(fragment=True)

    return st.fragment(run)


@functools.lru_cache(maxsize=256)
def qr_data_uri(url: str) -> str:
    """The QR code of ``url`` as a PNG ``data:`` URI, memoised across sessions (a class shares few links).

    A data URI travels inside the page's own message, so Streamlit's media file manager never holds it: bytes given
    to ``st.image`` become a media file that the next rerun of the session drops, and a browser still fetching the
    old address got HTTP 404 (benchmarks/bench_class.py, 2 of 30 students)."""
    return segno.make(url, error="m").png_data_uri(scale=6, border=2)


def ensure_workspace() -> Workspace | None:
    setup = current_setup()
    ws = workspace_of(setup)
    if ws is not None:
        return ws
    slot = st.empty()
    with slot.status(f"Loading model **{plain(setup.model)}** and data **{plain(setup.data_label)}** …",
                     expanded=True) as status:
        bar = progress_bar("loading")
        try:
            ws = build_workspace(setup, bar)
        except HeadpruneError as exc:
            status.update(label="Could not load the model and data", state="error")
            st.error(plain(exc), icon="⚠️")
        bar.done()
    if ws is not None:   # loaded: the page that follows says what is loaded (a done status took a phone's line)
        slot.empty()
    if ws is None and setup != demo_setup(setup):
        st.button("Use the demo model and data instead", type="primary", on_click=use_setup, args=(demo_setup(setup),))
    return ws


DEMO_TITLES = {"demo": "demo · MiniLM-L6 sentiment (Rotten Tomatoes)",
               "demo-lm": "demo-lm · 6-layer Llama language model (Rotten Tomatoes)",
               "demo-circuit": "demo-circuit · 3-layer Llama with an induction circuit (repeated word blocks)"}
# how the model picker names each demo (a registered demo not listed here shows its name)
DEMO_CHOICES = {"demo": "Demo classifier (MiniLM-L6, Rotten Tomatoes)",
                "demo-lm": "Demo language model (6-layer Llama, 8 query / 2 key-value heads)",
                "demo-circuit": "Circuit demo (3-layer Llama whose induction heads are known)"}


def model_title(ws: Workspace) -> str:
    return DEMO_TITLES.get(ws.setup.model, ws.setup.model)


def baseline_label(ws: Workspace) -> str:
    """What "dense" means here: the model as loaded, which for a model saved by ``prune`` has heads cut already."""
    return f"dense {ws.metric}" if ws.n_cut == 0 else f"{ws.metric} as loaded"


def heads_left(ws: Workspace, sd: SessionData) -> str:
    """"54 / 72": heads still in use out of the full grid; cut and pruned heads both count as gone."""
    return f"{ws.n_units - sd.mask.n_pruned} / {ws.n_units}"


def cut_note(ws: Workspace) -> str:
    """A sentence on heads cut out of the loaded weights ('' when there are none)."""
    if ws.n_cut == 0:
        return ""
    return (f"This model was saved pruned: {ws.n_cut} of its {ws.n_units} heads are cut out of its weights "
            "(drawn ✕, they cannot be restored). \"As loaded\" is this model, not the original dense one.")


def sidebar(ws: Workspace, sd: SessionData, counts: bool = True) -> None:
    counts, (n_blocks, n_heads) = ws.counts, ws.shape
    grid = f"{n_heads} tied heads × {ws.adapter.n_layers} layers" if ws.tied else f"{n_blocks} × {n_heads}"
    dense = ws.metric_of(ws.dense())
    with st.sidebar:
        st.markdown("#### Loaded")
        st.markdown(f"**{plain(model_title(ws))}**")
        rows = {
            "architecture": ws.adapter.arch,
            "heads (L × H)": grid,
            **({"key/value heads": f"{ws.adapter.n_kv_heads} per layer, {n_heads // ws.adapter.n_kv_heads} query "
                                   "heads each"} if ws.adapter.grouped else {}),
            **({"attention": "causal (a token sees only earlier ones)"} if ws.adapter.causal else {}),
            "parameters": f"{counts['total']['params'] / 1e6:.1f} M",
            "size": f"{counts['total']['mb']:.1f} MB",
            "device": str(ws.loaded.device),
            "data": ws.setup.data_label,
            "evaluation / calibration": f"{len(ws.eval)} / {len(ws.calib)}",
            baseline_label(ws): viz.metric_text(dense),
        }
        st.markdown("\n".join(f"- {k}: **{plain(v)}**" for k, v in rows.items()))
        # the counts' own slot: a page's fragment rewrites it in place on each of its reruns (sidebar_counts)
        st.session_state["hp_counts_slot"] = st.empty()
        if counts:
            sidebar_counts(ws, sd)
        if stored_roles(ws) is not None:
            st.toggle("Head roles on the grids", value=True, key=urlstate.ROLE_MARKS,
                      help="Letters in the cells: " + role_legend() + " (Roles page; the Glossary explains each).")
        if ws.setup.model != "demo" or ws.setup.data != "demo":
            st.button("Use the demo", on_click=use_setup, args=(demo_setup(ws.setup),), key="sidebar-demo")



def role_marks(ws: Workspace) -> dict:
    """``marks``/``roles`` arguments for a head grid once the head roles are known and shown, else {}."""
    report = stored_roles(ws)
    if report is None or not st.session_state.get(urlstate.ROLE_MARKS, True):
        return {}
    return {"marks": report.marks(), "roles": report.names()}


def sidebar_counts(ws: Workspace, sd: SessionData) -> None:
    """The sidebar's mask counts, in their slot (called from a page's fragment: redrawn on each of its reruns)."""
    text = heads_left(ws, sd) + (f" ({ws.n_cut} cut in the loaded model)" if ws.n_cut else "")
    st.session_state["hp_counts_slot"].markdown(f"- heads left: **{text}**")


# -- live evaluation --------------------------------------------------------------------------------------------

def estimate_value(estimate) -> str:
    """A running ``progressive.Estimate`` as a metric value: "0.812 ± 0.031", "≈ 263.1 (250.2–280.4)" when the
    interval is lopsided (perplexity: exp of a symmetric interval), "≈ 0.812" before an interval exists."""
    digits = 3 if estimate.value < 10 else 1
    if estimate.low is None:
        return f"≈ {estimate.value:.{digits}f}"
    above, below = estimate.high - estimate.value, estimate.value - estimate.low
    # an interval is never a point before the last batch (progressive.py): never print one that reads as a point
    # ("± 0.000", "(1.000–1.000)"): as many digits as it takes to tell its ends apart
    def reads_as_a_point(d: int) -> bool:
        return f"{estimate.low:.{d}f}" == f"{estimate.high:.{d}f}" or float(f"{max(above, below):.{d}f}") == 0

    while digits < 6 and estimate.high > estimate.low and reads_as_a_point(digits):
        digits += 1
    if abs(above - below) <= 0.1 * max(above, below, 1e-12):
        return f"{estimate.value:.{digits}f} ± {max(above, below):.{digits}f}"
    return f"≈ {estimate.value:.{digits}f} ({estimate.low:.{digits}f}–{estimate.high:.{digits}f})"


def change_delta(value: float, reference: float, higher_is_better: bool, against: str) -> dict:
    """``st.metric``'s delta arguments for ``value`` beside ``reference`` ("+0.0312 vs dense"): the arrow follows
    the sign, green when the change is better for this metric (perplexity: down); a change that rounds to zero has
    no arrow and no colour (a green up-arrow on "+0.0000 vs dense" said better when nothing had changed)."""
    text = viz.change_text(value, reference)
    if text == "±0":
        return {"delta": f"no change vs {against}", "delta_color": "off", "delta_arrow": "off"}
    return {"delta": f"{text} vs {against}", "delta_color": "normal" if higher_is_better else "inverse"}


def running_metric(metric: str, estimate, previous: float) -> dict:
    """``st.metric`` arguments for the headline while batches arrive (issue 35): the running estimate with its
    interval once it is precise enough (``Estimate.shown``), before that the last exact value ``previous``, greyed,
    under "computing…" -- never a number whose interval spans a factor of forty."""
    common = {"delta": f"{estimate.done}/{estimate.total} batches", "delta_color": "off", "delta_arrow": "off"}
    if not estimate.shown:
        return {"label": f"{metric} · computing…", "value": f":gray[{viz.metric_text(previous)}]", **common,
                "help": f"The last exact value, kept until the running estimate is precise enough: a number is "
                        f"shown once {estimate.rule}."}
    return {"label": metric, "value": estimate_value(estimate), **common,
            "help": f"Running estimate over the batches evaluated so far (a fresh random order on every click) with "
                    f"its 95% interval, shown once {estimate.rule}; replaced by the exact value when the last batch "
                    "is in."}


# -- lessons: the current step's text above every page ------------------------------------------------------------

def lesson_steps() -> dict[str, int]:
    """Each lesson this server has, by name, with its number of steps (what a link's lesson step may name)."""
    lessons, _ = available_lessons(list(PAGE_URLS.values()))
    return {name: len(lesson.steps) for name, lesson in lessons.items()}


def step_href(lesson, step: int) -> str:
    """The link that opens step ``step`` of ``lesson`` (its whole state is in the query string), at the app's root
    (``app_root``: a relative "?..." opened on the page's own path)."""
    return link_url(lesson.query(step))


LESSON_HIDDEN = "hp_lesson_hidden"   # session key: the lesson step the reader closed (shown again on request)


def step_anchor(lesson, step: int, text: str) -> str:
    """An HTML link (for st.markdown with ``unsafe_allow_html``) that opens step ``step`` of ``lesson`` in this tab,
    a full page load (a Markdown link opens a new tab): the address URL-encoded then HTML-escaped, ``text`` shown
    inert (``plain``)."""
    return f'<a href="{html.escape(step_href(lesson, step))}" target="_self">{plain(text)}</a>'


def step_mask(ws: Workspace, state) -> HeadMask:
    """The mask a lesson step's state opens on ``ws`` (as ``urlstate.apply`` sets it): its heads pruned, on top of
    those cut out of the loaded weights."""
    pruned: dict[int, list[int]] = {}
    for layer, head in state.mask or ():
        pruned.setdefault(layer, []).append(head)
    return HeadMask.from_pruned(pruned, ws.shape) & ws.cut_mask


def lesson_panel(ws: Workspace) -> None:
    """The lesson step being followed, above the page: its text, what to look at, its question and the reveal,
    and links to the step before and after (each a full page load of that step's state). A step's placeholders
    (``{dense}``, ``{pruned}``, ...) are filled from the live values of its state on this server; every word of the
    lesson is shown inert (``plain``)."""
    current = st.session_state.get(urlstate.LESSON)
    if current is None:
        return
    lessons, _ = available_lessons(list(PAGE_URLS.values()))
    name, k = current
    lesson = lessons.get(name)
    if lesson is None or not 1 <= k <= len(lesson.steps):
        dropped = (f"lesson {name!r}, which this server does not have (its lessons: {', '.join(lessons) or 'none'})"
                   if lesson is None else f"step {k} of lesson {name!r}, which has {len(lesson.steps)} steps")
        st.warning(plain(f"This link names {dropped}: no lesson step is shown, the rest of the link is (the "
                         "Lessons page lists every lesson and its steps)."), icon="🎓")
        st.session_state.pop(urlstate.LESSON, None)
        return
    step = lesson.steps[k - 1]
    where = f"**{plain(lesson.title)}** · step {k} of {len(lesson.steps)}"
    if st.session_state.get(LESSON_HIDDEN) == current:   # closed: one line to bring it back, nothing else
        st.button(f"🎓 Show the lesson: {where}", key="lesson-open", type="tertiary",
                  on_click=st.session_state.pop, args=(LESSON_HIDDEN, None))
        return
    words, values, notes = step.words(), {}, []
    if any(placeholders(text) for text in words.values()):
        with guard("Could not measure the numbers this step quotes"):
            values = lesson_values(ws, step_mask(ws, step.state))
    for key, text in words.items():
        words[key], missed = fill(text, values)
        notes += missed
    with st.container(border=True, key="lesson-panel"):
        title, close = st.columns([6, 1], vertical_alignment="top")
        title.markdown(f"🎓 {where}: **{plain(step.title)}**")
        close.button("Close", key="lesson-close", icon=":material/close:", width="stretch",
                     help="Hide the lesson's text; a button in its place shows it again.",
                     on_click=st.session_state.__setitem__, args=(LESSON_HIDDEN, current))
        st.markdown(plain(words["text"], markdown=True))
        if step.look:
            st.markdown(f"**Look at:** {plain(words['look'], markdown=True)}")
        if step.question:
            st.markdown(f"**Question:** {plain(words['question'], markdown=True)}")
            with st.expander("Reveal the answer"):
                st.markdown(plain(words["answer"], markdown=True))
        if notes:
            st.caption(plain("The numbers on this server differ from what the lesson expects: " + "; ".join(notes)
                             + "."), help="Its evaluation rows or its build of the model differ from the "
                                          "lesson author's; the words around the numbers may not hold here.")
        if not lesson.linkable and ws.setup.model != lesson.model:
            st.button("Load this lesson's model", on_click=use_setup, key="lesson-model",
                      args=(replace(current_setup(), model=lesson.model, data=lesson.data, data_label=lesson.data),))
        # full page loads (target _self) of the neighbouring steps: the text is ours, the query is URL-encoded
        links = ([step_anchor(lesson, k - 1, f"← step {k - 1}")] if k > 1 else []) + \
            ([step_anchor(lesson, k + 1, f"step {k + 1} →")] if k < len(lesson.steps) else ["last step"])
        st.markdown(" · ".join(links), unsafe_allow_html=True)


# -- one example (model view, what the pruned model says) ---------------------------------------------------------

def example_picker(ws: Workspace, key: str, default_typed: str = "The film is slow, but the acting is wonderful.",
                   ) -> tuple[object, int | None]:
    """A text to look at: an evaluation row (with its ``targets_from``: demo-circuit scores the repeated half) or the
    user's own. Returns (text or (text, pair), targets_from); stops the page on an empty typed text. With the
    Attention page's ``key`` ("att") a link's sentence (``urlstate.apply``) opens here too."""
    source = st.radio("Text", ["from the evaluation set", "type one"], horizontal=True, key=f"{key}-source")
    if source == "type one":
        typed = {} if f"{key}-typed" in st.session_state else {"value": default_typed}   # no double default
        text = st.text_input("Your text", key=f"{key}-typed", max_chars=MAX_TYPED, **typed).strip()
        if not text:
            st.info("Type a text to look at.")
            st.stop()
        if ws.eval.pairs is not None:
            pair = st.text_input("Second text (this model reads pairs)", key=f"{key}-typed-pair").strip()
            return (text, pair or text), None
        return text, None
    n = min(len(ws.eval), 200)
    row = st.selectbox("Evaluation text", list(range(n)), key=f"{key}-row",
                       format_func=lambda i: f"{i}: " + (ws.eval.texts[i] if ws.eval.pairs is None
                                                         else f"{ws.eval.texts[i]} ⟂ {ws.eval.pairs[i]}")[:150])
    text = ws.eval.texts[row] if ws.eval.pairs is None else (ws.eval.texts[row], ws.eval.pairs[row])
    starts = ws.eval.targets_from
    return text, (None if starts is None else int(starts[row]))


# -- criteria -------------------------------------------------------------------------------------------------------

def criterion_picker(label: str, key: str, default: list[str], multi: bool = True,
                     exclude: tuple[str, ...] = ()) -> list[str]:
    names = [n for n in available() if n not in exclude]
    preset = key in st.session_state     # set by a shared link (urlstate.apply): the widget reads it, no default
    if multi:  # chips show names only; what each computes is in its settings expander and in the help
        return st.multiselect(label, names, default=None if preset else [d for d in default if d in names], key=key,
                              help="\n".join(f"- **{n}**: {help_for(n, 'criterion')}" for n in names))
    index = names.index(default[0]) if default and default[0] in names else 0
    return [st.selectbox(label, names, index=None if preset else index, key=key,
                         help=help_for(names[index], "criterion"))]


def _param_widget(crit: Criterion, name: str, value, key: str):
    p = crit.params[name]
    help_text = p.doc
    if p.choices is not None:
        choices = list(p.choices)
        return st.selectbox(name, choices, index=choices.index(value) if value in choices else 0, key=key,
                            help=help_text)
    if p.kind is bool:
        return st.checkbox(name, value=bool(value), key=key, help=help_text)
    if p.kind is int:
        return int(st.number_input(name, value=int(value), step=1, key=key, help=help_text))
    if p.kind is float:
        return float(st.number_input(name, value=float(value), key=key, help=help_text, format="%g"))
    return st.text_input(name, value=str(value), key=key, help=help_text)


def _needs_labels(crit: Criterion, params: dict) -> bool:
    """Whether ``crit`` needs labels with ``params`` (SAP does only when k is chosen on the metric); a parameter
    not accepted yet is reported when scoring, so the badge falls back to the criterion's default."""
    try:
        return crit.needs_labels_for(params)
    except HeadpruneError:
        return crit.needs_labels


def criterion_settings(name: str, sd: SessionData, key_prefix: str, expanded: bool = False) -> dict:
    """Expander: what the criterion computes (formula + paper) and its parameters. Returns the parameters."""
    crit = get(name)
    chosen = dict(sd.params.get(name, {}))
    with st.expander(f"**{name}** — {crit.description}", expanded=expanded):
        if crit.latex:
            st.latex(crit.latex)
        st.caption(f"Source: {crit.reference}")
        for pname, param in crit.params.items():
            chosen[pname] = _param_widget(crit, pname, chosen.get(pname, param.default),
                                          key=f"{key_prefix}-{name}-{pname}")
        changed = {k: v for k, v in chosen.items() if v != crit.params[k].default}
        flags = [f for f, on in (("re-scored after every removal", crit.dynamic),
                                 ("needs labels", _needs_labels(crit, changed)),
                                 ("uses gradients", crit.needs_gradients),
                                 ("parses the texts (spaCy)", crit.needs_parser)) if on]
        if flags:
            st.caption(" · ".join(flags))
    sd.params[name] = changed
    return changed


# -- head grids -----------------------------------------------------------------------------------------------------

def clickable_grid(fig: go.Figure, key: str, sd: SessionData, on_click: Callable[[tuple[int, int]], None]) -> None:
    """Draw a head grid whose cell clicks call ``on_click((layer, head))`` (once per click)."""
    widget_key = f"{key}-{sd.grid_version}"

    def clicked() -> None:
        with guard("Could not use that click"):
            event = st.session_state.get(widget_key) or {}
            selection = event.get("selection") if isinstance(event, dict) else getattr(event, "selection", None)
            head = viz.clicked_head(selection)
            if head is not None:
                on_click(head)
                urlstate.publish(draw=False)     # the address bar follows the click at once

    st.plotly_chart(fig, key=widget_key, on_select=clicked, selection_mode="points", width="stretch",
                    config={"displayModeBar": False})


# Every head at a glance: the atlas (one PNG of every head's thumbnail, ``views.head_atlas``) under one button per
# thumbnail that opens its head, with the head's role letters on it. Plain DOM, no Plotly: a Plotly click layer over
# the image cost about a second before the thumbnails showed (benchmarks/bench_model_view.py). The image and its
# buttons scale with the column (a fixed 672 px image hid heads 10-11 on a 390 px phone), up to 1.5x the image.
ATLAS_CSS = """
.hp-atlas { position: relative; width: 100%; background-size: 100% 100%; image-rendering: pixelated; }
.hp-head { position: absolute; box-sizing: border-box; margin: 0; padding: 1px; border: 0; border-radius: 0;
           background: transparent; cursor: pointer; display: flex; align-items: flex-start;
           justify-content: flex-end; }
.hp-head:hover, .hp-head:focus-visible { outline: 2px solid #ff006e; outline-offset: 1px; }
.hp-head span { font: 700 10px/1.1 ui-monospace, monospace; color: #b3001e; background: rgba(255, 255, 255, 0.85);
                padding: 0 2px; border-radius: 2px; pointer-events: none; }
"""
ATLAS_JS = """
export default function (component) {
  const { data, parentElement, setTriggerValue } = component;
  let root = parentElement.querySelector(".hp-atlas");
  if (!root) {
    root = document.createElement("div");
    root.className = "hp-atlas";
    parentElement.appendChild(root);
  }
  root.replaceChildren();
  root.style.aspectRatio = `${data.width} / ${data.height}`;
  root.style.maxWidth = `${data.max_width}px`;
  root.style.backgroundImage = `url(${data.uri})`;
  for (const cell of data.cells) {
    const button = document.createElement("button");
    button.className = "hp-head";
    button.setAttribute("aria-pressed", cell.open ? "true" : "false");
    Object.assign(button.style, {left: `${cell.x}%`, top: `${cell.y}%`, width: `${cell.w}%`, height: `${cell.h}%`});
    button.title = cell.title;
    button.setAttribute("aria-label", cell.title);
    button.dataset.head = `${cell.layer}.${cell.head}`;
    if (cell.mark) {
      const mark = document.createElement("span");
      mark.textContent = cell.mark;
      button.appendChild(mark);
    }
    button.onclick = () => setTriggerValue("head", [cell.layer, cell.head]);
    root.appendChild(button);
  }
}
"""
atlas_component = st.components.v2.component("headprune_atlas", css=ATLAS_CSS, js=ATLAS_JS)


def atlas_cells(atlas, titles, marks, opened: tuple[int, int] | None) -> list[dict]:
    """Where each thumbnail's button sits over the atlas image (in % of its width and height), with its hover
    ``titles`` (L x H), role ``marks`` (L x H, "" for none) and whether it is the ``opened`` head."""
    height, width = atlas.image.shape[:2]
    cells = []
    for layer in range(atlas.shape[0]):
        for head in range(atlas.shape[1]):
            x0, y0, x1, y1 = atlas.box(layer, head)
            cells.append({"layer": layer, "head": head, "x": 100 * x0 / width, "y": 100 * y0 / height,
                          "w": 100 * (x1 - x0) / width, "h": 100 * (y1 - y0) / height,
                          "title": str(titles[layer][head]), "mark": str(marks[layer][head] or ""),
                          "open": opened == (layer, head)})
    return cells


def atlas_picker(atlas, titles, marks, opened: tuple[int, int] | None, key: str,
                 on_pick: Callable[[tuple[int, int]], None]) -> None:
    """The atlas with a button on each thumbnail: a click calls ``on_pick((layer, head))`` before the rerun."""
    def picked() -> None:
        value = st.session_state.get(key)
        head = value.get("head") if isinstance(value, dict) else getattr(value, "head", None)
        if isinstance(head, (list, tuple)) and len(head) == 2:
            on_pick((int(head[0]), int(head[1])))

    height, width = atlas.image.shape[:2]
    atlas_component(key=key, data={"uri": atlas.data_uri(), "width": width, "height": height,
                                   "max_width": int(1.5 * width), "cells": atlas_cells(atlas, titles, marks, opened)},
                    on_head_change=picked)


def head_options(ws: Workspace) -> list[tuple[int, int]]:
    n_blocks, n_heads = ws.shape
    return [(b, h) for b in range(n_blocks) for h in range(n_heads)]


def head_picker(ws: Workspace, sd: SessionData, label: str, key: str, **kwargs) -> tuple[int, int] | None:
    """A head dropdown that shows and sets the one selected head (``sd.head``): a grid click anywhere moves it,
    and choosing here moves the outline. Returns the selected head (None until one is selected)."""
    options = head_options(ws)
    # the widget derives from the session's head, never keeps its own (it once toggled another head than the
    # outlined one: a dropdown that kept its own state)
    st.session_state[key] = sd.head if sd.head in options else None

    def chosen() -> None:
        sd.head = st.session_state[key]
        urlstate.publish(draw=False)

    return st.selectbox(label, options, key=key, on_change=chosen, placeholder="click a head on a grid", **kwargs)


def head_name(ws: Workspace, head: tuple[int, int]) -> str:
    block, h = head
    return f"head {h} (all layers, tied)" if ws.tied else f"layer {block} · head {h}"


# -- what a cut would give ---------------------------------------------------------------------------------------

CUT_KINDS = {"whole groups": "whole key/value groups — cuts cleanly",
             "equal per group": "the same number of heads from every group — cuts cleanly",
             "heads": "cuts cleanly"}


def cut_lines(ws: Workspace, mask) -> list[str]:
    """One line per changed layer of a grouped-query model on how surgery would cut ``mask`` (``cut_summary``):
    "layer 3: whole key/value groups — cuts cleanly", "layer 1: uneven — K/V of group 1 held 3×, +49,152
    parameters". Empty for multi-head attention, where every set of heads cuts cleanly."""
    if not ws.adapter.grouped:
        return []
    lines = []
    for row in cut_summary(ws.loaded.model, mask):
        if row["kind"] == "uneven":
            held = ", ".join(f"K/V of group {g} held {n}×" for g, n in row["kv_held"].items())
            text = f"uneven — {held}, +{row['kv_copy_parameters']:,} parameters"
        else:
            text = CUT_KINDS[row["kind"]]
        lines.append(f"layer {row['block']}: {text} ({row['query_heads']} query / {row['kv_heads']} key-value "
                     "heads left)")
    return lines


def speed_section(ws: Workspace, sd: SessionData, key: str) -> None:
    """Expander: measured vs ideal speed-up of the session's pruned model, timed on request (it takes seconds)."""
    with st.expander("How much faster is the pruned model?"):
        st.caption("Times the model as loaded and the pruned model (heads cut out) on random token ids: latency "
                   "at batch 1 and throughput at batch 32, sequence lengths 64 and 256, next to the ideal speed-up "
                   "from FLOPs. Takes several seconds.")
        report = measured_speed(ws, sd.mask)
        if report is None and st.button("Measure the speed-up", key=key, disabled=sd.n_gated == 0):
            with guard("Could not time the pruned model"):
                bar = progress_bar("timing the dense and the pruned model")
                report = measure_speed(ws, sd.mask, bar)
                bar.done()
        if report is not None:
            speed_report(report)


def speed_report(report: dict) -> None:
    """A ``speed.compare_speed`` report: the headline (ideal vs measured speed-up) and the per-length table."""
    head = speed_headline(report)
    if "ideal_speedup" not in head:
        st.warning(head.get("note", "Nothing could be timed."))
        return
    c1, c2, c3 = st.columns(3)
    c1.metric("ideal speed-up (FLOPs)", f"{head['ideal_speedup']:.2f}×")
    c2.metric("measured, throughput", f"{head['throughput_speedup']:.2f}×",
              help=f"batch {report['throughput_batch']}, length {head['length']}")
    c3.metric("measured, latency", f"{head['latency_speedup']:.2f}×",
              help=f"batch {report['latency_batch']}, length {head['length']}")
    share = "" if head["realised_share"] is None else \
        f" The clock realises {head['realised_share']:.0%} of the time saving FLOPs predict."
    st.caption(f"Length {head['length']} on {head['device']}, {head['torch_threads']} torch threads, median of "
               f"{report['repeats']} runs.{share}")
    st.dataframe(viz.readable(pd.DataFrame(speed_table(report))), hide_index=True, width="stretch")
