"""Paths and "JSON or a file" values as a user types them, read in one place: no ``OSError`` reaches the user.

A value that names a file or folder (``--data``, ``--model``, ``--mask``, ``--out``, ...) can be anything a shell
passes: 300 characters, a NUL byte, a name longer than the file system allows. The operating system answers such
a name with ``OSError`` (``File name too long``) from the very first ``stat``, so every path a user gives is first
checked here (:func:`path_problem`) and probed with :func:`kind_of`, which never raises.

A file a user names (a plan, a lesson, a score file, a results folder's records, a model's ``config.json``) is read
by :func:`read_user_bytes` and its text and JSON forms: a regular file only (a FIFO, a device or a socket is
refused before it is opened, so nothing hangs on a FIFO or reads ``/dev/zero`` forever), its real path (after
every symlink) inside the allowed roots when the caller names roots, at most ``max_bytes`` bytes (checked before
reading, and again while reading), and JSON nested at most :data:`MAX_JSON_DEPTH` deep (checked before parsing:
the parser recurses, and 100,000 levels are a ``RecursionError``).

A value documented as "JSON or a file holding it" (``--label-map``, ``--device-map``) is read by
:func:`json_or_file`: text that looks like JSON (it starts with ``{`` or ``[``) is parsed as JSON first, without
asking the file system about it (a long inline object is not a file name), anything else is a path.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from .errors import HeadpruneError

MAX_FILE_BYTES = 64 * 2**20   # a user's JSON, TOML or text file (plans, lessons, score files, records, configs)
MAX_JSON_DEPTH = 64           # arrays and objects nested deeper are refused before parsing (the parser recurses)
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


def _refuse_kind(mode: int) -> str | None:
    """What a non-regular file is, in words, or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def resolved_inside(path: Path, roots: tuple[Path, ...]) -> Path | None:
    """``path`` with every symlink resolved when that real path lies inside one of ``roots`` (themselves
    resolved), else None. A path that cannot be resolved (a loop, a missing part) is None too."""
    try:
        real = path.expanduser().resolve(strict=True)
        real_roots = [Path(r).expanduser().resolve() for r in roots]
    except (OSError, RuntimeError):
        return None
    return real if any(real == r or real.is_relative_to(r) for r in real_roots) else None


def read_user_bytes(path: str | Path, what: str, accepted: str, *, max_bytes: int = MAX_FILE_BYTES,
                    roots: tuple[str | Path, ...] = (), error: type[HeadpruneError] = HeadpruneError,
                    tail: bool = False) -> bytes:
    """The bytes of the regular file ``path`` a user named, or ``error`` naming ``what``, the problem and what is
    ``accepted``. Never hangs and never raises OSError:

    - a FIFO, a device, a socket or a folder is refused from ``stat`` before anything is opened (the file is then
      opened non-blocking and checked again, so a swap between the two is refused as well);
    - with ``roots``, the path's real location after every symlink must lie inside one of them;
    - a file over ``max_bytes`` is refused before it is read (and a file growing while read, after
      ``max_bytes + 1`` bytes); with ``tail``, its last ``max_bytes`` bytes are read instead (a log's end).
    """
    p = user_path(str(path), what, accepted, error)
    if roots:
        if resolved_inside(p, tuple(Path(r) for r in roots)) is None:
            shown_roots = ", ".join(str(r) for r in roots)
            raise error(f"{what} {p} is not inside {shown_roots} once its links are followed (or it cannot be "
                        f"resolved). Accepted: {accepted}, inside {shown_roots}.")
    try:
        mode = os.stat(p).st_mode
    except (FileNotFoundError, NotADirectoryError):
        raise error(f"{what} {p} not found. Accepted: {accepted}.") from None
    except OSError as exc:   # a symlink loop, a folder without permission on the way
        raise error(f"{what} {p} cannot be looked at ({exc.strerror or exc}). Accepted: {accepted}.") from None
    try:
        problem = _refuse_kind(mode)
        if problem:
            raise error(f"{what} {p} is {problem}, not a regular file. Accepted: {accepted}.")
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            problem = _refuse_kind(info.st_mode)
            if problem:
                raise error(f"{what} {p} is {problem}, not a regular file. Accepted: {accepted}.")
            if tail and info.st_size > max_bytes:
                handle.seek(info.st_size - max_bytes)
                return handle.read(max_bytes)
            if info.st_size > max_bytes:
                raise error(f"{what} {p} is {info.st_size:,} bytes, over the {max_bytes:,} bytes read. "
                            f"Accepted: {accepted}.")
            data = handle.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"{what} {p} cannot be read ({exc.__class__.__name__}: {exc.strerror or exc}). "
                    f"Accepted: {accepted}.") from None
    if len(data) > max_bytes:
        raise error(f"{what} {p} is over the {max_bytes:,} bytes read. Accepted: {accepted}.")
    return data


