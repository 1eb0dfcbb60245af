"""MkDocs hooks: the pages that come from the code, written at build time so they cannot drift from it.

- ``index.md``: the front page is README.md itself (its ``docs/...`` links rewritten to the site's paths), and
  README's picture is copied in, so the README and the site's home never disagree.
- ``reference/cli.md``: every command, from the argparse parsers ``headprune.cli.build_parser()`` builds: the
  groups and examples of ``headprune --help``, then each command's usage and options (flags, default, choices, help).
- ``reference/protocol.md``: every key of a protocol file, table by table, from the spec's declarations
  (``headprune.protocol.spec``: the dataclass fields, their defaults and the comment declared beside each), with
  each numeric key's limits as the spec states them: the message it gives for a value out of range, read by parsing
  a small protocol with that value (so the page says exactly what the check says).
- Sections: a section of ``nav`` whose first page is ``DIR/index.md`` also lists every other page of ``docs/DIR``
  that the nav does not name yet (pages other work adds appear without an edit here; reorder them in mkdocs.yml).

tests/test_docs_reference.py compares these pages with ``--help`` and with the keys the spec accepts.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
README_PICTURES = ("assets/dashboard.png",)


# -- the front page ---------------------------------------------------------------------------------------------

def front_page(readme: str) -> str:
    """README.md as the site's home: links into ``docs/`` lose that prefix (README sits one folder up)."""
    return re.sub(r"\]\(docs/", "](", readme)


# -- the CLI reference ------------------------------------------------------------------------------------------

def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(action: argparse.Action) -> str:
    if action.default in (None, argparse.SUPPRESS) or isinstance(action, (argparse._StoreTrueAction,
                                                                         argparse._StoreFalseAction)):
        return ""
    return f"`{action.default}`"


def option_rows(parser: argparse.ArgumentParser) -> list[tuple[str, list[tuple[str, str, str, str]]]]:
    """[(group title, [(flags, default, choices, help)])] of a command's parser, in ``--help``'s order."""
    groups = []
    for group in parser._action_groups:
        rows = []
        for action in group._group_actions:
            if action.help == argparse.SUPPRESS:
                continue
            flags = ", ".join(action.option_strings) or (action.metavar or action.dest)
            if action.option_strings and action.nargs != 0:
                flags += f" {action.metavar or action.dest.upper()}"
            choices = ", ".join(map(str, action.choices)) if action.choices else ""
            text = (action.help or "") % {"default": action.default, "prog": parser.prog} \
                if "%(" in (action.help or "") else (action.help or "")
            rows.append((flags, _default(action), choices, text))
        if rows:
            groups.append((group.title or "options", rows))
    return groups


def cli_reference() -> str:
    """The CLI reference page (Markdown) from ``build_parser()``."""
    from headprune.cli import build_parser, command_groups, command_help

    parser = build_parser()
    sub = _subparsers(parser)
    helps = command_help(sub)
    out = ["# Command line", "",
           "Generated from the argparse parsers when the site is built (`docs/hooks.py`): what `python -m headprune "
           "COMMAND --help` prints, as tables. `python -m headprune` and the `headprune` console script are the "
           "same program. Every command prints one JSON object on stdout; progress goes to stderr; a user error "
           "prints `error: ...` and exits 2 before any weights load.", "", "## Commands by what they do", ""]
    for title, rows in command_groups(helps):
        out += [f"**{title}**", "", "| command | what it does | example |", "|---|---|---|"]
        out += [f"| [`{name}`](#{name}) | {_cell(text)} | `{_cell(example)}` |" for name, text, example in rows]
        out.append("")
    for name, command in sub.choices.items():
        out += [f"## {name}", "", _cell(helps.get(name, "")), "", "```text", command.format_usage().strip(), "```", ""]
        if command.description:
            out += [command.description, ""]
        for title, rows in option_rows(command):
            out += [f"**{title}**", "", "| option | default | choices | help |", "|---|---|---|---|"]
            out += [f"| `{_cell(flags)}` | {_cell(default)} | {_cell(choices)} | {_cell(text)} |"
                    for flags, default, choices, text in rows]
            out.append("")
    return "\n".join(out)


