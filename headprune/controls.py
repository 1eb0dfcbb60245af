"""The labels of the dashboard's controls, read from the page scripts' source: what a lesson step may name.

A lesson step says "press **Compute scores**"; ``headprune lessons check`` refuses a step that names a button,
tab, checkbox or select box its page does not have (issue 45: a lesson said "press Prune the lowest 50%" where the
button is "Apply"). The labels come from a static scan of the dashboard package's Python files (``ast``: nothing
imported, nothing run), not from a registry each page would declare: the labels then live in one place, the page
code, so no second list can fall behind when a page is edited (pages change every round); the scan takes
milliseconds and needs neither Streamlit nor a model, so the check runs wherever the library does. The browser walk
of the shipped lessons (tests/test_lessons_browser.py) confirms that what the scan finds is what the page shows.

What the scan reads:

- the page table: every tuple of strings in the dashboard's modules that holds a page script's file name
  (``"4_Prune.py"``) and a page's address name (``"prune"``, from ``viewstate.PAGE_NAMES``);
- in a page script, every call of a Streamlit widget (:data:`WIDGETS`, on ``st`` or on any container: a column,
  the sidebar, a slot) with its label: the first argument or ``label=``, a string, an f-string (each ``{...}`` part
  matches any text), a conditional of two of them, or the list given to ``st.tabs``; and the literal options of a
  select box, radio or pills;
- calls of the dashboard's own functions (``long_job(key, "Compute scores", ...)``, ``head_picker(..., "Head",
  ...)``): the labels each function draws itself, and the arguments it passes on as a widget's label, followed
  from function to function until nothing changes; every page also has what ``page()`` draws (the sidebar, the
  lesson panel).

What it cannot see: a label computed at run time from a variable (the Roles page's tabs, ``st.tabs(list(ROLES))``),
which a step therefore cannot name. Markdown in a label (``**bold**``) is dropped, as the page renders it.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

from .viewstate import PAGE_NAMES

# Streamlit's widgets and containers with a label, by the argument holding it (position, or keyword only: None)
WIDGETS = {name: 0 for name in (
    "button", "download_button", "form_submit_button", "link_button", "checkbox", "toggle", "radio", "selectbox",
    "multiselect", "slider", "select_slider", "number_input", "text_input", "text_area", "file_uploader",
    "expander", "popover", "tabs", "pills", "segmented_control", "date_input", "time_input", "color_picker",
    "camera_input", "data_editor")}
WIDGETS["page_link"] = None            # page_link(page, label=...): the label is a keyword
OPTIONED = {"radio", "selectbox", "multiselect", "pills", "segmented_control", "select_slider"}
FRAME = "page"                         # the function every page calls first: what it draws is on every page


@dataclass(frozen=True)
class Controls:
    """The labels of one page's controls: each a pattern (an f-string's parts match any text), plus the literal
    options of its select boxes and radios."""

    page: str
    file: str
    labels: tuple[str, ...]            # as written, for messages ("Compute scores", "Score the pruned model (…)")
    patterns: tuple[re.Pattern, ...]

    def has(self, name: str) -> bool:
        """Whether ``name`` (as a lesson writes it) is one of these labels or options (case and blanks aside)."""
        wanted = " ".join(name.split())
        return any(p.fullmatch(wanted) for p in self.patterns)


def dashboard_folder() -> Path | None:
    """The installed ``dashboard`` package's folder, found without importing it; None when it is not installed."""
    try:
        spec = importlib.util.find_spec("dashboard")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations)))
    return folder if (folder / "pages").is_dir() else None


# -- labels as written and as patterns ------------------------------------------------------------------------------

_MARKDOWN = re.compile(r"\*\*|\*|`|:material/[a-z_]+:")


