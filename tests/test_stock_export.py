"""Stock exports (issue 16 §1): every exported folder loads in a Python process that never imports headprune, with
plain ``AutoModelFor*.from_pretrained``, and its logits equal the gated model's (``gating.gate_heads``, the one place
that gates) within 1e-5 on tiny Llama, Qwen2, GPT-2 and BERT. Uniform cuts are physically smaller and hold exactly
the analytic parameter count. One subprocess loads every folder (CI time).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from headprune.cli import main
from headprune.model.arch import adapt
from headprune.model.export import ExportError, export_model, nearest_uniform, uniform_shape
from headprune.model.gating import gate_heads
from headprune.model.mask import HeadMask
from headprune.testing import random_batch, random_decoder_batch, tiny_decoder, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

# Loads each folder with transformers alone and reports, per folder: max |logits - reference|, parameters,
# loading problems, headprune keys in the config; and whether headprune was ever imported.
LOADER = r"""
import json, sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
torch.set_num_threads(1)
report = {}
for job in json.loads(sys.argv[1]):
    auto = AutoModelForCausalLM if job["head"] == "lm" else AutoModelForSequenceClassification
    model, info = auto.from_pretrained(job["folder"], output_loading_info=True)
    model.eval()
    ref = load_file(job["reference"])
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).logits
    report[job["name"]] = {
        "diff": (logits - ref["logits"]).abs().max().item(),
        "params": sum(p.numel() for p in model.parameters()),
        "problems": {k: list(v) for k, v in info.items() if v},
        "headprune_keys": [k for k in model.config.to_dict() if k.startswith("headprune")],
        "heads": [model.config.to_dict().get(k) for k in ("num_attention_heads", "num_key_value_heads", "head_dim")],
    }
report["headprune imported"] = any(name.split(".")[0] == "headprune" for name in sys.modules)
print(json.dumps(report))
"""


def _mask(shape, seed: int, keep: float = 0.6) -> HeadMask:
    values = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) < keep).float()
    values[:, 0] = 1.0   # every layer keeps a head
    return HeadMask(values)


def llama_params(config, q: int, n: int, d: int, bias: bool) -> int:
    """Analytic count of a Llama-style causal LM with q query / n key/value heads of size d in every layer:
    embeddings V h (+ an untied LM head V h), a final norm h, and per layer W_Q (h x q d), W_K and W_V (h x n d each),
    W_O (q d x h), Q/K/V biases (q d + 2 n d, Qwen2), a gated MLP 3 h I and two norms 2 h."""
    V, h, L, I = config.vocab_size, config.hidden_size, config.num_hidden_layers, config.intermediate_size
    per_layer = h * d * (2 * q + 2 * n) + (q * d + 2 * n * d if bias else 0) + 3 * h * I + 2 * h
    return V * h * (1 if config.tie_word_embeddings else 2) + h + L * per_layer


def louder(model):
    """Linear weights drawn with std 0.3 instead of 0.02 (seeded), so that one head visibly moves a tiny BERT's
    logits (at 0.02 they are ~1e-2 and a pruned head moves them by less than 1e-4)."""
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.3)
    return model


CASES = {  # name -> (model builder, head, batch, format, round the mask to uniform first)
    "llama masked": (lambda: tiny_decoder("llama"), "lm", "decoder", "masked", False),
    "llama uniform": (lambda: tiny_decoder("llama"), "lm", "decoder", "uniform", True),
    "qwen2 masked": (lambda: tiny_decoder("qwen2"), "lm", "decoder", "masked", False),
    "qwen2 uniform": (lambda: tiny_decoder("qwen2"), "lm", "decoder", "uniform", True),
    "phi3 uniform": (lambda: tiny_decoder("phi3"), "lm", "decoder", "uniform", True),
    "gemma3 uniform": (lambda: tiny_decoder("gemma3"), "lm", "decoder", "uniform", True),
    "gpt2 masked": (lambda: tiny_decoder("gpt2"), "lm", "decoder", "masked", False),
    "bert masked": (lambda: louder(tiny_model("bert")), "cls", "encoder", "masked", False),
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Every case exported into its own folder with its reference logits; then one headprune-free process."""
    root = tmp_path_factory.mktemp("stock-exports")
    jobs, built = [], {}
    for i, (name, (build, head, kind, fmt, round_first)) in enumerate(CASES.items()):
        model = build()
        batch = random_decoder_batch(seed=3) if kind == "decoder" else random_batch(seed=3)
        batch.pop("labels", None)
        mask = _mask(adapt(model).grid_shape, seed=10 + i)
        if round_first:
            mask = nearest_uniform(model, mask).mask
        with torch.no_grad():
            dense = model(**batch).logits
            with gate_heads(model, mask):
                gated = model(**batch).logits
        assert (gated - dense).abs().max() > 1e-3      # the mask changes the output: equality below means something
        result = export_model(model, None, mask, root / name.replace(" ", "-"), format=fmt)
        reference = root / f"{name.replace(' ', '-')}.safetensors"
        save_file({**{k: v.contiguous() for k, v in batch.items()}, "logits": gated.contiguous()}, str(reference))
        jobs.append({"name": name, "folder": result["out"], "head": head, "reference": str(reference)})
        built[name] = (model, mask, result)
    proc = subprocess.run([sys.executable, "-c", LOADER, json.dumps(jobs)], capture_output=True, text=True,
                          cwd=str(root), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), built


