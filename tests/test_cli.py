import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import write_csv

from headprune.cli import main

TINY_MASK = {"pruned": {"0": [1, 3], "2": [0]}}


def run(argv: list[str], capsys) -> tuple[int, dict | None, str]:
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


@pytest.fixture
def mask_file(tmp_path):
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(TINY_MASK))
    return path


def test_evaluate_prints_metrics(tiny_model_dir, tiny_csv, capsys):
    rc, out, _ = run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--eval-size", 40], capsys)
    assert rc == 0 and out["n"] == 40 and out["eval_size"] == 40 and out["pruned_heads"] == 0
    assert {"accuracy", "macro_f1", "mcc", "loss"} <= set(out) and out["columns"]["label"] == "label"
    assert "calib_data" not in out


def test_prune_then_evaluate_equals_evaluate_under_mask(tiny_model_dir, tiny_csv, mask_file, tmp_path, capsys):
    data = ["--data", tiny_csv, "--eval-size", "all", "--calib-size", 0]
    rc, masked, _ = run(["evaluate", "--model", tiny_model_dir, "--mask", mask_file, *data], capsys)
    assert rc == 0 and masked["pruned_heads"] == 3 and masked["n"] == 60
    rc, report, _ = run(["prune", "--model", tiny_model_dir, "--mask", mask_file, "--out", tmp_path / "cut"], capsys)
    assert rc == 0 and report["pruned_heads"] == 3 and report["kept_heads"] == 9
    # per BERT head: Q, K, V rows (d_h x hidden + d_h bias each) and O columns (hidden x d_h); d_h 8, hidden 32
    per_head = 3 * (8 * 32 + 8) + 32 * 8
    sizes = report["sizes"]
    assert sizes["attention_qkvo"]["removed_params"] == 3 * per_head == sizes["total"]["removed_params"]
    assert sizes["total"]["after"]["mb"] < sizes["total"]["before"]["mb"]
    rc, cut, _ = run(["evaluate", "--model", tmp_path / "cut", *data], capsys)
    assert rc == 0 and cut["pruned_heads"] == 3  # heads cut out of the saved model count as pruned
    for key in ("accuracy", "macro_f1", "mcc", "n"):
        assert cut[key] == masked[key]
    assert cut["loss"] == pytest.approx(masked["loss"], abs=1e-5)


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory, tiny_tokenizer):
    """A model whose heads cannot be found: a tiny Mamba (state-space) language model, with a tokenizer."""
    from transformers import MambaConfig, MambaForCausalLM

    out = tmp_path_factory.mktemp("mamba")
    config = MambaConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, state_size=4, expand=2, conv_kernel=2)
    MambaForCausalLM(config).save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


