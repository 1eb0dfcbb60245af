"""A dashboard view as a query string, both ways: ``ViewState`` (checked once, when built) and its codec.

Pure (no streamlit, no model): the dashboard binds it to the browser's address bar (``dashboard/urlstate.py``) and
a lesson can check one of its steps with it. A link names only what a user could pick from the dashboard's menus:
``from_query`` is told the accepted pages, models, data and criteria, and the head grid's ``shape`` when known;
anything else is dropped with one line saying what was dropped and what is accepted, and the rest still applies.

Keys (all optional; README "Shareable views for teaching" lists them for users)::

    page=prune  model=demo  data=demo  mask=0.3,2.1-4,5.*  head=1.4  criteria=ae,his  criterion=kl  ratio=0.5
    rows=64  sentence=the+film+was+fine  roles=0  kv=razor_25_4_16_4096_0.0,1.1  lesson=induction  step=2

``criterion`` is the Prune page's one criterion (its "Apply" prunes the lowest ``ratio`` by it), ``criteria`` the
Head scores page's set. ``rows`` is the number of evaluation rows the view's numbers are measured on (the first
``rows`` of the evaluation split): a link carries it so that the same link shows the same numbers on any server,
however loaded (issue 45 item 3). ``lesson`` and ``step`` come together: one without the other is dropped, and
said.

Masks (``mask``, the heads pruned in the session; ``kv``'s full heads) use a compact form of ``layer.head`` items:
each side an integer, a range ``a-b`` or ``*`` (every layer / head of the grid), e.g. ``0-2.3`` = heads 3 of
layers 0, 1, 2. A leading ``~`` names the complement (the heads *not* in the set): ``to_query`` writes whichever
form is shorter, so a mask of all but two heads stays two items long. ``*`` and ``~`` need the grid's shape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields

from .errors import HeadpruneError
from .limits import Interval

# The dashboard's pages by their address names (``?page=NAME``), in its navigation order. dashboard/ui.py's PAGES
# gives each its file, title and icon (tests/test_lessons.py checks the two lists agree); they live here too so that
# the library (``headprune lessons check``) can check a lesson's pages without importing the dashboard.
PAGE_NAMES = ("model-and-data", "head-scores", "roles", "attention", "prune", "recover", "trajectories", "export",
              "kv-cache", "runs", "lessons", "heads", "example", "glossary")

KEYS = ("page", "model", "data", "mask", "head", "criteria", "criterion", "ratio", "rows", "sentence", "roles", "kv",
        "lesson", "step")

MAX_VALUE = 4000          # characters of one value (a compact mask of a 64 x 64 grid fits; 10 kB of junk does not)
MAX_SENTENCE = 500        # characters of a typed sentence
MAX_NAME = 100            # characters of a page / model / data / criterion / lesson name
MAX_CRITERIA = 16
MAX_GRID = 4096           # layers, and heads per layer, a link may name (any real model's grid fits)
MAX_HEADS = 65536         # heads a mask may list once expanded
MAX_STEP = 999
KV_SHARE = (0, 100)       # percent of key/value heads kept full
KV_SINK = (0, 64)         # first keys kept by a streaming head (the KV page's inputs)
KV_WINDOW = (1, 4096)     # last keys kept by a streaming head
KV_LENGTHS = tuple(2 ** k for k in range(8, 18))  # context lengths the KV page's bytes bar offers
KV_BUDGET = (0, 2**24)    # a budget plan's total tokens over all key/value groups (the KV page's input)
KV_BETA = (1.0, 1e6)      # HeadKV's β (the KV page's input)
# evaluation rows a link may ask for: any split a user can load fits (the CLI's and dashboard's default is 500)
ROWS = Interval(1, 10**6, integer=True, why="the evaluation rows a view's numbers are measured on")
TRUE, FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
LESSON = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")
# a typed sentence: printable text only (no control characters that could rewrite a terminal or hide a payload)
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
NUMBER = re.compile(r"[0-9]{1,4}")      # ASCII digits only: int() would also read other scripts' digits

Head = tuple[int, int]


class ViewStateError(HeadpruneError):
    """A ``ViewState`` built with a value outside what a link accepts."""


def _shown(value: str, limit: int = 40) -> str:
    """A user's value quoted for a message, cut to ``limit`` characters (a 10 kB value stays one line)."""
    text = value if len(value) <= limit else value[:limit] + f"… ({len(value):,} characters)"
    return repr(text)


