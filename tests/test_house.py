"""The house rules, checked: the import contract in pyproject.toml holds (and bites), no private name crosses a
module, function-local imports only defer a heavy optional import, one module registers torch hooks, and page
scripts hold layout only."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("headprune", "dashboard")
# The only imports allowed inside a function: each defers a heavy or optional module, and says so on its line.
DEFERRED = {"spacy", "datasets", "fcntl", "tomllib", "toml", "lm_eval", "peft", "submitit", "onnx", "onnxruntime",
            "gguf"}


# Never the project's files, in a checkout without git: folders a user or a tool makes inside it.
NOT_PROJECT = {"build", "dist", "runs", "venv", "env", "node_modules", "__pycache__", "site-packages"}


def _in_virtualenv(path: Path, root: Path, seen: dict[Path, bool]) -> bool:
    """Is ``path`` inside a virtualenv (a folder holding ``pyvenv.cfg``) below ``root``, whatever its name?"""
    for folder in path.relative_to(root).parents:
        folder = root / folder
        if folder not in seen:
            seen[folder] = (folder / "pyvenv.cfg").is_file()
        if seen[folder]:
            return True
    return False


def _walk(root: Path):
    """Relative paths of the files below ``root``, not descending into hidden folders or ``NOT_PROJECT``."""
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in NOT_PROJECT and not d.endswith(".egg-info")]
        yield from (str((Path(folder) / f).relative_to(root)) for f in files)


def project_files(root: Path = ROOT, suffix: str = ".py") -> list[Path]:
    """The project's own files ending in ``suffix``: what ``git ls-files`` lists (tracked, plus new files git does
    not ignore), never a virtualenv, build folder or cache inside the checkout (the README puts ``.venv`` there,
    and other packages' files are none of the house's business: one is big5-encoded, some register hooks).
    Outside a git checkout (an unpacked sdist), a walk that skips hidden folders and ``NOT_PROJECT``."""
    try:
        run = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                             capture_output=True, timeout=60)
        listed = run.stdout.decode().split("\0") if run.returncode == 0 and (root / ".git").exists() else None
    except (OSError, subprocess.TimeoutExpired):  # no git on this machine
        listed = None
    if listed is None:
        listed = list(_walk(root))
    seen: dict[Path, bool] = {}
    paths = (root / name for name in listed if name.endswith(suffix))
    return sorted(p for p in paths if p.is_file() and not _in_virtualenv(p, root, seen))


def sources(root: Path = ROOT) -> list[Path]:
    """The Python files of the packages the house rules govern."""
    return [p for p in project_files(root) if p.relative_to(root).parts[0] in PACKAGES]


def lint_imports(cwd: Path) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(cwd), "PATH": "/usr/bin:/bin", "NO_COLOR": "1",
                               "TERM": "dumb", "COLUMNS": "200"})


def test_the_import_contract_holds():
    run = lint_imports(ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """A copy of the tree with one import from the model layer up into the workspace fails lint-imports."""
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.bz2"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    mask = tmp_path / "headprune" / "model" / "mask.py"
    upward = "\nfrom ..workspace import Workspace  # noqa: E402,F401  (deliberately upward)\n"
    mask.write_text(mask.read_text() + upward)
    run = lint_imports(tmp_path)
    assert run.returncode != 0
    assert "BROKEN" in run.stdout and "headprune.model.mask -> headprune.workspace" in run.stdout, run.stdout


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def test_no_private_name_is_imported_across_modules():
    crossings = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                module_private = any(part.startswith("_") and not part.startswith("__")
                                     for part in (node.module or "").split("."))
                if private or module_private:
                    crossings.append(f"{_module_of(path)}:{node.lineno}: {ast.unparse(node)}")
    assert crossings == []


def test_function_local_imports_only_defer_heavy_optional_modules():
    found = []
    for path in sources():
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in (n for stmt in node.body for n in ast.walk(stmt)):
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    name = (inner.module if isinstance(inner, ast.ImportFrom) else inner.names[0].name) or ""
                    top = name.split(".")[0]
                    explained = "#" in lines[inner.lineno - 1] or (inner.lineno >= 2 and "#" in lines[inner.lineno - 2])
                    if top not in DEFERRED or not explained or getattr(inner, "level", 0):
                        found.append(f"{_module_of(path)}:{inner.lineno}: {ast.unparse(inner)}")
    assert found == []


HOUSE_TESTS = {"test_house.py", "test_house_layout.py"}  # they spell the hook calls they look for


def hook_registering_files(root: Path = ROOT) -> set[str]:
    pattern = re.compile(r"register_forward|register_full_backward")
    return {p.relative_to(root).as_posix() for p in project_files(root)
            if p.name not in HOUSE_TESTS and pattern.search(p.read_text(encoding="utf-8"))}


def test_one_module_registers_torch_hooks():
    assert hook_registering_files() == {"headprune/model/hooks.py"}


PAGE_WORK = {
    "builds an evaluator": re.compile(r"LiveEvaluator|live_evaluator\(|perturb_batches"),
    "parses a file": re.compile(r"\bcsv\.|json\.loads|\bopen\("),
    "spells a store key": re.compile(r"store\(\)|['\"][a-z]+\|"),
}


@pytest.mark.parametrize("page", [p for p in sources() if p.parent == ROOT / "dashboard" / "pages"],
                         ids=lambda p: p.name)
def test_page_scripts_hold_layout_only(page):
    text = page.read_text(encoding="utf-8")
    assert [what for what, pattern in PAGE_WORK.items() if pattern.search(text)] == []


# -- every read of a user's file goes through the one safe reader (issue 46) ---------------------------------------
# (module, function) -> why it may read a file itself: each reads the project's own files, or is the reader
OWN_READS = {
    ("headprune/userinput.py", "read_user_bytes"): "the one safe reader of a user's file",
    ("headprune/outdir.py", "_read_regular"): "outdir sits beside userinput (no import): its own regular-file peek",
    ("headprune/cli/dashboard.py", "_load_toml"): "the Streamlit configuration shipped in the package",
    ("headprune/cli/docs.py", "sources_key"): "hashing the manual's own sources",
    ("headprune/controls.py", "_parse"): "the package's own page scripts",
    ("headprune/demos/build.py", "read_info"): "a demo's info file in headprune's own cache",
    ("headprune/demos/corpus.py", "reviews"): "the corpus shipped in the package",
    ("headprune/model/loading.py", "_load_state_dict"): "weights of a folder load_model checked (weights_only)",
    ("headprune/protocol/smoke.py", "run_smoke"): "the run file and table this run wrote a moment ago",
    ("headprune/viz.py", "figure_images"): "the images kaleido wrote a moment ago in a temporary folder of its own",
}
LOADERS = {("json", "load"), ("torch", "load"), ("np", "load"), ("np", "loadtxt"), ("np", "genfromtxt"),
           ("numpy", "load"), ("numpy", "loadtxt"), ("tomllib", "load"), ("pickle", "load"), ("pd", "read_csv")}


def _reads_a_file(call: ast.Call) -> bool:
    """Whether ``call`` reads a file by name or handle: read_text / read_bytes, open(...) for reading (no mode, or
    one with "r"), os.open with O_RDONLY, or a loader (json.load, np.loadtxt, torch.load, ...) not given an
    in-memory buffer."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    owner = ast.unparse(func.value) if isinstance(func, ast.Attribute) else ""
    if name in ("read_text", "read_bytes"):
        return True
    if name == "open" and owner == "os":
        return "O_RDONLY" in ast.unparse(call)
    if name == "open" and owner not in ("webbrowser",):   # open(file, mode), path.open(mode), bz2.open(file, mode)
        at = 0 if owner and owner not in ("bz2", "gzip", "lzma", "io", "codecs") else 1
        given = call.args[at:at + 1] + [k.value for k in call.keywords if k.arg == "mode"]
        mode = given[0].value if given and isinstance(given[0], ast.Constant) else "r"
        return "r" in str(mode)
    if (owner, name) in LOADERS:
        first = call.args[0] if call.args else None
        return not (isinstance(first, ast.Call) and ast.unparse(first.func) in ("io.StringIO", "io.BytesIO"))
    return False


