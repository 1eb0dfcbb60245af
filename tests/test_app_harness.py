"""The Export page's lm-eval button on the LM demo with the shipped offline cloze task and a small limit: estimate
line, a run dense and under the current mask, the numbers beside each other -- each checked against a direct
``run_lm_eval`` call -- and a classifier told lm-eval is not for it."""

from __future__ import annotations

import pytest
from app_support import open_app, problems, workspace

pytest.importorskip("lm_eval")

from dashboard.config import Setup  # noqa: E402
from headprune.evaluation.harness import HarnessSpec, resolve_tasks, run_lm_eval  # noqa: E402

LIMIT = 4


def test_lm_eval_button_runs_the_cloze_task_dense_and_under_the_mask():
    at = open_app("export", Setup(model="demo-lm", data="demo-lm", calib_size=8, eval_size=8, max_length=64))
    assert not problems(at)
    at.number_input(key="export-lmeval-limit").set_value(LIMIT).run()
    assert any("lm-eval demo_lm_cloze" in c.value for c in at.caption), [c.value for c in at.caption]  # estimate
    sd = at.session_state["hp_session"]
    sd.set_mask(sd.mask.prune(0, 0).prune(0, 1).prune(2, 3))
    at.button(key="export-lmeval").click().run()
    assert not problems(at)
    table = next(d.value for d in at.dataframe if "under the mask" in d.value.columns)
    assert sorted(table["metric"]) == ["acc", "acc_norm"]

    ws = workspace(at)
    tasks = resolve_tasks(HarnessSpec(tasks=("demo_lm_cloze",), limit=LIMIT))
    dense = run_lm_eval(ws.loaded.model, ws.loaded.tokenizer, tasks)["results"]["demo_lm_cloze"]
    masked = run_lm_eval(ws.loaded.model, ws.loaded.tokenizer, tasks, sd.mask)["results"]["demo_lm_cloze"]
    for _, row in table.iterrows():
        key = f"{row['metric']},none"
        assert row["dense"] == pytest.approx(dense[key]) and row["under the mask"] == pytest.approx(masked[key])
        assert row["change"] == pytest.approx(masked[key] - dense[key])

    at.run()   # stored: a rerun shows the same table without running lm-eval again
    assert next(d.value for d in at.dataframe if "under the mask" in d.value.columns).equals(table)


def test_a_classifier_is_told_lm_eval_is_for_language_models():
    at = open_app("export", Setup(calib_size=8, eval_size=8, max_length=32))
    assert not problems(at)
    assert any("language model" in i.value for i in at.info)
    assert not any(b.key == "export-lmeval" for b in at.button)
