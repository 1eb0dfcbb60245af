"""speed.py: FLOPs counted from the shapes a forward sees, checked against hand formulas from the config; the
timing report's arithmetic; rounding kept-head counts."""

from __future__ import annotations

import math

import numpy as np
import pytest

from headprune.evaluation.speed import (
    SpeedError,
    compare_speed,
    count_flops,
    ideal_speedup,
    realised_share,
    round_kept_heads,
    speed_headline,
    speed_table,
    time_forwards,
)
from headprune.model.arch import adapt
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import random_batch, tiny_model

T = 10


def _hand_flops(config, kept_per_layer: list[int], pooled: bool = True) -> dict:
    """BERT layer by hand: Q/K/V 2·T·d·(h·d_h) each, O 2·T·(h·d_h)·d, scores 4·h·T²·d_h, FFN 2·(2·T·d·d_ff)."""
    d, d_h, d_ff = config.hidden_size, config.hidden_size // config.num_attention_heads, config.intermediate_size
    projections = sum(4 * 2 * T * d * h * d_h for h in kept_per_layer)
    scores = sum(4 * h * T * T * d_h for h in kept_per_layer)
    other = len(kept_per_layer) * 2 * 2 * T * d * d_ff
    other += (2 * d * d if pooled else 0) + 2 * d * config.num_labels  # pooler and classifier read token 0 only
    return {"attention_projections": projections, "attention_scores": scores, "other": other}


def test_bert_flops_match_the_hand_count(one_thread):
    model = tiny_model("bert")
    counted = count_flops(model, T)
    expected = _hand_flops(model.config, [4, 4, 4])
    assert (counted.attention_projections, counted.attention_scores, counted.other) == \
        tuple(float(v) for v in expected.values())
    assert counted.total == sum(expected.values())
    assert not any(m._forward_hooks for m in model.modules())  # the caller's model carries no hook afterwards


def test_cut_heads_leave_the_flops_of_the_heads_kept(one_thread):
    model = tiny_model("bert")
    mask = HeadMask.from_pruned({0: [0, 1, 2, 3], 1: [2]}, adapt(model).grid_shape)
    pruned = count_flops(prune_model(model, mask), T)
    expected = _hand_flops(model.config, [0, 3, 4])
    assert (pruned.attention_projections, pruned.attention_scores, pruned.other) == \
        tuple(float(v) for v in expected.values())
    ideal = ideal_speedup(count_flops(model, T), pruned)
    dense_total = sum(_hand_flops(model.config, [4, 4, 4]).values())
    assert ideal["removed_flops_share"] == pytest.approx(1 - sum(expected.values()) / dense_total)
    assert ideal["ideal_speedup"] == pytest.approx(dense_total / sum(expected.values()))


def test_albert_counts_its_shared_block_in_every_layer(one_thread):
    model = tiny_model("albert")
    counted = count_flops(model, T)
    c = model.config
    d_h = c.hidden_size // c.num_attention_heads
    # one block reused by all 3 layers: its Q/K/V/O and scores are paid 3 times
    assert counted.attention_projections == c.num_hidden_layers * 4 * 2 * T * c.hidden_size ** 2
    assert counted.attention_scores == c.num_hidden_layers * 4 * c.num_attention_heads * T * T * d_h
    mask = HeadMask.from_pruned({0: [0]}, adapt(model).grid_shape)
    assert count_flops(prune_model(model, mask), T).attention_scores == counted.attention_scores * 3 / 4


def test_grouped_query_attention_counts_fewer_kv_rows(one_thread):
    """GQA (Llama style, 4 query heads sharing 2 key/value heads): K and V are half as wide as Q."""
    transformers = pytest.importorskip("transformers")
    from headprune.errors import UnsupportedArchitecture

    config = transformers.LlamaConfig(vocab_size=120, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      num_labels=2, pad_token_id=0)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    try:
        adapt(model)
    except UnsupportedArchitecture:
        pytest.skip("this checkout's adapter does not support Llama yet")
    counted = count_flops(model, T)
    d, d_h = 32, 8
    per_layer = 2 * T * d * (4 * d_h) * 2 + 2 * T * d * (2 * d_h) * 2  # Q and O full width, K and V half
    assert counted.attention_projections == 2 * per_layer
    assert counted.attention_scores == 2 * 4 * 4 * T * T * d_h
    # gate/up/down of the MLP on every token, score head on every token (decoders classify from the last one)
    assert counted.other == 2 * 3 * 2 * T * d * 48 + 2 * T * d * 2


def test_realised_share_is_the_saving_over_the_flops_saving():
    assert realised_share(2.0, 1.5, 0.5) == pytest.approx(0.5)
    assert realised_share(2.0, 1.0, 0.5) == pytest.approx(1.0)
    assert realised_share(2.0, 2.0, 0.0) is None


