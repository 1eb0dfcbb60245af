"""A protocol's cells as shards (issue 31): units and shards partition the cells; a pool of workers and a submitit
job array give the sequential run's table exactly; claims keep two live workers off one cell; a worker killed with
SIGKILL leaves its cell to a rerun (and to no one else while it lives); ``--status`` says which cell is which; bad
flags are refused before any model loads."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import subprocess
import sys
import time
import types
from collections import Counter
from pathlib import Path

import pytest
from conftest import tiny_protocol

from headprune.cli import main
from headprune.protocol import Protocol, expand
from headprune.protocol import cells as adapter
from headprune.protocol.claims import Claims, claim_path, taken
from headprune.protocol.executors import log_tail, run_pool, submit
from headprune.protocol.run import merge, run_protocol
from headprune.protocol.schedule import MAX_UNIT, deal, own_folder, run_shard, status, units

ROOT = Path(__file__).resolve().parent.parent

def tiny(tmp_path, model_dir, csv, sparsities="[0.25, 0.5]", name="tiny.toml") -> Protocol:
    return Protocol.read(tiny_protocol(tmp_path / name, model_dir, csv, name="tiny", sparsities=sparsities,
                                       repeats=2, criteria=("ae", "random"), batch_size=8))


# -- units and shards: pure functions of the protocol ----------------------------------------------------------

@pytest.mark.parametrize("sparsities", ["[0.25, 0.5]", str([round(0.05 * i, 2) for i in range(1, 12)])])
def test_units_and_shards_partition_the_cells_and_keep_a_criterion_together(tmp_path, sparsities):
    protocol = tiny(tmp_path, "m", "d.csv", sparsities)
    cells = expand(protocol)
    all_units = units(protocol)
    assert sorted(c.key for u in all_units for c in u.cells) == sorted(c.key for c in cells)   # each cell once
    for u in all_units:
        assert {c.model for c in u.cells} == {u.model} and {c.repeat for c in u.cells} == {u.repeat}
        assert len(u.cells) <= MAX_UNIT or len({c.criterion for c in u.cells}) == 1
    # a criterion's cells of one repeat are in one unit (its scores are shared by its sparsities)
    where = {}
    for i, u in enumerate(all_units):
        for c in u.cells:
            assert where.setdefault((c.criterion, c.repeat), i) == i
    large = len(cells) > 2 * MAX_UNIT
    assert (len(all_units) > 2) == large   # 2 repeats: split only when a repeat holds more than MAX_UNIT cells
    criteria = len({(c.criterion, c.repeat) for c in cells if c.kind != "dense"})
    for n in (1, 2, 3, 7, 40):
        shards = deal(protocol, n)
        dealt = [c.key for s in shards for u in s for c in u.cells]
        assert len(shards) == n and sorted(dealt) == sorted(c.key for c in cells)   # each cell in one shard
        assert deal(Protocol.parse(protocol.text, "elsewhere.toml"), n) == shards   # the text decides, not the path
        # more shards than model x repeat groups: units halved by criterion, so min(n, criterion groups) work
        assert sum(1 for s in shards if s) == min(n, criteria)
        owner = {}
        for j, s in enumerate(shards):   # a criterion's cells of a repeat still share one shard (one scoring)
            for u in s:
                for c in u.cells:
                    if c.kind != "dense":
                        assert owner.setdefault((c.criterion, c.repeat), j) == j
        loads = [sum(len(u.cells) for u in s) for s in shards]
        assert max(loads) - min(loads) <= max(len(u.cells) for u in all_units)


# -- same numbers --------------------------------------------------------------------------------------------

def test_pool_and_a_submitit_array_give_the_sequential_table(tmp_path, tiny_model_dir, tiny_csv, one_thread,
                                                              monkeypatch):
    submitit = pytest.importorskip("submitit")
    protocol = tiny(tmp_path, tiny_model_dir, tiny_csv)
    keys = [c.key for c in expand(protocol)]
    run_protocol(protocol, tmp_path / "seq", plots=False)
    expected = (tmp_path / "seq" / "results.csv").read_text()

    # the caller's __main__ is a script that must not run again in a worker (CI: an AppTest had left the dashboard's
    # app.py as __main__, and multiprocessing's spawn re-ran it in both workers, which died before any cell)
    script = tmp_path / "callers_main.py"
    script.write_text("raise SystemExit('the caller\'s __main__ ran in a worker')\n")
    caller = types.ModuleType("__main__")
    caller.__file__ = str(script)
    monkeypatch.setitem(sys.modules, "__main__", caller)
    pool = tmp_path / "pool"
    own_folder(pool, protocol)
    summary = run_pool(protocol, pool, 2, threads=1, plots=False)   # a RunError names failed workers and cells
    assert summary["workers"] == [0, 0], [log_tail(p) for p in sorted((pool / "jobs" / "pool").glob("*.log"))]
    assert (pool / "results.csv").read_text() == expected
    assert sorted(k for k, _ in taken(pool)) == sorted(keys)   # every cell claimed (and computed) exactly once
    # both workers ran to the end (exit 0 above, a log each); which of them computes which cell is timing: a worker
    # whose imports finish first takes the other shard's cells once its own are done
    logs = pool / "jobs" / "pool"
    assert not list((pool / "claims").glob("*.json")) and (logs / "worker-0.log").is_file() and \
        (logs / "worker-1.log").is_file()

    array = tmp_path / "array"
    executor = submitit.LocalExecutor(folder=array / "jobs" / "%j")
    executor.update_parameters(timeout_min=10)
    result = submit(protocol, array, executor, 2, wait=True, plots=False, threads=1)
    assert result["merged"] and not result["failed"] and len(result["jobs"]) == 2
    assert (array / "results.csv").read_text() == expected
    assert sorted(k for k, _ in taken(array)) == sorted(keys)
    for job in result["jobs"]:   # submitit's own job folders: the pickled call, its logs and its result
        folder = array / "jobs" / job
        assert list(folder.glob("*_submitted.pkl")) and list(folder.glob("*_result.pkl"))
        assert "cells computed" in next(folder.glob("*.out")).read_text()


# -- faults ----------------------------------------------------------------------------------------------------

SLOW_WORKER = """
import sys, time
from headprune.protocol import cells
from headprune.protocol.executors import shard_job
original = cells.evaluate
def slow(*args, **kwargs):   # a cell long enough to be killed in the middle of
    time.sleep(float(sys.argv[4]))
    return original(*args, **kwargs)
