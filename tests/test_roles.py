"""Head roles: hand-built attention gives each role its exact score; real models agree with an eager reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headprune.data import model_inputs
from headprune.evaluation.live import LiveEvaluator
from headprune.evaluation.metrics import evaluate
from headprune.model.arch import adapt
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.roles import (
    NO_ROLE,
    ROLE_NAMES,
    Probes,
    RoleError,
    RoleReport,
    RoleSpec,
    RoleStats,
    build_report,
    head_roles,
    kept_by_role,
    make_probes,
    role_ablation,
)
from headprune.roles.report import calibration_stats, probe_stats
from headprune.scoring import ScoreMap
from headprune.testing import random_batch, random_decoder_batch, tiny_decoder, tiny_model

T = 64          # calibration rows
N = 20          # probe block
TP = 1 + 2 * N  # probe rows: [BOS] + r + r


def one_hot_rows(targets: list[int], t: int) -> torch.Tensor:
    a = torch.zeros(t, t)
    a[torch.arange(t), torch.tensor(targets)] = 1.0
    return a


def scattered(t: int) -> list[int]:
    """Row i looks at key (i + t/2) mod t: offset ±t/2 (beyond the positional window), key 0 only from row t/2."""
    return [(i + t // 2) % t for i in range(t)]


def second_block(rule) -> list[int]:
    """Probe rows: the first block scattered, the second block at rule(i)."""
    base = scattered(TP)
    return [rule(i) if i >= 1 + N else base[i] for i in range(TP)]


# each synthetic head: (calibration attention (T, T), probe attention (TP, TP))
HEADS = {
    "previous-token": (one_hot_rows([scattered(T)[0]] + [i - 1 for i in range(1, T)], T), one_hot_rows(
        [scattered(TP)[0]] + [i - 1 for i in range(1, TP)], TP)),
    "duplicate-token": (one_hot_rows(scattered(T), T), one_hot_rows(second_block(lambda i: i - N), TP)),
    "induction": (one_hot_rows(scattered(T), T), one_hot_rows(second_block(lambda i: i - N + 1), TP)),
    "sink": (one_hot_rows([0] * T, T), one_hot_rows([0] * TP, TP)),
    "positional": (one_hot_rows([i + 2 if i + 2 < T else scattered(T)[i] for i in range(T)], T),
                   one_hot_rows([i + 2 if i + 2 < TP else scattered(TP)[i] for i in range(TP)], TP)),
    "broad": (torch.full((T, T), 1.0 / T), torch.full((TP, TP), 1.0 / TP)),
}
# exact hand values of each head's own role (positional: the last two rows cannot look two ahead)
OWN = {"previous-token": 1.0, "duplicate-token": 1.0, "induction": 1.0, "sink": 1.0, "positional": (T - 2) / T,
       "broad": 1.0}


def synthetic_report(causal: bool = False) -> RoleReport:
    """One layer of six heads built from HEADS, scored through the same accumulation head_roles uses."""
    names = list(HEADS)
    calib = torch.stack([HEADS[n][0] for n in names])[None]     # (1, H, T, T)
    probe = torch.stack([HEADS[n][1] for n in names])[None]     # (1, H, TP, TP)
    stats = RoleStats(1, len(names), [0])
    sinks = torch.zeros(1, T, dtype=torch.bool)
    sinks[0, 0] = True
    calibration_stats(stats, 0, calib, torch.ones(1, T, dtype=torch.bool), sinks, causal)
    probes = Probes(torch.zeros(1, TP, dtype=torch.long), 1, N)
    probe_stats(stats, 0, probe, probes)
    spec = RoleSpec(parser=None)
    return build_report(stats, None, spec, spec.resolved(), probes)


def test_perfect_heads_score_one_on_their_role_and_at_most_five_points_elsewhere():
    report = synthetic_report()
    for head, role in enumerate(HEADS):
        for other in ROLE_NAMES:
            value = report.scores[other].scores[0, head]
            if other == "syntactic":
                assert np.isnan(value)          # no parser, no texts: no syntactic score
            elif other == role:
                assert value == pytest.approx(OWN[role], abs=1e-6), (role, other)
            else:
                assert value <= 0.05, (role, other, value)
        assert report.labels[0, head] == (role,)
    assert report.positional_offset[0, list(HEADS).index("positional")] == 2


def test_hand_values_of_the_leftovers():
    """The small values are what the formulas give by hand, not just small."""
    report = synthetic_report()
    sink_head = list(HEADS).index("sink")
    # the sink head's row 1 attends key 0 = i − 1: one of the T − 1 previous-token rows
    assert report.scores["previous-token"].scores[0, sink_head] == pytest.approx(1 / (T - 1))
    # uniform attention: H(row)/log T = 1 on every row; on the probe each stripe gets 1/TP
    uniform = list(HEADS).index("broad")
    assert report.scores["induction"].scores[0, uniform] == pytest.approx(1 / TP)
    assert report.scores["sink"].scores[0, uniform] == pytest.approx(1 / T)


def test_causal_uniform_head_is_broad():
    """A causal head spreading evenly over the i + 1 keys it may see scores 1 (each row over its own log k_i)."""
    t = 16
    causal = torch.tril(torch.ones(t, t))
    probs = (causal / causal.sum(-1, keepdim=True))[None, None]
    stats = RoleStats(1, 1, [0])
    calibration_stats(stats, 0, probs, torch.ones(1, t, dtype=torch.bool), torch.zeros(1, t, dtype=torch.bool), True)
    assert stats.mean("broad")[0, 0] == pytest.approx(1.0)


def test_padding_rows_and_keys_do_not_count():
    """Rows past the attention mask are left out of every mean: padding a batch does not move a score."""
    names = list(HEADS)
    calib = torch.stack([HEADS[n][0] for n in names])[None]
    padded = torch.zeros(1, len(names), T + 5, T + 5)
    padded[..., :T, :T] = calib
    valid = torch.zeros(1, T + 5, dtype=torch.bool)
    valid[0, :T] = True
    a, b = RoleStats(1, len(names), [0]), RoleStats(1, len(names), [0])
    sinks = torch.zeros(1, T, dtype=torch.bool)
    sinks[0, 0] = True
    calibration_stats(a, 0, calib, torch.ones(1, T, dtype=torch.bool), sinks, False)
    calibration_stats(b, 0, padded, valid, torch.nn.functional.pad(sinks, (0, 5)), False)
    for name in ("previous", "sink", "broad"):
        np.testing.assert_allclose(a.mean(name), b.mean(name))
    np.testing.assert_allclose(a.offset_shares(), b.offset_shares())


def eager_reference(model, batch) -> list[torch.Tensor]:
    """Attention probabilities from the stock eager forward (output_attentions), independent of headprune."""
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(**model_inputs(batch), output_attentions=True)
    model.set_attn_implementation("sdpa")
    return [a.float() for a in out.attentions]


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_real_model_scores_match_an_eager_reference(one_thread, family):
    model = tiny_decoder(family) if family == "llama" else tiny_model(family)
    causal = adapt(model).causal
    batch = random_decoder_batch(batch_size=3, seq_len=10) if causal else random_batch(batch_size=3, seq_len=10)
    batch["attention_mask"][0, 7:] = 0
    spec = RoleSpec(parser=None, probe_length=6, probe_rows=2, seed=3)
    report = head_roles(model, None, [batch], spec)

    valid = batch["attention_mask"].bool()
    probes = make_probes(model, None, 6, 2, 3, causal)
    calib_attn = eager_reference(model, batch)
    probe_attn = eager_reference(model, probes.batch)
    for layer in range(len(calib_attn)):
        a = calib_attn[layer] * valid[:, None, :, None]
        rows = valid[:, 1:] & valid[:, :-1]
        prev = (a.diagonal(-1, -2, -1) * rows[:, None]).sum((0, 2)) / rows.sum()
        sink = (a[..., 0] * valid[:, None]).sum((0, 2)) / valid.sum()
        p = probe_attn[layer]
        second = range(probes.start + probes.n, probes.start + 2 * probes.n)
        induction = torch.stack([p[:, :, i, i - probes.n + 1] for i in second], -1).mean((0, 2))
        duplicate = torch.stack([p[:, :, i, i - probes.n] for i in second], -1).mean((0, 2))
        for role, expected in (("previous-token", prev), ("induction", induction), ("duplicate-token", duplicate)):
            np.testing.assert_allclose(report.scores[role].scores[layer], expected.numpy(), atol=1e-5)
        if causal:   # decoders: the sink is the first position only
            np.testing.assert_allclose(report.scores["sink"].scores[layer], sink.numpy(), atol=1e-5)


def test_grouped_query_heads_are_scored_one_by_one(one_thread):
    """Query heads sharing one K/V group still attend differently (their own Q), and get their own scores."""
    model = tiny_decoder("llama")   # 8 query heads, 2 K/V heads
    report = head_roles(model, None, [random_decoder_batch(seq_len=16)], RoleSpec(parser=None, probe_length=6))
    groups = adapt(model).group_grid().numpy()
    for role in ("previous-token", "induction", "sink", "broad"):
        scores = report.scores[role].scores
        for layer in range(scores.shape[0]):
            for group in np.unique(groups[layer]):
                values = scores[layer, groups[layer] == group]
                assert np.ptp(values) > 1e-6, (role, layer, group)


def test_cut_and_gated_heads_are_nan(one_thread):
    model = tiny_decoder("llama")
    cut = prune_model(model, {0: [1, 2]})
    mask = HeadMask.ones(adapt(model).grid_shape).prune(2, 5)
    report = head_roles(cut, None, [random_decoder_batch()], RoleSpec(parser=None, probe_length=6), mask=mask)
    for role, grid in report.scores.items():
        if role == "syntactic":
            continue
        assert np.isnan(grid.scores[0, [1, 2]]).all() and np.isnan(grid.scores[2, 5]), role
        assert np.isfinite(grid.scores[1]).all(), role
    assert report.labels[0, 1] == ()
    assert not report.heads_with(NO_ROLE)[0, 1]     # a cut head is not "no clear role" either


def test_albert_is_scored_per_tied_head(one_thread):
    model = tiny_model("albert")
    report = head_roles(model, None, [random_batch()], RoleSpec(parser=None, probe_length=6))
    assert report.shape == adapt(model).grid_shape == (1, model.config.num_attention_heads)


def test_probes_are_seeded_distinct_ordinary_tokens(one_thread):
    model = tiny_decoder("llama")
    a = make_probes(model, None, 12, 4, seed=5, causal=True)
    b = make_probes(model, None, 12, 4, seed=5, causal=True)
    assert torch.equal(a.input_ids, b.input_ids)
    block = a.input_ids[:, a.start:a.start + a.n]
    assert torch.equal(block, a.input_ids[:, a.start + a.n:a.start + 2 * a.n])
    assert all(len(set(row.tolist())) == a.n for row in block)
    assert not torch.equal(a.input_ids, make_probes(model, None, 12, 4, seed=6, causal=True).input_ids)


def test_json_round_trip_and_bad_input(one_thread):
    report = synthetic_report()
    again = RoleReport.from_json(json.loads(json.dumps(report.to_json())))
    assert again.counts() == report.counts()
    assert (again.labels == report.labels).all()
    with pytest.raises(RoleError, match="Unknown head role"):
        RoleSpec(params={"inductoin": {"threshold": 0.5}})
    with pytest.raises(Exception, match="threshold"):
        RoleSpec(params={"sink": {"threshold": 1.5}})
    with pytest.raises(RoleError, match="probe_length"):
        RoleSpec(probe_length=1)


def test_kept_by_role_counts_by_hand():
    report = synthetic_report()
    # keep the heads in order of this map: prune the two lowest (previous-token, duplicate-token) at ratio 2/6
    scores = ScoreMap(np.arange(6, dtype=float)[None], "toy")
    table = kept_by_role({"toy": scores}, report, 2 / 6)["toy"]
    assert table["kept_share"]["previous-token"] == 0.0 and table["kept_share"]["induction"] == 1.0
    assert table["pruned"]["duplicate-token"] == 1 and table["kept"]["sink"] == 1
    assert table["kept_share"]["syntactic"] is None       # no head has the role
    assert table["n_kept"] == 4 and table["n_pruned"] == 2


def test_role_ablation_equals_evaluate_under_the_same_mask(one_thread):
    model = tiny_decoder("llama")
    batches = [random_decoder_batch(seed=s) for s in range(2)]
    for b in batches:
        b["labels"] = b["input_ids"].clone()
    report = head_roles(model, None, batches, RoleSpec(parser=None, probe_length=6))
    role = "sink"     # a random model's heads are all alike: flag its top half by moving the threshold
    report.thresholds[role] = float(np.nanmedian(report.scores[role].scores))
    live = LiveEvaluator(model, batches)
    result = role_ablation(live, report, role, seeds=3)
    mask = HeadMask(torch.from_numpy(~report.heads_with(role)).float())
    expected = evaluate(model, batches, mask).to_dict()[result["metric"]]
    assert result["role_value"] == pytest.approx(expected, rel=1e-5)
    assert len(result["random_values"]) == 3 and result["n_heads"] == report.heads_with(role).sum()
    assert live.mask == HeadMask.ones(live.mask.shape)     # the caller's evaluator is untouched
