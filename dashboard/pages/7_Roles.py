"""Roles: what each head does -- previous-token, duplicate-token, induction, sink, positional, syntactic, broad."""

import numpy as np
import streamlit as st

from dashboard.compute import (
    ablate_role,
    ablation_estimate,
    arcs_for,
    live_role_heads,
    roles_for,
    smaller_sizes,
    stored_ablation,
    stored_roles,
)
from dashboard.ui import change_delta, clickable_grid, guard, head_name, long_job, page, view_fragment
from headprune import viz
from headprune.roles import NO_ROLE, ROLES

ws, sd = page("Roles", "What each head does, read off its attention: on random repeated-token probes "
                       "([BOS] + r + r) and on the calibration texts. Click a head to see both.")

report = stored_roles(ws)
if report is None:
    st.info(f"Scores every head on seven roles from one pass over {len(ws.calib)} calibration texts (parsed for the "
            "syntactic role) and one over eight random probes. Each role's formula and source is listed below.")
    report = long_job("roles-compute", "Find head roles", lambda bar: roles_for(ws, None, bar),
                      what="probes and calibration texts", failed="Could not score the head roles")
    if report is None:
        st.stop()

counts = report.counts()
# a table: its cells wrap, so "what it does" is read whole; "—" where a row has no threshold (no clear role)
st.table({"role": list(counts), "heads": list(counts.values()),
          "threshold": [viz.number_text(report.thresholds.get(r)) for r in counts],
          "what it does": [ROLES[r].description if r in ROLES else "none of the above" for r in counts]},
         hide_index=True)
st.caption("A head can carry several roles. Thresholds come from the sources: 0.4 for previous-token, duplicate and "
           "induction (ARENA/TransformerLens detectors), 0.3 sink (Gu et al. 2024), 90% positional (Voita et al. "
           "2019), 10 points over the best fixed offset for syntactic (Voita et al. 2019), 0.8 broad (ours).")
options = viz.grid_options(ws.adapter)
marks = report.marks()


def select(head: tuple[int, int]) -> None:
    sd.head = head


@view_fragment   # its every run ends by writing the view to the address bar and the sidebar's link
def grids() -> None:
    st.subheader("Labels")
    labels = np.where(report.live, 1.0, 0.0)
    hover = np.array([[f"{head_name(ws, (b, h))}" for h in range(ws.shape[1])] for b in range(ws.shape[0])],
                     dtype=object)
    fig = viz.head_grid(labels, hover, [[0, viz.PRUNED_COLOR], [1, viz.KEPT_COLOR]], pruned=~report.live,
                        selected=sd.head, showscale=False, marks=marks, roles=report.names(), **options)
    clickable_grid(fig, "roles-labels", sd, select)
    st.caption("P previous-token · D duplicate-token · I induction · S sink · @k positional (offset k) · "
               "Y syntactic · B broad · empty: no clear role")
    tabs = st.tabs(list(ROLES))
    for tab, name in zip(tabs, ROLES):
        with tab:
            role = ROLES[name]
            st.markdown(f"**{name}** — {role.description}. {role.reference}.")
            st.latex(role.latex)
            if np.isnan(report.scores[name].scores).all():
                st.info("Not scored: the syntactic role needs the spaCy parser and raw calibration texts.")
                continue
            clickable_grid(viz.role_grid(report.scores[name], report.thresholds[name], selected=sd.head,
                                         marks=marks, **options), f"roles-grid-{name}", sd, select)
    head_detail()


def head_detail() -> None:
    if sd.head is None:
        st.info("Click a head to see its attention on a probe and on a sentence.")
        return
    block, head = sd.head
    layer = next(i for i, b in enumerate(ws.adapter.layer_to_block) if b == block)
    st.subheader(f"{head_name(ws, sd.head)}: {report.names()[block, head] or NO_ROLE}")
    st.caption(" · ".join(f"{name} {report.scores[name].scores[block, head]:.2f}" for name in ROLES
                          if np.isfinite(report.scores[name].scores[block, head])))
    left, right = st.columns(2, gap="large")
    with left:
        tokens = [ws.loaded.tokenizer.convert_ids_to_tokens(int(i)) for i in report.probe_ids] \
            if ws.loaded.tokenizer is not None else [str(int(i)) for i in report.probe_ids]
        st.plotly_chart(viz.attention_figure(tokens, report.probe_attention[layer, head],
                                             title="on a probe [BOS] + r + r: the induction stripe, the "
                                                   "previous-token diagonal, the sink column"),
                        width="stretch", key="roles-probe")
    with right:
        text = ws.eval.texts[0] if ws.eval.pairs is None else (ws.eval.texts[0], ws.eval.pairs[0])
        arcs = None
        with guard("Could not parse the sentence"):
            arcs = arcs_for(ws, text, sd.mask)
        if arcs is not None and arcs.arcs:
            st.plotly_chart(viz.arc_figure(arcs.words, arcs.arcs, arcs.arc_weights(layer, head),
                                           title="on a sentence, over its dependency arcs", seen=arcs.seen),
                            width="stretch", key="roles-arcs")
        elif arcs is not None:
            st.plotly_chart(viz.attention_figure(arcs.words, arcs.word_attention(layer, head),
                                                 title="on a sentence"), width="stretch", key="roles-sentence")


grids()

st.subheader("Does the task need a role?")
st.caption("Prune every head of a role (or keep only them) from the current mask, against 10 random sets of the same "
           "size drawn from the other heads: mean ± sd. Runs on a copy of this session's live evaluator.")
c1, c2, c3 = st.columns([2, 2, 1])
# the roles with a head still in use: a role whose heads are all pruned now has nothing to prune or keep (the
# default role, its one head pruned on Prune, made Measure fail)
left = {r: int(n) for r in ROLES if (n := live_role_heads(report, sd.mask, r))}
role = c1.selectbox("Role", list(left), key="roles-ablate-role",
                    format_func=lambda r: f"{r} ({left[r]} heads in use)") if left else None
if not left:
    st.info("Every head with a role is pruned now: restore some on the Prune page to measure a role.")
mode = c2.radio("Edit", ["prune", "keep"], format_func={"prune": "prune the role", "keep": "keep only the role"}.get,
                horizontal=True, key="roles-ablate-mode")
if role is not None:
    with c3:
        result = long_job("roles-ablate", "Measure", lambda bar: ablate_role(ws, sd, report, role, mode, bar),
                          done=stored_ablation(ws, sd, role, mode), estimate=lambda: ablation_estimate(ws, sd),
                          hint=smaller_sizes(ws), what=f"{mode} {role} vs random sets",
                          failed="Could not measure the ablation")
    if result is not None:
        st.metric(f"{result['metric']} with {result['n_heads']} {role} heads "
                  f"{'pruned' if mode == 'prune' else 'kept alone'}", viz.metric_text(result["role_value"]),
                  **change_delta(result["role_value"], result["base"], result["higher_is_better"],
                                 f"now ({viz.metric_text(result['base'])})"))
        mean = result["random_mean"]
        st.markdown(f"Random sets of {result['n_heads']} heads ({result['seeds']} seeds): "
                    f"**{viz.metric_text(mean)} ± {viz.metric_text(result['random_sd'], like=mean)}**")
