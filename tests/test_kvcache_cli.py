"""The KV cache commands end to end on a tiny saved Llama: kvplan, evaluate --kv-plan, generate --kv-plan, and
their refusals before any model loads (issue 32)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import save_tiny_lm, sentences

from headprune.cli import main
from headprune.kvcache.plan import KVPlan
from headprune.kvcache.stream import StreamTrajectory

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_llama"))


def run(capsys, *argv) -> tuple[int, dict | str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_kvplan_evaluate_and_generate(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    plan_file, tsv, ids = tmp_path / "plan.json", tmp_path / "duo" / "full_attention_heads.tsv", tmp_path / "ids.json"
    code, out = run(capsys, "kvplan", "--model", model, "--data", data, "--rule", "far-mass", "--full-share", "0.25",
                    "--sink", "1", "--window", "3", "--calib-size", "8", "--out", str(plan_file), "--tsv", str(tsv),
                    "--head-ids", str(ids))
    assert code == 0, out
    plan = KVPlan.read(plan_file)
    assert int(plan.full.sum()) == out["full_kv_heads"] == 2 and (plan.sink, plan.window) == (1, 3)
    assert plan.meta["rule"] == "far-mass" and "versions" in plan.meta
    # the groups kept full are those with the highest far-mass scores (group = max of its query heads)
    scores = np.array(plan.meta["query_scores"]).reshape(4, 2, 4).max(-1)
    assert set(map(tuple, np.argwhere(plan.full.numpy()))) == set(map(tuple, np.argwhere(
        scores >= np.sort(scores.ravel())[-2])))
    # --tsv writes DuoAttention's folder: the continuous group scores (within the ordering steps) and config.json
    values, config = np.loadtxt(tsv, delimiter="\t"), json.loads((tsv.parent / "config.json").read_text())
    assert np.abs(values - scores).max() < 1e-4 and len(np.unique(values)) == 8   # far-mass lies in [0, 1]
    assert config["sparsity"] == 0.75 and (config["sink_size"], config["recent_size"]) == (1, 3)
    assert np.array_equal(values >= np.quantile(values, config["sparsity"]), plan.full.numpy())
    assert json.loads(ids.read_text())["full_kv_heads"] == out["head_ids"]

    evaluate = ("evaluate", "--model", model, "--data", data, "--eval-size", "12")
    code, dense = run(capsys, *evaluate)
    code, streamed = run(capsys, *evaluate, "--kv-plan", str(plan_file))
    assert code == 0 and streamed["kv_plan_full_kv_heads"] == 2
    assert streamed["perplexity"] != dense["perplexity"]
    wide = tmp_path / "wide.json"
    plan.with_window(0, 1000).write(wide)
    code, same = run(capsys, *evaluate, "--kv-plan", str(wide))
    assert same["perplexity"] == dense["perplexity"]      # W >= every row: exactly the dense metric

    code, gen = run(capsys, "generate", "--model", model, "--prompt", sentences(1, seed=9, min_words=12)[0],
                    "--max-new-tokens", "6", "--kv-plan", str(plan_file))
    assert code == 0, gen
    assert len(gen["full_cache"]["tokens"]) == len(gen["kv_plan"]["tokens"]) == 6
    assert gen["kv_plan"]["kv_bytes"] < gen["full_cache"]["kv_bytes"]
    assert gen["kv_plan"]["measured_byte_ratio"] == pytest.approx(gen["kv_plan"]["ideal_byte_ratio"])
    assert gen["kv_plan"]["time_per_output_token_s"] > 0


@pytest.mark.parametrize("argv, words", [
    (["kvplan", "--window", "0"], "window 0 must be an integer in [1, 1,048,576]"),
    (["kvplan", "--sink", "-1"], "sink -1 must be an integer in [0, 1,048,576]"),
    (["kvplan", "--full-share", "1.5"], "--full-share 1.5 must lie in [0, 1]"),
    (["kvplan", "--rule", "nope"], "Unknown KV plan rule 'nope'"),
    (["kvplan", "--model", "demo"], "--model demo is an encoder"),
    (["evaluate", "--model", "demo", "--kv-plan", "plan.json"], "--model demo is an encoder"),
    (["generate", "--model", "demo", "--prompt", "hi"], "--model demo is an encoder"),
    (["kvplan", "--trajectory", "--window", "0"], "window 0 must be an integer in [1, 1,048,576]"),
    (["kvplan", "--trajectory", "--step", "0"], "Step 0 must be a positive integer"),
    (["kvplan", "--trajectory", "--full-share", "-0.5"], "--full-share -0.5 must lie in [0, 1]"),
    (["kvplan", "--trajectory", "--rule", "nope"], "Unknown KV plan rule 'nope'"),
    (["kvplan", "--trajectory", "--random-orders", "-1"], "--random-orders -1"),
    (["kvplan", "--trajectory", "--tsv", "x.tsv"], "--tsv, --head-ids and --export-duo export one plan"),
    (["kvplan", "--tsv", "heads.tsv"], "--tsv heads.tsv: DuoAttention's loader reads full_attention_heads.tsv"),
    (["kvplan", "--trajectory", "--model", "demo"], "--model demo is an encoder"),
    (["kvplan", "--step", "2"], "--step belong to a streaming trajectory: add --trajectory"),
    (["kvplan", "--trajectory", "--metric", "bleu"], "bleu"),
])
def test_bad_input_is_refused_before_loading(argv, words, tmp_path, capsys, monkeypatch, lm_dir):
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache):   # every place a command loads a model from
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    argv = [a if a != "plan.json" else str(tmp_path / a) for a in argv]
    if argv[0] == "kvplan" and "--model" not in argv:
        argv += ["--model", lm_dir[0]]
    if argv[0] == "kvplan":
        argv += ["--out", str(tmp_path / "p.json")]
    code, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and words in err


def test_plan_for_another_grid_is_refused(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    other = tmp_path / "other.json"
    KVPlan(torch.ones(3, 2, dtype=torch.bool), 8).write(other)
    code, err = run(capsys, "evaluate", "--model", model, "--data", data, "--eval-size", "4", "--kv-plan", str(other))
    assert code == 2 and "3 blocks x 2 key/value heads" in err and "model has 4 x 2" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**KVPlan(torch.ones(4, 2, dtype=torch.bool), 8).to_json(), "window": 0}))
    code, err = run(capsys, "evaluate", "--model", model, "--data", data, "--kv-plan", str(bad))
    assert code == 2 and "window 0 must be an integer in [1, 1,048,576]" in err


def test_kvplan_trajectory_streams_each_group_and_records_every_plan(lm_dir, tmp_path, capsys):
    """``kvplan --trajectory``: each step's metric is what ``evaluate --kv-plan`` gives for that step's plan written
    to a file (a second, independent path through the CLI), and the random orders come with their band."""
    model, data = lm_dir
    out = tmp_path / "stream.json"
    code, result = run(capsys, "kvplan", "--trajectory", "--model", model, "--data", data, "--rule", "far-mass",
                       "--sink", "1", "--window", "3", "--step", "3", "--random-orders", "2", "--calib-size", "8",
                       "--eval-size", "12", "--out", str(out))
    assert code == 0, result
    assert json.loads(out.read_text())["rule"] == result["rule"]
    traj = StreamTrajectory.from_json(result["rule"])
    assert traj.rule == "far-mass" and [s["n_streamed"] for s in traj.steps] == [3, 6, 8]
    assert traj.metric == "perplexity"
    assert result["rule"]["model"] == model and result["rule"]["data"]["roles"]["eval"]["size"] == 12
    assert [r["seed"] for r in result["random"]["runs"]] == [0, 1] and result["random"]["spread"]["band"]
    evaluate = ("evaluate", "--model", model, "--data", data, "--eval-size", "12", "--calib-size", "8")
    code, dense = run(capsys, *evaluate)
    assert dense["perplexity"] == traj.values()[0]
    plan_file = tmp_path / "step1.json"
    traj.plan_at(1).write(plan_file)
    code, streamed = run(capsys, *evaluate, "--kv-plan", str(plan_file))
    assert code == 0 and streamed["kv_plan_full_kv_heads"] == 5
    assert streamed["perplexity"] == traj.steps[0]["metrics"]["perplexity"]
