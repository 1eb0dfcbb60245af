"""A KV cache plan: for every key/value head (grouped-query group) of a decoder, ``full`` or ``streaming``.

A full head keeps every key and value; a streaming head keeps the first ``sink`` keys (attention sinks) and the
last ``window`` keys, as in DuoAttention (Xiao et al. 2024, "streaming heads"). A query head reads the keys of
its group, so the plan is per group: with grouped-query attention the ``H / H_kv`` query heads of a group stream
or not together.

On disk (``*.json`` beside mask files)::

    {"format": "headprune-kv-plan", "version": 1,
     "shape": [L, H_kv],              # blocks x key/value heads of the model it was made for
     "n_heads": H,                    # query heads per block (H_kv divides H)
     "sink": 4, "window": 64,         # S >= 0 first keys, W >= 1 last keys (the key itself included)
     "full": {"<layer>": [group, ...]},   # groups keeping the whole cache; every other group streams
     "rule": "...", "scores": [[...]]}    # optional: how it was chosen (recorded, never read back)

A query at position q of a streaming head sees key position p iff ``p <= q`` and (``p < S`` or ``p > q - W``):
the same keys a cache holding the first S and last W entries gives it (``cache.MixedCache``).

A **budget plan** (version 2, ``"kind": "budgets"``; HeadKV/AdaKV's per-head budgets, ``budgets.allocate``) gives
every group its own window: group g keeps the S sinks and its last W_g keys, a budget of b_g = S + W_g tokens, or
``null`` (every key: a full group)::

    {"format": "headprune-kv-plan", "version": 2, "kind": "budgets", "shape": [L, H_kv], "n_heads": H,
     "sink": 4, "budget": 1536,                # total tokens of the bounded groups' budgets (sum b_g <= budget)
     "budgets": [[68, null], [132, 20], ...]}  # b_g = S + W_g >= S + 1 per group; null = full

Full and all-streaming plans are its two extremes (every budget null; every budget S + W). Version 1 files load
as before; any other version is refused (a newer headprune's file is not read as an older one).

Either version may say ``"compensation": true``: RazorAttention's compensation token (Tang et al. 2024, arXiv
2407.15891, §3.3, Eq. 4-5): each streaming group also holds ONE entry summarising the keys it dropped (every
position p with S <= p <= q - W at query q): key and value are the MEAN of the dropped keys and values, attended
with weight N_d (the number dropped), i.e. its logit gets + log N_d. A file without the key streams as before
(no compensation); a value that is not true / false is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import HeadpruneError
from ..limits import NON_NEGATIVE_INT, TOKENS_PER_ROW, UNIT, Interval
from ..outdir import SIGNATURE, signed, write_atomic
from ..userinput import read_user_json, shown

FORMAT = "headprune-kv-plan"
# a sink or window past the longest row any command accepts keeps every key: bounded there, so a number like 10**20
# is refused before it reaches a tensor (it overflowed the restriction's int64 comparison)
SINK = Interval(0, TOKENS_PER_ROW.high, integer=True, why="no row is longer")
WINDOW = Interval(1, TOKENS_PER_ROW.high, integer=True, why="no row is longer")
FULL_SHARE = UNIT             # share of key/value heads kept full
# a plan's grid is allocated from its "shape" before it meets a model: bounded there, so a file saying 10**7 x 10**7
# is refused in words instead of asking the allocator for 100 TB
BLOCKS = Interval(1, 4096, integer=True, why="blocks of one model; the largest decoders have a few hundred")
KV_HEADS = Interval(1, 4096, integer=True, why="key/value heads of one block")
N_HEADS = Interval(1, 65_536, integer=True, why="query heads of one block")
# a budget plan's numbers: one group keeps at most its sinks and a window, each bounded by the longest row; the total
# is bounded where the command-line --budget is (budgets.TOTAL)
GROUP_BUDGET = Interval(0, SINK.high + WINDOW.high, integer=True, why="S + W_g tokens, each bounded by the longest "
                                                                        "row")
PLAN_TOTAL = Interval(0, 2**40, integer=True, why="the KV tokens of every group together: rows are at most "
                                                  "1,048,576 tokens, and no model has a million key/value groups")
VERSIONS = (1, 2)             # 1: full / streaming at one window; 2: per-group budgets


class KVPlanError(HeadpruneError):
    """A cache plan that does not fit its model, or parameters outside their limits."""


def check_window(sink, window) -> None:
    """Refuse a sink or window outside its limits (before anything loads)."""
    for name, value, limit in (("sink", sink, SINK), ("window", window, WINDOW)):
        problem = limit(value)
        if problem:
            meaning = "first keys kept" if name == "sink" else "last keys kept, the key itself included"
            raise KVPlanError(f"KV plan {name} {value!r} {problem} ({meaning}).")


def check_full_share(share) -> None:
    problem = FULL_SHARE(share)
    if problem:
        raise KVPlanError(f"--full-share {share!r} {problem}: the share of key/value heads keeping the whole cache.")


@dataclass
class KVPlan:
    """``full``: bool (L, H_kv), True = the group keeps every key/value; the rest stream (``sink`` + ``window``).

    A budget plan also has ``windows``: int (L, H_kv), each streaming group's own window W_g (entries of full
    groups are unused), and ``budget``: the total tokens its bounded groups may hold (sum of S + W_g <= budget);
    its ``window`` is then the largest W_g (what a reader of one window sees as the widest)."""

    full: torch.Tensor
    n_heads: int
    sink: int = 4
    window: int = 64
    meta: dict = field(default_factory=dict)
    windows: torch.Tensor | None = None
    budget: int | None = None
    compensation: bool = False   # RazorAttention's compensation token for every streaming group (module doc)

    def __post_init__(self):
        self.full = torch.as_tensor(self.full, dtype=torch.bool)
        if not isinstance(self.compensation, bool):
            raise KVPlanError(f'A KV plan\'s "compensation" is true or false (RazorAttention\'s compensation token); '
                              f"got {self.compensation!r}.")
        if self.windows is not None:
            self.check_budgets()
        check_window(self.sink, self.window)
        if self.full.ndim != 2 or self.full.shape[1] < 1:
            raise KVPlanError(f"A KV plan's grid is blocks x key/value heads; got shape {tuple(self.full.shape)}.")
        n_kv = self.full.shape[1]
        if N_HEADS(self.n_heads) or self.n_heads < n_kv or self.n_heads % n_kv:
            raise KVPlanError(f"A KV plan's n_heads {shown(repr(self.n_heads))} must be a multiple of its {n_kv} "
                              f"key/value heads, {N_HEADS.describe()} ({N_HEADS.why}).")

    def check_budgets(self) -> None:
        """A budget plan's windows: one per group, each >= 1 where the group streams; their budgets S + W_g within
        ``budget``. Sets ``window`` to the largest streaming W_g."""
        windows = torch.as_tensor(self.windows)
        if windows.shape != self.full.shape or windows.is_floating_point() or windows.dtype == torch.bool:
            raise KVPlanError(f"A budget plan's windows are integers, one per key/value group {tuple(self.full.shape)};"
                              f" got {windows.dtype} {tuple(windows.shape)}.")
        self.windows = windows.long()
        check_window(self.sink, 1)
        bad = [(int(i), int(j)) for i, j in torch.nonzero(~self.full & (self.windows < 1)).tolist()]
        if bad:
            layer, group = bad[0]
            raise KVPlanError(f"Budget plan: layer {layer} group {group} has a budget of "
                              f"{self.sink + int(self.windows[layer, group])} tokens; a streaming group's budget is "
                              f"at least S + 1 = {self.sink + 1} (the sinks and the key itself), or null (full).")
        used = self.budget_tokens()
        if self.budget is not None:
            problem = PLAN_TOTAL(self.budget)
            if problem:
                raise KVPlanError(f"Budget plan total {self.budget!r} {problem} (tokens over all bounded groups).")
            if used > self.budget:
                raise KVPlanError(f"Budget plan: its groups' budgets sum to {used} tokens, more than its total "
                                  f"budget {self.budget}. Lower some budgets or raise the total.")
        stream = ~self.full
        self.window = int(self.windows[stream].max()) if bool(stream.any()) else max(int(self.window), 1)

    @property
    def is_budget(self) -> bool:
        return self.windows is not None

    def group_windows(self) -> torch.Tensor:
        """Long (L, H_kv): each group's window W_g (a one-window plan: ``window`` everywhere)."""
        if self.windows is not None:
            return self.windows.clone()
        return torch.full(self.full.shape, int(self.window), dtype=torch.long)

    def budgets(self) -> torch.Tensor:
        """Float (L, H_kv): tokens each group keeps, S + W_g, ``inf`` for a full group."""
        out = (self.sink + self.group_windows()).double()
        out[self.full] = float("inf")
        return out

    def budget_tokens(self) -> int:
        """Tokens the bounded (streaming) groups keep together: sum of S + W_g."""
        return int((self.sink + self.group_windows())[~self.full].sum())

    # -- shape -------------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.full.shape)

    @property
    def group_size(self) -> int:
        return self.n_heads // self.full.shape[1]

    def query_full(self) -> torch.Tensor:
        """Bool (L, H): the plan per query head (a query head streams with its group)."""
        return self.full.repeat_interleave(self.group_size, dim=1)

    @classmethod
    def all_full(cls, shape: tuple[int, int], n_heads: int, sink: int = 4, window: int = 64) -> KVPlan:
        return cls(torch.ones(shape, dtype=torch.bool), n_heads, sink, window)

    def with_window(self, sink: int, window: int) -> KVPlan:
        """The same full / streaming grid at one sink and window (a budget plan's own windows are dropped)."""
        return KVPlan(self.full.clone(), self.n_heads, sink, window, dict(self.meta), compensation=self.compensation)

    # -- fitting a model -----------------------------------------------------------------------------------------
    def check_fits(self, adapter) -> None:
        """Refuse a plan for an encoder (no cache: its queries see every key) or for another grid."""
        check_decoder(adapter)
        want = (len(adapter.blocks), adapter.n_kv_heads)
        if self.shape != want or self.n_heads != adapter.n_heads:
            raise KVPlanError(
                f"This KV plan is for {self.shape[0]} blocks x {self.shape[1]} key/value heads ({self.n_heads} query "
                f"heads); the model has {want[0]} x {want[1]} ({adapter.n_heads} query heads). Make a plan for this "
                "model (headprune kvplan).")

    # -- files ---------------------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        # written only when set, so a plan without the token is byte for byte the file it always was
        extra = {"compensation": True} if self.compensation else {}
        if self.is_budget:
            budgets = [[None if f else self.sink + int(w) for f, w in zip(frow.tolist(), wrow.tolist())]
                       for frow, wrow in zip(self.full, self.windows)]
            return {"format": FORMAT, "version": 2, "kind": "budgets", "shape": list(self.shape),
                    "n_heads": self.n_heads, "sink": self.sink, "budget": self.budget, "budgets": budgets,
                    **extra, **self.meta}
        full = {str(layer): [int(g) for g in torch.nonzero(row).flatten()] for layer, row in enumerate(self.full)}
        return {"format": FORMAT, "version": 1, "shape": list(self.shape), "n_heads": self.n_heads,
                "sink": self.sink, "window": self.window, "full": full, **extra, **self.meta}

    @classmethod
    def from_json(cls, obj) -> KVPlan:
        if not isinstance(obj, dict) or obj.get("format") != FORMAT:
            raise KVPlanError(f'A KV plan is a JSON object with "format": "{FORMAT}" (write one with headprune '
                              "kvplan); this one has none.")
        version = obj.get("version", 1)   # files written before the field existed are version 1
        if isinstance(version, bool) or version not in VERSIONS:
            raise KVPlanError(f"KV plan version {version!r} is not one this headprune reads (accepted: "
                              f"{', '.join(map(str, VERSIONS))}); write the plan again with this headprune's kvplan.")
        if version == 2:
            return cls.budgets_from_json(obj)
        if "budgets" in obj or obj.get("kind") == "budgets":   # would be kept as metadata and never applied
            raise KVPlanError('Per-group "budgets" (and "kind") belong to a version-2 plan; this file says version '
                              f"{version}. Set \"version\": 2, \"kind\": \"budgets\", or remove them.")
        missing = [k for k in ("shape", "n_heads", "full") if k not in obj]
        if missing:
            raise KVPlanError(f"KV plan misses {', '.join(missing)}: a plan names its shape [L, H_kv], n_heads and "
                              'full {"<layer>": [group, ...]}.')
        shape = check_shape(obj["shape"])
        full = torch.zeros(shape, dtype=torch.bool)
        if not isinstance(obj["full"], dict):
            raise KVPlanError('KV plan "full" must be an object {"<layer>": [group, ...]}.')
        for key, groups in obj["full"].items():
            if not (str(key).isascii() and str(key).isdigit()) or not int(key) < shape[0]:   # int('²') raises
                raise KVPlanError(f"KV plan names layer {key!r}; the plan's layers are 0..{shape[0] - 1}.")
            if not isinstance(groups, list) or any(NON_NEGATIVE_INT(g) is not None or g >= shape[1] for g in groups):
                raise KVPlanError(f"KV plan layer {key}: groups must be a list of integers in 0..{shape[1] - 1}, "
                                  f"got {groups!r}.")
            full[int(key), groups] = True
        meta = {k: v for k, v in obj.items() if k not in ("format", "version", "shape", "n_heads", "sink", "window",
                                                          "full", "compensation", SIGNATURE)}
        return cls(full, obj["n_heads"], obj.get("sink", 4), obj.get("window", 64), meta,
                   compensation=obj.get("compensation", False))

    @classmethod
    def budgets_from_json(cls, obj: dict) -> KVPlan:
        """A version-2 budget plan (module doc); every key it does not know is kept as metadata."""
        if obj.get("kind") != "budgets":
            raise KVPlanError(f'A version-2 KV plan has "kind": "budgets"; this one has {obj.get("kind")!r}.')
        missing = [k for k in ("shape", "n_heads", "budgets") if k not in obj]
        if missing:
            raise KVPlanError(f"Budget plan misses {', '.join(missing)}: it names its shape [L, H_kv], n_heads and "
                              "budgets (one per group: S + W_g tokens, or null for a full group).")
        stray = [k for k in ("full", "window") if k in obj]
        if stray:   # a version-1 key in a budget plan would be ignored: refused instead
            raise KVPlanError(f"A budget plan names budgets per group (null = full), not {' or '.join(stray)}; "
                              "remove them, or write a version-1 plan.")
        shape, sink, rows = check_shape(obj["shape"]), obj.get("sink", 4), obj["budgets"]
        check_window(sink, 1)
        if not (isinstance(rows, list) and len(rows) == shape[0]
                and all(isinstance(r, list) and len(r) == shape[1] for r in rows)):
            raise KVPlanError(f"Budget plan budgets must be {shape[0]} lists of {shape[1]} values (its shape).")
        for row in rows:
            for value in row:
                if value is not None and GROUP_BUDGET(value):
                    raise KVPlanError(f"Budget plan budget {shown(repr(value))} must be a whole number of tokens "
                                      f">= 0, at most {GROUP_BUDGET.high:,} ({GROUP_BUDGET.why}): S + W_g, or null "
                                      "for a full group.")
        full = torch.tensor([[v is None for v in row] for row in rows], dtype=torch.bool)
        windows = torch.tensor([[0 if v is None else v - sink for v in row] for row in rows], dtype=torch.long)
        meta = {k: v for k, v in obj.items() if k not in ("format", "version", "kind", "shape", "n_heads", "sink",
                                                          "budget", "budgets", "compensation", SIGNATURE)}
        return cls(full, obj["n_heads"], sink, 1, meta, windows=windows, budget=obj.get("budget"),
                   compensation=obj.get("compensation", False))

    def write(self, path: str | Path, command: str = "kvplan") -> None:
        # whole or not at all, through the one module that owns outputs: its temporary name is its own, so a
        # user's "plan.json.tmp" (a file or a folder) is never replaced; signed (``outdir.signed``) so that a rerun
        # of ``command`` may replace the file it wrote, and the signature is no part of the plan when read back
        write_atomic(Path(path), json.dumps(signed(self.to_json(), command), indent=1))

    @classmethod
    def read(cls, path: str | Path) -> KVPlan:
        """The plan in the user's file ``path``, read by the one safe reader (``read_plan_file``)."""
        return cls.from_json(read_plan_file(path))

    # -- other tools' layouts (DuoAttention's folder: ``exports.write_duo_folder``) -------------------------------
    def refuse_compensation(self, where: str) -> None:
        """An export whose reader has no compensation token would stream without it: refused, not dropped."""
        if self.compensation:
            raise KVPlanError(f"This plan streams with RazorAttention's compensation token; {where} has no place for "
                              "it (its streaming heads would drop the far keys without it). Export the plan JSON, or "
                              "make the plan without --compensation.")

    def head_ids(self) -> dict:
        """A JSON of head ids other tools read: full and streaming (layer, kv head) pairs, and the query heads
        that read each kind."""
        pairs = lambda grid: [[int(i), int(j)] for i, j in torch.nonzero(grid).tolist()]  # noqa: E731
        return {"full_kv_heads": pairs(self.full), "streaming_kv_heads": pairs(~self.full),
                "full_query_heads": pairs(self.query_full()), "streaming_query_heads": pairs(~self.query_full()),
                "sink": self.sink, "window": self.window, "shape": list(self.shape), "n_heads": self.n_heads,
                **({"compensation": True} if self.compensation else {}),
                **({"budgets": self.to_json()["budgets"], "budget": self.budget} if self.is_budget else {})}

    # -- memory ----------------------------------------------------------------------------------------------------
    def ideal_bytes(self, length: int, head_dim: int, bytes_per_value: int, live: torch.Tensor | None = None) -> dict:
        """KV bytes at ``length`` tokens (batch 1) for the full cache and under the plan, counted (not measured).

        ``live``: bool (L, H_kv), groups with a query head left (a pruned group needs no cache at all)."""
        live = torch.ones(self.shape, dtype=torch.bool) if live is None else live
        per_token = 2 * head_dim * bytes_per_value        # one key and one value
        kept = (self.sink + self.group_windows()).clamp(max=length)
        kept[self.full] = length
        full = int(live.sum()) * length * per_token
        plan = int(kept[live].sum()) * per_token
        return {"full_cache": full, "plan": plan, "ratio": plan / full if full else 0.0}


