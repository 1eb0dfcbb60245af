"""Claims: which worker computes which cell of a results folder, so that two workers never compute one cell.

Layout under ``OUT``::

    claims/<key>.json    a cell being computed: {"host", "pid", "worker", "since"}; created with O_CREAT | O_EXCL
                         (atomic on a local or NFS-v3+ file system: exactly one creator wins), its modification
                         time is the holder's heartbeat (touched every ``HEARTBEAT`` seconds while it computes)
    claims/taken.log     one line per cell a claim holder computes: "<time> <key> <host> <pid> <worker>" (O_APPEND, one
                         write: who computed what, and which cells were taken over from a dead holder)
    failed/<key>.json    the last failure of a cell: holder, time, the error and the last lines of its traceback

A claim is **stale**, and may be taken over, when its holder is gone: no heartbeat for ``STALE_AFTER`` seconds
(a node that disappeared), or a holder on this host whose pid no longer runs (a worker killed with SIGKILL).
Taking over renames the stale claim to a tombstone first (``os.rename`` is atomic: of two workers trying, one
succeeds and the other sees the file gone), then creates a fresh claim as usual. A cell's result is written by the
runner (``run.write_atomic``), only whole; the claim is removed after that.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

HEARTBEAT = 10.0      # seconds between touches of a held claim
STALE_AFTER = 120.0   # a claim whose heartbeat is older than this is the claim of a dead or cut-off holder
TAIL_LINES = 12       # lines of a failure's traceback kept in failed/<key>.json


def host() -> str:
    return socket.gethostname()


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs on this host (a zombie child counts as running until reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: it exists
        return True
    return True


@dataclass(frozen=True)
class Holder:
    """A claim as read: who holds the cell, since when, and when it last showed it was alive."""

    key: str
    host: str
    pid: int
    worker: str
    since: float
    heartbeat: float

    def stale(self, now: float | None = None) -> str | None:
        """Why this claim's holder is gone (None: it is alive, as far as this host can tell)."""
        now = time.time() if now is None else now
        if self.host == host() and not pid_alive(self.pid):
            return f"pid {self.pid} on {self.host} is not running"
        if now - self.heartbeat > STALE_AFTER:
            return f"no heartbeat from {self.host} pid {self.pid} for {now - self.heartbeat:.0f} s " \
                   f"(> {STALE_AFTER:g} s)"
        return None

    def to_json(self) -> dict:
        return {"key": self.key, "host": self.host, "pid": self.pid, "worker": self.worker, "since": self.since,
                "heartbeat": self.heartbeat}


def claim_path(out: Path, key: str) -> Path:
    return out / "claims" / f"{key}.json"


def read_claim(out: Path, key: str) -> Holder | None:
    path = claim_path(out, key)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        heartbeat = path.stat().st_mtime
    except (OSError, ValueError):   # gone, or being created this instant (empty): nobody we can name
        return None
    return Holder(key, record["host"], int(record["pid"]), record.get("worker", ""), float(record["since"]),
                  heartbeat)


def _create(path: Path, worker: str) -> bool:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        handle = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(handle, "w", encoding="utf-8") as f:
        json.dump({"host": host(), "pid": os.getpid(), "worker": worker, "since": time.time()}, f)
    return True


class Claims:
    """This process's claims in ``out``: taken with :meth:`take`, kept alive by a heartbeat thread while held,
    given back with :meth:`release` (or all at once with :meth:`close`)."""

    def __init__(self, out: Path, worker: str = ""):
        self.out, self.worker = Path(out), worker or f"{host()}:{os.getpid()}"
        self.held: set[str] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.beat = threading.Thread(target=self._beat, name="headprune-claims", daemon=True)
        self.beat.start()

    def free(self, key: str) -> bool:
        """Whether ``key`` may be taken: unclaimed, or its holder gone (``Holder.stale``)."""
        holder = read_claim(self.out, key)
        return holder is None or holder.stale() is not None

    def take(self, key: str) -> bool:
        """Claim ``key``: True when this process now holds it; False when a live holder has it."""
        path = claim_path(self.out, key)
        if not _create(path, self.worker):
            holder = read_claim(self.out, key)
            if holder is None or holder.stale() is None:
                return False
            tomb = path.with_name(f".{path.name}.stale-{host()}-{os.getpid()}")
            try:
                os.rename(path, tomb)   # one taker wins; the other finds the claim gone and loses the create
            except FileNotFoundError:
                return False
            tomb.unlink(missing_ok=True)
            if not _create(path, self.worker):
                return False
        with self.lock:
            self.held.add(key)
        return True

    def started(self, key: str) -> None:
        """Log that this process computes the claimed ``key`` (``claims/taken.log``). Apart from :meth:`take`: a
        claim taken on a cell another worker has just written is given back unlogged, so the log counts the cells
        computed, which is what "never computed twice" is checked on."""
        line = f"{time.time():.3f} {key} {host()} {os.getpid()} {self.worker}\n".encode()
        handle = os.open(self.out / "claims" / "taken.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(handle, line)
        finally:
            os.close(handle)

    def release(self, key: str) -> None:
        with self.lock:
            self.held.discard(key)
        claim_path(self.out, key).unlink(missing_ok=True)

    def fail(self, key: str, exc: BaseException) -> None:
        """Record ``exc`` as ``key``'s failure (``failed/<key>.json``) and give the claim back."""
        lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
        record = {"key": key, "host": host(), "pid": os.getpid(), "worker": self.worker, "time": time.time(),
                  "error": f"{type(exc).__name__}: {exc}", "tail": lines[-TAIL_LINES:]}
        write_failure(self.out, key, record)
        self.release(key)

    def succeeded(self, key: str) -> None:
        (self.out / "failed" / f"{key}.json").unlink(missing_ok=True)
        self.release(key)

    def close(self) -> None:
        self.stop.set()
        for key in list(self.held):
            self.release(key)

    def _beat(self) -> None:
        while not self.stop.wait(HEARTBEAT):
            with self.lock:
                keys = list(self.held)
            for key in keys:
                try:
                    os.utime(claim_path(self.out, key))
                except OSError:   # released between the copy and the touch
                    pass


def write_failure(out: Path, key: str, record: dict) -> None:
    path = out / "failed" / f"{key}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(tmp, path)


def read_failure(out: Path, key: str) -> dict | None:
    try:
        return json.loads((out / "failed" / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def taken(out: Path) -> list[tuple[str, int]]:
    """(cell key, pid) of every claim taken in ``out``, in order (``claims/taken.log``)."""
    try:
        lines = (Path(out) / "claims" / "taken.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return [(parts[1], int(parts[3])) for parts in (line.split() for line in lines) if len(parts) >= 4]
