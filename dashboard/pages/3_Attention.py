"""Attention: what one head looks at in one sentence, drawn over the sentence's dependency arcs."""

import numpy as np
import streamlit as st

from dashboard.compute import arcs_for, profile_for, stored_profile, syntax_problem
from dashboard.ui import MAX_TYPED, clickable_grid, guard, long_job, page, plain, role_marks, view_fragment
from headprune import viz
from headprune.glossary import dependency_help

ws, sd = page("Attention", "Pick a sentence and a head. Arcs go from a word to its grammatical head; "
                           "the thicker and redder an arc, the more this head attends along it.")
n_layers, n_heads = ws.adapter.n_layers, ws.shape[1]


def sentence_options() -> list:
    texts = ws.eval.texts[:200]
    return list(zip(texts, ws.eval.pairs[:200])) if ws.eval.pairs is not None else texts


source = st.radio("Sentence", ["from the evaluation set", "type one"], horizontal=True, key="att-source")
if source == "type one":
    # the same key and max_chars as the other views' typed text (ui.example_picker), so the sentence goes with the
    # reader from page to page; a default only when none is kept (a widget given both warns)
    typed = {} if "att-typed" in st.session_state else {"value": "The film is slow, but the acting is wonderful."}
    text = st.text_input("Your sentence", key="att-typed", max_chars=MAX_TYPED, **typed).strip()
    if ws.eval.pairs is not None and text:
        pair = st.text_input("Second text (this model reads pairs)", key="att-typed-pair").strip()
        text = (text, pair or text)
else:
    options = sentence_options()
    text = st.selectbox("Evaluation text", options, key="att-pick",
                        format_func=lambda t: (" ⟂ ".join(t) if isinstance(t, tuple) else t)[:160])
if not text:
    st.info("Type a sentence to see its attention.")
    st.stop()


arcs = None
with guard("Could not parse this sentence or capture its attention"), st.spinner("Parsing and running the model …"):
    arcs = arcs_for(ws, text, sd.mask)
if arcs is None:
    st.stop()
no_syntax = syntax_problem(ws)   # data that is not a language: no arcs, no profile (the reason is shown)
if no_syntax:
    st.info(plain(no_syntax), icon="ℹ️")

# -- which head -----------------------------------------------------------------------------------------------------
if "att-layer" not in st.session_state:  # entering the page: the head selected elsewhere, else the most syntactic
    if sd.head is not None:
        layer0 = sd.head[0] if not ws.tied else st.session_state.get("att-layer-value", 0)
        head0 = sd.head[1]
    elif arcs.arcs and not no_syntax:
        layer0, head0 = np.unravel_index(int(np.argmax(np.where(arcs.live, arcs.arc_values().mean(-1), -1))),
                                         (n_layers, n_heads))
    else:
        layer0, head0 = 0, 0
    st.session_state["att-layer"], st.session_state["att-head"] = int(min(layer0, n_layers - 1)), int(head0)


# A head click (grid or pickers) reruns only this part: the sentence is not parsed or run again.
@view_fragment   # its every run ends by writing the view to the address bar and the sidebar's link
def head_view() -> None:
    if sd.head is not None and not ws.tied:    # the one selected head, wherever it was chosen, is the one shown
        st.session_state["att-layer"], st.session_state["att-head"] = sd.head
    def picked() -> None:
        sd.head = (ws.adapter.layer_to_block[st.session_state["att-layer"]], st.session_state["att-head"])

    c1, c2 = st.columns(2)
    layer = c1.selectbox("Layer", list(range(n_layers)), key="att-layer", on_change=picked)
    head = c2.selectbox("Head", list(range(n_heads)), key="att-head", on_change=picked)
    st.session_state["att-layer-value"] = layer
    sd.head = (ws.adapter.layer_to_block[layer], head)

    def pick(cell: tuple[int, int]) -> None:
        st.session_state["att-layer"], st.session_state["att-head"] = cell
        st.session_state["att-layer-value"] = cell[0]
        sd.head = (ws.adapter.layer_to_block[cell[0]], cell[1])

    title = f"layer {layer}, head {head}"
    if not arcs.live[layer, head]:
        if sd.is_cut((ws.adapter.layer_to_block[layer], head)):
            st.warning(f"Head {head} of layer {layer} was cut out of the loaded model: it attends to nothing.")
        else:
            st.warning(f"Head {head} of layer {layer} is pruned: it attends to nothing. Restore it on the Prune page.")
    if arcs.arcs and not no_syntax:
        st.plotly_chart(viz.arc_figure(arcs.words, arcs.arcs, arcs.arc_weights(layer, head), title=title,
                                       seen=arcs.seen), width="stretch", key="att-arcs")
        with st.expander("What do these labels mean?"):
            st.markdown(dependency_help(arcs.labels))     # spaCy's own explanation of each label drawn
    elif not no_syntax:
        st.info("The parser found no dependency arcs in this text.")
    future = arcs.dropped.get("future head", 0)
    unreadable = sum(arcs.dropped.values()) - future
    if arcs.causal and not no_syntax:
        st.caption(f"This model's attention is causal: a word sees only itself and the words before it, so only "
                   f"arcs whose grammatical head comes first are drawn ({future} with the head later in the "
                   "sentence left out as \"future head\").")
    if unreadable and not no_syntax:
        st.caption(f"{unreadable} arcs not drawn (words cut by the max length, or not aligned to tokens).")

    grid_col, map_col = st.columns([2, 3], gap="large")
    with grid_col:
        st.markdown("**Heads** — click one" if no_syntax else
                    "**Attention along the arcs, per head** (mean over this sentence's arcs) — click a head")
        values = arcs.arc_values().mean(axis=-1) if arcs.arcs and not no_syntax else np.zeros((n_layers, n_heads))
        pruned = ~arcs.live
        hover = np.array([[f"layer {l_}, head {h}<br>" + ("pruned" if pruned[l_, h] else
                                                          "" if no_syntax else
                                                          f"mean arc attention {values[l_, h]:.3f}")
                           for h in range(n_heads)] for l_ in range(n_layers)], dtype=object)
        fig = viz.head_grid(values, hover, viz.ARC_SCALE, zmin=0, zmax=max(float(values.max()), 1e-6), pruned=pruned,
                            selected=(layer, head), colorbar=dict(title="attention", thickness=12),
                            **viz.grid_options(ws.adapter), **({} if ws.tied else role_marks(ws)))
        clickable_grid(fig, "att-grid", sd, pick)
        if ws.tied:
            st.caption("ALBERT: the same block runs in every layer, so a pruned head is gone from all rows.")
    with map_col:
        st.plotly_chart(viz.attention_figure(arcs.words, arcs.word_attention(layer, head),
                                             title=f"word attention, {title}"), width="stretch", key="att-map")

    # -- syntactic profile ------------------------------------------------------------------------------------------
    if no_syntax:
        return
    st.subheader("Syntactic profile of this head")
    st.caption("Over the calibration texts: for each relation, how often a word's strongest attention in this head "
               "goes to its grammatical head (Clark et al. 2019), beside the best head for that relation.")
    profile = long_job("att-profile", "Compute the profile", lambda bar: profile_for(ws, sd.mask, bar),
                       done=stored_profile(ws, sd.mask),
                       what=f"parsing {len(ws.calib)} calibration texts and reading their attention",
                       failed="Could not build the syntactic profile")
    if profile is not None:
        if profile.relations:
            st.plotly_chart(viz.profile_figure(profile, layer, head), width="stretch", key="att-profile-fig")
        else:
            st.info("No dependency arcs in the calibration texts.")


head_view()