# -- compact head sets -----------------------------------------------------------------------------------------------

def _span(text: str, size: int | None) -> range:
    """``3`` | ``1-4`` | ``*`` (needs ``size``) as a range of indices; ValueError otherwise."""
    if text == "*":
        if size is None:
            raise ValueError("'*' needs the grid's size")
        return range(size)
    low, dash, high = text.partition("-")
    if not NUMBER.fullmatch(low) or (dash and not NUMBER.fullmatch(high)):
        raise ValueError(f"{_shown(text, 12)} is not a number, a range a-b or *")
    first, last = int(low), int(high) if dash else int(low)
    if last < first:
        raise ValueError(text)
    return range(first, last + 1)


def parse_heads(text: str, shape: tuple[int, int] | None = None) -> tuple[Head, ...]:
    """The sorted, distinct heads a compact head set names (module docstring); ValueError naming the bad item.

    With ``shape`` (layers, heads per layer) every head must lie in the grid; ``*`` and ``~`` need it."""
    complement = text.startswith("~")
    if complement:
        text = text[1:]
        if shape is None:
            raise ValueError("'~' (all heads but these) needs the grid's shape")
    n_layers, n_heads = shape if shape is not None else (None, None)
    heads: set[Head] = set()
    for item in filter(None, text.split(",")):
        layers, dot, units = item.partition(".")
        if not dot:
            raise ValueError(f"{_shown(item)} is not layer.head")
        try:
            layer_span, head_span = _span(layers, n_layers), _span(units, n_heads)
        except ValueError as exc:
            raise ValueError(f"{_shown(item)} is not layer.head ({exc})") from None
        if len(layer_span) * len(head_span) + len(heads) > MAX_HEADS:
            raise ValueError(f"more than {MAX_HEADS:,} heads")
        if shape is not None and (layer_span[-1] >= n_layers or head_span[-1] >= n_heads):
            raise ValueError(f"{_shown(item)} is outside the {n_layers} x {n_heads} grid (layers 0-{n_layers - 1}, "
                             f"heads 0-{n_heads - 1})")
        heads.update((layer, head) for layer in layer_span for head in head_span)
    if complement:
        heads = {(layer, head) for layer in range(n_layers) for head in range(n_heads)} - heads
    return tuple(sorted(heads))


def _runs(values: list[int], size: int | None) -> str:
    """Sorted distinct indices as ``*`` (all ``size`` of them) or space-separated runs: ``[1, 2, 3, 5]`` ->
    ``1-3 5`` (the caller makes one item of each run)."""
    if size is not None and values == list(range(size)):
        return "*"
    runs, start, last = [], values[0], values[0]
    for value in values[1:] + [None]:
        if value is not None and value == last + 1:
            last = value
            continue
        runs.append(str(start) if start == last else f"{start}-{last}")
        start = last = value
    return " ".join(runs)


def format_heads(heads: Iterable[Head], shape: tuple[int, int] | None = None) -> str:
    """The shortest compact text of ``heads`` this encoder finds (``parse_heads`` reads it back exactly): runs of
    heads within a layer, runs of layers with the same heads, ``*`` for a whole row, and with ``shape`` the
    complement (``~``) when that is shorter."""
    direct = _format(sorted(set(heads)), shape)
    if shape is None:
        return direct
    everything = {(layer, head) for layer in range(shape[0]) for head in range(shape[1])}
    rest = sorted(everything - set(heads))
    inverse = "~" + _format(rest, shape)
    return inverse if len(inverse) < len(direct) else direct


