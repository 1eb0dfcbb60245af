"""`prune --format gguf`: the file read back with gguf's own reader (metadata arrays, tensor shapes, q8_0 within its
error bound) and run by an independent numpy re-implementation of llama.cpp's deci graph (``src/models/deci.cpp``:
RMSNorm, "normal" RoPE on consecutive pairs, grouped-query attention with per-layer counts, SwiGLU, a layer of 0
heads skipped), compared with headprune's own cut model. llama.cpp itself runs these files in
benchmarks/gguf_check.sh (its build takes about an hour, too long for CI)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import transformers as tf

from headprune.cli import main
from headprune.data import load_data
from headprune.demos.corpus import reviews
from headprune.model.arch import adapt
from headprune.model.gating import gate_heads
from headprune.model.gguf_export import (
    GGUF_FILE,
    GGUFPlan,
    config_problem,
    export_gguf,
    read_gguf,
    rope_permute,
    tokenizer_problem,
    write_gguf,
)
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import offline_tokenizer, tiny_decoder, tiny_decoder_config

pytest.importorskip("gguf")


# -- an independent numpy deci forward ------------------------------------------------------------------------

def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def deci_forward(contents, ids: list[int]) -> np.ndarray:
    """Logits (T, vocab) of llama.cpp's deci graph for one row, from a GGUF file's tensors, in float64."""
    f, t = contents.fields, contents.tensors
    heads, kv_heads = f["deci.attention.head_count"], f["deci.attention.head_count_kv"]
    eps, d = f["deci.attention.layer_norm_rms_epsilon"], f["deci.attention.key_length"]
    n = len(ids)
    inv = f.get("deci.rope.freq_base", 10000.0) ** (-np.arange(0, d, 2) / d)
    if "rope_freqs.weight" in t:
        inv = inv / t["rope_freqs.weight"]
    pos = np.arange(n, dtype=np.float64)
    if f.get("deci.rope.scaling.type") == "linear":
        pos = pos / f["deci.rope.scaling.factor"]
    cos, sin = np.cos(pos[:, None] * inv)[:, None, :], np.sin(pos[:, None] * inv)[:, None, :]

    def rope(x):   # llama.cpp's LLAMA_ROPE_TYPE_NORM: rotate the pairs (2i, 2i + 1)
        out = np.empty_like(x)
        out[..., 0::2] = x[..., 0::2] * cos - x[..., 1::2] * sin
        out[..., 1::2] = x[..., 0::2] * sin + x[..., 1::2] * cos
        return out

    def linear(x, name, layer):
        y = x @ t[f"blk.{layer}.{name}.weight"].astype(np.float64).T
        bias = t.get(f"blk.{layer}.{name}.bias")
        return y if bias is None else y + bias

    x = t["token_embd.weight"].astype(np.float64)[ids]
    causal = np.triu(np.full((n, n), -np.inf), 1)
    for layer, (n_q, n_kv) in enumerate(zip(heads, kv_heads)):
        if n_q:
            h = _rms(x, t[f"blk.{layer}.attn_norm.weight"], eps)
            q = rope(linear(h, "attn_q", layer).reshape(n, n_q, d))
            k = rope(linear(h, "attn_k", layer).reshape(n, n_kv, d))
            v = linear(h, "attn_v", layer).reshape(n, n_kv, d)
            context = []
            for p in range(n_q):
                j = p // (n_q // n_kv)
                s = q[:, p] @ k[:, j].T / np.sqrt(d) + causal
                s = np.exp(s - s.max(-1, keepdims=True))
                context.append((s / s.sum(-1, keepdims=True)) @ v[:, j])
            x = x + linear(np.concatenate(context, -1), "attn_output", layer)
        h = _rms(x, t[f"blk.{layer}.ffn_norm.weight"], eps)
        gate = linear(h, "ffn_gate", layer)
        x = x + linear(gate / (1 + np.exp(-gate)) * linear(h, "ffn_up", layer), "ffn_down", layer)
    x = _rms(x, t["output_norm.weight"], eps)
    return x @ t.get("output.weight", t["token_embd.weight"]).astype(np.float64).T


def _scale_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got - want).max() / np.abs(want).max())


# -- tiny models ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE (GPT-2's pre-tokenizer) of 300 tokens trained on the demo reviews."""
    return offline_tokenizer("byte-level-bpe", reviews().texts[:200], vocab_size=300)