def _pieces(node: ast.AST) -> list[list[str | None]] | None:
    """The label(s) an expression can evaluate to, each a list of literal parts and None for a formatted part;
    None when it is not a string the scan can read."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [[node.value]]
    if isinstance(node, ast.JoinedStr):
        parts: list[str | None] = []
        for value in node.values:
            parts.append(value.value if isinstance(value, ast.Constant) else None)
        return [parts]
    if isinstance(node, ast.IfExp):
        both = [_pieces(node.body), _pieces(node.orelse)]
        return [p for side in both if side for p in side] or None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _pieces(node.left), _pieces(node.right)
        if left and right:
            return [a + b for a in left for b in right]
    return None


def _label(parts: list[str | None]) -> tuple[str, str]:
    """(the label as a reader sees it, "…" for formatted parts; its regular expression)."""
    shown, pattern = [], []
    for part in parts:
        if part is None:
            shown.append("…")
            pattern.append(".+?")
        else:
            text = " ".join(_MARKDOWN.sub("", part).split(" "))
            shown.append(text)
            pattern.append(re.escape(text))
    return " ".join("".join(shown).split()), "".join(pattern)


def _strings(node: ast.AST) -> list[list[str | None]]:
    """Labels in a list or tuple of strings (``st.tabs(["a", "b"])``, a select box's options)."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return [p for item in node.elts for p in (_pieces(item) or [])]
    return []


# -- the scan ---------------------------------------------------------------------------------------------------------

@dataclass
class _Function:
    params: list[str]
    calls: list[ast.Call]
    labels: set[tuple[str, str]]
    label_params: set[str]


def _call_name(call: ast.Call) -> tuple[str | None, bool]:
    """(the called name, whether it is an attribute call ``x.name(...)``)."""
    if isinstance(call.func, ast.Name):
        return call.func.id, False
    if isinstance(call.func, ast.Attribute):
        return call.func.attr, True
    return None, False


def _argument(call: ast.Call, position: int | None, keyword: str) -> ast.AST | None:
    for kw in call.keywords:
        if kw.arg == keyword:
            return kw.value
    if position is not None and position < len(call.args) and not any(isinstance(a, ast.Starred)
                                                                       for a in call.args[:position + 1]):
        return call.args[position]
    return None


def _labels_of_call(call: ast.Call, functions: dict[str, _Function], local: set[str]) \
        -> tuple[set[tuple[str, str]], set[str]]:
    """(labels this call draws, names of ``local`` variables it uses as a label)."""
    name, attribute = _call_name(call)
    found: set[tuple[str, str]] = set()
    uses: set[str] = set()

    def take(node: ast.AST | None, many: bool = False) -> None:
        if node is None:
            return
        if isinstance(node, ast.Name) and node.id in local:
            uses.add(node.id)
        for parts in (_strings(node) if many else _pieces(node) or []):
            found.add(_label(parts))

    if name in WIDGETS and (attribute or name == "page_link"):
        take(_argument(call, WIDGETS[name], "label"), many=name == "tabs")
        if name in OPTIONED:
            take(_argument(call, 1, "options"), many=True)
    elif name in functions and not attribute:
        target = functions[name]
        found |= target.labels
        for i, param in enumerate(target.params):
            if param in target.label_params:
                take(_argument(call, i, param))
    return found, uses


def _functions(trees: list[ast.Module]) -> dict[str, _Function]:
    """Every function defined in ``trees`` (module level and nested), by name, with the labels it draws (itself and
    through the functions it calls) and the parameters it uses as a label, to a fixed point."""
    functions: dict[str, _Function] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
                functions.setdefault(node.name, _Function(params, calls, set(), set()))
    changed = True
    while changed:
        changed = False
        for fn in functions.values():
            for call in fn.calls:
                labels, uses = _labels_of_call(call, functions, set(fn.params))
                if not labels <= fn.labels or not uses <= fn.label_params:
                    fn.labels |= labels
                    fn.label_params |= uses
                    changed = True
    return functions


def _page_table(trees: list[ast.Module]) -> dict[str, str]:
    """{address name: page script file}: from every tuple of strings naming a ``*.py`` file and a page."""
    table: dict[str, str] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and all(isinstance(e, ast.Constant) for e in node.elts):
                values = [e.value for e in node.elts]
                files = [v for v in values if isinstance(v, str) and v.endswith(".py")]
                names = [v for v in values if v in PAGE_NAMES]
                if len(files) == 1 and len(names) == 1:
                    table.setdefault(names[0], files[0])
    return table


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


@functools.lru_cache(maxsize=4)
def _scan(folder: Path, stamp: tuple) -> dict[str, Controls]:
    modules = [t for t in map(_parse, sorted(folder.glob("*.py"))) if t is not None]
    functions = _functions(modules)
    frame = functions[FRAME].labels if FRAME in functions else set()
    pages = {}
    for name, file in _page_table(modules).items():
        tree = _parse(folder / "pages" / file)
        if tree is None:
            continue
        own = _functions([tree])
        scope = {**functions, **own}
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        labels = set(frame) if any(_call_name(c) == (FRAME, False) for c in calls) else set()
        for fn in own.values():                  # the page's own functions draw on the page when called
            labels |= fn.labels
        for call in calls:
            labels |= _labels_of_call(call, scope, set())[0]
        ordered = sorted(labels)
        pages[name] = Controls(page=name, file=file, labels=tuple(shown for shown, _ in ordered),
                               patterns=tuple(re.compile(" ".join(p.split()), re.I) for _, p in ordered))
    return pages


def page_controls(folder: Path | None = None) -> dict[str, Controls] | None:
    """The controls of every page of the dashboard in ``folder`` (default: the installed ``dashboard`` package), by
    address name; None when there is no dashboard to read. Re-scanned when a script changes."""
    folder = folder or dashboard_folder()
    if folder is None:
        return None
    files = sorted(folder.glob("*.py")) + sorted((folder / "pages").glob("*.py"))
    stamp = tuple((str(f), f.stat().st_mtime_ns) for f in files)
    return _scan(folder, stamp)


__all__ = ["Controls", "WIDGETS", "dashboard_folder", "page_controls"]
