"""RazorAttention's compensation token (Tang et al. 2024, arXiv 2407.15891, §3.3, Eq. 4-5; issue 37 item 1): each
streaming group attends to one more entry, the mean of the keys and values it dropped, weighted by their number.
Checked by hand on random tensors, against the keys a tiny model really computes, and between the restriction (a
forward over the whole row) and the mixed cache (prefill in chunks, then decode)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import save_tiny_lm
from transformers import DynamicCache

from headprune.cli import main
from headprune.kvcache.budgets import budget_plan
from headprune.kvcache.cache import MixedCache, MixedLayer, generate
from headprune.kvcache.exports import duo_folder_files
from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.kvcache.restrict import CONFIG_KEY, eager_kv_attention, restricted, sdpa_kv_attention
from headprune.testing import tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")

GRID = torch.tensor([[1, 0], [0, 0], [0, 1], [1, 0]], dtype=torch.bool)   # tiny decoders: 4 blocks x 2 groups


def by_hand(q, k, v, sink, window, stream, scaling, compensate):
    """Attention of one query head, loop by loop: kept keys exp(q.k) each, and with the token N_d exp(q.k^) v^
    where k^, v^ are the means of the dropped keys/values (Eq. 4-5). q (T, d), k / v (T, d) -> (T, d)."""
    out = torch.zeros_like(q, dtype=torch.float64)
    q, k, v = q.double(), k.double(), v.double()
    for t in range(q.shape[0]):
        kept = [p for p in range(t + 1) if not stream or p < sink or p > t - window]
        dropped = [p for p in range(t + 1) if p not in kept]
        weights = [math.exp(float(q[t] @ k[p]) * scaling) for p in kept]
        num = sum(w * v[p] for w, p in zip(weights, kept))
        den = sum(weights)
        if compensate and dropped:
            mean_k, mean_v = k[dropped].mean(0), v[dropped].mean(0)
            w = len(dropped) * math.exp(float(q[t] @ mean_k) * scaling)
            num, den = num + w * mean_v, den + w
        out[t] = num / den
    return out


@pytest.mark.parametrize("function", [eager_kv_attention, sdpa_kv_attention])
def test_the_entry_is_the_mean_of_the_dropped_keys_and_values_weighted_by_their_number(function):
    """One layer, 4 query heads over 2 key/value heads (group 0 streams at S = 2, W = 3; group 1 full), 11 tokens:
    the attention function's output equals the hand formula with the token, and differs from it without."""
    gen = torch.Generator().manual_seed(0)
    t, d, sink, window = 11, 8, 2, 3
    q, k, v = (torch.randn(1, h, t, d, generator=gen) for h in (4, 2, 2))
    spec = {"stream": [True, True, False, False], "windows": [window] * 4, "kv_stream": [True, False],
            "kv_windows": [window] * 2, "sink": sink, "compensation": True}
    module = SimpleNamespace(config=SimpleNamespace(**{CONFIG_KEY: {0: spec}}), layer_idx=0, training=False)
    causal = torch.ones(t, t, dtype=torch.bool).tril()[None, None]
    out = function(module, q, k, v, causal, scaling=d ** -0.5)[0]                 # (1, T, H, d)
    for h in range(4):
        group, stream = h // 2, spec["stream"][h]
        want = by_hand(q[0, h], k[0, group], v[0, group], sink, window, stream, d ** -0.5, compensate=True)
        torch.testing.assert_close(out[0, :, h].double(), want, atol=1e-5, rtol=1e-5)
        if stream:   # the token matters: without it the streaming heads' outputs differ
            plain = by_hand(q[0, h], k[0, group], v[0, group], sink, window, stream, d ** -0.5, compensate=False)
            assert (out[0, sink + window:, h].double() - plain[sink + window:]).abs().max() > 1e-3


def test_the_mixed_cache_keeps_the_running_sums_of_exactly_the_dropped_keys():
    """Fed in uneven chunks: the ring's dropped sums are the sums of the keys and values at positions S..T-1-W,
    their count T - W - S; its slots hold the sinks and the last W keys as without the token."""
    layer = MixedLayer([False, True], sink=2, window=3, compensation=True)
    gen = torch.Generator().manual_seed(1)
    keys, values = [], []
    for n in (5, 1, 1, 9, 1, 4):
        k, v = torch.randn(1, 2, n, 4, generator=gen), torch.randn(1, 2, n, 4, generator=gen)
        layer.update(k, v)
        keys.append(k)
        values.append(v)
    k, v = torch.cat(keys, 2), torch.cat(values, 2)
    t = k.shape[2]
    dropped = layer.dropped
    assert dropped.count.tolist() == [t - 3 - 2]
    torch.testing.assert_close(dropped.k_sum, k[:, 1:, 2:t - 3].double().sum(-2))
    torch.testing.assert_close(dropped.v_sum, v[:, 1:, 2:t - 3].double().sum(-2))
    assert sorted(layer.positions.tolist()) == [0, 1, t - 3, t - 2, t - 1]
    assert torch.equal(layer.stream_k[0, 0], k[0, 1, layer.positions])


