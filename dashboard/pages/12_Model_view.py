"""Every head at a glance: one small attention map per head for one text, pruned heads greyed; click one to open it."""

import numpy as np
import streamlit as st

from dashboard.compute import head_maps, stored_roles
from dashboard.ui import clickable_grid, example_picker, guard, head_name, page
from headprune import viz
from headprune.glossary import role_legend
from headprune.views import head_atlas

ws, sd = page("Every head at a glance", "One small attention map per head for one text: rows are queries (the "
                                        "token attending), columns keys (the token attended to), each map scaled "
                                        "to its own maximum. Greyed: pruned now. Click a head to open it large.")
text, _ = example_picker(ws, "att")   # the Attention page's keys: a link's sentence opens here too

maps = None
with guard("Could not run the model on this text"), st.spinner("Running the model …"):
    maps = head_maps(ws, text)
if maps is None:
    st.stop()
tokens, attention = maps

n_layers = attention.shape[0]
block_of = np.asarray(ws.adapter.layer_to_block)
live = (sd.mask.values.numpy() != 0)[block_of]            # forward layer -> its block's row of the mask
selected = None
if sd.head is not None and not ws.tied:
    selected = sd.head
atlas = head_atlas(attention, live, selected=selected)

report = stored_roles(ws)
marks = report.marks()[block_of] if report is not None else None
names = report.names()[block_of] if report is not None else np.full(live.shape, "", dtype=object)
hover = np.array([[f"layer {layer}, head {h}" + ("" if live[layer, h] else " · pruned")
                   + f"<br>max attention {atlas.peak[layer, h]:.2f}" + (f"<br>roles: {names[layer, h]}"
                                                                        if names[layer, h] else "")
                   for h in range(live.shape[1])] for layer in range(n_layers)], dtype=object)


def pick(cell: tuple[int, int]) -> None:
    sd.head = (int(block_of[cell[0]]), cell[1])
    st.session_state["glance-open"] = cell


st.caption(f"{n_layers} × {live.shape[1]} heads on {len(tokens)} tokens · {int((~live).sum())} greyed (pruned)")
fig = viz.atlas_figure(atlas.data_uri(), atlas.shape, hover=hover, marks=marks, tied=ws.tied,
                       layer_kinds=ws.adapter.layer_kinds)
clickable_grid(fig, "glance-atlas", sd, pick)
if report is not None:
    st.caption("Role letters: " + role_legend() + " (Roles page; the Glossary explains each).")
else:
    st.caption("Find the head roles on the **Roles** page to see a role letter on each map.")

opened = st.session_state.get("glance-open") or (sd.head if sd.head is not None and not ws.tied else None)
if opened is not None and opened[0] < n_layers:
    layer, head = opened
    st.subheader(f"{head_name(ws, (int(block_of[layer]), head))}" + ("" if live[layer, head] else " (pruned now)"))
    st.plotly_chart(viz.attention_figure(tokens, attention[layer, head],
                                         title=f"token attention, layer {layer}, head {head}"),
                    width="stretch", key="glance-large")
