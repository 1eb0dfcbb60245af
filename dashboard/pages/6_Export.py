"""Export: the mask, the scores, figures, a run file and the pruned model (headprune, masked or uniform stock, an
ONNX graph timed in onnxruntime, or a GGUF file for llama.cpp)."""

import json

import pandas as pd
import streamlit as st

from dashboard.export import (
    GGUF_GAIN,
    HARNESS_TASKS,
    ONNX_MEASURED,
    build_pruned_model,
    built_model,
    compare_uniform,
    compared_metrics,
    export_formats,
    gguf_types,
    harness_estimate,
    harness_problem,
    harness_rows,
    harness_runs,
    harness_tasks,
    onnx_timing,
    render_images,
    rendered_images,
    run_file,
    run_harness,
    runtime_rows,
    time_onnx,
    uniform_preview,
)
from dashboard.ui import (
    cancel_button,
    cancelled_note,
    change_delta,
    estimate_line,
    guard,
    job,
    long_job,
    page,
    plain,
    progress_bar,
    speed_section,
)
from headprune import viz

ws, sd = page("Export")
st.caption(f"The current mask prunes {sd.n_gated} heads (change it on the Prune page)"
           + (f", on top of the {ws.n_cut} cut out of the loaded model." if ws.n_cut else "."))

st.subheader("Mask, scores and run file")
c1, c2, c3 = st.columns(3)
c1.download_button("Mask (JSON)", json.dumps(sd.mask.to_json(), indent=1), file_name="headprune-mask.json",
                   mime="application/json", key="export-mask", width="stretch")
c1.caption('`{"pruned": {"<layer>": [heads]}}` — load it on the Prune page or with `--mask`.')
scores_csv = viz.scores_frame(sd.scores).to_csv(index=False) if sd.scores else ""
c2.download_button("Scores (CSV)", scores_csv, file_name="headprune-scores.csv", mime="text/csv",
                   disabled=not sd.scores, key="export-scores", width="stretch")
c2.caption(f"{len(sd.scores)} criteria: criterion, layer, head, score, rank." if sd.scores else
           "Compute scores on the Head scores page first.")
c3.download_button("Run file (JSON)", json.dumps(run_file(ws, sd), indent=1), file_name="headprune-run.json",
                   mime="application/json", key="export-run", width="stretch")
c3.caption("Model, data, mask, metrics, scores and trajectories; reopen it on the Trajectories page.")

st.subheader("Figures")
figures = {"Head mask": lambda: viz.mask_figure(sd.mask, **viz.grid_options(ws.adapter))}
for name, score in sd.scores.items():
    figures[f"Scores: {name}"] = lambda score=score: viz.score_heatmap(score, title=score.criterion,
                                                                          **viz.grid_options(ws.adapter))
if len(sd.scores) >= 2:
    figures["Rank correlation"] = lambda: viz.correlation_figure(viz.rank_correlation(sd.scores))
if sd.trajectories or sd.spreads:
    figures["Trajectories"] = lambda: viz.trajectory_figure(
        [t for t in sd.trajectories if t.criterion != "random" or not sd.spreads], sd.spreads,
        tolerance=sd.tolerance)
which = st.selectbox("Figure", list(figures), key="export-figure")
fig = figures[which]()
slug = which.lower().replace(": ", "-").replace(" ", "-")
c1, c2, c3 = st.columns(3)
c1.download_button("HTML (interactive, opens offline)", viz.figure_html(fig), file_name=f"headprune-{slug}.html",
                   mime="text/html", key="export-html", width="stretch")
images = rendered_images(sd, which)
if images is None:
    if c2.button("Render PNG and SVG", key="export-render", width="stretch"):
        try:
            with st.spinner("Rendering with kaleido …"):
                images = render_images(sd, which, fig)
        except RuntimeError as exc:
            st.warning(f"{plain(exc)} PNG and SVG need kaleido and a local Chromium; the HTML export always works.")
if images is not None:
    c2.download_button("PNG", images["png"], file_name=f"headprune-{slug}.png", mime="image/png", key="export-png",
                       width="stretch")
    c3.download_button("SVG (text stays text)", images["svg"], file_name=f"headprune-{slug}.svg",
                       mime="image/svg+xml", key="export-svg", width="stretch")
# a preview, not a tool: without the modebar nothing sits over the grid's top-right cells
st.plotly_chart(fig, width="stretch", key="export-preview", config={"displayModeBar": False})

st.subheader("Pruned model")
formats = export_formats(ws)
fmt = st.radio("Format", list(formats), format_func=lambda name: formats[name]["label"], horizontal=True,
               key="export-format")
with st.expander("Which runtime loads what"):
    st.table(runtime_rows())
st.caption(f"{formats[fmt]['what'].capitalize()}. Loads in: {formats[fmt]['loads_in']}."
           + ("" if formats[fmt]["saves_compute"] else " It saves no compute: same size and speed as the original."))
problem = formats[fmt]["problem"]
gguf_type = None
if problem:
    st.info(problem)
elif fmt == "gguf":
    types = gguf_types()
    gguf_type = st.radio("Tensor type", list(types), format_func=types.get, horizontal=True, key="export-gguf-type")
    st.caption(GGUF_GAIN)
