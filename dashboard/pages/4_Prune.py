"""Prune: click heads to prune or restore them and watch the evaluation metric move live."""

import time

import numpy as np
import pandas as pd
import streamlit as st

from dashboard.compute import (
    choice_table,
    criterion_mask,
    enable_stability,
    live_estimate,
    session_metrics,
    smaller_sizes,
    stored_roles,
    tracks_stability,
)
from dashboard.session import SessionData
from dashboard.store import DashboardWorkspace as Workspace
from dashboard.ui import (
    baseline_label,
    change_delta,
    clickable_grid,
    criterion_picker,
    cut_lines,
    cut_note,
    estimate_line,
    guard,
    head_name,
    head_options,
    head_picker,
    heads_left,
    job,
    page,
    plain,
    progress_bar,
    role_marks,
    running_metric,
    sidebar_counts,
    speed_section,
    view_fragment,
)
from headprune import viz
from headprune.model.mask import HeadMask
from headprune.model.sizes import parameters_left

# one line at 1280 px, so the metric row and the grid share a 720 px screen (the metric's help says how it arrives)
ws, sd = page("Prune", "Click a head to prune it, again to restore it: the layers from it up are re-run and the "
                       "metric follows, exact once its last batch is in.", live_counts=True)


def toggle(head: tuple[int, int]) -> None:
    sd.head = head
    sd.toggle(head, head_name(ws, head))  # MaskError (shown by the caller's guard) for a head cut out of the weights


def toggle_button() -> None:
    """The button acts on the one selected head (the outlined cell), whatever selected it."""
    with guard("Could not toggle that head"):
        toggle(sd.head)


# -- numbers ---------------------------------------------------------------------------------------------
ESTIMATE_INTERVAL = 0.3  # seconds between two redraws of the running estimate
LAST_EXACT = "prune-last-exact"  # session key: (workspace key, the last exact headline value shown)


def numbers(ws: Workspace, sd: SessionData) -> None:
    """The metric row: counts at once, the headline metric as a running estimate, then exact."""
    dense_value, baseline = ws.metric_of(ws.dense()), baseline_label(ws)
    short = "as loaded" if ws.n_cut else "dense"
    params = parameters_left(ws.loaded.model, sd.mask)
    total = ws.counts["total"]["params"]
    c1, c2, c3, c4 = st.columns(4)
    c2.metric("heads left", heads_left(ws, sd), f"-{sd.n_gated}" if sd.n_gated else None, delta_color="off",
              help=f"{ws.n_cut} cut out of the loaded model, {sd.n_gated} pruned here" if ws.n_cut else None)
    # the arrow follows the sign; red when the cut model would be *bigger*: an uneven grouped-query cut holds
    # key/value rows more than once, which can outweigh the heads' own rows (see "Cutting these heads out")
    c3.metric("parameters left", f"{params / 1e6:.2f} M", f"{100 * (params - total) / total:+.1f}%" if sd.n_gated
              else None, delta_color="inverse",
              help="The pruned model's size once the heads are cut, counting the key/value rows an uneven "
                   "grouped-query cut holds more than once: then it can grow (red), see \"Cutting these heads out "
                   "of the weights\" below.")
    headline, side_metric = c1.empty(), c4.empty()
    side_metric.metric(baseline, viz.metric_text(dense_value))

    shown_at = [0.0]
    # the last exact value of this session (dense before its first change): what stays, greyed, until a running
    # estimate is precise enough to be shown (progressive.Estimate.shown)
    last_key, last_exact = st.session_state.get(LAST_EXACT, (ws.key, dense_value))
    previous = last_exact if last_key == ws.key else dense_value

    def show_estimate(estimate) -> None:
        # the exact value is drawn below, with its change against the dense model; the browser shares the CPU
        # with the evaluation, so running values are redrawn at most every ESTIMATE_INTERVAL seconds
        if estimate.exact or time.monotonic() - shown_at[0] < ESTIMATE_INTERVAL:
            return
        shown_at[0] = time.monotonic()
        headline.metric(**running_metric(ws.metric, estimate, previous))

    with guard("Could not evaluate this mask"):
        if sd.live is None:
            estimate_line(live_estimate(ws), smaller_sizes(ws))
            # a progress bar, not an st.status: inside this fragment Streamlit 1.67 sends a status's update to a
            # stale delta path when its first message has already left (a busy server: 5 of 10 students opening a
            # lesson link at once got a blank page, "Cannot set a node at a delta path"; streamlit#16281)
            bar = progress_bar("Preparing live evaluation: one pass over the evaluation set (caching layer inputs)")
            metrics, stability = session_metrics(ws, sd, show_estimate, bar)
            bar.done()
        else:
            metrics, stability = session_metrics(ws, sd, show_estimate)
        value = ws.metric_of(metrics)
        st.session_state[LAST_EXACT] = (ws.key, value)
        headline.metric(ws.metric, viz.metric_text(value), **change_delta(value, dense_value, ws.higher_is_better,
                                                                          short),
                        help=f"{baseline}: {viz.metric_text(dense_value)}" + ("" if ws.higher_is_better else
                                                                             " (lower is better)"))
        if stability is not None:
            side_metric.metric("stability", f"{stability:.1f}%",
                               help="Predictions unchanged when 10% of the words are dropped.")
        if sd.last_change:
            st.caption(f"Last change: {plain(sd.last_change)}. Loss {metrics.loss:.4f}.")   # names a file


