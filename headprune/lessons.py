"""Lessons: short guided tours of the dashboard, one TOML file each, checked line by line before a class sees them.

A lesson is a title, a model and data, and a sequence of steps; a step is a dashboard state (a
``viewstate.ViewState``: page, mask, selected head, criteria, ratio, sentence, role letters) plus a few sentences,
what to look at, and one question with its reveal. Opening a step sets that state (the query string) and switches
page; ``?lesson=NAME&step=K`` in a link opens step K (from 1) of lesson NAME.

File format (``docs/tutorials/lessons.md`` is the reference; the lesson's name is the file's stem, lower-case
letters, digits and "-")::

    title = "Induction heads"              # required
    summary = "Find them, cut them, ..."   # required
    minutes = 12                           # required, 1-45: class time
    model = "demo-circuit"                 # required: a named model, or a folder INSIDE the lessons folder
    data = "demo-circuit"                  # required: a named data set
    rows = 128                             # optional: the evaluation rows every step's numbers are measured on
                                           # (the link's ``rows``: the same numbers on any server)

    [[step]]                               # 1 to MAX_STEPS of them
    title = "..."                          # required
    text = "..."                           # required (Markdown)
    look = "..."                           # what to look at (optional)
    question = "..."                       # optional; then answer is required (the reveal)
    answer = "..."
    page = "heads"                         # the state (all optional): a page's address name,
    mask = "1.0-7"                         # heads pruned (the link's compact form: layer.head, ranges a-b, *)
    head = "1.3"                           # the selected head
    criteria = ["ae", "his"]               # criteria shown
    criterion = "ae"                       # the Prune page's criterion (its Apply)
    ratio = 0.5                            # prune ratio, 0-1
    sentence = "..."                       # the text looked at
    roles = true                           # role letters on the grids

Every problem is an ``error:`` line naming the file and the line (TOML parsers give no line numbers for keys:
``protocol.spec.KeyLines`` finds them by a scan of the text, as for protocol files), and the other lessons still
load. A lesson is a file people share, so it is read as hostile input: through ``userinput.read_user_text`` (a
regular file only, its real path inside the lessons folder, at most MAX_BYTES, all checked before reading: a FIFO
never hangs the check, a symlink never reads a file elsewhere); a model folder, every file in it and its
``config.json`` (read through ``read_user_json``) must lie inside the lessons folder once links are followed, so a
lesson never makes the server load a file elsewhere; its head grid is bounded (GRID).

What a lesson's words may hold (``lessons check`` and the Lessons page refuse the rest, each on its line):

- no raw HTML, image, link or web address (``<img ...>``, ``![x](...)``, ``[x](...)``, ``http://...``): the
  dashboard shows a lesson's Markdown with all of them made inert (``dashboard.ui.plain``), so they could only
  mislead; a tag meant as text goes in a code span (```<bos>```);
- a control a step tells the reader to use (an action verb, VERBS, then a label in bold or in quotes: "press
  **Compute scores**", "set "Criterion" to random") exists with that label on the step's page
  (``headprune.controls`` reads the labels from the page scripts);
- a step whose words follow a state ("the mask you set", "the same heads cut", "as in the last step") carries that
  state itself: a step's link opens a fresh session holding the step's own state and nothing else;
- a number measured on the model (one with a decimal point, or 100 and over, a year or a percentage aside) is a
  placeholder filled from the values on the student's screen (PLACEHOLDERS: ``{dense}``, ``{pruned}``,
  ``{change}``, ``{pruned_next_token_accuracy}`` ...), with a Python format after a colon (``{pruned:,.0f}``) and,
  optionally, the value the words rely on with its tolerance (``{pruned~6100+-50%}``): the panel shows the live
  value and says so when it lies outside; the browser walk of the shipped lessons fails then;
- no promise of how long a computation takes: the page estimates it beside its button, for the server it runs on.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .controls import Controls, page_controls
from .criteria import available
from .data import NAMED_DATA
from .errors import HeadpruneError
from .evaluation.metrics import HIGHER_IS_BETTER
from .limits import Interval
from .markdown import markup_problem, outside_code
from .model.loading import NAMED_MODELS
from .protocol.spec import KeyLines, parse_toml
from .userinput import kind_of, read_user_json, read_user_text, resolved_inside
from .viewstate import LESSON, MAX_GRID, ROWS, ViewState

MAX_BYTES = 256 * 1024          # a lesson is a page of text; a 10 MB file is a mistake (refused unread)
MAX_CONFIG_BYTES = 1024 * 1024  # a model's config.json (a few kB; a 1 GB one is a trap)
MAX_MODEL_FILES = 200           # files in a lesson's model folder (a saved model has a dozen)
MAX_STEPS = 40
MAX_TEXT = 4000                 # characters of one text field
MINUTES = (1, 45)
MAX_FILES = 200                 # lesson files read from one folder (a class needs a handful); more is an error
GRID = Interval(1, MAX_GRID, integer=True, why="layers, and heads per layer, of a model a link can name")
LESSON_KEYS = {"title": True, "summary": True, "minutes": True, "model": True, "data": True, "step": True,
               "rows": False}
TEXT_KEYS = {"title": True, "text": True, "look": False, "question": False, "answer": False}
FILLED_KEYS = ("text", "look", "question", "answer")   # the fields whose placeholders are filled
STATE_KEYS = ("page", "mask", "head", "criteria", "criterion", "ratio", "sentence", "roles")
SHIPPED = Path(__file__).resolve().parent / "resources" / "lessons"
ENV = "HEADPRUNE_LESSONS"       # a teacher's folder of lessons, listed after the shipped ones
ACCEPTED_FILE = f"a UTF-8 TOML lesson file of at most {MAX_BYTES:,} bytes, inside its lessons folder"

# the values a step's words may quote, filled on the student's screen (``fill``); with every metric's own
# dense_<name> and pruned_<name> (the metrics ``evaluation.metrics`` reports)
PLACEHOLDERS = {
    "dense": "the headline metric of the model as loaded, on this server's evaluation rows",
    "pruned": "the headline metric with this step's heads pruned",
    "change": "pruned minus dense",
    "metric": "the headline metric's name (accuracy, perplexity, ...)",
    "heads": "heads in the model",
    "heads_left": "heads left with this step's heads pruned",
    "rows": "evaluation rows the metrics are measured on",
}
METRIC_PLACEHOLDERS = {f"{kind}_{name}" for kind in ("dense", "pruned") for name in HIGHER_IS_BETTER}
PLACEHOLDER = re.compile(r"\{([a-z_]+)(?::([^{}~]*))?(?:~([^{}]*))?\}")
TOLERANCE = re.compile(r"\s*(?P<value>-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?:±|\+-|\+/-)\s*"
                       r"(?P<within>[0-9][0-9,]*(?:\.[0-9]+)?)\s*(?P<percent>%?)\s*")
MEASURED = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?![\w]|\.\d)")
DURATION = re.compile(r"\b(?:\d+|a few|several)\s*(?:seconds?|secs?|s|minutes?|mins?|hours?|h)\b|"
                      r"\b(?:seconds|minutes|hours|a minute|an hour)\b", re.I)   # "second" alone is an ordinal
VERBS = ("press", "click", "tick", "untick", "choose", "select", "pick", "toggle", "switch", "turn on", "turn off",
         "open", "set", "drag")
CONTROL_NAMED = re.compile(
    r"\b(?:" + "|".join(VERBS) + r")\b(?:\s+(?:the|a|an|on|off|button|tab|box|checkbox|toggle|expander|slider|"
    r"menu|again|its))*\s+(?:\*\*(?P<bold>[^*\n]+?)\*\*|\"(?P<quoted>[^\"\n]+?)\"|“(?P<curly>[^”\n]+?)”)", re.I)
FOLLOWS = re.compile(r"\b(?:follows?|following|you (?:set|chose|picked|pruned|cut|selected|typed|clicked)|"
                     r"(?:last|previous|earlier) step(?:'s)?|same|as before)\b", re.I)
STATE_WORDS = {"mask": re.compile(r"\bmask\b|\bheads? (?:you )?(?:pruned|cut)\b|\b(?:pruned|cut) heads\b", re.I),
               "head": re.compile(r"\bselected head\b|\bhead you (?:selected|clicked|picked)\b", re.I),
               "criteria": re.compile(r"\bcriteri(?:on|a)\b", re.I),
               "ratio": re.compile(r"\bratio\b", re.I),
               "sentence": re.compile(r"\bsentence\b", re.I)}


class LessonError(HeadpruneError):
    """A lesson file that cannot be used as written: the message is ``FILE:LINE: problem``."""


@dataclass(frozen=True)
class Step:
    title: str
    text: str
    look: str
    question: str
    answer: str
    state: ViewState              # the dashboard state this step opens (model and data: the lesson's)

    def words(self) -> dict[str, str]:
        """The step's filled fields (text, look, question, answer) by name."""
        return {key: getattr(self, key) for key in FILLED_KEYS}


