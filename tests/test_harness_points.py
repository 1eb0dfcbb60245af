"""lm-eval numbers in trajectories and protocols: measured at chosen ratios only, on the masks the run reached.

Each number is checked against an independent computation: the task's rows are also the evaluation rows, so
lm-eval's acc at a point must equal headprune's own multiple-choice acc (tests/test_harness.py shows the two paths
agree question by question) under the mask rebuilt from the run file's removed heads; and a direct ``run_lm_eval``
on that mask.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lm_eval")

from harness_support import model_folder, random_questions, word_tokenizer, write_task  # noqa: E402

from headprune.cli import main  # noqa: E402
from headprune.data import load_data, make_choice_batches  # noqa: E402
from headprune.evaluation.harness import HarnessSpec, harness_metrics, resolve_tasks, run_lm_eval  # noqa: E402
from headprune.evaluation.metrics import evaluate  # noqa: E402
from headprune.protocol import Protocol, ProtocolError  # noqa: E402
from headprune.protocol.run import run_protocol  # noqa: E402
from headprune.testing import tiny_decoder  # noqa: E402
from headprune.trajectory import Trajectory  # noqa: E402

ACC, NORM = "lm-eval:pts_mc/acc", "lm-eval:pts_mc/acc_norm"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A model folder, the lm-eval task pts_mc (40 questions) and a second file of other questions (calibration)."""
    root = tmp_path_factory.mktemp("points")
    tasks = write_task(root / "tasks", "pts_mc", random_questions(40, seed=1))
    calib = write_task(root / "calib", "calib_mc", random_questions(24, seed=2)) / "calib_mc.jsonl"
    return {"root": root, "model": str(model_folder(root / "model")), "tasks": tasks,
            "rows": tasks / "pts_mc.jsonl", "calib": calib}


def own_scores(rows, mask) -> tuple[float, float]:
    """headprune's own acc / acc_norm on the task's rows under ``mask`` (the independent reference)."""
    batches = make_choice_batches(word_tokenizer(), load_data(str(rows)), batch_size=8, max_length=64)
    m = evaluate(tiny_decoder("llama"), batches, mask)
    return m.acc, m.acc_norm


def test_harness_metrics_runs_each_task_once_and_drops_layers_on_a_copy(setup):
    """Two metrics of one task come from one lm-eval run; dropped layers change the numbers but never the caller's
    model (the same call without them afterwards gives the dense numbers again)."""
    model, tok = tiny_decoder("llama"), word_tokenizer()
    tasks = resolve_tasks(HarnessSpec(tasks=("pts_mc",), include=(str(setup["tasks"]),), batch_size=8))
    calls = []
    both = harness_metrics(model, tok, None, [ACC, NORM], tasks=tasks, progress=lambda f, m: calls.append(f))
    assert calls.count(1.0) == 1   # one run (its progress ends once)
    full = run_lm_eval(model, tok, tasks)["results"]["pts_mc"]
    assert both == {ACC: full["acc,none"], NORM: full["acc_norm,none"]}
    assert (both[ACC], both[NORM]) == own_scores(setup["rows"], None)
    dropped = run_lm_eval(model, tok, tasks, dropped_layers=[1, 2])
    assert dropped["dropped_layers"] == [1, 2]
    assert dropped["results"]["pts_mc"] != run_lm_eval(model, tok, tasks, dropped_layers=[1])["results"]["pts_mc"]
    assert harness_metrics(model, tok, None, [ACC, NORM], tasks=tasks) == both


