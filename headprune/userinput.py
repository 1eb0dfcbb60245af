"""Paths and "JSON or a file" values as a user types them, read in one place: no ``OSError`` reaches the user.

A value that names a file or folder (``--data``, ``--model``, ``--mask``, ``--out``, ...) can be anything a shell
passes: 300 characters, a NUL byte, a name longer than the file system allows. The operating system answers such
a name with ``OSError`` (``File name too long``) from the very first ``stat``, so every path a user gives is first
checked here (:func:`path_problem`) and probed with :func:`kind_of`, which never raises.

A value documented as "JSON or a file holding it" (``--label-map``, ``--device-map``) is read by
:func:`json_or_file`: text that looks like JSON (it starts with ``{`` or ``[``) is parsed as JSON first, without
asking the file system about it (a long inline object is not a file name), anything else is a path.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from .errors import HeadpruneError

NAME_MAX = 255    # bytes in one file or folder name (Linux, macOS, Windows: 255)
PATH_MAX = 4096   # bytes in a whole path (Linux's PATH_MAX; the smallest of the three usual systems' limits)


def path_problem(text: str) -> str | None:
    """Why ``text`` cannot be a path on this system (NUL byte, a name over :data:`NAME_MAX` bytes, the whole over
    :data:`PATH_MAX` bytes), or None. Checks the text only: nothing is asked of the file system."""
    if "\x00" in text:
        return "it holds a NUL character, which no path may hold"
    size = len(os.fsencode(text))
    if size > PATH_MAX:
        return f"it is {size} bytes long; a path holds at most {PATH_MAX} bytes"
    longest = max((len(os.fsencode(part)) for part in text.replace("\\", "/").split("/")), default=0)
    if longest > NAME_MAX:
        return f"it has a name of {longest} bytes; a file or folder name holds at most {NAME_MAX} bytes"
    return None


def shown(text: str, limit: int = 60) -> str:
    """``text`` shortened for a message (a 300-character value is named by its start and its length)."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def user_path(text: str, option: str, accepted: str, error: type[HeadpruneError] = HeadpruneError) -> Path:
    """``text`` as a Path (``~`` expanded), or ``error`` naming ``option``, the problem and what is ``accepted``."""
    problem = path_problem(text)
    if problem:
        raise error(f"{option} {shown(text)}: not a usable path ({problem}). Accepted: {accepted}.")
    return Path(text).expanduser()


def kind_of(path: str | Path) -> str:
    """"file", "dir", "missing" or "other" (a device, a socket), or "unreadable" when the system refuses to look
    (a name too long, a folder without permission on the way); never raises."""
    text = str(path)
    if path_problem(text):
        return "unreadable"
    try:
        mode = os.stat(Path(text).expanduser()).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except (OSError, ValueError):
        return "unreadable"
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def is_file(path: str | Path) -> bool:
    return kind_of(path) == "file"


def is_dir(path: str | Path) -> bool:
    return kind_of(path) == "dir"


def exists(path: str | Path) -> bool:
    return kind_of(path) not in ("missing", "unreadable")


def looks_like_json(text: str) -> bool:
    """Whether ``text`` is meant as inline JSON (an object or a list), not a file name."""
    return text.lstrip()[:1] in ("{", "[")


def json_or_file(text: str, what: str, accepted: str,
                 error: type[HeadpruneError] = HeadpruneError) -> tuple[object, str]:
    """(parsed value, where it came from) for a value given as JSON or as a file holding JSON.

    Text that looks like JSON is parsed first; otherwise ``text`` must name a readable file (then its content is
    parsed), or parse as JSON itself. Every failure is ``error`` naming ``what`` and what is ``accepted``; no
    ``OSError`` or ``JSONDecodeError`` escapes.
    """
    source, raw = what, text
    if not looks_like_json(text):
        problem = path_problem(text)
        if problem:
            raise error(f"{what} {shown(text)} is neither JSON nor a usable file name ({problem}). "
                        f"Accepted: {accepted}.")
        if kind_of(text) == "file":
            source = f"{what} file {text}"
            try:
                raw = Path(text).expanduser().read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise error(f"The {source} cannot be read ({exc.__class__.__name__}: "
                            f"{getattr(exc, 'strerror', None) or exc}). Accepted: {accepted}.") from None
        elif kind_of(text) == "dir":
            raise error(f"{what} {text} is a folder. Accepted: {accepted}.")
    try:
        return json.loads(raw), source
    except json.JSONDecodeError as exc:
        raise error(f"The {source} is not JSON ({exc.msg}; got {shown(raw.strip(), 40)!r}). "
                    f"Accepted: {accepted}.") from None


__all__ = ["NAME_MAX", "PATH_MAX", "exists", "is_dir", "is_file", "json_or_file", "kind_of", "looks_like_json",
           "path_problem", "shown", "user_path"]
