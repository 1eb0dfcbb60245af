"""Shared fixtures: the real demo model (built once per machine) and a tiny BERT classifier saved to a folder
with a word-level tokenizer, so file/CLI tests run in milliseconds."""

from __future__ import annotations

import csv
import random
import re
import sys
import time
from contextlib import contextmanager

import pytest

WORDS = ["good", "bad", "movie", "great", "awful", "the", "a", "plot", "is", "was", "not", "very", "acting",
         "boring", "fun", "story", "and", "but", "film", "cast"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY_LABELS = {0: "neg", 1: "pos"}


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run ~50x faster on one thread than on two contended ones (the shared CI box)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def callers_main():
    """Each test leaves ``__main__`` as it found it: streamlit's AppTest runs app.py as ``__main__`` and keeps it
    there, and whatever reads ``__main__`` later (multiprocessing's spawn re-runs it) would run the dashboard."""
    before = sys.modules.get("__main__")
    yield
    if before is not None:
        sys.modules["__main__"] = before


# -- the browser tests' one server and one Chromium -----------------------------------------------------------------
CHROMIUM = "/usr/bin/chromium"


def browser_skip_reason() -> str | None:
    from pathlib import Path

    if not Path(CHROMIUM).exists():
        return f"{CHROMIUM} not found: install Debian's chromium to run the browser tests"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "python playwright is not installed"
    return None


@contextmanager
def dashboard_server(tmp_path_factory, extra_env: dict[str, str] | None = None):
    """``streamlit run app.py`` with the SMALL splits (and ``extra_env``); yields its URL, stops it on exit."""
    from app_support import ROOT, SMALL, benchmark

    reason = browser_skip_reason()
    if reason:
        print(f"skipping the browser tests: {reason}")
        pytest.skip(reason)
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with benchmark("bench_browser").streamlit_server(ROOT, {**SMALL, **(extra_env or {})}, log,
                                                     start_timeout=120) as url:
        yield url


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory):
    """One server for every browser test module that needs nothing of its own: a server takes 30-150 s to start
    on the shared 2-core box and builds each demo's workspace once (one per module cost minutes of CI)."""
    with dashboard_server(tmp_path_factory) as url:
        yield url


@pytest.fixture(scope="module")
def server(request, tmp_path_factory):
    """The browser tests' server: the shared one, or, for a module with a ``server_env(tmp_path_factory)``
    function (tests/test_lessons_browser.py: a teacher's folder of lessons), one of its own with that environment.
    Skipped, with the reason printed, when Chromium or Playwright is missing."""
    extra = getattr(request.module, "server_env", None)
    if extra is None:
        yield request.getfixturevalue("shared_server")
        return
    with dashboard_server(tmp_path_factory, extra(tmp_path_factory)) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    """One headless Chromium for every browser test module (each test opens its own pages and contexts)."""
    from playwright.sync_api import sync_playwright

    reason = browser_skip_reason()
    if reason:
        pytest.skip(reason)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM,
                              args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture(scope="session")
def demo_model_path():
    from headprune.demos.classifier import ensure_demo_model

    return ensure_demo_model()


@pytest.fixture(scope="session")
def demo(demo_model_path):
    from headprune.model.loading import load_model

    return load_model("demo", "cpu")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    from transformers import BertTokenizer

    return BertTokenizer(vocab={w: i for i, w in enumerate(SPECIAL + WORDS)})


def sentences(n: int, seed: int = 0, min_words: int = 1, max_words: int = 12) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(min_words, max_words))) for _ in range(n)]


def tiny_protocol(path, model, csv, *, name: str, sparsities: str = "[0.25, 0.5]", repeats: int = 1,
                  criteria: tuple[str, ...] = ("random",), batch_size: int | None = None) -> str:
    """A protocol file at ``path`` on ``model`` and ``csv``: 12 calibration and 20 evaluation rows of the same file,
    the ``criteria`` at ``sparsities`` (a TOML array) for ``repeats`` repeats."""
    head = f'name = "{name}"\nmodels = ["{model}"]\nsparsities = {sparsities}\nrepeats = {repeats}\n'
    if batch_size is not None:
        head += f"batch_size = {batch_size}\n"
    roles = f'\n[data.calib]\nsource = "{csv}"\nsize = 12\n\n[data.eval]\nsource = "{csv}"\nsize = 20\n'
    path.write_text(head + roles + "".join(f'\n[[criteria]]\nname = "{c}"\n' for c in criteria), encoding="utf-8")
    return str(path)