def choices(ws: Workspace, sd: SessionData) -> None:
    """Multiple choice: one question's choices with their log-likelihoods before and after pruning."""
    if not ws.task.is_choice or sd.live is None:
        return
    st.markdown("**What the pruned model now prefers**")
    question = int(st.number_input(f"Question (0-{len(ws.eval) - 1} of the evaluation split)", min_value=0,
                                   max_value=len(ws.eval) - 1, value=0, key="prune-question"))
    shown = choice_table(ws, sd, question)
    st.caption(f"Context: {plain(shown['context'])}")
    st.dataframe(pd.DataFrame(shown["table"]), hide_index=True, width="stretch",
                 column_config={k: st.column_config.NumberColumn(format="%.3f") for k in shown["table"]
                                if k.startswith(("log", "per"))})
    st.caption("Summed log-likelihood of each choice's tokens after the context; acc picks the highest, acc_norm "
               "the highest per character.")


def one_head_controls(ws: Workspace, sd: SessionData) -> None:
    st.markdown("**Prune or restore one head**")
    head = head_picker(ws, sd, "Head", "prune-head", format_func=lambda h: head_name(ws, h)
                       + (" — cut in the loaded model" if sd.is_cut(h) else
                          " — pruned" if sd.mask.values[h] == 0 else ""))
    b1, b2, b3 = st.columns([2, 1, 1])
    b1.button("Prune / restore", on_click=toggle_button, type="primary", key="prune-toggle",
              width="stretch", disabled=head is None or sd.is_cut(head))
    b2.button("Undo", on_click=sd.undo, disabled=not sd.history, key="prune-undo", width="stretch")
    b3.button("Reset", on_click=sd.reset, disabled=sd.n_gated == 0, key="prune-reset", width="stretch")


def criterion_controls(ws: Workspace, sd: SessionData) -> None:
    st.markdown("**Prune the lowest x% by a criterion**")
    crit = criterion_picker("Criterion", "prune-crit", ["ae"], multi=False)[0]
    # a link's ratio is set on the widget's key (urlstate.apply): then no default beside it (Streamlit warns of both)
    default = {} if "prune-ratio" in st.session_state else {"value": 25}
    ratio = st.slider("Heads pruned in total (%)", 0, 100, step=5, key="prune-ratio", **default) / 100
    if st.button("Apply", key="prune-apply"):
        applied = False
        with guard(f"Could not prune by {crit}"), job(f"Apply (prune the lowest {ratio:.0%} by {crit})"):
            bar = progress_bar(f"scoring heads by {crit}")
            mask, what = criterion_mask(ws, sd, crit, ratio, bar)   # SAP: its own selection at that sparsity
            bar.done()
            sd.set_mask(mask, what)
            applied = True
        if applied:
            st.rerun()


def role_controls(ws: Workspace, sd: SessionData) -> None:
    """Prune every head of a role, or keep only them (the Roles page finds the roles)."""
    report = stored_roles(ws)
    if report is None:
        return
    st.markdown("**Prune by head role**")
    present = [r for r, n in report.counts().items() if n]
    role = st.selectbox("Role", present, key="prune-role",
                        format_func=lambda r: f"{r} ({int(report.heads_with(r).sum())} heads)")
    heads = report.heads_with(role)
    pruned = HeadMask(np.where(heads, 0.0, sd.mask.values.numpy()))
    alone = HeadMask(np.where(heads, sd.mask.values.numpy(), 0.0))
    c1, c2 = st.columns(2)
    c1.button("Prune this role", key="prune-role-prune", width="stretch", on_click=sd.set_mask,
              args=(pruned, f"pruned the {role} heads"))
    c2.button("Keep only this role", key="prune-role-keep", width="stretch", on_click=sd.set_mask,
              args=(alone, f"kept only the {role} heads"))


