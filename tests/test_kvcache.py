"""KV cache plans: exact streaming heads (restriction), the mixed cache, plan files and exports (issue 32)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprune.kvcache.cache import MixedCache, cache_bytes, generate
from headprune.kvcache.exports import write_duo_folder
from headprune.kvcache.plan import KVPlan, KVPlanError, check_full_share, top_share
from headprune.kvcache.restrict import CONFIG_KEY, restricted
from headprune.model.arch import adapt
from headprune.model.capture import capture_attention
from headprune.model.mask import HeadMask
from headprune.testing import random_decoder_batch, tiny_decoder, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

GRID = torch.tensor([[1, 0], [0, 0], [0, 1], [1, 0]], dtype=torch.bool)   # tiny decoders: 4 blocks x 2 groups


def inputs(seq_len=12):
    batch = random_decoder_batch(seq_len=seq_len)
    return {k: v for k, v in batch.items() if k != "labels"}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_window_covering_the_row_gives_exactly_the_dense_logits(impl):
    model = tiny_decoder("llama", attn_implementation=impl)
    batch = inputs()
    with torch.no_grad():
        dense = model(**batch).logits
        with restricted(model, KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, sink=0, window=12)) as copy:
            streamed = copy(**batch).logits
        with restricted(model, KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, sink=0, window=3)) as copy:
            narrow = copy(**batch).logits
    assert torch.equal(dense, streamed)
    assert not torch.allclose(dense, narrow, atol=1e-4)   # a narrow window does change them
    # the loaded model is intact: no plan in its config, its own attention kernel, same outputs
    assert not hasattr(model.config, CONFIG_KEY) and model.config._attn_implementation == impl
    assert torch.equal(model(**batch).logits, dense)


def test_streaming_heads_attention_is_exactly_zero_outside_sink_and_window():
    model = tiny_decoder("llama", attn_implementation="sdpa")
    batch = inputs(seq_len=14)
    sink, window = 2, 3
    plan = KVPlan(GRID, 8, sink=sink, window=window)
    with restricted(model, plan) as copy:
        maps = capture_attention(copy, batch)
    dense = capture_attention(model, batch)
    t = batch["input_ids"].shape[1]
    q, k = torch.arange(t)[:, None], torch.arange(t)[None, :]
    outside = (k > q) | ((k >= sink) & (k <= q - window))          # hand formula of the plan's rule
    stream = ~plan.query_full()
    valid = batch["attention_mask"].bool()
    for layer, probs in enumerate(maps.probs):
        for h in range(8):
            if stream[layer, h]:
                assert torch.equal(probs[:, h][:, outside], torch.zeros_like(probs[:, h][:, outside]))
                assert probs[:, h][:, ~outside].abs().sum() > 0
            # every real query row is still a distribution
            rows = probs[:, h].sum(-1)[valid]
            assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)
    # layer 0's full group sees what it saw densely (the layers above differ: their input changed)
    assert torch.equal(maps.probs[0][:, :4], dense.probs[0][:, :4])


def test_restriction_composes_with_a_mask():
    """Gating still works on the restricted copy: a head gated to 0 contributes nothing either way."""
    model = tiny_decoder("llama")
    batch = inputs()
    mask = HeadMask.ones((4, 8))
    mask.values[1, :4] = 0.0
    from headprune.model.gating import gate_heads

    plan = KVPlan(GRID, 8, sink=1, window=4)
    with torch.no_grad(), restricted(model, plan) as copy:
        with gate_heads(copy, mask):
            gated = copy(**batch).logits
        plain = copy(**batch).logits
    assert not torch.allclose(gated, plain)
    # a pruned group needs no cache: ideal bytes drop when its group is not live
    live = torch.ones(4, 2, dtype=torch.bool)
    live[1, 0] = False
    assert plan.ideal_bytes(100, 8, 4, live)["plan"] < plan.ideal_bytes(100, 8, 4)["plan"]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_cache_generates_the_tokens_of_the_restricted_full_cache(arch):
    model = tiny_decoder(arch)
    prompt = torch.randint(3, 100, (1, 30), generator=torch.Generator().manual_seed(1))
    plan = KVPlan(GRID, 8, sink=2, window=5)
    with restricted(model, plan) as copy:
        ref = generate(copy, prompt, 12, mode="restricted")
        mixed = generate(copy, prompt, 12, mode="mixed")
        chunked = generate(copy, prompt, 12, mode="mixed", prefill_chunk=7)
        sampled = generate(copy, prompt, 12, mode="mixed", sample=True, seed=3)
        sampled_ref = generate(copy, prompt, 12, mode="restricted", sample=True, seed=3)
    assert mixed.tokens == ref.tokens == chunked.tokens
    assert sampled.tokens == sampled_ref.tokens
    assert generate(model, prompt, 12).tokens != ref.tokens   # the restriction matters on this prompt
    # bytes measured from the tensors equal the hand count: full groups keep all T, streaming ones S + W
    t, d, per = 30 + 11, 8, 2 * 4          # the last token is never fed back
    expected = sum(int(row.sum()) * t * d * per + int((~row).sum()) * (2 + 5) * d * per for row in GRID)
    assert mixed.kv_bytes == expected
    # allocated: the full heads' buffers hold 256 tokens (the first allocation), the ring exactly S + W
    assert mixed.kv_bytes_allocated == sum(int(row.sum()) * 256 * d * per + int((~row).sum()) * (2 + 5) * d * per
                                           for row in GRID)
    assert ref.kv_bytes_allocated == ref.kv_bytes
    assert mixed.kv_bytes == plan.ideal_bytes(t, d, 4)["plan"]
    assert ref.kv_bytes == plan.ideal_bytes(t, d, 4)["full_cache"]


def test_mixed_cache_is_a_transformers_cache():
    model = tiny_decoder("llama")
    with restricted(model, KVPlan(GRID, 8, sink=1, window=2)) as copy:
        cache = MixedCache(copy)
        copy(input_ids=torch.randint(3, 100, (1, 9)), past_key_values=cache, use_cache=True)
        assert cache.get_seq_length() == 9
        held = [layer.stream_k.shape[2] for layer in cache.layers if layer.stream_heads]
        assert held and all(h == 3 for h in held)
        assert cache_bytes(cache) < 4 * 2 * 9 * 8 * 2 * 4



@pytest.mark.parametrize("chunk", [1, 3, 30])
def test_preallocated_mixed_cache_matches_the_restricted_forward_at_every_step(chunk):
    """The ring of S + W slots and the growing full-head buffers: at every step, the logits of the mixed cache equal
    those of a forward of the whole prefix through the restricted copy (no cache; the restriction by mask), and the
    ring holds exactly the sinks and the last W positions."""
    model = tiny_decoder("llama")
    ids = torch.randint(3, 100, (1, 40), generator=torch.Generator().manual_seed(2))
    sink, window = 2, 5
    with restricted(model, KVPlan(GRID, 8, sink=sink, window=window)) as copy, torch.no_grad():
        cache = MixedCache(copy)
        for begin in range(0, 40, chunk):
            got = copy(input_ids=ids[:, begin:begin + chunk], past_key_values=cache, use_cache=True).logits
            end = min(begin + chunk, 40)
            want = copy(input_ids=ids[:, :end]).logits[:, begin:end]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            for layer in cache.layers:
                held = sorted(layer.positions.tolist())
                assert held == sorted({*range(min(sink, end)), *range(max(0, end - window), end)})
                assert layer.full_k.shape[2] == end and end <= layer.full_k_buf.shape[2] <= max(256, 1.25 * end)
        # the buffers' spare capacity is counted apart from what the cache holds
        assert cache_bytes(cache, allocated=True) >= cache_bytes(cache) > 0


def test_mixed_layer_buffers_hold_every_full_key_and_the_streaming_window():
    """Fed in chunks past several growths: the full head's view is exactly the concatenation of its keys/values,
    the buffer grows by a quarter (at least 256), the streaming head's slots hold the keys of the sinks and the
    last W positions, each at its position."""
    from headprune.kvcache.cache import MixedLayer

    layer = MixedLayer([False, True], sink=2, window=3)
    gen = torch.Generator().manual_seed(0)
    keys, values, capacities = [], [], []
    for t in (100, 200, 1, 1, 300, 1, 7, 1, 600, 1):
        k, v = torch.randn(1, 2, t, 4, generator=gen), torch.randn(1, 2, t, 4, generator=gen)
        layer.update(k, v)
        keys.append(k)
        values.append(v)
        capacities.append(layer.full_k_buf.shape[2])
    k, v = torch.cat(keys, dim=2), torch.cat(values, dim=2)
    n = k.shape[2]
    assert torch.equal(layer.full_k, k[:, :1]) and torch.equal(layer.full_v, v[:, :1]) and layer.length == n
    # by hand: max(end, capacity + max(capacity // 4, 256)) whenever a chunk does not fit
    assert capacities == [256, 512, 512, 512, 768, 768, 768, 768, 1211, 1211 + 302]
    pos = layer.positions
    assert sorted(pos.tolist()) == [0, 1, n - 3, n - 2, n - 1]
    assert torch.equal(layer.stream_k[0, 0], k[0, 1, pos]) and torch.equal(layer.stream_v[0, 0], v[0, 1, pos])
    assert sum(t.numel() for t in layer.tensors()) == 4 * (n + n + 5 + 5)

def test_plan_file_round_trip_and_exports(tmp_path):
    plan = KVPlan(GRID, 8, sink=4, window=16, meta={"rule": "random"})
    path = tmp_path / "plan.json"
    plan.write(path)
    back = KVPlan.read(path)
    assert torch.equal(back.full, plan.full) and (back.sink, back.window, back.n_heads) == (4, 16, 8)
    assert back.meta["rule"] == "random"
    # DuoAttention's folder: a plan without scores writes its grid (ordered as the plan keeps), and config.json's
    # sparsity gives its head set back through DuoAttention's quantile
    config = write_duo_folder(plan, tmp_path / "duo")
    values = np.loadtxt(tmp_path / "duo" / "full_attention_heads.tsv", delimiter="\t")
    assert np.abs(values - GRID.float().numpy()).max() < 1e-4 and config["recent_size"] == 16
    assert np.array_equal(values >= np.quantile(values, config["sparsity"]), GRID.numpy())
    ids = plan.head_ids()
    assert ids["full_kv_heads"] == [[0, 0], [2, 1], [3, 0]]
    assert len(ids["full_query_heads"]) == 3 * 4 and len(ids["streaming_query_heads"]) == 5 * 4


def test_top_share_picks_the_highest_scores():
    scores = torch.tensor([[0.1, 0.9], [0.5, 0.2]])
    assert top_share(scores, 0.5).tolist() == [[False, True], [True, False]]
    assert not top_share(scores, 0.0).any() and top_share(scores, 1.0).all()


@pytest.mark.parametrize("kwargs, words", [
    ({"sink": 0, "window": 0}, "window 0 must be an integer in \\[1, 1,048,576\\]"),
    ({"sink": -1, "window": 4}, "sink -1 must be an integer in \\[0, 1,048,576\\]"),
    ({"sink": 1, "window": 2.5}, "window 2.5 must be an integer in \\[1, 1,048,576\\]"),
])
def test_bad_window_or_sink(kwargs, words):
    with pytest.raises(KVPlanError, match=words):
        KVPlan(GRID, 8, **kwargs)


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_full_share_outside_unit_interval(share):
    with pytest.raises(KVPlanError, match="must (lie|be a finite number) in \\[0, 1\\]"):
        check_full_share(share)


def test_plan_for_another_grid_or_an_encoder():
    with pytest.raises(KVPlanError, match="3 blocks x 2 key/value heads.*model has 4 x 2"):
        KVPlan(torch.ones(3, 2, dtype=torch.bool), 8).check_fits(adapt(tiny_decoder("llama")))
    with pytest.raises(KVPlanError, match="needs a decoder.*encoder"):
        KVPlan(torch.ones(3, 4, dtype=torch.bool), 4).check_fits(adapt(tiny_model("bert")))
    with pytest.raises(KVPlanError, match="format"):
        KVPlan.from_json({"shape": [4, 2]})
    with pytest.raises(KVPlanError, match="groups must be a list of integers in 0..1"):
        KVPlan.from_json({"format": "headprune-kv-plan", "shape": [4, 2], "n_heads": 8, "full": {"0": [2]}})


# -- scores --------------------------------------------------------------------------------------------------------

from headprune.kvcache.scores import (  # noqa: E402
    check_rule,
    far_mass_scores,
    group_scores,
    head_scores,
    plan_from_scores,
    razor_scores,
)
from headprune.roles.probes import make_probes  # noqa: E402


def test_far_mass_score_is_the_attention_mass_outside_sink_and_window():
    model = tiny_decoder("llama")
    batch = random_decoder_batch(seq_len=14)
    sink, window = 1, 4
    got = far_mass_scores(model, [batch], sink, window)
    probs = capture_attention(model, batch).stacked.double().numpy()      # (L, B, H, T, T)
    valid = batch["attention_mask"].bool().numpy()
    want = np.zeros((4, 8))
    for layer in range(4):
        for h in range(8):
            masses = [probs[layer, b, h, q, sink:q - window + 1].sum()          # keys S .. q-W, by hand
                      for b in range(valid.shape[0]) for q in range(14) if valid[b, q] and q >= sink + window]
            want[layer, h] = np.mean(masses)
    assert np.allclose(got, want, atol=1e-6)
    assert (want > 0).all()


def test_razor_score_is_the_max_of_echo_and_induction_on_long_probes():
    model = tiny_decoder("llama")
    window = 5
    got = razor_scores(model, None, window, rows=3, seed=7)
    probes = make_probes(model, None, 20, 3, 7, causal=True)
    assert probes.n > window
    probs = capture_attention(model, probes.batch).stacked.double().numpy()
    s, n = probes.start, probes.n
    for layer in range(4):
        for h in range(8):
            echo = np.mean([probs[layer, b, h, i, i - n] for b in range(3) for i in range(s + n, s + 2 * n)])
            induction = np.mean([probs[layer, b, h, i, i - n + 1] for b in range(3) for i in range(s + n, s + 2 * n)])
            assert got[layer, h] == pytest.approx(max(echo, induction), abs=1e-6)


def test_group_scores_and_plans():
    scores = np.array([[0.1, 0.9, 0.2, 0.3], [0.5, 0.5, np.nan, np.nan]])   # 2 layers, 4 query heads, 2 groups
    assert np.allclose(group_scores(scores, 2, "max")[0], [0.9, 0.3])
    assert np.allclose(group_scores(scores, 2, "mean")[0], [0.5, 0.25])
    assert group_scores(scores, 2, "max")[1, 1] == -np.inf                    # a cut group needs no cache
    plan = plan_from_scores(scores, 2, 0.5, 4, 8)
    assert plan.full.tolist() == [[True, False], [True, False]]
    assert plan.meta["group_scores"][1][1] is None
    with pytest.raises(KVPlanError, match="accepted: max, mean"):
        group_scores(scores, 2, "median")


def test_random_and_criterion_rules():
    model = tiny_decoder("llama")
    batch = random_decoder_batch()
    a = head_scores("random", model, calib=[], seed=1)
    assert np.array_equal(a, head_scores("random", model, calib=[], seed=1))
    assert not np.array_equal(a, head_scores("random", model, calib=[], seed=2))
    entropy = head_scores("ae", model, calib=[batch])
    assert entropy.shape == (4, 8) and np.isfinite(entropy).all()
    with pytest.raises(KVPlanError, match="Unknown KV plan rule .nope.*razor, duo, far-mass, random"):
        check_rule("nope")


# -- tasks ---------------------------------------------------------------------------------------------------------

from headprune.kvcache.tasks import bytes_at, invert, metric_under_plan, random_plans, role_plan  # noqa: E402


def test_role_random_and_inverted_plans():
    heads = np.zeros((4, 8), dtype=bool)
    heads[1, 5] = heads[3, 0] = True
    plan = role_plan(heads, 2, 1, 4)
    assert plan.full.tolist() == [[False, False], [False, True], [False, False], [True, False]]
    assert torch.equal(invert(plan).full, ~plan.full)
    plans = random_plans((4, 2), 8, 3, range(5), 1, 4)
    assert all(int(p.full.sum()) == 3 for p in plans)
    assert len({tuple(p.full.flatten().tolist()) for p in plans}) > 1           # seeds differ
    assert random_plans((4, 2), 8, 3, [2], 1, 4)[0].full.tolist() == plans[2].full.tolist()


def test_metric_and_bytes_under_a_plan():
    from headprune.model.task import lm_labels

    model = tiny_decoder("llama")
    batch = random_decoder_batch(seq_len=12)
    batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
    dense = metric_under_plan(model, [batch], None).to_dict()["perplexity"]
    wide = metric_under_plan(model, [batch], KVPlan(GRID, 8, 0, 12)).to_dict()["perplexity"]
    narrow = metric_under_plan(model, [batch], KVPlan(GRID, 8, 0, 2)).to_dict()["perplexity"]
    assert wide == dense and narrow != dense
    counted = bytes_at(model, KVPlan(GRID, 8, 2, 6), 100)
    # by hand: 3 full groups x 100 tokens + 5 streaming x 8, each token a key and a value of 8 fp32
    assert counted["full_cache"] == 8 * 100 * 2 * 8 * 4 and counted["plan"] == (3 * 100 + 5 * 8) * 2 * 8 * 4
    mask = HeadMask.ones((4, 8))
    mask.values[0, :4] = 0.0                                     # group (0, 0) gated off: needs no cache
    assert bytes_at(model, KVPlan(GRID, 8, 2, 6), 100, mask)["plan"] == (2 * 100 + 5 * 8) * 2 * 8 * 4
