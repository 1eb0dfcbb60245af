"""Issue 47's fused-Q/K/V and ALiBi families: GPT-NeoX (Pythia), BLOOM, Falcon (new grouped, old multi-query, old
multi-head with ALiBi, new with ALiBi), MPT (ALiBi, clip_qkv) and DeBERTa v1 (headprune.testing.tiny_fused).

What every family's support-table row claims (every criterion, every export format loaded back, KV plan or refusal:
tests/test_support_table.py, on one tiny model per family) is run there; here, what is specific to these layouts,
on every variant (Falcon's four): gated == cut exactly on an uneven mask, a whole layer, whole key/value groups and
an uneven cut inside groups, on a left-padded batch (decoders), in float32, eager and sdpa; a cut in two steps ==
the cut at once (the layouts re-laid at new counts); the rows of each head against the family's own view of its
fused output; each kept ALiBi head keeps its own slope (a hand formula from the paper's slopes); capture == the
stock eager probabilities; run from layer l == the full forward; live evaluation follows toggles exactly; Gnorm ==
batch-size-one autograd; a saved cut reloads; KV plans apply to GPT-NeoX (mixed cache == restricted full cache)
and are refused by name for the others, by the CLI before weights load; bad input (heads that do not divide the
hidden size, a fused Q/K/V of another width, a checkpoint whose weights do not fit its config) is an ``error:``
line before work, with nothing written.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from headprune.errors import ModelLoadError, UnsupportedArchitecture
from headprune.kvcache.plan import KVPlan, KVPlanError, check_decoder
from headprune.model.arch import adapt
from headprune.model.capture import capture_attention
from headprune.model.gating import gate_heads
from headprune.model.layers import record_layer_inputs, start_at_layer
from headprune.model.mask import HeadMask
from headprune.model.sizes import parameters_left
from headprune.model.surgery import prune_model
from headprune.model.task import lm_labels
from headprune.testing import (
    FUSED_ARCHS,
    FUSED_DECODERS,
    random_batch,
    random_decoder_batch,
    tiny_fused,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SDPA = ("gpt-neox", "falcon", "falcon-mq", "falcon-alibi", "falcon-new-alibi")   # the rest have eager only
CASES = [(arch, attn) for arch in FUSED_ARCHS for attn in ("eager", "sdpa") if attn == "eager" or arch in SDPA]
ATOL = 1e-5


def batch_of(arch: str, seed: int = 0) -> dict:
    """Decoders: a left-padded batch (the flipped right-padded one: pads first); DeBERTa: right padding, pad id 1."""
    if arch not in FUSED_DECODERS:
        return {k: v for k, v in random_batch(seed=seed).items() if k != "labels"}
    return {k: v.flip(1) for k, v in random_decoder_batch(seed=seed).items()}


def logits(model, batch, mask=None) -> torch.Tensor:
    with torch.no_grad(), gate_heads(model, mask):
        out = model(**batch).logits
    return out[batch["attention_mask"].bool()] if out.ndim == 3 else out   # an LM's pad positions are never read


def masks(adapter) -> dict[str, HeadMask]:
    shape = adapter.grid_shape
    values = (torch.rand(shape, generator=torch.Generator().manual_seed(7)) > 0.5).float()
    values[0] = torch.tensor([0.0, 1.0, 0.0, 1.0])   # keeps heads 1 and 3 of layer 0 (ALiBi slopes 2 and 4)
    values[2] = torch.tensor([1.0, 1.0, 1.0, 0.0])   # an uneven count per layer
    cases = {"uneven": HeadMask(values), "whole layer": HeadMask.from_pruned({1: [0, 1, 2, 3]}, shape)}
    if 1 < adapter.n_kv_heads < adapter.n_heads:     # Falcon's new architecture: 2 groups of 2 query heads
        cases["whole groups"] = HeadMask.from_pruned({0: [0, 1], 2: [2, 3]}, shape)
        cases["uneven in groups"] = HeadMask.from_pruned({1: [0], 2: [3]}, shape)
    return cases


@pytest.mark.parametrize("arch,attn", CASES)
def test_gated_equals_cut_exactly(arch, attn):
    model = tiny_fused(arch, attn_implementation=attn)
    batch = batch_of(arch)
    adapter = adapt(model)
    assert adapter.family == {"falcon-mq": "falcon", "falcon-alibi": "falcon", "falcon-new-alibi": "falcon"}.get(
        arch, arch)
    dense = logits(model, batch)
    for name, mask in masks(adapter).items():
        gated = logits(model, batch, mask)
        assert (gated - dense).abs().max() > 1e-2, name        # the mask matters: equality below means something
        cut = prune_model(model, mask)
        assert (logits(cut, batch) - gated).abs().max() <= ATOL, name
        assert adapt(cut).live_grid().equal(mask.keep_bool()), name
        assert sum(p.numel() for p in cut.parameters()) == parameters_left(model, mask), name
    # a cut of a cut: the layouts are laid again at the new counts (Falcon's groups shrink from 2 to 1 query head)
    first, second = masks(adapter)["uneven"], HeadMask.from_pruned({2: [0], 0: [3]}, adapter.grid_shape)
    once = prune_model(model, first)
    before = logits(once, batch)
    both = prune_model(once, second)
    assert (logits(both, batch) - logits(model, batch, first & second)).abs().max() <= ATOL
    assert torch.equal(logits(once, batch), before)   # the second cut worked on a copy: the first is untouched


def independent_start(arch: str, part: str, head: int, n_heads: int = 4, n_kv: int = 2, d: int = 8) -> int:
    """First row of physical head ``head`` of ``part`` in the fused module, by the family's own view of its output
    (read from transformers' forwards, not from headprune's description): per head (H, 3, d) for GPT-NeoX, BLOOM,
    DeBERTa v1 and Falcon's old multi-head architecture; per group (H_kv, g + 2, d) for Falcon's new one; Q | K | V
    for MPT and Falcon multi-query."""
    index = ("query", "key", "value").index(part)
    if arch in ("gpt-neox", "bloom", "deberta", "falcon-alibi"):
        return (3 * head + index) * d
    if arch in ("falcon", "falcon-new-alibi"):
        g = n_heads // n_kv
        return ((head // g) * (g + 2) + head % g if part == "query" else head * (g + 2) + g + index - 1) * d
    kv = 1 if arch == "falcon-mq" else n_heads
    return (head if part == "query" else n_heads + (index - 1) * kv + head) * d


def test_the_description_of_rows_matches_each_family_own_view():
    for arch in FUSED_ARCHS:
        block = adapt(tiny_fused(arch)).blocks[0]
        for part in ("query", "key", "value"):
            for head in range(block.n_heads if part == "query" else block.n_kv_heads):
                first = independent_start(arch, part, head)
                assert block.rows(part, [head]) == list(range(first, first + 8)), (arch, part, head)


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Press et al.'s slopes for a power-of-two head count: m_h = 2^(-8 (h + 1) / H)."""
    return torch.tensor([2.0 ** (-8 * (h + 1) / n_heads) for h in range(n_heads)])