def _decoder(arch: str, vocab: int, **config):
    """A tiny 4-layer decoder, 8 query heads in 2 key/value groups, head size 8; ``config`` overrides."""
    base = tiny_decoder_config(arch, vocab_size=vocab).to_dict()
    for key in ("layer_types", "use_sliding_window", "sliding_window", "max_window_layers", "architectures"):
        base.pop(key, None)
    torch.manual_seed(0)
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "phi3": tf.Phi3Config}
    model = tf.AutoModelForCausalLM.from_config(cls[arch](**{**base, **config}), attn_implementation="sdpa")
    with torch.no_grad():   # random norms: a wrong norm weight or a swapped norm shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model.eval()


# layer 0 empty (written as a null head), layer 1 empty (head_count 0), layer 2 one whole group of 4 kept (n_gqa
# 4), layer 3 uneven groups (2 + 3 heads: each key/value row held once per head, gcd 1), a tuned scale baked in
UNEVEN = {"pruned": {"0": list(range(8)), "1": list(range(8)), "2": [4, 5, 6, 7], "3": [1, 2, 4]},
          "scales": {"2": {"1": 0.5}}}


def _mask(model) -> HeadMask:
    adapter = adapt(model)
    return HeadMask.from_json(UNEVEN, adapter.grid_shape, adapter.group_grid())


def _row(tokenizer) -> list[int]:
    return tokenizer(reviews().texts[300])["input_ids"][:24]


@pytest.mark.parametrize("arch,config", [
    ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
    ("mistral", {}),
    ("qwen2", {}),
    ("phi3", {}),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 16}}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}}),
])
def test_uneven_cut_runs_as_the_cut_model_in_the_deci_graph(arch, config, bpe, tmp_path, one_thread):
    model = _decoder(arch, len(bpe) + 13, **config)   # 13 padded rows beyond the tokenizer
    cut, report = export_gguf(model, bpe, _mask(model), tmp_path / "out")
    contents = read_gguf(report["file"])
    blocks = adapt(cut).blocks
    assert contents.fields["general.architecture"] == "deci"
    o_bias = int(bool(config.get("attention_bias")))   # an empty layer whose O has a bias: a null head
    assert contents.fields["deci.attention.head_count"] == [1, o_bias, 4, 5] == report["head_count"]
    assert contents.fields["deci.attention.head_count_kv"] == [1, o_bias, 1, 5]
    assert [b.n_live for b in blocks] == [0, 0, 4, 5] and report["null_head_layers"] == [0, 1][:1 + o_bias]
    assert any(name.startswith("blk.1.attn") for name in contents.tensors) == bool(o_bias)
    assert contents.tensors["blk.3.attn_k.weight"].shape == (5 * 8, 64)
    assert contents.tensors["token_embd.weight"].shape == (len(bpe) + 13, 64)
    assert ("output.weight" in contents.tensors) == (not model.config.tie_word_embeddings)
    assert set(contents.types.values()) == {"F32"}
    ids = _row(bpe)
    with torch.no_grad():
        want = cut(torch.tensor([ids])).logits[0].double().numpy()
    assert _scale_error(deci_forward(contents, ids), want) < 1e-5
    # the scale is baked: the cut model is the gated one
    with torch.no_grad(), gate_heads(model, _mask(model)):
        gated = model(torch.tensor([ids])).logits[0].double().numpy()
    assert _scale_error(want, gated) < 1e-5


