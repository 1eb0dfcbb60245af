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

Every file of a results folder is read as untrusted input (a folder may be copied, hand-edited or another tool's):
``read_folder_json`` is the one reader. A file that is missing or not JSON (a claim being created this instant is
empty) reads as absent; a JSON file without the fields headprune writes, or with values of the wrong kind, is a
``FolderError`` naming the file, the field and what is accepted, never a traceback from deep in the run.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import HeadpruneError
from ..userinput import MAX_JSON_DEPTH, json_depth, kind_of, read_user_text

HEARTBEAT = 10.0      # seconds between touches of a held claim
STALE_AFTER = 120.0   # a claim whose heartbeat is older than this is the claim of a dead or cut-off holder
TAIL_LINES = 12       # lines of a failure's traceback kept in failed/<key>.json


MAX_PID = 2 ** 31 - 1    # what os.kill takes (a C int); Linux's pids stay far below it
LATEST_TIME = 1e11       # seconds since 1970 (year 5138): a later "since" is no clock's, and time.localtime overflows

Check = tuple[Callable[[object], bool], str]   # (is the value acceptable, what is accepted: said in the error)


class FolderError(HeadpruneError):
    """A results folder's file that is not what headprune writes there."""


def number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def text(value) -> bool:
    return isinstance(value, str)


def texts(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def read_folder_json(path: Path, what: str, fields: dict[str, Check], optional: dict[str, Check] | None = None
                     ) -> dict | None:
    """The JSON object at ``path`` (a ``what`` of a results folder), checked field by field: ``fields`` must be
    present and pass their check, ``optional`` pass theirs where present. None when the file is missing or not JSON
    (module doc); a FolderError when it is JSON but not such an object."""
    record = read_folder_value(path, what)
    return None if record is None else check_record(record, path, what, fields, optional)


def read_folder_value(path: Path, what: str):
    """The JSON value of a results folder's file ``path`` (a ``what``) through the one safe reader
    (``userinput.read_user_bytes``): None when it is missing or not JSON (gone, or being written this instant:
    nobody we can name); a FolderError naming it when it is no regular file (a FIFO would hang the reader, a device
    such as /dev/zero never ends), is over ``MAX_FILE_BYTES`` or nests deeper than any file headprune writes."""
    if kind_of(path) == "missing":
        return None
    accepted = f"the {what} as `headprune run` wrote it"
    try:
        text = read_user_text(path, f"The {what}", accepted, error=FolderError)
    except FolderError as exc:
        if kind_of(path) == "missing":   # removed between the two looks (a claim released this instant)
            return None
        raise FolderError(f"{exc} Move it out of the folder (its cell then counts as not computed).") from None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise not_written(path, f"it nests arrays or objects {json_depth(text)} deep (at most {MAX_JSON_DEPTH})",
                          what)
    try:
        return json.loads(text)
    except ValueError:
        return None


def check_record(record, path: Path, what: str, fields: dict[str, Check], optional: dict[str, Check] | None = None
                 ) -> dict:
    """``record`` (read from ``path``) checked as ``read_folder_json`` checks it; returned as it is."""
    if not isinstance(record, dict):
        problem = f"holds {_kind(record)}, not a JSON object"
    else:
        problem = next((f"its {name!r} is missing" if name not in record else
                        f"its {name!r} is {_kind(record[name])}, not {wanted}"
                        for name, (ok, wanted) in fields.items() if name not in record or not ok(record[name])),
                       None)
        problem = problem or next((f"its {name!r} is {_kind(record[name])}, not {wanted}"
                                   for name, (ok, wanted) in (optional or {}).items()
                                   if name in record and not ok(record[name])), None)
    if problem:
        raise not_written(path, problem, what)
    return record


def not_written(path: Path, problem: str, what: str) -> FolderError:
    """The error of a results folder's file ``path`` that is not the ``what`` headprune writes there."""
    return FolderError(f"{path}: {problem}; it is not a {what} headprune writes. Accepted: the file as `headprune "
                       "run` wrote it; move it out of the folder (its cell then counts as not computed) or restore it.")


def _kind(value) -> str:
    shown = repr(value)
    return f"{type(value).__name__} {shown[:40]}{'...' if len(shown) > 40 else ''}"


CLAIM = {"host": (text, "a host name"),
         "pid": (lambda v: isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_PID,
                 f"a process id (a whole number from 1 to {MAX_PID})"),
         "since": (lambda v: number(v) and 0 <= v <= LATEST_TIME,
                   f"a time in seconds since 1970 (0 to {LATEST_TIME:.0e})")}
FAILURE = {"error": (text, "the error's text")}


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
    record = read_folder_json(path, "claim", CLAIM, {"worker": (text, "a worker's name")})
    try:
        heartbeat = path.stat().st_mtime
    except OSError:   # released since it was read
        return None
    if record is None:
        return None
    return Holder(key, record["host"], record["pid"], record.get("worker", ""), float(record["since"]), heartbeat)


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
    """``key``'s failure record ({"error": text, "tail": lines, ...}), None when it has none."""
    return read_folder_json(out / "failed" / f"{key}.json", "failure record", FAILURE,
                            {"tail": (texts, "a list of lines")})


def taken(out: Path) -> list[tuple[str, int]]:
    """(cell key, pid) of every claim taken in ``out``, in order (``claims/taken.log``)."""
    path = Path(out) / "claims" / "taken.log"
    if kind_of(path) == "missing":
        return []
    lines = read_user_text(path, "The claims log", "the claims/taken.log `headprune run` appends to",
                           error=FolderError).splitlines()
    # a line as written: "<time> <key> <host> <pid> <worker>"; an edited line that is not is skipped, not a crash
    return [(parts[1], int(parts[3])) for parts in (line.split() for line in lines)
            if len(parts) >= 4 and parts[3].isascii() and parts[3].isdigit()]