# -- the protocol reference -------------------------------------------------------------------------------------

def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def toml_text(obj: dict) -> str:
    """A small TOML writer for probe protocols: scalars, then tables (one level of nesting), then arrays of tables."""
    lines, tables = [], []
    for key, value in obj.items():
        if isinstance(value, dict):
            tables.append((key, value))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables += [(f"[{key}]", item) for item in value]
        else:
            lines.append(f"{key} = {_toml_value(value)}")
    for name, table in tables:
        inner = {k: v for k, v in table.items() if not isinstance(v, dict)}
        lines += ["", f"[{name}]"] + [f"{k} = {_toml_value(v)}" for k, v in inner.items()]
        lines += [toml_text({f"{name}.{k}": v}).strip() for k, v in table.items() if isinstance(v, dict)]
    return "\n".join(lines) + "\n"


def _base(kind: str = "sparsities") -> dict:
    """A valid protocol (as a dict) of each kind: sparsity cells, a trajectory, KV plans."""
    data = {"calib": {"source": "demo"}, "eval": {"source": "demo"}}
    if kind == "kv":
        return {"models": ["demo-lm"], "data": {"calib": {"source": "demo-lm"}, "eval": {"source": "demo-lm"}},
                "kv": {"rules": ["random"], "full_shares": [0.5]}}
    base = {"models": ["demo"], "data": data, "criteria": [{"name": "random"}]}
    return base | ({"trajectory": {"step": 1}} if kind == "trajectory" else {"sparsities": [0.5]})


def _with(kind: str, path: tuple, key: str, value) -> dict:
    obj = json.loads(json.dumps(_base(kind)))
    if path == ("data", "train") or path == ("recovery",):
        obj["data"]["train"] = {"source": "demo:train"}
        obj.setdefault("recovery", {})
    if path[:1] == ("models",):
        obj["models"] = [{"model": m} for m in obj["models"]]
    at = obj
    for part in path:
        at = at.setdefault(part, {}) if isinstance(at, dict) else at[int(part)]
    at[key] = value
    return obj


def probe(kind: str, path: tuple, key: str, value) -> str | None:
    """The spec's complaint about ``key = value`` in the table at ``path`` of a ``kind`` protocol (None: accepted)."""
    from headprune.errors import HeadpruneError
    from headprune.protocol.spec import Protocol

    try:
        Protocol.parse(toml_text(_with(kind, path, key, value)), "probe.toml")
    except HeadpruneError as exc:
        named = re.search(r"key '([^']*)': (.*)", str(exc), re.S)
        return named.group(2) if named and named.group(1).split(".")[-1] == key else None
    return None


def limits(kind: str, path: tuple, key: str, default) -> str:
    """What the spec says of an out-of-range number for a numeric key ("" for other keys)."""
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    listed = isinstance(default, tuple) and key in ("sparsities", "full_shares", "report_at")
    if not (numeric or default is None or listed):
        return ""
    for value in ([[-1.0]] if listed else [-1, -1.5]):
        message = probe(kind, path, key, value)
        if message and "must" in message:
            return message[message.index("must"):].rstrip(".")
    return ""


def declared_notes(cls) -> dict[str, str]:
    """The comment declared beside each field (``name: type = default   # note``), else the docstring's
    ``name   description`` line."""
    notes = {}
    source = inspect.getsource(cls)
    for match in re.finditer(r"^\s+(\w+): [^\n#]*#\s*([^\n]*)$", source, re.M):
        notes[match.group(1)] = match.group(2).strip()
    for match in re.finditer(r"^\s{4}(\w+)\s{2,}(\S[^\n]*)$", inspect.getdoc(cls) or "", re.M):
        notes.setdefault(match.group(1), match.group(2).strip())
    return notes


