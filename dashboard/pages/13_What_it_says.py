"""What the pruned model now says: one example through the model as loaded and the pruned one, side by side."""

import numpy as np
import streamlit as st

from dashboard.compute import example_comparison
from dashboard.ui import baseline_label, example_picker, guard, heads_left, page, plain
from headprune.glossary import help_for
from headprune.views import loss_change_html

ws, sd = page("What the pruned model says", "One example, the model as loaded beside the model with the heads "
                                            "pruned now (Prune page, or a lesson's link). It follows the mask.")
if ws.task.kind not in ("lm", "classification"):
    st.info(f"This view compares language models and classifiers; this model's task is {ws.task.kind}.")
    st.stop()

text, targets_from = example_picker(ws, "att")   # the Attention page's keys: a link's sentence opens here too
result = None
with guard("Could not run this example"), st.spinner("Running the dense and the pruned model …"):
    result = example_comparison(ws, text, sd.mask, targets_from)
if result is None:
    st.stop()
st.caption(f"heads left: **{heads_left(ws, sd)}**")

if ws.task.kind == "classification":
    left, right = st.columns(2)
    left.metric(baseline_label(ws).replace(ws.metric, "").strip() or "as loaded", plain(result.dense_label),
                f"p = {result.dense.max():.3f}", delta_color="off")
    right.metric("pruned", plain(result.pruned_label), f"p = {result.pruned.max():.3f}", delta_color="off")
    st.dataframe({"label": result.labels, "probability, as loaded": result.dense.round(4).tolist(),
                  "probability, pruned": result.pruned.round(4).tolist(),
                  "change": (result.pruned - result.dense).round(4).tolist()}, hide_index=True, width="stretch")
    st.stop()

scored = result.scored
left, right = st.columns(2)
left.metric("perplexity on this text, as loaded", f"{result.perplexity('dense'):,.2f}",
            help=help_for("perplexity"))
right.metric("perplexity on this text, pruned", f"{result.perplexity('pruned'):,.2f}", help=help_for("perplexity"))
st.markdown("**Each token coloured by the change in its loss** (pruned − as loaded): red = the pruned model finds "
            "the right token harder, blue = easier. Hover a token for its two losses." +
            ("" if scored[1:].all() else " Underlined: the tokens this data's metric scores (the rest is context)."))
position = st.session_state.get("says-pos")
if position is None and len(result.tokens) > 1:   # open where the pruning hurt a scored token most, not on <bos>
    hurt = np.where(scored[1:], np.nan_to_num(result.delta[1:], nan=-np.inf), -np.inf)
    position = int(np.argmax(hurt))
st.html(loss_change_html(result.tokens, result.dense_loss, result.pruned_loss, scored, selected=position))
delta = result.delta
half = np.flatnonzero(scored)
if half.size:
    st.caption(f"mean change over the scored tokens: {np.nanmean(delta[half]):+.2f} nats"
               + (f" · over the context before them: {np.nanmean(delta[1:half[0]]):+.2f} nats" if half[0] > 1 else ""))

st.subheader("Next-token guesses at one position")
positions = list(range(len(result.tokens) - 1))
position = st.select_slider("After the token", positions, value=min(position or 0, positions[-1]) if positions else 0,
                            key="says-pos", format_func=lambda i: f"{i}: {result.tokens[i]!r}")
actual = result.tokens[position + 1] if position + 1 < len(result.tokens) else ""
st.caption(f"The text goes on with **{plain(repr(actual))}**.")   # a token: the tokenizer's
c1, c2 = st.columns(2)
for column, title, top in ((c1, "as loaded", result.dense_top), (c2, "pruned", result.pruned_top)):
    column.markdown(f"**{title}**")
    column.dataframe({"guess": [repr(t) for t, _ in top[position]], "probability": [round(p, 4) for _, p in
                                                                                   top[position]]},
                     hide_index=True, width="stretch")