@pytest.mark.parametrize("arch", ["bloom", "mpt"])
def test_each_kept_alibi_head_keeps_its_own_slope(arch):
    """Layer 0 of a model cut to heads 1 and 3: each kept head's probabilities are the hand formula
    softmax(q_h k_hᵀ / sqrt(d) + m_h j) with its own slope m_h (not the first two slopes), q_h and k_h read from the
    uncut weights by the family's own row order."""
    model = tiny_fused(arch)
    mask = masks(adapt(model))["uneven"]
    cut = prune_model(model, mask)
    batch = batch_of(arch)
    with torch.no_grad(), record_layer_inputs(adapt(model).layer_modules) as inputs:
        model(**batch)
    layer = adapt(model).layer_modules[0]
    core = adapt(model).blocks[0].core
    d, n = 8, 4
    with torch.no_grad():
        x = (layer.input_layernorm if arch == "bloom" else layer.norm_1)(inputs[0])
        fused = core.query_key_value(x) if arch == "bloom" else core.Wqkv(x).clamp(-0.5, 0.5)   # MPT's clip_qkv
    b, t = x.shape[:2]
    if arch == "bloom":
        qkv = fused.view(b, t, n, 3, d)
        q, k = qkv[..., 0, :], qkv[..., 1, :]
        positions = (batch["attention_mask"].cumsum(-1) - 1) * batch["attention_mask"]   # BLOOM counts real tokens
    else:
        q, k = fused[..., :n * d].view(b, t, n, d), fused[..., n * d:2 * n * d].view(b, t, n, d)
        positions = torch.arange(t).expand(b, t)
    real = batch["attention_mask"].bool()
    allowed = torch.tril(torch.ones(t, t, dtype=torch.bool)) & real[:, None, :]
    probs = capture_attention(cut, batch).probs[0]
    for h in (1, 3):
        scores = torch.einsum("bqd,bkd->bqk", q[:, :, h], k[:, :, h]) / math.sqrt(d)
        scores = scores + alibi_slopes(n)[h] * positions[:, None, :]
        expected = torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1)
        expected = torch.nan_to_num(expected) * real[:, :, None] * real[:, None, :]
        assert (probs[:, h] - expected).abs().max() <= 1e-5, h
    assert not probs[:, [0, 2]].any()


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_capture_equals_the_stock_eager_attentions(arch):
    from test_decoders import check_capture_against_eager

    model = tiny_fused(arch)
    maps = check_capture_against_eager(model, batch_of(arch), HeadMask.from_pruned({1: [2]}, (3, 4)),
                                       HeadMask.from_pruned({2: [0, 1]}, (3, 4)))
    assert not maps.live[2, :2].any() and not maps.live[1, 2]


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_run_from_every_layer_equals_the_full_forward(arch):
    model = prune_model(tiny_fused(arch), HeadMask.from_pruned({1: [1, 2]}, (3, 4)))   # cut cores replay too
    batch = batch_of(arch)
    adapter = adapt(model)
    with torch.no_grad(), record_layer_inputs(adapter.layer_modules) as inputs:
        full = model(**batch).logits
    for layer in range(adapter.n_layers):
        with torch.no_grad(), start_at_layer(adapter, layer, inputs[layer]):
            assert torch.equal(model(**batch).logits, full), layer


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_live_evaluation_follows_toggles_exactly(arch):
    """LiveEvaluator (replays from the changed layer) == a full evaluation under the same mask after every toggle,
    on left-padded LM rows (perplexity) or padded classifier rows (loss)."""
    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import evaluate

    model = tiny_fused(arch)
    batches = []
    for seed in range(2):
        batch = batch_of(arch, seed)
        batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"]) if arch in FUSED_DECODERS else \
            torch.tensor([0, 2, 1, 0])
        batches.append(batch)
    live = LiveEvaluator(model, batches)
    for layer, head in ((2, 1), (0, 3), (1, 0), (2, 1)):
        metrics = live.toggle(layer, head)
        reference = evaluate(model, batches, live.mask)
        assert metrics.loss == pytest.approx(reference.loss, rel=1e-5), (layer, head)
    assert live.stats.partial_runs >= 1


