"""Decoders with grouped-query attention: gating == surgery for every GQA case, run-from-layer-l == full forward for
every layer and family, capture == eager attention, save -> load, honest parameter counts, clear errors."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from headprune.errors import MaskError, UnsupportedArchitecture
from headprune.model.arch import adapt
from headprune.model.capture import capture_attention
from headprune.model.gating import gate_heads
from headprune.model.layers import record_layer_inputs, start_at_layer
from headprune.model.mask import HeadMask
from headprune.model.sizes import layout_report, parameter_counts
from headprune.model.surgery import prune_model
from headprune.testing import ARCHS, DECODER_ARCHS, random_batch, random_decoder_batch, tiny_decoder, tiny_model

ATTN = ("sdpa", "eager")


def _mask_cases(arch: str) -> dict[str, HeadMask]:
    """Masks over a 4 x 8 grid with groups of 4 query heads (GPT-2: every head its own group)."""
    shape = (4, 8)
    g = torch.Generator().manual_seed(3)
    random_values = (torch.rand(shape, generator=g) > 0.5).float()
    random_values[0, 0] = 1.0  # keep the grid from being empty by chance
    cases = {
        "random": HeadMask(random_values),
        "whole groups": HeadMask.from_pruned({0: [0, 1, 2, 3], 2: [4, 5, 6, 7]}, shape),
        "equal per group": HeadMask.from_pruned({1: [0, 1, 4, 5], 3: [3, 7]}, shape),
        "uneven": HeadMask.from_pruned({0: [0], 1: [1, 2, 3, 4], 3: [5, 6]}, shape),
        "whole layer": HeadMask.from_pruned({1: list(range(8))}, shape),
        "whole model": HeadMask(torch.zeros(shape)),
    }
    return cases


def _out(model, batch):
    return model(**batch).logits


@pytest.mark.parametrize("attn", ATTN)
@pytest.mark.parametrize("head", ["lm", "cls"])
@pytest.mark.parametrize("arch", DECODER_ARCHS)
def test_gating_equals_surgery_for_every_gqa_case(arch, head, attn, one_thread):
    model = tiny_decoder(arch, head, attn_implementation=attn)
    batch = random_decoder_batch()
    real = batch["attention_mask"].bool()
    for name, mask in _mask_cases(arch).items():
        with torch.no_grad(), gate_heads(model, mask):
            gated = _out(model, batch)
        cut = prune_model(model, mask)
        with torch.no_grad():
            pruned = _out(cut, batch)
        if head == "lm":  # padded positions of an LM are never read
            gated, pruned = gated[real], pruned[real]
        assert torch.allclose(gated, pruned, atol=1e-5), (name, (gated - pruned).abs().max())
        assert adapt(cut).live_grid().equal(mask.keep_bool()), name


def test_surgery_layouts_follow_the_documented_gqa_strategy():
    model = tiny_decoder("llama")
    cases = _mask_cases("llama")
    whole = layout_report(prune_model(model, cases["whole groups"]))
    assert (whole[0]["query_heads"], whole[0]["kv_heads"], whole[0]["kv_copies"]) == (4, 1, 0)
    equal = layout_report(prune_model(model, cases["equal per group"]))
    assert (equal[1]["query_heads"], equal[1]["kv_heads"], equal[1]["kv_copies"]) == (4, 2, 0)
    uneven = prune_model(model, cases["uneven"])
    report = layout_report(uneven)
    # layer 1 keeps head 0 of group 0 and heads 5-7 of group 1: gcd(1, 3) = 1, so group 1's K/V is held 3 times
    assert (report[1]["query_heads"], report[1]["kv_heads"], report[1]["kv_copies"]) == (4, 4, 2)
    assert adapt(uneven).layer_modules[1].self_attn.num_key_value_groups == 1
    # the stock attention's own count after an equal cut of 2 heads per group
    assert adapt(prune_model(model, cases["equal per group"])).layer_modules[1].self_attn.num_key_value_groups == 2


def test_parameter_counts_are_honest_about_repeated_key_value_rows():
    model = tiny_decoder("llama")
    d, hidden = 8, 64
    before = parameter_counts(model)["attention_qkvo"]["params"]
    uneven = prune_model(model, HeadMask.from_pruned({1: [1, 2, 3, 4]}, (4, 8)))
    after = parameter_counts(uneven)["attention_qkvo"]["params"]
    # layer 1: 4 query heads removed (Q rows and O columns), K/V: 2 heads -> 4 physical heads (group 1 held 3x)
    expected_delta = -4 * d * hidden * 2 + 2 * 2 * d * hidden
    assert after - before == expected_delta


def test_pruned_groups_in_a_mask_file_expand_to_their_query_heads():
    model = tiny_decoder("qwen2")
    adapter = adapt(model)
    mask = HeadMask.from_json({"pruned_groups": {"2": [1]}, "pruned": {"0": [3]}}, adapter.grid_shape,
                              adapter.group_grid())
    assert mask.pruned() == {0: [3], 2: [4, 5, 6, 7]}
    with pytest.raises(MaskError, match="group 2 in layer 0, but that layer has groups 0..1"):
        HeadMask.from_json({"pruned_groups": {"0": [2]}}, adapter.grid_shape, adapter.group_grid())


ENCODERS = tuple(a for a in ARCHS if a != "albert")


@pytest.mark.parametrize("arch", DECODER_ARCHS + ENCODERS)
def test_full_forward_equals_run_from_every_layer(arch, one_thread):
    if arch in DECODER_ARCHS:
        model, batch = tiny_decoder(arch, "cls"), random_decoder_batch()
    else:
        model, batch = tiny_model(arch), random_batch()
        batch = {k: v for k, v in batch.items() if k != "labels"}
    adapter = adapt(model)
    with torch.no_grad(), record_layer_inputs(adapter.layer_modules) as inputs:
        full = model(**batch).logits
    for layer in range(adapter.n_layers):
        with torch.no_grad(), start_at_layer(adapter, layer, inputs[layer]):
            replayed = model(**batch).logits
        assert torch.allclose(full, replayed, atol=1e-6), (arch, layer, (full - replayed).abs().max())
    assert all(not type(m).__name__ == "StandIn" for m in adapter.layer_modules)  # restored


@pytest.mark.parametrize("arch", DECODER_ARCHS)
def test_capture_equals_eager_output_attentions(arch, one_thread):
    model = tiny_decoder(arch, "lm", attn_implementation="eager")
    batch = random_decoder_batch()
    mask = HeadMask.from_pruned({1: [2, 5]}, adapt(model).grid_shape)
    cut = HeadMask.from_pruned({3: [0, 1, 2, 3]}, adapt(model).grid_shape)
    maps = check_capture_against_eager(model, batch, mask, cut)
    assert not maps.live[3, :4].any() and not maps.live[1, [2, 5]].any()
    # causal: nothing above the diagonal
    assert maps.probs[0].triu(1).abs().max() == 0


def check_capture_against_eager(model, batch: dict, mask: HeadMask, cut: HeadMask):
    """Capture on ``model`` cut by ``cut`` and gated by ``mask`` equals the stock eager ``output_attentions`` of the
    uncut model gated by both (padded pairs and dead heads zero); returns the maps. Also used by
    tests/test_fused_families.py."""
    maps = capture_attention(prune_model(model, cut), batch, mask)
    with torch.no_grad(), gate_heads(model, mask & cut):  # the same computation on the uncut model
        reference = model(**batch, output_attentions=True).attentions
    valid = batch["attention_mask"].bool()
    pair = valid[:, None, :, None] & valid[:, None, None, :]
    for layer, probs in enumerate(maps.probs):
        expected = reference[layer] * pair
        expected[:, ~maps.live[layer]] = 0.0
        assert torch.allclose(probs, expected, atol=1e-6), layer
    return maps


@pytest.mark.parametrize("arch", ["llama", "phi3", "gpt2", "gemma3"])
def test_save_and_reload_a_cut_decoder(arch, tmp_path, tiny_tokenizer, one_thread):
    from headprune.model.loading import load_model, save_pruned

    model = tiny_decoder(arch, "lm")
    cut = prune_model(model, _mask_cases(arch)["uneven"])
    save_pruned(cut, tiny_tokenizer, tmp_path)
    loaded = load_model(str(tmp_path), "cpu")
    batch = random_decoder_batch()
    with torch.no_grad():
        assert torch.equal(cut(**batch).logits, loaded.model(**batch).logits)
    assert loaded.adapter.live_grid().equal(adapt(cut).live_grid())
    assert [b.kv_sources for b in loaded.adapter.blocks] == [b.kv_sources for b in adapt(cut).blocks]


def test_surgery_leaves_the_original_decoder_untouched():
    model = tiny_decoder("phi3")
    state = copy.deepcopy(model.state_dict())
    prune_model(model, _mask_cases("phi3")["uneven"])
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())
    assert adapt(model).blocks[0].n_live == 8 and "forward" not in model.model.layers[0].self_attn.__dict__


def test_unknown_families_get_the_supported_list():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                num_heads=4))
    with pytest.raises(UnsupportedArchitecture, match="llama.*gpt2.*bert"):
        adapt(model)


def _head_rows(block, name: str, head: int) -> slice:
    """Output-feature rows of physical head ``head`` of part ``name`` (a kv head for key/value)."""
    start = block.fused_span(name)[0] if block.fused else 0
    return slice(start + head * block.head_size, start + (head + 1) * block.head_size)


@pytest.mark.parametrize("arch", ["llama", "phi3", "gpt2"])
def test_gnorm_on_gqa_and_fused_decoders_matches_batch_size_one_autograd(arch, one_thread):
    """G_Q per query head; G_K, G_V of the key/value head a query head reads (shared by its group)."""
    model = tiny_decoder(arch, "cls")
    batch = random_decoder_batch(batch_size=3)
    batch["labels"] = torch.tensor([0, 2, 1])
    check_gnorm_by_single_examples(model, batch, _head_rows)


def check_gnorm_by_single_examples(model, batch: dict, head_rows) -> None:
    """Gnorm (objective: the logits' norm) on ``batch`` equals the mean over its examples, each run alone and
    unpadded, of the norms of the weight gradient's rows ``head_rows(block, part, physical head)`` (a slice) of each
    head of each part. Also used by tests/test_fused_families.py (interleaved fused layouts)."""
    from headprune.criteria import ScoringContext, get
    from headprune.model.arch import out_axis

    adapter = adapt(model)
    expected = torch.zeros((3, *adapter.grid_shape), dtype=torch.float64)
    for b in range(len(batch["input_ids"])):
        length = int(batch["attention_mask"][b].sum())
        model.zero_grad()
        model(input_ids=batch["input_ids"][b:b + 1, :length]).logits.norm().backward()
        for block in adapter.blocks:
            for i, name in enumerate(("query", "key", "value")):
                module = getattr(block, name)
                grad = module.weight.grad.double()
                grad = grad if out_axis(module) == 0 else grad.T
                for p, h in enumerate(block.kept):
                    head = p if name == "query" else block.kv_of_position()[p]
                    expected[i, block.index, h] += grad[head_rows(block, name, head)].norm()
    expected /= len(batch["input_ids"])
    result = get("gnorm")(ScoringContext(model=model, calib=[batch]), {"objective": "logits_norm"})
    for i, name in enumerate(("G_Q", "G_K", "G_V")):
        torch.testing.assert_close(torch.as_tensor(result.meta[name], dtype=torch.float64), expected[i],
                                   rtol=1e-6, atol=1e-9, msg=name)


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "gpt2"])
def test_live_evaluation_of_a_language_model_equals_full_evaluation(arch, one_thread):
    """Perplexity under random toggles equals a full evaluation; the running estimate ends on the exact value."""
    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import evaluate
    from headprune.model.task import lm_labels

    model = tiny_decoder(arch, "lm")
    batches = []
    for seed in range(4):
        batch = random_decoder_batch(seed=seed)
        batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
        batches.append(batch)
    live = LiveEvaluator(model, batches)
    assert live.metrics().perplexity == pytest.approx(evaluate(model, batches).perplexity, rel=1e-6)
    rng = torch.Generator().manual_seed(5)
    for _ in range(5):
        layer, head = (int(v) for v in (torch.randint(4, (1,), generator=rng), torch.randint(8, (1,), generator=rng)))
        seen = []
        metrics = live.toggle(layer, head, on_estimate=seen.append)
        reference = evaluate(model, batches, live.mask)
        assert metrics.perplexity == pytest.approx(reference.perplexity, rel=1e-5)
        assert metrics.next_token_accuracy == pytest.approx(reference.next_token_accuracy)
        assert seen[-1].exact and seen[-1].value == pytest.approx(metrics.perplexity, rel=1e-9)
    assert live.stats.partial_runs >= 1


def _lm_batches(n: int = 2, batch_size: int = 3):
    from headprune.model.task import lm_labels

    out = []
    for seed in range(n):
        batch = random_decoder_batch(batch_size=batch_size, seed=seed)
        batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
        out.append(batch)
    return out


def test_his_on_a_gqa_language_model_equals_finite_differences_of_the_gate(one_thread):
    """HIS = mean over rows of |∂L_b/∂m_h|, L_b the row-mean next-token loss; checked by central differences."""
    from headprune.criteria import ScoringContext, get
    from headprune.model.task import Task

    model = tiny_decoder("qwen3", "lm").double()
    batches = _lm_batches()
    result = get("his")(ScoringContext(model, batches))
    # eps 1e-3: the rotary tables are float32 even in a float64 model, so smaller steps drown in rounding
    eps, expected = 1e-3, torch.zeros(4, 8, dtype=torch.float64)
    for layer, head in [(0, 1), (2, 5), (3, 7)]:
        for batch in batches:
            for b in range(len(batch["input_ids"])):
                row = {k: v[b:b + 1] for k, v in batch.items()}
                losses = []
                for sign in (1, -1):
                    gates = torch.ones(4, 8, dtype=torch.float64)
                    gates[layer, head] += sign * eps
                    with torch.no_grad(), gate_heads(model, gates):
                        logits = model(input_ids=row["input_ids"], attention_mask=row["attention_mask"]).logits
                    losses.append(Task("lm").per_example_loss(logits, row)[0])
                expected[layer, head] += abs((losses[0] - losses[1]) / (2 * eps))
        assert result.scores[layer, head] == pytest.approx(float(expected[layer, head]) / 6, rel=1e-3)


def test_kl_on_a_language_model_equals_surgery_ablation(one_thread):
    """Raw KL of head (l, h): mean over rows of the mean over real positions of D_KL(p ‖ p without the head)."""
    import torch.nn.functional as F

    from headprune.criteria.kl import kl_raw_importance

    model = tiny_decoder("llama", "lm")
    batches = _lm_batches()
    raw = kl_raw_importance(model, batches)
    for layer, head in [(0, 0), (1, 6), (3, 3)]:
        cut = prune_model(model, HeadMask.from_pruned({layer: [head]}, (4, 8)))
        total, rows = 0.0, 0
        for batch in batches:
            inputs = {k: batch[k] for k in ("input_ids", "attention_mask")}
            with torch.no_grad():
                log_p = F.log_softmax(model(**inputs).logits.double(), -1)
                log_q = F.log_softmax(cut(**inputs).logits.double(), -1)
            kl = (log_p.exp() * (log_p - log_q)).sum(-1)
            real = batch["attention_mask"].bool()
            total += float(((kl * real).sum(-1) / real.sum(-1)).sum())
            rows += len(kl)
        assert raw[layer, head] == pytest.approx(total / rows, rel=1e-4, abs=1e-7)


def test_trajectory_on_a_language_model_reads_perplexity_lower_is_better(one_thread):
    from conftest import trajectory

    model = tiny_decoder("llama", "lm")
    batches = _lm_batches(n=2)
    traj = trajectory(model, batches, batches, "random", step=4, tolerance=0.9, seed=1)
    values = traj.values()
    assert traj.metric == "perplexity" and not traj.higher_is_better
    if traj.stop == "tolerance":  # stopped at the first step whose perplexity exceeds dense / 0.9
        assert values[-1] > values[0] / 0.9 and (values[:-1] <= values[0] / 0.9).all()
    else:
        assert (values <= values[0] / 0.9).all()
    assert traj.tolerance_ratio() == traj.ratios()[len(values) - 2 if traj.stop == "tolerance" else -1]


def test_dependency_arcs_on_a_causal_model_keep_only_heads_that_precede(one_thread):
    """Causal attention: an arc is attendable only when its grammatical head precedes its dependent."""
    from headprune.syntax import build_arcs, load_parser
    from headprune.syntax.parse import parse_texts
    from headprune.testing import offline_tokenizer

    text = "The quick brown fox jumps over the lazy dog."
    tokenizer = offline_tokenizer("byte-level-bpe", [text] * 5)
    model = tiny_decoder("llama", "lm", vocab_size=len(tokenizer))
    arcs = build_arcs(model, tokenizer, text)
    parse = next(iter(parse_texts([text], load_parser(None))))
    all_arcs = [a for a in parse.arcs()]
    assert arcs.causal and arcs.arcs and all(a.head < a.dependent for a in arcs.arcs)
    assert arcs.dropped["future head"] == sum(a.head > a.dependent for a in all_arcs) > 0
    assert np.abs(np.triu(arcs.attention[0, 0], 1)).max() == 0  # nothing attends forward


@pytest.mark.parametrize("arch", ["llama", "phi3", "gpt2", "qwen2"])
def test_parameters_left_equals_the_cut_model(arch):
    """The live count (no cutting) equals the parameters of the surgically pruned model, for every GQA case."""
    from headprune.model.sizes import parameters_left

    model = tiny_decoder(arch, "cls")
    for name, mask in _mask_cases(arch).items():
        cut = prune_model(model, mask)
        assert parameters_left(model, mask) == sum(p.numel() for p in cut.parameters()), name
        again = HeadMask.from_pruned({0: [1, 2]}, mask.shape) & mask
        assert parameters_left(cut, again) == sum(p.numel() for p in prune_model(cut, again).parameters()), name


def test_cut_summary_names_each_gqa_case():
    from headprune.model.sizes import cut_summary

    model = tiny_decoder("llama")
    cases = _mask_cases("llama")
    assert [r["kind"] for r in cut_summary(model, cases["whole groups"])] == ["whole groups", "whole groups"]
    assert [r["kind"] for r in cut_summary(model, cases["equal per group"])] == ["equal per group", "equal per group"]
    uneven = {r["block"]: r for r in cut_summary(model, cases["uneven"])}
    # layer 0 keeps 3 + 4 heads (gcd 1: 7 K/V heads), layer 1 1 + 3 (4), layer 3 4 + 2 (gcd 2: 3 K/V heads)
    assert [(uneven[b]["kind"], uneven[b]["kv_copies"]) for b in (0, 1, 3)] == [("uneven", 5), ("uneven", 2),
                                                                                 ("uneven", 1)]
    assert [r["kind"] for r in cut_summary(tiny_decoder("gpt2"), cases["uneven"])] == ["heads"] * 3


def test_save_pruned_leaves_nothing_half_written(tmp_path):
    from headprune.errors import ModelLoadError
    from headprune.model.loading import save_pruned

    class BrokenTokenizer:
        def save_pretrained(self, folder):
            raise OSError("disk full")

    out = tmp_path / "pruned"
    with pytest.raises(OSError, match="disk full"):
        save_pruned(tiny_decoder("gpt2"), BrokenTokenizer(), out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    (out / "old").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="not an empty folder"):
        save_pruned(tiny_decoder("gpt2"), None, out)


def test_entropy_deficit_and_taylor_on_a_gqa_language_model(one_thread):
    """AE (form A) and AD against hand formulas over each row's causal maps (eager capture, padding cut);
    Taylor equals HIS with the LM loss."""
    from headprune.criteria import ScoringContext, get

    model = tiny_decoder("mistral", "lm", attn_implementation="eager")
    batches = _lm_batches()
    entropy, deficit, n = np.zeros((4, 8)), np.zeros((4, 8)), 0
    for batch in batches:
        maps = capture_attention(model, batch)
        for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
            for layer, probs in enumerate(maps.probs):
                a = probs[b, :, :length, :length].double()
                rows = -torch.special.xlogy(a, a).sum(-1)            # (H, t): entropy of each causal row
                entropy[layer] += (rows.sum(-1) / length).numpy()
                deficit[layer] += (1 - rows.sum(-1) / (length * math.log(max(length, 2)))).numpy()
            n += 1
    ctx = ScoringContext(model, batches)
    np.testing.assert_allclose(get("ae")(ctx, {"form": "A"}).scores, -entropy / n, rtol=1e-5)
    np.testing.assert_allclose(get("ad")(ctx).scores, -deficit / n, rtol=1e-5)
    np.testing.assert_allclose(get("taylor")(ctx).scores, get("his")(ctx).scores, rtol=1e-4)


def test_gnorm_on_a_language_model_defaults_to_the_lm_loss(one_thread):
    from headprune.criteria import ScoringContext, get

    model, batches = tiny_decoder("llama", "lm"), _lm_batches()
    default = get("gnorm")(ScoringContext(model, batches))
    explicit = get("gnorm")(ScoringContext(model, batches), {"objective": "loss"})
    assert default.params["objective"] == "loss"
    np.testing.assert_allclose(default.scores, explicit.scores)
    norm = get("gnorm")(ScoringContext(model, batches), {"objective": "logits_norm"})
    assert not np.allclose(norm.scores, default.scores)
    classifier = tiny_decoder("llama", "cls")
    batch = dict(random_decoder_batch(), labels=torch.tensor([0, 1, 2, 0]))
    assert get("gnorm")(ScoringContext(classifier, [batch])).params["objective"] == "logits_norm"


def test_core_replay_is_on_for_decoders_and_exact(one_thread):
    """The toggled layer restarts at O of its cached context; toggles still equal a full evaluation."""
    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import evaluate

    model, batches = tiny_decoder("phi3", "lm"), _lm_batches()
    live = LiveEvaluator(model, batches)
    assert live._core_replay and "core replay" in live.fast_path_note
    for layer, head in [(2, 1), (2, 6), (0, 3), (2, 1)]:  # repeated toggles in one layer reuse its cached context
        got = live.toggle(layer, head)
        assert got.perplexity == pytest.approx(evaluate(model, batches, live.mask).perplexity, rel=1e-5)
    off = LiveEvaluator(model, batches, fast_paths=False)
    assert not off._core_replay


def _hand_lm_row_stats(model, batches, mask) -> torch.Tensor:
    """Per-row [Σ next-token loss, targets, correct] of the dense gated forward, from its full float64 log-softmax."""
    rows = []
    with torch.no_grad(), gate_heads(model, mask):
        for batch in batches:
            logp = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.double()
            logp = logp.log_softmax(-1)
            for r in range(len(logp)):
                loss = tokens = correct = 0.0
                for t in range(logp.shape[1] - 1):
                    y = int(batch["labels"][r, t + 1])
                    if y != -100:
                        loss, tokens = loss - float(logp[r, t, y]), tokens + 1
                        correct += float(int(logp[r, t].argmax()) == y)
                rows.append([loss, tokens, correct])
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_chunked_lm_head_with_the_layer_cache_equals_a_dense_gated_evaluation(arch, one_thread):
    """Live toggles on an LM (layer cache + core replay + the head run on real targets only, in chunks) give the
    per-row losses of a plain forward with the heads gated, computed here by hand."""
    from headprune.evaluation.live import LiveEvaluator

    model, batches = tiny_decoder(arch, "lm"), _lm_batches()
    live = LiveEvaluator(model, batches)
    assert live.chunked_head and live._core_replay
    for layer, head in [(2, 1), (0, 3), (3, 5), (2, 1)]:
        live.toggle(layer, head)
        torch.testing.assert_close(live.logits, _hand_lm_row_stats(model, batches, live.mask), rtol=1e-5, atol=1e-5)


def test_lm_row_stats_chunked_equals_the_dense_stats_in_any_chunk_and_on_a_kept_tail():
    from headprune.model.task import lm_row_stats, lm_row_stats_chunked

    torch.manual_seed(0)
    head = torch.nn.Linear(8, 120)
    hidden, batch = torch.randn(3, 12, 8), _lm_batches(1)[0]
    for chunk in (1, 5, 1000):
        for tail in (12, 4):  # a forward with logits_to_keep gives the last positions only
            got = lm_row_stats_chunked(hidden[:, -tail:], head, batch["labels"], chunk=chunk)
            torch.testing.assert_close(got, lm_row_stats(head(hidden[:, -tail:]), batch["labels"]),
                                       rtol=1e-6, atol=1e-6)


def test_chunked_lm_head_switches_itself_off_when_the_model_changes_the_logits_after_its_head(one_thread):
    """Gemma-style final soft-capping is applied to whatever the head returns: the start-up check sees it."""
    from transformers import AutoModelForCausalLM

    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import evaluate
    from headprune.testing import tiny_decoder_config

    config = tiny_decoder_config("gemma3")
    config.final_logit_softcapping = 0.5
    torch.manual_seed(0)
    model, batches = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval(), _lm_batches()
    live = LiveEvaluator(model, batches)
    assert not live.chunked_head and "chunked LM head off" in live.fast_path_note
    got = live.toggle(1, 2)
    assert got.perplexity == pytest.approx(evaluate(model, batches, live.mask).perplexity, rel=1e-5)