elif fmt == "uniform":
    st.write(uniform_preview(ws, sd)["text"])
    compared = compared_metrics(sd)
    if compared is None and st.button("Compare the mask with its nearest uniform mask", key="export-compare"):
        with guard("Could not evaluate the two masks"):
            bar = progress_bar("evaluating both masks")
            compared = compare_uniform(ws, sd, bar)
            bar.done()
    if compared is not None:
        c1, c2 = st.columns(2)
        c1.metric(f"{ws.metric} under the mask", viz.metric_text(compared["mask"]))
        c2.metric(f"{ws.metric} under the uniform mask", viz.metric_text(compared["uniform"]),
                  **change_delta(compared["uniform"], compared["mask"], ws.higher_is_better, "the mask"))
built = None if problem else built_model(sd, fmt, gguf_type)
if not problem and built is None and st.button("Build the pruned model", type="primary", key="export-build"):
    with guard("Could not build the pruned model"):
        bar = progress_bar("writing, checking, zipping")
        built = build_pruned_model(ws, sd, bar, fmt, gguf_type)
        bar.done()
if built is not None:
    if built["rounding"]:
        st.caption(plain(built["rounding"]))
    c1, c2 = st.columns([1, 2])
    c1.metric(f"{ws.metric} of the pruned model", viz.metric_text(built["metric"]),
              **change_delta(built["metric"], ws.metric_of(ws.dense()), ws.higher_is_better,
                             "as loaded" if ws.n_cut else "dense"))
    c1.download_button("Pruned model (zip)", built["zip"], file_name=f"headprune-{fmt}-model.zip",
                       mime="application/zip", key="export-model", type="primary", width="stretch")
    c1.caption(f"{len(built['zip']) / 2**20:.1f} MB zipped. {plain(built['note'])}")
    if built["onnx"]:
        c1.caption(f"onnxruntime ran the file on {built['onnx']['rows']} evaluation rows: its logits equal the cut "
                   f"model's within {built['onnx']['relative']:.0e} of their scale.")
    c2.dataframe(viz.readable(viz.size_table(built["size"])),
                 hide_index=True, width="stretch")
if fmt == "onnx" and not problem:
    st.caption(ONNX_MEASURED)
if fmt == "onnx" and not problem and sd.n_gated:
    timed = long_job("export-onnx-speed", "Time the pruned and the dense graph in onnxruntime",
                     lambda bar: time_onnx(ws, sd, bar), done=onnx_timing(sd), failed="Could not time the two graphs",
                     what="exporting the dense graph too, then timing both in turn")
    if timed is not None:
        c1, c2 = st.columns(2)
        c1.metric("pruned / dense time, onnxruntime", f"{timed['ratio']:.2f}",
                  help=f"middle half of the per-round ratios: {timed['spread'][0]:.2f} to {timed['spread'][1]:.2f}")
        c2.metric("ideal (FLOPs)", f"{timed['ideal_ratio']:.2f}")
        st.caption(f"Median of {timed['repeats']} rounds, the two graphs in turn, on a batch of {timed['batch']} x "
                   f"{timed['length']} tokens, {timed['threads']} threads, {timed['runtime']}, on this machine now "
                   "(a busy machine moves the ratio; the manual's Exports page has medians of many runs).")

st.subheader("lm-evaluation-harness")
problem = harness_problem(ws)
if problem:
    st.info(problem)
else:
    c1, c2 = st.columns([3, 1])
    names = c1.text_input("Tasks (comma-separated)", HARNESS_TASKS, key="export-lmeval-tasks",
                          help="lm-eval task names. demo_lm_cloze ships with headprune and runs offline; hellaswag, "
                               "arc_easy and arc_challenge download their data from the Hugging Face hub once.")
    limit = c2.number_input("Examples per task", min_value=1, value=50, step=10, key="export-lmeval-limit")
    tasks = None
    with guard("Could not find the lm-eval tasks"):
        with st.spinner("Looking the tasks up in lm-eval's index …"):
            tasks = harness_tasks(ws, names, int(limit))
    if tasks is not None:
        with guard("Could not estimate how long lm-eval takes"):
            estimate_line(harness_estimate(ws, sd, tasks), "Lower the examples per task.")
        cancelled_note("export-lmeval-cancel")
        if st.button("lm-eval", key="export-lmeval", type="primary",
                     help="Run the tasks on the model as loaded (dense) and under the current mask (heads gated "
                          "on a copy, exactly as removed)"):
            with guard("lm-eval did not finish"), job("lm-eval"):
                cancel_button("export-lmeval-cancel")
                bar = progress_bar(f"lm-eval {plain(names)}")
                run_harness(ws, sd, tasks, bar)
                bar.done()
        rows = harness_rows(harness_runs(ws, sd, tasks))
        if rows:
            st.dataframe(viz.readable(pd.DataFrame(rows)), hide_index=True, width="stretch")
            st.caption(f"lm-evaluation-harness, at most {int(limit)} examples per task, the task's own few-shot "
                       "setting (0 for most); ± is lm-eval's standard error.")

speed_section(ws, sd, "export-speed")
