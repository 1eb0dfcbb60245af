"""Tiny randomly-initialised classifiers of every supported architecture (for tests and benchmarks)."""

from __future__ import annotations

import json
import textwrap
from functools import partial
from pathlib import Path

import torch
import transformers as tf
from tokenizers import processors
from tokenizers.implementations import ByteLevelBPETokenizer, SentencePieceUnigramTokenizer
from transformers import (
    AlbertConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    BertConfig,
    DebertaV2Config,
    DistilBertConfig,
    ElectraConfig,
    ModernBertConfig,
    PreTrainedTokenizerFast,
    RobertaConfig,
    XLMRobertaConfig,
)

ARCHS = ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra")


def tiny_config(arch: str, n_layers: int = 3, n_heads: int = 4, head_size: int = 8, num_labels: int = 3,
                vocab_size: int = 120):
    hidden = n_heads * head_size
    common = dict(vocab_size=vocab_size, num_labels=num_labels, max_position_embeddings=64)
    if arch == "distilbert":
        return DistilBertConfig(n_layers=n_layers, n_heads=n_heads, dim=hidden, hidden_dim=2 * hidden,
                                dropout=0.0, attention_dropout=0.0, **common)
    kw = dict(num_hidden_layers=n_layers, num_attention_heads=n_heads, hidden_size=hidden,
              intermediate_size=2 * hidden, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common)
    if arch == "bert":
        return BertConfig(**kw)
    if arch == "roberta":
        return RobertaConfig(pad_token_id=1, **kw)
    if arch == "xlm-roberta":
        return XLMRobertaConfig(pad_token_id=1, **kw)
    if arch == "albert":
        return AlbertConfig(embedding_size=16, classifier_dropout_prob=0.0, **kw)
    if arch == "electra":
        return ElectraConfig(embedding_size=16, **kw)
    raise ValueError(f"unknown arch {arch}; known: {ARCHS}")


def tiny_model(arch: str, seed: int = 0, attn_implementation: str = "sdpa", **kw):

    torch.manual_seed(seed)
    config = tiny_config(arch, **kw)
    model = AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation)
    return model.eval()


