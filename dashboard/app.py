"""headprune dashboard.  Run:  streamlit run dashboard/app.py  (or ``streamlit run app.py`` from a checkout)

This file builds the navigation (Home, defined here, and the pages in dashboard/pages/) and runs the chosen page.
It opens on the embedded offline demo (MiniLM-L6 fine-tuned on Rotten Tomatoes); HEADPRUNE_MODEL / HEADPRUNE_DATA
start it on another model or data set. Pages are thin: the maths lives in ``headprune``, shared page code in
``dashboard``. Page scripts are registered by absolute path, so the same navigation works from the repository's
top-level ``app.py`` and from an installed package.
"""

import sys
from pathlib import Path

import streamlit as st

if str(Path(__file__).resolve().parents[1]) not in sys.path:  # `streamlit run dashboard/app.py` from a checkout
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dashboard.config import demo_setup, use_setup
from dashboard.ui import (
    ABOUT,
    PAGES,
    baseline_label,
    cut_note,
    follow_link,
    heads_left,
    model_title,
    page,
    page_path,
    plain,
)

LINKS = {"2_Head_scores.py": "See which heads matter (heatmaps)",
         "7_Roles.py": "What do the heads do? (previous-token, induction, sink, syntactic …)",
         "4_Prune.py": "Prune heads and watch the metric move",
         "3_Attention.py": "What does a head look at?",
         "8_Recover.py": "Train the pruned model back (fine-tune, LoRA, distil)",
         "5_Trajectories.py": "Prune step by step: the metric vs heads removed",
         "6_Export.py": "Download the mask, scores, figures and the pruned model",
         "1_Model_and_data.py": "Use your own model or data"}


def home() -> None:
    ws, sd = page("headprune", "Find the attention heads a model can do without.")
    st.markdown(ABOUT)
    st.markdown(
        "1. **Score** every head with criteria from the pruning literature and see them side by side.\n"
        "2. **Look** at what a head attends to, over the sentence's grammar.\n"
        "3. **Prune** heads by clicking them and watch accuracy or perplexity change live; export the smaller model."
    )
    left, right = st.columns([3, 2], gap="large")
    with left:
        st.subheader("Start here")
        icons = {file: icon for file, _, icon, _ in PAGES}
        for file, label in LINKS.items():
            st.page_link(page_path(file), label=label, icon=icons[file])
    with right:
        st.subheader("Loaded now")
        n_blocks, n_heads = ws.shape
        st.markdown(f"**{plain(model_title(ws))}** — {ws.adapter.arch}, "
                    f"{n_blocks * n_heads} {'tied heads' if ws.tied else 'heads'}, "
                    f"{ws.counts['total']['params'] / 1e6:.1f} M parameters")
        c1, c2 = st.columns(2)
        c1.metric(baseline_label(ws), f"{ws.metric_of(ws.dense()):.3f}", help=f"on {len(ws.eval)} evaluation texts")
        c2.metric("heads left", heads_left(ws, sd))
        if ws.n_cut:
            st.info(cut_note(ws))
        if ws.setup.model != "demo" or ws.setup.data != "demo":
            st.button("Use the demo", type="primary", on_click=use_setup, args=(demo_setup(ws.setup),), key="home-demo")
        else:
            st.success("You are on the demo — no network needed. A good first click: **Head scores → Compute**.")


def main() -> None:
    """Build the navigation and run the chosen page (streamlit calls this on every rerun)."""
    navigation = st.navigation([st.Page(home, title="Home", icon="🏠", default=True)]
                               + [st.Page(page_path(file), title=title, icon=icon, url_path=url)
                                  for file, title, icon, url in PAGES])
    # An emoji favicon is an inline SVG (a data: URI); a ":material/..." one makes the browser fetch its SVG from
    # fonts.gstatic.com, which fails offline (issue 35); so are the pages' icons (ui.PAGES), which the open page
    # lends the favicon.
    st.set_page_config(page_title=f"{navigation.title} · headprune", page_icon="✂️", layout="wide")
    linked_page = follow_link()          # a shared link or a reload: ?model=demo&page=prune&mask=0.3,2.5 (README)
    if linked_page is not None:
        st.switch_page(page_path(linked_page))
    navigation.run()


if __name__ == "__main__":  # streamlit runs the script it was given as __main__
    main()
