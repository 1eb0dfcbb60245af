"""The dashboard on multiple choice: the LM demo on its cloze set (demo-lm-cloze), picked on Model & data; the Prune
page's live number is acc (checked against a full evaluation under the session's mask) and a question's choices
show their log-likelihoods as loaded and pruned (checked against a batch-of-one forward of each choice)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from app_support import PAGES, metric, open_app, problems, prune_lowest, small_env, workspace

from headprune.data import split_context_continuation
from headprune.evaluation.metrics import evaluate
from headprune.model.gating import gate_heads
from headprune.model.hooks import structural_copy


def choice_loglik(ws, mask, context: str, choice: str) -> float:
    ctx, cont = split_context_continuation(ws.loaded.tokenizer, context, choice)
    model = structural_copy(ws.loaded.model)   # the workspace's model is shared: gate a private copy
    with torch.no_grad(), gate_heads(model, mask):
        logits = model(input_ids=torch.tensor([ctx + cont])).logits[0].double()
    logp = F.log_softmax(logits, -1)
    return sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont))


def test_prune_page_on_the_cloze_set():
    with small_env(HEADPRUNE_EVAL_SIZE="48", HEADPRUNE_CALIB_SIZE="16"):
        at = open_app("model")
        at.radio(key="md-model-kind").set_value("demo-lm").run()
        at.radio(key="md-data-kind").set_value("demo").run()
        at.selectbox(key="md-demo-data").set_value("demo-lm-cloze").run()
        at.button(key="md-load").click().run()
        assert not problems(at)
        setup = at.session_state["hp_setup"]
        assert (setup.model, setup.data) == ("demo-lm", "demo-lm-cloze")
        ws = workspace(at)
        assert ws.task.is_choice and ws.metric == "acc" and len(ws.eval) == 48
        assert "choices" in at.dataframe[0].value.columns

        at.switch_page(PAGES["prune"]).run()
        assert not problems(at)
        dense = float(metric(at, "acc"))
        assert dense == pytest.approx(ws.dense().acc, abs=1e-4)
        prune_lowest(at, 50)
        assert not problems(at)
        mask = at.session_state["hp_session"].mask
        want = evaluate(ws.loaded.model, ws.eval_batches, mask, task=ws.task)
        assert float(metric(at, "acc")) == pytest.approx(want.acc, abs=1e-4)

        table = next(d.value for d in at.dataframe if "choice" in d.value.columns)
        question = int(at.number_input(key="prune-question").value)
        assert list(table["choice"]) == ws.eval.choices[question]
        assert list(table["right"]).index(True) == ws.eval.labels[question]
        context = ws.eval.texts[question]
        for row, choice in enumerate(ws.eval.choices[question]):
            assert table["log-likelihood, as loaded"][row] == pytest.approx(
                choice_loglik(ws, None, context, choice), abs=1e-3)
            assert table["log-likelihood, pruned"][row] == pytest.approx(
                choice_loglik(ws, mask, context, choice), abs=1e-3)
        assert table["picked pruned"].sum() == 1
