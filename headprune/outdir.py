"""Where a command writes: ``--out`` folders and files that are the run's own, never a user's.

Every command that writes a folder or a file follows one rule, checked before anything is created and before any
model loads, so a refused ``--out`` is left byte for byte as it was:

* **A results folder** (``run --out DIR``) is created, or accepted when it is empty, or when it holds this tool's
  run marker (:data:`MARKER`, ``.headprune-run.json``: the command and what it ran, e.g. the protocol's name and
  sha256) for the same work. Any other folder -- the user's files, another protocol's results -- is refused unless
  ``--force`` says to write into it anyway. The home folder and the file-system root are refused even then.
* **A model folder** (``prune --out``, ``recover --out``, ``trajectory --prune-out``) must be new or empty: the
  model is written whole into a staged folder and renamed into place (``model.loading.write_staged``).
* **A single file** (``score --out FILE``, ``mask --out``, ...) may replace a file this tool wrote (its JSON starts
  with the :data:`SIGNATURE` key ``"headprune_output"``); any other existing file is refused unless ``--force``.

Nothing is ever deleted by a pattern over the user's tree: a run deletes only files it names itself (temporary
files of its own writes, :func:`stale_temps`, whose names end in :data:`TEMP_SUFFIX` and start with the name of a
file the run writes). Files appear whole or not at all (:func:`write_atomic`).
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import HeadpruneError
from .provenance import versions

MARKER = ".headprune-run.json"        # in a results folder: what wrote it (command, protocol name and sha256)
SIGNATURE = "headprune_output"        # the first key of every JSON file a command writes to --out
TEMP_SUFFIX = ".headprune.tmp"        # a write in progress: ".<target name>.<random>.headprune.tmp"
PEEK = 256                            # bytes read to recognise our own JSON file (never the whole file)
MARKER_BYTES = 64 * 1024              # a run marker is a few lines; a larger file is no marker of ours


class OutError(HeadpruneError):
    """An ``--out`` this command may not write: a user's folder or file, a file where a folder is needed."""


# -- writing -----------------------------------------------------------------------------------------------------