cells.evaluate = slow
text = open(sys.argv[1], encoding="utf-8").read()
shard_job(text, sys.argv[1], sys.argv[2], tuple(int(x) for x in sys.argv[3].split("/")), steal=True, threads=1)
"""


def start_worker(protocol: Protocol, out: Path, shard: str, delay: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", SLOW_WORKER, protocol.source, str(out), shard, str(delay)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_for(predicate, timeout: float = 120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out")


def test_a_worker_killed_mid_cell_leaves_only_that_cell_and_no_cell_is_computed_twice(
        tmp_path, tiny_model_dir, tiny_csv, monkeypatch, one_thread):
    """Two workers: a subprocess (a) and this process (b, in a thread: one import of torch fewer on a busy CI box),
    both slowed to 0.3 s an evaluation; a is killed in the middle of a cell."""
    protocol = tiny(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    own_folder(out, protocol)
    keys = [c.key for c in expand(protocol)]
    original = adapter.evaluate
    monkeypatch.setattr(adapter, "evaluate", lambda *a, **k: time.sleep(0.3) or original(*a, **k))
    a = start_worker(protocol, out, "0/2", 0.3)
    # b starts once a holds a claim (a's import of torch is slow under load): both live from then on
    wait_for(lambda: taken(out))
    b = concurrent.futures.ThreadPoolExecutor(1).submit(run_shard, protocol, out, (1, 2), steal=True, worker="b")
    # once a has finished a cell and claimed the next, kill it in the middle of that cell
    victim = wait_for(lambda: [k for k, pid in taken(out) if pid == a.pid and (out / "cells" / f"{k}.json").exists()]
                      and [k for k, pid in taken(out) if pid == a.pid and not (out / "cells" / f"{k}.json").exists()
                           and claim_path(out, k).exists()])[-1]
    a.send_signal(signal.SIGKILL)
    a.wait()
    assert a.returncode == -signal.SIGKILL
    result = b.result(timeout=600)
    assert not result["failed"]
    log = taken(out)
    counts = Counter(k for k, _ in log)
    # b went on through a's shard: every cell done; only the killed cell was claimed twice, by a and then by b
    assert sorted(counts) == sorted(keys) and {k for k, n in counts.items() if n > 1} == {victim}
    assert [pid for k, pid in log if k == victim] == [a.pid, os.getpid()]
    assert sorted(result["computed"]) == sorted(k for k, pid in log if pid == os.getpid())
    assert not (out / "failed").exists() or not list((out / "failed").iterdir())
    monkeypatch.setattr(adapter, "evaluate", original)
    seq = tmp_path / "seq"
    run_protocol(protocol, seq, plots=False)
    assert merge(protocol, out, plots=False)["cells"] == len(keys)
    assert (out / "results.csv").read_text() == (seq / "results.csv").read_text()


def test_a_killed_shard_is_failed_in_status_and_a_rerun_computes_only_the_missing_cells(
        tmp_path, tiny_model_dir, tiny_csv, monkeypatch, capsys, one_thread):
    protocol = tiny(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    own_folder(out, protocol)
    keys = [c.key for c in expand(protocol)]
    lone = start_worker(protocol, out, "0/1", 0.3)
    wait_for(lambda: len(list((out / "cells").glob("*.json"))) >= 3 and
             [k for k, _ in taken(out) if not (out / "cells" / f"{k}.json").exists() and claim_path(out, k).exists()])
    lone.send_signal(signal.SIGKILL)
    lone.wait()
    done = sorted(p.stem for p in (out / "cells").glob("*.json"))
    killed = [k for k, _ in taken(out) if k not in done]
    assert len(killed) == 1   # the cell it was in
    pending = [k for k in keys if k not in done and k not in killed]
    # a live claim of another worker (this process) and a recorded failure
    running, raised = pending[0], pending[1]
    mine = Claims(out, "test worker")
    assert mine.take(running) and not mine.free(running)
    mine.fail(raised, ValueError("a shard that raises"))

    assert main(["run", "--status", str(out)]) == 0
    text = capsys.readouterr().err
    assert f"{len(done)} done, 1 running, 2 failed, {len(keys) - len(done) - 3} pending" in text
    assert f"running  {running}: test worker (pid {os.getpid()}" in text
    assert f"failed   {killed[0]}: its worker is gone: pid {lone.pid}" in text
    assert f"failed   {raised}: ValueError: a shard that raises" in text and "| ValueError: a shard" in text
    report = status(protocol, out)
    assert report["seconds_left"] is None or report["seconds_left"] > 0
    assert {s.key for s in report["states"] if s.state == "pending"} == set(pending[2:])

    # the rerun skips the cell another worker holds, takes the dead one's over and computes the rest
    calls = []
    original = adapter.evaluate
    monkeypatch.setattr(adapter, "evaluate", lambda *a, **k: calls.append(1) or original(*a, **k))
    result = run_shard(protocol, out, (0, 1))
    assert sorted(result["computed"]) == sorted(k for k in keys if k not in done and k != running)
    assert len(calls) == len(result["computed"])
    assert not (out / "failed" / f"{raised}.json").exists()   # its failure is cleared by its success
    mine.release(running)
    mine.close()
    assert run_shard(protocol, out, (0, 1))["computed"] == [running]


# -- bad input, before any model loads -------------------------------------------------------------------------

@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(adapter, "load_model", refuse)


@pytest.mark.parametrize("flags, needle", [
    (["--shard", "3/2"], "--shard 3/2: shard 3 of 2 does not exist"),
    (["--shard", "1"], "is not I/N"),
    (["--executor", "pool", "--workers", "0"], "--workers 0 must be an integer in [1, 4096]"),
    (["--workers", "2"], "--workers goes with --executor pool"),
    (["--executor", "pool", "--shard", "0/2"], "does not go with --executor pool"),
    (["--mem", "4G"], "--mem goes with --executor slurm"),
    (["--executor", "slurm", "--time", "60", "--slurm-arg", "account"], "is not KEY=VALUE"),
    (["--executor", "slurm", "--mem", "8G"], "--executor slurm needs --time MINUTES"),   # not submitit's 5 minutes
])
def test_bad_flags_are_refused_before_any_model_loads(tmp_path, capsys, no_model, flags, needle, monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)   # an sbatch to get past that check
    protocol = tiny(tmp_path, "m", "d.csv")
    assert main(["run", protocol.source, "--out", str(tmp_path / "out"), *flags]) == 2
    err = capsys.readouterr().err
    assert "error: " in err and needle in err, err


def test_slurm_without_submitit_or_sbatch_says_what_to_use_instead(tmp_path, capsys, no_model, monkeypatch):
    protocol = tiny(tmp_path, "m", "d.csv")
    argv = ["run", protocol.source, "--out", str(tmp_path / "out"), "--executor", "slurm", "--time", "60"]
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "sbatch" in err and "--executor pool --workers N" in err and "--shard I/N" in err
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "submitit" else real(name, *a))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs submitit" in err and "headprune[cluster]" in err and "--executor pool" in err
    assert not (tmp_path / "out").exists()


def test_a_folder_of_another_protocol_is_refused(tmp_path, capsys, no_model):
    protocol = tiny(tmp_path, "m", "d.csv")
    out = tmp_path / "out"
    own_folder(out, protocol)
    (tmp_path / "other.toml").write_text(protocol.text.replace('name = "tiny"', 'name = "other"'), encoding="utf-8")
    other = Protocol.read(tmp_path / "other.toml")
    before = sorted(p.name for p in out.iterdir())
    for flags in ([], ["--executor", "pool", "--workers", "2"], ["--shard", "0/2"]):
        assert main(["run", other.source, "--out", str(out), *flags]) == 2
        err = capsys.readouterr().err
        assert "holds the results of another run" in err and "tiny.toml" in err and "other" in err, err
    assert sorted(p.name for p in out.iterdir()) == before
    assert json.loads((out / ".headprune-run.json").read_text())["sha256"] == protocol.hash
    # --status and --merge read the protocol from the marker, or take the file given when it is the folder's
    assert main(["run", "--status", str(out)]) == 0 and "0 done" in capsys.readouterr().err
    assert main(["run", other.source, "--status", str(out)]) == 2
    assert "holds the results of" in capsys.readouterr().err
    assert main(["run", "--merge", str(out)]) == 2 and "lacks 9 of the protocol's 9 cells" in capsys.readouterr().err


def test_slurm_flags_reach_the_sbatch_parameters(tmp_path, monkeypatch):
    pytest.importorskip("submitit")
    from headprune.protocol.executors import slurm_executor

    monkeypatch.setattr("shutil.which", lambda name: "/usr/bin/" + name)   # submitit looks for srun

    executor = slurm_executor(tmp_path, partition="gpu", gpus_per_task=1, cpus_per_task=8, mem="32G", minutes=90,
                              array_parallelism=4, extra={"account": "abc"})
    params = executor.parameters
    assert (params["partition"], params["gpus_per_task"], params["cpus_per_task"], params["mem"], params["time"],
            params["array_parallelism"]) == ("gpu", 1, 8, "32G", 90, 4)
    assert params["additional_parameters"] == {"account": "abc"}
    assert str(executor.folder).startswith(str(tmp_path / "jobs"))


def test_a_unit_that_raises_is_recorded_on_its_cells_and_the_other_units_go_on(tmp_path, tiny_model_dir, tiny_csv,
                                                                               monkeypatch, one_thread):
    protocol = tiny(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    keys = [c.key for c in expand(protocol)]
    original = adapter.load_model_for
    repeat_1 = {c.key for c in expand(protocol) if c.repeat == 1}

    calls = []

    def broken_on_repeat_1(entry, protocol):   # the second unit (repeat 1) cannot load its model
        calls.append(1)
        if len(calls) == 2:
            raise OSError("the node's disk went away")
        return original(entry, protocol)

    monkeypatch.setattr(adapter, "load_model_for", broken_on_repeat_1)
    result = run_shard(protocol, out, (0, 1))
    assert sorted(result["computed"]) == sorted(k for k in keys if k not in repeat_1)
    assert list(result["failed"].values()) == ["OSError: the node's disk went away"]
    report = status(protocol, out)
    failed = {s.key: s.detail for s in report["states"] if s.state == "failed"}
    assert set(failed) == repeat_1 and all("the node's disk went away" in d for d in failed.values())
    monkeypatch.setattr(adapter, "load_model_for", original)
    assert sorted(run_shard(protocol, out, (0, 1))["computed"]) == sorted(repeat_1)   # the rerun: only those
    assert status(protocol, out)["counts"] == {"done": len(keys), "running": 0, "failed": 0, "pending": 0}


def stand_in_sbatch(tmp_path, monkeypatch, *, refuse: str | None = None) -> Path:
    """An ``sbatch`` (and ``srun``) on PATH: records its arguments and prints a job id, or prints ``refuse`` on
    stderr and exits 1 as a real sbatch refusing a partition or a --mem does. Returns the arguments' file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-args.txt"
    answer = f'echo "{refuse}" >&2\nexit 1' if refuse else 'echo "Submitted batch job 123"'
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\necho "$@" >> "{calls}"\n{answer}\n', encoding="utf-8")
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n", encoding="utf-8")
    for tool in ("sbatch", "srun"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return calls


def test_a_one_unit_protocol_is_submitted_as_a_job_array_of_one_task(tmp_path, capsys, no_model, monkeypatch):
    pytest.importorskip("submitit")
    calls = stand_in_sbatch(tmp_path, monkeypatch)
    protocol = Protocol.read(tiny_protocol(tmp_path / "one.toml", "m", "d.csv", name="one", sparsities="[0.5]"))
    assert len(units(protocol)) == 1
    out = tmp_path / "out"
    assert main(["run", protocol.source, "--out", str(out), "--executor", "slurm", "--mem", "8G", "--time", "90"]) == 0
    assert "submitted 1 shard(s): 123_0" in capsys.readouterr().err
    script = Path(calls.read_text(encoding="utf-8").split()[0])   # the one sbatch call: the script submitit wrote
    assert calls.read_text(encoding="utf-8").count("\n") == 1
    lines = script.read_text(encoding="utf-8").splitlines()
    assert "#SBATCH --array=0-0%1" in lines and "#SBATCH --mem=8G" in lines and "#SBATCH --time=90" in lines
    assert (out / "jobs" / "123_0" / "123_0_submitted.pkl").is_file()   # the pickled call, where task 0 reads it
    assert (out / "jobs" / "123" / "123_submission.sh").is_file()


@pytest.mark.parametrize("refusal", ["sbatch: error: invalid partition specified: x",
                                     "sbatch: error: Memory specification can not be satisfied"])
def test_sbatch_refusing_the_array_is_one_error_line(tmp_path, capsys, no_model, monkeypatch, refusal):
    pytest.importorskip("submitit")
    calls = stand_in_sbatch(tmp_path, monkeypatch, refuse=refusal)
    protocol = tiny(tmp_path, "m", "d.csv")
    out = tmp_path / "out"
    assert main(["run", protocol.source, "--out", str(out), "--executor", "slurm", "--slurm-partition", "x",
                 "--mem", "10T", "--time", "60"]) == 2
    err = capsys.readouterr().err
    assert calls.is_file()   # sbatch was asked
    said = [line for line in err.splitlines() if line.strip()]
    assert said == [f"error: the job array was not submitted: {refusal}. Check --slurm-partition, --mem, --time and "
                    "--slurm-arg against the cluster (sinfo lists its partitions)."], err
    assert "Traceback" not in err and not (out / "jobs").exists()   # no pickles or script left from the refused call
