"""``prune --format onnx``: the cut model as one ONNX graph, run in onnxruntime itself and compared with headprune's
cut model (``surgery.prune_model`` + transformers' forward) on real rows of the demos, with uneven masks.

The measure everywhere: max |onnxruntime logits - cut model logits| / max |cut model logits| over every compared
logit (a classifier's rows; an LM's real, unpadded positions), accepted at 1e-4. Dynamic axes are shown by two
batches of different size and length run on the one file; padding by every row of a padded batch equalling the
same row run alone.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from transformers import AutoTokenizer

from headprune.cli import main
from headprune.data import load_data
from headprune.evaluation.speed import count_flops
from headprune.model.arch import adapt
from headprune.model.export import export_model
from headprune.model.gating import gate_heads
from headprune.model.hooks import attached_names, wrap_forward
from headprune.model.layers import skip_layers
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.model.onnx_export import OPSET, OnnxExportError, export_onnx, read_metadata
from headprune.model.surgery import prune_model
from headprune.testing import random_batch, tiny_decoder, tiny_model, tiny_modern

TOLERANCE = 1e-4


def relative_gap(got: np.ndarray, expected: np.ndarray, attention: np.ndarray | None = None) -> float:
    """max |got - expected| / max |expected|; an LM's logits at real positions only (``attention`` == 1)."""
    if expected.ndim == 3:
        keep = attention.astype(bool)
        got, expected = got[keep], expected[keep]
    return float(np.abs(got - expected).max() / np.abs(expected).max())


def torch_logits(model, batch: dict) -> np.ndarray:
    inputs = {k: torch.as_tensor(v) for k, v in batch.items() if k in ("input_ids", "attention_mask",
                                                                      "token_type_ids")}
    with torch.inference_mode():
        return model(**inputs).logits.float().numpy()


@functools.lru_cache(maxsize=4)
def session_of(path: str):
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def run_onnx(path, batch: dict) -> np.ndarray:
    session = session_of(str(path))
    names = {i.name for i in session.get_inputs()}
    return session.run(["logits"], {k: np.asarray(v, dtype=np.int64) for k, v in batch.items() if k in names})[0]


def cli_prune(tmp, model: str, pruned: dict) -> tuple[dict, object]:
    """``prune --format onnx`` in this process; returns (its JSON report, the --out folder)."""
    mask = tmp / "mask.json"
    mask.write_text(json.dumps({"pruned": pruned}))
    out = tmp / "onnx"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main(["prune", "--model", model, "--mask", str(mask), "--out", str(out), "--format", "onnx"]) == 0
    return json.loads(stdout.getvalue()), out


def check_demo(report: dict, out, model: str, rows: list[str], pruned: dict) -> None:
    """The --out folder of ``prune --format onnx`` on ``model``: opset, dynamic axes, the tokenizer beside it, and
    onnxruntime's logits on real ``rows`` against headprune's cut model (and not the dense one)."""
    path = out / "model.onnx"
    graph = onnx.load(str(path))
    assert report["onnx"]["opset"] == OPSET == 17
    assert {o.domain: o.version for o in graph.opset_import}[""] == OPSET
    assert read_metadata(path)["headprune.opset"] == "17"
    for value in graph.graph.input:   # batch and sequence are named, not numbers
        assert [d.dim_param for d in value.type.tensor_type.shape.dim] == ["batch", "sequence"]
    loaded = load_model(model, "cpu")
    cut = prune_model(loaded.model, HeadMask.from_pruned(pruned, loaded.adapter.grid_shape))
    tokenizer = AutoTokenizer.from_pretrained(out)    # the tokenizer files beside the graph, nothing else
    assert tokenizer(rows)["input_ids"] == loaded.tokenizer(rows)["input_ids"]
    big = tokenizer(rows[:6], padding=True, truncation=True, max_length=64, return_tensors="np")
    small = tokenizer(rows[6:8], padding=True, truncation=True, max_length=16, return_tensors="np")
    assert big["input_ids"].shape[0] != small["input_ids"].shape[0]
    assert big["input_ids"].shape[1] != small["input_ids"].shape[1]    # two batch sizes, two lengths
    assert (big["attention_mask"] == 0).any()                         # a padded batch
    for batch in (big, small):
        got = run_onnx(path, batch)     # the tokenizer's own arrays feed the graph as they are
        assert relative_gap(got, torch_logits(cut, batch), batch["attention_mask"]) <= TOLERANCE
        assert relative_gap(got, torch_logits(loaded.model, batch), batch["attention_mask"]) > 1e-2  # the cut
    alone = tokenizer(rows[1:2], truncation=True, max_length=64, return_tensors="np")   # row 1, unpadded
    real = big["attention_mask"][1] == 1
    assert not real.all()    # ... and padded in the big batch
    got_alone, got_padded = run_onnx(path, alone)[0], run_onnx(path, big)[1]
    got_padded = got_padded[real] if got_padded.ndim == 2 else got_padded   # an LM's real positions
    assert np.abs(got_padded - got_alone).max() <= TOLERANCE * np.abs(got_alone).max()