def test_qwen3_is_refused_because_deci_computes_other_logits(bpe, tmp_path, one_thread):
    """The refusal, proved by logits: Qwen3's weights written as deci takes them -- everything but q_norm / k_norm,
    for which deci has no slot -- give logits far from Qwen3's own, while Qwen2's (no q/k norm) agree to 1e-5."""
    model = tiny_decoder("qwen3", vocab_size=len(bpe))
    assert config_problem({**model.config.to_dict(), "architectures": ["Qwen3ForCausalLM"]}).startswith(
        "--format gguf cannot carry 'qwen3'")
    rope = {"rope_type": "default", "rope_theta": model.config.rope_parameters["rope_theta"]}
    write_gguf(tmp_path / "qwen3.gguf", model, bpe, GGUFPlan("qwen3", 64, rope), "f32")
    ids = _row(bpe)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    assert _scale_error(deci_forward(read_gguf(tmp_path / "qwen3.gguf"), ids), want) > 0.05


def test_rope_permutation_turns_half_rotation_into_pair_rotation():
    """RoPE on consecutive pairs of permuted rows == transformers' rotate_half RoPE on the original rows."""
    d, heads, pos = 8, 3, 5.0
    x = torch.randn(heads * d, dtype=torch.float64)
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    cos, sin = torch.cos(pos * inv).repeat(2), torch.sin(pos * inv).repeat(2)
    half = x.view(heads, d)
    rotated = half * cos + torch.cat([-half[:, d // 2:], half[:, :d // 2]], -1) * sin   # transformers
    perm = rope_permute(x, heads).view(heads, d)
    pairs = torch.empty_like(perm)
    pairs[:, 0::2] = perm[:, 0::2] * cos[: d // 2] - perm[:, 1::2] * sin[: d // 2]
    pairs[:, 1::2] = perm[:, 0::2] * sin[: d // 2] + perm[:, 1::2] * cos[: d // 2]
    assert torch.allclose(pairs, rope_permute(rotated.reshape(-1), heads).view(heads, d))
    assert not torch.allclose(pairs, rotated)   # the permutation is needed


def test_q8_0_and_f16_stay_within_their_error_bounds(bpe, tmp_path, one_thread):
    model = _decoder("llama", len(bpe))
    mask = _mask(model)
    cut = prune_model(model, mask)
    exact = read_gguf(export_gguf(model, bpe, mask, tmp_path / "f32", cut=cut)[1]["file"])
    ids = _row(bpe)
    with torch.no_grad():
        want = cut(torch.tensor([ids])).logits[0].double().numpy()
    for kind, logits_bound in (("q8_0", 3e-2), ("f16", 2e-3)):
        contents = read_gguf(export_gguf(model, bpe, mask, tmp_path / kind, kind, cut=cut)[1]["file"])
        quantized = [n for n, k in contents.types.items() if k == kind.upper()]
        assert "blk.2.ffn_up.weight" in quantized and "token_embd.weight" in quantized
        assert contents.types["blk.2.ffn_norm.weight"] == "F32"
        for name in quantized:
            w, got = exact.tensors[name], contents.tensors[name]
            if kind == "q8_0":   # per block of 32: s = max|w| / 127 stored as f16 (relative error <= 2^-11),
                # w ~ s_f16 round(w / s): |error| <= s / 2 + 127 s 2^-11 < 0.57 s
                blocks = w.reshape(-1, 32)
                s = np.abs(blocks).max(-1, keepdims=True) / 127
                assert (np.abs(got.reshape(-1, 32) - blocks) <= 0.57 * s + 1e-12).all(), name
            else:
                assert np.allclose(got, w, rtol=2 ** -10, atol=2 ** -24), name
        assert 0 < _scale_error(deci_forward(contents, ids), want) < logits_bound


def test_empty_mask_writes_the_dense_baseline(bpe, tmp_path, one_thread):
    model = _decoder("llama", len(bpe))
    _, report = export_gguf(model, bpe, HeadMask.ones(adapt(model).grid_shape), tmp_path / "dense",
                            name="a Phi-3 lookalike")
    contents = read_gguf(report["file"])
    assert contents.fields["general.name"] == "headprune cut"   # llama.cpp keys Phi-3's tokenizer quirks on it
    assert contents.fields["deci.attention.head_count"] == [8] * 4
    assert contents.fields["deci.attention.head_count_kv"] == [2] * 4
    ids = _row(bpe)
    with torch.no_grad():
        want = model(torch.tensor([ids])).logits[0].double().numpy()
    assert _scale_error(deci_forward(contents, ids), want) < 1e-5


def test_the_tokenizer_travels(bpe, tmp_path, one_thread):
    model = _decoder("llama", len(bpe) + 5)
    contents = read_gguf(export_gguf(model, bpe, HeadMask.ones(adapt(model).grid_shape), tmp_path / "o")[1]["file"])
    f = contents.fields
    vocab = bpe.get_vocab()
    assert f["tokenizer.ggml.model"] == "gpt2" and f["tokenizer.ggml.pre"] == "gpt-2"
    assert f["tokenizer.ggml.tokens"][: len(bpe)] == sorted(vocab, key=vocab.get)
    assert f["tokenizer.ggml.tokens"][len(bpe):] == [f"[PAD{i}]" for i in range(len(bpe), len(bpe) + 5)]
    assert f["tokenizer.ggml.token_type"][len(bpe):] == [5] * 5                       # UNUSED
    assert f["tokenizer.ggml.token_type"][vocab["<s>"]] == 3                          # CONTROL
    merges = json.loads(bpe.backend_tokenizer.to_str())["model"]["merges"]
    assert f["tokenizer.ggml.merges"] == [" ".join(m) if isinstance(m, list) else m for m in merges]
    assert (f["tokenizer.ggml.bos_token_id"], f["tokenizer.ggml.eos_token_id"]) == (vocab["<s>"], vocab["</s>"])
    assert f["tokenizer.ggml.add_bos_token"] and f["tokenizer.ggml.add_eos_token"]   # RobertaProcessing: <s> A </s>


def _split(regex: str) -> dict:
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}


LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.mark.parametrize("spec,accepted", [
    ({"model": {"type": "BPE", "ignore_merges": True}, "pre_tokenizer": _split(LLAMA3)}, True),
    ({"model": {"type": "BPE"}, "pre_tokenizer": _split(LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")),
      "normalizer": {"type": "NFC"}}, True),
    ({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, {"type": "ByteLevel", "use_regex": True}]}}, True),
    ({"model": {"type": "BPE"}, "pre_tokenizer": _split(r"\w+")}, False),
    ({"model": {"type": "BPE", "byte_fallback": True}, "pre_tokenizer": {"type": "Metaspace"}}, False),
    ({"model": {"type": "WordLevel"}, "pre_tokenizer": {"type": "Whitespace"}}, False),
    ({"model": {"type": "Unigram"}, "pre_tokenizer": {"type": "Metaspace"}}, False),
    ({"model": {"type": "BPE"}, "pre_tokenizer": _split(LLAMA3)}, False),   # Llama 3's regex without ignore_merges
])
def test_tokenizers_llama_cpp_reads_the_same_way(spec, accepted):
    assert (tokenizer_problem(spec) is None) == accepted


# -- the command ------------------------------------------------------------------------------------------------

def _save(model, tokenizer, folder, broken_weights: bool = False):
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    if broken_weights:   # a refusal that still loaded weights would fail on these bytes instead
        (folder / "model.safetensors").write_bytes(b"not weights")
    return folder


def _prune(argv, capsys):
    capsys.readouterr()   # what saving the test's model printed
    rc = main(["prune", *map(str, argv)])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("arch,words", [("qwen3", "q_norm / k_norm"), ("gemma3", "GELU(tanh)"),
                                        ("gpt2", "LayerNorm")])
def test_families_deci_cannot_compute_are_refused_before_loading(arch, words, bpe, tmp_path, capsys, one_thread):
    folder = _save(tiny_decoder(arch, vocab_size=len(bpe)), bpe, tmp_path / arch, broken_weights=True)
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}))
    rc, _, err = _prune(["--model", folder, "--mask", mask, "--out", tmp_path / "o", "--format", "gguf"], capsys)
    assert rc == 2 and err.startswith("error:") and words in err and "Accepted: Llama, Mistral, Qwen2" in err
    assert not (tmp_path / "o").exists()