def save_tiny_lm(out, n: int = 40, seed: int = 3) -> tuple[str, str]:
    """A tiny random Llama LM (4 blocks x 8 query heads, 2 key/value groups) with a byte-level BPE tokenizer fitted
    to ``n`` seeded sentences, saved to the folder ``out``; returns (model folder, CSV of those sentences)."""
    from headprune.testing import offline_tokenizer, tiny_decoder

    texts = sentences(n, seed=seed, min_words=8, max_words=14)
    tokenizer = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_decoder("llama", vocab_size=len(tokenizer), max_positions=128)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out), write_csv(out / "rows.csv", ["text"], [[t] for t in texts])


def write_csv(path, header: list[str], rows: list[list], delimiter: str = ",") -> str:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A 3-layer x 4-head BERT sentiment classifier (labels neg/pos) saved like a user's model folder."""
    from headprune.testing import tiny_model

    return save_classifier(tiny_model("bert", num_labels=2), tiny_tokenizer, tmp_path_factory.mktemp("tiny_bert"))


def save_classifier(model, tokenizer, out):
    """``model`` labelled neg/pos (TINY_LABELS) saved with ``tokenizer`` in the folder ``out``; returns ``out``."""
    model.config.id2label = dict(TINY_LABELS)
    model.config.label2id = {v: k for k, v in TINY_LABELS.items()}
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_csv(tmp_path_factory) -> str:
    """60 labelled rows (text, label = neg/pos) for the tiny model."""
    texts = sentences(60, seed=1)
    labels = ["pos" if i % 3 else "neg" for i in range(60)]
    return write_csv(tmp_path_factory.mktemp("data") / "tiny.csv", ["text", "label"], list(zip(texts, labels)))


def trajectory(model, calib, evals, criterion: str, params: dict | None = None, *, tokenizer=None, texts=None,
               evaluator=None, **spec):
    """``run_trajectory`` for a criterion name: the rest of the keywords build the TrajectorySpec."""
    from headprune.criteria import get
    from headprune.trajectory import TrajectorySpec, run_trajectory

    return run_trajectory(TrajectorySpec(criterion=get(criterion), params=params or {}, **spec), model, calib, evals,
                          tokenizer=tokenizer, texts=texts, evaluator=evaluator)


# -- the demos, built once before the tests that need them ---------------------------------------------------------
# A test that first needs a demo would build it inside its own timeout (an AppTest's 600 s script timeout, a browser
# wait): on a busy 2-core machine the LM demo's build alone can take most of that. The demos the selected tests
# name are built here instead, after collection and before the first test, and the build time is printed.
DEMO_NEEDS = {   # demo -> what in a test module (or a test's fixtures) says it uses that demo's model
    "demo": re.compile(r"""["']demo["']|ensure_demo_model|\bdemo_model_path\b"""),
    "demo-lm": re.compile(r"""["']demo-lm["']|ensure_demo_lm"""),
    "demo-circuit": re.compile(r"""["']demo-circuit["']|ensure_demo_circuit"""),
}
DEMO_FIXTURES = {"demo": "demo", "demo_model_path": "demo"}


def demos_needed(items) -> list[str]:
    """The demos the collected ``items`` use: named in their module's source, or through a demo fixture."""
    needed, sources = set(), {}
    for item in items:
        path = getattr(item, "path", None)
        if path is not None and path not in sources:
            try:
                sources[path] = path.read_text(encoding="utf-8")
            except OSError:
                sources[path] = ""
        text = sources.get(path, "")
        needed |= {demo for demo, pattern in DEMO_NEEDS.items() if pattern.search(text)}
        needed |= {DEMO_FIXTURES[f] for f in getattr(item, "fixturenames", ()) if f in DEMO_FIXTURES}
    return [demo for demo in DEMO_NEEDS if demo in needed]


def pytest_collection_finish(session):
    if session.config.option.collectonly or not session.items:
        return
    import headprune.demos  # noqa: F401 - registers the demos as named models
    from headprune.model.loading import NAMED_MODELS

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    for name in demos_needed(session.items):
        start = time.perf_counter()
        NAMED_MODELS[name].build()   # a no-op once the shared cache holds it (a file lock keeps parallel builds apart)
        line = f"{name}: ready in {time.perf_counter() - start:.1f} s (built or found before the first test)"
        if reporter is not None:
            reporter.write_line(line)


def refused(argv, capsys) -> str:
    """The CLI's ``error:`` line for ``argv``: exit code 2, nothing on stdout, no traceback, a line that says more
    than a word (the hostile-input tests' one check of a refusal)."""
    from headprune.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert not out and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and len(lines[-1]) > 40
    return lines[-1]
