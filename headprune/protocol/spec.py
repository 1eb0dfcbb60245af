"""A protocol file: what one results table needs (models, data roles, criteria, sparsities or a trajectory,
metrics, repeats), read from TOML and validated once, before any model loads.

The file (``protocols/demo.toml`` is a commented example)::

    name = "demo"                       # names the run (default: the file's stem)
    models = ["demo"]                   # model specs; or [[models]] tables with their own data and metrics
    sparsities = [0.25, 0.5]            # pruned ratios of the head grid, each in [0, 1] (0 = the dense model)
    repeats = 2                         # re-drawn calibration subsets and criterion seeds (seed + repeat)
    [data.calib]                        # what criteria score on; [data.select] (where choices are made: HIES's
    source = "demo:train"               # α, SAP's k) and [data.eval] (what is reported) alike: source (any data
    size = 64                           # spec), size (rows; "all" for eval), text_col/pair_col/label_col
    # label_map = { entailment = "LABEL_1" }   # data label -> model label (top level or per [[models]] table);
    # labels_by_position = true, allow_untrained_head = true: the data-roles guards, as the CLI's flags
    [[criteria]]                        # one table per criterion: name, label (default: name), params
    name = "his"

A criterion with a ``sparsity`` parameter (SAP, SAP+CF) is scored at each cell's sparsity and evaluated at its
own selection there. SAP+CF's tolerance mode (the paper's CF: prune while the metric stays ≥ tolerance x dense)
is ``params = { sparsity = 0, tolerance = 0.9 }``: one cell per model and repeat instead of one per sparsity,
evaluated at the mask CF chose; its table row has sparsity "tolerance" and a "sparsity reached" column (a
protocol of tolerance cells only writes ``sparsities = [0]``: the dense cell). sap-cf's ``pool`` (a fraction of
the heads) must hold every target: a pool below a sparsity is an error naming ``params.pool`` and its line.

or, instead of ``sparsities``, a ``[trajectory]`` table (step, budget, count, tolerance, inverse = [false, true],
random_boxes = N independent random orders, report_at = ratios, mask_tolerance = τ: each cell saves the mask of
the last step within τ x dense on the selection rows, with its size, instead of the last step). ``[[paper]]``
tables carry a paper's values per cell (``PaperValues``), ``[table] baseline`` names the criterion of the "% vs"
column. Or a ``[kv]`` table alone (no sparsities, trajectory or criteria): KV cache plans of decoders, ``rules``
(razor, duo, far-mass, random or criterion names) x ``full_shares`` (shares of key/value heads kept full) at
``sink`` and ``window`` (``KVPart``), each cell the task's metrics under its plan. Roles are drawn with the protocol's
``seed`` (roles on one source are disjoint; each repeat re-draws the calibration rows outside the evaluation rows).
A key this module does not know, or a bad value, is a :class:`ProtocolError` naming the key and its line in the
file: TOML parsers give no line numbers for keys, so :class:`KeyLines` finds them by scanning the text for the
table headers and keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..criteria import get
from ..errors import HeadpruneError
from ..evaluation.harness import HarnessError, HarnessSpec, is_harness_metric, metric_tasks, parse_metric
from ..evaluation.metrics import Metrics
from ..evaluation.stability import STABILITY_METRICS
from ..kvcache.plan import FULL_SHARE, SINK, WINDOW
from ..kvcache.scores import REDUCE, check_rule
from ..limits import ROWS_PER_BATCH, SEED, TOKENS_PER_ROW, UNIT, Interval
from ..model.device import DEVICES
from ..model.loading import declared_causal, declared_refusal
from ..model.memory import MemoryBudgetError, parse_budget
from ..recovery.spec import RecoverySpec
from ..trajectory import INFLECTION_DROP, INFLECTION_WINDOW, TrajectoryError, TrajectorySpec, check_inflection
from ..userinput import bracket_depth, read_user_text

ROLES = ("calib", "select", "eval", "train")   # train: recovery's rows ([recovery])
# metric names a protocol may ask for: every field of Metrics that is a metric (new metrics join by themselves)
NOT_METRICS = ("n", "tokens")
# in a metrics list: the task's own set there (GLUE's for GLUE data), e.g. metrics = ["task", "agreement"]
TASK_SET = "task"
DTYPES = ("fp32", "bf16", "fp16")


# limits of the protocol's own keys, declared once, each with the reason it stops where it does: a plan lists,
# counts and times its cells by these numbers, so a number past them is refused before anything is allocated
REPEATS = Interval(1, 1000, integer=True, why="each repeat is a full set of scored cells, listed, planned and run "
                                               "one by one")
RANDOM_BOXES = Interval(0, 1000, integer=True, why="each box is one random-order trajectory cell")
ROLE_SIZE = Interval(1, 100_000_000, integer=True, why="rows drawn from a source, whose rows are read into memory; "
                                                       "checked against the source's row count before the first cell")


class ProtocolError(HeadpruneError):
    """A protocol file that cannot run as written: the message names the file, the line and the key."""


def metric_names() -> tuple[str, ...]:
    """Metric names a protocol may list (``Metrics`` fields less the counts, and the stability measures of
    ``evaluation.stability``: agreement with the dense model's answers, and answers kept under word drop)."""
    return tuple(f.name for f in dataclasses.fields(Metrics) if f.name not in NOT_METRICS) + STABILITY_METRICS


# -- where a key is written -------------------------------------------------------------------------------------

MAX_PROTOCOL_BYTES = 1 * 2**20   # a protocol is a page of settings; a larger file is no protocol (read before parsing)
PROTOCOL_ACCEPTED = "a regular file of UTF-8 TOML text (docs/how-to/protocols.md)"
MAX_SCANNED_LINE = 4096   # longer lines are left to the TOML parser: a key written there is named by its table's line
MAX_TOML_DEPTH = 32       # arrays and inline tables nested deeper are refused before parsing (the parser recurses)
MAX_KEY_PARTS = 32        # a dotted key or header of more parts is refused before parsing (tomllib: quadratic in it)
# what a scan of TOML text skips whole: the four kinds of strings, then comments (a bracket or a dot inside is text)
_TOML_SKIP = r'"""(?:\\.|[^\\])*?"""' r"|'''.*?'''" r'|"(?:\\.|[^"\\\n])*"' r"|'[^'\n]*'|#[^\n]*"
_TOML_TOKEN = re.compile(_TOML_SKIP + r"|[\[\]{}]", re.S)   # strings, comments, then the brackets
_KEY = re.compile(r"""^\s*((?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')(?:\s*\.\s*(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*'))*)\s*=""")
_INLINE_KEY = re.compile(r"""[{,]\s*([A-Za-z0-9_-]+|"[^"]*")\s*=""")


def _header(line: str) -> tuple[str, str] | None:
    """("[" or "[[", the dotted name) of a table header line, else None (a scan by hand: the regex it replaces,
    ``^\\s*(\\[\\[?)\\s*([^\\[\\]]+?)\\s*\\]\\]?\\s*(#.*)?$``, backtracked in polynomial time on "[" and spaces)."""
    stripped = line.strip()
    if not stripped.startswith("["):
        return None
    opening = "[[" if stripped.startswith("[[") else "["
    close = stripped.find("]")
    name = stripped[len(opening):close].strip() if close > 0 else ""
    if not name or "[" in name:
        return None
    rest = stripped[close + 1:]
    rest = (rest[1:] if rest.startswith("]") else rest).lstrip()
    return (opening, name) if not rest or rest.startswith("#") else None


def toml_depth(text: str) -> int:
    """The deepest nesting of arrays and inline tables in TOML ``text`` (brackets outside strings and comments;
    a table header counts its own brackets, 1 or 2)."""
    return bracket_depth(_TOML_TOKEN, text)


# a dotted-key chain, token by token: quoted strings and comments (skipped whole), a dot, a bare word, anything else
_KEY_TOKEN = re.compile(_TOML_SKIP + r"|\.|[A-Za-z0-9_+:-]+|\S", re.S)


def longest_key(text: str) -> int:
    """The most parts of a dotted chain (``a.b.c``: 3) outside comments, strings counting as one part. A number
    (``0.5``, a date-time's ``00.999``) is a chain of 2, so only keys and headers come near ``MAX_KEY_PARTS``."""
    if text.count(".") < MAX_KEY_PARTS:   # the common case: no chain can be that long
        return 0
    longest = parts = 0
    expect_part = True
    for token in _KEY_TOKEN.finditer(text):
        kind = token.group()
        if kind == ".":
            expect_part = True
            continue
        if kind[0] == "#" or not (kind[0].isalnum() or kind[0] in "_+-:\"'"):
            parts, expect_part = 0, True     # a comment, a bracket, "=", ",": the chain ends
            continue
        parts = parts + 1 if expect_part and parts else 1
        expect_part = False
        longest = max(longest, parts)
    return longest


def _split_dotted(text: str) -> list[str]:
    return [p.strip().strip("\"'") for p in re.findall(r"""\s*("[^"]*"|'[^']*'|[^.]+)\s*(?:\.|$)""", text)]


class KeyLines:
    """The line of every table and key of a TOML text, by path: ``("criteria", 1, "params", "alpha")``.

    Tables of an array (``[[criteria]]``) are numbered from 0 in order of appearance; keys of an inline table
    (``params = { alpha = 0.3 }``) get the line of that inline table. A line is found by a scan of the text (a
    header at the start of a line, then ``key =`` at the start of a line), skipping multi-line strings; a path
    not found gives the line of its nearest written parent.
    """

    def __init__(self, text: str):
        self.lines: dict[tuple, int] = {}
        arrays: dict[tuple, int] = {}
        table: tuple = ()
        in_string = None
        for number, line in enumerate(text.splitlines(), start=1):
            if in_string:
                if in_string in line:
                    in_string = None
                continue
            if len(line) > MAX_SCANNED_LINE:   # the scan's time stays linear in the file (a 1 MB line: milliseconds)
                continue
            header = _header(line)
            if header:
                names = tuple(_split_dotted(header[1]))
                path = self._resolve(names, arrays)
                if header[0] == "[[":
                    arrays[names] = arrays.get(names, -1) + 1
                    path = self._resolve(names, arrays)
                table = path
                self.lines.setdefault(path, number)
                continue
            key = _KEY.match(line)
            if key:
                path = table + tuple(_split_dotted(key.group(1)))
                self.lines.setdefault(path, number)
                rest = line[key.end():]
                for inner in _INLINE_KEY.findall(rest):
                    self.lines.setdefault(path + (inner.strip("\"'"),), number)
                for quote in ('"""', "'''"):
                    if rest.count(quote) % 2 == 1:
                        in_string = quote

    @staticmethod
    def _resolve(names: tuple, arrays: dict) -> tuple:
        """A header's path with the index of every array of tables it passes through (``[[models]]`` then
        ``[models.data.calib]`` is models, <last index>, data, calib)."""
        path: tuple = ()
        for i in range(len(names)):
            path += (names[i],)
            if names[:i + 1] in arrays:
                path += (arrays[names[:i + 1]],)
        return path

    def line(self, path: tuple) -> int | None:
        for end in range(len(path), 0, -1):
            if path[:end] in self.lines:
                return self.lines[path[:end]]
        return None


# -- the protocol ----------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Located:
    """What every part of a protocol shares: where it sits in the file, to name in errors."""

    path: tuple = ()                     # e.g. ("models", 0, "data", "calib")
    where: Callable[[tuple], str] | None = field(default=None, compare=False, repr=False)

    def fail(self, key: str | int | None, problem: str) -> ProtocolError:
        """A ProtocolError naming the key (dotted, e.g. ``data.calib.size``), its line and ``problem``."""
        path = self.path + ((key,) if key is not None else ())
        name = ".".join(str(p) for p in path) or "the file"
        place = self.where(path) if self.where else ""
        return ProtocolError(f"{place}key '{name}': {problem}")


def _unknown(part: Located, given: Mapping, cls: type, extra: tuple = ()) -> None:
    known = [f.name for f in dataclasses.fields(cls) if f.name not in ("path", "where")] + list(extra)
    for key in given:
        if key not in known:
            raise part.fail(key, f"unknown key; accepted: {', '.join(sorted(known))}.")


def _table(part: Located, key: str, value, kind: str = "a table") -> Mapping:
    if not isinstance(value, Mapping):
        raise part.fail(key, f"expected {kind}, got {value!r}.")
    return value


def _check(part: Located, key: str, value, limit, what: str) -> None:
    problem = limit(value)
    if problem:
        raise part.fail(key, f"{what} {value!r} {problem}.")


@dataclass(frozen=True, kw_only=True)
class Role(Located):
    """One data role: rows drawn (with the protocol's seed) from a data spec. ``size`` None = every row."""

    source: str
    size: int | None = None
    text_col: str | None = None
    pair_col: str | None = None
    label_col: str | None = None

    def __post_init__(self):
        if not isinstance(self.source, str) or not self.source:
            raise self.fail("source", f"expected a data spec (e.g. 'demo', 'demo:train', a file, "
                                      f"hf:NAME[:CONFIG[:SPLIT]]), got {self.source!r}.")
        if self.size is not None:
            _check(self, "size", self.size, ROLE_SIZE, "size")
        for key in ("text_col", "pair_col", "label_col"):
            if getattr(self, key) is not None and not isinstance(getattr(self, key), str):
                raise self.fail(key, f"expected a column name, got {getattr(self, key)!r}.")

    @classmethod
    def read(cls, obj, path: tuple, where) -> Role:
        part = Located(path=path[:-1], where=where)
        obj = dict(_table(part, path[-1], obj, "a table: source, size, seed"))
        part = Located(path=path, where=where)
        if "seed" in obj:
            raise part.fail("seed", "a data role has no seed of its own: every role is drawn with the protocol's "
                                    "seed (roles on one source are disjoint subsets of one permutation). Accepted: "
                                    "source, size, text_col, pair_col, label_col.")
        _unknown(part, obj, cls)
        if "source" not in obj:
            raise part.fail("source", "missing: every data role names its source (a data spec).")
        if obj.get("size") == "all":
            obj["size"] = None
        return cls(**obj, path=path, where=where)

    def to_json(self) -> dict:
        return {"source": self.source, "size": self.size,
                **{k: getattr(self, k) for k in ("text_col", "pair_col", "label_col") if getattr(self, k)}}


@dataclass(frozen=True, kw_only=True)
class CriterionEntry(Located):
    """A criterion of the registry with its parameters (checked against its declared limits)."""

    name: str
    label: str = ""
    params: Mapping = field(default_factory=dict)

    def __post_init__(self):
        try:
            crit = get(self.name)
        except HeadpruneError as exc:
            raise self.fail("name", str(exc)) from None
        if not isinstance(self.params, Mapping):
            raise self.fail("params", f"expected a table of parameters, got {self.params!r}.")
        params = Located(path=self.path + ("params",), where=self.where)
        for key in self.params:   # one at a time, so the error names the line of the parameter at fault
            try:
                crit.resolve_params({key: self.params[key]})
            except HeadpruneError as exc:
                raise params.fail(key, str(exc)) from None
        self.check_target(None)
        if not isinstance(self.label, str):
            raise self.fail("label", f"expected text, got {self.label!r}.")
        if not self.label:
            object.__setattr__(self, "label", self.name)

    def check_target(self, sparsity: float | None) -> None:
        """The parameters together, at a cell's ``sparsity`` when the criterion's own ``sparsity`` follows the cell
        (e.g. sap-cf's ``pool`` must hold its target); the error names ``params.pool`` when written, else params."""
        params = dict(self.params)
        if sparsity is not None and "sparsity" in self.criterion.params and "sparsity" not in params:
            params["sparsity"] = sparsity
        try:
            self.criterion.resolve_params(params)
        except HeadpruneError as exc:
            at = Located(path=self.path + ("params",), where=self.where)
            key = "pool" if "pool" in self.params else None
            raise at.fail(key, f"{exc}" + (f" (at the protocol's sparsity {sparsity:g})" if sparsity else "")
                          ) from None

    @property
    def tolerance_cells(self) -> bool:
        """A criterion run in its tolerance mode: sap-cf with ``sparsity = 0`` written in its params (the paper's
        CF: prune while the metric stays ≥ tolerance · dense). It gets one cell per model and repeat, not one per
        sparsity, evaluated at the mask CF chose; the table reports the sparsity it reached."""
        return "tolerance" in self.criterion.params and self.params.get("sparsity", None) == 0

    @property
    def criterion(self):
        return get(self.name)

    def to_json(self) -> dict:
        return {"name": self.name, "label": self.label, "params": dict(self.params)}


@dataclass(frozen=True, kw_only=True)
class TrajectoryPart(Located):
    """A trajectory instead of sparsities: step, stop (budget/count/tolerance), orders and random boxes."""

    step: int = 1
    budget: float | None = None
    count: int | None = None
    tolerance: float | None = None
    inverse: tuple = (False,)            # orders run: False = least important first (the criterion's order)
    random_boxes: int = 0                # independent random orders (boxplots per ratio), 0 = none
    report_at: tuple = ()                # ratios the table reports the metric at (the step at or below each)
    mask_tolerance: float | None = None  # the saved mask: the last step within τ x dense on the selection rows
    # which point the saved mask is: "tolerance" (the last step within mask_tolerance) or "inflection" (Greedy-Gnorm's
    # inflection point, trajectory.inflection_index, with `inflection = { drop, window }`); both points are reported
    mask_rule: str | None = None
    inflection: Mapping | None = None

    def __post_init__(self):
        if self.mask_rule is None and self.mask_tolerance is not None:
            object.__setattr__(self, "mask_rule", "tolerance")
        if self.mask_rule not in (None, "tolerance", "inflection"):
            raise self.fail("mask_rule", f"expected \"tolerance\" or \"inflection\", got {self.mask_rule!r}.")
        if self.mask_rule == "tolerance" and self.mask_tolerance is None:
            raise self.fail("mask_rule", "\"tolerance\" saves the last step within mask_tolerance: give "
                                         "mask_tolerance = τ too (e.g. 0.9).")
        if self.inflection is not None:
            if self.mask_rule is None:
                raise self.fail("inflection", "the inflection point is reported with a saved mask: give mask_rule "
                                              "= \"inflection\" (or mask_tolerance = τ, to report both points).")
            if not isinstance(self.inflection, Mapping) or set(self.inflection) - {"drop", "window"}:
                raise self.fail("inflection", f"expected {{ drop = SHARE, window = SHARE }}, got {self.inflection!r}.")
            try:
                check_inflection(self.inflection.get("drop", INFLECTION_DROP),
                                 self.inflection.get("window", INFLECTION_WINDOW))
            except TrajectoryError as exc:
                raise self.fail("inflection", str(exc)) from None
        inverse = self.inverse if isinstance(self.inverse, (list, tuple)) else (self.inverse,)
        if not inverse or any(not isinstance(v, bool) for v in inverse):
            raise self.fail("inverse", f"expected true, false or a list of them (orders to run), got "
                                       f"{self.inverse!r}.")
        object.__setattr__(self, "inverse", tuple(dict.fromkeys(inverse)))
        _check(self, "random_boxes", self.random_boxes, RANDOM_BOXES, "random_boxes")
        if not isinstance(self.report_at, (list, tuple)):
            raise self.fail("report_at", f"expected a list of ratios, got {self.report_at!r}.")
        for ratio in self.report_at:
            _check(self, "report_at", ratio, UNIT, "ratio")
        object.__setattr__(self, "report_at", tuple(float(r) for r in self.report_at))
        for key in ("step", "budget", "count", "tolerance", "mask_tolerance"):
            try:   # the trajectory's own limits, declared once in TrajectorySpec (mask_tolerance: a tolerance's)
                TrajectorySpec(criterion=get("random"), **{key.replace("mask_", ""): getattr(self, key)})
            except TrajectoryError as exc:
                raise self.fail(key, str(exc)) from None

    def spec(self, criterion, params: Mapping, inverse: bool, seed: int, metric: str | None) -> TrajectorySpec:
        """The TrajectorySpec of one cell: ``criterion`` (a Criterion) with ``params``, one order, one seed."""
        return TrajectorySpec(criterion=criterion, params=dict(params), inverse=inverse, step=self.step,
                              budget=self.budget, count=self.count, tolerance=self.tolerance, metric=metric,
                              seed=seed, track_select=self.mask_rule is not None)

    def inflection_params(self) -> dict:
        """The inflection detector's drop and window (the defaults where the table gives none)."""
        given = dict(self.inflection or {})
        return {"drop": given.get("drop", INFLECTION_DROP), "window": given.get("window", INFLECTION_WINDOW)}

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("step", "budget", "count", "tolerance", "random_boxes")} | \
            {"inverse": list(self.inverse), "report_at": list(self.report_at)} | \
            ({"mask_tolerance": self.mask_tolerance} if self.mask_tolerance is not None else {}) | \
            ({"mask_rule": self.mask_rule} if self.mask_rule == "inflection" else {}) | \
            ({"inflection": dict(self.inflection)} if self.inflection else {})


