"""The work a plan counts before a run (``run --plan``: row-passes over the calibration, selection and evaluation
rows) against the forward passes the run makes, counted independently: every call of the model class's forward,
by the rows it carries, or of each encoder layer's (issue 29: SAP's k sweep and SAP+CF's candidate evaluations on
the selection rows were not counted at all; Kwon et al.'s Fisher pass and tuning are)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from test_sap_cf import labelled_csv, protocol_text, sensitive_model_dir  # noqa: F401 - fixtures

from headprune.protocol import Protocol
from headprune.protocol.plan import plan
from headprune.protocol.run import run_protocol
from headprune.scoring.protocol import GRADIENT_PASS


@contextmanager
def counted_rows(cls):
    """Rows through ``cls.forward`` (every instance, private copies included), with and without autograd."""
    seen = {"rows": 0, "calls": 0}
    original = cls.forward

    def forward(self, *args, **kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        seen["rows"] += 0 if ids is None else int(ids.shape[0])
        seen["calls"] += 1
        return original(self, *args, **kwargs)

    cls.forward = forward
    try:
        yield seen
    finally:
        cls.forward = original


@pytest.mark.parametrize("criteria, select_passes, least", [
    # target 0.5 on 12 heads: pool 0.75 -> 9 candidates; m0, each candidate alone, the 6-head mask
    ('[[criteria]]\nname = "sap-cf"\nparams = { k = 2 }\n', 1 + 9 + 1, 1 + 9 + 1),
    ('[[criteria]]\nname = "sap"\nparams = { k = 2 }\n', 0, 0),
    # the k sweep: one evaluation per k of 1..3 at most (two k giving one mask are evaluated once), then CF's 11
    ('[[criteria]]\nname = "sap-cf"\nparams = { k_max = 3 }\n', 3 + 1 + 9 + 1, 1 + 1 + 9 + 1),
    # the tolerance mode: m0, the 9 heads alone, then at most 9 cumulative steps (at least one)
    ('[[criteria]]\nname = "sap-cf"\nparams = { k = 2, sparsity = 0, pool = 0.75 }\n', 1 + 9 + 9, 1 + 9 + 1),
])
def test_the_plan_counts_the_rows_a_sap_cf_run_forwards(tmp_path, sensitive_model_dir, labelled_csv,  # noqa: F811
                                                         one_thread,
                                                         criteria, select_passes, least):
    from transformers import BertForSequenceClassification

    path = tmp_path / "cf.toml"
    path.write_text(protocol_text(sensitive_model_dir, labelled_csv, criteria), encoding="utf-8")
    protocol = Protocol.read(path)
    [p] = plan(protocol, time_it=False)
    sizes = {role: protocol.models[0].data[role].size for role in ("calib", "select", "eval")}
    assert p.select_row_passes == sizes["select"] * select_passes       # the count by hand
    with counted_rows(BertForSequenceClassification) as seen:
        run_protocol(protocol, tmp_path / "out", plots=False)
    planned = p.calib_row_passes + p.select_row_passes + p.eval_row_passes
    # exact where the count is known before scoring (least = select_passes), else an upper bound
    assert planned - sizes["select"] * (select_passes - least) <= seen["rows"] <= planned


def test_the_plan_counts_kwon_s_fisher_pass_and_tuning(tmp_path, sensitive_model_dir, labelled_csv,  # noqa: F811
                                                        one_thread):
    """Kwon et al. at 0.5: a forward + backward for the Fisher, then per layer three one-layer passes (dense,
    pruned, tuned input of the next layer; the last layer needs no next input). Counted per encoder layer, a
    layer's rows under autograd as 1 + 2 (GRADIENT_PASS: a backward costs about two forwards)."""
    from transformers.models.bert.modeling_bert import BertLayer

    path = tmp_path / "kwon.toml"
    path.write_text(protocol_text(sensitive_model_dir, labelled_csv, '[[criteria]]\nname = "kwon"\n'),
                    encoding="utf-8")
    protocol = Protocol.read(path)
    [p] = plan(protocol, time_it=False)
    n_calib, n_layers = protocol.models[0].data["calib"].size, p.grid[0]
    assert p.calib_row_passes == n_calib * (GRADIENT_PASS + 3) and p.select_row_passes == 0
    seen = {"rows": 0, "grad_rows": 0}
    original = BertLayer.forward

    def forward(self, hidden_states, *args, **kwargs):
        seen["rows"] += hidden_states.shape[0]
        seen["grad_rows"] += hidden_states.shape[0] if torch.is_grad_enabled() else 0
        return original(self, hidden_states, *args, **kwargs)

    BertLayer.forward = forward
    try:
        run_protocol(protocol, tmp_path / "out", plots=False)
    finally:
        BertLayer.forward = original
    assert seen["grad_rows"] == n_calib * n_layers          # the Fisher pass: one forward with autograd
    measured = (seen["rows"] + (GRADIENT_PASS - 1) * seen["grad_rows"]) / n_layers
    planned = p.calib_row_passes + p.eval_row_passes
    assert planned - n_calib / n_layers == pytest.approx(measured)    # the last layer's unneeded next input
