"""DeBERTa-v2/v3 and ModernBERT: gating == surgery, save/load, run-from-layer, capture, criteria, SAP, bad input.

(Random masks, repeat surgery and the word-level save/load round trip run in tests/test_equivalence.py, whose
parametrisations include these families under each attention implementation.)

Tiny random configs (headprune.testing.tiny_modern): DeBERTa with relative attention, p2c + c2p, position
buckets and the layer-0 convolution, once with share_att_key (v3) and once with its own position projections;
ModernBERT with alternating global/local layers whose window is shorter than the test sentences.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from headprune.model.arch import adapt
from headprune.model.capture import CaptureError, capture_attention, record_attention
from headprune.model.gating import gate_heads
from headprune.model.layers import record_layer_inputs, start_at_layer
from headprune.model.loading import load_model, save_pruned
from headprune.model.mask import HeadMask
from headprune.model.sizes import parameter_counts
from headprune.model.surgery import prune_model
from headprune.testing import MODERN_ARCHS, offline_tokenizer, random_batch, save_tiny_modern, tiny_modern

ATOL = 1e-5
# Every attention implementation each family supports on CPU (DeBERTa-v2 has only its own eager kernel).
IMPLEMENTATIONS = [(arch, attn) for arch in MODERN_ARCHS
                   for attn in (("eager", "sdpa") if arch == "modernbert" else ("eager",))]
CORPUS = ["Dolphins were washed up on beaches in Africa.", "The quick brown fox jumps over the lazy dog.",
          "More than 150 dolphins, marine turtles and beaked whales died.", "I laughed, didn't I?"]
TOKENIZER_KIND = {"deberta-v2": "unigram", "deberta-v2-unshared": "unigram", "modernbert": "byte-level-bpe"}

pytestmark = pytest.mark.usefixtures("one_thread")


def inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def logits(model, batch, mask=None) -> torch.Tensor:
    with torch.no_grad(), gate_heads(model, mask):
        return model(**inputs(batch)).logits


def random_mask(shape, seed: int, p: float = 0.5) -> HeadMask:
    g = torch.Generator().manual_seed(seed)
    return HeadMask((torch.rand(shape, generator=g) > p).float())


@functools.cache
def tokenizer(kind: str):
    return offline_tokenizer(kind, CORPUS * 3)


# -- gating == surgery -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,attn", IMPLEMENTATIONS)
def test_every_whole_layer_and_the_whole_model(arch, attn):
    model = tiny_modern(arch, attn_implementation=attn)
    batch = random_batch(seed=3)
    shape = adapt(model).grid_shape
    for layer in range(shape[0]):
        values = torch.ones(shape)
        values[layer] = 0
        mask = HeadMask(values)
        pruned = prune_model(model, mask)
        assert adapt(pruned).blocks[layer].kept == []
        assert (logits(model, batch, mask) - logits(pruned, batch)).abs().max() <= ATOL
    nothing = HeadMask(torch.zeros(shape))
    assert (logits(model, batch, nothing) - logits(prune_model(model, nothing), batch)).abs().max() <= ATOL


def test_every_per_head_projection_is_cut():
    """DeBERTa's own position projections (share_att_key=False) lose the same head rows as Q/K/V."""
    model = tiny_modern("deberta-v2-unshared")
    mask = HeadMask.ones(adapt(model).grid_shape).prune(1, 0).prune(1, 2)
    pruned = prune_model(model, mask)
    core = adapt(pruned).blocks[1].core
    d = core.attention_head_size
    for name in ("query_proj", "key_proj", "value_proj", "pos_query_proj", "pos_key_proj"):
        assert getattr(core, name).out_features == 2 * d, name
        original = getattr(adapt(model).blocks[1].core, name).weight
        assert torch.equal(getattr(core, name).weight, torch.cat([original[d:2 * d], original[3 * d:]]))
    assert core.num_attention_heads == 2 and core.all_head_size == 2 * d
    removed = parameter_counts(model)["attention_qkvo"]["params"] - parameter_counts(pruned)["attention_qkvo"]["params"]
    hidden = model.config.hidden_size
    assert removed == 2 * (5 * (d * hidden + d) + d * hidden)   # 5 projections (weights + biases) and O's columns


def test_modernbert_grid_marks_local_and_global_layers():
    adapter = adapt(tiny_modern("modernbert", n_layers=4))
    assert adapter.layer_kinds == ["full", "sliding", "full", "sliding"]
    assert adapter.blocks[0].fused and adapter.family == "modernbert"