def _bad_inputs(tmp: Path, tiny_model_dir, tiny_csv, gpt2_dir) -> dict:
    """name -> (argv, expected message fragment) for every kind of bad input a user can give."""
    (tmp / "empty_dir").mkdir()
    (tmp / "config_only").mkdir()
    (tmp / "config_only" / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (tmp / "notes.txt").write_text("text,label\nx,pos\n")
    (tmp / "latin1.csv").write_bytes("text,label\ncaf\u00e9 film,pos\n".encode("latin-1"))
    write_csv(tmp / "nolabel.csv", ["text", "stars"], [["good", 5]])
    write_csv(tmp / "notext.csv", ["title", "label"], [["good", "pos"]])
    write_csv(tmp / "labels.csv", ["text", "label"], [["good", "positive"], ["bad", "negative"]])
    write_csv(tmp / "empty.csv", ["text", "label"], [])
    (tmp / "layer.json").write_text(json.dumps({"pruned": {"5": [0]}}))
    (tmp / "head.json").write_text(json.dumps({"pruned": {"1": [9]}}))
    model = ["--model", tiny_model_dir]
    ev = ["evaluate", *model, "--data", tiny_csv]
    return {
        "unknown path": (["evaluate", "--model", tmp / "missing" / "model", "--data", tiny_csv],
                         "Model path not found"),
        "unknown hub id": (["evaluate", "--model", "nobody-xyz/no-such-model", "--data", tiny_csv],
                           "Could not fetch 'nobody-xyz/no-such-model'"),
        "folder without config": (["evaluate", "--model", tmp / "empty_dir", "--data", tiny_csv],
                                  "not a model folder: it needs config.json"),
        "folder without weights": (["evaluate", "--model", tmp / "config_only", "--data", tiny_csv],
                                   "No weights"),
        "unsupported architecture": (["evaluate", "--model", gpt2_dir, "--data", tiny_csv],
                                     "Unsupported architecture: model type 'mamba'.*Supported families: "
                                     ".*llama.*gpt2.*bert"),
        "not csv": ([*ev[:3], "--data", tmp / "notes.txt"], r"notes.txt is unlabelled text.*\.csv"),  # .txt: LM data
        "not utf-8": ([*ev[:3], "--data", tmp / "latin1.csv"], "not UTF-8"),
        "no label column": ([*ev[:3], "--data", tmp / "nolabel.csv"], "no label column found. Columns found: text"),
        "no text column": ([*ev[:3], "--data", tmp / "notext.csv"], "no text column found. Columns found: title"),
        "unknown labels": ([*ev[:3], "--data", tmp / "labels.csv"], "not known to the model. It knows: 0=neg"),
        "empty data": ([*ev[:3], "--data", tmp / "empty.csv"], "has no rows"),
        "split too large": ([*ev, "--eval-size", 500], "has only 60"),
        "mask layer": ([*ev, "--mask", tmp / "layer.json"], "layer 5, but this model has layers 0..2"),
        "mask head": (["prune", *model, "--mask", tmp / "head.json", "--out", tmp / "o"], "head 9 in layer 1"),
        "mask missing": ([*ev, "--mask", tmp / "nope.json"], r"Mask file .* not found"),
        "prune out is a file": (["prune", *model, "--mask", tmp / "layer.json", "--out", tmp / "notes.txt"],
                                "is a file"),
        "cuda without gpu": ([*ev, "--device", "cuda"], "no CUDA GPU is available"),
    }


BAD = ["unknown path", "unknown hub id", "folder without config", "folder without weights",
       "unsupported architecture", "not csv", "not utf-8", "no label column", "no text column", "unknown labels",
       "empty data", "split too large", "mask layer", "mask head", "mask missing", "prune out is a file",
       "cuda without gpu"]


@pytest.mark.parametrize("case", BAD)
def test_bad_input_exits_2_with_a_clear_message(case, tmp_path, tiny_model_dir, tiny_csv, gpt2_dir, capsys,
                                                monkeypatch):
    if case == "cuda without gpu" and torch.cuda.is_available():
        pytest.skip("a GPU is present")
    # an unknown hub id fails at once instead of retrying (the hub reads HF_HUB_OFFLINE only at import)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    argv, expected = _bad_inputs(tmp_path, tiny_model_dir, tiny_csv, gpt2_dir)[case]
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert "error: " in err and "Traceback" not in err
    assert re.search(expected, err), err


def test_bad_size_argument_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["evaluate", "--eval-size", "-3"])
    assert exc.value.code == 2 and "non-negative integer" in capsys.readouterr().err


def test_module_entry_point_reports_errors_on_stderr(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "headprune", "evaluate", "--model", str(tmp_path / "none")],
                          capture_output=True, text=True, cwd=str(Path(__file__).parents[1]))
    assert proc.returncode == 2 and proc.stdout == "" and "error: Model path not found" in proc.stderr


# -- the real demo (integration) ---------------------------------------------------------------------------------------

def test_demo_command(demo_model_path, capsys):
    rc, out, _ = run(["demo"], capsys)
    assert rc == 0 and out["model_path"] == str(demo_model_path) and out["accuracy"] > 0.8


def test_demo_prune_matches_mask(demo_model_path, tmp_path, capsys):
    mask = tmp_path / "m.json"
    mask.write_text(json.dumps({"pruned": {"0": [0, 5], "3": list(range(6)), "5": [11]}}))
    data = ["--data", "demo", "--eval-size", 200, "--max-length", 64]
    rc, masked, _ = run(["evaluate", "--model", "demo", "--mask", mask, *data], capsys)
    assert rc == 0 and masked["n"] == 200 and masked["accuracy"] > 0.7
    rc, report, _ = run(["prune", "--model", "demo", "--mask", mask, "--out", tmp_path / "cut"], capsys)
    assert rc == 0 and report["pruned_heads"] == 9
    rc, cut, _ = run(["evaluate", "--model", tmp_path / "cut", *data], capsys)
    assert rc == 0 and cut["accuracy"] == masked["accuracy"] and cut["mcc"] == pytest.approx(masked["mcc"])
    assert cut["loss"] == pytest.approx(masked["loss"], abs=1e-4)