@pytest.mark.parametrize("name", list(CASES))
def test_stock_export_loads_without_headprune_and_equals_the_gated_model(exported, name):
    report, built = exported
    assert report["headprune imported"] is False
    got = report[name]
    assert got["problems"] == {} and got["headprune_keys"] == []
    assert got["diff"] <= 1e-5, got["diff"]
    model, mask, result = built[name]
    dense_params = sum(p.numel() for p in model.parameters())
    if result["format"] == "masked":
        assert got["params"] == dense_params and result["saves_compute"] is False
        assert "saves no compute" in result["note"]
        config = model.config
        heads = [getattr(config, "num_attention_heads", None) or config.n_head,
                 getattr(config, "num_key_value_heads", None), getattr(config, "head_dim", None)]
        if model.config.model_type in ("gpt2", "bert"):   # their config dicts carry no kv heads / head_dim
            assert got["heads"][0] in (heads[0], None)
        else:
            assert got["heads"] == heads


@pytest.mark.parametrize("name, bias", [("llama uniform", False), ("qwen2 uniform", True)])
def test_uniform_cut_is_physically_smaller_with_the_analytic_count(exported, name, bias):
    report, built = exported
    model, mask, result = built[name]
    q, n = uniform_shape(model, mask)
    d = adapt(model).blocks[0].head_size
    dense_q, dense_n = model.config.num_attention_heads, model.config.num_key_value_heads
    assert report[name]["heads"] == [q, n, d] and q < dense_q
    assert report[name]["params"] == llama_params(model.config, q, n, d, bias)
    assert report[name]["params"] < llama_params(model.config, dense_q, dense_n, d, bias)
    # the formula counts the dense model right too
    assert llama_params(model.config, dense_q, dense_n, d, bias) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("build, family", [(lambda: tiny_decoder("gpt2"), "gpt2"),
                                           (lambda: tiny_model("bert"), "bert")])
def test_uniform_refused_where_the_config_ties_head_size(build, family, tmp_path):
    model = build()
    shape = adapt(model).grid_shape
    values = torch.ones(shape)
    values[:, -1] = 0.0          # uniform: one head fewer everywhere
    with pytest.raises(ExportError, match=rf"explicitly \(Llama.*Qwen2.*'{family}' ties the head size.*'masked'"):
        export_model(model, None, HeadMask(values), tmp_path / "out", format="uniform")
    assert list(tmp_path.iterdir()) == []   # nothing written, not even a temporary folder