@pytest.mark.parametrize("arch,attn", IMPLEMENTATIONS)
def test_save_and_load_gives_identical_logits(arch, attn, tmp_path):
    model = tiny_modern(arch, attn_implementation=attn, vocab_size=320)
    mask = random_mask(adapt(model).grid_shape, seed=5)
    values = mask.values.clone()
    values[0] = 0   # one block with no heads at all
    pruned = prune_model(model, HeadMask(values))
    save_pruned(pruned, tokenizer(TOKENIZER_KIND[arch]), tmp_path / "cut")
    loaded = load_model(str(tmp_path / "cut"), "cpu", attn_implementation=attn)
    batch = random_batch(vocab_size=320, seed=2)
    assert torch.equal(logits(pruned, batch), logits(loaded.model, batch))
    assert adapt(loaded.model).live_grid().equal(adapt(pruned).live_grid())


# -- run from layer l ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,attn", IMPLEMENTATIONS)
def test_full_forward_equals_run_from_every_layer(arch, attn):
    model = tiny_modern(arch, attn_implementation=attn)
    adapter = adapt(model)
    batch = random_batch(seq_len=12, seed=1)
    mask = random_mask(adapter.grid_shape, seed=2, p=0.3)
    with torch.no_grad(), gate_heads(model, mask, adapter):
        with record_layer_inputs(adapter.layer_modules) as layer_inputs:
            full = model(**inputs(batch)).logits
        assert len(layer_inputs) == adapter.n_layers
        for layer in range(adapter.n_layers):
            with start_at_layer(adapter, layer, layer_inputs[layer]):
                replayed = model(**inputs(batch)).logits
            assert (replayed - full).abs().max() <= ATOL, (arch, attn, layer)


# -- attention capture ----------------------------------------------------------------------------------------------

def padded_pairs(batch) -> torch.Tensor:
    valid = batch["attention_mask"].bool()
    return (valid[:, None, :, None] & valid[:, None, None, :]).float()


@pytest.mark.parametrize("arch,attn", IMPLEMENTATIONS)
def test_capture_equals_eager_output_attentions(arch, attn):
    """capture_attention (which switches sdpa to eager and asks DeBERTa for its probabilities) == the stock eager
    forward's own ``output_attentions`` (same seed = same weights), padded rows and columns zeroed."""
    model = tiny_modern(arch, attn_implementation=attn)
    batch = random_batch(seq_len=12, seed=4)
    maps = capture_attention(model, batch)
    with torch.no_grad():
        reference = tiny_modern(arch, attn_implementation="eager")(**inputs(batch), output_attentions=True).attentions
    assert len(maps.probs) == len(reference) == adapt(model).n_layers
    for captured, expected in zip(maps.probs, reference):
        assert (captured - expected.float() * padded_pairs(batch)).abs().max() <= 1e-6
        assert captured.sum(-1).transpose(1, 2)[batch["attention_mask"].bool()].sub(1).abs().max() < 1e-5  # rows: 1
    assert model.config._attn_implementation == attn and not model.config.output_attentions   # restored


def test_capture_of_gated_model_equals_eager_attentions_of_the_cut_model():
    """Every layer, not only the first: capture under a mask == eager output_attentions of the cut model."""
    for arch in MODERN_ARCHS:
        model = tiny_modern(arch)
        mask = random_mask(adapt(model).grid_shape, seed=7, p=0.4)
        batch = random_batch(seq_len=12, seed=5)
        maps = capture_attention(model, batch, mask)
        cut = prune_model(model, mask)
        with torch.no_grad():
            attentions = cut(**inputs(batch), output_attentions=True).attentions
        for block, probs in zip(adapt(cut).blocks, maps.probs):
            if block.kept:
                assert (probs[:, block.kept] - attentions[block.index].float() * padded_pairs(batch)).abs().max() \
                    <= 1e-6
            dead = [h for h in range(adapt(model).n_heads) if h not in block.kept]
            assert probs[:, dead].abs().max() == 0 if dead else True


def test_capture_refuses_a_core_that_returns_no_probabilities():
    """DeBERTa's core returns probabilities only when asked; not asking must fail loudly, never draw zeros."""
    model = tiny_modern("deberta-v2")
    adapter = adapt(model)
    adapter.needs_output_attentions = False
    with pytest.raises(CaptureError, match="returned no attention probabilities.*Supported families"):
        with record_attention(model, adapter):
            model(**inputs(random_batch()))


# -- one-pass criteria against independent computations -----------------------------------------------------------

@functools.cache
def double(arch: str):
    """Float64 copy (finite differences and autograd references need it); cached: scoring never mutates it."""
    return tiny_modern(arch).double()