def options(ws: Workspace, sd: SessionData) -> None:
    st.markdown("**Options**")
    if tracks_stability(ws):
        want = st.toggle("Track stability", value=sd.live_stable is not None, key="prune-stability",
                         help="Share of evaluation texts whose prediction (for multiple choice: the picked choice, "
                              "the context perturbed) survives dropping 10% of their words (costs a second live "
                              "evaluation).")
        if want and sd.live_stable is None:
            with guard("Could not prepare stability"):   # a bar, not an st.status: see numbers()
                bar = progress_bar("Preparing stability: caching layer inputs of the evaluation texts with 10% of "
                                   "their words dropped")
                enable_stability(ws, sd, bar)
                bar.done()
                st.rerun()
        elif not want and sd.live_stable is not None:
            sd.live_stable = None
            st.rerun()
    upload = st.file_uploader("Load a mask (JSON file)", type=["json"], key=f"prune-mask-upload-{sd.grid_version}",
                              help='{"pruned": {"<layer>": [head, ...]}}, 0-based, as Export writes it.')
    pasted = st.text_area("… or paste a mask", key=f"prune-mask-text-{sd.grid_version}", height=80,
                          placeholder='{"pruned": {"0": [3, 7], "5": [1]}}')
    if upload is not None or (pasted.strip() and st.button("Apply this mask", key="prune-mask-apply")):
        with guard("That mask does not fit"):
            raw, name = (upload.getvalue(), upload.name) if upload is not None else (pasted.encode(), "the mask")
            sd.set_mask(HeadMask.from_bytes(raw, name, ws.shape), f"loaded {name}")
            st.rerun()


def grid(ws: Workspace, sd: SessionData) -> None:
    colour_by = st.selectbox("Colour kept heads by", ["(none)"] + list(sd.scores), index=1 if sd.scores else 0,
                             key="prune-colour",
                             help="Scores computed on the Head scores page: darker = kept longer by that criterion.")
    score = sd.scores.get(colour_by)
    if score is not None and score.shape != ws.shape:
        score = None
    fig = viz.mask_figure(sd.mask, selected=sd.head, score=score, cut=sd.base, **viz.grid_options(ws.adapter),
                          **role_marks(ws))
    clickable_grid(fig, "prune-grid", sd, toggle)
    if ws.tied:
        st.caption("ALBERT shares one attention block across all layers: each column is one head in every layer.")
    if ws.eval_note:   # a big model: the rows and batches a click re-evaluates in time here (store.sized_for_clicks)
        st.caption(plain(ws.eval_note))
    if sd.live is not None:
        note = sd.live.fallback_reason or (f"Live cache {sd.live.cache_megabytes():.0f} MB; a change in layer l "
                                           "re-runs layers l and up.")
        st.caption(plain(note))


def cuttable(ws: Workspace, sd: SessionData) -> None:
    """Which pruned sets surgery can cut cleanly (grouped-query attention), and how fast the cut model runs."""
    lines = cut_lines(ws, sd.mask)
    if lines:
        st.markdown("**Cutting these heads out of the weights**")
        st.markdown("\n".join(f"- {line}" for line in lines))
    speed_section(ws, sd, "prune-speed")


# The metrics, the grid and every control that changes the mask: a click here reruns only this fragment (the
# title, the sidebar's fixed rows and other pages' state are not redrawn), and the sidebar's counts are written
# from here so they follow the click.
@view_fragment   # its every run ends by writing the view to the address bar and the sidebar's link
def live_view() -> None:
    sidebar_counts(ws, sd)
    metric_row = st.container()
    grid_col, side = st.columns([3, 2], gap="large")
    # drawing order (not layout order): the clicked grid first, then the numbers as they arrive, then the rest
    with grid_col:
        grid(ws, sd)
    with metric_row:
        numbers(ws, sd)
    with grid_col:
        choices(ws, sd)
        cuttable(ws, sd)
    with side:
        one_head_controls(ws, sd)
        criterion_controls(ws, sd)
        role_controls(ws, sd)
        options(ws, sd)


if ws.n_cut:
    st.info(cut_note(ws))
if sd.head is None:    # one head is always outlined here, and it is the one "Prune / restore" acts on
    sd.head = head_options(ws)[0]
live_view()
