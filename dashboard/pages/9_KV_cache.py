"""KV cache: which key/value heads keep the whole cache; the others stream (first S keys + last W keys)."""

import json

import numpy as np
import streamlit as st

from dashboard.compute import (
    KV_ROWS,
    kv_group_scores,
    kv_metrics,
    kv_scores_at_once,
    kv_scores_estimate,
    smaller_sizes,
    stored_kv_scores,
)
from dashboard.ui import (
    change_delta,
    clickable_grid,
    guard,
    long_job,
    page,
    plain,
    progress_bar,
    rows_choice,
    view_fragment,
)
from dashboard.urlstate import publish
from headprune import viz
from headprune.kvcache import KVPlan
from headprune.kvcache.budgets import BETA_DEFAULT, budget_plan
from headprune.kvcache.budgets import KIND as BUDGET_KIND
from headprune.kvcache.exports import duo_folder_zip
from headprune.kvcache.plan import top_share
from headprune.kvcache.scores import CRITERION_KIND, RULE_KINDS, RULES
from headprune.kvcache.tasks import bytes_at

ws, sd = page("KV cache", "Which key/value heads need the whole KV cache? A full head keeps every key and value; a "
                          "streaming head keeps the first S keys (attention sinks) and the last W (DuoAttention). "
                          "Click a head to select it, then switch it; the metric is exact under the restriction.")

if not ws.adapter.causal:
    st.warning(f"{plain(ws.setup.model)} is an encoder ({ws.adapter.family}): it keeps no key/value cache -- every "
               "query sees every key of the row at once, so there is nothing to stream. Load a decoder (demo-lm, "
               "demo-circuit) on Model & data.")
    st.stop()
if "kv" in ws.adapter.refuses:
    st.warning(f"{ws.setup.model} ({ws.adapter.family}) cannot take a KV cache plan: {ws.adapter.refuses['kv']}")
    st.stop()

left, mid, right = st.columns(3)
rule = left.selectbox("Score", RULES, key="kv-rule", help="each rule's card below says what it is: the published "
                      "method, a part of it, a proxy or a baseline")
kind = left.radio("Plan", ["full / streaming", "budgets (HeadKV)"], key="kv-kind", horizontal=True,
                  help="full / streaming: a share of groups keeps every key, the rest S + W; budgets: every group "
                  "keeps S + W_g tokens, W_g from the score under a total (HeadKV's allocation)")
budgets = kind.startswith("budgets")
sink = mid.number_input("Sink S (first keys)", 0, 64, 4, key="kv-sink")
window = mid.number_input("Window W (last keys)", 1, 4096, 16, key="kv-window",
                          help="the streaming window; with budgets, the window the score is measured at and the "
                          "default mean budget S + W per group")
length = right.select_slider("Context length (bytes bar)", [2**k for k in range(8, 18)], 4096, key="kv-length")
n_groups = ws.adapter.n_kv_heads * len(ws.adapter.blocks)
if budgets:
    total = left.number_input("Total budget (tokens, all groups)", 0, 2**24, n_groups * int(sink + window),
                              key="kv-budget", help=f"{n_groups} key/value groups; their budgets S + W_g sum to this")
    beta = right.number_input("β (HeadKV's pool: floor(b / β) per group)", 1.0, 1e6, BETA_DEFAULT, key="kv-beta")
else:
    share = left.slider("Full heads (%)", 0, 100, 25, 5, key="kv-share")
rows = rows_choice(right, "kv-rows", KV_ROWS, len(ws.eval), "each plan (and the dense model beside it)",
                   "a head click then evaluates its new plan on those rows only")
st.caption(f"**{rule}**: {RULE_KINDS.get(rule, CRITERION_KIND)}."
           + (f"  \n**budgets**: {BUDGET_KIND}." if budgets else ""))


def kv_of(head: tuple[int, int] | None) -> tuple[int, int] | None:
    """The key/value head (layer, group) of a selected query head."""
    return None if head is None else (head[0], int(ws.adapter.group_grid()[head]))


def query_head_of(cell: tuple[int, int]) -> tuple[int, int]:
    """The first query head of key/value head ``cell`` (what selecting it selects elsewhere)."""
    layer, group = cell
    return layer, int((ws.adapter.group_grid()[layer] == group).nonzero()[0])


# The scores are a job like any other (ui.long_job: its time told, a button, a bar and Cancel; kept until the
# settings change), except that a rule costing a few clicks' work (random, razor's probes, far-mass) scores at once:
# decided by its work in tokens, never by a timing (a busy server must not change what the page does).
stored = stored_kv_scores(ws, rule, int(sink), int(window))
if stored is None and kv_scores_at_once(ws, rule, int(sink), int(window), rows):
    with guard("Could not score the key/value heads"):
        bar = progress_bar(f"{rule} scores")
        stored = kv_group_scores(ws, rule, int(sink), int(window), bar)
        bar.done()
scores = long_job("kv-scores", f"Score the key/value heads by {rule}",
                  lambda bar: kv_group_scores(ws, rule, int(sink), int(window), bar), done=stored,
                  estimate=lambda: kv_scores_estimate(ws, rule, int(sink), int(window)), hint=smaller_sizes(ws),
                  what=f"{rule} scores",
                  failed="Could not score the key/value heads")
if scores is None:   # not scored yet (the button above), or the error above says why (rows no longer than S + W)
    st.stop()

