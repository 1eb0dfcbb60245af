"""Glossary: every word on the pages explained in one place (headprune.glossary)."""

import streamlit as st

from dashboard.ui import guard, page
from headprune.glossary import criterion_entries, dependency_entries, metric_entries, role_entries, term_entries

ws, sd = page("Glossary", "The words on the pages: criteria, head roles, dependency labels, metrics and terms. "
                          "Each grid, picker and figure points here from its help.")
query = st.text_input("Find a word", key="glossary-find").strip().lower()


def table(title: str, entries, first: str = "term") -> None:
    rows = [e for e in entries if not query or query in f"{e.term} {e.name} {e.text}".lower()]
    if not rows:
        return
    st.subheader(title)
    # a table, not a data grid: its cells wrap, so every meaning is read whole (a grid cut them at one line)
    st.table({first: [e.term for e in rows], "name": [e.name for e in rows], "meaning": [e.text for e in rows],
              "source": [e.source for e in rows]}, hide_index=True)


table("Criteria", criterion_entries(), "criterion")
table("Head roles (letters on the grids)", role_entries(), "letter")
table("Metrics", metric_entries(), "metric")
table("Other words", term_entries())
with guard("Could not load the dependency parser"):
    table("Dependency labels (spaCy's own explanations)", dependency_entries(), "label")
