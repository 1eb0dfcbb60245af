"""Head scores: how important is every head, by each criterion -- and do the criteria agree?"""

import streamlit as st

from dashboard.compute import compute_scores
from dashboard.ui import clickable_grid, criterion_picker, criterion_settings, guard, head_name, page, progress_bar
from headprune import viz
from headprune.criteria import get

ws, sd = page("Head scores", "Each criterion ranks the heads; darker = more important = kept longer. "
                             "Click a head to select it for the Attention and Prune pages.")

chosen = criterion_picker("Criteria", "scores-criteria", list(sd.scores) or ["ae", "his", "gnorm"])
params = {name: criterion_settings(name, sd, "scores") for name in chosen}
under_mask = False
if sd.n_gated:
    under_mask = st.checkbox(f"Score the pruned model ({sd.n_gated} heads pruned on the Prune page)",
                             value=True, key="scores-under-mask")

if st.button("Compute scores", type="primary", disabled=not chosen, key="scores-compute"):
    with guard("Could not compute the scores"):
        bar = progress_bar(f"scoring {', '.join(chosen)} on {len(ws.calib)} calibration texts")
        sd.scores = compute_scores(ws, chosen, params, sd.mask if under_mask else None, bar)
        bar.done()

scores = {name: s for name, s in sd.scores.items() if s.shape == ws.shape}
if not scores:
    st.info("Choose one or more criteria and press **Compute scores**.")
    st.stop()


def select(head: tuple[int, int]) -> None:
    sd.head = head


if sd.head is not None:
    st.caption(f"Selected: **{head_name(ws, sd.head)}** — see it on the Attention page, prune it on the Prune page.")
per_row = 3 if len(scores) > 2 else len(scores)
names = list(scores)
for start in range(0, len(names), per_row):
    for col, name in zip(st.columns(per_row), names[start:start + per_row]):
        with col:
            st.markdown(f"**{name}**" + (" · re-scored after each removal" if get(name).dynamic else ""))
            fig = viz.score_heatmap(scores[name], tied=ws.tied, selected=sd.head,
                                     layer_kinds=ws.adapter.layer_kinds)
            clickable_grid(fig, f"scores-map-{name}", sd, select)

if len(scores) >= 2:
    st.subheader("Do the criteria agree?")
    left, right = st.columns(2)
    with left:
        st.markdown("**Rank correlation** (Spearman ρ over the live heads)")
        corr = viz.rank_correlation(scores)
        st.plotly_chart(viz.correlation_figure(corr), width="stretch", key="scores-corr")
    with right:
        ratio = st.slider("Prune ratio r (%)", 5, 95, 50, step=5, key="scores-ratio") / 100
        st.markdown(f"**Which heads each criterion keeps at r = {ratio:.0%}**: cell = how many criteria keep it")
        st.plotly_chart(viz.overlap_figure(scores, ratio, tied=ws.tied, layer_kinds=ws.adapter.layer_kinds),
                        width="stretch", key="scores-overlap")
        st.markdown("**Jaccard overlap** of the kept sets")
        st.dataframe(viz.jaccard_table(scores, ratio).style.format("{:.2f}"), width="stretch")
