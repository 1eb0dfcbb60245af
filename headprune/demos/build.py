"""How every demo is built and cached: one training loop, one cache folder, one atomic and locked build.

The cache lives in $HEADPRUNE_CACHE, else the user cache dir (platformdirs ``user_cache_dir("headprune")``); each
demo is a folder named after its recipe (bump the recipe when the recipe changes). A build runs in a temporary
folder beside the final one and is renamed into place once complete (``INFO_FILE`` is written last), so an
interrupted build leaves nothing half-written; a file lock makes concurrent processes build once.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from platformdirs import user_cache_dir
from transformers import LlamaForCausalLM

from ..data import model_inputs
from ..errors import HeadpruneError

INFO_FILE = "headprune_demo.json"
WARMUP_FRACTION = 0.1


class CacheError(HeadpruneError):
    """The headprune cache cannot be written where it is (HEADPRUNE_CACHE, or the user cache folder)."""


def cache_dir() -> Path:
    """$HEADPRUNE_CACHE, else the user cache dir (platformdirs ``user_cache_dir("headprune")``)."""
    return Path(os.environ.get("HEADPRUNE_CACHE") or user_cache_dir("headprune")).expanduser()


def writable(folder: Path) -> Path:
    """``folder`` (the cache, or a folder inside it), created if missing, once a file can be written there; else
    CacheError naming it and HEADPRUNE_CACHE, before any work (a read-only place, a file in its place, a folder
    without permission: PermissionError, NotADirectoryError or FileExistsError reached users from ``docs``, demo
    builds and ``--export-duo`` before). Every writer of the cache calls this first."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".headprune-write-test-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except (OSError, ValueError) as exc:   # ValueError: a NUL byte in the variable
        where = os.environ.get("HEADPRUNE_CACHE")
        raise CacheError(f"The headprune cache {folder} cannot be written ({getattr(exc, 'strerror', None) or exc}). "
                         f"Accepted: HEADPRUNE_CACHE naming a folder you can write (now "
                         f"{repr(where) if where else 'unset: the user cache folder'}).") from None
    return folder


def stderr_progress(fraction: float, message: str) -> None:
    """The default progress of a demo build: a line on stderr."""
    print(f"headprune demo: {fraction:4.0%} {message}", file=sys.stderr, flush=True)


def linear_warmup_decay(step: int, total: int) -> float:
    """Learning-rate factor: rises linearly to 1 over the warmup steps, then falls linearly to 0."""
    warmup = max(1, int(WARMUP_FRACTION * total))
    return step / warmup if step < warmup else max(0.0, (total - step) / max(1, total - warmup))


def train_steps(model, batches: list[dict], optimizer, loss_of, progress, what: str) -> None:
    """One optimizer step per batch, in order: ``loss_of(logits, batch)`` backpropagated, the gradient norm of the
    optimizer's parameters clipped at 1, the learning rate scaled by ``linear_warmup_decay``; eval mode after."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: linear_warmup_decay(s, len(batches)))
    model.train()
    for step, batch in enumerate(batches):
        loss = loss_of(model(**model_inputs(batch)).logits, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == len(batches) - 1:
            progress(0.9 * (step + 1) / len(batches), f"{what} step {step + 1}/{len(batches)}, loss {loss:.3f}")
    model.eval()


def train_llama(config, batches: list[dict], seed: int, learning_rate: float, weight_decay: float, loss_of, progress,
                what: str = "training"):
    """A LlamaForCausalLM of ``config`` initialised under ``torch.manual_seed(seed)`` and trained by
    :func:`train_steps` with AdamW (betas (0.9, 0.98); weight decay on matrices only, not on norm scales)."""
    torch.manual_seed(seed)
    model = LlamaForCausalLM._from_config(config, attn_implementation="sdpa")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=learning_rate, betas=(0.9, 0.98))
    train_steps(model, batches, optimizer, loss_of, progress, what)
    return model


@contextmanager
def exclusive_lock(lock_path: Path):
    """An exclusive file lock (POSIX), so concurrent processes build the demo once; no lock elsewhere."""
    try:
        import fcntl  # deferred: POSIX only (no lock elsewhere)
    except ImportError:
        yield
        return
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def complete(folder: Path) -> bool:
    """Whether ``folder`` holds a finished build (its info file is written last)."""
    return (folder / INFO_FILE).is_file()


def build_cached(final: Path, build, what: str, summary) -> Path:
    """``final`` once complete (``INFO_FILE`` written last), building it first when missing.

    ``build()`` returns (model, tokenizer, info); they are saved into a temporary folder beside ``final`` and
    renamed into place, so an interrupted build leaves nothing half-written, under a file lock so concurrent
    processes build once. ``summary(info)`` is printed on stderr after a build; ``what`` names it before.
    """
    if complete(final):
        return final
    writable(final.parent)
    with exclusive_lock(final.parent / f"{final.name}.lock"):
        if complete(final):  # built by another process while we waited
            return final
        print(f"headprune: building the {what} into {final} (once; a few minutes on CPU)", file=sys.stderr)
        model, tokenizer, info = build()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
        try:
            model.save_pretrained(tmp, safe_serialization=True)
            tokenizer.save_pretrained(tmp)
            (tmp / INFO_FILE).write_text(json.dumps(info, indent=1), encoding="utf-8")
            if final.exists():  # a folder without the info file is not ours to trust
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"headprune: {what} cached at {final} ({summary(info)})", file=sys.stderr)
    return final


def read_info(folder: Path) -> dict:
    """The recorded facts of a built demo folder."""
    return json.loads((folder / INFO_FILE).read_text(encoding="utf-8"))
