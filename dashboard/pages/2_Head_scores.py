"""Head scores: how important is every head, by each criterion -- and do the criteria agree?"""

import streamlit as st

from dashboard.compute import compute_scores, role_curves, role_table, scoring_estimate, smaller_sizes, stored_roles
from dashboard.ui import (
    clickable_grid,
    criterion_picker,
    criterion_settings,
    head_name,
    long_job,
    page,
    role_marks,
    view_fragment,
)
from headprune import viz
from headprune.criteria import ScoreMap, get, redundant_pairs
from headprune.glossary import help_for

ws, sd = page("Head scores", "Each criterion ranks the heads; darker = more important = kept longer. "
                             "Click a head to select it for the Attention and Prune pages.")

chosen = criterion_picker("Criteria", "scores-criteria", list(sd.scores) or ["ae", "his", "gnorm"])
params = {name: criterion_settings(name, sd, "scores") for name in chosen}
for first, second in redundant_pairs(chosen, params):
    st.info(f"**{first}** and **{second}** give identical scores with these settings (Σ A ⊙ ∂L/∂A over a head's "
            f"attention is ∂L/∂gate): their maps and pruning orders are the same, so one of them is enough.",
            icon="🟰")
under_mask = False
if sd.n_gated:
    under_mask = st.checkbox(f"Score the pruned model ({sd.n_gated} heads pruned on the Prune page)",
                             value=True, key="scores-under-mask")

if chosen:
    fresh = long_job("scores-compute", "Compute scores",
                     lambda bar: compute_scores(ws, chosen, params, sd.mask if under_mask else None, bar),
                     estimate=lambda: scoring_estimate(ws, chosen, params, sd.mask if under_mask else None),
                     hint=smaller_sizes(ws), what=f"scoring {', '.join(chosen)} on {len(ws.calib)} calibration texts",
                     failed="Could not compute the scores")
    if fresh is not None:
        sd.scores = fresh

scores = {name: s for name, s in sd.scores.items() if s.shape == ws.shape}
if not scores:
    st.info("Choose one or more criteria and press **Compute scores**.")
    st.stop()


def select(head: tuple[int, int]) -> None:
    sd.head = head


def criterion_report(score: ScoreMap) -> None:
    """What a criterion reports about its own scores (``ScoreMap.meta``): KL, how far each layer's order is that
    layer's own KL (warnings where it is not); HIES with α = auto, the α chosen by wAUC and the wAUC of each α."""
    own = score.meta.get("own_kl_spearman")
    if own is not None:
        st.caption("Rank correlation of each layer's final score with its own KL: "
                   + " · ".join(f"L{layer} {'—' if rho is None else f'{rho:.2f}'}" for layer, rho in enumerate(own)))
    if score.meta.get("warnings"):
        st.warning("\n".join(f"- {text}" for text in score.meta["warnings"]), icon="⚠️")
    selection = score.meta.get("alpha_selection")
    if selection:
        st.caption(f"α = {selection['best_alpha']:g}, chosen by the wAUC of the pruning curve on the calibration "
                   f"split (up to {selection['budget']:.0%} pruned).")
        with st.expander("wAUC per α"):
            st.dataframe({"α": list(selection["wauc"]), "wAUC": list(selection["wauc"].values())},
                         hide_index=True, width="stretch")


# A head click only moves the selection outline: it reruns just the heatmaps, not the agreement figures below.
@view_fragment   # its every run ends by writing the view to the address bar and the sidebar's link
def heatmaps() -> None:
    if sd.head is not None:
        st.caption(f"Selected: **{head_name(ws, sd.head)}** — see it on the Attention page, prune it on the "
                   "Prune page.")
    # two maps a row at most: three (the default criteria) left each a third of a 1280 px screen, its 12 head
    # numbers crammed under it; a phone stacks them anyway
    per_row = min(2, len(scores))
    names = list(scores)
    for start in range(0, len(names), per_row):
        for col, name in zip(st.columns(per_row), names[start:start + per_row]):
            with col:
                st.markdown(f"**{name}**" + (" · re-scored after each removal" if get(name).dynamic else ""),
                            help=help_for(name, "criterion"))
                fig = viz.score_heatmap(scores[name], selected=sd.head, **viz.grid_options(ws.adapter),
                                        **role_marks(ws))
                clickable_grid(fig, f"scores-map-{name}", sd, select)
                criterion_report(scores[name])


heatmaps()

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
        st.plotly_chart(viz.overlap_figure(scores, ratio, **viz.grid_options(ws.adapter)),
                        width="stretch", key="scores-overlap")
        st.markdown("**Jaccard overlap** of the kept sets")
        st.dataframe(viz.jaccard_table(scores, ratio).style.format("{:.2f}"), width="stretch")

st.subheader("Which head roles does each criterion keep?")
roles = stored_roles(ws)
if roles is None:
    st.info("Find the head roles on the **Roles** page to see which kinds of heads each criterion keeps.")
else:
    role_ratio = st.slider("Prune ratio r (%)", 5, 95, 50, step=5, key="scores-role-ratio") / 100
    table = role_table(scores, roles, role_ratio)
    st.markdown(f"**Share of each role's heads kept at r = {role_ratio:.0%}** (empty: no head has the role)")
    st.dataframe(viz.kept_share_table(table), width="stretch")
    ratios = [i / 20 for i in range(21)]
    curves = role_curves(scores, roles, ratios)
    pick = st.selectbox("Curve of", list(scores), key="scores-role-curve")
    st.plotly_chart(viz.kept_share_figure(curves[pick], ratios, title=f"{pick}: share of each role kept"),
                    width="stretch", key="scores-role-fig")
