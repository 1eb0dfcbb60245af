"""Trajectories: prune step by step in each criterion's order and plot the metric against the heads removed."""

import json

import streamlit as st

from dashboard.compute import (
    LESSON_ROWS,
    chart_metrics,
    chart_spreads,
    open_step,
    run_trajectories,
    smaller_sizes,
    tracks_stability,
    trajectories_estimate,
)
from dashboard.ui import (
    criterion_picker,
    criterion_settings,
    guard,
    long_job,
    page,
    page_path,
    rows_choice,
)
from headprune import viz
from headprune.trajectory import read_run_file

ws, sd = page("Trajectories")
st.caption("Each curve prunes heads in one criterion's order (least important first) and measures the model after "
           "every step, starting from the model as loaded. "
           + ("Higher" if ws.higher_is_better else "Lower") + " and flatter is better.")
n_units = ws.n_units
# perplexity and loss get worse upwards: the tolerance bound is dense / τ there, τ × dense for accuracy
past_tolerance = viz.tolerance_rule("τ", ws.higher_is_better)

with st.expander("Run trajectories", expanded=not sd.trajectories):
    chosen = criterion_picker("Criteria", "traj-criteria", ["ae", "his"], exclude=("random",))
    params = {name: criterion_settings(name, sd, "traj") for name in chosen}
    c1, c2, c3, c4 = st.columns(4)
    inverse = c1.checkbox("Also inverse orders", value=False, key="traj-inverse",
                          help="Most important first: a good criterion's inverse collapses fast.")
    seeds = int(c2.number_input("Random orders (seeds)", min_value=0, max_value=20, value=3, key="traj-seeds",
                                help="Baseline: random pruning orders, drawn as a box per ratio."))
    step = int(c3.number_input("Heads per step", min_value=1, max_value=n_units, value=max(1, n_units // 24),
                               key="traj-step"))
    budget = c4.slider("Prune up to (%)", 5, 100, 100, step=5, key="traj-budget") / 100
    c5, c6 = st.columns(2)
    tolerance = c5.slider(f"Tolerance τ (stop point: first {ws.metric} {past_tolerance})", 0.5, 1.0, 0.9,
                          step=0.01, key="traj-tolerance")
    stability = c6.checkbox("Record stability", value=False, key="traj-stability",
                            disabled=not tracks_stability(ws))
    rows = rows_choice(c5, "traj-rows", LESSON_ROWS, len(ws.eval), "each step",
                       "the demo's default run then takes about two minutes instead of ten")
    if len(ws.eval) > LESSON_ROWS:
        st.caption(f"Measured on **{rows or len(ws.eval)}** of the {len(ws.eval)} evaluation rows"
                   + (" (quick, for a lesson; choose *all* for the final numbers)." if rows else "."))
    n_runs = len(chosen) * (2 if inverse else 1) + seeds
    if n_runs:
        ran = long_job("traj-run", f"Run {n_runs} trajectories",
                       lambda bar: run_trajectories(ws, chosen, params, inverse, seeds, step, budget, tolerance,
                                                    stability, bar, rows),
                       estimate=lambda: trajectories_estimate(ws, chosen, params, inverse, seeds, step, budget,
                                                              stability, rows),
                       hint=smaller_sizes(ws), what="pruning step by step", failed="Could not run the trajectories")
        if ran is not None:
            sd.trajectories, sd.spreads, sd.tolerance = *ran, tolerance

with st.expander("Open run files (written by `python -m headprune trajectory --out …` or by Export)"):
    files = st.file_uploader("Run files (JSON)", type=["json"], accept_multiple_files=True, key="traj-files")
    if files and st.button("Add to the chart", key="traj-add"):
        for f in files:
            with guard(f"Could not read {f.name}"):
                trajs, spreads = read_run_file(f.getvalue(), f.name)
                sd.trajectories = sd.trajectories + trajs
                sd.spreads = sd.spreads + spreads

if not sd.trajectories and not sd.spreads:
    st.info("Run trajectories above, or open run files.")
    st.stop()

shown = [t for t in sd.trajectories if t.criterion != "random" or not sd.spreads]
c1, c2 = st.columns(2)
chart_metric = c1.selectbox("Metric (headline first)", chart_metrics(ws, sd.trajectories), key="traj-metric",
                            help="Every run records the task's whole metric set; the chart and the table's stop "
                                 "points read the one chosen here.")
tau = c2.slider("Tolerance line τ", 0.5, 1.0, sd.tolerance or 0.9, step=0.01, key="traj-tau")
fig = viz.trajectory_figure(shown, chart_spreads(sd.trajectories, sd.spreads, chart_metric), tolerance=tau,
                            metric=chart_metric)
st.plotly_chart(fig, width="stretch", key="traj-fig")
# opened run files may hold another model's runs: their own metric decides the direction
charted = shown[0] if shown else sd.trajectories[0] if sd.trajectories else None
higher = charted.higher_is_better if charted is not None else ws.higher_is_better
st.markdown(f"**Area under the curve and stop points** (AUC = mean metric over the pruned range, "
            f"{'higher' if higher else 'lower'} is better; stop point = last ratio before the metric is "
            f"{viz.tolerance_rule(tau, higher)})")
st.dataframe(viz.readable(viz.trajectory_table(sd.trajectories, tolerance=tau)), hide_index=True,
             width="stretch")
st.download_button("Download these runs (JSON)", key="traj-download", mime="application/json",
                   file_name="headprune-trajectories.json",
                   data=json.dumps({"trajectories": [t.to_json() for t in sd.trajectories], "spreads": sd.spreads},
                                   indent=1))
with st.expander("Open a step on Prune and Export", expanded=False):
    if sd.trajectories:
        labels = [viz.trajectory_label(t) for t in sd.trajectories]
        picked = st.selectbox("Run", range(len(labels)), format_func=labels.__getitem__, key="traj-open-run")
        run = sd.trajectories[picked]
        index = st.select_slider("Step", options=list(range(len(run.steps) + 1)), value=run.stop_index(),
                                 format_func=lambda i: f"{i}: {100 * run.ratios()[i]:.1f}% pruned",
                                 key="traj-open-step", help="Default: the run's stopping point (its last step, or "
                                                            "the last within its tolerance).")
        if st.button("Open this step on Prune", key="traj-open"):
            with guard("Could not open that step"):
                open_step(sd, run, index, labels[picked])
                st.switch_page(page_path("4_Prune.py"))
if st.button("Clear", key="traj-clear"):
    sd.trajectories, sd.spreads = [], []
    st.rerun()