@pytest.mark.parametrize("arch", ["gpt-neox", "falcon", "deberta"])
def test_gnorm_matches_batch_size_one_autograd(arch):
    """G_Q per query head, G_K / G_V of the key/value head it reads, on interleaved fused rows (right padding:
    each example runs alone, unpadded)."""
    from test_decoders import check_gnorm_by_single_examples

    model = tiny_fused(arch, head="cls")
    batch = random_decoder_batch(batch_size=3) if arch != "deberta" else random_batch(batch_size=3)
    batch["labels"] = torch.tensor([0, 2, 1])

    def rows(block, part: str, head: int) -> slice:
        first = independent_start(arch, part, head)
        return slice(first, first + 8)

    check_gnorm_by_single_examples(model, batch, rows)


def test_save_and_reload_a_cut_model(tmp_path, tiny_tokenizer):
    from headprune.model.loading import load_model, save_pruned

    for arch in ("gpt-neox", "falcon", "deberta"):
        model = tiny_fused(arch)
        cut = prune_model(model, masks(adapt(model))["uneven"])
        save_pruned(cut, tiny_tokenizer, tmp_path / arch)
        loaded = load_model(str(tmp_path / arch), "cpu", attn_implementation="eager")
        batch = batch_of(arch)
        state = loaded.model.state_dict()
        assert all(torch.equal(v, state[k]) for k, v in cut.state_dict().items()), arch
        # equal weights; the logits may differ in the last bits (the loaded tensors sit at other memory alignments)
        assert (logits(cut, batch) - logits(loaded.model, batch)).abs().max() <= 1e-6, arch
        assert [b.kv_sources for b in loaded.adapter.blocks] == [b.kv_sources for b in adapt(cut).blocks]