def _format(heads: list[Head], shape: tuple[int, int] | None) -> str:
    by_layer: dict[int, list[int]] = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    n_layers, n_heads = shape if shape is not None else (None, None)
    # each layer's heads as runs ("1-3 5" -> two items), then layers with the same runs merged into layer runs
    spec_of = {layer: _runs(units, n_heads) for layer, units in by_layer.items()}
    layers_of: dict[str, list[int]] = {}
    for layer, spec in spec_of.items():
        layers_of.setdefault(spec, []).append(layer)
    items = []
    for spec, layers in layers_of.items():
        layer_text = _runs(layers, n_layers)
        for layer_part in layer_text.split(" "):
            items.extend((layer_part, head_part) for head_part in spec.split(" "))
    items.sort(key=lambda item: (_first(item[0]), _first(item[1])))
    return ",".join(f"{layer}.{head}" for layer, head in items)


def _first(part: str) -> int:
    return -1 if part == "*" else int(part.partition("-")[0])


# -- the KV page's plan -------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class KVView:
    """The KV cache page's settings: score ``rule``, ``share`` (% of key/value heads full), ``sink`` S, ``window``
    W, the bytes bar's context ``length``, and the key/value heads kept full after clicks (None: the rule's top
    share). Text form: ``rule_share_sink_window_length[_fullheads]``, e.g. ``razor_25_4_16_4096_0.1,2.0``.

    A budget plan (HeadKV's allocation: every group keeps S + W_g tokens) has a ``budget`` (total tokens) and
    ``beta`` instead of a share and full heads; its share field reads ``bTOTAL-BETA``: ``razor_b96-2.0_4_16_4096``."""

    rule: str
    share: int | None
    sink: int
    window: int
    length: int
    full: tuple[Head, ...] | None = None
    budget: int | None = None
    beta: float | None = None

    def __post_init__(self):
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,29}", str(self.rule)):
            raise ViewStateError(f"kv rule {_shown(str(self.rule))} is not a rule name (lower-case letters)")
        budgets = self.budget is not None
        limits = (("sink", KV_SINK), ("window", KV_WINDOW)) + ((("budget", KV_BUDGET),) if budgets else
                                                                (("share", KV_SHARE),))
        for name, (low, high) in limits:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ViewStateError(f"kv {name} {value!r} must be a whole number in [{low}, {high}]")
        if self.length not in KV_LENGTHS:
            raise ViewStateError(f"kv length {self.length!r} must be one of {', '.join(map(str, KV_LENGTHS))}")
        if budgets:
            if self.share is not None or self.full is not None:
                raise ViewStateError("a kv budget plan has no share of full heads")
            if isinstance(self.beta, bool) or not isinstance(self.beta, (int, float)) \
                    or not math.isfinite(self.beta) or not KV_BETA[0] <= self.beta <= KV_BETA[1]:
                raise ViewStateError(f"kv beta {self.beta!r} must be a number in [{KV_BETA[0]:g}, {KV_BETA[1]:g}]")
            object.__setattr__(self, "beta", float(self.beta))
        elif self.beta is not None:
            raise ViewStateError("kv beta belongs to a budget plan (give its budget)")
        if self.full is not None:
            object.__setattr__(self, "full", _checked_heads(self.full, "kv full heads"))

    def text(self, shape: tuple[int, int] | None = None) -> str:
        share = f"b{self.budget}-{self.beta!r}" if self.budget is not None else str(self.share)
        parts = [self.rule, share, str(self.sink), str(self.window), str(self.length)]
        if self.full is not None:
            parts.append(format_heads(self.full, shape) or "-")
        return "_".join(parts)

    @classmethod
    def parse(cls, text: str, rules: Iterable[str] | None = None, shape: tuple[int, int] | None = None) -> KVView:
        """The ``KVView`` of ``text``; ViewStateError naming what is wrong and what is accepted."""
        parts = text.split("_")
        budget = re.fullmatch(r"b([0-9]{1,8})-([0-9]{1,7}(?:\.[0-9]{1,17})?)", parts[1]) if len(parts) > 1 else None
        if len(parts) not in (5, 6) or not all(re.fullmatch(r"[0-9]{1,6}", p) for p in parts[2:5]) \
                or not (budget or re.fullmatch(r"[0-9]{1,6}", parts[1])) or (budget and len(parts) == 6):
            raise ViewStateError(f"kv={_shown(text)}: expected rule_share_sink_window_length[_fullheads], "
                                 "e.g. razor_25_4_16_4096, or a budget plan rule_bTOTAL-BETA_sink_window_length")
        rules = list(rules) if rules is not None else None
        if rules is not None and parts[0] not in rules:
            raise ViewStateError(f"kv rule {_shown(parts[0])} is not one of: {', '.join(rules)}")
        full = None
        if len(parts) == 6:
            try:
                full = () if parts[5] == "-" else parse_heads(parts[5], shape)
            except ValueError as exc:
                raise ViewStateError(f"kv full heads: {exc}") from None
        sink, window, length = map(int, parts[2:5])
        if budget:
            return cls(rule=parts[0], share=None, sink=sink, window=window, length=length,
                       budget=int(budget.group(1)), beta=float(budget.group(2)))
        return cls(rule=parts[0], share=int(parts[1]), sink=sink, window=window, length=length, full=full)