def long_rows(texts: list[str]) -> list[str]:
    """Eight real rows: the longest first, a middling one second (padded in the big batch), then long ones (the
    small batch truncates them to fewer tokens than the big one holds)."""
    ranked = sorted(texts[:200], key=len, reverse=True)
    return [ranked[0], ranked[100], *ranked[1:7]]


def test_demo_classifier(tmp_path):
    """The MiniLM demo classifier, 6 x 12 heads cut unevenly (12, 6, 11, 10, 12 and 1 heads left)."""
    pruned = {"0": [], "1": [0, 1, 2, 3, 4, 5], "2": [3], "3": [0, 11], "5": list(range(1, 12))}
    report, out = cli_prune(tmp_path, "demo", pruned)
    assert report["format"] == "onnx" and report["pruned_heads"] == 20
    assert report["onnx"]["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert report["onnx"]["check"]["relative"] <= TOLERANCE
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "tokenizer.json", "tokenizer_config.json"]
    check_demo(report, out, "demo", long_rows(load_data("demo").texts), pruned)


def test_demo_lm(tmp_path):
    """The decoder demo (Llama, 6 x 8 query heads in 2 key/value groups): a whole group cut, uneven groups (one
    group's key/value rows held three times), a layer with no heads; every position's next-token logits."""
    pruned = {"0": [0, 1, 2, 3], "1": [0, 5], "2": [1, 2, 3, 4], "3": list(range(8)), "4": [7]}
    report, out = cli_prune(tmp_path, "demo-lm", pruned)
    assert report["onnx"]["inputs"] == ["input_ids", "attention_mask"]
    assert report["onnx"]["dynamic_axes"]["logits"] == {"0": "batch", "1": "sequence"}
    metadata = read_metadata(out / "model.onnx")
    assert metadata["headprune.task"] == "lm" and json.loads(metadata["headprune.kept_heads"])["3"] == []
    check_demo(report, out, "demo-lm", long_rows(load_data("demo-lm").texts), pruned)


# -- tiny models: families, tuned masks, the caller's model ------------------------------------------------------

def uneven_mask(model, seed: int = 0) -> HeadMask:
    """Half the heads at random, block 0 emptied, the last block whole: a different count in every layer."""
    shape = adapt(model).grid_shape
    values = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5).float()
    values[0] = 0.0
    values[-1] = 1.0
    return HeadMask(values)


def padded(batch_size: int, length: int, seed: int, segments: bool = False) -> dict:
    """Random rows, the first one padded from the middle on; ``segments``: token types too (BERT), all 0."""
    batch = random_batch(batch_size, length, seed=seed)
    batch["attention_mask"][:] = 1
    batch["attention_mask"][0, length // 2:] = 0
    types = {"token_type_ids": torch.zeros_like(batch["input_ids"])} if segments else {}
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], **types}


