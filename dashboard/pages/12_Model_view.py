"""Every head at a glance: one small attention map per head for one text, pruned heads greyed; click one to open it."""

import numpy as np
import streamlit as st

from dashboard import urlstate
from dashboard.compute import head_maps, stored_roles
from dashboard.ui import atlas_picker, example_picker, guard, head_name, page
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
marks = report.marks()[block_of] if report is not None else np.full(live.shape, "", dtype=object)
names = report.names()[block_of] if report is not None else np.full(live.shape, "", dtype=object)

st.caption(f"{n_layers} × {live.shape[1]} heads on {len(tokens)} tokens · {int((~live).sum())} greyed (pruned) · "
           f"rows: layers 0 (top) to {n_layers - 1}; columns: heads 0 (left) to {live.shape[1] - 1}")
opened = st.session_state.get("glance-open") or (sd.head if sd.head is not None and not ws.tied else None)


def open_head(layer: int, head: int) -> None:
    sd.head = (int(block_of[layer]), head)
    st.session_state["glance-open"] = (layer, head)
    urlstate.publish(draw=False)      # the address bar follows the click at once


# a click on a thumbnail opens its head; its role letters sit on it (ui.atlas_picker)
titles = [[f"layer {layer} · head {h}" + (f" · {names[layer, h]}" if names[layer, h] else "")
           + ("" if live[layer, h] else " · pruned now") for h in range(live.shape[1])] for layer in range(n_layers)]
shown = np.where(live, marks, np.char.add(marks.astype(str), " ✕"))
atlas_picker(atlas, titles, shown, opened, "glance-atlas", lambda cell: open_head(*cell))
with st.expander("Open a head by its number"):
    for layer in range(n_layers):
        key = f"glance-pick-{layer}"
        # every row shows the one opened head (a pick in another row clears this one), as the dropdowns do
        st.session_state[key] = opened[1] if opened is not None and opened[0] == layer else None

        def picked(layer=layer, key=key) -> None:
            head = st.session_state.get(key)
            if head is not None:
                open_head(layer, head)

        st.pills(f"layer {layer}", list(range(live.shape[1])), key=key, on_change=picked,
                 format_func=lambda h, layer=layer: f"{h}{' ' + marks[layer, h] if marks[layer, h] else ''}"
                                                    f"{'' if live[layer, h] else ' ✕'}")
if report is not None:
    st.caption("Click a map to open its head. Role letters: " + role_legend() + " (Roles page; the Glossary explains "
               "each). ✕: pruned now.")
else:
    st.caption("Click a map to open its head. Find the head roles on the **Roles** page to see role letters on the "
               "maps. ✕: pruned now.")

if opened is not None and opened[0] < n_layers:
    layer, head = opened
    st.subheader(f"{head_name(ws, (int(block_of[layer]), head))}" + ("" if live[layer, head] else " (pruned now)"))
    st.caption(f"max attention {atlas.peak[layer, head]:.2f}" + (f" · roles: {names[layer, head]}"
                                                                 if names[layer, head] else ""))
    st.plotly_chart(viz.attention_figure(tokens, attention[layer, head],
                                         title=f"token attention, layer {layer}, head {head}"),
                    width="stretch", key="glance-large")