def test_bad_input_is_refused_before_loading(bpe, tmp_path, capsys, one_thread):
    folder = _save(_decoder("llama", len(bpe)), bpe, tmp_path / "llama", broken_weights=True)
    classifier = _save(tiny_decoder("llama", head="cls", vocab_size=len(bpe)), bpe, tmp_path / "cls",
                       broken_weights=True)
    word_level = tmp_path / "words"
    _save(_decoder("llama", 40), bpe, word_level, broken_weights=True)
    (word_level / "tokenizer.json").write_text(json.dumps({"model": {"type": "WordLevel", "vocab": {"a": 0}},
                                                           "pre_tokenizer": {"type": "Whitespace"}}))
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}))
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    cases = [
        (["--model", folder, "--out", tmp_path / "a", "--format", "masked", "--gguf-type", "q8_0"],
         "--gguf-type q8_0 applies to --format gguf only"),
        (["--model", classifier, "--out", tmp_path / "b", "--format", "gguf"], "LlamaForSequenceClassification"),
        (["--model", word_level, "--out", tmp_path / "c", "--format", "gguf"], "word-level vocabulary"),
        (["--model", "demo-circuit", "--out", tmp_path / "e", "--format", "gguf"], "as demo-circuit's"),
        (["--model", folder, "--out", taken, "--format", "gguf"], "taken"),
    ]
    for argv, words in cases:
        rc, _, err = _prune([*argv, "--mask", mask], capsys)
        assert rc == 2 and err.startswith("error:") and words in err, err
    assert not any((tmp_path / name).exists() for name in "abce")
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    with pytest.raises(SystemExit) as exit_:   # argparse's choices
        _prune(["--model", folder, "--mask", mask, "--out", tmp_path / "d", "--format", "gguf", "--gguf-type",
                "q4_0"], capsys)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.startswith("error:") and "'q4_0'" in err and "'q8_0'" in err