def calib(arch: str, n: int = 2) -> list[dict]:
    """Padded batches, except for ModernBERT: in float64 its stock forward gives NaN logits for padded rows
    (transformers 5.23: the eager softmax runs in float32, where float64's mask minimum is -inf, so a padded query
    whose local window holds only padding gets an all -inf row), so its float64 references run on unpadded
    batches; padding on ModernBERT is covered in float32 above."""
    batches = [random_batch(batch_size=3, seq_len=10, seed=10 + i) for i in range(n)]
    if arch == "modernbert":
        for batch in batches:
            batch["attention_mask"] = torch.ones_like(batch["attention_mask"])
    return batches


def scores(model, name, batches, params=None):
    from headprune.criteria import ScoringContext, get

    return get(name)(ScoringContext(model, batches), params)


@pytest.mark.parametrize("arch", MODERN_ARCHS)
def test_entropy_and_deficit_match_hand_formulas(arch):
    from test_criteria_onepass import hand_entropy, per_sentence_mean

    model, batches = double(arch), calib(arch)
    entropy = hand_entropy(model, batches, lambda a: -torch.special.xlogy(a, a))
    np.testing.assert_allclose(scores(model, "ae", batches, {"form": "A"}).meta["entropy"], entropy, rtol=1e-6)
    deficit = per_sentence_mean(
        model, batches, lambda a, n: 1 - (-torch.special.xlogy(a, a)).sum((-1, -2)).numpy() / (n * np.log(n)))
    np.testing.assert_allclose(scores(model, "ad", batches).meta["deficit"], deficit, rtol=1e-6)


@pytest.mark.parametrize("arch", MODERN_ARCHS)
def test_his_matches_finite_differences_of_the_gate(arch):
    """ModernBERT applies its rotary table in float32 even in a float64 model, so its loss carries float32
    rounding (~1e-7): a larger step (3e-3) keeps that noise over the step, and the central difference's O(δ²)
    error, below the looser tolerance (1e-3 relative)."""
    from test_criteria_onepass import gate_slopes, loss

    model, batches = double(arch), calib(arch)
    delta = 3e-3 if arch == "modernbert" else 1e-5
    expected = gate_slopes(model, batches, loss, delta=delta)
    assert expected.max() > 1e-3
    got = scores(model, "his", batches).scores
    np.testing.assert_allclose(got, expected, rtol=1e-3 if arch == "modernbert" else 1e-6, atol=1e-9)
    np.testing.assert_allclose(scores(model, "taylor", batches).scores, got, rtol=1e-8)   # Σ A ∂L/∂A = HIS


def gnorm_by_single_examples(model, batches) -> np.ndarray:
    """G_Q, G_K, G_V: autograd of ‖logits‖ on each sentence alone (no padding); each head's rows of W.grad, a
    fused Wqkv's rows taken part by part."""
    adapter = adapt(model)
    total, n = np.zeros((3, *adapter.grid_shape)), 0
    for batch in batches:
        for b in range(len(batch["labels"])):
            length = int(batch["attention_mask"][b].sum())
            model.zero_grad()
            model(**{k: v[b:b + 1, :length] for k, v in inputs(batch).items()}).logits.norm().backward()
            for block in adapter.blocks:
                for i, part in enumerate(("query", "key", "value")):
                    grad = getattr(block, part).weight.grad
                    if block.fused:
                        grad = grad[slice(*block.fused_span(part))]
                    total[i, block.index] += grad.view(adapter.n_heads, block.head_size, -1).norm(dim=(1, 2)).numpy()
            n += 1
    model.zero_grad()
    return total / n


@pytest.mark.parametrize("arch", ["deberta-v2-unshared", "modernbert"])
def test_gnorm_per_sentence_matches_batch_size_one_autograd(arch):
    """(DeBERTa with share_att_key also sends its position table through W_Q/W_K, once per batch: Gnorm counts
    the token path only, see criteria/onepass.py, so whole-weight gradients are no reference there.)"""
    model, batches = double(arch), calib(arch)
    expected = gnorm_by_single_examples(model, batches)
    result = scores(model, "gnorm", batches, {"objective": "logits_norm"})
    for i, name in enumerate(("G_Q", "G_K", "G_V")):
        np.testing.assert_allclose(result.meta[name], expected[i], rtol=1e-6, err_msg=name)