@dataclass(frozen=True)
class Lesson:
    name: str                     # the file's stem: ?lesson=NAME
    title: str
    summary: str
    minutes: int
    model: str                    # a named model, or the absolute path of a folder inside the lessons folder
    data: str
    steps: tuple[Step, ...]
    path: Path
    rows: int | None = None       # the evaluation rows of every step (None: the server's)

    @property
    def linkable(self) -> bool:
        """Whether a link can carry this lesson's model (named models only: a link never names a folder)."""
        return self.model in NAMED_MODELS

    def query(self, step: int) -> dict[str, str]:
        """The query string of step ``step`` (from 1): its state, the lesson's model and data, lesson and step."""
        state = self.steps[step - 1].state
        view = ViewState(**{**{k: getattr(state, k) for k in STATE_KEYS},
                            "model": self.model if self.linkable else None,
                            "data": self.data if self.linkable else None, "rows": self.rows,
                            "lesson": self.name, "step": step})
        query = view.to_query()
        if state.mask:   # item by item ("1.0,1.1"), not ranges: a lesson's few heads read the same in any reader
            query["mask"] = ",".join(f"{layer}.{head}" for layer, head in state.mask)
        return query


# -- a step's words ---------------------------------------------------------------------------------------------------

def named_controls(text: str) -> list[str]:
    """The controls ``text`` tells its reader to use: the bold or quoted label after an action verb (VERBS)."""
    found = []
    for match in CONTROL_NAMED.finditer(outside_code(text)):
        name = match.group("bold") or match.group("quoted") or match.group("curly")
        found.append(" ".join(name.strip(" .,:;").split()))
    return found