# -- the view -------------------------------------------------------------------------------------------------------

def _checked_heads(heads, what: str) -> tuple[Head, ...]:
    try:
        pairs = {(int(layer), int(head)) for layer, head in heads}
    except (TypeError, ValueError):
        raise ViewStateError(f"{what} must be (layer, head) pairs of whole numbers") from None
    if len(pairs) > MAX_HEADS or any(not (0 <= layer < MAX_GRID and 0 <= head < MAX_GRID) for layer, head in pairs):
        raise ViewStateError(f"{what}: at most {MAX_HEADS:,} heads, each layer and head in [0, {MAX_GRID})")
    return tuple(sorted(pairs))


def _name(value, what: str) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_NAME or CONTROL.search(value):
        raise ViewStateError(f"{what} must be a name of 1-{MAX_NAME} printable characters")


@dataclass(frozen=True, kw_only=True)
class ViewState:
    """What a dashboard view shows, each field None when the view does not set it. Checked once, here: a
    ``ViewState`` that exists holds only values a link accepts (ViewStateError otherwise). ``mask`` is the heads
    pruned in the session (sorted); ``head`` the one selected head; ``criterion`` the Prune page's criterion;
    ``rows`` the evaluation rows the numbers are measured on; ``roles`` whether role letters are drawn on the
    grids; ``lesson``/``step`` a lesson's slug and step number."""

    page: str | None = None
    model: str | None = None
    data: str | None = None
    mask: tuple[Head, ...] | None = None
    head: Head | None = None
    criteria: tuple[str, ...] | None = None
    criterion: str | None = None
    ratio: float | None = None
    rows: int | None = None
    sentence: str | None = None
    roles: bool | None = None
    kv: KVView | None = None
    lesson: str | None = None
    step: int | None = None

    def __post_init__(self):
        for name in ("page", "model", "data"):
            if getattr(self, name) is not None:
                _name(getattr(self, name), name)
        if self.mask is not None:
            object.__setattr__(self, "mask", _checked_heads(self.mask, "mask"))
        if self.head is not None:
            (head,) = _checked_heads([self.head], "head")
            object.__setattr__(self, "head", head)
        if self.criteria is not None:
            names = tuple(dict.fromkeys(self.criteria))
            if not names or len(names) > MAX_CRITERIA:
                raise ViewStateError(f"criteria: 1 to {MAX_CRITERIA} names")
            for name in names:
                _name(name, "a criterion")
            object.__setattr__(self, "criteria", names)
        if self.criterion is not None:
            _name(self.criterion, "the criterion")
        if self.rows is not None and ROWS(self.rows):
            raise ViewStateError(f"rows {self.rows!r} {ROWS(self.rows)}")
        if self.ratio is not None:
            if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)) \
                    or not math.isfinite(self.ratio) or not 0 <= self.ratio <= 1:
                raise ViewStateError(f"ratio {self.ratio!r} must be a number in [0, 1]")
            object.__setattr__(self, "ratio", float(self.ratio))
        if self.sentence is not None:
            if not isinstance(self.sentence, str) or not 0 < len(self.sentence) <= MAX_SENTENCE \
                    or CONTROL.search(self.sentence):
                raise ViewStateError(f"sentence: 1-{MAX_SENTENCE} printable characters")
        if self.roles is not None and not isinstance(self.roles, bool):
            raise ViewStateError("roles must be True or False")
        if self.kv is not None and not isinstance(self.kv, KVView):
            raise ViewStateError("kv must be a KVView")
        if self.lesson is not None and (not isinstance(self.lesson, str) or not LESSON.fullmatch(self.lesson)):
            raise ViewStateError("lesson must be 1-40 characters: lower-case letters, digits and '-'")
        if self.step is not None and (isinstance(self.step, bool) or not isinstance(self.step, int)
                                      or not 0 <= self.step <= MAX_STEP):
            raise ViewStateError(f"step must be a whole number in [0, {MAX_STEP}]")

    # -- to the address bar ---------------------------------------------------------------------------------------

    def to_query(self, shape: tuple[int, int] | None = None, kv_shape: tuple[int, int] | None = None
                 ) -> dict[str, str]:
        """The query string's keys (KEYS order), only those set. ``shape`` (the head grid) and ``kv_shape`` (the
        key/value head grid) let masks use ``*`` and the complement form, whichever is shorter."""
        out = {}
        for key in KEYS:
            value = getattr(self, key)
            if value is None:
                continue
            if key == "mask":
                out[key] = format_heads(value, shape)
            elif key == "head":
                out[key] = f"{value[0]}.{value[1]}"
            elif key == "criteria":
                out[key] = ",".join(value)
            elif key == "rows":
                out[key] = str(value)
            elif key == "ratio":
                out[key] = repr(value)        # the shortest text that reads back as the same float
            elif key == "roles":
                out[key] = "1" if value else "0"
            elif key == "kv":
                out[key] = value.text(kv_shape)
            else:
                out[key] = str(value)
        return out

    # -- from the address bar -------------------------------------------------------------------------------------

    @classmethod
    def from_query(cls, params: Mapping, *, pages: Iterable[str], models: Iterable[str], data: Iterable[str],
                   criteria: Iterable[str], shape: tuple[int, int] | None = None, kv_rules: Iterable[str] | None = None,
                   kv_shape: tuple[int, int] | None = None) -> tuple[ViewState, list[str]]:
        """The view ``params`` (a query string's keys: text, or lists of text whose last one counts) asks for, and
        one line per value dropped, naming it and what is accepted. Never raises for a user's link.

        ``pages``/``models``/``data``/``criteria``: the names a link may choose (a link never names a file or a
        hub id: only these). ``shape``: the head grid (layers, heads) the mask and head must fit; None skips that
        check (and refuses ``*``/``~`` masks, which need it). ``kv_rules``/``kv_shape`` the same for ``kv``."""
        pages, models, data, criteria = (list(names) for names in (pages, models, data, criteria))
        problems: list[str] = []
        unknown = [str(key) for key in params if key not in KEYS]
        if unknown:
            shown = ", ".join(_shown(key, 20) for key in unknown[:5]) + (" …" if len(unknown) > 5 else "")
            problems.append(f"unknown key{'s' if len(unknown) > 1 else ''} {shown} dropped; a link's keys are: "
                            f"{', '.join(KEYS)}.")
        values = {}
        for key in KEYS:
            if key not in params:
                continue
            raw = params[key]
            if isinstance(raw, (list, tuple)):
                raw = raw[-1] if raw else ""
            raw = str(raw)
            limit = MAX_SENTENCE if key == "sentence" else MAX_VALUE
            if len(raw) > limit:
                problems.append(f"{key} is {len(raw):,} characters long (at most {limit:,}): dropped.")
                continue
            if raw == "" and key != "mask":
                continue
            try:
                values[key] = _read(key, raw, pages=pages, models=models, data=data, criteria=criteria, shape=shape,
                                    kv_rules=kv_rules, kv_shape=kv_shape, problems=problems)
            except (ViewStateError, ValueError) as exc:
                problems.append(f"{key}={_shown(raw)} dropped: {str(exc).rstrip('.')}.")
        # a step is a lesson's: one without the other names nothing a server can open (issue 46 item 7)
        if "lesson" in values and "step" not in values:
            problems.append(f"lesson={_shown(values.pop('lesson'))} dropped: a lesson link names its step too "
                            "(step=1 opens the first).")
        elif "step" in values and "lesson" not in values:
            problems.append(f"step={values.pop('step')} dropped: a step belongs to a lesson (lesson=NAME&step=K).")
        return cls(**values), problems


