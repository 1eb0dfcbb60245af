"""benchmarks/gpu_check.py as a CPU dry run (CPU vs CPU on tiny models, a tiny stand-in for the 1B Llama): the
script runs end to end, its checks can fail, and the 1B shape is about 1B parameters."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from headprune.errors import UnsupportedArchitecture

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


def test_dry_run_passes_every_check(gpu_check, tmp_path, one_thread, capsys):
    from headprune import criteria

    out = tmp_path / "report.json"
    assert gpu_check.main(["--device", "cpu", "--tiny", "--llama-1b", "--toggles", "3", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    names = {c["check"] for c in report["checks"]}
    text_free = [n for n in criteria.available() if not criteria.get(n).needs_parser]
    assert {f"criterion {n}: rank correlation" for n in text_free} <= names
    assert any(n.startswith("live evaluation") for n in names) and any(n.startswith("trajectory") for n in names)
    assert "surgery on cpu: max |Δ logit| / max |logit|" in names
    assert all(c["passed"] for c in report["checks"])
    assert set(report["timings"]["live evaluation: first pass"]) == {"cpu", "cpu (target)"}
    shape = gpu_check.LLAMA_TINY
    assert report["llama"]["grid"] == [shape["num_hidden_layers"], shape["num_attention_heads"]]
    assert "all checks passed" in capsys.readouterr().out


def test_a_wrong_cut_fails_the_surgery_check(gpu_check, monkeypatch, one_thread):
    """Stand in a cut whose classifier weights doubled: its logits are off by about max |logit|, so it fails."""
    import torch

    from headprune.model.surgery import prune_model

    def wrong_cut(model, mask):
        cut = prune_model(model, mask)
        with torch.no_grad():
            cut.classifier.weight.mul_(2.0)
        return cut

    monkeypatch.setattr(gpu_check, "prune_model", wrong_cut)
    report = gpu_check.Report({})
    args = gpu_check.parse_args(["--device", "cpu", "--tiny"])
    model, _, _, evals, _ = gpu_check.tiny_setup(args)
    gpu_check.check_surgery(report, model, evals, "cpu", seed=0)
    assert not report.passed


def test_rank_agreement_is_spearman_on_the_heads_both_score(gpu_check):
    reference = np.array([[1.0, 2.0, np.nan], [3.0, 4.0, 5.0]])
    assert gpu_check.rank_agreement(reference, reference.copy()) == 1.0
    assert gpu_check.rank_agreement(np.ones((2, 2)), np.ones((2, 2))) == 1.0  # constant maps that agree
    reversed_ = np.array([[5.0, 4.0, np.nan], [3.0, 2.0, 1.0]])
    assert gpu_check.rank_agreement(reference, reversed_) == pytest.approx(-1.0)


def test_llama_1b_shape_has_about_a_billion_parameters(gpu_check):
    s = gpu_check.LLAMA_1B
    d, layers, kv_width = s["hidden_size"], s["num_hidden_layers"], s["hidden_size"] * s["num_key_value_heads"] // \
        s["num_attention_heads"]
    per_layer = 2 * d * d + 2 * d * kv_width + 3 * d * s["intermediate_size"] + 2 * d  # Q,O + K,V + MLP + norms
    total = s["vocab_size"] * d + layers * per_layer + d + 2 * d  # embeddings, final norm, 2-label score head
    assert 0.95e9 < total < 1.1e9


def test_unsupported_llama_stops_with_a_clear_message(gpu_check, monkeypatch, one_thread):
    def reject(model):
        raise UnsupportedArchitecture("model type 'llama' is not supported")

    monkeypatch.setattr(gpu_check, "adapt", reject)
    with pytest.raises(SystemExit, match="--llama-1b: this checkout cannot prune Llama models yet"):
        gpu_check.llama_timings(gpu_check.Report({}), "cpu", tiny=True, seed=0)


def test_spacy_criteria_are_skipped_and_said_where_spacy_is_missing(gpu_check, monkeypatch, capsys):
    """A GPU machine without the syntax extra: sap is skipped with its reason in the report, never scored."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec",
                        lambda name, *a: None if name == "spacy" else real_find_spec(name, *a))
    report = gpu_check.Report({})
    gpu_check.check_criteria(report, [], tokenizer=object(), texts=["a text"], names=["sap"], seed=0)
    assert "spaCy" in report.data["skipped"]["sap"] and report.data["checks"] == []
    assert "skip sap: parses text with spaCy" in capsys.readouterr().out


def test_a_crash_is_one_failed_check_and_the_checks_after_it_run(gpu_check):
    report = gpu_check.Report({})
    with report.crash_is_a_failure("criterion hies on cuda"):
        raise TypeError("can't convert cuda:0 device type tensor to numpy")
    report.check("the next check", 1.0, 1, True)
    assert [c["passed"] for c in report.data["checks"]] == [False, True] and not report.passed
    assert report.data["checks"][0]["note"].startswith("TypeError: can't convert cuda:0")
