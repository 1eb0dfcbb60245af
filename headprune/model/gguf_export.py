"""llama.cpp export: a decoder cut by any mask, as one GGUF file that llama.cpp loads unmodified.

llama.cpp's ``deci`` architecture (DeciLM / Llama-3.1-Nemotron-NAS; ``src/models/deci.cpp``) reads
``deci.attention.head_count`` and ``deci.attention.head_count_kv`` as per-layer arrays, so an uneven cut -- a
different number of query heads and key/value groups in every layer, whole layers without attention -- keeps its
saving in llama.cpp (and so in ollama, LM Studio, llama-cpp-python). What deci computes, per layer l with
q_l = head_count[l] query heads and n_l = head_count_kv[l] key/value heads of size d:

    q_l > 0:  h = x + W_O [softmax(Q_p K_(p // (q_l / n_l))^T / sqrt(d) + causal) V_(p // (q_l / n_l))]_p (+ b_O)
              with Q, K, V = RMSNorm(x) W_{Q,K,V}^T (+ b_{Q,K,V}), RoPE on Q and K
    q_l = 0:  h = x                                                    (the attention-free layer of Nemotron-51B)
    then      y = h + W_down (SiLU(W_gate RMSNorm(h)) * W_up RMSNorm(h)) (+ biases)

then the output RMSNorm and the head (the embedding when ``output.weight`` is absent: a tied head). This is
exactly a Llama / Mistral / Qwen2 / Phi-3 decoder layer with surgery's per-layer counts (``surgery.py``: the
kept query heads grouped by key/value group, and for uneven groups each group's key/value rows held c_g / k times,
k = gcd(c_g), so query position p reads key/value head p // k -- stock grouped-query attention, which deci
computes with ``n_gqa = q_l / n_l = k``). Families whose maths deci cannot express are refused by name before any
weights load (:data:`REFUSED`): Qwen3 and Gemma 3 normalise each head's queries and keys (not linear, so not
foldable into W_Q / W_K), Gemma 3 adds norms after attention and the MLP and scales its embeddings, GPT-2 uses
LayerNorm, GELU and learned positions.

Mapping details (all from llama.cpp's own converter, ``conversion/deci.py`` / ``llama.py``):
* RoPE: transformers rotates the two halves of a head (``rotate_half``), llama.cpp's deci uses the "normal" RoPE
  on consecutive pairs, so the rows of W_Q and W_K (and their biases) are permuted within each head from
  [x_0..x_(d/2-1), x_(d/2)..x_(d-1)] to [x_0, x_(d/2), x_1, x_(d/2+1), ...] (:func:`rope_permute`), which makes
  the pair rotation of the permuted rows the half rotation of the original ones. rope_type "default", "linear"
  (``rope.scaling.factor``) and "llama3" (``rope_freqs.weight``, the per-frequency factors of Llama 3.1) map
  exactly; other RoPE scalings are refused by name.
* An attention-free layer: head_count 0, no attention tensors. llama.cpp takes the head size from layer 0
  (``n_embd / n_head(0)``, ``llama-model.cpp``), so an empty layer 0 -- and an empty layer whose O has a bias,
  which the cut model still adds -- is written instead as one *null head*: W_Q = W_K = W_V = 0 and W_O = 0, so
  its output is exactly 0 (+ b_O) at the cost of one head of size d.
* Sliding-window attention (Mistral's ``sliding_window``, Qwen2's ``use_sliding_window``, Phi-3): deci attends
  to the whole context, which equals sliding attention over at most ``window`` tokens, so the file's context
  length is set to the window (a note says so); llama.cpp warns when a context beyond it is asked for.
* A tuned mask's scales are baked into W_O (``surgery.bake_scales``, through ``prune_model``), as in every
  format; soft (fractional) gates are refused, as by surgery.
* Tensor types: f32; f16 (2-D weights, norms and biases stay f32, as llama.cpp's converter keeps them);
  q8_0 (2-D weights whose rows are a multiple of 32 values, blocks of 32 with one f16 scale
  s = max|w| / 127 and w ~ s round(w / s); other 2-D weights f16, 1-D f32).
* The tokenizer: a byte-level BPE (``tokenizer.ggml.model`` "gpt2") whose pre-tokenizer llama.cpp names --
  GPT-2's regex ("gpt-2"), digits split then GPT-2's regex ("smollm"), Llama 3's ("llama-bpe"), Qwen2's
  ("qwen2") -- with its merges, special tokens and whether BOS / EOS are added (read by encoding a probe with
  and without special tokens). A vocabulary llama.cpp reads differently is refused by name
  (:func:`tokenizer_problem`: word-level such as demo-circuit's, WordPiece, Unigram, SentencePiece-style BPE with
  byte fallback). ``add_prefix_space`` (demo-lm's) has no llama.cpp counterpart for BPE: the note says to start
  the text with a space. An embedding wider than the tokenizer (a padded vocabulary) gets "[PAD<id>]" tokens of
  type UNUSED for the ids no token has, as llama.cpp's converter writes them.
The file is written through ``loading.write_staged`` (a temporary folder renamed into place): nothing half-written.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import HeadpruneError
from ..userinput import is_file, read_user_json
from .arch import adapt
from .loading import folder_config, is_lm_config, model_folder, write_staged
from .mask import HeadMask
from .surgery import prune_model

GGUF_TYPES = ("f32", "f16", "q8_0")
GGUF_FILE = "model.gguf"
ARCH = "deci"
Q8_BLOCK = 32   # values per q8_0 block (ggml's QK8_0)
# llama.cpp's vocabulary loader changes special tokens' whitespace handling when general.name contains these
# (src/llama-vocab.cpp: Phi-3's and ModernBERT's quirks, which also demand tokens of theirs): never written
NAME_QUIRKS = ("phi-3", "phi3", "modern-bert")

# model_type -> name, for the families whose layer is deci's (module docstring)
GGUF_FAMILIES = {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2", "phi3": "Phi-3"}
_QK_NORM = ("normalises every head's queries and keys (q_norm / k_norm, an RMSNorm over the head) before RoPE; "
            "llama.cpp's deci graph has no such step and, not being linear, it cannot be folded into W_Q / W_K")
REFUSED = {
    "qwen3": f"Qwen3 {_QK_NORM}",
    "gemma3_text": f"Gemma 3 {_QK_NORM}; it also adds an RMSNorm after attention and after the MLP, scales the "
                   "embeddings by sqrt(hidden), uses GELU(tanh) in its MLP and alternates sliding-window layers",
    "gpt2": "GPT-2 uses LayerNorm (with a mean and a bias), a GELU MLP and learned absolute positions; deci computes "
            "RMSNorm, SwiGLU and RoPE",
}
REFUSED["gemma3"] = REFUSED["gemma3_text"]
_ROPE_TYPES = ("default", "linear", "llama3")

# pre-tokenizers llama.cpp names (``tokenizer.ggml.pre``), keyed by the regex of the tokenizer.json Split that
# precedes a ByteLevel(use_regex=false); llama.cpp's own regex for each is in src/llama-vocab.cpp
_LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLIT_PRE = {_LLAMA3_REGEX: "llama-bpe", _QWEN2_REGEX: "qwen2"}
PRE_NAMES = ("gpt-2", "smollm", "llama-bpe", "qwen2")


class GGUFExportError(HeadpruneError):
    pass


@dataclass
class GGUFPlan:
    """What the file will say, decided from the config (and tokenizer) before weights load."""

    family: str
    context: int
    rope: dict
    notes: list[str] = field(default_factory=list)


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def _rope(config: dict) -> dict:
    """The config's RoPE parameters (transformers 5: ``rope_parameters``; 4: ``rope_theta`` + ``rope_scaling``)."""
    params = dict(config.get("rope_parameters") or {})
    if "full_attention" in params and isinstance(params["full_attention"], dict):
        params = dict(params["full_attention"])
    legacy = config.get("rope_scaling") or {}
    params.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    params.setdefault("rope_type", legacy.get("rope_type") or legacy.get("type") or "default")
    for key, value in legacy.items():
        params.setdefault(key, value)
    return params