HIDDEN = ("path", "where")   # Located's bookkeeping: where a part sits in the file


def _fields(cls, skip=()) -> list[tuple[str, str, object]]:
    rows = []
    for f in dataclasses.fields(cls):
        if f.name in HIDDEN or f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        rows.append((f.name, str(f.type), default))
    return rows


def _shown(default) -> str:
    if default is dataclasses.MISSING:
        return "**required**"
    if default is None or default == () or default == {} or default == "":
        return "—"
    if isinstance(default, tuple):
        default = list(default)
    return f"`{_toml_value(default)}`"


def protocol_tables() -> list[tuple[str, str, str, tuple, list]]:
    """(heading, what it holds, probe kind, probe path, [(key, type, default, note)]) for every table of the file."""
    from headprune.evaluation.harness import HarnessSpec
    from headprune.protocol import spec
    from headprune.recovery.spec import RecoverySpec

    tables = []

    def add(heading, text, cls, kind, path, skip=(), extra=(), more_notes=None):
        notes = declared_notes(cls) | (more_notes or {})
        rows = [(k, t, d, notes.get(k, "")) for k, t, d in _fields(cls, skip)] + list(extra)
        tables.append((heading, text, kind, path, rows))

    guards = [(g, "bool" if g != "label_map" else "Mapping | None", False if g != "label_map" else None,
               declared_notes(spec.ModelEntry).get(g, "")) for g in spec.GUARDS]
    # the spec's module docstring shows a commented file: `key = value   # note` lines say what top-level keys are
    example = dict(re.findall(r"^\s{4}(\w+) = [^#\n]*#\s*([^\n]*)$", spec.__doc__ or "", re.M))
    add("top level", "The protocol itself. `models` is a list of model specs or `[[models]]` tables; `criteria` a "
        "list of names or `[[criteria]]` tables. `metrics`, `headline` and the label guards set every model's "
        "(a `[[models]]` table may override them).", spec.Protocol, "sparsities", (),
        skip=("trajectory", "kv", "recovery", "lm_eval", "paper", "table", "text", "source"),  # text, source:
        # what headprune records of the file, refused in it
        extra=[("data", "tables", dataclasses.MISSING, "the data roles: [data.calib], [data.select], [data.eval], "
                                                       "[data.train]"),
               ("metrics", "list", (), "metric names, `task` (the task's own set) or lm-eval:TASK/METRIC"),
               ("headline", "str | None", None, "the metric plots and trajectories follow")] + guards
        + [(name, "table", None, f"the [{name}] table below") for name in ("trajectory", "kv", "recovery", "lm_eval",
                                                                            "table")]
        + [("paper", "array of tables", None, "the [[paper]] tables below")], more_notes=example)
    add("[data.ROLE]", f"One data role ({', '.join(spec.ROLES)}): rows drawn with the protocol's seed from a data "
        "spec. `size = \"all\"` takes every row.", spec.Role, "sparsities", ("data", "calib"))
    add("[[models]]", "A model with its own data roles (`[models.data.ROLE]`, overriding the protocol's key by "
        "key), metrics and label guards.", spec.ModelEntry, "sparsities", ("models", 0))
    add("[[criteria]]", "A criterion of the registry (`headprune criteria`) and its parameters (`params = { ... }`, "
        "checked against the limits the criterion declares: see the criteria table below).", spec.CriterionEntry,
        "sparsities", ("criteria", 0))
    add("[trajectory]", "Instead of `sparsities`: a trajectory per criterion, order and repeat.", spec.TrajectoryPart,
        "trajectory", ("trajectory",))
    add("[kv]", "Instead of sparsities, trajectory and criteria: KV cache plans, one cell per rule x full share x "
        "repeat.", spec.KVPart, "kv", ("kv",))
    add("[recovery]", "Every pruned cell also recovered (needs a `[data.train]` role); the protocol's seed and "
        "max_length unless set.", RecoverySpec, "sparsities", ("recovery",))
    harness = {k: (t, d) for k, t, d in _fields(HarnessSpec)}
    notes = declared_notes(HarnessSpec)
    tables.append(("[lm_eval]", "How lm-evaluation-harness metrics (`lm-eval:TASK/METRIC` in `metrics`) run; the "
                   "tasks come from those metrics, the seed is the protocol's. `include` folders are relative to "
                   "the protocol file.", "sparsities", ("lm_eval",),
                   [(k, *harness[k], notes.get(k, "")) for k in spec.LM_EVAL_KEYS]))
    add("[[paper]]", "A paper's values per cell, printed beside the measured ones.", spec.PaperValues, "", ())
    tables.append(("[table]", "How the results table is written.", "", (),
                   [(k, "str", None, "the criterion label of the \"% vs\" column") for k in spec.TABLE_KEYS]))
    return tables


