"""Helpers for the dashboard tests (tests/test_app_*.py): small splits, AppTest on app.py, page switching."""

from __future__ import annotations

import html
import json
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # pages import the `dashboard` package from the repository root
    sys.path.insert(0, str(ROOT))

# Small splits keep every page quick on a shared 2-core machine; the pages read these through Setup's defaults.
SMALL = {"HEADPRUNE_EVAL_SIZE": "64", "HEADPRUNE_CALIB_SIZE": "32", "HEADPRUNE_MAX_LENGTH": "64"}


@contextmanager
def small_env(**overrides: str):
    """The SMALL splits (and ``overrides``, e.g. HEADPRUNE_EVAL_SIZE="128") in the environment while in use."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**SMALL, **overrides}.items():
            mp.setenv(key, value)
        yield


PAGES = {"home": None, "model": "dashboard/pages/1_Model_and_data.py", "scores": "dashboard/pages/2_Head_scores.py",
         "attention": "dashboard/pages/3_Attention.py", "prune": "dashboard/pages/4_Prune.py",
         "trajectories": "dashboard/pages/5_Trajectories.py",
         "export": "dashboard/pages/6_Export.py", "roles": "dashboard/pages/7_Roles.py",
         "recover": "dashboard/pages/8_Recover.py", "kv": "dashboard/pages/9_KV_cache.py",
         "runs": "dashboard/pages/10_Runs.py"}


def benchmark(name: str):
    """The module benchmarks/<name>.py (the browser tests start servers and walks with the benchmarks' code)."""
    import importlib.util

    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module       # a dataclass module must be importable by name while it loads
        spec.loader.exec_module(module)
    return module


def open_app(page: str = "home", setup=None, timeout: float = 600):
    """AppTest of app.py run once on ``page`` (optionally with a dashboard Setup already chosen)."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=timeout)
    if setup is not None:
        at.session_state["hp_setup"] = setup
    at.run()
    if PAGES[page] is not None:
        at.switch_page(PAGES[page]).run()
    return at


def problems(at) -> list[str]:
    """Exceptions and error boxes on the page (an empty list is a clean render)."""
    return [e.value for e in at.exception] + [e.value for e in at.error]


def shown(element) -> str:
    """An element's text as a reader sees it: user words reach pages inert (headprune.markdown.inert writes ':' as
    '&#58;'), which the browser shows as the character again."""
    return html.unescape(element.value)


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label == label)


def metric_number(at, label: str) -> float:
    """``metric`` read as a number (viz.metric_text writes thousands separators: "1,651")."""
    return float(metric(at, label).replace(",", ""))


def figures(at) -> list[dict]:
    """The Plotly figures on the page, as the JSON spec sent to the browser."""
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def array(value):
    """A Plotly JSON array: a plain list, or the typed form {"dtype", "bdata" (base64), "shape"} of plotly >= 6."""
    import base64

    import numpy as np

    if isinstance(value, dict) and "bdata" in value:
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=np.dtype(value["dtype"]))
        shape = [int(n) for n in str(value.get("shape", len(flat))).split(",")]
        return flat.reshape(shape)
    return np.array(value, dtype=object)


def head_grids(at) -> list:
    """The value layer (L x H array) of every head grid on the page (grids carry a click layer named 'heads')."""
    return [array(fig["data"][1]["z"]) for fig in figures(at)
            if any(t.get("name") == "heads" for t in fig["data"])]


def save_tiny_classifier(folder: Path, arch: str = "bert") -> str:
    """A small random classifier (labels rotten/fresh) with the demo encoder's tokenizer, saved HF-style."""
    import torch
    from transformers import AlbertConfig, AutoModelForSequenceClassification, AutoTokenizer, BertConfig

    from headprune.demos.classifier import encoder_path

    tokenizer = AutoTokenizer.from_pretrained(encoder_path())
    torch.manual_seed(0)
    common = dict(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=128, num_labels=2,
                  id2label={0: "rotten", 1: "fresh"}, label2id={"rotten": 0, "fresh": 1})
    config = AlbertConfig(embedding_size=16, **common) if arch == "albert" else BertConfig(**common)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def workspace(at):
    """The Workspace (model, data, batches) the page's session is on."""
    from dashboard.store import store

    return store().get(f"ws|{at.session_state['hp_setup'].key}")


def prune_lowest(at, percent: int) -> None:
    """Prune page: 'prune the lowest x%' with the current criterion."""
    at.slider(key="prune-ratio").set_value(percent).run()
    at.button(key="prune-apply").click().run()


def full_evaluation(at):
    """An independent full evaluation of the session's model under its current mask (to check live numbers)."""
    from headprune.evaluation.metrics import evaluate

    ws = workspace(at)
    return evaluate(ws.loaded.model, ws.eval_batches, at.session_state["hp_session"].mask)


def run_trajectories(at, criteria=("ae",), seeds: int = 2, step: int = 12, budget: int = 50) -> None:
    """Trajectories page: run ``criteria`` plus ``seeds`` random runs, ``step`` heads per step, up to ``budget`` %."""
    at.multiselect(key="traj-criteria").set_value(list(criteria)).run()
    at.number_input(key="traj-seeds").set_value(seeds).run()
    at.number_input(key="traj-step").set_value(step).run()
    at.slider(key="traj-budget").set_value(budget).run()
    at.button(key="traj-run").click().run()
