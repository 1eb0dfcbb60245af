"""Shared code of the Streamlit pages (app.py, pages/*): state, caching, sidebar and common widgets.

state.py    what is loaded (Setup -> Workspace, cached per process), per-session data, compute helpers
ui.py       page frame (config, sidebar, auto-load of the demo), error guard, progress, shared widgets

The maths lives in ``headprune``; these modules only wire it to widgets.
"""
