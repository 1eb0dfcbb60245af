"""A results folder is the run's own (issue 30): every command's --out refuses a user's folder or file and leaves
it byte for byte as it was, before any model loads; files of our own are replaced, --force writes into another;
a protocol run deletes only the files it names; a cancelled run says what it kept and how to resume."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import tiny_protocol

from headprune import outdir
from headprune.cli import main

ROOT = Path(__file__).resolve().parents[1]


def tree(folder: Path) -> dict:
    """Every path under ``folder`` (folders too) with the sha256 of its bytes: what "unchanged" means."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


@pytest.fixture
def user_folder(tmp_path) -> Path:
    """A user's folder: their own results table, JSON, a model-like .work folder and temp files at several depths."""
    user = tmp_path / "user"
    for name, text in {"results.csv": "mine,1\n", "a.json": '{"mine": true}', ".draft.tmp": "draft",
                       "deep/.notes.tmp": "notes", "deep/deeper/.x.tmp": "x", "cells/.y.tmp": "y",
                       "cells/keep.json": "{}", "model.run.json": '{"mine": 1}', "other.work/log.txt": "log",
                       "new.mask-0.5.json": '{"pruned": {}}', "run.json": '{"protocol": {}}'}.items():
        path = user / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return user


@pytest.fixture
def no_loading(monkeypatch):
    """Any model load fails the test: every refusal comes before the weights."""
    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded before --out was refused")

    from headprune.cli import core, recover
    from headprune.protocol import cells
    from headprune.workspace import Workspace

    for module in (core, recover):
        monkeypatch.setattr(module, "load_model", loaded)
    monkeypatch.setattr(cells, "load_model_for", loaded)
    monkeypatch.setattr(Workspace, "build", classmethod(loaded))


def protocol_file(tmp_path: Path, model: Path, csv: str, name: str = "t", repeats: int = 1) -> Path:
    return Path(tiny_protocol(tmp_path / f"{name}.toml", model, csv, name=name, repeats=repeats))


def mask_file(tmp_path: Path) -> Path:
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({"pruned": {"0": [1]}}), encoding="utf-8")
    return path


def test_every_out_refuses_a_users_folder_and_leaves_every_byte(tmp_path, user_folder, tiny_model_dir, tiny_csv,
                                                                no_loading, capsys):
    model, mask = str(tiny_model_dir), str(mask_file(tmp_path))
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"criterion": "random", "scores": [[0.1] * 4] * 3}), encoding="utf-8")
    data = ["--model", model, "--data", tiny_csv]
    user = str(user_folder)
    commands = {
        "run": ["run", str(protocol_file(tmp_path, tiny_model_dir, tiny_csv)), "--out", user],
        "run --out a file": ["run", str(protocol_file(tmp_path, tiny_model_dir, tiny_csv)), "--out", f"{user}/a.json"],
        "prune": ["prune", "--model", model, "--mask", mask, "--out", user],
        "prune into a subfolder": ["prune", "--model", model, "--mask", mask, "--out", f"{user}/deep"],
        "recover": ["recover", "--model", model, "--mask", mask, "--train-data", tiny_csv, "--out", user],
        "recover, its run file": ["recover", "--model", model, "--mask", mask, "--train-data", tiny_csv,
                                  "--out", f"{user}/model"],
        "recover, its work folder": ["recover", "--model", model, "--mask", mask, "--train-data", tiny_csv,
                                     "--out", f"{user}/other"],
        "score": ["score", *data, "--criterion", "random", "--out", f"{user}/a.json"],
        "score --out a folder": ["score", *data, "--criterion", "random", "--out", user],
        "score over a table": ["score", *data, "--criterion", "random", "--out", f"{user}/results.csv"],
        "trajectory": ["trajectory", *data, "--criterion", "random", "--out", f"{user}/a.json"],
        "trajectory --save-mask": ["trajectory", *data, "--criterion", "random", "--save-mask", "0.5",
                                   "--out", f"{user}/new.json"],
        "trajectory --prune-out": ["trajectory", *data, "--criterion", "random", "--prune-out", user],
        "select-alpha": ["select-alpha", *data, "--out", f"{user}/a.json"],
        "roles": ["roles", *data, "--no-syntax", "--out", f"{user}/a.json"],
        "syntax": ["syntax", *data, "--out", f"{user}/a.json"],
        "mask": ["mask", "--scores", str(scores), "--ratio", "0.5", "--out", f"{user}/a.json"],
        "mask over a temp file": ["mask", "--scores", str(scores), "--ratio", "0.5", "--out", f"{user}/.draft.tmp"],
    }
    before = tree(user_folder)
    assert len(before) == 15
    for what, argv in commands.items():
        capsys.readouterr()
        assert main(argv) == 2, what
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "Traceback" not in err, (what, err)
        refused = r"not (written by|create)|not empty|holds no|is a (folder|file)|another run|holds files"
        assert re.search(refused, err), (what, err)
        assert tree(user_folder) == before, what