PROBE_ROWS = Interval(1, 10_000, integer=True, why="razor's repeated-token probes, one forward pass over them")


@dataclass(frozen=True, kw_only=True)
class KVPart(Located):
    """A ``[kv]`` table instead of sparsities: KV cache plans (``headprune.kvcache``). Each rule (razor, duo,
    far-mass, random or a criterion name: ``kvcache.scores``) scores the heads once per repeat; a cell per rule x
    full share x repeat keeps that share of the key/value groups full (the highest group scores,
    ``plan_from_scores``) and streams the rest (the first ``sink`` and last ``window`` keys, exactly), and reports
    the task's metrics under that plan.
    random draws one plan per repeat (seed + repeat): its repeats are the band."""

    rules: tuple = ()
    full_shares: tuple = ()
    sink: int = 4
    window: int = 64
    group: str = "max"                   # a group's score from its query heads' (kvcache.scores.REDUCE)
    probe_rows: int = 8                  # razor's probes

    def __post_init__(self):
        rules = self.rules if isinstance(self.rules, (list, tuple)) else None
        if not rules or any(not isinstance(r, str) for r in rules) or len(set(rules)) < len(rules):
            raise self.fail("rules", f"expected a list of distinct rule names (razor, duo, far-mass, random or a "
                                     f"criterion), "
                                     f"got {self.rules!r}.")
        for rule in rules:
            try:
                check_rule(rule)
            except HeadpruneError as exc:
                raise self.fail("rules", str(exc)) from None
        object.__setattr__(self, "rules", tuple(rules))
        if not isinstance(self.full_shares, (list, tuple)) or not self.full_shares:
            raise self.fail("full_shares", f"expected a list of shares of key/value heads kept full, each in [0, 1], "
                                           f"got {self.full_shares!r}.")
        for share in self.full_shares:
            _check(self, "full_shares", share, FULL_SHARE, "full share")
        object.__setattr__(self, "full_shares", tuple(sorted({float(x) for x in self.full_shares})))
        _check(self, "sink", self.sink, SINK, "sink (first keys a streaming head keeps)")
        _check(self, "window", self.window, WINDOW, "window (last keys a streaming head keeps, the key itself "
                                                    "included)")
        if self.group not in REDUCE:
            raise self.fail("group", f"unknown group reduction {self.group!r}; accepted: {', '.join(REDUCE)}.")
        _check(self, "probe_rows", self.probe_rows, PROBE_ROWS, "probe_rows")

    def to_json(self) -> dict:
        return {"rules": list(self.rules), "full_shares": list(self.full_shares), "sink": self.sink,
                "window": self.window, "group": self.group, "probe_rows": self.probe_rows}