# A head click (or the Switch button) reruns only this fragment: the plan's grid, metric, bytes and exports -- not the
# scores and settings above (issue 35: a click re-ran the whole page, 35 s on demo-lm).
@view_fragment   # its every run ends by writing the view to the address bar and the sidebar's link
def plan_view() -> None:
    if budgets:
        plan = None
        with guard("Could not allocate the budgets"):
            plan = budget_plan(scores, ws.adapter.n_heads, int(total), int(sink), float(beta),
                               meta={"rule": rule, "model": ws.setup.model})
            st.plotly_chart(viz.kv_budget_grid(plan.budgets().numpy(), scores, title=f"KV budget per key/value head "
                                               f"(tokens, S + W_g) from the {rule} score"), key="kv-budget-grid",
                            width="stretch")
        if plan is None:   # the error above says why (a total too small for S + 1 per group)
            st.stop()
    else:
        basis = (ws.key, rule, share, int(sink), int(window))
        if st.session_state.get("kv-basis") != basis:     # a new rule, share or window: start from the rule's top share
            st.session_state["kv-basis"] = basis
            st.session_state["kv-full"] = top_share(np.nan_to_num(scores, nan=-np.inf), share / 100).numpy()
        full = st.session_state["kv-full"]
        # one selected head on every page (issue 35): the key/value head outlined here is the group of the session's
        # selected query head; a click selects (as on Head scores, Roles, Attention) and the button switches it
        selected = kv_of(sd.head)

        def select(cell: tuple[int, int]) -> None:
            if kv_of(sd.head) != cell:
                sd.head = query_head_of(cell)

        def switch() -> None:
            cell = kv_of(sd.head)
            if cell is not None:
                full[cell] = not full[cell]

        clickable_grid(viz.kv_plan_grid(scores, full, selected=selected,
                                        title=f"{rule} score per key/value head (F full · S streaming)"),
                       "kv-grid", sd, select)
        heads = [(b, g) for b in range(full.shape[0]) for g in range(full.shape[1])]
        pick, button = st.columns([3, 1], vertical_alignment="bottom")
        # the dropdown shows the selection, never keeps its own (ui.head_picker's rule)
        st.session_state["kv-head"] = selected

        def chosen() -> None:
            cell = st.session_state["kv-head"]
            if cell is not None:
                select(cell)
            publish(draw=False)

        pick.selectbox("Key/value head", heads, key="kv-head", on_change=chosen, placeholder="click a head on the grid",
                       format_func=lambda h: f"layer {h[0]} · key/value head {h[1]}"
                                             + (" — full" if full[h] else " — streaming"))
        # a callback: it runs before the rerun, so the grid above is drawn with the switch already made
        button.button("Switch full / streaming", key="kv-toggle", on_click=switch, disabled=selected is None)

        readable = [[float(v) if np.isfinite(v) else None for v in row] for row in scores]   # JSON has no inf
        plan = KVPlan(full.copy(), ws.adapter.n_heads, int(sink), int(window), {"rule": rule, "model": ws.setup.model,
                                                                               "group_scores": readable})
    counted = bytes_at(ws.loaded.model, plan, int(length), sd.mask)
    show_metric, show_bytes = st.columns(2)
    with show_metric, guard("Could not evaluate under the plan"):
        dense = ws.metric_of(ws.dense() if rows is None else kv_metrics(ws, None, None, rows))
        under = ws.metric_of(kv_metrics(ws, plan, sd.mask, rows))
        st.metric(f"{ws.metric} under the plan", viz.metric_text(under),
                  **change_delta(under, dense, ws.higher_is_better, "dense"))
        # a saving is down and green (it read "↑ 31 % of 5.75 MiB": an up arrow for a cache two thirds smaller)
        saved = 1 - counted["ratio"]
        st.metric("KV bytes under the plan", f"{counted['plan'] / 2**20:.2f} MiB",
                  **({"delta": f"-{saved:.0%} vs the full {counted['full_cache'] / 2**20:.2f} MiB",
                      "delta_color": "inverse"} if round(saved, 2) > 0 else
                     {"delta": "the full cache", "delta_color": "off", "delta_arrow": "off"}))
        shape = (f"budgets of {plan.budget_tokens()} tokens in all (W_g {int(plan.group_windows().min())}-"
                 f"{plan.window})" if budgets else
                 f"{int(plan.full.sum())} of {plan.full.numel()} key/value heads full")
        measured = (f"measured on {KV_ROWS} of the {len(ws.eval)} evaluation rows (quick; choose all above for "
                    "the final numbers)" if rows else f"measured on all {len(ws.eval)} evaluation rows")
        st.caption(f"{shape} · S = {int(sink)}, W = {plan.window} · {measured}")
    with show_bytes:
        st.plotly_chart(viz.kv_bytes_figure(counted, int(length)), key="kv-bytes", width="stretch")

    export_json, export_tsv = st.columns(2)
    export_json.download_button("Export plan (JSON)", json.dumps(plan.to_json(), indent=1), "kv_plan.json",
                                mime="application/json", key="kv-export")
    if budgets:   # DuoAttention's layout knows one window
        export_tsv.caption("DuoAttention's TSV holds one window for every streaming head: export a full / "
                           "streaming plan.")
    else:   # the folder DuoAttention loads: continuous scores + config.json (S, W, this plan's sparsity), zipped
        export_tsv.download_button("Export DuoAttention folder (zip)", duo_folder_zip(plan),
                                   "duo_attention_pattern.zip", mime="application/zip", key="kv-export-tsv")


plan_view()
