"""headprune's half of ``gguf_check.sh``: write GGUF files with ``prune --format gguf``'s code and, beside each, the
logits headprune's own cut model gives on real rows, for llama.cpp (``gguf_check.py``, its own virtualenv) to
compare against. Also writes small byte-level BPE tokenizers of every pre-tokenizer the export maps (GPT-2's,
with add_prefix_space as demo-lm's, SmolLM's digits, Llama 3's split with ignore_merges, Qwen2's split with NFC),
each inside a GGUF file, with headprune's token ids of the same rows.

Cases (``<work>/cases.json``): the demo-lm decoder cut by an uneven mask (an empty layer 0: a null head; a layer of
0 heads; a whole key/value group; uneven groups), the same at f16 and q8_0 (errors reported), the dense export
(empty mask); random decoders with head size 32 cut by another uneven mask: Llama with attention and MLP biases,
an untied head and a padded vocabulary (13 rows beyond the tokenizer), Mistral, Qwen2 (q/k/v biases), Phi-3
(fused projections), Llama 3.1 RoPE scaling and linear RoPE scaling.
Usage: python benchmarks/gguf_check_write.py WORK_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers as tf
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from headprune.data import load_data
from headprune.model.arch import adapt
from headprune.model.gguf_export import export_gguf
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model

ROWS = 6           # real rows per model
MAX_TOKENS = 64    # tokens per row
DEMO_MASK = {"pruned": {"0": list(range(8)), "2": list(range(8)), "3": [4, 5, 6, 7], "4": [0, 1, 5], "5": [2]},
             "scales": {"1": {"3": 0.7}}}
RANDOM_MASK = {"pruned": {"0": list(range(8)), "1": list(range(8)), "2": [4, 5, 6, 7], "3": [1, 2, 4]}}
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")


def bpe_tokenizer(kind: str, texts: list[str], size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE of ``size`` tokens trained on ``texts`` with the pre-tokenizer of ``kind`` (module doc)."""
    model = models.BPE(ignore_merges=kind == "llama-bpe")
    tok = Tokenizer(model)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=kind == "prefix", use_regex=kind in ("gpt-2", "prefix",
                                                                                                  "smollm"))
    if kind == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif kind in ("llama-bpe", "qwen2"):
        regex = LLAMA3_REGEX if kind == "llama-bpe" else QWEN2_REGEX
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(regex), "isolated"), byte_level])
        if kind == "qwen2":
            tok.normalizer = normalizers.NFC()
    else:
        tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=size, special_tokens=["<pad>", "<bos>", "<eos>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                       show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")


def random_decoder(arch: str, vocab: int, **config) -> torch.nn.Module:
    """A seeded random 4-layer decoder: hidden 256, 8 query heads of 32 in 2 key/value groups; norms drawn too."""
    cls = {"llama": tf.LlamaConfig, "mistral": tf.MistralConfig, "qwen2": tf.Qwen2Config, "phi3": tf.Phi3Config}
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cls[arch](
        vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0,
        bos_token_id=1, eos_token_id=2, **config),
        attn_implementation="sdpa").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1:
                p.normal_(0, 0.1)
    return model


def write_case(work: Path, name: str, model, tokenizer, mask: HeadMask, rows: list[list[int]], tensor_type: str,
               cut=None, bound: float | None = 1e-3) -> dict:
    cut, report = export_gguf(model, tokenizer, mask, work / name, tensor_type, cut=cut, name=name)
    logits = []
    with torch.no_grad():
        for ids in rows:
            logits.append(cut(torch.tensor([ids])).logits[0].float().numpy())
    np.savez(work / f"{name}.npz", *logits)
    return {"name": name, "file": report["file"], "tensor_type": tensor_type, "rows": rows, "bound": bound,
            "head_count": report["head_count"], "head_count_kv": report["head_count_kv"],
            "null_head_layers": report["null_head_layers"]}


def main(work: Path) -> None:
    torch.set_num_threads(1)
    texts = load_data("demo-lm").texts
    cases = []
    demo = load_model("demo-lm", "cpu")
    rows = [demo.tokenizer(t)["input_ids"][:MAX_TOKENS] for t in texts[:ROWS]]
    mask = HeadMask.from_json(DEMO_MASK, demo.adapter.grid_shape, demo.adapter.group_grid())
    cut = prune_model(demo.model, mask)
    cases.append(write_case(work, "demo-lm-cut-f32", demo.model, demo.tokenizer, mask, rows, "f32", cut))
    for kind in ("f16", "q8_0"):   # reported, not bounded: llama.cpp also rounds activations for these types
        cases.append(write_case(work, f"demo-lm-cut-{kind}", demo.model, demo.tokenizer, mask, rows, kind, cut,
                                None))
    cases.append(write_case(work, "demo-lm-dense-f32", demo.model, demo.tokenizer,
                            HeadMask.ones(demo.adapter.grid_shape), rows, "f32"))
    tokenizer = bpe_tokenizer("gpt-2", texts[:400])
    random_rows = [tokenizer(t)["input_ids"][:MAX_TOKENS] for t in texts[ROWS:2 * ROWS]]
    variants = {
        "llama-biases-untied-padded": ("llama", {"attention_bias": True, "mlp_bias": True,
                                                 "tie_word_embeddings": False}),
        "mistral": ("mistral", {"sliding_window": None}),
        "qwen2": ("qwen2", {"use_sliding_window": False}),
        "phi3": ("phi3", {}),
        "llama3-rope": ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0,
                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 32}}),
        "linear-rope": ("llama", {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0,
                                                      "factor": 4.0}}),
    }
    for name, (arch, config) in variants.items():
        model = random_decoder(arch, len(tokenizer) + 13, **config)
        mask = HeadMask.from_json(RANDOM_MASK, adapt(model).grid_shape, adapt(model).group_grid())
        cases.append(write_case(work, f"random-{name}", model, tokenizer, mask, random_rows, "f32"))
    probes = texts[:50] + ["In 1999, 12345 people paid $3.50 -- it's 2x better!", "  two  spaces\nand a line",
                           "Don't you'll we've I'm THEY'RE"]
    tokenizer_cases = []
    for kind in ("gpt-2", "prefix", "smollm", "llama-bpe", "qwen2"):
        tok = bpe_tokenizer(kind, texts[:400])
        model = random_decoder("llama", len(tok))
        name = f"tokenizer-{kind}"
        _, report = export_gguf(model, tok, HeadMask.ones(adapt(model).grid_shape), work / name, "q8_0")
        # demo-lm's kind adds a prefix space that llama.cpp does not: its users start a prompt with a space
        tokenizer_cases.append({"name": name, "file": report["file"], "texts": probes,
                                "llama_cpp_texts": [(" " + t if kind == "prefix" and not t.startswith(" ") else t)
                                                    for t in probes],
                                "ids": [tok(t)["input_ids"] for t in probes]})
    demo_case = cases[0]
    tokenizer_cases.append({"name": "tokenizer-demo-lm", "file": demo_case["file"], "texts": probes,
                            "llama_cpp_texts": [t if t.startswith(" ") else " " + t for t in probes],
                            "ids": [demo.tokenizer(t)["input_ids"] for t in probes]})
    (work / "cases.json").write_text(json.dumps({"logits": cases, "tokenizers": tokenizer_cases}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