def placeholders(text: str) -> list[re.Match]:
    """The placeholders of ``text`` (outside code spans): group 1 the name, 2 the format, 3 the tolerance."""
    blank = outside_code(text)
    return [m for m in PLACEHOLDER.finditer(text) if blank[m.start()] == "{"]


def _known(name: str) -> bool:
    return name in PLACEHOLDERS or name in METRIC_PLACEHOLDERS


def _placeholder_problem(match: re.Match) -> str | None:
    name, spec, tolerance = match.groups()
    if not _known(name):
        return (f"unknown placeholder {{{name}}}; accepted: {', '.join('{' + k + '}' for k in PLACEHOLDERS)}, or "
                "{dense_<metric>} / {pruned_<metric>} for one of: " + ", ".join(HIGHER_IS_BETTER) + ".")
    if spec is not None:
        try:
            format(1.5, spec)
        except ValueError:
            return f"{{{name}:{spec}}}: {spec!r} is not a number format (e.g. {{{name}:,.1f}})."
    if tolerance is not None and not TOLERANCE.fullmatch(tolerance):
        return (f"{{{name}~{tolerance}}}: a stated value is a number, then +- and the tolerance (absolute, or % of "
                f"the value), e.g. {{{name}~6100+-10%}}.")
    if name == "metric" and tolerance is not None:
        return "{metric} is a name: it has no value to hold to a tolerance."
    return None


def _measured_number(text: str) -> re.Match | None:
    """The first number in ``text`` (code spans and placeholders aside) that reads as measured on a model."""
    blank = PLACEHOLDER.sub(lambda m: " " * len(m.group()), outside_code(text))
    for match in MEASURED.finditer(blank):
        whole, decimals = match.group(1), match.group(2)
        value = int(whole.replace(",", ""))
        after = blank[match.end():match.end() + 1]
        if decimals:
            if re.search(r"\b(?:heads?|layers?)\s+$", blank[:match.start()], re.I):
                continue   # "head 1.5": a head's name, not a number
            return match
        if value >= 100 and not (1900 <= value <= 2099 and "," not in whole) and not (after == "%" and value <= 100):
            return match
    return None


