"""Models placed by accelerate (device maps with CPU/disk offload): the same numbers as a plain model, accelerate's
hooks still in place after gating, capture, scoring and live evaluation, and clear errors for bad maps."""

from __future__ import annotations

import json

import pytest
import torch

from headprune.criteria import ScoringContext, get
from headprune.errors import DeviceError, MaskError
from headprune.evaluation.live import LiveEvaluator
from headprune.model.capture import capture_attention
from headprune.model.device import parse_device_map, parse_dtype
from headprune.model.gating import gate_heads
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import random_decoder_batch, tiny_decoder

OFFLOADED = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
             "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "score": "cpu"}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tiny_tokenizer):
    out = tmp_path_factory.mktemp("llama_cls")
    tiny_decoder("llama", "cls").save_pretrained(out)
    tiny_tokenizer.save_pretrained(out)
    return out


def _hooked(model) -> int:
    return sum(hasattr(m, "_hf_hook") for m in model.modules())


def test_disk_offloaded_model_gives_the_same_numbers_and_keeps_its_hooks(llama_dir, tmp_path, one_thread):
    plain = load_model(str(llama_dir), "cpu")
    placed = load_model(str(llama_dir), device_map=json.dumps(OFFLOADED), offload_folder=str(tmp_path))
    assert any(p.device.type == "meta" for p in placed.model.parameters())  # really offloaded
    hooks = _hooked(placed.model)
    assert hooks > 0
    batch = random_decoder_batch()
    labelled = dict(batch, labels=torch.tensor([0, 1, 2, 0]))
    mask = HeadMask.from_pruned({1: [0, 1], 3: [4]}, plain.adapter.grid_shape)
    with torch.no_grad():
        assert torch.equal(plain.model(**batch).logits, placed.model(**batch).logits)
        with gate_heads(plain.model, mask):
            expected = plain.model(**batch).logits
        with gate_heads(placed.model, mask):
            assert torch.allclose(placed.model(**batch).logits, expected, atol=1e-6)
    captured = capture_attention(placed.model, batch, mask).probs
    for a, b in zip(capture_attention(plain.model, batch, mask).probs, captured):
        assert torch.allclose(a, b, atol=1e-6)
    for name in ("his", "ae"):
        ref = get(name)(ScoringContext(plain.model, [labelled]))
        got = get(name)(ScoringContext(placed.model, [labelled]))
        assert torch.allclose(torch.as_tensor(ref.scores), torch.as_tensor(got.scores), atol=1e-6, equal_nan=True)
    live_plain, live_placed = LiveEvaluator(plain.model, [labelled]), LiveEvaluator(placed.model, [labelled])
    live_plain.set_mask(mask)
    live_placed.set_mask(mask)
    assert torch.allclose(live_plain.logits, live_placed.logits, atol=1e-6)
    assert _hooked(placed.model) == hooks and not placed.model.model.layers[1]._forward_pre_hooks


def test_surgery_on_offloaded_weights_says_it_needs_them_in_memory(llama_dir, tmp_path):
    placed = load_model(str(llama_dir), device_map=OFFLOADED, offload_folder=str(tmp_path))
    with pytest.raises(MaskError, match="needs the weights in memory"):
        prune_model(placed.model, HeadMask.from_pruned({0: [1]}, placed.adapter.grid_shape))


@pytest.mark.parametrize("spec, message", [
    ('{"model": "cuda:3"}', "sends 'model' to 'cuda:3', which this machine does not have. Available: cpu, disk"),
    ('{"model": 1}', "sends 'model' to '1'"),
    ("{not json", "Accepted: 'auto', a JSON object"),
    ("{}", "non-empty JSON object"),
])
def test_bad_device_maps_are_named(spec, message):
    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has the GPUs the map names")
    with pytest.raises(DeviceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_device_map(spec)


def test_dtype_choices():
    assert parse_dtype("bf16") is torch.bfloat16 and parse_dtype(None) is None
    with pytest.raises(DeviceError, match="Accepted: fp32, bf16, fp16"):
        parse_dtype("int8")


def test_bf16_load_converts_the_weights(llama_dir):
    loaded = load_model(str(llama_dir), "cpu", dtype="bf16")
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}


def test_a_device_map_naming_a_missing_module_is_named(llama_dir):
    with pytest.raises(DeviceError, match="names 'model.layerz.0', which this model does not have"):
        load_model(str(llama_dir), device_map={**OFFLOADED, "model.layerz.0": "cpu"})
