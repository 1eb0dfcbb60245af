"""The circuit demo: its known induction circuit is found by the role detectors and is what the task needs.

These are the README's four measurements ("The circuit demo"), recomputed on the cached demo (built once, about
two CPU minutes, like the other demos).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from headprune.cli import main
from headprune.data import load_data, make_batches, split_calib_eval
from headprune.demos import circuit
from headprune.evaluation.live import LiveEvaluator
from headprune.evaluation.metrics import evaluate
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.roles import ROLE_NAMES, RoleSpec, head_roles, kept_by_role, role_ablation
from headprune.scoring import ScoringContext, get


@pytest.fixture(scope="module")
def circuit_setup():
    torch.set_num_threads(1)
    loaded = load_model("demo-circuit", device="cpu")
    calib_ds, eval_ds = split_calib_eval(load_data("demo-circuit"), 64, 192, seed=0)
    calib = make_batches(loaded.tokenizer, calib_ds, 32)
    evals = make_batches(loaded.tokenizer, eval_ds, 64)
    report = head_roles(loaded.model, loaded.tokenizer, calib, RoleSpec(parser=None))
    return loaded, calib, evals, report


def test_the_repeated_half_is_learnt_and_only_it_is_scored(circuit_setup):
    loaded, _, evals, _ = circuit_setup
    metrics = evaluate(loaded.model, evals)
    assert metrics.next_token_accuracy > 0.9
    # targets: the second copy after its first word, n - 1 of them per row of 2n words
    ds = load_data("demo-circuit")
    words = [len(t.split()) // 2 for t in ds.texts]
    batches = make_batches(loaded.tokenizer, ds, 64)
    assert sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches) == sum(n - 1 for n in words)


def test_previous_token_head_early_and_induction_heads_late(circuit_setup):
    _, _, _, report = circuit_setup
    prev, ind = report.heads_with("previous-token"), report.heads_with("induction")
    assert prev[0].any(), report.scores["previous-token"].scores
    assert ind[1].any() and not ind[0].any(), report.scores["induction"].scores


def test_pruning_the_induction_heads_breaks_the_task_and_random_heads_do_not(circuit_setup):
    loaded, _, evals, report = circuit_setup
    live = LiveEvaluator(loaded.model, evals)
    result = role_ablation(live, report, "induction", seeds=10, metric="next_token_accuracy",
                           exclude=["previous-token"])
    assert result["role_value"] < 0.1 * result["base"]                  # near chance (1/500) vs > 0.9
    assert result["random_mean"] >= 0.9 * result["base"]


def test_a_fresh_copy_has_no_induction_head(circuit_setup):
    loaded, calib, _, _ = circuit_setup
    torch.manual_seed(0)
    fresh = LlamaForCausalLM._from_config(loaded.model.config, attn_implementation="sdpa").eval()
    report = head_roles(fresh, loaded.tokenizer, calib, RoleSpec(parser=None))
    assert not report.heads_with("induction").any(), report.scores["induction"].scores


def test_which_criteria_keep_the_circuit(circuit_setup):
    """The kept share of the circuit's heads is what the kept sets say, head by head."""
    loaded, calib, _, report = circuit_setup
    ctx = ScoringContext(loaded.model, calib, tokenizer=loaded.tokenizer)
    maps = {name: get(name)(ctx, {}) for name in ("ae", "his")}
    circuit_heads = report.heads_with("induction") | report.heads_with("previous-token")
    for ratio in (0.25, 0.5, 0.75):
        table = kept_by_role(maps, report, ratio)
        for name, scores in maps.items():
            kept = scores.kept_at(ratio)
            ind = report.heads_with("induction")
            assert table[name]["kept"]["induction"] == int((kept & ind).sum())
            assert table[name]["n_kept"] == int(kept.sum())
    assert circuit_heads.sum() < circuit_heads.size           # the circuit is a few of the heads, not all
    assert np.isfinite(report.scores["induction"].scores).all()
    assert HeadMask.ones(report.shape).n_kept == report.shape[0] * report.shape[1]


def test_the_demo_is_registered():
    assert circuit.RECIPE in str(circuit.demo_circuit_dir())


def test_roles_command_writes_scores_labels_thresholds_and_the_kept_table(tmp_path, capsys):
    out = tmp_path / "roles.json"
    code = main(["roles", "--model", "demo-circuit", "--data", "demo-circuit", "--calib-size", "32", "--no-syntax",
                 "--criterion", "ae", "--ratio", "0.25", "--ratio", "0.75", "--out", str(out)])
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["roles"]) == set(ROLE_NAMES) and result["thresholds"]["sink"] == 0.3
    assert result["counts"]["induction"] >= 1 and result["seed"] == 0 and "torch" in result["versions"]
    assert set(result["kept_by_role"]) == {"0.25", "0.75"}
    assert result["kept_by_role"]["0.75"]["ae"]["n_pruned"] == 18


@pytest.mark.parametrize("argv, message", [
    (["--role-param", "sink.threshold=2"], "threshold"),
    (["--role-param", "nothing=1"], "ROLE.KEY=VALUE"),
    (["--criterion", "nope"], "Unknown criterion"),
])
def test_roles_command_refuses_bad_input_before_loading(capsys, argv, message):
    assert main(["roles", "--model", "/no/such/folder", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
