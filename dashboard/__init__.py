"""The Streamlit dashboard: entry ``dashboard/app.py``, page scripts in ``dashboard/pages/``, shared page code here.

config.py   Setup: what a session loads (model, data, columns, split sizes, device) and the session's choice
store.py    process-wide: cached models, the workspace per Setup (``headprune.workspace.Workspace``), result store
session.py  per browser session: the mask (cut heads included), undo, selection, scores, trajectories
compute.py  scores, arcs, profiles, live evaluation, trajectories -- each on its own copy of the model -- and the
            thread policy for sessions computing at once
export.py   the run file and the zipped pruned model
ui.py       page frame (sidebar, auto-load of the demo), error guard, progress, shared widgets and labels

The maths lives in ``headprune``; these modules only wire it to widgets.
"""

from pathlib import Path


def run_page(file: str) -> None:
    """Run the page script ``dashboard/pages/<file>`` (used by the repository's thin top-level ``pages/*.py``)."""
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parent / "pages" / file), run_name="__main__")