def read_user_text(path: str | Path, what: str, accepted: str, *, max_bytes: int = MAX_FILE_BYTES,
                   roots: tuple[str | Path, ...] = (), error: type[HeadpruneError] = HeadpruneError) -> str:
    """:func:`read_user_bytes` decoded as UTF-8 (a file that is not UTF-8 is ``error``, naming ``what``)."""
    data = read_user_bytes(path, what, accepted, max_bytes=max_bytes, roots=roots, error=error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}). Accepted: {accepted}.") from None


_JSON_TOKEN = re.compile(r'"(?:\\.|[^"\\])*"|[\[\]{}]', re.S)   # strings skipped whole, then the brackets


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (brackets inside strings do not count)."""
    return bracket_depth(_JSON_TOKEN, text)


def bracket_depth(tokens: re.Pattern, text: str) -> int:
    """The deepest nesting of ``[``/``{`` among the matches of ``tokens`` in ``text``: a format's tokenizer that
    matches strings (and comments) whole, so only brackets outside them count (JSON here, TOML in protocol.spec)."""
    depth = deepest = 0
    for token in tokens.finditer(text):
        kind = token.group()
        if kind in ("[", "{"):
            depth += 1
            deepest = max(deepest, depth)
        elif kind in ("]", "}"):
            depth -= 1
    return deepest


def parse_user_json(text: str, source: str, accepted: str, *, max_depth: int = MAX_JSON_DEPTH,
                    error: type[HeadpruneError] = HeadpruneError):
    """``text`` parsed as JSON, or ``error`` naming ``source``: not JSON, or nested deeper than ``max_depth``
    (checked before parsing, so no ``RecursionError``)."""
    depth = json_depth(text) if text.count("[") + text.count("{") > max_depth else 0
    if depth > max_depth:
        raise error(f"{source} nests arrays or objects {depth} deep, over the {max_depth} levels read. "
                    f"Accepted: {accepted}.")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{source} is not JSON ({exc.msg}; got {shown(text.strip(), 40)!r}). Accepted: {accepted}.") \
            from None
    except RecursionError:  # the depth scan above counts brackets; this is its last line of defence
        raise error(f"{source} nests too deep to parse. Accepted: {accepted}.") from None


def read_user_json(path: str | Path, what: str, accepted: str, *, max_bytes: int = MAX_FILE_BYTES,
                   max_depth: int = MAX_JSON_DEPTH, roots: tuple[str | Path, ...] = (),
                   error: type[HeadpruneError] = HeadpruneError):
    """The JSON value in the user's file ``path``: :func:`read_user_text`, then :func:`parse_user_json`."""
    text = read_user_text(path, what, accepted, max_bytes=max_bytes, roots=roots, error=error)
    return parse_user_json(text, f"{what} {path}", accepted, max_depth=max_depth, error=error)


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
        if kind_of(text) == "dir":
            raise error(f"{what} {text} is a folder. Accepted: {accepted}.")
        if kind_of(text) != "missing":
            source = f"{what} file {text}"
            raw = read_user_text(text, f"The {what} file", accepted, error=error)
    return parse_user_json(raw, f"The {source}", accepted, error=error), source


__all__ = ["MAX_FILE_BYTES", "MAX_JSON_DEPTH", "NAME_MAX", "PATH_MAX", "exists", "is_dir", "is_file", "json_depth",
           "json_or_file", "kind_of", "looks_like_json", "parse_user_json", "path_problem", "read_user_bytes",
           "read_user_json", "read_user_text", "resolved_inside", "shown", "user_path"]