def _window(config: dict) -> int | None:
    """The sliding window any layer attends within, or None when every layer sees the whole context."""
    window = config.get("sliding_window")
    if not window:
        return None
    kinds = config.get("layer_types")
    if kinds:
        return int(window) if "sliding_attention" in kinds else None
    if config.get("model_type") == "qwen2":
        return int(window) if config.get("use_sliding_window") else None
    return int(window)


def config_problem(config: dict) -> str | None:
    """Why a model of this config.json (a dict) cannot become a GGUF file llama.cpp computes exactly, or None."""
    text = _text_config(config)
    kind = str(text.get("model_type"))
    accepted = f"Accepted: {', '.join(GGUF_FAMILIES.values())} causal LMs."
    if kind in REFUSED:
        return f"--format gguf cannot carry '{kind}': {REFUSED[kind]}. {accepted}"
    if kind not in GGUF_FAMILIES:
        return (f"--format gguf writes llama.cpp's 'deci' architecture (RMSNorm, RoPE, SwiGLU, per-layer head "
                f"counts); '{kind}' is not a family headprune maps onto it. {accepted}")
    if not is_lm_config(config):
        return (f"--format gguf writes a causal language model; this {GGUF_FAMILIES[kind]} is "
                f"{', '.join(config.get('architectures') or ['not a *ForCausalLM'])}, whose head llama.cpp's deci "
                f"graph does not compute. {accepted}")
    act = text.get("hidden_act") or text.get("hidden_activation") or "silu"
    if act != "silu":
        return f"--format gguf needs a SwiGLU MLP (hidden_act 'silu'); this model uses {act!r}."
    rope = _rope(text)
    if rope["rope_type"] not in _ROPE_TYPES:
        return (f"--format gguf maps RoPE types {', '.join(_ROPE_TYPES)}; this model uses {rope['rope_type']!r}, "
                "which llama.cpp's deci graph would compute differently.")
    if float(text.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0) != 1.0:
        return "--format gguf needs RoPE over the whole head (partial_rotary_factor 1): deci asserts it."
    return None


