"""Executors: who runs a protocol's shards. Each hands a shard id to one function, :func:`shard_job`.

    local   today's run: one process, every cell in order (``run_protocol``), the table at the end
    pool    N worker processes on this machine: one per visible GPU, each with ``CUDA_VISIBLE_DEVICES`` set
            to its own, or on CPU with the cores split between them (``torch.set_num_threads``). Each is a fresh
            ``python -m headprune.protocol.executors OUT/jobs/pool/worker-<i>.json`` (the job file: the
            protocol's text and the call's arguments, as submitit pickles a call) -- not a multiprocessing
            spawn, which re-runs the parent's ``__main__`` file (a Streamlit script, a test runner's)
            in every worker, and not a fork (torch and CUDA are not fork-safe). Worker i runs shard i/N and
            then takes over the cells no live worker holds (``run_shard(steal=True)``), so a slow or killed
            worker's cells are still done. Logs in ``OUT/jobs/pool/worker-<i>.log``; a Ctrl-C stops the
            workers (SIGTERM: each gives its claims back; a cell file is only ever written whole), keeps what
            finished and is raised again to the caller.
    slurm   a submitit job array, one task per shard, submitit's folders (pickled call, logs, result) under
            ``OUT/jobs/<job id>_<task>/``; returns the job ids, or waits for them and merges the table.
            ``submit`` takes any submitit executor: CI runs the same array through ``submitit.LocalExecutor``
            (real subprocesses, real job folders).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import torch

from ..userinput import read_user_bytes, read_user_json
from .compute import write_atomic
from .run import RunError, merge
from .schedule import run_shard, units, worker_name
from .spec import Protocol

Say = Callable[[str], None]
EXECUTORS = ("local", "pool", "slurm")
STOP_GRACE = 30.0   # seconds a worker has to give its claims back after SIGTERM before it is killed
LOG_TAIL_BYTES = 64 * 1024   # the end of a worker's log read to show its last lines


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def shard_job(text: str, source: str, out: str, shard: tuple[int, int], *, steal: bool = False,
              threads: int | None = None, memory_budget=None) -> dict:
    """One shard in this process: the function every executor calls (pickled by submitit, run by a pool's worker).

    ``text``/``source``: the protocol file as written (parsed here again: a job carries text, not objects);
    ``threads``: torch's CPU threads."""
    if threads is not None:
        torch.set_num_threads(threads)
    protocol = Protocol.parse(text, source, default_name=Path(source).stem)
    result = run_shard(protocol, out, shard, steal=steal, memory_budget=memory_budget, worker=worker_name(shard),
                       say=lambda line: print(line, flush=True))
    print(f"shard {shard[0]}/{shard[1]}: {len(result['computed'])} cells computed, {len(result['failed'])} units "
          "failed", flush=True)
    return result


def pool_worker(call: str) -> int:
    """A pool's worker process (``python -m headprune.protocol.executors JOB.json``): its shard, then any cell
    left. The pool's stop (SIGTERM) is a KeyboardInterrupt here, so ``run_shard``'s finally gives the claims back
    (submitit keeps its own SIGTERM handling: requeue)."""
    # the pool wrote it a moment ago, in a folder others may write to: read as any user's file
    job = read_user_json(call, "Worker job file", "the JSON file a pool writes for its worker", error=RunError)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    shard_job(job["text"], job["source"], job["out"], tuple(job["shard"]), steal=True, threads=job["threads"],
              memory_budget=job["memory_budget"])
    return 0


# -- pool ------------------------------------------------------------------------------------------------------

def visible_gpus() -> list[str]:
    """The GPU ids a pool spreads its workers over: ``CUDA_VISIBLE_DEVICES`` when set, else every CUDA device."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def pool_plan(workers: int | None, gpus: list[str], cores: int) -> list[dict]:
    """Each worker's environment and threads: worker i on GPU ``gpus[i % len(gpus)]``, else the ``cores`` split
    (at least one thread each). ``workers`` None: one per GPU, else one per core."""
    n = workers if workers is not None else (len(gpus) or cores)
    if gpus:
        return [{"env": {"CUDA_VISIBLE_DEVICES": gpus[i % len(gpus)]}, "threads": max(1, cores // n)}
                for i in range(n)]
    return [{"env": {"CUDA_VISIBLE_DEVICES": ""}, "threads": max(1, cores // n)} for _ in range(n)]


def run_pool(protocol: Protocol, out: str | Path, workers: int | None = None, *, threads: int | None = None,
             memory_budget=None, say: Say | None = None, plots: bool = True) -> dict:
    """The protocol by a pool of worker processes (module doc), then the table (``merge``).

    Returns the merge summary plus "workers": each worker's exit code (0: finished; -9: killed by SIGKILL)."""
    say = say or (lambda text: None)
    out = Path(out)
    plan = pool_plan(workers, visible_gpus(), os.cpu_count() or 1)
    n = len(plan)
    procs = []
    folder = out / "jobs" / "pool"
    folder.mkdir(parents=True, exist_ok=True)
    logs = [folder / f"worker-{i}.log" for i in range(n)]
    for i, (job, log) in enumerate(zip(plan, logs)):
        call, cores = folder / f"worker-{i}.json", threads or job["threads"]
        write_atomic(call, json.dumps({"text": protocol.text, "source": protocol.source, "out": str(out),
                                       "shard": [i, n], "threads": cores, "memory_budget": memory_budget}, indent=1))
        with open(log, "ab") as sink:   # the child holds its own copy of the descriptor
            proc = subprocess.Popen([sys.executable, "-m", __name__, str(call)], env={**os.environ, **job["env"]},
                                    stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        procs.append(proc)
        where = f"GPU {job['env']['CUDA_VISIBLE_DEVICES']}" if job["env"]["CUDA_VISIBLE_DEVICES"] else \
            f"CPU, {cores} thread(s)"
        say(f"worker {i}: pid {proc.pid}, {where}, shard {i}/{n} then any cell left; log {log}")
    try:
        for proc in procs:
            proc.wait()
    except KeyboardInterrupt:   # Ctrl-C (or SIGTERM): the workers stop too, the caller says what was kept
        stop(procs)
        raise
    codes = [proc.returncode for proc in procs]
    ended = []   # each worker that did not finish, with the end of its log: what a user (or CI) reads first
    for i, (code, log) in enumerate(zip(codes, logs)):
        if code:
            say(f"worker {i} exited with code {code} (see {log}); its cells are left to a rerun")
            ended.append(f"worker {i} exited with code {code}; the end of {log}:\n{log_tail(log)}")
    try:
        summary = merge(protocol, out, memory_budget=memory_budget, plots=plots)
    except RunError as exc:
        raise RunError("\n".join([str(exc), *ended])) from None
    return {**summary, "workers": codes}


def log_tail(path: Path, lines: int = 8) -> str:
    """The last ``lines`` lines of a worker's log (progress bars' carriage returns split too), indented."""
    try:   # its end only: a worker's log of progress bars grows without a bound
        text = read_user_bytes(path, "Worker log", "a worker's log", max_bytes=LOG_TAIL_BYTES, tail=True,
                               error=RunError).decode("utf-8", errors="replace")
    except RunError as exc:
        return f"    (unreadable: {exc})"
    tail = [line for line in text.replace("\r", "\n").splitlines() if line.strip()][-lines:]
    return "\n".join(f"    {line}" for line in tail) or "    (empty)"


def stop(procs) -> None:
    """SIGTERM to every live worker (each gives its claims back), SIGKILL to those still alive after the grace."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- slurm (submitit) ------------------------------------------------------------------------------------------

SUBMITIT_MISSING = "--executor slurm needs submitit (pip install 'headprune[cluster]')"
NO_SBATCH = "--executor slurm needs SLURM's sbatch and srun on PATH, and {} is not found on this machine"
INSTEAD = ("Instead: `--executor pool --workers N` runs the shards on this machine's GPUs or cores, or run "
           "`headprune run P.toml --out D --shard I/N` for I = 0..N-1 on each machine (then `headprune run --merge "
           "D`).")


def check_slurm() -> None:
    """submitit installed and ``sbatch`` on PATH, before any model loads (a RunError saying what to use instead)."""
    if importlib.util.find_spec("submitit") is None:
        raise RunError(f"{SUBMITIT_MISSING}. {INSTEAD}")
    for tool in ("sbatch", "srun"):   # submit, and run the array's tasks (submitit's SlurmExecutor needs both)
        if shutil.which(tool) is None:
            raise RunError(f"{NO_SBATCH.format(tool)}. {INSTEAD}")


def slurm_executor(out: Path, *, partition: str | None = None, gpus_per_task: int | None = None,
                   cpus_per_task: int | None = None, mem: str | None = None, minutes: int | None = None,
                   array_parallelism: int | None = None, extra: dict | None = None):
    """A submitit SLURM executor writing its job folders under ``out/jobs``, with the given sbatch options
    (``extra``: any other ``#SBATCH --KEY=VALUE``); a ``map_array`` of one call is still a job array (see
    :func:`array_executor_class`)."""
    # %j: an array task's id is "<job>_<task>", so each task gets out/jobs/<job>_<task>/. Not "%A_%a": submitit
    # formats the folder with the bare job id while it files the sbatch script, which has no "_<task>" to fill %a
    executor = array_executor_class()(folder=out / "jobs" / "%j")
    given = {"partition": partition, "gpus_per_task": gpus_per_task, "cpus_per_task": cpus_per_task, "mem": mem,
             "time": minutes, "array_parallelism": array_parallelism}
    executor.update_parameters(job_name="headprune", additional_parameters=dict(extra or {}),
                               **{k: v for k, v in given.items() if v is not None})
    return executor


def array_executor_class():
    """``submitit.SlurmExecutor`` whose ``map_array`` of ONE call is a job array of one task (``--array=0-0``).

    submitit submits a lone call as a plain job (no ``--array``, an id without ``_<task>``); a protocol of one unit
    would then be the only run whose task is not ``<job>_0``. Same steps as submitit's own array branch (1.5):
    the pickled call, one sbatch with ``map_count``, the pickle filed under the task's id."""
    import submitit  # the cluster extra: optional (check_slurm said so before any model loads)
    from submitit.core.utils import JobPaths  # the cluster extra, as above
    from submitit.slurm.slurm import SlurmJob  # the cluster extra, as above

    class ArrayExecutor(submitit.SlurmExecutor):
        def _internal_process_submissions(self, delayed_submissions):
            if len(delayed_submissions) != 1:
                return super()._internal_process_submissions(delayed_submissions)
            folder = JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            pickle_path = folder / f"{uuid.uuid4().hex}.pkl"
            delayed_submissions[0].set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
            delayed_submissions[0].dump(pickle_path)
            array = submitit.SlurmExecutor(self.folder, self.max_num_timeout, python=self.python)
            array.update_parameters(**self.parameters)
            array.parameters["map_count"] = 1
            first = array._submit_command(self._submitit_command_str)
            job = SlurmJob(folder=self.folder, job_id=f"{first.job_id}_0", tasks=list(range(first.num_tasks)))
            job.paths.move_temporary_file(pickle_path, "submitted_pickle")
            return [job]

    return ArrayExecutor


def submit(protocol: Protocol, out: str | Path, executor, shards: int, *, wait: bool = False, memory_budget=None,
           say: Say | None = None, plots: bool = True, threads: int | None = None) -> dict:
    """One array job of ``shards`` tasks through a submitit ``executor``: task I runs shard I/N (:func:`shard_job`).

    Returns {"jobs": job ids}; with ``wait``, each task's end too ("failed": tasks that raised or died, their
    cells left to a rerun) and, when every cell is done, the merged table."""
    say = say or (lambda text: None)
    out = Path(out)
    n = shards
    jobs = submit_array(executor, out, [protocol.text] * n, [protocol.source] * n, [str(out)] * n,
                        [(i, n) for i in range(n)], [memory_budget] * n, [threads] * n)
    ids = [job.job_id for job in jobs]
    say(f"submitted {n} shard(s): {', '.join(ids)}; logs under {out}/jobs; `headprune run --status {out}` follows "
        "them")
    if not wait:
        return {"jobs": ids}
    failed = {}
    for job in jobs:
        try:
            job.result()
        except Exception as exc:   # submitit's FailedJobState / UncompletedJobError: a task that raised or died
            failed[job.job_id] = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
            say(f"task {job.job_id} failed: {failed[job.job_id]}")
    try:
        summary = merge(protocol, out, memory_budget=memory_budget, plots=plots)
    except RunError as exc:
        return {"jobs": ids, "failed": failed, "merged": False, "note": str(exc)}
    return {**summary, "jobs": ids, "failed": failed, "merged": True}


def submit_array(executor, out: Path, *columns: list) -> list:
    """``executor.map_array`` of :func:`_array_task`; a submission the scheduler refuses (``sbatch`` exits non-zero:
    a partition, a ``--mem``, an account it does not know) is a RunError carrying sbatch's own words, and the
    call's pickles and sbatch script submitit left in ``out/jobs`` are removed (nothing was submitted)."""
    from submitit.core.utils import FailedJobError, FailedSubmissionError  # submit's executors are submitit's

    jobs_dir = out / "jobs"
    existed = jobs_dir.is_dir()
    before = set(jobs_dir.rglob("*")) if existed else set()
    try:
        with contextlib.redirect_stderr(io.StringIO()):   # submitit prints sbatch's stderr too: said once, below
            return executor.map_array(_array_task, *columns)
    except (FailedJobError, FailedSubmissionError, OSError) as exc:   # sbatch exited non-zero / said no job id
        for path in sorted(set(jobs_dir.rglob("*")) - before, key=lambda p: len(p.parts), reverse=True):
            if path.is_symlink() or path.is_file():
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if not existed and jobs_dir.is_dir() and not any(jobs_dir.iterdir()):
            jobs_dir.rmdir()
        said = " ".join(str(exc).split()) or type(exc).__name__
        raise RunError(f"the job array was not submitted: {said}. Check --slurm-partition, --mem, --time and "
                       "--slurm-arg against the cluster (sinfo lists its partitions).") from None


def _array_task(text: str, source: str, out: str, shard: tuple[int, int], memory_budget, threads) -> dict:
    """An array task's call (positional arguments: ``map_array`` zips its lists)."""
    return shard_job(text, source, out, shard, memory_budget=memory_budget, threads=threads)


def shard_count(protocol: Protocol) -> int:
    """How many shards an array gets by default: one per unit (one model load each)."""
    return len(units(protocol))


if __name__ == "__main__":   # a pool's worker (run_pool starts it with -m)
    sys.exit(pool_worker(sys.argv[1]))
