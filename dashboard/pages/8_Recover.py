"""Recover: train the pruned model back (fine-tuning, LoRA or distillation), pruned heads kept pruned."""

from dataclasses import replace

import pandas as pd
import streamlit as st

from dashboard.compute import (
    recovered_zip,
    recovery_estimate,
    recovery_table,
    recovery_train_source,
    run_recovery,
    stored_recovery,
)
from dashboard.export import export_formats
from dashboard.ui import guard, long_job, page
from headprune import viz
from headprune.recovery import DEFAULT_LR, METHODS, RecoverySpec

DEFAULTS = RecoverySpec()   # the widgets open on the library's measured recipe (recovery/spec.py), set nowhere else

ws, sd = page("Recover", "Pruning costs accuracy; a little training on what is left wins much of it back. The pruned "
                         "heads stay pruned: the cut model is trained, or, for the masked export, the original one "
                         "with those heads gated and held at zero.")
st.caption(f"The current mask prunes {sd.n_gated} heads (change it on the Prune page)"
           + (f", on top of the {ws.n_cut} cut out of the loaded model." if ws.n_cut else "."))

c1, c2, c3, c4 = st.columns(4)
method = c1.selectbox("Method", METHODS, index=METHODS.index(DEFAULTS.method), key="recover-method",
                      help="finetune: every kept parameter; lora: low-rank adapters (peft), merged on export; "
                           "distill: fine-tuning plus a KL to the dense model's outputs (Hinton et al.)")
epochs = c2.number_input("Epochs", min_value=1, max_value=20, value=DEFAULTS.epochs, key="recover-epochs")
steps = c3.number_input("Steps (0: whole epochs)", min_value=0, value=DEFAULTS.steps or 0, key="recover-steps")
# one widget per method: a keyed widget keeps its value when its default changes, so one shared key would keep
# full training's rate after a switch to LoRA (whose default is 5x higher)
lr = c4.number_input("Learning rate", min_value=1e-6, max_value=1e-1, value=DEFAULT_LR[method], format="%.6f",
                     key=f"recover-lr-{method}", help="peak rate after the warm-up; the default is the method's")
c1, c2, c3 = st.columns(3)
train = c1.text_input("Training data", recovery_train_source(ws), key="recover-train",
                      help="any data spec; the demos' fine-tuning split by default (offline)")
train_size = c2.number_input("Training rows", min_value=1, value=500, key="recover-train-size")
formats = export_formats(ws)
fmt = c3.radio("Export as", list(formats), format_func=lambda name: formats[name]["label"], horizontal=True,
               key="recover-format")

spec = None
with guard("These settings cannot be used"):
    spec = replace(DEFAULTS, method=method, epochs=int(epochs), steps=int(steps) or None, lr=float(lr),
                   max_length=ws.setup.max_length)
if spec is None:
    st.stop()


def recover(bar) -> dict:
    """The run, with its training loss drawn live below the bar (removed when the result's own chart is drawn)."""
    chart, losses = st.empty(), []

    def plot_loss(step: int, loss: float) -> None:
        losses.append(loss)
        chart.line_chart({"training loss": losses}, x_label="step", height=220)

    result = run_recovery(ws, sd, spec, train, int(train_size), fmt, bar, plot_loss)
    chart.empty()
    return result


done = long_job("recover-run", "Recover", recover, done=stored_recovery(sd, spec, train, int(train_size), fmt),
                estimate=lambda: recovery_estimate(ws, sd, spec, train, int(train_size), fmt),
                hint="Fewer training rows or steps make it shorter.", what="training",
                failed="Could not recover the model")

if done is not None:
    result = done["result"]
    st.subheader("Dense, pruned and recovered")
    st.table(viz.readable(pd.DataFrame(recovery_table(done))))
    st.caption(f"{result.steps} steps in {result.seconds:.0f} s, {result.trainable_parameters:,} trainable "
               f"parameters ({result.mode} model), on {len(ws.eval)} evaluation texts.")
    st.line_chart({"training loss": [loss for _, loss in result.losses]}, x_label="step", height=220)
    if st.button("Build the recovered model", key="recover-build"):
        with guard("Could not write the recovered model"):
            st.download_button("Recovered model (zip)", recovered_zip(ws, done),
                               file_name=f"headprune-recovered-{fmt}.zip", mime="application/zip",
                               key="recover-download", type="primary")