def tokenizer_problem(spec: dict) -> str | None:
    """Why llama.cpp would read this tokenizer.json (a dict) differently, or None (module docstring)."""
    try:
        _pre_name(spec)
    except GGUFExportError as exc:
        return str(exc)
    return None


def _pre_name(spec: dict) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for a byte-level BPE tokenizer.json, or GGUFExportError naming why not."""
    def part(value) -> dict:   # a user's file: any value may have the wrong JSON type
        return value if isinstance(value, dict) else {}

    model = part(spec.get("model"))
    kind = model.get("type")
    accepted = ("llama.cpp reads byte-level BPE vocabularies whose pre-tokenizer it names (GPT-2's, SmolLM's, "
                "Llama 3's, Qwen2's)")
    if kind != "BPE" or model.get("byte_fallback"):
        what = {"WordLevel": "a word-level vocabulary (one token per word, as demo-circuit's)",
                "WordPiece": "a WordPiece vocabulary", "Unigram": "a SentencePiece Unigram vocabulary",
                "BPE": "a SentencePiece-style BPE with byte fallback (Llama 2, Mistral v0.1-v0.3)"}.get(
                    kind, f"a {kind!r} tokenizer model")
        raise GGUFExportError(f"The tokenizer is {what}; {accepted}. Export with --format headprune, masked or "
                              "uniform.")
    normalizer = part(spec.get("normalizer"))
    pre = part(spec.get("pre_tokenizer"))
    steps = [part(s) for s in (pre.get("pretokenizers") or [] if pre.get("type") == "Sequence" else [pre])]
    types = [s.get("type") for s in steps]
    byte_level = steps[-1] if types and types[-1] == "ByteLevel" else None
    name = None
    if byte_level is not None and byte_level.get("use_regex", True):
        if types == ["ByteLevel"]:
            name = "gpt-2"
        elif types == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
            name = "smollm"
    elif byte_level is not None and types == ["Split", "ByteLevel"]:
        split = steps[0]
        regex = part(split.get("pattern")).get("Regex")
        if split.get("behavior") == "Isolated" and not split.get("invert"):
            name = SPLIT_PRE.get(regex)
    if name is None:
        raise GGUFExportError(f"The tokenizer's pre-tokenizer ({' + '.join(map(str, types)) or 'none'}) splits "
                              f"text in a way llama.cpp names no pre-tokenizer for; {accepted}.")
    if bool(model.get("ignore_merges")) != (name == "llama-bpe"):   # llama.cpp sets it for llama-bpe only
        raise GGUFExportError(f"The tokenizer's ignore_merges={bool(model.get('ignore_merges'))} differs from "
                              f"llama.cpp's '{name}' pre-tokenizer; {accepted}.")
    if normalizer and not (normalizer.get("type") == "NFC" and name == "qwen2"):
        raise GGUFExportError(f"The tokenizer normalises text ({normalizer.get('type')}); llama.cpp's byte-level "
                              f"BPE does not; {accepted}.")
    return name


def check_source(spec: str, tensor_type: str) -> GGUFPlan | None:
    """Refuse, before any weights load, a model ``spec`` (named, or a folder) that --format gguf cannot carry and
    a ``tensor_type`` outside :data:`GGUF_TYPES`. None for a hub id (checked once loaded)."""
    if tensor_type not in GGUF_TYPES:
        raise GGUFExportError(f"--gguf-type {tensor_type!r} is not a GGUF tensor type headprune writes; accepted: "
                              f"{', '.join(GGUF_TYPES)}.")
    folder = model_folder(spec)
    if folder is None:
        return None
    config = folder_config(folder)
    if config is None:
        return None   # load_model names the problem
    plan = gguf_plan(config)
    if is_file(folder / "tokenizer.json"):
        tokenizer_json = read_user_json(folder / "tokenizer.json", "the model's tokenizer", "a tokenizer.json as "
                                        "save_pretrained writes it", error=GGUFExportError)
        if isinstance(tokenizer_json, dict):
            _pre_name(tokenizer_json)
    return plan


def gguf_plan(config: dict) -> GGUFPlan:
    """The family, context and RoPE the file will carry; GGUFExportError (:func:`config_problem`) when none."""
    problem = config_problem(config)
    if problem:
        raise GGUFExportError(problem)
    text = _text_config(config)
    context = int(text.get("max_position_embeddings") or 2048)
    notes = []
    window = _window(text)
    if window is not None and window < context:
        notes.append(f"The model attends within a sliding window of {window} tokens, which llama.cpp's deci graph "
                     f"does not: the file's context length is {window} (of {context}), where the two agree.")
        context = window
    return GGUFPlan(str(text.get("model_type")), context, _rope(text), notes)


def model_problem(model: nn.Module, tokenizer) -> str | None:
    """Why a loaded ``model`` and its ``tokenizer`` cannot become a GGUF file (:func:`config_problem`,
    :func:`loaded_tokenizer_problem`), or None: what the dashboard says before offering the format."""
    return (config_problem({**model.config.to_dict(), "architectures": [type(model).__name__]})
            or loaded_tokenizer_problem(tokenizer))


def loaded_tokenizer_problem(tokenizer) -> str | None:
    """Why llama.cpp would read a loaded ``tokenizer`` differently (:func:`tokenizer_problem`), or None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return ("--format gguf needs the model's fast tokenizer (tokenizer.json): llama.cpp's vocabulary is built "
                "from it.")
    return tokenizer_problem(json.loads(backend.to_str()))


