"""The Streamlit dashboard: entry ``dashboard/app.py``, page scripts in ``dashboard/pages/``, shared page code here.

state.py    what is loaded (Setup -> Workspace, cached per process), per-session data, compute helpers
ui.py       page frame (config, sidebar, auto-load of the demo), error guard, progress, shared widgets

The maths lives in ``headprune``; these modules only wire it to widgets.
"""

from pathlib import Path


def run_page(file: str) -> None:
    """Run the page script ``dashboard/pages/<file>`` (used by the repository's thin top-level ``pages/*.py``)."""
    import runpy

    runpy.run_path(str(Path(__file__).resolve().parent / "pages" / file), run_name="__main__")