def fill(text: str, values: Mapping[str, object]) -> tuple[str, list[str]]:
    """``text`` with each placeholder replaced by its value in ``values`` (numbers formatted to 4 significant
    digits, or by the placeholder's own format), and one line for each value outside the tolerance the text states
    (or missing from ``values``)."""
    notes: list[str] = []
    out, last = [], 0
    for match in placeholders(text):
        name, spec, tolerance = match.groups()
        value = values.get(name)
        if value is None:
            shown = "…"
            notes.append(f"{{{name}}} has no value on this page")
        elif isinstance(value, str):
            shown = value
        else:
            shown = format(value, spec) if spec else number(value)
            stated = TOLERANCE.fullmatch(tolerance) if tolerance else None
            if stated:
                expect = float(stated["value"].replace(",", ""))
                within = float(stated["within"].replace(",", ""))
                within = abs(expect) * within / 100 if stated["percent"] else within
                if not abs(float(value) - expect) <= within:
                    notes.append(f"this lesson expects {name} near {stated['value']} (within {stated['within']}"
                                 f"{stated['percent']}); this server measures {shown}")
        out += [text[last:match.start()], shown]
        last = match.end()
    return "".join(out + [text[last:]]), notes


def number(value) -> str:
    """A live value for a lesson's words: integers with thousands separators, other numbers to 4 significant
    digits (6,101 · 965.6 · 1.234 · 0.8182)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    value = float(value)
    if not math.isfinite(value) or value == 0:
        return f"{value:g}"
    digits = max(0, 3 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


# -- reading a file -------------------------------------------------------------------------------------------------

def grid_shape(model_folder: Path, roots: tuple[Path, ...] = ()) -> tuple[int, int]:
    """(layers, heads) of a model folder from its config.json, without loading weights; LessonError (without a
    file and line) when unreadable, not a model's config, or outside GRID. ``roots``: where the file must lie."""
    accepted = "a saved model's config.json with num_hidden_layers and num_attention_heads"
    config = read_user_json(Path(model_folder) / "config.json", "config.json", accepted,
                            max_bytes=MAX_CONFIG_BYTES, roots=roots, error=LessonError)
    shape = []
    for key in ("num_hidden_layers", "num_attention_heads"):
        value = config.get(key) if isinstance(config, dict) else None
        problem = GRID(value)
        if problem:
            raise LessonError(f"config.json of {model_folder}: {key} {value!r} {problem}.")
        shape.append(value)
    return shape[0], shape[1]


def named_shape(name: str) -> tuple[int, int]:
    """The head grid of a named model (its folder is built once, then cached)."""
    return grid_shape(Path(NAMED_MODELS[name].build()))


class _File:
    """One lesson file being read: its name, text, key lines, and the errors found so far."""

    def __init__(self, path: Path, text: str):
        self.path, self.text, self.lines, self.errors = path, text, KeyLines(text), []

    def error(self, where: tuple, problem: str, piece: str | None = None) -> None:
        """An error on the line of key ``where`` (or, given ``piece``, the first line from there that holds it)."""
        line = self.lines.line(where) or 1
        if piece:
            needle = piece.strip().split("\n")[0][:30]
            rows = self.text.splitlines()
            line = next((n for n in range(line, len(rows) + 1) if needle and needle in rows[n - 1]), line)
        self.errors.append(f"{self.path}:{line}: {problem}")


def _text(file: _File, table: dict, where: tuple, keys: dict) -> dict:
    out = {}
    for key, required in keys.items():
        value = table.get(key)
        if value is None:
            if required:
                file.error(where, f"'{key}' is missing; every {'step' if where else 'lesson'} needs "
                                  f"{', '.join(k for k, r in keys.items() if r)}.")
            out[key] = ""
        elif not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
            file.error(where + (key,), f"'{key}' must be text of 1-{MAX_TEXT:,} characters.")
            out[key] = ""
        else:
            out[key] = value.strip()
    return out