def test_our_own_files_are_replaced_and_force_writes_over_a_users(tmp_path, user_folder, tiny_csv, tiny_model_dir,
                                                                  capsys):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"criterion": "random", "scores": [[0.4, 0.3, 0.2, 0.1]] * 3}), encoding="utf-8")
    out = tmp_path / "mask.json"
    args = ["mask", "--scores", str(scores), "--ratio", "0.5", "--out", str(out)]
    assert main(args) == 0 and outdir.is_ours(out)
    first = json.loads(out.read_text())
    assert list(first)[0] == outdir.SIGNATURE and first[outdir.SIGNATURE]["command"] == "mask"
    assert main(args[:-3] + ["0.25", "--out", str(out)]) == 0            # written by headprune: replaced
    assert json.loads(out.read_text())["pruned"] != first["pruned"]
    foreign = user_folder / "a.json"
    assert main(args[:-1] + [str(foreign)]) == 2 and foreign.read_text() == '{"mine": true}'
    assert main(args[:-1] + [str(foreign), "--force"]) == 0 and outdir.is_ours(foreign)
    # a file that only mentions our key later is not ours; nor is one we cannot read
    (tmp_path / "mention.json").write_text('{"x": 1, "headprune_output": {}}')
    assert not outdir.is_ours(tmp_path / "mention.json") and not outdir.is_ours(tmp_path / "missing.json")


def test_a_results_folder_is_the_protocols_own(tmp_path, user_folder, tiny_model_dir, tiny_csv, one_thread, capsys):
    first = protocol_file(tmp_path, tiny_model_dir, tiny_csv, "first")
    out = tmp_path / "results"
    assert main(["run", str(first), "--out", str(out), "--no-plots"]) == 0
    marker = json.loads((out / outdir.MARKER).read_text())
    assert marker["command"] == "run" and marker["name"] == "first" and len(marker["sha256"]) == 64
    capsys.readouterr()
    assert main(["run", str(first), "--out", str(out), "--no-plots"]) == 0          # the same protocol: resumed
    assert json.loads(capsys.readouterr().out)["computed"] == 0
    table = (out / "results.csv").read_bytes()
    other = protocol_file(tmp_path, tiny_model_dir, tiny_csv, "other")
    assert main(["run", str(other), "--out", str(out), "--no-plots"]) == 2           # another protocol's folder
    assert "holds the results of another run (run name first" in capsys.readouterr().err
    assert (out / "results.csv").read_bytes() == table
    for refused in (Path.home(), Path("/")):                                         # never, even with --force
        assert main(["run", str(first), "--out", str(refused), "--force", "--no-plots"]) == 2
        assert "results go in a folder of their own" in capsys.readouterr().err

    # --force into the user's folder: our files written by name, the user's left (results.csv is one of ours)
    before = tree(user_folder)
    assert main(["run", str(first), "--out", str(user_folder), "--force", "--no-plots"]) == 0
    after = tree(user_folder)
    changed = sorted(k for k in before if after.get(k) != before[k])
    assert changed == ["results.csv", "run.json"], changed                           # named by the run, replaced
    assert (user_folder / "cells" / ".y.tmp").read_text() == "y" and (user_folder / "deep/deeper/.x.tmp").exists()


