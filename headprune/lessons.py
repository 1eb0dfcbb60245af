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
load. A file over MAX_BYTES is refused unread; a model folder is resolved (symlinks too) and refused unless it lies
inside the lessons folder, so a lesson never makes the server load a file elsewhere.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .criteria import available
from .data import NAMED_DATA
from .errors import HeadpruneError
from .model.loading import NAMED_MODELS
from .protocol.spec import KeyLines, parse_toml
from .viewstate import LESSON, ROWS, ViewState

MAX_BYTES = 256 * 1024          # a lesson is a page of text; a 10 MB file is a mistake (refused unread)
MAX_STEPS = 40
MAX_TEXT = 4000                 # characters of one text field
MINUTES = (1, 45)
MAX_FILES = 200                 # lesson files read from one folder (a class needs a handful)
LESSON_KEYS = {"title": True, "summary": True, "minutes": True, "model": True, "data": True, "step": True,
               "rows": False}
TEXT_KEYS = {"title": True, "text": True, "look": False, "question": False, "answer": False}
STATE_KEYS = ("page", "mask", "head", "criteria", "criterion", "ratio", "sentence", "roles")
SHIPPED = Path(__file__).resolve().parent / "resources" / "lessons"
ENV = "HEADPRUNE_LESSONS"       # a teacher's folder of lessons, listed after the shipped ones


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


def grid_shape(model_folder: Path) -> tuple[int, int] | None:
    """(layers, heads) of a model folder from its config.json, without loading weights; None when unreadable."""
    try:
        config = json.loads((model_folder / "config.json").read_text())
        return int(config["num_hidden_layers"]), int(config["num_attention_heads"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def named_shape(name: str) -> tuple[int, int] | None:
    """The head grid of a named model (its folder is built once, then cached)."""
    return grid_shape(Path(NAMED_MODELS[name].build()))


class _File:
    """One lesson file being read: its name, key lines, and the errors found so far."""

    def __init__(self, path: Path, text: str):
        self.path, self.lines, self.errors = path, KeyLines(text), []

    def error(self, where: tuple, problem: str) -> None:
        self.errors.append(f"{self.path}:{self.lines.line(where) or 1}: {problem}")


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


def _model(file: _File, value, folder: Path) -> tuple[str | None, tuple[int, int] | None]:
    """The lesson's model (a named one, or a folder inside ``folder``) and its head grid."""
    if not isinstance(value, str) or not value:
        file.error(("model",), f"'model' must be a named model ({', '.join(NAMED_MODELS)}) or a folder inside "
                               f"{folder}.")
        return None, None
    if value in NAMED_MODELS:
        return value, named_shape(value)
    target = (folder / value).resolve()
    if not target.is_relative_to(folder.resolve()):
        file.error(("model",), f"model folder {value!r} is outside the lessons folder {folder}; a lesson may name "
                               f"a named model ({', '.join(NAMED_MODELS)}) or a folder inside its own folder.")
        return None, None
    shape = grid_shape(target)
    if shape is None:
        file.error(("model",), f"model folder {value!r} has no readable config.json; accepted: a named model "
                               f"({', '.join(NAMED_MODELS)}) or a saved model's folder inside {folder}.")
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


def read_lesson(path: Path, *, pages: Iterable[str], folder: Path | None = None) -> Lesson:
    """The lesson in ``path``; LessonError with every problem found, one ``FILE:LINE: problem`` per line.

    ``pages``: the page names a step may open (the dashboard's address names). ``folder``: the lessons folder a
    model folder must lie in (default: the file's own folder)."""
    path, pages = Path(path), list(pages)
    folder = Path(folder) if folder is not None else path.parent
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise LessonError(f"{path}:1: the file is {size:,} bytes; a lesson is at most {MAX_BYTES:,} bytes "
                          "(a few pages of text).")
    name = path.stem
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
        obj = parse_toml(text)
    except UnicodeDecodeError:
        raise LessonError(f"{path}:1: not UTF-8 text; a lesson is a TOML file.") from None
    except ValueError as exc:   # tomllib's and toml's decode errors: their messages name the line
        line = re.search(r"line (\d+)", str(exc))
        raise LessonError(f"{path}:{line.group(1) if line else 1}: not valid TOML: {exc}") from None
    file = _File(path, text)
    if not LESSON.fullmatch(name):
        file.error((), f"the file name {name!r} is not a lesson name: 1-40 lower-case letters, digits and '-' "
                       "(it is the lesson's name in links).")
    for key in obj:
        if key not in LESSON_KEYS:
            file.error((key,), f"unknown key '{key}'; a lesson's keys are: {', '.join(LESSON_KEYS)}.")
    head = _text(file, obj, (), {k: True for k in ("title", "summary")})
    minutes = obj.get("minutes")
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not MINUTES[0] <= minutes <= MINUTES[1]:
        file.error(("minutes",) if "minutes" in obj else (), f"'minutes' must be a whole number of class minutes "
                                                             f"in [{MINUTES[0]}, {MINUTES[1]}].")
    model, shape = _model(file, obj.get("model"), folder)
    data = obj.get("data")
    if data not in NAMED_DATA:
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
        steps.append(Step(**words, state=_state(file, table, where, pages=pages, shape=shape)))
    if file.errors:
        raise LessonError("\n".join(file.errors))
    return Lesson(name=name, title=head["title"], summary=head["summary"], minutes=minutes, model=model, data=data,
                  steps=tuple(steps), path=path, rows=rows)


def lesson_folders(extra: str | None = None) -> list[Path]:
    """The shipped lessons' folder, then a teacher's (``extra``, e.g. the HEADPRUNE_LESSONS variable) if given."""
    return [SHIPPED] + ([Path(extra)] if extra else [])


def load_lessons(folders: Iterable[Path], *, pages: Iterable[str]) -> tuple[dict[str, Lesson], list[str]]:
    """Every ``*.toml`` lesson of ``folders`` by name, and the error lines of those that could not be used (the
    rest still load). A later folder's lesson of the same name is an error (the first one stays)."""
    lessons, errors, _ = check_lessons(folders, pages=pages, files=False)
    return lessons, errors


def check_lessons(paths: Iterable[Path], *, pages: Iterable[str], files: bool = True) \
        -> tuple[dict[str, Lesson], list[str], int]:
    """(lessons by name, error lines, lesson files read) of ``paths``: each a folder (its ``*.toml`` files, up to
    MAX_FILES) or, with ``files``, one lesson file (its folder is the one a model folder must lie in). What the
    Lessons page shows and ``headprune lessons check`` prints: the same lines, the same rules."""
    lessons: dict[str, Lesson] = {}
    errors: list[str] = []
    pages, read = list(pages), 0
    for path in map(Path, paths):
        if path.is_dir():
            batch, folder = sorted(path.glob("*.toml"))[:MAX_FILES], path
        elif files and path.is_file():
            batch, folder = [path], path.parent
        else:
            errors.append(f"{path}: not a folder of lessons{' or a lesson file' if files else ''}.")
            continue
        for file in batch:
            read += 1
            try:
                lesson = read_lesson(file, pages=pages, folder=folder)
            except LessonError as exc:
                errors.extend(str(exc).splitlines())
                continue
            except OSError as exc:
                errors.append(f"{file}:1: cannot be read ({exc.strerror}).")
                continue
            if lesson.name in lessons:
                errors.append(f"{file}:1: a lesson named {lesson.name!r} was already loaded from "
                              f"{lessons[lesson.name].path}; rename one of the files.")
                continue
            lessons[lesson.name] = lesson
    return lessons, errors, read
