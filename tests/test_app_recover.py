"""Dashboard, Recover step (issue 24): the widgets open on ``RecoverySpec()``'s recipe (issue 29), the estimate
before the run, a dense / pruned / recovered table whose pruned column is an independent evaluation under the
session mask, and a cancelled run that stores nothing."""

from __future__ import annotations

import pytest
from app_support import full_evaluation, open_app, problems, workspace

from dashboard.compute import run_recovery, stored_recovery
from headprune.errors import Cancelled
from headprune.model.mask import HeadMask
from headprune.recovery import DEFAULT_LR, RecoverySpec

pytestmark = pytest.mark.usefixtures("one_thread")


def _prune_half(at) -> HeadMask:
    sd = at.session_state["hp_session"]
    shape = sd.mask.shape
    sd.set_mask(HeadMask.from_pruned({layer: list(range(6)) for layer in range(shape[0])}, shape), "test")
    return sd.mask


def test_recover_table_and_cancel():
    at = open_app("recover")
    assert not problems(at), problems(at)
    defaults = RecoverySpec()
    assert (defaults.method, defaults.learning_rate, defaults.batch_size) == ("distill", 2e-4, 32)   # the recipe
    assert at.selectbox(key="recover-method").value == defaults.method
    assert at.number_input(key=f"recover-lr-{defaults.method}").value == pytest.approx(defaults.learning_rate)
    assert at.number_input(key="recover-epochs").value == defaults.epochs
    assert at.number_input(key="recover-steps").value == 0 and defaults.steps is None
    mask = _prune_half(at)
    at.number_input(key="recover-steps").set_value(2)
    at.number_input(key="recover-train-size").set_value(32).run()
    assert not problems(at), problems(at)
    assert any(c.value.startswith("⏱ distill recovery (2 steps)") for c in at.caption)

    # a cancel between steps stores nothing; the page's spec is the default one but for steps and max_length (its
    # key holds every field: batch, α, T, warm-up, frozen embeddings, dropout)
    ws, sd = workspace(at), at.session_state["hp_session"]
    spec = RecoverySpec(steps=2, max_length=ws.setup.max_length)
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


def test_recover_learning_rate_follows_the_method():
    at = open_app("recover")
    at.selectbox(key="recover-method").set_value("lora").run()
    assert not problems(at), problems(at)
    assert DEFAULT_LR["lora"] != RecoverySpec().learning_rate
    assert at.number_input(key="recover-lr-lora").value == pytest.approx(DEFAULT_LR["lora"])
    at.selectbox(key="recover-method").set_value("finetune").run()
    assert at.number_input(key="recover-lr-finetune").value == pytest.approx(DEFAULT_LR["finetune"])
