"""Dashboard: the expected duration beside Compute / Run, the memory budget on Model & data, and a cancelled
scoring run that stores nothing (the library's progress callback raising ``errors.Cancelled`` between batches)."""

from __future__ import annotations

import pytest
from app_support import open_app, problems

from dashboard.compute import compute_scores, scoring_estimate
from dashboard.store import workspace_of
from headprune.errors import Cancelled


def told(at) -> list[str]:
    """The estimate lines on the page: a caption, or a warning past ten minutes."""
    return [c.value for c in at.caption if c.value.startswith("⏱")] + \
        [w.value for w in at.warning if " on this CPU" in w.value]


def test_estimate_before_compute_and_a_cancelled_run_stores_nothing():
    at = open_app("scores")
    assert not problems(at)
    [line] = told(at)                                 # before anything is computed
    assert line.startswith("⏱ ae, his, gnorm on this model: ") and "on this CPU (measured: one forward of" in line

    ws = workspace_of(at.session_state["hp_setup"])
    calls = []

    def cancel(fraction, message):
        calls.append(message)
        raise Cancelled()

    with pytest.raises(Cancelled):
        compute_scores(ws, ["his"], {}, None, cancel)
    assert len(calls) == 1 and calls[0].startswith("scoring batch 1/")   # stopped after its first batch
    assert scoring_estimate(ws, ["his"], {}, None) is not None      # still to compute: nothing was stored
    at.multiselect(key="scores-criteria").set_value(["ae"]).run()
    at.button(key="scores-compute").click().run()
    assert not problems(at)
    at.run()
    assert told(at) == []                                            # stored now: nothing left to wait for


def test_trajectories_show_their_estimate():
    at = open_app("trajectories")
    assert not problems(at)
    [line] = told(at)
    assert "these trajectories: " in line and "on this CPU" in line


def test_memory_budget_on_model_and_data():
    at = open_app("model")
    at.text_input(key="md-memory-budget").input("lots").run()
    assert any("not a size" in p for p in problems(at))
    assert at.session_state["hp_memory_budget"] is None if "hp_memory_budget" in at.session_state else True
    at.text_input(key="md-memory-budget").input("2GB").run()
    assert not problems(at)
    assert at.session_state["hp_memory_budget"] == "2GB"


def test_prune_tells_the_live_warm_up_before_it_runs():
    at = open_app("prune")
    assert not problems(at)
    [line] = told(at)                                 # drawn before the first pass over the evaluation split
    assert line.startswith("⏱ live evaluation warm-up") and "on this CPU" in line
    at.run()
    assert told(at) == []                             # the live evaluator exists now: nothing left to wait for
