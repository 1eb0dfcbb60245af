"""``run --plan`` refuses what a run refuses before its first cell (issue 30): limits past their declared bounds
(before anything is allocated), a missing data file, role sizes past the source's rows, an unknown lm-eval task;
and an error starts on its own line even while a progress bar is drawn."""

from __future__ import annotations

import importlib.util
import json
import re
import time

import pytest

from headprune.cli import main
from headprune.cli.common import OPEN_BARS, tqdm_progress
from headprune.limits import POSITIVE, Interval

BASE = """name = "p"
models = ["{model}"]
sparsities = [0.5]
{extra}
[data.calib]
source = "{csv}"
size = {calib}
[data.eval]
source = "{eval}"
size = 20
[[criteria]]
name = "random"
"""


def plan(tmp_path, capsys, model, csv, *, extra="", calib=12, eval_source=None) -> tuple[int, str]:
    path = tmp_path / "p.toml"
    path.write_text(BASE.format(model=model, csv=csv, eval=eval_source or csv, calib=calib, extra=extra))
    capsys.readouterr()
    code = main(["run", str(path), "--plan", "--no-timing"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("extra, needle", [
    ("repeats = 1000000000", "repeats 1000000000 must be an integer in [1, 1000] (each repeat is a full set"),
    ("batch_size = 1000000000", "batch_size 1000000000 must be an integer in [1, 4096] (rows in one forward"),
    ("max_length = 1000000000", "in [1, 1,048,576] (tokens per row"),
    ("[lm_eval]\nlimit = 1000000000000", "--lm-eval-limit 1000000000000: must be an integer in [1, 10,000,000]"),
    ("[lm_eval]\nbootstrap_iters = 1000000000000", "in [0, 1,000,000] (lm-eval's resamples"),
    ("[recovery]\nlr = inf", "must be a finite number > 0"),
])
def test_limits_past_their_bounds_are_refused_at_once(tmp_path, capsys, tiny_model_dir, tiny_csv, extra, needle):
    start = time.perf_counter()
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv, extra=extra)
    assert code == 2 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err and time.perf_counter() - start < 30   # no MemoryError, no 1 TB batch


def test_an_interval_refuses_infinity_unless_it_admits_it():
    assert POSITIVE(float("inf")) == "must be a finite number > 0"
    assert POSITIVE(float("nan")) == "must be a finite number > 0"
    assert Interval(0, None, infinite=True)(float("inf")) is None and POSITIVE(1e300) is None
    assert Interval(1, 10, integer=True, why="a reason")(11) == "must be an integer in [1, 10] (a reason)"


def test_the_plan_reads_the_data_as_a_run_would(tmp_path, capsys, tiny_model_dir, tiny_csv):
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv)   # 60 rows: 12 + 20 fit
    assert code == 0, err
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv, calib=41)   # 41 + 20 > 60 rows
    assert code == 2 and re.search(r"key 'data\.(calib|eval)\.size'", err) and "only 60 rows" in err, err
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv, eval_source=tmp_path / "missing.csv")
    assert code == 2 and "key 'data.eval.source'" in err and "not found" in err, err
    other = tmp_path / "other.csv"
    other.write_text("text,label\n" + "".join(f"row {i},pos\n" for i in range(15)))
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv, eval_source=other)   # 20 of 15 rows
    assert code == 2 and "key 'data.eval.size'" in err and "only 15 rows" in err, err


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="the eval extra")
def test_the_plan_checks_lm_eval_task_names_offline(tmp_path, capsys, tiny_model_dir, tiny_csv):
    extra = 'metrics = ["lm-eval:no_such_task_xyz/acc"]'
    code, err = plan(tmp_path, capsys, tiny_model_dir, tiny_csv, extra=extra)
    assert code == 2 and "lm-eval has no task 'no_such_task_xyz'" in err, err


def test_an_error_starts_on_its_own_line_after_a_progress_bar(tmp_path, capsys):
    update = tqdm_progress("working")
    update(0.4, "half way")   # a bar drawn and not finished, as when a run fails in the middle
    assert OPEN_BARS
    capsys.readouterr()
    assert main(["mask", "--scores", str(tmp_path / "none.json"), "--ratio", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "\nerror: --scores" in err and not OPEN_BARS, err
    assert json.dumps(err)   # printable