def protocol_reference() -> str:
    """The protocol reference page (Markdown) from the spec's declarations."""
    from headprune.criteria import available, get

    out = ["# Protocol files", "",
           "Generated from `headprune/protocol/spec.py` when the site is built (`docs/hooks.py`). A protocol is a "
           "TOML file `python -m headprune run FILE --out DIR` turns into one results table (`protocols/demo.toml` "
           "is a commented example). A key not listed here, or a value outside its limits, is an `error:` naming "
           "the key and its line before any model loads. *limits* is what the check says of a value out of range.",
           ""]
    for heading, text, kind, path, rows in protocol_tables():
        out += [f"## {heading}", "", text, "", "| key | type | default | limits | what it is |",
                "|---|---|---|---|---|"]
        for key, kind_name, default, note in rows:
            bound = limits(kind, path, key, default) if kind else ""
            out.append(f"| `{key}` | `{_cell(kind_name)}` | {_cell(_shown(default))} | {_cell(bound)} | "
                       f"{_cell(note)} |")
        out.append("")
    out += ["## Criteria and their parameters", "",
            "`params` of a `[[criteria]]` table (and `--param` on the command line), as each criterion declares "
            "them.", "", "| criterion | parameter | default | limits | what it is |", "|---|---|---|---|---|"]
    for name in available():
        crit = get(name)
        for pname, param in crit.params.items():
            bound = param.check.describe() if hasattr(param.check, "describe") else ""
            bound = bound or (", ".join(map(str, param.choices)) if param.choices else "")
            out.append(f"| `{name}` | `{pname}` | `{_cell(param.default)}` | {_cell(bound)} | {_cell(param.doc)} |")
        if not crit.params:
            out.append(f"| `{name}` | — | | | |")
    return "\n".join(out) + "\n"


# -- mkdocs events ----------------------------------------------------------------------------------------------

GENERATED = {"reference/cli.md": cli_reference, "reference/protocol.md": protocol_reference}


def on_config(config, **kwargs):
    """Each nav section led by ``DIR/index.md`` also lists the other pages of ``docs/DIR`` it does not name."""
    docs = Path(config["docs_dir"])
    named = set()

    def walk(items):
        for item in items or []:
            for value in (item.values() if isinstance(item, dict) else [item]):
                if isinstance(value, list):
                    walk(value)
                elif isinstance(value, str):
                    named.add(value)

    walk(config["nav"])
    for item in config["nav"] or []:
        for value in item.values() if isinstance(item, dict) else []:
            if isinstance(value, list) and value and isinstance(value[0], str) and value[0].endswith("/index.md"):
                folder = value[0].rsplit("/", 1)[0]
                value += [f"{folder}/{p.name}" for p in sorted((docs / folder).glob("*.md"))
                          if f"{folder}/{p.name}" not in named]
    return config


def on_files(files, config, **kwargs):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=front_page(readme)))
    for picture in README_PICTURES:
        files.append(File.generated(config, picture, abs_src_path=str(ROOT / picture)))
    for name, make in GENERATED.items():
        files.append(File.generated(config, name, content=make()))
    return files