def _words(file: _File, words: dict[str, str], where: tuple, *, step: int | None = None) -> None:
    """The rules every field's words follow (raw HTML, links, placeholders, measured numbers, durations)."""
    name = f"step {step} '" if step else "'"
    for key, value in words.items():
        if not value:
            continue
        at = where + (key,)
        bad = markup_problem(value)
        if bad:
            piece, what = bad
            file.error(at, f"{name}{key}' holds {what} ({piece!r}); a lesson's words are shown as text: raw HTML, "
                           "images, links and web addresses are refused (a tag meant as text goes in backticks, "
                           "`<bos>`).", piece)
        for match in placeholders(value):
            problem = _placeholder_problem(match) if key in FILLED_KEYS and step else \
                f"a placeholder ({match.group()}) is filled only in a step's {', '.join(FILLED_KEYS)}."
            if problem:
                file.error(at, f"{name}{key}': {problem}", match.group())
        measured = _measured_number(value)
        if measured:
            file.error(at, f"{name}{key}' quotes {measured.group()!r}, a number measured on the model: this "
                           "server's evaluation rows give their own. Write a placeholder filled from the live value "
                           "({dense}, {pruned}, {change}, {pruned_<metric>}, ...), optionally with what the words "
                           "rely on: {pruned~6100+-10%}.", measured.group())
        duration = DURATION.search(outside_code(value)) if step else None
        if duration:
            file.error(at, f"{name}{key}' promises a duration ({duration.group()!r}): the page estimates how "
                           "long its work takes beside its button, for the server it runs on; leave it to the page.",
                       duration.group())


def _controls(file: _File, words: dict[str, str], where: tuple, step: int, page: str | None,
              controls: Mapping[str, Controls] | None) -> None:
    """Every control the step names exists with that label on its page."""
    if controls is None or page not in controls:
        return
    on_page = controls[page]
    for key, value in words.items():
        for name in named_controls(value):
            if not on_page.has(name):
                file.error(where + (key,), f"step {step} '{key}' names the control {name!r}, which the {page} page "
                                           f"({on_page.file}) does not have; its controls: "
                                           f"{', '.join(on_page.labels)}.", name)


def _follows(file: _File, table: dict, words: dict[str, str], where: tuple, step: int) -> None:
    """A step whose words follow a state carries that state (its link opens a fresh session)."""
    for key, value in words.items():
        for sentence in re.split(r"(?<=[.!?])\s+", value):
            if not FOLLOWS.search(sentence):
                continue
            for state, pattern in STATE_WORDS.items():
                if pattern.search(sentence) and state not in table:
                    file.error(where + (key,), f"step {step} '{key}' follows a {state} ({sentence.strip()[:80]!r}) "
                                               f"but does not set '{state}': its link opens a fresh session, with "
                                               "only the step's own state. Set it in the step.", sentence.strip())


def _model(file: _File, value, folder: Path) -> tuple[str | None, tuple[int, int] | None]:
    """The lesson's model (a named one, or a folder inside ``folder``) and its head grid."""
    if not isinstance(value, str) or not value:
        file.error(("model",), f"'model' must be a named model ({', '.join(NAMED_MODELS)}) or a folder inside "
                               f"{folder}.")
        return None, None
    if value in NAMED_MODELS:
        try:
            return value, named_shape(value)
        except LessonError as exc:
            file.error(("model",), str(exc))
            return None, None
    accepted = (f"a named model ({', '.join(NAMED_MODELS)}) or a saved model's folder inside {folder} (every file "
                "in it too, once links are followed)")
    target = resolved_inside(folder / value, (folder,))
    if target is None or kind_of(target) != "dir":
        file.error(("model",), f"model folder {value!r} is outside the lessons folder {folder}, or not a folder; "
                               f"accepted: {accepted}.")
        return None, None
    try:
        entries = sorted(os.scandir(target), key=lambda e: e.name)
    except OSError as exc:
        file.error(("model",), f"model folder {value!r} cannot be listed ({exc.strerror}); accepted: {accepted}.")
        return None, None
    if len(entries) > MAX_MODEL_FILES:
        file.error(("model",), f"model folder {value!r} holds {len(entries)} entries, over the {MAX_MODEL_FILES} "
                               f"a saved model has; accepted: {accepted}.")
        return None, None
    for entry in entries:
        if resolved_inside(Path(entry.path), (folder,)) is None or kind_of(entry.path) not in ("file", "dir"):
            file.error(("model",), f"model folder {value!r}: {entry.name} is outside the lessons folder once its "
                                   f"links are followed, or not a regular file; accepted: {accepted}.")
            return None, None
    try:
        shape = grid_shape(target, roots=(folder,))
    except LessonError as exc:
        file.error(("model",), f"model folder {value!r}: {exc}")
        return None, None
    return str(target), shape