def test_gnorm_value_of_shared_key_deberta_matches_autograd():
    """With share_att_key, W_V never meets the position table, so G_V is the whole W_V gradient there too."""
    model, batches = double("deberta-v2"), calib("deberta-v2")
    result = scores(model, "gnorm", batches, {"objective": "logits_norm"})
    np.testing.assert_allclose(result.meta["G_V"], gnorm_by_single_examples(model, batches)[2], rtol=1e-6)
    assert np.isfinite(result.scores).all() and (result.scores > 0).all()


@pytest.mark.parametrize("arch", MODERN_ARCHS)
def test_criteria_on_the_cut_model_equal_criteria_under_the_gate(arch):
    """After surgery the fused Wqkv is sliced by the live counts and DeBERTa's core has fewer heads: every
    one-pass quantity of a cut model equals the same quantity under the equivalent gate (NaN where cut)."""
    from headprune.criteria import ScoringContext
    from headprune.criteria.onepass import score_many

    model, batches = double(arch), calib(arch)
    mask = HeadMask.ones(adapt(model).grid_shape).prune(0, 1).prune(2, 0).prune(2, 3)
    names = ["ae", "ad", "his", "gnorm"]
    gated = score_many(names, ScoringContext(model, batches, mask))
    cut = score_many(names, ScoringContext(prune_model(model, mask), batches))
    for name in names:
        assert np.isnan(gated[name].scores).sum() == 3
        np.testing.assert_allclose(cut[name].scores, gated[name].scores, rtol=1e-7, err_msg=name)


@pytest.mark.parametrize("arch", MODERN_ARCHS)
def test_kl_from_layer_l_equals_full_passes(arch):
    """KL ablation replays each layer from its recorded input (DeBERTa: past the layer-0 convolution); the
    naive method runs one full pass per head."""
    from headprune.criteria.kl import kl_raw_importance

    model, batches = tiny_modern(arch), [random_batch(seed=30 + i) for i in range(2)]
    mask = HeadMask.ones(adapt(model).grid_shape).prune(1, 2)
    cached = kl_raw_importance(model, batches, mask)
    naive = kl_raw_importance(model, batches, mask, cached=False, ablations_per_pass=1)
    np.testing.assert_allclose(cached, naive, rtol=1e-4, atol=1e-7)
    assert np.isnan(cached[1, 2]) and np.nanmin(cached) > 0


# -- SAP on word pieces of both tokenizer kinds --------------------------------------------------------------------

SAP_TEXT = "Beaked whales were washed up, unexpectedly!"   # unseen words: split into several pieces


@pytest.mark.parametrize("arch", ["deberta-v2", "modernbert"])
def test_word_attention_on_both_tokenizer_kinds(arch):
    """Word-level attention of the attention view / SAP (DeBERTa: SentencePiece Unigram "▁" pieces, ModernBERT:
    byte-level BPE "Ġ" pieces) == a hand loop over the stock eager attentions: query word i's pieces averaged,
    key word j's pieces summed."""
    from headprune.syntax.arcs import build_arcs
    from headprune.syntax.parse import parse_text

    tok = tokenizer(TOKENIZER_KIND[arch])
    model = tiny_modern(arch, vocab_size=320, attn_implementation="sdpa" if arch == "modernbert" else "eager")
    arcs = build_arcs(model, tok, SAP_TEXT)
    spans = parse_text(SAP_TEXT).spans
    assert arcs.seen.all() and len(arcs.arcs) >= len(spans) - 2
    enc = tok([SAP_TEXT], return_offsets_mapping=True, return_special_tokens_mask=True, return_tensors="pt")
    pieces = [[t for t, ((a, b), special) in enumerate(zip(enc["offset_mapping"][0].tolist(),
                                                             enc["special_tokens_mask"][0].tolist()))
               if not special and SAP_TEXT[a:b].strip() and a < end and b > start] for start, end in spans]
    assert max(len(p) for p in pieces) >= 2   # some words really are split
    with torch.no_grad():
        eager = tiny_modern(arch, vocab_size=320)(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                                                 output_attentions=True).attentions
    for layer, probs in enumerate(eager):
        for i, queries in enumerate(pieces):
            for j, keys in enumerate(pieces):
                expected = probs[0][:, queries][:, :, keys].sum(-1).mean(-1).numpy()
                np.testing.assert_allclose(arcs.attention[layer, :, i, j], expected, atol=1e-6)