def check_decoder(adapter) -> None:
    """Refuse an encoder (no cache) or a decoder whose family a plan cannot reach (``ModelAdapter.refuses``)."""
    if not adapter.causal:
        raise KVPlanError(f"A KV cache plan needs a decoder; {adapter.family or adapter.arch} is an encoder: it keeps "
                          "no key/value cache (every query sees every key of the row at once).")
    if "kv" in adapter.refuses:
        raise KVPlanError(f"A KV cache plan cannot run on {adapter.family or adapter.arch}: {adapter.refuses['kv']}")


def check_shape(shape) -> list[int]:
    """A plan's ``"shape"``: [blocks, key/value heads], each inside its limit (checked before anything is sized)."""
    if not (isinstance(shape, list) and len(shape) == 2):
        raise KVPlanError(f"KV plan shape {shown(repr(shape))} must be [blocks, key/value heads]: two integers.")
    for name, value, limit in (("blocks", shape[0], BLOCKS), ("key/value heads", shape[1], KV_HEADS)):
        if limit(value):
            raise KVPlanError(f"KV plan shape {shown(repr(shape))}: its {name} {shown(repr(value))} {limit(value)}.")
    return shape


PLAN_ACCEPTED = 'a KV plan JSON file as headprune kvplan writes it ({"format": "headprune-kv-plan", ...})'


def read_plan_file(path: str | Path) -> dict:
    """The JSON object of the user's plan file ``path``: a regular file (a FIFO or a device is refused before it is
    opened), at most ``MAX_FILE_BYTES``, nested at most ``MAX_JSON_DEPTH`` deep (``userinput.read_user_json``)."""
    return read_user_json(path, "KV plan file", PLAN_ACCEPTED, error=KVPlanError)


def top_share(scores: torch.Tensor, share: float) -> torch.Tensor:
    """Bool grid like ``scores`` with the round(share x n) highest scores True (ties: lower flat index first)."""
    check_full_share(share)
    scores = torch.as_tensor(scores)
    n = round(share * scores.numel())
    order = sorted(range(scores.numel()), key=lambda i: (-float(scores.flatten()[i]), i))
    full = torch.zeros(scores.numel(), dtype=torch.bool)
    full[order[:n]] = True
    return full.view(scores.shape)
