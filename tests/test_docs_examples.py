"""Every ```bash and ```python block of README.md and docs/ runs, on the offline demos, or says why not.

The convention (issue 38), for whoever writes docs:

- A block runs unless the line directly above its fence is ``<!-- skip: REASON -->`` (GPU, network, hours, a
  placeholder path ...); a skip without a reason fails.
- A ``text`` block with ``<!-- output -->`` on the line directly above it, after a runnable block (blank lines
  between them allowed), is what that block prints: each of its non-blank lines must appear, in order, inside the
  block's output lines (stdout, then stderr); a line ``...`` stands for anything. Write it only for output that is
  deterministic (seeded, the cached demos, no timings).
- The blocks of one page run in order in one scratch folder (a later block reads what an earlier one wrote), with
  the repository's ``protocols/`` and ``benchmarks/`` beside them, PYTHONPATH at this checkout and one thread.
  bash runs with ``-euo pipefail``, so any failing command fails the block.

The counts of executed and skipped blocks (with each reason) are printed at the end of the pytest run. The pages
read are the ``HEADPRUNE_DOCS_ROOT`` checkout's (default: this one), so a scratch copy can be checked
(``test_a_broken_example_fails_the_run``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("HEADPRUNE_DOCS_ROOT") or REPO)
DEMOS = ("demo", "demo-lm", "demo-circuit")   # the examples run on these (tests/conftest.py builds them first)
LANGUAGES = ("bash", "python")
SKIP = re.compile(r"^\s*<!--\s*skip:(.*?)-->\s*$")
OUTPUT = re.compile(r"^\s*<!--\s*output\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
SHARED = ("protocols", "benchmarks")   # repository folders the examples name by relative path
BLOCK_TIMEOUT = 300                    # s: one block; the blocks together stay within ~4 min in CI


@dataclass
class Block:
    """One fenced code block of a page."""

    page: str            # path relative to the root
    line: int            # 1-based line of the opening fence
    language: str
    code: str
    skip: str | None = None           # the reason, when skipped
    expected: list[str] = field(default_factory=list)   # lines of its <!-- output --> block

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md"] + sorted((root / "docs").rglob("*.md"))


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The bash/python blocks of one page, with their skip reason and expected output."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    previous = None   # the block of the last fence, when it was a bash/python one: an output block's owner
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        marker, language, start = fence.group(2), fence.group(3).lower(), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip().startswith(marker)), len(lines))
        code = "\n".join(line[len(fence.group(1)):] for line in lines[i + 1:end])
        above = lines[start - 1] if start else ""
        if language in LANGUAGES:
            skip = SKIP.match(above)
            previous = Block(str(path.relative_to(root)), start + 1, language, code,
                             skip=skip.group(1).strip() if skip else None)
            found.append(previous)
        else:
            if OUTPUT.match(above) and previous is not None:
                previous.expected = [x for x in code.splitlines() if x.strip()]
            previous = None
        i = end + 1
    return found


def all_blocks(root: Path = ROOT) -> list[Block]:
    return [b for page in pages(root) if page.is_file() for b in blocks(page, root)]


def matches(expected: list[str], output: str) -> str | None:
    """None when every expected line lies, in order, inside a line of ``output`` (``...`` matches anything);
    else the first line not found."""
    produced = output.splitlines()
    at = 0
    for want in expected:
        if want.strip() == "...":
            continue
        while at < len(produced) and want.strip() not in produced[at]:
            at += 1
        if at == len(produced):
            return want
        at += 1
    return None


def scratch_folder(base: Path, root: Path = ROOT) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    for name in SHARED:
        if (root / name).exists() and not (base / name).exists():
            (base / name).symlink_to(root / name)
    return base


def run_block(block: Block, folder: Path, root: Path = ROOT, timeout: int = BLOCK_TIMEOUT) -> tuple[int, str]:
    """Run ``block`` in ``folder``: (exit status, stdout + stderr)."""
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false")
    if block.language == "python":
        script = folder / f"block_{block.line}.py"
        script.write_text(block.code + "\n", encoding="utf-8")
        argv = [sys.executable, str(script)]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", block.code]
    try:
        run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return 124, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    return run.returncode, run.stdout + run.stderr


def check_block(block: Block, folder: Path, root: Path = ROOT) -> None:
    """Fail (pytest.fail) unless ``block`` exits 0 and prints what its output block shows."""
    code, output = run_block(block, folder, root)
    if code != 0:
        pytest.fail(f"{block.id}: exit {code}\n--- the block\n{block.code}\n--- its output (last 3000 characters)\n"
                    f"{output[-3000:]}", pytrace=False)
    missing = matches(block.expected, output)
    if missing is not None:
        pytest.fail(f"{block.id}: printed no line holding {missing!r}\n--- its output\n{output[-3000:]}",
                    pytrace=False)


# -- the run ----------------------------------------------------------------------------------------------------

BLOCKS = all_blocks()
RESULTS: dict[str, str] = {}   # block id -> passed | failed | skipped: REASON


class Summary:
    """Prints the counts at the end of the run (a pytest plugin object, registered by the fixture below)."""

    def pytest_terminal_summary(self, terminalreporter):
        ran = [r for r in RESULTS.values() if not r.startswith("skipped")]
        reasons = Counter(r.removeprefix("skipped: ") for r in RESULTS.values() if r.startswith("skipped"))
        terminalreporter.write_line(
            f"doc examples: {len(ran)} executed ({ran.count('passed')} passed, {ran.count('failed')} failed), "
            f"{sum(reasons.values())} skipped")
        for reason, n in reasons.most_common():
            terminalreporter.write_line(f"  skipped {n} x: {reason}")


@pytest.fixture(scope="module", autouse=True)
def summary(request):
    plugin = Summary()
    if not request.config.pluginmanager.is_registered(plugin):
        request.config.pluginmanager.register(plugin, "headprune-doc-examples")
    yield


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """One scratch folder per page, made on first use."""
    made: dict[str, Path] = {}

    def folder(page: str) -> Path:
        if page not in made:
            made[page] = scratch_folder(tmp_path_factory.mktemp(re.sub(r"\W", "_", page)))
        return made[page]
    return folder


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_doc_example(block, folders):
    if block.skip is not None:
        RESULTS[block.id] = f"skipped: {block.skip}"
        assert block.skip, f"{block.id}: a skip marker needs a reason (<!-- skip: GPU -->)"
        pytest.skip(block.skip)
    RESULTS[block.id] = "failed"
    start = time.perf_counter()
    check_block(block, folders(block.page))
    RESULTS[block.id] = "passed"
    print(f"{block.id}: {time.perf_counter() - start:.1f} s")


# -- the runner itself ------------------------------------------------------------------------------------------

PAGE = """# A page