def _state(file: _File, table: dict, where: tuple, *, pages: list[str], shape) -> ViewState:
    """A step's state through the link's own reader (``ViewState.from_query``): what a link would drop is an error
    here, on the line of the key at fault."""
    query = {}
    for key in STATE_KEYS:
        if key not in table:
            continue
        value = table[key]
        if key == "criteria" and isinstance(value, list):
            value = ",".join(map(str, value))
        elif key == "roles" and isinstance(value, bool):
            value = "1" if value else "0"
        elif isinstance(value, (bool, list, dict)) or not isinstance(value, (str, int, float)):
            file.error(where + (key,), f"'{key}' must be text or a number, as in a link.")
            continue
        query[key] = str(value)
        state, problems = ViewState.from_query({key: query[key]}, pages=pages, models=[], data=[],
                                               criteria=available(), shape=shape)
        for problem in problems:
            file.error(where + (key,), problem)
        if problems:
            del query[key]
    if "page" not in table:
        file.error(where, f"'page' is missing; a step opens one of: {', '.join(pages)}.")
    return ViewState.from_query(query, pages=pages, models=[], data=[], criteria=available(), shape=shape)[0]


def read_lesson(path: Path, *, pages: Iterable[str], folder: Path | None = None,
                controls: Mapping[str, Controls] | None = None) -> Lesson:
    """The lesson in ``path``; LessonError with every problem found, one ``FILE:LINE: problem`` per line.

    ``pages``: the page names a step may open (the dashboard's address names). ``folder``: the lessons folder the
    file and a model folder must lie in (default: the file's own folder). ``controls``: each page's controls
    (``controls.page_controls()``, the default; None when there is no dashboard to read)."""
    path, pages = Path(path), list(pages)
    folder = Path(folder) if folder is not None else path.parent
    controls = page_controls() if controls is None else controls
    try:
        text = read_user_text(path, "lesson file", ACCEPTED_FILE, max_bytes=MAX_BYTES, roots=(folder,),
                              error=LessonError)
    except LessonError as exc:
        raise LessonError(f"{path}:1: {exc}") from None
    try:
        obj = parse_toml(text)
    except ValueError as exc:   # tomllib's and toml's decode errors: their messages name the line
        line = re.search(r"line (\d+)", str(exc))
        raise LessonError(f"{path}:{line.group(1) if line else 1}: not valid TOML: {exc}") from None
    name = path.stem
    file = _File(path, text)
    if not LESSON.fullmatch(name):
        file.error((), f"the file name {name!r} is not a lesson name: 1-40 lower-case letters, digits and '-' "
                       "(it is the lesson's name in links).")
    for key in obj:
        if key not in LESSON_KEYS:
            file.error((key,), f"unknown key '{key}'; a lesson's keys are: {', '.join(LESSON_KEYS)}.")
    head = _text(file, obj, (), {k: True for k in ("title", "summary")})
    _words(file, head, ())
    minutes = obj.get("minutes")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not MINUTES[0] <= minutes <= MINUTES[1]:
        file.error(("minutes",) if "minutes" in obj else (), f"'minutes' must be a whole number of class minutes "
                                                             f"in [{MINUTES[0]}, {MINUTES[1]}].")
    model, shape = _model(file, obj.get("model"), folder)
    data = obj.get("data")
    if not isinstance(data, str) or data not in NAMED_DATA:
        file.error(("data",) if "data" in obj else (), f"'data' {data!r} is not a named data set; accepted: "
                                                       f"{', '.join(NAMED_DATA)}.")
    rows = obj.get("rows")
    if rows is not None and ROWS(rows):
        file.error(("rows",), f"'rows' {ROWS(rows)}.")
    tables = obj.get("step")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables) \
            or len(tables) > MAX_STEPS:
        file.error(("step",), f"a lesson has 1 to {MAX_STEPS} [[step]] tables.")
        tables = []
    steps = []
    for i, table in enumerate(tables):
        where = ("step", i)
        for key in table:
            if key not in TEXT_KEYS and key not in STATE_KEYS:
                file.error(where + (key,), f"unknown key '{key}' in step {i + 1}; a step's keys are: "
                                           f"{', '.join([*TEXT_KEYS, *STATE_KEYS])}.")
        words = _text(file, table, where, TEXT_KEYS)
        if words["question"] and not words["answer"] and "answer" not in table:
            file.error(where + ("question",), f"step {i + 1} asks a question but has no 'answer' (the reveal).")
        state = _state(file, table, where, pages=pages, shape=shape)
        _words(file, words, where, step=i + 1)
        bad = markup_problem(state.sentence) if state.sentence else None
        if bad:   # drawn as the tick labels of the page's figures, where Plotly reads <a href> and <b>
            file.error(where + ("sentence",), f"step {i + 1} 'sentence' holds {bad[1]} ({bad[0]!r}); the sentence "
                                              "is drawn on the page's figures: raw HTML, links and web addresses "
                                              "are refused.", bad[0])
        filled = {k: words[k] for k in FILLED_KEYS}
        _controls(file, filled, where, i + 1, state.page, controls)
        _follows(file, table, filled, where, i + 1)
        steps.append(Step(**words, state=state))
    if file.errors:
        raise LessonError("\n".join(file.errors))
    return Lesson(name=name, title=head["title"], summary=head["summary"], minutes=minutes, model=model, data=data,
                  steps=tuple(steps), path=path, rows=rows)