def write_atomic(path: Path, text: str | bytes, what: str = "--out") -> None:
    """``text`` to ``path`` whole or not at all: a temporary file in the same folder (named after ``path``, ending
    in :data:`TEMP_SUFFIX`) renamed over ``path`` (``os.replace`` is atomic on one file system)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    try:    # a folder that cannot be made or written to (read-only, a file in the way) is the user's to fix
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TEMP_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise OutError(f"Could not write {path}: {exc.strerror or exc}. Accepted: a writable {what}.") from exc
    try:
        with os.fdopen(handle, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise OutError(f"Could not write {path}: {exc.strerror or exc}. Accepted: a writable {what}.") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def temp_target(name: str) -> str | None:
    """The file a temporary file of :func:`write_atomic` was written for (``.a.json.x1y2.headprune.tmp`` ->
    ``a.json``), None for any other name."""
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return None
    target, dot, _ = name[1:-len(TEMP_SUFFIX)].rpartition(".")
    return target if dot and target else None


def stale_temps(folder: Path, ours: Callable[[str], bool]) -> Iterator[Path]:
    """Temporary files left in ``folder`` (not its subfolders) by writes cut short (a kill skips
    :func:`write_atomic`'s clean-up) of files for which ``ours(name)`` is true: the caller names what it writes."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        target = temp_target(entry.name)
        if target is not None and entry.is_file() and not entry.is_symlink() and ours(target):
            yield entry


def signed(result: dict, command: str) -> dict:
    """``result`` with :data:`SIGNATURE` first: what a file written to ``--out`` carries, so a later run may
    replace it (:func:`check_file`) and a reader can tell which command and version wrote it."""
    return {SIGNATURE: {"command": command, "headprune": versions()["headprune"]}, **result}


# -- checking, before anything is created -----------------------------------------------------------------------

def _refuse_everywhere(path: Path, option: str) -> None:
    """The home folder and the file-system root are never a results folder, whatever ``--force`` says."""
    resolved = path.resolve()
    if resolved == Path.home().resolve() or resolved == Path(resolved.anchor):
        raise OutError(f"{option} {path} is {'your home folder' if resolved != Path(resolved.anchor) else 'the root'}"
                       "; results go in a folder of their own. Accepted: a new or empty folder, e.g. "
                       f"{path / 'results'}.")


def _read_regular(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of ``path`` when it is a regular file, else None (never raises). A FIFO or a device
    is never opened (opening a FIFO waits for a writer; /dev/zero never ends): this module sits beside
    ``userinput`` and cannot use its reader, so it keeps this one check of its own."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(handle, "rb") as f:
            return f.read(limit) if stat.S_ISREG(os.fstat(f.fileno()).st_mode) else None
    except (OSError, ValueError):
        return None


def is_ours(path: Path) -> bool:
    """True when ``path`` is a JSON file a headprune command wrote (it starts with the :data:`SIGNATURE` key)."""
    head = _read_regular(path, PEEK) or b""
    return head.lstrip().startswith(b"{") and head.lstrip()[1:].lstrip().startswith(f'"{SIGNATURE}"'.encode())


def check_file(out: str | Path | None, option: str = "--out", force: bool = False) -> Path | None:
    """``out`` as a Path once it may be written: a file path in an existing folder that is new, or a file this
    tool wrote (:func:`is_ours`), or any file with ``force``. None when not given. Creates nothing."""
    if out is None or out == "":
        return None
    path = Path(out).expanduser()
    if path.is_dir():
        raise OutError(f"{option} {out} is a folder; give a file path for the JSON result, e.g. "
                       f"{path / 'result.json'}.")
    if not path.parent.is_dir():
        problem = "is a file, not a folder" if path.parent.exists() else "does not exist"
        raise OutError(f"{option} {out}: the folder {path.parent} {problem}. Accepted: a file path inside an "
                       "existing folder (create the folder first).")
    if (path.exists() or path.is_symlink()) and not force and not is_ours(path):
        raise OutError(f"{option} {out} exists and was not written by headprune; it is left as it is. Accepted: a "
                       "new file name, a file an earlier headprune command wrote, or --force to replace it.")
    return path


def check_model_folder(out: str | Path, option: str = "--out") -> Path:
    """``out`` as a Path once a model may be written there: new, or an empty folder. Creates nothing."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise OutError(f"{option} {out} is a file; give a folder (created if missing) for the model.")
    if path.is_dir() and any(path.iterdir()):
        raise OutError(f"{option} {out} is a folder that is not empty; its files are left as they are. Accepted: a "
                       "new or empty folder for the model (it is written whole, then moved into place).")
    _refuse_everywhere(path, option)
    return path


def read_marker(folder: Path) -> dict | None:
    """The run marker of ``folder`` (None when it has none or it is unreadable)."""
    raw = _read_regular(folder / MARKER, MARKER_BYTES + 1)
    if raw is None or len(raw) > MARKER_BYTES:
        return None
    try:
        marker = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):   # RecursionError: nested past the parser's stack, no marker of ours
        return None
    return marker if isinstance(marker, dict) else None


def check_results_folder(out: str | Path, option: str, identity: dict, same: Callable[[dict], bool], *,
                         force: bool = False, legacy: Callable[[Path], bool] | None = None) -> Path:
    """``out`` as a results folder this run may write (module doc), checked without creating anything.

    ``identity`` is what this run writes in the marker (at least "command"); ``same(marker)`` says whether a folder
    marked by another run is this run's to continue. ``legacy(path)`` recognises a folder an older headprune wrote
    before markers existed. Raises OutError naming what was found and what is accepted.
    """
    path = Path(out).expanduser()
    _refuse_unreachable(path, option)
    if path.exists() and not path.is_dir():
        raise OutError(f"{option} {out} is a file; give a folder (created if missing) for the results.")
    _refuse_everywhere(path, option)
    if not path.is_dir() or force or not any(path.iterdir()):
        return path
    marker = read_marker(path)
    if marker is None and legacy is not None and legacy(path):
        return path
    if marker is None:
        raise OutError(f"{option} {out} is a folder headprune did not create (no {MARKER} in it); its files are "
                       f"left as they are. Accepted: a new or empty folder, a folder of an earlier run of the same "
                       f"{identity['command']}, or --force to write into it anyway (only files this run names are "
                       "written; none is deleted).")
    if marker.get("command") != identity["command"] or not same(marker):
        raise OutError(f"{option} {out} holds the results of another run ({_describe(marker)}), not of "
                       f"{_describe(identity)}; they are left as they are. Accepted: a new or empty folder, or "
                       "--force to write into it anyway.")
    return path


def _refuse_unreachable(path: Path, option: str) -> None:
    """A results folder that could never be created or written, refused in words before anything else: a link to
    nothing (mkdir would meet the link: FileExistsError), a loop of links (resolving it: RuntimeError), a file or a
    folder without permission on the way, or a new folder inside one this user cannot write (PermissionError)."""
    accepted = "Accepted: a new or empty folder in a place you can write, or a link to one."
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise OutError(f"{option} {path} is a link to {os.readlink(path)}, which does not exist. {accepted}") \
                from None
    except OSError as exc:   # ELOOP, ENOTDIR, EACCES, ENAMETOOLONG on the way
        raise OutError(f"{option} {path} cannot be looked at ({exc.strerror or exc}). {accepted}") from None
    parent = path if path.is_dir() else next((p for p in path.parents if p.is_dir()), None)
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise OutError(f"{option} {path}: {parent} is not writable by this user. {accepted}")


def _describe(marker: dict) -> str:
    details = ", ".join(f"{k} {v}" for k, v in marker.items() if k in ("name", "source") and v)
    return f"{marker.get('command', 'unknown command')}{' ' + details if details else ''}"


def claim_results_folder(path: Path, identity: dict) -> Path:
    """Create ``path`` (checked by :func:`check_results_folder`) and write its run marker: ``identity``, the time
    and versions. A folder's first marker is kept when it is this run's; returns ``path``."""
    try:   # checked before (check_results_folder), and again here: the file system may refuse what it allowed
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutError(f"Could not create {path}: {exc.strerror or exc}. Accepted: a new or empty folder in a place "
                       "you can write.") from None
    marker = read_marker(path)
    if marker is None or any(marker.get(k) != v for k, v in identity.items()):
        record = {**identity, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "versions": versions()}
        write_atomic(path / MARKER, json.dumps(record, indent=1), option_of(identity))
    return path


def option_of(identity: dict) -> str:
    return f"{identity.get('command', 'headprune')} --out folder"