def _metric(part: Located, key: str, name: str) -> str:
    """One metric name: headprune's (``metric_names``) or an lm-eval number "lm-eval:TASK/METRIC" (the task is
    checked against lm-eval's index when the run starts, before any model loads: ``cells.harness_tasks``)."""
    if is_harness_metric(name):
        try:
            parse_metric(name)
        except HarnessError as exc:
            raise part.fail(key, str(exc)) from None
        return name
    if name not in metric_names() + (TASK_SET,):
        raise part.fail(key, f"unknown metric {name!r}; accepted: {', '.join(metric_names())}, {TASK_SET} (the "
                             "task's own set), or an lm-eval number lm-eval:TASK/METRIC (e.g. "
                             "lm-eval:arc_easy/acc_norm).")
    return name


def _metrics(part: Located, key: str, value) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or any(not isinstance(m, str) for m in value):
        raise part.fail(key, f"expected a list of metric names, got {value!r}.")
    return tuple(_metric(part, key, m) for m in value)


def _headline(part: Located, value) -> str | None:
    if value == TASK_SET:
        raise part.fail("headline", f"{TASK_SET!r} names a metric set; a headline is one metric. Accepted: a metric "
                                    f"name ({', '.join(metric_names())}) or lm-eval:TASK/METRIC.")
    return None if value is None else _metric(part, "headline", value)


