"""Every CLI argument is checked before a model loads or a progress bar is drawn (issue 16 §4).

Each bad argument below must end the command with exit 2 and a first stderr line starting with ``error:``, while
loading a model, building a workspace or opening a tqdm bar raises (monkeypatched): so a case that got as far as
loading fails here even if it would have been refused later with the right words. One case runs as a real
process to show the refusal stands alone on stderr (no bar drawn before it, no carriage return).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import headprune.cli.common
import headprune.cli.core
import headprune.workspace
from headprune.cli import main


def _no_work(*args, **kwargs):
    raise AssertionError("a model was loaded or a progress bar drawn before the arguments were checked")


@pytest.fixture
def nothing_runs(monkeypatch):
    monkeypatch.setattr(headprune.workspace.Workspace, "build", _no_work)
    monkeypatch.setattr(headprune.cli.core, "load_model", _no_work)
    monkeypatch.setattr(headprune.cli.common, "tqdm", _no_work)


@pytest.fixture
def mask_json(tmp_path):
    path = tmp_path / "mask.json"
    path.write_text('{"pruned": {"0": [1]}}')
    return path


def cases(tmp: Path, mask: Path) -> dict:
    out = ["--out", tmp / "out"]
    return {
        # the four of issue 16
        "score calibration 0": (["score", "--criterion", "ae", "--calib-size", "0"],
                                r"--calib-size 0: scoring needs at least one calibration example"),
        "evaluate evaluation 0": (["evaluate", "--eval-size", "0"], r"--eval-size 0: .*Accepted: --eval-size N"),
        "trajectory tolerance 2": (["trajectory", "--criterion", "ae", "--tolerance", "2"], r"must lie in \(0, 1\]"),
        "trajectory step 0": (["trajectory", "--criterion", "ae", "--step", "0"], r"Step 0 must be a positive"),
        # found the same way
        "trajectory evaluation 0": (["trajectory", "--criterion", "ae", "--eval-size", "0"],
                                    r"--eval-size 0: a trajectory needs at least one example"),
        "trajectory calibration 0": (["trajectory", "--criterion", "random", "--calib-size", "0"],
                                     r"--calib-size 0: .*needs at least one calibration example"),
        "trajectory budget 0": (["trajectory", "--criterion", "ae", "--budget", "0"], r"not a ratio in \(0, 1\]"),
        "trajectory budget above 1": (["trajectory", "--criterion", "ae", "--budget", "1.5"], r"not a ratio"),
        "trajectory count 0": (["trajectory", "--criterion", "ae", "--count", "-2"], r"count -2 must be a positive"),
        "trajectory seeds 0": (["trajectory", "--criterion", "random", "--seeds", "0"], r"seeds 0 must be a positive"),
        "trajectory drop 1": (["trajectory", "--criterion", "ae", "--stability", "--drop", "1"], r"\[0, 1\)"),
        "trajectory metric": (["trajectory", "--criterion", "ae", "--metric", "bleu"], r"'bleu' is unknown"),
        "select-alpha calibration 0": (["select-alpha", "--calib-size", "0"], r"needs at least one calibration"),
        "select-alpha budget 2": (["select-alpha", "--budget", "2"], r"Budget 2.0 is not a ratio in \(0, 1\]"),
        "select-alpha step 0": (["select-alpha", "--step", "0"], r"Step 0 must be a positive integer"),
        "select-alpha alpha 2": (["select-alpha", "--alphas", "0,2"], r"α values must lie in \[0, 1\]; got \[2.0\]"),
        "select-alpha metric": (["select-alpha", "--metric", "bleu"], r"'bleu' is unknown"),
        "syntax calibration 0": (["syntax", "--calib-size", "0"], r"--calib-size 0: reading dependency arcs needs"),
        "score unknown criterion": (["score", "--criterion", "nope"], r"Unknown criterion 'nope'"),
        "score parameter out of range": (["score", "--criterion", "ae", "--param", "eps=0"], r"must be > 0"),
        "evaluate missing mask": (["evaluate", "--mask", tmp / "none.json"], r"Mask file .* not found"),
        "score mask not json": (["score", "--criterion", "ae", "--mask", tmp], r"is a folder"),
        "prune missing mask": (["prune", "--mask", tmp / "none.json", *out], r"Mask file .* not found"),
        "prune repeats 0": (["prune", "--mask", mask, *out, "--benchmark", "--benchmark-repeats", "0"],
                            r"--benchmark-repeats 0: repeats must be in \[1, 1000\]"),
        "prune threads -1": (["prune", "--mask", mask, *out, "--benchmark-threads", "-1"],
                             r"--benchmark-threads -1: threads must be in \[1, 1024\]"),
        # refused by the parser: the message comes first too
        "batch size 0": (["evaluate", "--batch-size", "0"], r"--batch-size: expected a positive integer"),
        "negative evaluation size": (["evaluate", "--eval-size", "-3"], r"expected a non-negative integer"),
        "max length 0": (["score", "--criterion", "ae", "--max-length", "0"], r"--max-length: expected a positive"),
        "step not a number": (["trajectory", "--criterion", "ae", "--step", "x"], r"--step: invalid int value"),
        # no abbreviations: prune has no --device, and it is not read as --device-map
        "prune device": (["prune", "--mask", mask, *out, "--device", "cuda"], r"unrecognized arguments: --device cuda"),
    }


CASE_NAMES = list(cases(Path("."), Path(".")))


@pytest.mark.parametrize("case", CASE_NAMES)
def test_refused_before_anything_loads(case, tmp_path, mask_json, nothing_runs, capsys):
    argv, expected = cases(tmp_path, mask_json)[case]
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:  # the parser's refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "", (code, out, err)
    first = err.splitlines()[0]
    assert first.startswith("error: "), err
    assert re.search(expected, first), err
    assert not (tmp_path / "out").exists()


def test_the_refusal_is_a_line_of_its_own_in_a_real_process():
    """``score --calib-size 0`` as a user runs it: stderr is the error line alone (before the fix, a bar was drawn
    and the message was glued to it after a carriage return)."""
    proc = subprocess.run([sys.executable, "-m", "headprune", "score", "--criterion", "ae", "--calib-size", "0"],
                          capture_output=True, text=True, cwd=str(Path(__file__).parents[1]), timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: --calib-size 0") and "\r" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1