def test_a_non_uniform_mask_is_refused_with_the_way_out(tmp_path):
    model = tiny_decoder("llama")
    values = torch.ones(adapt(model).grid_shape)
    values[0, 0] = 0.0
    with pytest.raises(ExportError, match=r"\[7, 8, 8, 8\] query heads per layer.*nearest_uniform"):
        export_model(model, None, HeadMask(values), tmp_path / "out", format="uniform")
    with pytest.raises(ExportError, match="Unknown export format 'tflite'; accepted: headprune, masked, uniform"):
        export_model(model, None, HeadMask(values), tmp_path / "out", format="tflite")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch, kw", [("llama", dict(n_layers=2, n_heads=4, n_kv_heads=2)),
                                      ("gpt2", dict(n_layers=2, n_heads=4))])
def test_nearest_uniform_changes_the_fewest_heads(arch, kw):
    """Against brute force: every 2 x 4 mask, the uniform ones by definition (same count per layer and per kept
    group), the smallest Hamming distance to each of several masks."""
    model = tiny_decoder(arch, **kw)
    shape = adapt(model).grid_shape
    group_size = 2 if arch == "llama" else 1

    def uniform(grid: torch.Tensor) -> bool:
        shapes = set()
        for row in grid:
            counts = [int(row[g * group_size:(g + 1) * group_size].sum()) for g in range(shape[1] // group_size)]
            kept = [c for c in counts if c]
            if not kept or len(set(kept)) > 1:
                return False
            shapes.add((sum(kept), len(kept)))
        return len(shapes) == 1

    grids = [torch.tensor(bits, dtype=torch.float32).view(shape)
             for bits in itertools.product((0.0, 1.0), repeat=shape[0] * shape[1])]
    uniform_grids = [g for g in grids if uniform(g)]
    for seed in range(6):
        mask = _mask(shape, seed=seed, keep=0.5)
        rounded = nearest_uniform(model, mask)
        best = min(int((g != mask.values).sum()) for g in uniform_grids)
        assert uniform(rounded.mask.values) and uniform_shape(model, rounded.mask) is not None
        assert rounded.changed == int((rounded.mask.values != mask.values).sum()) == best
        assert uniform_shape(model, mask) is None or rounded.changed == 0


def test_nearest_uniform_keeps_the_higher_scored_heads():
    model = tiny_decoder("gpt2", n_layers=2, n_heads=4)
    mask = HeadMask(torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]))   # 2 and 1 kept
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.0, 1.0, 5.0, 0.0]])
    rounded = nearest_uniform(model, mask, scores)   # either 1 per layer or 2 per layer: one change each
    assert rounded.changed == 1 and rounded.query_heads == 2     # ties: more heads kept
    assert rounded.added == [(1, 2)] and rounded.removed == []   # head 2 outscores head 1


def test_cli_prune_formats(tmp_path, tiny_model_dir, capsys):
    """``prune --format``: uniform rounds the mask and says so, writes a stock config; masked says it saves no
    compute; uniform on BERT is refused with exit 2 and the way out."""
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [0, 1, 2], "1": [3], "2": [4, 5]}}))
    assert main(["prune", "--model", "demo-lm", "--mask", str(mask), "--out", str(tmp_path / "u"),
                 "--format", "uniform"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    rounding = result["uniform_rounding"]
    assert "note: Rounded to" in err and rounding["changed"] == len(rounding["added"]) + len(rounding["removed"]) > 0
    config = json.loads((tmp_path / "u" / "config.json").read_text())
    assert not [k for k in config if k.startswith("headprune")] and not (tmp_path / "u" / "headprune.json").exists()
    assert config["num_attention_heads"] == rounding["query_heads_per_layer"]
    assert config["num_key_value_heads"] == rounding["kv_heads_per_layer"]

    assert main(["prune", "--model", "demo-lm", "--mask", str(mask), "--out", str(tmp_path / "m"),
                 "--format", "masked"]) == 0
    out, err = capsys.readouterr()
    assert "saves no compute" in err and json.loads(out)["sizes"]["total"]["removed_params"] == 0

    bert_mask = tmp_path / "bert-mask.json"
    bert_mask.write_text(json.dumps({"pruned": {"0": [0]}}))
    assert main(["prune", "--model", str(tiny_model_dir), "--mask", str(bert_mask), "--out", str(tmp_path / "b"),
                 "--format", "uniform"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: A uniform cut with a stock config") and "'masked'" in err
    assert not (tmp_path / "b").exists()