def test_an_older_run_folder_without_a_marker_is_still_resumed(tmp_path, tiny_model_dir, tiny_csv, one_thread,
                                                               capsys):
    protocol = protocol_file(tmp_path, tiny_model_dir, tiny_csv, "older")
    out = tmp_path / "older"
    assert main(["run", str(protocol), "--out", str(out), "--no-plots"]) == 0
    (out / outdir.MARKER).unlink()                 # as a run before markers left it
    capsys.readouterr()
    assert main(["run", str(protocol), "--out", str(out), "--no-plots"]) == 0
    assert json.loads(capsys.readouterr().out)["computed"] == 0 and (out / outdir.MARKER).is_file()


def test_stale_temps_are_only_the_named_files_own():
    names = {"a.json"}
    assert outdir.temp_target(".a.json.k2j4.headprune.tmp") == "a.json"
    for other in (".a.json.tmp", "a.json.k2j4.headprune.tmp", ".headprune.tmp", ".x.headprune.tmp", ".a.json"):
        target = outdir.temp_target(other)
        assert target is None or target not in names, other


def _default_sigint() -> None:
    # A shell starts a background job (CI's `pytest &`, nohup) with SIGINT ignored, and a child inherits that:
    # Python then installs no KeyboardInterrupt handler and the run never hears the Ctrl-C this test sends.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _run_until_a_cell(tmp_path: Path, protocol: Path, out: Path, sig: int) -> tuple[int, str]:
    """The CLI in a real process, sent ``sig`` once its first cell file is written: (status, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "headprune", "run", str(protocol), "--out", str(out),
                             "--no-plots"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    deadline = time.monotonic() + 240
    while not list((out / "cells").glob("*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_cancelled_run_says_what_it_kept_and_how_to_resume(tmp_path, tiny_model_dir, tiny_csv, sig, status):
    # 1 + 50 x 2 cells: a run of several seconds after its first cell, whatever the load on the machine
    protocol = protocol_file(tmp_path, tiny_model_dir, tiny_csv, "cancel", repeats=50)
    out = tmp_path / "out"
    code, err = _run_until_a_cell(tmp_path, protocol, out, sig)
    assert code == status, err
    lines = err.split("\n")
    [line] = [x for x in lines if "interrupted:" in x]
    assert line.startswith("interrupted: "), err                  # on its own line, not after a progress bar
    kept = len(list((out / "cells").glob("*.json")))
    assert 1 <= kept < 101 and line.startswith(f"interrupted: {kept} of 101 cells are kept in {out}")
    command = line.split("to resume, run: ", 1)[1]
    assert shlex.split(command) == ["headprune", "run", str(protocol), "--out", str(out), "--no-plots"]
    if sig == signal.SIGINT:   # the command said resumes: the kept cells are read, not computed again
        assert main(shlex.split(command)[1:]) == 0
        assert len(list((out / "cells").glob("*.json"))) == 101


def test_a_folder_that_cannot_be_written_is_an_out_error_not_a_traceback(tmp_path, monkeypatch):
    """Issue 39: ``--out`` in a read-only folder raised PermissionError from the temporary file's creation, and a
    file standing where the folder should be raised from mkdir. (Root ignores a folder's mode, so the read-only case
    is the OS error itself.)"""
    from headprune.outdir import OutError, write_atomic

    (tmp_path / "file").write_text("mine")
    with pytest.raises(OutError, match="Could not write .*Accepted: a writable --out"):
        write_atomic(tmp_path / "file" / "plan.json", "{}")
    assert (tmp_path / "file").read_text() == "mine"

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("headprune.outdir.tempfile.mkstemp", read_only)
    with pytest.raises(OutError, match="Permission denied"):
        write_atomic(tmp_path / "plan.json", "{}")
    assert list(tmp_path.iterdir()) == [tmp_path / "file"]