def test_on_a_tiny_model_the_entry_is_the_mean_of_the_keys_the_model_computed():
    """The same prompt through the restricted copy with the ordinary cache (every key kept) and with the mixed
    cache: each streaming group's running mean is the mean of the ordinary cache's keys/values at the dropped
    positions (keys after the rotary embedding, as the paper's Algorithm 1)."""
    model = tiny_decoder("llama")
    prompt = torch.randint(3, 100, (1, 25), generator=torch.Generator().manual_seed(4))
    sink, window = 2, 5
    ordinary = DynamicCache()
    with restricted(model, KVPlan(GRID, 8, sink=sink, window=window, compensation=True)) as copy, torch.no_grad():
        mixed = MixedCache(copy)
        copy(input_ids=prompt, past_key_values=ordinary, use_cache=True)
        copy(input_ids=prompt, past_key_values=mixed, use_cache=True)
    t = prompt.shape[1]
    checked = 0
    for mine, theirs in zip(mixed.layers, ordinary.layers):
        if mine.stream_heads:
            count = mine.dropped.count[None, :, None]
            mean_k, mean_v = mine.dropped.k_sum / count, mine.dropped.v_sum / count
            heads = mine.stream_heads
            torch.testing.assert_close(mean_k.float(), theirs.keys[:, heads, sink:t - window].mean(-2))
            torch.testing.assert_close(mean_v.float(), theirs.values[:, heads, sink:t - window].mean(-2))
            checked += len(heads)
    assert checked == int((~GRID).sum())


@pytest.mark.parametrize("chunk", [1, 7, 40])
@pytest.mark.parametrize("budget", [False, True])
def test_restriction_and_mixed_cache_agree_with_the_token(chunk, budget):
    """At every step the mixed cache's logits (prefill in chunks, then one token at a time) equal a forward of the
    whole prefix through the restricted copy to 1e-5; for a one-window and a budget plan (windows per group)."""
    model = tiny_decoder("llama")
    ids = torch.randint(3, 100, (1, 40), generator=torch.Generator().manual_seed(2))
    if budget:
        plan = budget_plan(torch.arange(8.0).view(4, 2), 8, 8 * 8, sink=2, beta=4.0)
        plan.compensation = True
    else:
        plan = KVPlan(GRID, 8, sink=2, window=5, compensation=True)
    with restricted(model, plan) as copy, torch.no_grad():
        cache = MixedCache(copy)
        for begin in range(0, 40, chunk):
            got = copy(input_ids=ids[:, begin:begin + chunk], past_key_values=cache, use_cache=True).logits
            want = copy(input_ids=ids[:, :min(begin + chunk, 40)]).logits[:, begin:begin + chunk]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        ref = generate(copy, ids[:, :30], 8, mode="restricted")
        mixed = generate(copy, ids[:, :30], 8, mode="mixed", prefill_chunk=chunk)
    assert mixed.tokens == ref.tokens


def test_without_the_option_plans_and_numbers_are_unchanged(tmp_path):
    """A plan file without "compensation" reads as no token and is written without the key; its logits are those of
    the plain restriction; with the token, a window covering the row is still exactly dense, and a narrow one moves
    the logits (the option does something)."""
    model = tiny_decoder("llama")
    ids = torch.randint(3, 100, (2, 16), generator=torch.Generator().manual_seed(3))
    plain = KVPlan(GRID, 8, sink=1, window=4)
    plain.write(tmp_path / "p.json")
    assert "compensation" not in json.loads((tmp_path / "p.json").read_text())
    assert KVPlan.read(tmp_path / "p.json").compensation is False
    with torch.no_grad():
        dense = model(input_ids=ids).logits
        with restricted(model, KVPlan.read(tmp_path / "p.json")) as copy:
            read_back = copy(input_ids=ids).logits
        with restricted(model, plain) as copy:
            today = copy(input_ids=ids).logits
        with restricted(model, plain.with_window(1, 16)) as copy:
            wide_plain = copy(input_ids=ids).logits
        token = KVPlan(GRID, 8, sink=1, window=4, compensation=True)
        with restricted(model, token.with_window(1, 16)) as copy:
            wide = copy(input_ids=ids).logits
        with restricted(model, token) as copy:
            narrow = copy(input_ids=ids).logits
    assert torch.equal(read_back, today) and torch.equal(wide_plain, dense)
    assert torch.equal(wide, dense)
    assert not torch.allclose(narrow, today, atol=1e-3)
    token.write(tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["compensation"] is True
    assert KVPlan.read(tmp_path / "t.json").compensation is True


def test_what_cannot_carry_the_token_is_refused():
    obj = KVPlan(GRID, 8).to_json()
    with pytest.raises(KVPlanError, match='"compensation" is true or false'):
        KVPlan.from_json({**obj, "compensation": "yes"})
    token = KVPlan(GRID, 8, compensation=True)
    with pytest.raises(KVPlanError, match="no place for it"):
        duo_folder_files(token)
    assert token.head_ids()["compensation"] is True
    with pytest.raises(KVPlanError, match="sliding-window"):   # tiny Qwen2: sliding-window layers
        with restricted(tiny_decoder("qwen2"), token):
            pass


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_llama"))


@pytest.mark.parametrize("argv, words", [
    (["--rule", "far-mass", "--compensation"], "--compensation is RazorAttention's compensation token"),
    (["--rule", "razor", "--compensation", "--tsv", "x.tsv"], "--tsv: DuoAttention's files have no compensation"),
    (["--trajectory", "--rule", "razor", "--compensation"], "--compensation apply to one plan"),
])
def test_bad_compensation_input_is_refused_before_loading(argv, words, lm_dir, tmp_path, capsys, monkeypatch):
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    monkeypatch.chdir(tmp_path)
    code = main(["kvplan", "--model", lm_dir[0], *argv, "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and words in err, err
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "x.tsv").exists()


def test_kvplan_razor_compensation_is_recorded_in_the_plan(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    out = tmp_path / "r.json"
    code = main(["kvplan", "--model", model, "--data", data, "--rule", "razor", "--compensation", "--sink", "1",
                 "--window", "3", "--out", str(out)])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0 and summary["compensation"] is True
    plan = KVPlan.read(out)
    assert plan.compensation is True and plan.meta["rule"] == "razor"
