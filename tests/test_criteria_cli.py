"""CLI: criteria, score, trajectory, select-alpha on the tiny saved model (conftest fixtures); bad input exits 2."""

import json

import pytest

from headprune.cli import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_criteria_lists_names_and_descriptions(capsys):
    code, out, _ = run(capsys, "criteria")
    by_name = {c["name"]: c for c in out["criteria"]}
    assert code == 0 and {"ae", "ad", "his", "hies", "taylor", "gnorm", "greedy-gnorm", "random"} <= set(by_name)
    assert by_name["hies"]["params"]["alpha"]["default"] == "auto" and by_name["greedy-gnorm"]["dynamic"]


def test_score_writes_the_score_map(capsys, tmp_path, tiny_model_dir, tiny_csv):
    out_file = tmp_path / "s.json"
    code, out, err = run(capsys, "score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "hies",
                       "--param", "alpha=0.25", "--calib-size", 16, "--out", out_file)
    assert code == 0, err
    assert out == json.loads(out_file.read_text())
    assert out["criterion"] == "hies" and out["params"] == {"alpha": 0.25} and out["higher_is_more_important"]
    assert (out["layers"], out["heads"]) == (3, 4) and len(out["scores"]) == 3 and out["seconds"] > 0
    assert out["model"] == str(tiny_model_dir) and out["data"]["calib_size"] == 16


def test_trajectory_run_file_and_seeds(capsys, tmp_path, tiny_model_dir, tiny_csv):
    common = ["--model", tiny_model_dir, "--data", tiny_csv, "--calib-size", 16, "--eval-size", 20]
    code, out, _ = run(capsys, "trajectory", *common, "--criterion", "greedy-gnorm", "--budget", 0.5, "--step", 2,
                       "--stability", "--out", tmp_path / "run.json")
    assert code == 0 and [s["n_pruned"] for s in out["steps"]] == [2, 4, 6] and out["stop"] == "budget"
    assert all(0 <= s["stability"] <= 100 for s in [out["dense"], *out["steps"]])
    assert "auc" in out["summary"] and out["data"]["eval_size"] == 20 and out["versions"]["torch"]
    code, out, _ = run(capsys, "trajectory", *common, "--criterion", "random", "--count", 3, "--seeds", 3)
    assert code == 0 and out["seeds"] == [0, 1, 2] and len(out["spread"]["median"]) == 4


def test_select_alpha(capsys, tiny_model_dir, tiny_csv):
    code, out, _ = run(capsys, "select-alpha", "--model", tiny_model_dir, "--data", tiny_csv, "--calib-size", 16,
                       "--alphas", "0,1", "--budget", 0.25, "--step", 3)
    assert code == 0 and out["best_alpha"] in (0.0, 1.0) and set(out["wauc"]) == {"0.0", "1.0"}


@pytest.mark.parametrize("argv, words", [
    (["score", "--criterion", "nope"], "Unknown criterion 'nope'. Known criteria: ad, ae"),
    (["score", "--criterion", "ae", "--param", "alpha=1"], "does not take parameter(s) alpha"),
    (["score", "--criterion", "hies", "--param", "alpha=2"], "accepted: 'auto' (chosen by wAUC on the calibration"),
    (["score", "--criterion", "ae", "--param", "eps=0"], "must be > 0"),
    (["score", "--criterion", "ae", "--param", "eps"], "expected KEY=VALUE"),
    (["trajectory", "--criterion", "ae", "--budget", "1.5"], "not a ratio in (0, 1]"),
    (["trajectory", "--criterion", "ae", "--budget", "0"], "not a ratio in (0, 1]"),
    (["select-alpha", "--alphas", "0,x"], "comma-separated numbers"),
])
def test_bad_input_exits_2_with_a_message(capsys, tiny_model_dir, tiny_csv, argv, words):
    code, _, err = run(capsys, *argv, "--model", tiny_model_dir, "--data", tiny_csv, "--calib-size", 8,
                       "--eval-size", 8)
    assert code == 2 and words in err