@pytest.mark.parametrize("arch", ["deberta-v2", "modernbert"])
def test_sap_criteria_run_on_both_families(arch):
    from headprune.criteria import ScoringContext, get

    tok = tokenizer(TOKENIZER_KIND[arch])
    model = tiny_modern(arch, vocab_size=320)
    enc = tok(CORPUS, padding=True, return_tensors="pt")
    batches = [{"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                "labels": torch.tensor([0, 1, 2, 0])}]
    shape = adapt(model).grid_shape
    for name in ("sap", "sap-cf"):
        result = get(name)(ScoringContext(model, batches, tokenizer=tok, texts=CORPUS), None)
        assert result.scores.shape == shape and np.isfinite(result.scores).all()
        assert len(np.unique(result.scores)) > 1


# -- live evaluation, CLI, bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("arch,attn", IMPLEMENTATIONS)
def test_live_evaluation_follows_toggles_exactly(arch, attn):
    """LiveEvaluator (replays from the changed layer; the BERT fast paths switch themselves off) == a plain gated
    forward after every toggle."""
    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import predict

    model = tiny_modern(arch, attn_implementation=attn)
    batches = [random_batch(seed=20 + i) for i in range(2)]
    live = LiveEvaluator(model, batches)
    assert live.incremental
    mask = live.mask
    for layer, head in ((2, 1), (0, 3), (1, 0), (2, 1)):
        mask = mask.prune(layer, head) if mask.values[layer, head] else mask.restore(layer, head)
        live.set_mask(mask)
        assert (live.logits - predict(model, batches, mask)).abs().max() <= ATOL, (layer, head)
    assert live.stats.partial_runs >= 2


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory):
    from conftest import sentences

    corpus = sentences(60, seed=1)   # the texts of conftest's tiny_csv
    return {arch: save_tiny_modern(arch, tmp_path_factory.mktemp(arch), corpus)
            for arch in ("deberta-v2", "modernbert")}


@pytest.mark.parametrize("arch", ["deberta-v2", "modernbert"])
def test_cli_scores_prunes_and_reloads(arch, saved_models, tiny_csv, tmp_path, capsys):
    import json

    from headprune.cli import main

    def run(*argv):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert code == 0, err
        return json.loads(out)

    folder = saved_models[arch]
    data = ["--data", tiny_csv, "--calib-size", 16, "--eval-size", 40]
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1, 3], "2": [0]}}))
    masked = run("evaluate", "--model", folder, "--mask", mask, *data)
    run("prune", "--model", folder, "--mask", mask, "--out", tmp_path / "cut")
    cut = run("evaluate", "--model", tmp_path / "cut", *data)
    assert masked["pruned_heads"] == cut["pruned_heads"] == 3
    assert cut["loss"] == pytest.approx(masked["loss"], abs=1e-5)
    scored = run("score", "--model", folder, "--criterion", "his", *data)
    assert (scored["layers"], scored["heads"]) == (3, 4)
    trajectory = run("trajectory", "--model", folder, "--criterion", "kl", "--count", 3, "--stability", *data)
    assert [s["n_pruned"] for s in trajectory["steps"]] == [1, 2, 3]
    assert all(0 <= s["stability"] <= 100 for s in [trajectory["dense"], *trajectory["steps"]])


def test_unknown_families_get_the_supported_list(tmp_path, tiny_csv, capsys):
    import transformers as tf

    from headprune.cli import main
    from headprune.errors import UnsupportedArchitecture

    small = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    funnel = dict(vocab_size=64, d_model=16, n_head=2, d_head=8, d_inner=32, block_sizes=[1, 1])
    for model in (tf.FunnelForSequenceClassification(tf.FunnelConfig(**funnel)),
                  tf.FNetForSequenceClassification(tf.FNetConfig(**{k: v for k, v in small.items()
                                                                   if k != "num_attention_heads"}))):
        with pytest.raises(UnsupportedArchitecture, match="Supported families: .*deberta-v2.*modernbert"):
            adapt(model)
    folder = tmp_path / "funnel"
    tf.FunnelForSequenceClassification(tf.FunnelConfig(**funnel)).save_pretrained(folder)
    offline_tokenizer("unigram", CORPUS * 3).save_pretrained(folder)
    assert main(["evaluate", "--model", str(folder), "--data", tiny_csv]) != 0
    err = capsys.readouterr().err
    assert "model type 'funnel'" in err and "deberta-v2 (DeBERTa-v2/v3" in err and "modernbert (ModernBERT" in err


@pytest.mark.parametrize("arch", MODERN_ARCHS)
def test_parameters_left_equals_surgery(arch):
    """The live parameter count (trajectories, Prune page) counts DeBERTa's position projections and the fused
    Wqkv like surgery does."""
    from headprune.model.sizes import parameters_left

    model = tiny_modern(arch)
    mask = random_mask(adapt(model).grid_shape, seed=9)
    assert parameters_left(model, mask) == parameter_counts(prune_model(model, mask))["total"]["params"]
