"""The glossary has an entry for every word the UI shows, collected from the UI's own sources (issue 36 item 4)."""

import re

import pytest

from headprune import glossary
from headprune.criteria import available, get
from headprune.evaluation.metrics import GLUE_METRICS, KIND_METRICS
from headprune.roles import MARKS, ROLES


def test_every_criterion_has_a_full_name_line_and_paper():
    entries = {e.term: e for e in glossary.criterion_entries()}
    assert set(entries) == set(available())
    for name, entry in entries.items():
        assert name in glossary.CRITERION_NAMES, f"criterion {name} has no full name in the glossary"
        assert entry.name != name and entry.text == get(name).description and entry.source == get(name).reference
        assert glossary.help_for(name).startswith(entry.name)


def test_every_role_letter_has_an_entry_and_the_legend_names_it():
    entries = {e.term: e for e in glossary.role_entries()}
    legend = glossary.role_legend()
    for role, letter in MARKS.items():
        assert entries[letter].name == role and entries[letter].text == ROLES[role].description
        assert f"**{letter}" in legend and role in legend
    # the sidebar's role-letter help and the grids write exactly these letters (roles.report.MARKS)
    assert set(MARKS) == set(ROLES)


def test_every_metric_a_task_reports_is_explained():
    shown = {m for names in KIND_METRICS.values() for m in names} | {m for v in GLUE_METRICS.values() for m in v}
    entries = {e.term: e for e in glossary.metric_entries()}
    assert shown <= set(entries)
    for name in shown:
        assert name in glossary.METRICS and len(entries[name].text) > 20, name


@pytest.mark.filterwarnings("ignore:.*W118")   # spacy.explain warns for a label its glossary lacks (predet)
def test_every_dependency_label_of_the_parser_is_explained_by_spacy():
    pytest.importorskip("spacy")
    from headprune.syntax.parse import load_parser
    labels = sorted(load_parser().get_pipe("parser").labels)      # what the arc views can draw
    entries = {e.term: e for e in glossary.dependency_entries()}
    assert set(entries) == set(labels) and "pobj" in entries and "advmod" in entries
    import spacy
    for label in labels:
        assert entries[label].text == (spacy.explain(label) or glossary.NOT_IN_SPACY[label])
    assert entries["pobj"].text == "object of preposition"
    assert glossary.help_for("nsubj", "dependency") == f"nsubj: {spacy.explain('nsubj')} (spaCy)"
    assert re.search(r"\*\*pobj\*\*: object of preposition", glossary.dependency_help(["pobj", "pobj"]))


def test_terms_of_the_issue_are_explained():
    # the words issue 36 lists as never explained on screen: ae, his, gnorm, advmod, pobj, "@+0", "dep → head", S/B/P/I
    for term in ("ae", "his", "gnorm", "dep → head", "@k", "P", "S", "B", "I"):
        assert glossary.help_for(term), term
    assert glossary.help_for("no such word") == ""