<!-- skip: needs a GPU -->
```bash
nvidia-smi
```

```bash
echo "accuracy 0.5"
```

<!-- output -->
```text
accuracy 0.5
```

```python
print(sum(range(4)))
```
"""


def test_blocks_markers_and_outputs_are_read(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text(PAGE, encoding="utf-8")
    found = all_blocks(tmp_path)
    assert [(b.line, b.language, b.skip) for b in found] == [(4, "bash", "needs a GPU"), (8, "bash", None),
                                                             (17, "python", None)]
    assert found[1].expected == ["accuracy 0.5"] and found[2].expected == []
    assert matches(["a", "...", "c"], "xa\nb\ncy") is None and matches(["c", "a"], "a\nc") == "a"
    folder = scratch_folder(tmp_path / "run", tmp_path)
    assert run_block(found[2], folder, tmp_path) == (0, "6\n")


BROKEN = """# Broken

```bash
python3 -m headprune mask --scores no-such-scores.json --ratio 0.5 --out mask.json
```

```python
print("accuracy", 0.25)
```

<!-- output -->
```text
accuracy 0.75
```

```bash
echo fine
```
"""


def test_a_broken_example_fails_the_run(tmp_path):
    """A scratch copy of the checkout whose docs hold a failing command and a wrong output: pytest fails on both,
    passes the good block, and prints the counts."""
    root = tmp_path / "copy"
    (root / "docs").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "README.md").write_text("# headprune\n", encoding="utf-8")
    (root / "docs" / "broken.md").write_text(BROKEN, encoding="utf-8")
    (root / "tests" / "test_docs_examples.py").write_text(Path(__file__).read_text(encoding="utf-8"))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "test_doc_example",
                          str(root / "tests" / "test_docs_examples.py")], cwd=root, capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, HEADPRUNE_DOCS_ROOT=str(root), PYTHONPATH=str(REPO)))
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 failed, 1 passed" in run.stdout, run.stdout
    assert "docs/broken.md:3: exit 2" in run.stdout and "error:" in run.stdout
    assert "printed no line holding 'accuracy 0.75'" in run.stdout
    assert "doc examples: 3 executed (1 passed, 2 failed), 0 skipped" in run.stdout