def lesson_folders(extra: str | None = None) -> list[Path]:
    """The shipped lessons' folder, then a teacher's (``extra``, e.g. the HEADPRUNE_LESSONS variable) if given."""
    return [SHIPPED] + ([Path(extra)] if extra else [])


def lesson_files(folder: Path) -> tuple[list[Path], str | None]:
    """The ``*.toml`` files of ``folder`` by name, at most MAX_FILES, and an error line when there are more (the
    rest are never read: the line says how many and why)."""
    files = sorted(Path(folder).glob("*.toml"))
    if len(files) <= MAX_FILES:
        return files, None
    return files[:MAX_FILES], (f"{folder}: {len(files)} lesson files, over the {MAX_FILES} read from one folder: "
                               f"the first {MAX_FILES} by name were checked, the other {len(files) - MAX_FILES} "
                               f"(from {files[MAX_FILES].name}) were not; split the folder.")


def folders_stamp(folders: Iterable[Path]) -> tuple:
    """What changes when a lesson of ``folders`` changes (each file's name, time and size; never raises: a dangling
    link or a FIFO is stamped too, and reported when read): the dashboard re-reads the lessons when it moves."""
    stamp = []
    for folder in folders:
        if kind_of(folder) != "dir":
            continue
        for path in lesson_files(folder)[0]:
            try:
                info = os.stat(path)
                stamp.append((str(path), info.st_mtime_ns, info.st_size))
            except OSError:
                stamp.append((str(path), None, None))
    return tuple(stamp)


def load_lessons(folders: Iterable[Path], *, pages: Iterable[str]) -> tuple[dict[str, Lesson], list[str]]:
    """Every ``*.toml`` lesson of ``folders`` by name, and the error lines of those that could not be used (the
    rest still load). A later folder's lesson of the same name is an error (the first one stays)."""
    lessons, errors, _ = check_lessons(folders, pages=pages, files=False)
    return lessons, errors


def check_lessons(paths: Iterable[Path], *, pages: Iterable[str], files: bool = True,
                  controls: Mapping[str, Controls] | None = None) -> tuple[dict[str, Lesson], list[str], int]:
    """(lessons by name, error lines, lesson files read) of ``paths``: each a folder (its ``*.toml`` files, up to
    MAX_FILES) or, with ``files``, one lesson file (its folder is the one a model folder must lie in). What the
    Lessons page shows and ``headprune lessons check`` prints: the same lines, the same rules."""
    lessons: dict[str, Lesson] = {}
    errors: list[str] = []
    pages, read = list(pages), 0
    controls = page_controls() if controls is None else controls
    for path in map(Path, paths):
        kind = kind_of(path)
        if kind == "dir":
            batch, too_many = lesson_files(path)
            folder = path
            if too_many:
                errors.append(too_many)
        elif files and kind == "file":
            batch, folder = [path], path.parent
        else:
            errors.append(f"{path}: not a folder of lessons{' or a lesson file' if files else ''}.")
            continue
        for file in batch:
            read += 1
            try:
                lesson = read_lesson(file, pages=pages, folder=folder, controls=controls)
            except LessonError as exc:
                errors.extend(str(exc).splitlines())
                continue
            if lesson.name in lessons:
                errors.append(f"{file}:1: a lesson named {lesson.name!r} was already loaded from "
                              f"{lessons[lesson.name].path}; rename one of the files.")
                continue
            lessons[lesson.name] = lesson
    return lessons, errors, read
