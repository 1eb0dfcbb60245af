"""A recovery run's work folder (``OUT.work/``: per-epoch checkpoints and ``recovery_spec.json``), judged before
training starts.

What ``--resume`` (or a fresh run) may find there, and what happens:

    missing / empty          a fresh run; ``--resume`` from the CLI is refused (nothing to resume)
    a file (or a device)     refused: the checkpoints' folder would replace a file of the user's
    files and no spec file   refused: a folder recover did not write (the user's, or another tool's)
    a broken spec file       refused: not the JSON object recover writes
    a spec and no checkpoint a fresh run; ``--resume`` from the CLI is refused (stopped before the first epoch)
    another run's spec       refused on ``--resume`` (the settings that differ are named)
    another model's weights  refused on ``--resume``: the checkpoint's config.json names another family, label
                             count or vocabulary, or other kept heads
    pickled objects          refused on ``--resume``: a state file holds Python objects that torch's
                             ``weights_only`` loading refuses (an RNG state's numpy arrays are the one exception,
                             as transformers allows them)

Every refusal is a RecoveryError naming what was found and what is accepted; nothing in the folder is touched.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers.trainer_utils import get_last_checkpoint

from ..userinput import kind_of, read_user_json
from .spec import RecoveryError

SPEC_FILE = "recovery_spec.json"   # in the work folder: a resumed run must be the same run
# globals a Trainer checkpoint's RNG state legitimately holds (numpy arrays of the generator's state)
RNG_GLOBALS = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.dtype",
               "numpy.ndarray", "numpy.dtypes.")
NOT_LOADED = ("training_args.bin",)   # written beside a checkpoint, never read back by a resume
# config keys a checkpoint of this run shares with the student being resumed
SAME_MODEL_KEYS = ("model_type", "vocab_size", "labels", "headprune_kept_heads")
ACCEPTED = ("the OUT.work folder an interrupted `headprune recover --out OUT` left, resumed with the same model, "
            "mask and settings, or no folder at all (a fresh run)")


def read_spec(work_dir: Path) -> dict | None:
    """The settings recorded in ``work_dir`` (None when the folder is missing or empty); refuses a file in its
    place, a folder of other files, and a spec file that is not the JSON object recover writes."""
    kind = kind_of(work_dir)
    if kind == "missing":
        return None
    if kind != "dir":
        found = {"file": "a file", "other": "something that is not a folder",
                 "unreadable": "a path the system cannot look up"}[kind]
        raise RecoveryError(f"The work folder {work_dir} is {found}, not a folder of checkpoints. Accepted: "
                            f"{ACCEPTED}. Move it away, or choose another --out.")
    entries = sorted(p.name for p in work_dir.iterdir())
    if not entries:
        return None
    if SPEC_FILE not in entries:
        listed = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise RecoveryError(f"The work folder {work_dir} holds files recover did not write ({listed}; no "
                            f"{SPEC_FILE}). Accepted: {ACCEPTED}. Move the files away, or choose another --out.")
    # the one safe reader: a FIFO or a device in its place is refused before it is opened, size and nesting bounded
    recorded = read_user_json(work_dir / SPEC_FILE, "The work folder's settings file",
                              f"{ACCEPTED}; delete {work_dir} to start again", error=RecoveryError)
    if not isinstance(recorded, dict):
        raise RecoveryError(f"{work_dir / SPEC_FILE} holds {type(recorded).__name__}, not the settings object "
                            f"recover writes. Accepted: {ACCEPTED}. Delete {work_dir} to start again.")
    return recorded


def last_checkpoint(work_dir: Path) -> str | None:
    """The newest ``checkpoint-N`` folder in ``work_dir``, or None."""
    return get_last_checkpoint(str(work_dir)) if kind_of(work_dir) == "dir" else None


def changed_settings(recorded: dict, wanted: dict) -> list[str]:
    """The keys of ``wanted`` whose value the recorded run had otherwise."""
    return sorted(k for k in wanted if recorded.get(k) != wanted[k])


def _model_facts(config) -> dict:
    """What a checkpoint's config.json and the student's must agree on (``SAME_MODEL_KEYS``)."""
    config = config if isinstance(config, dict) else {}
    facts = {k: config.get(k) for k in SAME_MODEL_KEYS}
    facts["labels"] = len(config["id2label"]) if isinstance(config.get("id2label"), dict) else None
    if isinstance(facts["headprune_kept_heads"], dict):   # JSON keys are text; the live config's may be ints
        facts["headprune_kept_heads"] = {str(k): v for k, v in facts["headprune_kept_heads"].items()}
    return facts


def checkpoint_problem(checkpoint: str | Path, config: dict | None = None) -> str | None:
    """Why ``checkpoint`` cannot be resumed into this run, or None: its config.json names another model than
    ``config`` (the student's config.json; None: not compared), or a state file a resume loads holds pickled
    objects that ``torch.load(weights_only=True)`` refuses. Reads the pickles' opcodes only: nothing in them
    runs."""
    folder = Path(checkpoint)
    if config is not None and kind_of(folder / "config.json") == "file":
        try:
            theirs = read_user_json(folder / "config.json", "Its config.json", "a checkpoint's config.json",
                                    error=RecoveryError)
        except RecoveryError:
            return "its config.json is not readable JSON"
        theirs, ours = _model_facts(theirs), _model_facts(config)
        differ = [f"{k} {theirs[k]!r} there, {ours[k]!r} here" for k in SAME_MODEL_KEYS if theirs[k] != ours[k]]
        if differ:
            return f"it was written for another model ({'; '.join(differ)})"
    for path in sorted(folder.iterdir()):
        if path.suffix not in (".pt", ".pth", ".bin") or path.name in NOT_LOADED:
            continue
        try:
            unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
        except Exception as exc:   # torch raises several types for a file that is not a checkpoint
            return f"{path.name} is not a torch checkpoint ({exc.__class__.__name__})"
        unsafe = [g for g in unsafe if not (path.name == "rng_state.pth" and g.startswith(RNG_GLOBALS))]
        if unsafe:
            return (f"{path.name} holds pickled Python objects ({', '.join(unsafe[:3])}) that loading with "
                    "weights_only refuses")
    return None


def check_work_dir(work_dir: Path, *, resume: bool, wanted: dict, config: dict | None = None,
                   strict: bool = False) -> str | None:
    """The checkpoint to resume from (None: a fresh run), or a RecoveryError naming what was found.

    ``wanted`` holds the settings this run records (compared on ``--resume`` with what the folder recorded),
    ``config`` the student's config.json (compared with the checkpoint's). ``strict`` (the CLI's ``--resume``)
    also refuses a resume with nothing to resume; a protocol resumes cells whose folder may not exist yet.
    """
    recorded = read_spec(work_dir)
    last = last_checkpoint(work_dir) if recorded is not None else None
    if last and not resume:
        raise RecoveryError(f"{work_dir} holds checkpoints of an interrupted run ({Path(last).name}). Pass --resume "
                            "to continue it, or delete the folder to start again.")
    if not resume:
        return None
    if strict and last is None:
        found = "does not exist" if recorded is None and kind_of(work_dir) == "missing" else \
            "is empty" if recorded is None else "holds no checkpoint (the run stopped before its first epoch ended)"
        raise RecoveryError(f"--resume: nothing to resume: {work_dir} {found}. Accepted: {ACCEPTED}. Leave out "
                            "--resume to start from the beginning.")
    if recorded is not None:
        changed = changed_settings(recorded, wanted)
        if changed:
            raise RecoveryError(f"--resume: the run in {work_dir} had other settings ({', '.join(changed)}); resume "
                                "with the same settings, or delete the folder to start again.")
    if last:
        problem = checkpoint_problem(last, config)
        if problem:
            raise RecoveryError(f"--resume: {last} cannot be resumed: {problem}. Accepted: {ACCEPTED}. Delete "
                                f"{work_dir} to start again.")
    return last


__all__ = ["ACCEPTED", "SPEC_FILE", "changed_settings", "check_work_dir", "checkpoint_problem", "last_checkpoint",
           "read_spec"]
