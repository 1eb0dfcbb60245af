"""Dashboard, Recover step (issue 24): the estimate before the run, a dense / pruned / recovered table whose pruned
column is an independent evaluation under the session mask, and a cancelled run that stores nothing."""

from __future__ import annotations

import pytest
from app_support import full_evaluation, open_app, problems, workspace

from dashboard.compute import run_recovery, stored_recovery
from headprune.errors import Cancelled
from headprune.model.mask import HeadMask
from headprune.recovery import RecoverySpec

pytestmark = pytest.mark.usefixtures("one_thread")


def _prune_half(at) -> HeadMask:
    sd = at.session_state["hp_session"]
    shape = sd.mask.shape
    sd.set_mask(HeadMask.from_pruned({layer: list(range(6)) for layer in range(shape[0])}, shape), "test")
    return sd.mask


def test_recover_table_and_cancel():
    at = open_app("recover")
    assert not problems(at), problems(at)
    mask = _prune_half(at)
    at.number_input(key="recover-steps").set_value(2)
    at.number_input(key="recover-train-size").set_value(32).run()
    assert not problems(at), problems(at)
    assert any(c.value.startswith("⏱ finetune recovery (2 steps)") for c in at.caption)

    # a cancel between steps stores nothing
    ws, sd = workspace(at), at.session_state["hp_session"]
    spec = RecoverySpec(method="finetune", epochs=1, steps=2, lr=5e-5, batch_size=16, max_length=ws.setup.max_length,
                        freeze_embeddings=True)
    assert at.text_input(key="recover-train").value == "demo:train"

    def cancel(fraction, message):
        raise Cancelled()

    with pytest.raises(Cancelled):
        run_recovery(ws, sd, spec, "demo:train", 32, "headprune", cancel)
    assert stored_recovery(sd, spec, "demo:train", 32, "headprune") is None

    at.button(key="recover-run").click().run()
    assert not problems(at), problems(at)
    [table] = at.table
    rows = {row["metric"]: row for row in table.value.to_dict("records")}
    pruned = full_evaluation(at)          # the session mask, evaluated on its own
    assert mask == sd.mask
    assert rows["accuracy"]["pruned"] == pytest.approx(pruned.accuracy)
    assert rows["accuracy"]["dense"] == pytest.approx(ws.dense().accuracy)
    assert 0 <= rows["accuracy"]["recovered"] <= 1
    assert stored_recovery(sd, spec, "demo:train", 32, "headprune") is not None
    at.button(key="recover-build").click().run()
    assert not problems(at), problems(at)
    assert at.get("download_button")
