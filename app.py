"""headprune dashboard -- home page.  Run:  streamlit run app.py

Opens on the embedded offline demo (MiniLM-L6 fine-tuned on Rotten Tomatoes). Pages are thin: the maths lives in
``headprune``, shared page code in ``dashboard``.
"""

import streamlit as st

from dashboard.state import demo_setup, use_setup
from dashboard.ui import ABOUT, model_title, page

ws, sd = page("headprune", "✂️")

st.markdown(ABOUT)
st.markdown(
    "1. **Score** every head with criteria from the pruning literature and see them side by side.\n"
    "2. **Look** at what a head attends to, over the sentence's grammar.\n"
    "3. **Prune** heads by clicking them and watch the accuracy change live; export the smaller model."
)

left, right = st.columns([3, 2])
with left:
    st.subheader("Start here")
    st.page_link("pages/2_Head_scores.py", label="See which heads matter (heatmaps)", icon="🔥")
    st.page_link("pages/4_Prune.py", label="Prune heads and watch accuracy move", icon="✂️")
    st.page_link("pages/3_Attention.py", label="What does a head look at?", icon="👁️")
    st.page_link("pages/5_Trajectories.py", label="Prune step by step: accuracy vs heads removed", icon="📉")
    st.page_link("pages/6_Export.py", label="Download the mask, scores, figures and pruned model", icon="📦")
    st.page_link("pages/1_Model_and_data.py", label="Use your own model or data", icon="📂")
with right:
    st.subheader("Loaded now")
    n_blocks, n_heads = ws.shape
    st.markdown(f"**{model_title(ws)}** — {ws.adapter.arch}, "
                f"{n_blocks * n_heads} {'tied heads' if ws.tied else 'heads'}, "
                f"{ws.counts['total']['params'] / 1e6:.1f} M parameters")
    c1, c2 = st.columns(2)
    c1.metric(f"dense {ws.metric}", f"{ws.metric_of(ws.dense):.3f}", help=f"on {len(ws.eval)} evaluation examples")
    c2.metric("heads pruned now", f"{sd.mask.n_pruned}")
    if ws.setup.model != "demo" or ws.setup.data != "demo":
        st.button("Use the demo", type="primary", on_click=use_setup, args=(demo_setup(ws.setup),))
    else:
        st.success("You are on the demo: no network needed. Head scores → Compute is a good first click.")