# -- KV plans -----------------------------------------------------------------------------------------------------

def test_gpt_neox_takes_a_kv_plan_exactly():
    """Streaming heads see only sink + window (zero attention outside); the mixed cache generates the restricted
    full cache's tokens; the restriction matters."""
    from headprune.kvcache.cache import generate
    from headprune.kvcache.restrict import restricted

    model = tiny_fused("gpt-neox")
    grid = torch.tensor([[1, 0, 0, 1], [0, 0, 1, 0], [1, 1, 0, 0]], dtype=torch.bool)
    plan = KVPlan(grid, 4, sink=2, window=5)
    prompt = torch.randint(3, 100, (1, 30), generator=torch.Generator().manual_seed(1))
    with restricted(model, plan) as copy:
        ref = generate(copy, prompt, 12, mode="restricted")
        mixed = generate(copy, prompt, 12, mode="mixed")
        maps = capture_attention(copy, {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)})
    assert mixed.tokens == ref.tokens != generate(model, prompt, 12).tokens
    q, k = torch.arange(30)[:, None], torch.arange(30)[None, :]
    outside = (k > q) | ((k >= 2) & (k <= q - 5))
    for layer, row in enumerate(grid):
        for h in torch.nonzero(~row).flatten().tolist():
            assert maps.probs[layer][0, h][outside].abs().max() == 0
            assert maps.probs[layer][0, h][~outside].sum() > 0


@pytest.mark.parametrize("arch", ["bloom", "falcon-mq"])
def test_families_a_plan_cannot_reach_are_refused_by_name(arch, tmp_path, tiny_tokenizer, tiny_csv, capsys,
                                                         monkeypatch):
    """check_decoder names the family and why; the CLI refuses before any weight loads (load_model would fail)."""
    from headprune.cli import main

    model = tiny_fused(arch)
    with pytest.raises(KVPlanError, match="computes attention in its own code"):
        check_decoder(adapt(model))
    model.save_pretrained(tmp_path / arch)
    tiny_tokenizer.save_pretrained(tmp_path / arch)
    capsys.readouterr()
    plan = tmp_path / "plan.json"
    KVPlan.all_full((3, adapt(model).n_kv_heads), 4).write(plan)

    def no_loading(*args, **kwargs):
        raise AssertionError("weights loaded before the refusal")

    import headprune.workspace
    monkeypatch.setattr(headprune.workspace, "load_model", no_loading)
    code = main(["evaluate", "--model", str(tmp_path / arch), "--data", tiny_csv, "--kv-plan", str(plan)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and "cannot take a KV cache plan" in err
    assert ("ALiBi" in err) == arch.endswith(("alibi", "bloom", "mpt"))


# -- bad input ----------------------------------------------------------------------------------------------------

def test_a_fused_qkv_of_another_width_is_refused_by_the_adapter():
    model = tiny_fused("gpt-neox")
    core = model.gpt_neox.layers[1].attention
    core.query_key_value = torch.nn.Linear(32, 80)   # 80 rows: not 3 x 4 heads x 8
    with pytest.raises(ModelLoadError, match="block 1: its fused Q/K/V projection has 80 output features.*need 96"):
        adapt(model)
    mpt = tiny_fused("mpt")
    mpt.config.n_heads = 3   # an in-memory model whose config no longer divides: refused by the adapter itself
    with pytest.raises(ModelLoadError, match="hidden size 32, 3 attention heads"):
        adapt(mpt)


def test_unsupported_configs_of_known_families_are_refused_by_name():
    bloom = tiny_fused("bloom")
    bloom.transformer.h[0].self_attention.pretraining_tp = 2
    bloom.transformer.h[0].self_attention.slow_but_exact = True
    with pytest.raises(UnsupportedArchitecture, match="slow_but_exact"):
        adapt(bloom)
    deberta = tiny_fused("deberta")
    deberta.deberta.encoder.layer[0].attention.self.talking_head = True
    with pytest.raises(UnsupportedArchitecture, match="talking_head"):
        adapt(deberta)


def edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}), encoding="utf-8")