def test_trajectory_measures_lm_eval_at_the_chosen_ratios(setup, tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["trajectory", "--model", setup["model"], "--data", str(setup["rows"]), "--calib-data",
            str(setup["calib"]), "--eval-size", "40", "--calib-size", "16", "--criterion", "random", "--step", "4",
            "--budget", "0.875", "--metric", f"{ACC},{NORM}", "--at", "0.25,0.75", "--lm-eval-include",
            str(setup["tasks"]), "--save-mask", "0.75", "--out", str(out), "--device", "cpu"]
    assert main(argv) == 0, capsys.readouterr().err[-3000:]
    err = capsys.readouterr().err
    assert "estimate: lm-eval at up to 3 points per run" in err
    obj = json.loads(out.read_text())
    run = Trajectory.from_json(obj)
    assert obj["lm_eval_points"]["metrics"] == [ACC, NORM] and obj["lm_eval_points"]["at"] == [0.25, 0.75]
    assert run.metric == "acc"   # the steps keep the task's headline
    steps = [row["step"] for row in run.points[ACC]]
    assert steps == [0, run.point_at_ratio(0.25), run.point_at_ratio(0.75)] == [0, 2, 6]
    for acc_row, norm_row in zip(run.points[ACC], run.points[NORM]):
        mask = run.mask_at(acc_row["step"])
        # the independent reference: headprune's own scores on the same rows, and the run's own step metrics
        assert (acc_row["value"], norm_row["value"]) == own_scores(setup["rows"], mask)
        assert acc_row["value"] == run.values("acc")[acc_row["step"]]
        assert acc_row["ratio"] == run.ratios()[acc_row["step"]]
    # pruning moves the answers: not one number thrice
    assert len({(a["value"], n["value"]) for a, n in zip(run.points[ACC], run.points[NORM])}) > 1
    saved = json.loads(Path(obj["masks"]["0.75"][0]).read_text())
    assert saved["metrics"][ACC] == run.points[ACC][2]["value"]


@pytest.mark.parametrize("extra, message", [
    (["--metric", "lm-eval:pts_mc/acc", "--tolerance", "0.9"], "--tolerance reads its metric after every step"),
    (["--metric", "acc,lm-eval:pts_mc/acc"], "not both"),
    (["--metric", "lm-eval:pts_mc"], "lm-eval:TASK/METRIC"),
    (["--at", "0.5"], "--at names the points where an lm-eval metric is measured"),
    (["--metric", "lm-eval:pts_mc/acc", "--at", "1.5"], "--at '1.5'"),
    (["--metric", "lm-eval:no_such_task_q/acc"], "lm-eval has no task 'no_such_task_q'"),
])
def test_trajectory_refuses_bad_lm_eval_settings_before_the_model_loads(setup, monkeypatch, capsys, extra, message):
    import headprune.workspace as workspace

    monkeypatch.setattr(workspace, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    code = main(["trajectory", "--model", setup["model"], "--data", str(setup["rows"]), "--criterion", "random",
                 "--lm-eval-include", str(setup["tasks"]), *extra])
    assert code == 2 and message in capsys.readouterr().err


def protocol_text(setup, body: str, metrics=('"acc"', '"acc_norm"', f'"{ACC}"', f'"{NORM}"')) -> str:
    return f"""
name = "points"
models = ["{setup['model']}"]
metrics = [{", ".join(metrics)}]
batch_size = 8
max_length = 64
{body}
[lm_eval]
include = ["{setup['tasks']}"]
batch_size = 8
[data.calib]
source = "{setup['calib']}"
size = 16
[data.eval]
source = "{setup['rows']}"
size = "all"
"""


def test_protocol_sparsity_cells_carry_lm_eval_numbers(setup, tmp_path):
    text = protocol_text(setup, 'sparsities = [0.25, 0.5]\n[[criteria]]\nname = "random"\n'
                                '[[criteria]]\nname = "his"\n')
    result = run_protocol(Protocol.parse(text, str(tmp_path / "p.toml")), tmp_path / "out", plots=False)
    cells = json.loads((tmp_path / "out" / "run.json").read_text())["cells"]
    assert len(cells) == 5
    for record in cells.values():   # the evaluation rows are the task's rows: both paths must agree
        assert record["metrics"][ACC] == record["metrics"]["acc"]
        assert record["metrics"][NORM] == record["metrics"]["acc_norm"]
    assert len({r["metrics"][ACC] for r in cells.values()}) > 1
    assert ACC in result["table"]
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0]
    assert f"{ACC} mean" in header and f"{NORM} sd" in header


def test_protocol_trajectory_reports_lm_eval_at_report_at(setup, tmp_path):
    text = protocol_text(setup, '[trajectory]\nstep = 8\nbudget = 0.5\nreport_at = [0.25, 0.5]\n'
                                '[[criteria]]\nname = "random"\n')
    run_protocol(Protocol.parse(text, str(tmp_path / "p.toml")), tmp_path / "out", plots=False)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    row = run["table"]["rows"][0]
    traj = Trajectory.from_json(next(iter(run["cells"].values()))["trajectory"])
    assert [p["step"] for p in traj.points[ACC]] == [0, 1, 2]
    for r in (0.25, 0.5):
        assert row[f"{ACC} @ {r:g}"][0] == row[f"acc @ {r:g}"][0]   # same rows, two paths


@pytest.mark.parametrize("body, metrics, message", [
    ('sparsities = [0.5]\n[[criteria]]\nname = "random"\n', ('"lm-eval:pts_mc"',), "line 4: key 'metrics'"),
    ('[trajectory]\nstep = 8\n[[criteria]]\nname = "random"\n', (f'"{ACC}"',), "give report_at"),
    ('sparsities = [0.5]\n[[criteria]]\nname = "random"\n', ('"lm_eval:pts_mc/acc"',), "or an lm-eval number"),
])
def test_protocol_refuses_bad_lm_eval_metrics_with_their_line(setup, body, metrics, message):
    with pytest.raises(ProtocolError, match=message):
        Protocol.parse(protocol_text(setup, body, metrics), "p.toml")


def test_protocol_refuses_an_lm_eval_headline_for_a_trajectory_and_unknown_lm_eval_keys(setup):
    text = protocol_text(setup, '[trajectory]\nstep = 8\nreport_at = [0.5]\n[[criteria]]\nname = "random"\n')
    with pytest.raises(ProtocolError, match="trajectory's headline is read after every step"):
        Protocol.parse(text.replace('batch_size = 8\nmax_length', f'headline = "{ACC}"\nbatch_size = 8\nmax_length',
                                    1), "p.toml")
    with pytest.raises(ProtocolError, match=r"key 'lm_eval.shots': unknown key; accepted: limit"):
        Protocol.parse(text.replace("[lm_eval]\n", "[lm_eval]\nshots = 2\n"), "p.toml")
    with pytest.raises(ProtocolError, match=r"key 'lm_eval.limit'"):
        Protocol.parse(text.replace("[lm_eval]\n", "[lm_eval]\nlimit = 0\n"), "p.toml")


def test_an_unknown_lm_eval_task_stops_a_protocol_before_any_model_loads(setup, tmp_path, monkeypatch):
    import headprune.protocol.cells as cells
    from headprune.evaluation.harness import HarnessError

    monkeypatch.setattr(cells, "load_model", lambda *a, **k: pytest.fail("the model loaded first"))
    text = protocol_text(setup, 'sparsities = [0.5]\n[[criteria]]\nname = "random"\n',
                         ('"lm-eval:no_such_task_q/acc"',))
    with pytest.raises(HarnessError, match="no task 'no_such_task_q'"):
        run_protocol(Protocol.parse(text, "p.toml"), tmp_path / "out", plots=False)