FAMILIES = {"distilbert": lambda: tiny_model("distilbert"), "deberta-v2": lambda: tiny_modern("deberta-v2"),
            "modernbert": lambda: tiny_modern("modernbert", attn_implementation="sdpa"),
            "gemma3": lambda: tiny_decoder("gemma3"), "phi3": lambda: tiny_decoder("phi3"),
            "gpt2-classifier": lambda: tiny_decoder("gpt2", head="cls")}


@pytest.mark.parametrize("family", FAMILIES)
def test_families_export_as_they_are_cut(family, tmp_path, one_thread):
    """Whatever the cut model is (sliding-window layers, fused Q|K|V, Conv1D, relative positions, a decoder's
    classifier head reading the last real token), the graph computes it, at two shapes, padded."""
    model = FAMILIES[family]()
    mask = uneven_mask(model)
    export_onnx(model, None, mask, tmp_path / "g")
    cut = prune_model(model, mask)
    for batch in (padded(3, 9, seed=1), padded(1, 5, seed=2)):
        got = run_onnx(tmp_path / "g" / "model.onnx", batch)
        assert relative_gap(got, torch_logits(cut, batch), batch["attention_mask"].numpy()) <= TOLERANCE


def test_tuned_mask_is_baked_dense_is_the_model_and_the_callers_model_is_untouched(tmp_path, one_thread):
    """A tuned mask (scales on kept heads) is baked into the graph: its logits equal the gated model's. An empty
    mask exports the dense model. The caller's model, gated by another mask during the export, is exported
    ungated, and left with its own weights, mode and hooks."""
    model = tiny_model("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = model.config.to_dict()
    values = torch.ones(3, 4)
    values[0, 1] = values[2, :3] = 0.0
    scales = torch.full((3, 4), 1.0)
    scales[0, 0], scales[1, 2], scales[2, 3] = 1.7, -0.4, 0.3
    tuned = HeadMask(values, scales)
    batch = padded(4, 10, seed=3, segments=True)
    with gate_heads(model, HeadMask(torch.zeros(3, 4))):    # someone else's gate on the shared model
        export_onnx(model, None, tuned, tmp_path / "tuned")
        export_onnx(model, None, None, tmp_path / "dense")
        hooked = [n for n, m in model.named_modules() if attached_names(m)]
        assert hooked   # the gate really was on while exporting
    with gate_heads(model, tuned):
        gated = torch_logits(model, batch)
    assert relative_gap(run_onnx(tmp_path / "tuned" / "model.onnx", batch), gated) <= TOLERANCE
    assert relative_gap(run_onnx(tmp_path / "dense" / "model.onnx", batch), torch_logits(model, batch)) <= TOLERANCE
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()) and model.config.to_dict() == config
    assert not model.training and not [n for n, m in model.named_modules() if attached_names(m)]


def test_dropped_layers_are_left_out_of_the_graph(tmp_path, one_thread):
    """A mask's dropped layers (SAP's layer rule) are skipped in the graph as ``skip_layers`` skips them."""
    model = tiny_model("bert")
    mask = HeadMask.from_pruned({"1": [0, 1, 2, 3]}, (3, 4))
    written = export_model(model, None, mask, tmp_path / "d", "onnx", dropped_layers=[1])
    batch = padded(2, 8, seed=4, segments=True)
    cut = prune_model(model, mask)
    with skip_layers(adapt(cut), [1]):
        expected = torch_logits(cut, batch)
    assert relative_gap(run_onnx(written["onnx"]["file"], batch), expected) <= TOLERANCE
    assert relative_gap(run_onnx(written["onnx"]["file"], batch), torch_logits(cut, batch)) > 1e-3