def test_a_failed_write_leaves_nothing(bpe, tmp_path, monkeypatch, one_thread):
    model = _decoder("llama", len(bpe))

    def fail(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("headprune.model.gguf_export.encode_tensor", fail)
    with pytest.raises(OSError):
        export_gguf(model, bpe, HeadMask.ones(adapt(model).grid_shape), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_demo_lm_prune_gguf_matches_headprune_on_real_rows(tmp_path, capsys, one_thread):
    """The command on the demo decoder: an uneven mask, and the empty mask as the dense baseline, each read back
    and run by the numpy deci graph on held-out review rows, against headprune's cut (or dense) model."""
    loaded = load_model("demo-lm", "cpu")
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": list(range(8)), "1": [0, 1, 2], "3": [4, 5, 6, 7], "5": [2]}}))
    rows = [loaded.tokenizer(text)["input_ids"][:40] for text in load_data("demo-lm").texts[:3]]
    for name, argv in (("cut", ["--mask", mask]), ("dense", ["--mask", tmp_path / "empty.json"])):
        (tmp_path / "empty.json").write_text('{"pruned": {}}')
        rc, out, err = _prune(["--model", "demo-lm", "--out", tmp_path / name, "--format", "gguf", *argv], capsys)
        assert rc == 0, err
        report = json.loads(out)
        assert report["gguf"]["file"] == str(tmp_path / name / GGUF_FILE)
        assert "add_prefix_space" in err   # demo-lm's tokenizer: the note tells llama.cpp users what to do
        contents = read_gguf(tmp_path / name / GGUF_FILE)
        model = loaded.model if name == "dense" else prune_model(
            loaded.model, HeadMask.load(mask, loaded.adapter.grid_shape))
        expected = [8] * 6 if name == "dense" else [1, 5, 8, 4, 8, 7]
        assert contents.fields["deci.attention.head_count"] == expected
        for ids in rows:
            with torch.no_grad():
                want = model(torch.tensor([ids])).logits[0].double().numpy()
            assert _scale_error(deci_forward(contents, ids), want) < 1e-5