def slug(text: str) -> str:
    """``text`` as part of a file name: runs of other characters than letters, digits and ``._=-`` become "-"."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "-", text).strip("-") or "-"


@dataclass(frozen=True, kw_only=True)
class ModelEntry(Located):
    """A model spec with its data roles (the protocol's, overridden key by key) and metrics."""

    model: str
    name: str = ""
    data: Mapping = field(default_factory=dict)     # role -> Role
    metrics: tuple = ()                             # () = the task's set
    headline: str | None = None                     # None = the task's headline metric
    label_map: Mapping | None = None                # data label -> model id or label name (data.align_labels)
    labels_by_position: bool = False                # match unnamed labels by position
    allow_untrained_head: bool = False              # go on with a task head initialised on load
    # config.json key -> the value a paper's size table implies (e.g. vocab_size = 21128, num_labels = 3):
    # `run --plan` checks them against the model's config where it is on this machine or the hub answers
    expect_config: Mapping | None = None

    def __post_init__(self):
        if not isinstance(self.model, str) or not self.model:
            raise self.fail("model", f"expected a model spec ('demo', a folder, a hub id), got {self.model!r}.")
        if self.expect_config is not None and (not isinstance(self.expect_config, Mapping) or any(
                isinstance(v, bool) or not isinstance(v, (int, str)) for v in self.expect_config.values())):
            raise self.fail("expect_config", "expected a table of config.json key = integer or text (e.g. "
                                             f"{{ vocab_size = 21128, num_labels = 3 }}), got {self.expect_config!r}.")
        object.__setattr__(self, "metrics", _metrics(self, "metrics", self.metrics))
        object.__setattr__(self, "headline", _headline(self, self.headline))
        for role in ("calib", "eval"):
            if role not in self.data:
                raise self.fail("data", f"no [data.{role}] role: a protocol names the {role} data (source, size, "
                                        "seed) at the top or per model.")
        _label_guards(self, self)
        self.columns()   # one column name per key for every role: the workspace reads every source alike
        if not self.name:
            object.__setattr__(self, "name", self.model)

    def columns(self) -> dict:
        """text_col / pair_col / label_col as the roles name them (a ProtocolError when two roles disagree)."""
        out = {}
        for key in ("text_col", "pair_col", "label_col"):
            named = {role: getattr(r, key) for role, r in self.data.items() if getattr(r, key) is not None}
            if len(set(named.values())) > 1:
                role = sorted(named)[-1]
                raise self.data[role].fail(key, f"{named[role]!r} differs from another role's "
                                                f"({', '.join(f'{r}: {v}' for r, v in named.items())}); the roles "
                                                "of a model read their sources with one column name per key.")
            out[key] = next(iter(named.values()), None)
        return out

    @property
    def harness_metrics(self) -> tuple[str, ...]:
        """The lm-eval numbers this model's table reports ("lm-eval:TASK/METRIC")."""
        return tuple(m for m in self.metrics if is_harness_metric(m))

    def to_json(self) -> dict:
        return {"name": self.name, "model": self.model, "data": {k: r.to_json() for k, r in self.data.items()},
                "metrics": list(self.metrics), "headline": self.headline,
                **{k: getattr(self, k) for k in GUARDS if getattr(self, k)},
                **({"expect_config": dict(self.expect_config)} if self.expect_config else {})}


GUARDS = ("label_map", "labels_by_position", "allow_untrained_head")   # the data-roles guards a protocol sets


def _label_guards(part: Located, given) -> None:
    """``label_map`` a table of data label -> model id or label name; the two flags true or false."""
    value = getattr(given, "label_map", None) if not isinstance(given, Mapping) else given.get("label_map")
    if value is not None and (not isinstance(value, Mapping) or any(
            not isinstance(v, (str, int)) or isinstance(v, bool) for v in value.values())):
        raise part.fail("label_map", f"expected a table of data label = model label name or id (e.g. "
                                     f"{{ entailment = \"LABEL_1\" }}), got {value!r}.")
    for key in GUARDS[1:]:
        flag = getattr(given, key, False) if not isinstance(given, Mapping) else given.get(key, False)
        if not isinstance(flag, bool):
            raise part.fail(key, f"expected true or false, got {flag!r}.")


def _read_data(obj, path: tuple, where, inherited: Mapping | None = None) -> dict:
    part = Located(path=path[:-1], where=where)
    obj = _table(part, path[-1], obj, "a table of roles: calib, select, eval")
    part = Located(path=path, where=where)
    for key in obj:
        if key not in ROLES:
            raise part.fail(key, f"unknown data role; accepted: {', '.join(ROLES)}.")
    roles = dict(inherited or {})
    for key, value in obj.items():
        if key in roles and isinstance(value, Mapping):   # a model's role overrides the protocol's key by key
            value = {**roles[key].to_json(), **value}
        roles[key] = Role.read(value, path + (key,), where)
    return roles


@dataclass(frozen=True, kw_only=True)
class PaperValues(Located):
    """One ``[[paper]]`` table: a paper's reported values of one model's metric, cited by table and row, to print
    beside ours (``results.md``: paper | ours | delta). Keys other than model / metric / cite are criterion labels,
    each an inline table of sparsity -> value (``his = { "0.1" = 0.8888 }``), or ``dense = VALUE``. Values are in
    headprune's units (fractions: a paper's 88.76 % is 0.8876)."""

    model: str
    metric: str
    cite: str
    values: Mapping = field(default_factory=dict)   # criterion label -> {sparsity: value}

    def __post_init__(self):
        for key in ("model", "cite"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise self.fail(key, f"expected text (the model's name; the paper's table and row), got "
                                     f"{getattr(self, key)!r}.")
        _metric(self, "metric", self.metric)
        values = {}
        for label, cells in self.values.items():
            if label == "dense":
                cells = {"0": cells}
            if not isinstance(cells, Mapping):
                raise self.fail(label, f"expected {{ \"SPARSITY\" = VALUE, ... }}, got {cells!r}.")
            here = Located(path=self.path + (label,), where=self.where)
            values[label], spelled = {}, {}
            for ratio, value in cells.items():
                try:
                    at = float(ratio)
                except ValueError:
                    raise here.fail(ratio, "expected a sparsity as the key (e.g. \"0.5\").") from None
                if UNIT(at):
                    raise here.fail(ratio, f"the sparsity {ratio!r} {UNIT(at)} (a pruned share of the heads).")
                if at in spelled:   # "0.5" and "0.50" name one sparsity: one value would silently replace the other
                    raise here.fail(ratio, f"\"{spelled[at]}\" and \"{ratio}\" are the same sparsity {at:g}; give "
                                           "each sparsity once.")
                spelled[at] = ratio
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise here.fail(ratio, f"expected a finite number (the paper's value), got {value!r}.")
                values[label][at] = float(value)
        object.__setattr__(self, "values", values)

    @classmethod
    def read(cls, obj, i: int, where) -> PaperValues:
        part = Located(path=("paper", i), where=where)
        obj = dict(_table(Located(path=("paper",), where=where), i, obj, "a [[paper]] table"))
        for key in ("model", "metric", "cite"):
            if key not in obj:
                raise part.fail(key, "missing: a [[paper]] table names model, metric and cite (the paper's table "
                                     "and row), then criterion = { \"SPARSITY\" = VALUE } lines.")
        fixed = {k: obj.pop(k) for k in ("model", "metric", "cite")}
        return cls(**fixed, values=obj, path=("paper", i), where=where)

    def to_json(self) -> dict:
        return {"model": self.model, "metric": self.metric, "cite": self.cite,
                "values": {c: {f"{s:g}": v for s, v in cells.items()} for c, cells in self.values.items()}}


TABLE_KEYS = ("baseline",)


@dataclass(frozen=True, kw_only=True)
class Protocol(Located):
    """A whole protocol (module doc), validated on construction; :meth:`read` builds it from a file."""

    name: str
    description: str = ""
    models: tuple = ()                   # ModelEntry
    criteria: tuple = ()                 # CriterionEntry
    sparsities: tuple = ()               # ratios; empty with a trajectory
    trajectory: TrajectoryPart | None = None
    kv: KVPart | None = None                     # [kv]: cache plans per rule and full share instead of masks
    repeats: int = 1
    seed: int = 0
    memory_budget: str | int | None = None
    device: str = "auto"
    dtype: str | None = None
    batch_size: int = 32
    max_length: int = 128
    recovery: RecoverySpec | None = None         # [recovery]: every pruned cell also recovered on data.train
    lm_eval: Mapping = field(default_factory=dict)   # [lm_eval]: how lm-eval metrics run (HarnessSpec's fields)
    paper: tuple = ()                            # [[paper]]: PaperValues, printed beside ours
    table: Mapping = field(default_factory=dict)  # [table]: baseline = a criterion label ("% vs" column)
    text: str = field(default="", repr=False)     # the file as written (hashed into the run file)
    source: str = ""                               # the file's path

    def __post_init__(self):
        for key in ("name", "description"):
            if not isinstance(getattr(self, key), str) or (key == "name" and not self.name):
                raise self.fail(key, f"expected text, got {getattr(self, key)!r}.")
        if not self.models:
            raise self.fail("models", "no model: list at least one model spec (models = [\"demo\"]).")
        if not self.criteria and self.kv is None:
            raise self.fail("criteria", "no criterion: add at least one [[criteria]] table with a name.")
        names = [m.name for m in self.models]
        if len(set(names)) < len(names):
            raise self.fail("models", f"two models share a name ({', '.join(names)}); give each [[models]] table "
                                      "a distinct name.")
        labels = [c.label for c in self.criteria]
        if len(set(labels)) < len(labels):
            raise self.fail("criteria", f"two criteria share a label ({', '.join(labels)}); give each a distinct "
                                        "label.")
        # names and labels become file names (``slug``; case-insensitive on some file systems): two that map to
        # one file would make two cells write it, and the table report one's numbers under the other's name
        for key, given in (("models", names), ("criteria", labels)):
            seen: dict[str, str] = {}
            for text in given:
                other = seen.setdefault(slug(text).casefold(), text)
                if other != text:
                    raise self.fail(key, f"{other!r} and {text!r} name the same result files ({slug(text)!r}: "
                                         "letters, digits and ._=- are kept, other runs become '-', case is "
                                         "ignored); give them names that differ there.")
        if self.kv is not None:
            self._check_kv()
        elif (self.trajectory is None) == (not self.sparsities):
            raise self.fail("sparsities", "give either sparsities = [...] or a [trajectory] table (not both).")
        if not isinstance(self.sparsities, (list, tuple)):
            raise self.fail("sparsities", f"expected a list of ratios, got {self.sparsities!r}.")
        for ratio in self.sparsities:
            _check(self, "sparsities", ratio, UNIT, "sparsity")
        object.__setattr__(self, "sparsities", tuple(sorted({float(r) for r in self.sparsities})))
        for c in self.criteria:   # a parameter that depends on the cell's sparsity (sap-cf's pool) at each one
            for ratio in self.sparsities:
                if ratio > 0:
                    c.check_target(ratio)
        _check(self, "repeats", self.repeats, REPEATS, "repeats")
        _check(self, "seed", self.seed, SEED, "seed")
        _check(self, "batch_size", self.batch_size, ROWS_PER_BATCH, "batch_size")
        _check(self, "max_length", self.max_length, TOKENS_PER_ROW, "max_length")
        if self.device not in DEVICES:
            raise self.fail("device", f"unknown device {self.device!r}; accepted: {', '.join(DEVICES)}.")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise self.fail("dtype", f"unknown dtype {self.dtype!r}; accepted: {', '.join(DTYPES)}.")
        if self.recovery is not None and self.trajectory is not None:
            raise self.fail("recovery", "recovery applies to sparsity cells; a [trajectory] protocol has none. "
                                        "Accepted: [recovery] with sparsities = [...].")
        for entry in self.models:
            if (self.recovery is None) != ("train" not in entry.data):
                raise entry.fail("data", "a [recovery] table and a [data.train] role go together: recovery trains "
                                         "on the train role's rows. Accepted: both (recovered cells) or neither.")
        for entry in self.models:
            self._check_harness(entry)
        self._check_paper()
        if self.memory_budget is not None:
            try:
                parse_budget(str(self.memory_budget))
            except MemoryBudgetError as exc:
                raise self.fail("memory_budget", str(exc)) from None

    def _check_kv(self) -> None:
        """A [kv] protocol's cells are its rules x full shares: no sparsities, trajectory, criteria, recovery or
        paper values beside them; task metrics only (no lm-eval or stability numbers under a plan yet); decoders
        only (an encoder keeps no cache: refused by what its name or config.json says, before weights load)."""
        kv = self.kv
        for key, given in (("sparsities", self.sparsities), ("trajectory", self.trajectory),
                           ("criteria", self.criteria), ("recovery", self.recovery), ("paper", self.paper)):
            if given:
                raise self.fail(key, f"a [kv] protocol's cells are kv.rules x kv.full_shares; '{key}' has no place "
                                     "beside them (a criterion's name works as a kv rule). Accepted: [kv] alone, or "
                                     "that key without [kv].")
        for entry in self.models:
            if declared_causal(entry.model) is False:
                raise kv.fail(None, f"model {entry.model!r} ({entry.name}) is an encoder: a KV cache plan needs a "
                                    "decoder (an encoder keeps no key/value cache; every query sees every key at "
                                    "once). Accepted: causal LMs such as demo-lm or demo-circuit.")
            refused = declared_refusal(entry.model, "kv")
            if refused:
                raise kv.fail(None, f"model {entry.model!r} ({entry.name}) cannot take a KV cache plan: {refused}")
            other = [m for m in entry.metrics if is_harness_metric(m) or m in STABILITY_METRICS]
            if other:
                raise entry.fail("metrics", f"{', '.join(other)}: a [kv] cell reports the task's metrics under its "
                                            "plan. Accepted: the task's metrics (loss, perplexity, "
                                            "next_token_accuracy, ...).")

    def _check_paper(self) -> None:
        """Paper values name cells the protocol has (model, criterion, sparsity); [table]'s baseline a criterion."""
        labels = [c.label for c in self.criteria]
        unknown = [k for k in self.table if k not in TABLE_KEYS]
        if unknown:
            raise self.fail("table", f"unknown key {unknown[0]!r}; accepted: {', '.join(TABLE_KEYS)}.")
        if "baseline" in self.table and self.table["baseline"] not in labels:
            raise Located(path=("table",), where=self.where).fail(
                "baseline", f"{self.table['baseline']!r} is not a criterion of this protocol; accepted: "
                            f"{', '.join(labels)}.")
        if self.paper and self.trajectory is not None:
            raise self.paper[0].fail(None, "paper values sit beside sparsity cells; a [trajectory] protocol has "
                                           "none. Accepted: [[paper]] with sparsities = [...].")
        names = [m.name for m in self.models]
        for entry in self.paper:
            if entry.model not in names:
                raise entry.fail("model", f"{entry.model!r} is not a model of this protocol; accepted: "
                                          f"{', '.join(names)}.")
            for label, cells in entry.values.items():
                here = Located(path=entry.path + (label,), where=self.where)
                if label != "dense" and label not in labels:
                    raise entry.fail(label, f"no criterion labelled {label!r} in this protocol; accepted: dense, "
                                            f"{', '.join(labels)} (a cell the protocol does not have).")
                allowed = [0.0] if label == "dense" else [r for r in self.sparsities if r > 0]
                for ratio in cells:
                    if not any(abs(ratio - r) < 1e-9 for r in allowed):
                        raise here.fail(f"{ratio:g}", f"sparsity {ratio:g} is not a cell of this protocol; "
                                                      f"accepted: {', '.join(f'{r:g}' for r in allowed)}.")

    def _check_harness(self, entry: ModelEntry) -> None:
        """lm-eval metrics are measured on masks (one lm-eval run per cell, or per reported ratio of a trajectory),
        never after every step: a trajectory reports them at ``report_at``, and reads its own metric."""
        if is_harness_metric(entry.headline or "") and self.trajectory is not None:
            raise entry.fail("headline", f"{entry.headline!r}: a trajectory's headline is read after every step "
                                         "(curves, AUC, tolerance); an lm-eval number is measured at "
                                         "trajectory.report_at only. Accepted: a headprune metric as headline, "
                                         "lm-eval numbers in metrics.")
        if entry.harness_metrics and self.trajectory is not None and not self.trajectory.report_at:
            raise self.trajectory.fail("report_at", "lm-eval metrics in a trajectory protocol are measured at "
                                                    "the reported ratios: give report_at = [0.1, 0.2, ...].")
        stable = [m for m in entry.metrics if m in STABILITY_METRICS]
        if stable and self.trajectory is not None:
            raise entry.fail("metrics", f"{', '.join(stable)}: a trajectory protocol's table reads its headline "
                                        "(AUC, report_at). Accepted: stability measures with sparsities = [...], or "
                                        "`headprune trajectory --metric agreement` / `--stability`.")
        if stable and self.recovery is not None:
            raise entry.fail("metrics", f"{', '.join(stable)}: not measured on recovered models yet. Accepted: "
                                        "stability measures without [recovery], or [recovery] with the task's "
                                        "metrics.")
        if entry.harness_metrics and self.recovery is not None:
            raise entry.fail("metrics", f"lm-eval metrics ({', '.join(entry.harness_metrics)}) are not measured on "
                                    "recovered models yet; run `headprune evaluate --lm-eval TASKS` on a recovered "
                                    "model folder (`headprune recover --out DIR`). Accepted: lm-eval metrics "
                                    "without [recovery], or [recovery] with headprune's metrics.")

    def harness_spec(self, entry: ModelEntry) -> HarnessSpec | None:
        """The lm-eval run of ``entry``'s lm-eval metrics ([lm_eval] settings, the protocol's seed); None: none."""
        if not entry.harness_metrics:
            return None
        return HarnessSpec(tasks=metric_tasks(entry.harness_metrics), seed=self.seed, **self.lm_eval)

    @property
    def hash(self) -> str:
        """sha256 of the file as written."""
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    @classmethod
    def read(cls, path: str | Path) -> Protocol:
        """The protocol in the TOML file ``path`` (ProtocolError naming the line of any problem)."""
        path = Path(path)
        # what a protocol file may be (docs/reference/formats.md): a regular file of UTF-8 TOML text of at most
        # MAX_PROTOCOL_BYTES, wherever its links lead (it is the user's own file, read with the user's rights); a
        # FIFO, a device or a socket is refused before it is opened, and an error names a key and a line, never
        # the file's lines, so a link to another file (/etc/passwd) shows nothing of it
        text = read_user_text(path, "Protocol file", PROTOCOL_ACCEPTED, max_bytes=MAX_PROTOCOL_BYTES,
                              error=ProtocolError)
        return cls.parse(text, str(path), default_name=path.stem)

    @classmethod
    def parse(cls, text: str, source: str = "<protocol>", default_name: str = "protocol") -> Protocol:
        """The protocol in TOML ``text`` (``source`` names it in errors)."""
        try:
            obj = parse_toml(text)
        except ValueError as exc:   # tomllib.TOMLDecodeError and toml's TomlDecodeError are ValueErrors
            raise ProtocolError(f"{source}: not valid TOML: {exc}.") from None
        lines = KeyLines(text)

        def where(path: tuple) -> str:
            line = lines.line(path)
            return f"{source}, line {line}: " if line else f"{source}: "

        top = Located(where=where)
        _unknown(top, obj, cls, extra=("data", "metrics", "headline") + GUARDS)
        paper = obj.get("paper", [])
        if not isinstance(paper, list):
            raise top.fail("paper", f"expected [[paper]] tables, got {paper!r}.")
        paper = tuple(PaperValues.read(item, i, where) for i, item in enumerate(paper))
        table = dict(_table(top, "table", obj.get("table", {}), "a table: baseline = CRITERION"))
        for key in ("text", "source"):
            if key in obj:
                raise top.fail(key, f"unknown key; '{key}' is recorded by headprune, not written in the file.")
        if "metrics" in obj:   # checked here too, so an error names the protocol-wide key and its line
            _metrics(top, "metrics", obj["metrics"])
        _headline(top, obj.get("headline"))
        _label_guards(top, obj)   # checked here too, so an error names the protocol-wide key and its line
        data = _read_data(obj.get("data", {}), ("data",), where)
        models = obj.get("models", [])
        if not isinstance(models, list):
            raise top.fail("models", f"expected a list of model specs or [[models]] tables, got {models!r}.")
        entries = []
        for i, item in enumerate(models):
            here = Located(path=("models", i), where=where)
            if isinstance(item, str):
                item = {"model": item}
            item = dict(_table(Located(path=("models",), where=where), i, item, "a model spec or a table"))
            _unknown(here, item, ModelEntry)
            if "model" not in item:
                raise here.fail("model", "missing: each [[models]] table names its model spec.")
            roles = _read_data(item.pop("data", {}), ("models", i, "data"), where, inherited=data)
            item.setdefault("metrics", obj.get("metrics", ()))
            item.setdefault("headline", obj.get("headline"))
            for key in GUARDS:
                if key in obj:
                    item.setdefault(key, obj[key])
            entries.append(ModelEntry(**item, data=roles, path=("models", i), where=where))
        crits = obj.get("criteria", [])
        if not isinstance(crits, list):
            raise top.fail("criteria", f"expected [[criteria]] tables or a list of names, got {crits!r}.")
        criteria = []
        for i, item in enumerate(crits):
            if isinstance(item, str):
                item = {"name": item}
            item = _table(Located(path=("criteria",), where=where), i, item, "a criterion name or a table")
            here = Located(path=("criteria", i), where=where)
            _unknown(here, item, CriterionEntry)
            if "name" not in item:
                raise here.fail("name", "missing: each criterion names one of the registry (headprune criteria).")
            criteria.append(CriterionEntry(**item, path=("criteria", i), where=where))
        recovery = _read_recovery(obj, top, where) if "recovery" in obj else None
        lm_eval = _read_lm_eval(obj, top, where, Path(source).parent) if "lm_eval" in obj else {}
        kv = None
        if "kv" in obj:
            part = _table(top, "kv", obj["kv"], "a table: rules, full_shares, sink, window, group, probe_rows")
            _unknown(Located(path=("kv",), where=where), part, KVPart)
            kv = KVPart(**part, path=("kv",), where=where)
        trajectory = None
        if "trajectory" in obj:
            part = _table(top, "trajectory", obj["trajectory"])
            _unknown(Located(path=("trajectory",), where=where), part, TrajectoryPart)
            trajectory = TrajectoryPart(**part, path=("trajectory",), where=where)
        rest = {k: v for k, v in obj.items() if k not in ("data", "models", "criteria", "trajectory", "kv",
                                                         "metrics", "headline", "recovery", "lm_eval", "paper",
                                                         "table") + GUARDS}
        rest.setdefault("name", default_name)
        return cls(**rest, models=tuple(entries), criteria=tuple(criteria), trajectory=trajectory, kv=kv,
                   recovery=recovery,
                   lm_eval=lm_eval, paper=paper, table=table, text=text,
                   source=source, where=where)

    def to_json(self) -> dict:
        """Parameters as resolved (what the run file records next to the text and its hash)."""
        return {"name": self.name, "description": self.description, "models": [m.to_json() for m in self.models],
                "criteria": [c.to_json() for c in self.criteria], "sparsities": list(self.sparsities),
                "trajectory": self.trajectory.to_json() if self.trajectory else None,
                **({"kv": self.kv.to_json()} if self.kv else {}), "repeats": self.repeats,
                "seed": self.seed, "memory_budget": self.memory_budget, "device": self.device, "dtype": self.dtype,
                "batch_size": self.batch_size, "max_length": self.max_length,
                "recovery": self.recovery.to_json() if self.recovery else None, "lm_eval": dict(self.lm_eval),
                **({"paper": [p.to_json() for p in self.paper]} if self.paper else {}),
                **({"table": dict(self.table)} if self.table else {})}


def _read_recovery(obj: Mapping, top: Located, where) -> RecoverySpec:
    """The [recovery] table as a RecoverySpec (its keys are the spec's fields); the protocol's seed and max_length
    unless set. Each key is checked on its own first, so a bad value is named with its key and line."""
    given = dict(_table(top, "recovery", obj["recovery"], "a table of recovery settings (RecoverySpec's fields)"))
    part = Located(path=("recovery",), where=where)
    known = [f.name for f in dataclasses.fields(RecoverySpec)]
    for key, value in given.items():
        if key not in known:
            raise part.fail(key, f"unknown key; accepted: {', '.join(known)}.")
        try:
            RecoverySpec(**{key: value})
        except (HeadpruneError, TypeError) as exc:
            raise part.fail(key, str(exc)) from None
    given.setdefault("seed", obj.get("seed", 0))
    given.setdefault("max_length", obj.get("max_length", 128))
    try:
        return RecoverySpec(**given)
    except (HeadpruneError, TypeError) as exc:
        raise part.fail(None, str(exc)) from None


LM_EVAL_KEYS = ("limit", "include", "num_fewshot", "batch_size", "apply", "bootstrap_iters")


def _read_lm_eval(obj: Mapping, top: Located, where, folder: Path) -> dict:
    """The [lm_eval] table: HarnessSpec's settings (LM_EVAL_KEYS; tasks come from the lm-eval metrics, the seed is
    the protocol's). ``include`` folders are relative to the protocol file's folder. Each key is checked alone."""
    given = dict(_table(top, "lm_eval", obj["lm_eval"], f"a table of lm-eval settings: {', '.join(LM_EVAL_KEYS)}"))
    part = Located(path=("lm_eval",), where=where)
    if isinstance(given.get("include"), str):
        given["include"] = [given["include"]]
    for key, value in given.items():
        if key not in LM_EVAL_KEYS:
            raise part.fail(key, f"unknown key; accepted: {', '.join(LM_EVAL_KEYS)}.")
        if key == "include":
            if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
                raise part.fail(key, f"expected a folder or a list of folders, got {value!r}.")
            value = tuple(str((folder / Path(v).expanduser()).resolve()) for v in value)
            given[key] = value
        try:
            HarnessSpec(tasks=("any",), **{key: value})
        except (HeadpruneError, TypeError) as exc:
            raise part.fail(key, str(exc)) from None
    return given


def parse_toml(text: str) -> dict:
    """TOML text as a dict: ``tomllib`` (Python 3.11+), else the ``toml`` package. Arrays or inline tables nested
    deeper than ``MAX_TOML_DEPTH`` are a ValueError (the parsers recurse: 3,000 levels are a RecursionError)."""
    depth = toml_depth(text)
    if depth > MAX_TOML_DEPTH:
        raise ValueError(f"arrays or inline tables nested {depth} deep; accepted: at most {MAX_TOML_DEPTH} levels")
    parts = longest_key(text)
    if parts > MAX_KEY_PARTS:
        raise ValueError(f"a dotted key or table header of {parts} parts; accepted: at most {MAX_KEY_PARTS}")
    try:
        import tomllib  # deferred: Python 3.11+ only (3.10 falls back to toml)
    except ModuleNotFoundError:  # Python 3.10: streamlit depends on the `toml` package
        import toml  # deferred: the 3.10 fallback, a dependency of streamlit

        return toml.loads(text)
    return tomllib.loads(text)