def test_benchmark_times_both_graphs_in_onnxruntime(tiny_model_dir, tmp_path, capsys, one_thread):
    """``prune --format onnx --benchmark``: the pruned and the dense graph timed in onnxruntime, the ideal ratio
    beside it the FLOPs of the cut model over the dense one's."""
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [0, 1], "2": [3]}}))
    assert main(["prune", "--model", str(tiny_model_dir), "--mask", str(mask), "--out", str(tmp_path / "g"),
                 "--format", "onnx", "--benchmark", "--benchmark-repeats", "3", "--benchmark-threads", "1"]) == 0
    speed = json.loads(capsys.readouterr().out)["speed"]
    model = load_model(str(tiny_model_dir), "cpu").model
    length = speed["length"]
    dense, cut = count_flops(model, length).total, count_flops(prune_model(model, HeadMask.from_pruned(
        {"0": [0, 1], "2": [3]}, (3, 4))), length).total
    assert speed["ideal_ratio"] == pytest.approx(cut / dense) and speed["ideal_ratio"] < 1
    assert speed["ratio"] > 0 and speed["threads"] == 1 and speed["repeats"] == 3 and speed["batch"] == 8
    assert speed["runtime"] == "onnxruntime 1.32.0"


# -- refused, before the model loads, nothing written --------------------------------------------------------------

@pytest.fixture
def weightless_model(tmp_path, tiny_model_dir):
    """A folder with a model's config.json and no weights: a refusal that came after loading would be about them."""
    folder = tmp_path / "weightless"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    return folder


@pytest.mark.parametrize("options, message", [
    (["--device-map", "auto"], "error: --device-map auto with --format onnx: the export traces one forward on the "
                               "CPU"),
    (["--dtype", "fp16"], "error: --dtype fp16 with --format onnx: the ONNX graph is written in float32"),
])
def test_options_that_cannot_apply_are_refused(options, message, weightless_model, tmp_path, capsys):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}))
    argv = ["prune", "--model", str(weightless_model), "--mask", str(mask), "--out", str(tmp_path / "out"),
            "--format", "onnx", *options]
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(message)
    assert not (tmp_path / "out").exists()


def test_refusals_and_failures_write_nothing(weightless_model, tmp_path, capsys, monkeypatch, one_thread):
    """An --out that is not empty and a Python without onnxruntime: refused before the model loads. A soft mask,
    an operator opset 17 lacks, a graph that fails its check: refused by the export. Nothing written anywhere."""
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    base = ["prune", "--model", str(weightless_model), "--mask", str(mask), "--format", "onnx", "--out"]
    assert main([*base, str(taken)]) == 2
    assert "is a folder that is not empty" in capsys.readouterr().err
    assert [p.name for p in taken.iterdir()] == ["notes.txt"] and (taken / "notes.txt").read_text() == "mine"

    import headprune.model.onnx_export as onnx_export
    monkeypatch.setattr(onnx_export, "versions", lambda *names: {"onnx": "1.23.2", "onnxruntime": None})
    assert main([*base, str(tmp_path / "new")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --format onnx needs onnxruntime") and "pip install onnx==1.23.2" in err
    monkeypatch.undo()

    model = tiny_model("bert")
    with pytest.raises(OnnxExportError, match="soft gates between 0 and 1"):
        export_onnx(model, None, HeadMask(torch.full((3, 4), 0.5)), tmp_path / "soft")
    unsupported = tiny_model("bert")   # an operator ONNX opset 17 lacks, in the model's own forward
    wrap_forward(unsupported.classifier, lambda module, inner, x: inner(x) + torch.linalg.svdvals(x[:, :2, None]))
    with pytest.raises(OnnxExportError, match=r"cannot write this bert model \(.*linalg_svdvals.*Nothing was written"):
        export_onnx(unsupported, None, None, tmp_path / "unsupported")
    monkeypatch.setattr(onnx_export, "logits_gap", lambda *a: {"relative": 0.3})   # a graph that came out wrong
    with pytest.raises(OnnxExportError, match=r"does not reproduce the cut model.*3\.0e-01.*Nothing was written"):
        export_onnx(model, None, None, tmp_path / "wrong")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mask.json", "taken", "weightless"]
