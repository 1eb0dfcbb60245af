"""Protocol runs: a ``headprune run`` results folder as its cells land. Done / running (by whom, since when) /
failed (the error's last lines) / pending, the time left, and the table of the cells landed so far, refreshed every
few seconds. Layout only: ``headprune.protocol.schedule`` reads the folder and does the sums."""

import os

import streamlit as st

from dashboard.ui import manual_help, plain
from headprune.errors import HeadpruneError
from headprune.estimate import human_duration
from headprune.protocol.schedule import folder_protocol, landed_table, status
from headprune.protocol.smoke import smoke_protocol

REFRESH = 5   # seconds between re-reads of the folder while the page is open

st.title("Protocol runs", help=manual_help("Protocol runs"))
st.caption("Open the results folder of `headprune run PROTOCOL.toml --out DIR` (any executor: local, pool, slurm "
           "or --shard): the table fills in as cells land.")
folder = st.text_input("Results folder", value=os.environ.get("HEADPRUNE_RUN", ""), key="runs-folder",
                       placeholder="runs/demo")
if not folder:
    st.info("Give the --out folder of a protocol run.")
    st.stop()
try:
    protocol = folder_protocol(folder)
    protocol = smoke_protocol(protocol, folder) or protocol   # a --smoke run's cells are its stand-ins' (issue 35)
except HeadpruneError as exc:
    st.error(plain(exc))
    st.stop()


@st.fragment(run_every=REFRESH)
def progress_view() -> None:
    report = status(protocol, folder)
    counts = report["counts"]
    columns = st.columns(5)
    for column, name in zip(columns, ("done", "running", "failed", "pending")):
        column.metric(name, f"{counts[name]} / {report['cells']}")
    left = report["seconds_left"]
    finished = counts["done"] == report["cells"]   # nothing left: no "under a second" for a run that has ended
    columns[4].metric("time left", "none: finished" if finished else "unknown" if left is None else
                      human_duration(left),
                      help=f"mean measured cell time x cells left / {max(report['workers'], 1)} running worker(s)")
    if finished:
        st.success(f"Finished: all {report['cells']} cells are done.", icon=":material/check_circle:")
    st.subheader(f"{plain(protocol.name)}: the table so far")   # a protocol file's words
    rows = landed_table(protocol, folder)
    if rows:
        st.dataframe(rows, hide_index=True)
    else:
        st.info("No cell has landed yet.")
    waiting = [{"cell": s.key, "state": s.state, "detail": s.detail} for s in report["states"] if s.state != "done"]
    if waiting:
        st.subheader("Cells not done")
        st.dataframe(waiting, hide_index=True)
    for s in report["states"]:
        if s.state == "failed" and s.tail:
            with st.expander(plain(f"{s.key}: {s.detail}")):
                st.code("\n".join(s.tail), language=None)


progress_view()