def random_batch(batch_size: int = 4, seq_len: int = 12, vocab_size: int = 120, num_labels: int = 3,
                 seed: int = 0) -> dict:
    """Token ids with ragged padding at the end of each row (at least 3 real tokens each)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch_size, seq_len), generator=g)
    lengths = torch.randint(3, seq_len + 1, (batch_size,), generator=g)
    lengths[0] = seq_len
    attention = (torch.arange(seq_len)[None, :] < lengths[:, None]).long()
    ids = ids * attention + (1 - attention) * 1
    labels = torch.randint(0, num_labels, (batch_size,), generator=g)
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


# -- decoders ----------------------------------------------------------------------------------------------------

DECODER_ARCHS = ("llama", "qwen2", "qwen3", "mistral", "gemma3", "phi3", "gpt2")


def tiny_decoder_config(arch: str, n_layers: int = 4, n_heads: int = 8, n_kv_heads: int = 2, head_dim: int = 8,
                        vocab_size: int = 120, num_labels: int = 3, max_positions: int = 64):
    """A tiny random decoder config of ``arch``; GQA with ``n_kv_heads`` key/value heads (GPT-2: none).

    Qwen2 and Gemma 3 get sliding-window layers (window 4) so that a layer's attention kind really depends on its
    position in the layer list (Gemma 3 also has head_dim != hidden / heads).
    """
    hidden = n_heads * head_dim
    common = dict(vocab_size=vocab_size, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                  hidden_size=hidden, intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                  num_labels=num_labels, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    gqa = dict(num_key_value_heads=n_kv_heads)
    if arch == "llama":
        return tf.LlamaConfig(**common, **gqa)
    if arch == "mistral":
        return tf.MistralConfig(**common, **gqa, sliding_window=None)
    if arch == "qwen2":
        return tf.Qwen2Config(**common, **gqa, use_sliding_window=True, sliding_window=4,
                              max_window_layers=n_layers // 2)
    if arch == "qwen3":
        return tf.Qwen3Config(**common, **gqa, head_dim=head_dim)
    if arch == "gemma3":
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
        return tf.Gemma3TextConfig(**{**common, "hidden_size": hidden + 16}, **gqa, head_dim=head_dim,
                                   sliding_window=4, layer_types=kinds, query_pre_attn_scalar=head_dim)
    if arch == "phi3":
        return tf.Phi3Config(**common, **gqa, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
    if arch == "gpt2":
        return tf.GPT2Config(vocab_size=vocab_size, n_layer=n_layers, n_head=n_heads, n_embd=hidden,
                             n_positions=max_positions, num_labels=num_labels, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    raise ValueError(f"unknown decoder arch {arch}; known: {DECODER_ARCHS}")


def tiny_decoder(arch: str, head: str = "lm", seed: int = 0, attn_implementation: str = "sdpa", **kw):
    """A tiny random decoder: ``head="lm"`` (causal LM) or ``"cls"`` (sequence classifier), in eval mode."""

    torch.manual_seed(seed)
    config = tiny_decoder_config(arch, **kw)
    auto = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    return auto.from_config(config, attn_implementation=attn_implementation).eval()


def random_decoder_batch(batch_size: int = 4, seq_len: int = 12, vocab_size: int = 120, seed: int = 0) -> dict:
    """Like ``random_batch`` with right padding by pad id 0 and token ids >= 3 (0-2 are pad/BOS/EOS)."""
    batch = random_batch(batch_size, seq_len, vocab_size, seed=seed)
    batch["input_ids"] = batch["input_ids"] * batch["attention_mask"]
    batch.pop("labels")
    return batch


# -- modern encoders ---------------------------------------------------------------------------------------------

MODERN_ARCHS = ("deberta-v2", "deberta-v2-unshared", "modernbert")


def tiny_modern_config(arch: str, n_layers: int = 3, n_heads: int = 4, head_size: int = 8, num_labels: int = 3,
                       vocab_size: int = 120):
    """A tiny random DeBERTa-v2/v3 or ModernBERT classifier config.

    Weights are drawn with ``initializer_range=0.3`` (default 0.02) so that a single head visibly moves the
    logits. DeBERTa sets ``relative_attention=True`` and ``pos_att_type=["p2c", "c2p"]`` (the config defaults
    skip the disentangled path) with ``position_buckets`` and a convolution after layer 0
    (``conv_kernel_size``), as v3 checkpoints do; "deberta-v2" shares the position projections with Q/K
    (``share_att_key``, v3's default), "deberta-v2-unshared" has its own ``pos_query_proj``/``pos_key_proj``.
    ModernBERT alternates global and local layers with a local window (4 tokens) shorter than the test
    sequences, so the two kinds differ.
    """
    hidden = n_heads * head_size
    common = dict(vocab_size=vocab_size, num_labels=num_labels, num_hidden_layers=n_layers,
                  num_attention_heads=n_heads, hidden_size=hidden, intermediate_size=2 * hidden,
                  max_position_embeddings=64, pad_token_id=1, initializer_range=0.3)
    if arch.startswith("deberta-v2"):
        return DebertaV2Config(**common, relative_attention=True, pos_att_type=["p2c", "c2p"],
                               share_att_key=arch == "deberta-v2", position_buckets=8, max_relative_positions=16,
                               norm_rel_ebd="layer_norm", conv_kernel_size=3, type_vocab_size=0,
                               position_biased_input=False, hidden_dropout_prob=0.0,
                               attention_probs_dropout_prob=0.0, pooler_dropout=0.0)
    if arch == "modernbert":
        return ModernBertConfig(**common, global_attn_every_n_layers=2, local_attention=4, attention_dropout=0.0,
                                mlp_dropout=0.0, embedding_dropout=0.0, classifier_dropout=0.0, bos_token_id=2,
                                eos_token_id=3, cls_token_id=2, sep_token_id=3)
    raise ValueError(f"unknown modern encoder {arch}; known: {MODERN_ARCHS}")


def tiny_modern(arch: str, seed: int = 0, attn_implementation: str = "eager", **kw):
    """A tiny random ``tiny_modern_config`` classifier in eval mode (DeBERTa supports eager attention only)."""

    torch.manual_seed(seed)
    config = tiny_modern_config(arch, **kw)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=attn_implementation).eval()


def offline_tokenizer(kind: str, corpus: list[str], vocab_size: int | None = None):
    """A fast tokenizer trained offline on ``corpus`` (no pretrained tokenizer can be downloaded in tests).

    ``kind``: "unigram" -- SentencePiece-style Unigram with "▁" word starts, as DeBERTa-v3 ships (``<s> A </s>``,
    pad "<pad>", unk "<unk>"); "byte-level-bpe" -- byte-level BPE with "Ġ" word starts, as ModernBERT and RoBERTa
    ship (the 256 byte symbols are always in the vocabulary, so it has at least 259 entries).
    """
    if kind == "unigram":
        trained = SentencePieceUnigramTokenizer()
        trained.train_from_iterator(corpus, vocab_size=vocab_size or 70, unk_token="<unk>",
                                    special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
        trained._tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", trained.token_to_id("<s>")), ("</s>", trained.token_to_id("</s>"))])
        return PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer, bos_token="<s>", eos_token="</s>",
                                       pad_token="<pad>", unk_token="<unk>")
    if kind == "byte-level-bpe":
        trained = ByteLevelBPETokenizer()
        trained.train_from_iterator(corpus, vocab_size=vocab_size or 300, min_frequency=1,
                                    special_tokens=["<s>", "<pad>", "</s>"])
        trained._tokenizer.post_processor = processors.RobertaProcessing(
            ("</s>", trained.token_to_id("</s>")), ("<s>", trained.token_to_id("<s>")))
        return PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer, bos_token="<s>", eos_token="</s>",
                                       pad_token="<pad>")
    raise ValueError(f"unknown tokenizer kind {kind}; known: unigram, byte-level-bpe")


def save_tiny_modern(arch: str, out_dir, corpus: list[str], id2label: dict[int, str] | None = None):
    """Save a tiny ``arch`` classifier with an offline tokenizer of its family's kind (DeBERTa: SentencePiece
    Unigram, ModernBERT: byte-level BPE) trained on ``corpus``, like a user's model folder. Returns the path."""

    id2label = id2label or {0: "neg", 1: "pos"}
    tokenizer = offline_tokenizer("byte-level-bpe" if arch == "modernbert" else "unigram", corpus)
    model = tiny_modern(arch, num_labels=len(id2label), vocab_size=max(len(tokenizer), 120))
    model.config.id2label = dict(id2label)
    model.config.label2id = {v: k for k, v in id2label.items()}
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def write_choice_task(folder, name: str, questions) -> Path:
    """A local lm-eval multiple-choice task ``name`` in ``folder``: its rows as JSONL (``questions``: (context,
    choices, answer index) triples) and a YAML reading them by absolute path (offline, from any directory)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rows = folder / f"{name}.jsonl"
    rows.write_text("".join(json.dumps({"context": c, "choices": ch, "answer": a}) + "\n" for c, ch, a in questions),
                    encoding="utf-8")
    (folder / f"{name}.yaml").write_text(textwrap.dedent(f"""\
        task: {name}
        dataset_path: json
        dataset_kwargs:
          data_files:
            test: {rows}
        test_split: test
        output_type: multiple_choice
        doc_to_text: context
        doc_to_choice: choices
        doc_to_target: answer
        metric_list:
          - metric: acc
            aggregation: mean
            higher_is_better: true
          - metric: acc_norm
            aggregation: mean
            higher_is_better: true
        metadata:
          version: 2.0
        """), encoding="utf-8")
    return folder


# -- fused Q/K/V and ALiBi families (issue 47): GPT-NeoX, BLOOM, Falcon, MPT, DeBERTa v1 ------------------------------

FUSED_DECODERS = ("gpt-neox", "bloom", "falcon", "falcon-mq", "falcon-alibi", "falcon-new-alibi", "mpt")
FUSED_ARCHS = FUSED_DECODERS + ("deberta",)


def tiny_fused_config(arch: str, n_layers: int = 3, n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 8,
                      vocab_size: int = 120, num_labels: int = 3, max_positions: int = 64):
    """A tiny random config of a fused-Q/K/V family, dropout off, ``initializer_range`` 0.2 so a head visibly moves
    the output:

    gpt-neox          Pythia's shape in small: partial rotary (a quarter of each head), parallel residual, biases
    bloom             ALiBi, head-interleaved query_key_value
    falcon            new decoder architecture: ``n_kv_heads`` groups [q_1..q_g, k, v], rotary, parallel attention
    falcon-mq         old architecture, multi-query (Falcon-7B): Q heads then one K and one V head, rotary
    falcon-alibi      old architecture, multi-head, ALiBi, attention then MLP in sequence (Falcon-RW)
    falcon-new-alibi  new architecture with ALiBi: grouped heads each keep their slope
    mpt               ALiBi, fused Wqkv, ``clip_qkv`` 0.5 (clamps part of the projections at this scale)
    deberta           DeBERTa v1: relative attention with c2p and p2c (its own position projections)
    """
    hidden = n_heads * head_dim
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common = dict(vocab_size=vocab_size, num_labels=num_labels, initializer_range=0.2, **ids)
    if arch == "gpt-neox":
        return tf.GPTNeoXConfig(**common, hidden_size=hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                                intermediate_size=2 * hidden, max_position_embeddings=max_positions,
                                attention_dropout=0.0, hidden_dropout=0.0, use_parallel_residual=True,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.25})
    if arch == "bloom":
        return tf.BloomConfig(**common, hidden_size=hidden, n_layer=n_layers, n_head=n_heads, hidden_dropout=0.0,
                              attention_dropout=0.0)
    if arch.startswith("falcon"):
        new = arch in ("falcon", "falcon-new-alibi")
        return tf.FalconConfig(**common, hidden_size=hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                               num_kv_heads=n_kv_heads if new else n_heads, new_decoder_architecture=new,
                               multi_query=arch == "falcon-mq", alibi=arch.endswith("alibi"),
                               parallel_attn=arch != "falcon-alibi", bias=arch != "falcon-mq",
                               ffn_hidden_size=2 * hidden, max_position_embeddings=max_positions,
                               hidden_dropout=0.0, attention_dropout=0.0)
    if arch == "mpt":
        return tf.MptConfig(**common, d_model=hidden, n_heads=n_heads, n_layers=n_layers, expansion_ratio=2,
                            max_seq_len=max_positions, attn_config={"clip_qkv": 0.5, "attn_pdrop": 0},
                            resid_pdrop=0.0, emb_pdrop=0.0)
    if arch == "deberta":
        return tf.DebertaConfig(**{**common, "pad_token_id": 1}, hidden_size=hidden, num_hidden_layers=n_layers,
                                num_attention_heads=n_heads, intermediate_size=2 * hidden,
                                max_position_embeddings=max_positions, relative_attention=True,
                                pos_att_type=["c2p", "p2c"], max_relative_positions=16, type_vocab_size=0,
                                position_biased_input=False, hidden_dropout_prob=0.0,
                                attention_probs_dropout_prob=0.0, pooler_dropout=0.0)
    raise ValueError(f"unknown fused arch {arch}; known: {FUSED_ARCHS}")


def tiny_fused(arch: str, head: str | None = None, seed: int = 0, attn_implementation: str = "eager", **kw):
    """A tiny random ``tiny_fused_config`` model in eval mode: decoders as causal LMs (``head="lm"``, default) or
    sequence classifiers (``"cls"``), DeBERTa as a sequence classifier."""
    torch.manual_seed(seed)
    config = tiny_fused_config(arch, **kw)
    head = head or ("lm" if arch in FUSED_DECODERS else "cls")
    auto = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    return auto.from_config(config, attn_implementation=attn_implementation).eval()


# -- issue 47 families: GPT-J, GPT-Neo, OPT, Phi, OLMo, OLMo 2, gpt-oss (decoders); MPNet, Longformer, XLM,
# -- Nystromformer (encoders) ------------------------------------------------------------------------------------

MORE_DECODERS = ("gptj", "gpt-neo", "opt", "phi", "olmo", "olmo2", "gpt-oss")
MORE_ENCODERS = ("mpnet", "longformer", "xlm", "nystromformer")


def tiny_more_config(arch: str, n_layers: int = 3, n_heads: int = 4, n_kv_heads: int | None = None,
                     head_dim: int = 8, vocab_size: int = 120, num_labels: int = 3, max_positions: int = 64):
    """A tiny random config of an issue-47 family, with what makes the family itself on (dropout off):

    GPT-J and Phi partial rotary (half the head), GPT-Neo alternating global/local layers (window 4), OPT
    biases and a pre-norm, Phi biases, a parallel block and per-head q/k LayerNorms, OLMo ``clip_qkv``, OLMo 2
    and gpt-oss grouped-query attention (``n_kv_heads``, default half the heads), gpt-oss sliding and full
    layers (window 4) and a mixture of 4 experts (2 per token), Longformer a local window of 4 tokens, XLM
    per-layer module lists, Nystromformer its exact softmax path (``num_landmarks == segment_means_seq_len``)
    with the per-head convolution over values. ``initializer_range`` 0.2 so one head visibly moves the output.
    """
    hidden = n_heads * head_dim
    n_kv = n_kv_heads or max(1, n_heads // 2)
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
    common = dict(vocab_size=vocab_size, num_labels=num_labels, **ids)
    llama_like = dict(common, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=n_layers,
                      num_attention_heads=n_heads, max_position_embeddings=max_positions, initializer_range=0.2)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if arch == "gptj":
        return tf.GPTJConfig(**common, n_positions=max_positions, n_embd=hidden, n_layer=n_layers, n_head=n_heads,
                             rotary_dim=head_dim // 2, n_inner=2 * hidden, resid_pdrop=0.0, embd_pdrop=0.0,
                             attn_pdrop=0.0, initializer_range=0.2)
    if arch == "gpt-neo":
        return tf.GPTNeoConfig(**common, max_position_embeddings=max_positions, hidden_size=hidden,
                               num_layers=n_layers,
                               attention_types=[[["global", "local"][i % 2:i % 2 + 1], 1] for i in range(n_layers)],
                               num_heads=n_heads, intermediate_size=2 * hidden, window_size=4, resid_dropout=0.0,
                               embed_dropout=0.0, attention_dropout=0.0, classifier_dropout=0.0,
                               initializer_range=0.2)
    if arch == "opt":
        return tf.OPTConfig(**common, hidden_size=hidden, num_hidden_layers=n_layers, ffn_dim=2 * hidden,
                            max_position_embeddings=max_positions, word_embed_proj_dim=hidden,
                            num_attention_heads=n_heads, dropout=0.0, attention_dropout=0.0, init_std=0.2)
    if arch == "phi":
        return tf.PhiConfig(**llama_like, num_key_value_heads=n_heads, resid_pdrop=0.0, embd_pdrop=0.0,
                            attention_dropout=0.0, qk_layernorm=True,
                            rope_parameters={**rope, "partial_rotary_factor": 0.5})
    if arch == "olmo":
        return tf.OlmoConfig(**llama_like, num_key_value_heads=n_kv, clip_qkv=0.5)
    if arch == "olmo2":
        return tf.Olmo2Config(**llama_like, num_key_value_heads=n_kv)
    if arch == "gpt-oss":
        kinds = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n_layers)]
        return tf.GptOssConfig(**llama_like, num_key_value_heads=n_kv, head_dim=head_dim, sliding_window=4,
                               layer_types=kinds, num_local_experts=4, num_experts_per_tok=2, attention_dropout=0.0,
                               rope_parameters=rope)
    encoder = dict(common, hidden_size=hidden, num_hidden_layers=n_layers, num_attention_heads=n_heads,
                   intermediate_size=2 * hidden, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                   max_position_embeddings=max_positions, initializer_range=0.2)
    if arch == "mpnet":
        return tf.MPNetConfig(**{**encoder, "pad_token_id": 1})
    if arch == "longformer":
        return tf.LongformerConfig(**{**encoder, "pad_token_id": 1}, attention_window=4, type_vocab_size=1,
                                   sep_token_id=2)
    if arch == "xlm":
        return tf.XLMConfig(**{k: v for k, v in common.items() if k != "pad_token_id"}, pad_token_id=2,
                            emb_dim=hidden, n_layers=n_layers, n_heads=n_heads, dropout=0.0, attention_dropout=0.0,
                            max_position_embeddings=max_positions, n_langs=1, init_std=0.2, embed_init_std=0.2)
    if arch == "nystromformer":
        return tf.NystromformerConfig(**encoder, segment_means_seq_len=max_positions, num_landmarks=max_positions,
                                      conv_kernel_size=3)
    raise ValueError(f"unknown arch {arch}; known: {MORE_DECODERS + MORE_ENCODERS}")


def tiny_more(arch: str, head: str | None = None, seed: int = 0, attn_implementation: str = "eager", **kw):
    """A tiny random ``tiny_more_config`` model in eval mode: decoders as causal LMs (``head="lm"``, default) or
    sequence classifiers (``"cls"``), encoders as sequence classifiers."""
    torch.manual_seed(seed)
    config = tiny_more_config(arch, **kw)
    head = head or ("lm" if arch in MORE_DECODERS else "cls")
    auto = AutoModelForCausalLM if head == "lm" else AutoModelForSequenceClassification
    return auto.from_config(config, attn_implementation=attn_implementation).eval()


def left_padded(batch: dict, pad_id: int = 0) -> dict:
    """``batch`` with each row's padding moved to its start (left padding, as decoders are batched to generate)."""
    mask = batch["attention_mask"]
    order = torch.argsort(mask, dim=1, stable=True)   # pads (0) first, real tokens in their order after them
    out = dict(batch)
    out["attention_mask"] = mask.gather(1, order)
    out["input_ids"] = torch.where(out["attention_mask"].bool(), batch["input_ids"].gather(1, order), pad_id)
    return out


# One tiny random model per family of the registry (``headprune.model.arch.FAMILIES``), built by
# ``TINY_FAMILIES[name](vocab_size=...)``: the support table's tests (tests/test_support_table.py) run every path
# on it. A new family adds its line here; nothing else in the table's code changes.
TINY_FAMILIES = {
    **{name: partial(tiny_decoder, name) for name in ("llama", "phi3", "gpt2")},
    **{name: partial(tiny_model, name) for name in ("albert", "bert", "distilbert")},
    **{name: partial(tiny_modern, name) for name in ("deberta-v2", "modernbert")},
    **{name: partial(tiny_more, name) for name in MORE_DECODERS + MORE_ENCODERS if name != "olmo"},  # OLMo: llama
    # the fused Q/K/V families; Falcon by its new (grouped) architecture, its other layouts in test_fused_families
    **{name: partial(tiny_fused, name) for name in ("gpt-neox", "bloom", "falcon", "mpt", "deberta")},
}