def test_compare_speed_reports_both_models_per_length(one_thread):
    model = tiny_model("bert")
    pruned = prune_model(model, HeadMask.from_pruned({0: [0, 1], 2: [3]}, adapt(model).grid_shape))
    report = compare_speed(model, pruned, lengths=(8, 16), throughput_batch=4, repeats=1, warmup=0,
                           device="cpu", threads=1)
    assert report["device"] == "cpu" and report["torch_threads"] == 1 and set(report["lengths"]) == {"8", "16"}
    for length, entry in report["lengths"].items():
        flops = ideal_speedup(count_flops(model, int(length)), count_flops(pruned, int(length)))
        assert entry["ideal_speedup"] == pytest.approx(flops["ideal_speedup"])
        assert entry["latency_speedup"] == pytest.approx(entry["latency_ms_dense"] / entry["latency_ms_pruned"])
        assert entry["throughput_speedup"] == pytest.approx(entry["throughput_pruned"] / entry["throughput_dense"])
        saving = 1 - entry["throughput_dense"] / entry["throughput_pruned"]
        assert entry["throughput_realised_share"] == pytest.approx(saving / entry["removed_flops_share"])
    rows = speed_table(report)
    assert [r["length"] for r in rows] == [8, 16] and all(math.isfinite(v) for r in rows for v in r.values())
    headline = speed_headline(report)
    assert headline["length"] == 16
    assert headline["ideal_speedup"] == round(report["lengths"]["16"]["ideal_speedup"], 2)


def test_time_forwards_rejects_no_repeats():
    with pytest.raises(SpeedError, match="repeats"):
        time_forwards([tiny_model("bert")], random_batch(), repeats=0)


def test_round_kept_heads_restores_the_best_pruned_heads():
    shape = (3, 4)
    mask = HeadMask.from_pruned({0: [0, 1, 2], 1: [1], 2: [0, 1, 2, 3]}, shape)
    scores = np.arange(12, dtype=float).reshape(shape)
    scores[0, 2] = 100.0  # the best pruned head of block 0
    rounded, report = round_kept_heads(mask, 2, scores)
    assert rounded.keep_bool().sum(1).tolist() == [2, 4, 0]  # 1 -> 2, 3 -> 4, an empty block stays empty
    assert report["restored"] == {0: [2], 1: [1]} and report["heads_restored"] == 2
    assert rounded.pruned() == {0: [0, 1], 2: [0, 1, 2, 3]}
    by_id, _ = round_kept_heads(mask, 2)  # no scores: the lowest ids come back
    assert by_id.pruned() == {0: [1, 2], 2: [0, 1, 2, 3]}
    with pytest.raises(SpeedError, match="positive"):
        round_kept_heads(mask, 0)


def test_prune_benchmark_adds_measured_and_ideal_speedup(tiny_model_dir, tmp_path, capsys, one_thread):
    import json

    from headprune.cli import main

    mask_file = tmp_path / "mask.json"
    mask_file.write_text(json.dumps({"pruned": {"0": [1, 3], "2": [0]}}))
    def argv(out: str) -> list[str]:  # prune wants a new or empty folder each time
        return ["prune", "--model", str(tiny_model_dir), "--mask", str(mask_file), "--out", str(tmp_path / out)]

    assert main(argv("a") + ["--benchmark", "--benchmark-repeats", "1", "--benchmark-threads", "1"]) == 0
    report = json.loads(capsys.readouterr().out)["speed"]
    assert report["torch_threads"] == 1 and report["repeats"] == 1
    assert set(report["lengths"]) == {"64"}  # the tiny model has 64 positions: 256 is skipped and said so
    assert report["skipped_lengths"] == {"256": "longer than the model's 64 positions"}
    entry = report["lengths"]["64"]
    assert entry["ideal_speedup"] > 1 and entry["latency_ms_pruned"] > 0 and entry["throughput_pruned"] > 0
    assert main(argv("b")) == 0 and "speed" not in json.loads(capsys.readouterr().out)  # opt-in
    assert main(argv("c") + ["--benchmark", "--benchmark-repeats", "0"]) == 2
    assert "repeats must be in [1, 1000]" in capsys.readouterr().err


def test_head_count_timings_cover_every_count(one_thread):
    from headprune.evaluation.speed import head_count_timings

    timings = head_count_timings(16, 4, 3, seq_len=4, batch_size=2, repeats=1, warmup=0, clock="cpu")
    assert list(timings) == [1, 2, 3] and all(t >= 0 for t in timings.values())
    with pytest.raises(SpeedError, match="accepted: wall, cpu"):
        head_count_timings(16, 4, 3, seq_len=4, clock="sundial")


def test_fused_qkv_is_counted_once_per_call(one_thread):
    """GPT-2: one Conv1D ``c_attn`` (d -> 3d) makes Q|K|V; its MLP and O are Conv1D too (weights in x out)."""
    transformers = pytest.importorskip("transformers")
    from headprune.errors import UnsupportedArchitecture

    config = transformers.GPT2Config(vocab_size=120, n_embd=32, n_layer=2, n_head=4, n_positions=64, num_labels=2,
                                     pad_token_id=0, bos_token_id=0, eos_token_id=0)
    model = transformers.AutoModelForSequenceClassification.from_config(config).eval()
    try:
        assert adapt(model).blocks[0].query is adapt(model).blocks[0].key
    except UnsupportedArchitecture:
        pytest.skip("this checkout's adapter does not support GPT-2 yet")
    counted = count_flops(model, T)
    d, d_h = 32, 8
    assert counted.attention_projections == 2 * (2 * T * d * 3 * d + 2 * T * d * d)
    assert counted.attention_scores == 2 * 4 * 4 * T * T * d_h
    assert counted.other == 2 * (2 * 2 * T * d * 4 * d) + 2 * T * d * 2  # MLP d -> 4d -> d; score head per token
    mask = HeadMask.from_pruned({0: [0, 1]}, adapt(model).grid_shape)
    assert count_flops(prune_model(model, mask), T).attention_projections == \
        counted.attention_projections - (2 * T * d * 3 * 2 * d_h + 2 * T * 2 * d_h * d)
