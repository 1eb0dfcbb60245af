"""Tiny randomly-initialised classifiers of every supported architecture (for tests and benchmarks)."""

from __future__ import annotations

import torch

ARCHS = ("bert", "roberta", "xlm-roberta", "albert", "distilbert", "electra")


def tiny_config(arch: str, n_layers: int = 3, n_heads: int = 4, head_size: int = 8, num_labels: int = 3,
                vocab_size: int = 120):
    from transformers import AlbertConfig, BertConfig, DistilBertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig

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
    from transformers import AutoModelForSequenceClassification

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