def raw_reads(root: Path = ROOT) -> list[str]:
    """``module:line function`` of every raw file read outside ``OWN_READS``."""
    found = []

    def visit(node: ast.AST, module: str, function: str) -> None:   # each call named by its innermost function
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and _reads_a_file(node) and (module, function) not in OWN_READS:
            found.append(f"{module}:{node.lineno} {function}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, module, function)

    for path in sources(root):
        visit(ast.parse(path.read_text(encoding="utf-8")), path.relative_to(root).as_posix(), "<module>")
    return sorted(found, key=lambda line: (line.split(":")[0], int(line.split(":")[1].split(" ")[0])))


def test_every_read_of_a_users_file_goes_through_the_safe_reader():
    """A FIFO named as a plan hung the CLI, /dev/zero as a config.json was a MemoryError (issue 46): every read goes
    through ``userinput.read_user_bytes`` (regular files only, roots after links, size and depth limits), except
    the reads of the project's own files listed in OWN_READS with their reason."""
    assert raw_reads() == []


def test_the_raw_read_scan_finds_a_new_reader(tmp_path):
    package = tmp_path / "headprune"
    package.mkdir()
    (package / "plans.py").write_text("import json\nfrom pathlib import Path\n\n\ndef load(p):\n"
                                      "    return json.loads(Path(p).read_text())\n\n\ndef peek(p):\n"
                                      "    with open(p) as f:\n        return f.read(3)\n\n\ndef table(p):\n"
                                      "    return np.loadtxt(p)\n\n\ndef fine(p, text):\n"
                                      "    open(p, 'w').write(text)\n    Path(p).open('a').write(text)\n"
                                      "    return np.loadtxt(io.StringIO(text))\n")
    assert [line.split(" ")[1] for line in raw_reads(tmp_path)] == ["load:", "peek:", "table:"]