# -- tensors ----------------------------------------------------------------------------------------------------

def rope_permute(rows: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of W_Q / W_K (or their bias) reordered within each of ``n_heads`` heads from transformers' half split
    to llama.cpp's consecutive pairs: head row 2i <- i, 2i + 1 <- i + d/2 (``conversion/deci.py``'s permute)."""
    if n_heads == 0:
        return rows
    shape = rows.shape
    return rows.reshape(n_heads, 2, shape[0] // n_heads // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _llama3_factors(rope: dict, head_dim: int) -> torch.Tensor:
    """Llama 3.1's per-frequency RoPE divisors (transformers' ``_compute_llama3_parameters``, as llama.cpp's
    converter writes them into ``rope_freqs.weight``: theta_i / factor_i is the frequency used)."""
    base = float(rope.get("rope_theta", 10000.0))
    freqs = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old = float(rope.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old / low, old / high
    factors = []
    for freq in freqs.tolist():
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32)


def _parts(layer: nn.Module, family: str, n_q: int, n_kv: int, d: int) -> dict:
    """A cut layer's weights as deci names them (None: absent); Phi-3's fused projections split in two/three."""
    attn, mlp = layer.self_attn, layer.mlp
    if family == "phi3":
        qkv = attn.qkv_proj.weight
        q, k, v = torch.split(qkv, [n_q * d, n_kv * d, n_kv * d])
        gate, up = mlp.gate_up_proj.weight.chunk(2, dim=0)   # Phi3MLP: gate, up = gate_up_proj(x).chunk(2)
        proj = {"q": (q, None), "k": (k, None), "v": (v, None)}
        ffn = {"gate": (gate, None), "up": (up, None)}
    else:
        proj = {p: (getattr(attn, f"{p}_proj").weight, getattr(attn, f"{p}_proj").bias) for p in "qkv"}
        ffn = {p: (getattr(mlp, f"{p}_proj").weight, getattr(mlp, f"{p}_proj").bias) for p in ("gate", "up")}
    return {"attn_norm": layer.input_layernorm.weight, "ffn_norm": layer.post_attention_layernorm.weight,
            **{f"attn_{p}": proj[p] for p in "qkv"}, "attn_output": (attn.o_proj.weight, attn.o_proj.bias),
            **{f"ffn_{p}": ffn[p] for p in ("gate", "up")}, "ffn_down": (mlp.down_proj.weight, mlp.down_proj.bias)}


def deci_tensors(cut: nn.Module, family: str, rope: dict) -> tuple[dict[str, torch.Tensor], list[int], list[int],
                                                                      list[int]]:
    """(tensors by GGUF name, head_count, head_count_kv, null-head layers) of a model cut by ``prune_model``.

    Float32 copies on the CPU; W_Q / W_K rows RoPE-permuted; an empty layer 0 or an empty layer whose O has a bias
    as one null head (module docstring).
    """
    adapter = adapt(cut)
    d = adapter.blocks[0].head_size
    hidden = cut.get_input_embeddings().weight.shape[1]
    tensors: dict[str, torch.Tensor] = {}

    def put(name, value):
        if value is not None:
            tensors[name] = value.detach().to("cpu", torch.float32).clone()

    put("token_embd.weight", cut.get_input_embeddings().weight)
    put("output_norm.weight", cut.model.norm.weight)
    head = cut.get_output_embeddings()
    if head.weight.data_ptr() != cut.get_input_embeddings().weight.data_ptr():
        put("output.weight", head.weight)
    if getattr(head, "bias", None) is not None:
        raise GGUFExportError("The LM head has a bias; llama.cpp's deci graph adds none.")
    if rope["rope_type"] == "llama3":
        put("rope_freqs.weight", _llama3_factors(rope, d))
    heads, kv_heads, null = [], [], []
    for block, layer in zip(adapter.blocks, adapter.layer_modules):
        i, n_q, n_kv = block.index, block.n_live, block.n_kv_live
        parts = _parts(layer, family, n_q, n_kv, d)
        o_bias = parts["attn_output"][1]
        if n_q == 0 and (i == 0 or o_bias is not None):
            null.append(i)
            n_q = n_kv = 1
            zeros = torch.zeros(d, hidden)
            parts.update({f"attn_{p}": (zeros, None if parts[f"attn_{p}"][1] is None else torch.zeros(d))
                          for p in "qkv"})
            parts["attn_output"] = (zeros.T, o_bias)
        heads.append(n_q)
        kv_heads.append(n_kv)
        put(f"blk.{i}.ffn_norm.weight", parts["ffn_norm"])
        for name in ("ffn_gate", "ffn_up", "ffn_down"):
            put(f"blk.{i}.{name}.weight", parts[name][0])
            put(f"blk.{i}.{name}.bias", parts[name][1])
        if n_q == 0:
            continue
        put(f"blk.{i}.attn_norm.weight", parts["attn_norm"])
        for name, count in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", None), ("attn_output", None)):
            weight, bias = parts[name]
            put(f"blk.{i}.{name}.weight", weight if count is None else rope_permute(weight, count))
            put(f"blk.{i}.{name}.bias", bias if bias is None or count is None else rope_permute(bias, count))
    return tensors, heads, kv_heads, null


def encode_tensor(name: str, tensor: torch.Tensor, tensor_type: str):
    """(numpy data, ggml type) of one tensor written as ``tensor_type`` (module docstring: 1-D stays f32; q8_0 for
    2-D weights whose rows are a multiple of 32 values, else f16)."""
    import gguf  # the gguf extra: imported only when a GGUF file is written or read

    array = tensor.numpy().astype(np.float32)
    if array.ndim == 1 or tensor_type == "f32" or name == "rope_freqs.weight":
        return array, gguf.GGMLQuantizationType.F32
    if tensor_type == "q8_0" and array.shape[-1] % Q8_BLOCK == 0:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    return array.astype(np.float16), gguf.GGMLQuantizationType.F16


# -- tokenizer --------------------------------------------------------------------------------------------------

@dataclass
class GGUFVocab:
    """A tokenizer as llama.cpp's "gpt2" vocabulary: tokens, types, merges, special ids and flags."""

    pre: str
    tokens: list[str]
    types: list[int]
    merges: list[str]
    special: dict[str, int]
    add_bos: bool
    add_eos: bool
    notes: list[str]