def _choose(key: str, value: str, accepted: list[str]) -> str:
    if value not in accepted:
        raise ViewStateError(f"not one of {', '.join(accepted)}")
    return value


def _read(key: str, raw: str, *, pages, models, data, criteria, shape, kv_rules, kv_shape, problems):
    """One key's value from its text (ValueError / ViewStateError: dropped, the message says why)."""
    if key == "page":
        return _choose(key, raw, pages)
    if key == "model":
        return _choose(key, raw, models)
    if key == "data":
        return _choose(key, raw, data)
    if key == "mask":
        return parse_heads(raw, shape)
    if key == "head":
        heads = parse_heads(raw, shape)
        if len(heads) != 1 or "*" in raw or "-" in raw or "~" in raw or "," in raw:
            raise ViewStateError("expected one head as layer.head, e.g. 1.4")
        return heads[0]
    if key == "criteria":
        names = [n for n in raw.split(",") if n]
        bad = [n for n in names if n not in criteria]
        if bad:
            problems.append(f"criteria {', '.join(_shown(n, 20) for n in bad[:5])} dropped: not one of "
                            f"{', '.join(criteria)}.")
        names = [n for n in names if n in criteria]
        if len(names) > MAX_CRITERIA:
            raise ViewStateError(f"at most {MAX_CRITERIA} criteria")
        if not names:
            raise ViewStateError(f"no known criterion (known: {', '.join(criteria)})")
        return tuple(names)
    if key == "criterion":
        return _choose(key, raw, criteria)
    if key == "rows":
        if not re.fullmatch(r"[0-9]{1,7}", raw) or ROWS(int(raw)):
            raise ViewStateError(f"must be a whole number in [1, {ROWS.high:,}] (the evaluation rows the numbers "
                                 "are measured on)")
        return int(raw)
    if key == "ratio":
        try:
            value = float(raw)
        except ValueError:
            raise ViewStateError("must be a number in [0, 1]") from None
        if not math.isfinite(value) or not 0 <= value <= 1:
            raise ViewStateError("must be a number in [0, 1]")
        return value
    if key == "sentence":
        if CONTROL.search(raw):
            raise ViewStateError("control characters are not accepted in a sentence")
        return raw
    if key == "roles":
        if raw.lower() not in TRUE + FALSE:
            raise ViewStateError("must be 1 (role letters shown) or 0 (hidden)")
        return raw.lower() in TRUE
    if key == "kv":
        return KVView.parse(raw, kv_rules, kv_shape)
    if key == "lesson":
        if not LESSON.fullmatch(raw):
            raise ViewStateError("a lesson name is 1-40 lower-case letters, digits and '-'")
        return raw
    if key == "step":
        if not re.fullmatch(r"[0-9]{1,3}", raw):
            raise ViewStateError(f"must be a whole number in [0, {MAX_STEP}]")
        return int(raw)
    raise AssertionError(key)  # KEYS and this reader list the same keys


FIELDS = tuple(f.name for f in fields(ViewState))
assert FIELDS == KEYS, "ViewState's fields and the link's keys are the same list, in the same order"