@pytest.mark.parametrize("case", ["heads do not divide (config check)", "heads do not divide (MPT)",
                                  "weights of another shape"])
def test_bad_checkpoints_are_an_error_before_work(case, tmp_path, tiny_tokenizer, capsys):
    """``prune`` on a broken folder: one ``error:`` line naming the problem, exit 2, no output folder written."""
    from headprune.cli import main

    folder = tmp_path / "model"
    arch, build = {"heads do not divide (config check)": ("gpt-neox", {}),   # transformers' own validation
                   "heads do not divide (MPT)": ("mpt", {}),                 # MPT's own config checks nothing
                   "weights of another shape": ("gpt-neox", {"head_dim": 12})}[case]
    tiny_fused(arch, head="cls", num_labels=2, **build).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    capsys.readouterr()
    if case == "weights of another shape":
        edit_config(folder, hidden_size=32)      # the weights were saved at hidden 48
        words = ("do not match its config.json (37 tensor(s): gpt_neox.embed_in.weight is [120, 48] in the "
                 "checkpoint, [120, 32] by the config")
    else:
        edit_config(folder, **({"num_attention_heads": 3} if arch == "gpt-neox" else {"n_heads": 3}))
        words = "not divisible by the number of attention heads" if arch == "gpt-neox" else \
            "hidden size 32 is not a multiple of its 3 attention heads"
    out = tmp_path / "cut"
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}), encoding="utf-8")
    code = main(["prune", "--model", str(folder), "--mask", str(mask), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and words in err, err
    assert "Traceback" not in err and not out.exists()


def test_an_onnx_graph_onnxruntime_cannot_load_is_an_error_with_nothing_written(tmp_path, tiny_tokenizer, capsys):
    """Falcon's ALiBi variant traces to a graph onnxruntime rejects (a complex dtype in its slopes): ``prune --format
    onnx`` says so in one ``error:`` line and writes nothing; the same family's rotary variant exports."""
    from headprune.cli import main
    from headprune.model.onnx_export import runtime_problem

    if runtime_problem():
        pytest.skip(runtime_problem())
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"pruned": {"0": [1]}}), encoding="utf-8")
    for arch, works in (("falcon-alibi", False), ("falcon-mq", True)):
        folder = tmp_path / arch
        tiny_fused(arch).save_pretrained(folder)
        tiny_tokenizer.save_pretrained(folder)
        capsys.readouterr()
        code = main(["prune", "--model", str(folder), "--mask", str(mask), "--format", "onnx",
                     "--out", str(tmp_path / f"{arch}.onnx")])
        err = capsys.readouterr().err
        if works:
            assert code == 0 and (tmp_path / f"{arch}.onnx" / "model.onnx").is_file(), err
        else:
            # after the weights' loading bar: the export is refused once the graph is written, never half-written
            assert code == 2 and "\nerror: onnxruntime cannot load the graph" in err, err
            assert not (tmp_path / f"{arch}.onnx").exists()
