"""headprune dashboard.  Run:  streamlit run app.py

This file is the entry point: it builds the navigation (Home, defined here, and the pages in pages/) and runs the
chosen page. It opens on the embedded offline demo (MiniLM-L6 fine-tuned on Rotten Tomatoes); HEADPRUNE_MODEL /
HEADPRUNE_DATA start it on another model or data set. Pages are thin: the maths lives in ``headprune``, shared
page code in ``dashboard``.
"""

import streamlit as st

from dashboard.state import demo_setup, use_setup
from dashboard.ui import ABOUT, PAGES, model_title, page


def home() -> None:
    ws, sd = page("headprune", "Find the attention heads a classifier can do without.")
    st.markdown(ABOUT)
    st.markdown(
        "1. **Score** every head with criteria from the pruning literature and see them side by side.\n"
        "2. **Look** at what a head attends to, over the sentence's grammar.\n"
        "3. **Prune** heads by clicking them and watch the accuracy change live; export the smaller model."
    )
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader("Start here")
        links = {"pages/2_Head_scores.py": "See which heads matter (heatmaps)",
                 "pages/4_Prune.py": "Prune heads and watch the accuracy move",
                 "pages/3_Attention.py": "What does a head look at?",
                 "pages/5_Trajectories.py": "Prune step by step: accuracy vs heads removed",
                 "pages/6_Export.py": "Download the mask, scores, figures and the pruned model",
                 "pages/1_Model_and_data.py": "Use your own model or data"}
        icons = {file: icon for file, _, icon, _ in PAGES}
        for file, label in links.items():
            st.page_link(file, label=label, icon=icons[file])
    with right:
        st.subheader("Loaded now")
        n_blocks, n_heads = ws.shape
        st.markdown(f"**{model_title(ws)}** — {ws.adapter.arch}, "
                    f"{n_blocks * n_heads} {'tied heads' if ws.tied else 'heads'}, "
                    f"{ws.counts['total']['params'] / 1e6:.1f} M parameters")
        c1, c2 = st.columns(2)
        c1.metric(f"dense {ws.metric}", f"{ws.metric_of(ws.dense):.3f}", help=f"on {len(ws.eval)} evaluation texts")
        c2.metric("heads pruned now", f"{sd.mask.n_pruned}")
        if ws.setup.model != "demo" or ws.setup.data != "demo":
            st.button("Use the demo", type="primary", on_click=use_setup, args=(demo_setup(ws.setup),), key="home-demo")
        else:
            st.success("You are on the demo — no network needed. A good first click: **Head scores → Compute**.")


navigation = st.navigation([st.Page(home, title="Home", icon=":material/home:", default=True)]
                           + [st.Page(file, title=title, icon=icon, url_path=url) for file, title, icon, url in PAGES])
st.set_page_config(page_title=f"{navigation.title} · headprune", page_icon=":material/content_cut:", layout="wide")
navigation.run()
