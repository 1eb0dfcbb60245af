"""Writing a command's JSON result to ``--out``: checked before any work, written atomically, never over a user's file.

A command may run for minutes; a bad ``--out`` is refused before the model loads, and the file appears whole or
not at all (``outdir.write_atomic``: a temporary file in the same folder renamed over the target), so an
interrupted run never leaves half a JSON file behind. An existing file is replaced only when a headprune command
wrote it (its JSON starts with ``outdir.SIGNATURE``) or ``--force`` says so (``outdir.check_file``).
"""

from __future__ import annotations

import json

import numpy as np

from ..outdir import check_file, signed, write_atomic


def jsonable(obj):
    """What ``json.dumps`` cannot write itself: numpy scalars and arrays as numbers and lists, the rest as text."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def add_force_arg(p, help: str = "replace an existing --out file that headprune did not write (refused by "
                                 "default; a file an earlier headprune command wrote is always replaced)") -> None:
    p.add_argument("--force", action="store_true", help=help)


def checked_out_file(out: str | None, force: bool = False, option: str = "--out"):
    """``--out`` as a Path (None when not given), checked before any work (``outdir.check_file``): a file path in an
    existing folder, new or written by headprune, or any file with ``force``."""
    return check_file(out, option, force)


def write_json(result: dict, out: str | None, force: bool = False, command: str = "headprune") -> dict:
    """Write ``result`` to ``out`` (when given) atomically, signed with ``command`` (``outdir.signed``); returns
    what was written (``result`` when no file was asked for), so what is printed is what the file holds."""
    path = checked_out_file(out, force)
    if path is None:
        return result
    result = signed(result, command)
    write_atomic(path, json.dumps(result, indent=1, default=jsonable))   # serialised first: a failure writes nothing
    return result


def check_out_arg(args) -> None:
    """A command's ``--out`` file checked before any work (``checked_out_file`` with its ``--force``)."""
    checked_out_file(args.out, args.force)


def write_out(result: dict, args) -> dict:
    """``result`` written to the command's ``--out`` (``write_json``, signed with the command's name)."""
    return write_json(result, args.out, args.force, args.command)