def gguf_vocab(tokenizer, n_vocab: int) -> GGUFVocab:
    """The vocabulary llama.cpp reads for ``tokenizer`` (a fast tokenizer), padded to the embedding's ``n_vocab``
    rows (module docstring). GGUFExportError when llama.cpp cannot read it the same way."""
    import gguf  # the gguf extra: imported only when a GGUF file is written or read

    problem = loaded_tokenizer_problem(tokenizer)
    if problem:
        raise GGUFExportError(problem)
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = _pre_name(spec)
    vocab = tokenizer.get_vocab()
    size = max(vocab.values()) + 1
    if size > n_vocab:
        raise GGUFExportError(f"The tokenizer has ids up to {size - 1}, beyond the embedding's {n_vocab} rows.")
    by_id = {i: t for t, i in vocab.items()}
    added = {t.content: t.special for t in getattr(tokenizer, "added_tokens_decoder", {}).values()}
    special_ids = set(tokenizer.all_special_ids)
    tokens, types = [], []
    for i in range(n_vocab):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(token)
            types.append(gguf.TokenType.CONTROL if i in special_ids or added.get(token) else
                         gguf.TokenType.USER_DEFINED if token in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges") or []]
    special = {kind: getattr(tokenizer, f"{kind}_token_id") for kind in ("bos", "eos", "unk", "pad")
               if getattr(tokenizer, f"{kind}_token_id", None) is not None}
    probe = "a"
    bare = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    start = full.index(bare[0]) if bare and bare[0] in full else -1
    before, after = full[:start], full[start + len(bare):]
    if start < 0 or before not in ([], [special.get("bos")]) or after not in ([], [special.get("eos")]):
        raise GGUFExportError(f"The tokenizer wraps a text in {before} ... {after}; llama.cpp can add only its BOS "
                              "token before and its EOS token after.")
    notes = []
    pre_tokenizer = spec.get("pre_tokenizer") or {}
    steps = pre_tokenizer.get("pretokenizers") if pre_tokenizer.get("type") == "Sequence" else [pre_tokenizer]
    if any(s.get("add_prefix_space") for s in steps):
        notes.append("The tokenizer adds a space before a text that does not start with one (add_prefix_space); "
                     "llama.cpp's byte-level BPE does not, so start a prompt with a space to get the same tokens.")
    return GGUFVocab(pre, tokens, [int(t) for t in types], merges, special, bool(before), bool(after), notes)


# -- writing ----------------------------------------------------------------------------------------------------

def write_gguf(path: Path, cut: nn.Module, tokenizer, plan: GGUFPlan, tensor_type: str, name: str = "") -> dict:
    """Write the cut model ``cut`` and ``tokenizer`` as one GGUF file at ``path`` (deci, ``tensor_type``).

    Returns {"head_count", "head_count_kv", "null_head_layers", "tensor_types", "notes"}.
    """
    import gguf  # the gguf extra: imported only when a GGUF file is written or read

    config = cut.config
    tensors, heads, kv_heads, null = deci_tensors(cut, plan.family, plan.rope)
    d = adapt(cut).blocks[0].head_size
    n_vocab, hidden = tensors["token_embd.weight"].shape
    vocab = gguf_vocab(tokenizer, n_vocab)
    writer = gguf.GGUFWriter(str(path), ARCH)
    quirk = any(word in name.lower() for word in NAME_QUIRKS)
    writer.add_name("headprune cut" if quirk or not name else name)
    writer.add_block_count(len(heads))
    writer.add_context_length(plan.context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(d)
    writer.add_value_length(d)
    writer.add_rope_dimension_count(d)
    writer.add_rope_freq_base(float(plan.rope.get("rope_theta", 10000.0)))
    if plan.rope["rope_type"] == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(plan.rope["factor"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(n_vocab)
    writer.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                          "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[tensor_type])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    for kind, token_id in vocab.special.items():
        getattr(writer, f"add_{kind}_token_id")(int(token_id))
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    kinds = {}
    for tensor_name, tensor in tensors.items():
        data, kind = encode_tensor(tensor_name, tensor, tensor_type)
        writer.add_tensor(tensor_name, data, raw_dtype=kind)
        kinds[kind.name] = kinds.get(kind.name, 0) + 1
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return {"head_count": heads, "head_count_kv": kv_heads, "null_head_layers": null, "tensor_types": kinds,
            "notes": plan.notes + vocab.notes}


def export_gguf(model: nn.Module, tokenizer, mask: HeadMask, out: str | Path, tensor_type: str = "f32",
                cut: nn.Module | None = None, name: str = "") -> tuple[nn.Module, dict]:
    """Cut ``model`` by ``mask`` (``prune_model``: scales baked, soft gates refused) and write ``out``/model.gguf
    (staged: nothing half-written). Returns (the cut model, :func:`write_gguf`'s report + "file")."""
    plan = gguf_plan({**model.config.to_dict(), "architectures": [type(model).__name__]})   # what it is, not says
    if tensor_type not in GGUF_TYPES:
        raise GGUFExportError(f"GGUF tensor type {tensor_type!r}; accepted: {', '.join(GGUF_TYPES)}.")
    written = prune_model(model, mask) if cut is None else cut
    report = {}

    def write(folder: Path) -> None:
        report.update(write_gguf(folder / GGUF_FILE, written, tokenizer, plan, tensor_type, name))

    write_staged(out, write)
    for note in report["notes"]:
        print(f"note: {note}", file=sys.stderr)
    return written, {"file": str(Path(out) / GGUF_FILE), **report}


@dataclass
class GGUFContents:
    """A GGUF file as gguf's own reader sees it: metadata by key, tensors dequantized to float32 in torch's
    (out, in) layout, and each tensor's stored ggml type name."""

    fields: dict
    tensors: dict[str, np.ndarray]
    types: dict[str, str]


def read_gguf(path: str | Path) -> GGUFContents:
    """Read a GGUF file through gguf's own reader (``GGUFReader``, ``quants.dequantize``): the reference loader
    tests and the benchmark read back with."""
    import gguf  # the gguf extra: imported only when a GGUF file is written or read

    reader = gguf.GGUFReader(str(path))
    fields = {}
    for key, f in reader.fields.items():
        if not f.types:
            continue
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            values = [f.parts[i] for i in f.data]
            fields[key] = ([bytes(v).decode("utf-8") for v in values] if f.types[-1] == gguf.GGUFValueType.STRING
                           else [v.tolist()[0] for v in values])
        elif f.types[0] == gguf.GGUFValueType.STRING:
            fields[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            fields[key] = f.parts[f.data[0]].tolist()[0]
    tensors = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
               .reshape([int(n) for n in reversed(t.shape)]) for t in reader.tensors}
    return GGUFContents(fields, tensors, {t.name: t.tensor_type.name for t in reader.tensors})
