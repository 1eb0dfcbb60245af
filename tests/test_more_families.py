"""What each issue-47 family needs beyond the generic paths of tests/test_support_table.py (gated = cut, criteria,
exports, KV plans): OLMo 2's cut that keeps Q/K rows for its norm over all heads (and why a plain slice would be
wrong), gpt-oss's sinks, Longformer's banded maps, capture against each model's own eager attentions, running from
a layer, live evaluation, parameter counts; and the refusals: Nystromformer's Nyström approximation, remote code,
heads that do not divide the hidden size, weights that do not fit the config -- each an ``error:`` before work.

Tiny random models: ``headprune.testing.tiny_more`` (3 layers, 4 heads of 8 features; OLMo 2 and gpt-oss with 2
key/value groups).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from headprune.model.arch import adapt
from headprune.model.capture import capture_attention
from headprune.model.gating import gate_heads
from headprune.model.mask import HeadMask
from headprune.model.sizes import parameter_counts, parameters_left
from headprune.model.surgery import prune_model
from headprune.testing import MORE_DECODERS, MORE_ENCODERS, left_padded, random_batch, random_decoder_batch, tiny_more

ARCHS = MORE_DECODERS + MORE_ENCODERS
pytestmark = pytest.mark.usefixtures("one_thread")


def inputs(arch: str, seed: int = 0) -> dict:
    if arch in MORE_DECODERS:
        return left_padded(random_decoder_batch(seed=seed))
    return {k: v for k, v in random_batch(seed=seed).items() if k != "labels"}


def logits(model, batch, mask=None) -> torch.Tensor:
    with torch.no_grad(), gate_heads(model, mask):
        out = model(**batch).logits
    return out[batch["attention_mask"].bool()] if out.ndim == 3 else out


def mask_for(model, seed: int = 3) -> HeadMask:
    shape = adapt(model).grid_shape
    values = (torch.rand(shape, generator=torch.Generator().manual_seed(seed)) > 0.5).float()
    values[0, 0] = 1.0
    return HeadMask(values)


# -- OLMo 2: a norm over all heads ------------------------------------------------------------------------------

def test_olmo2_cut_keeps_q_k_rows_for_the_norm_and_is_exact():
    """The decision of arch/causal.py, proved: the cut holds every head's Q/K rows (and the whole norms), cuts V
    rows and O columns, and equals the gated model; parameters_left counts exactly that."""
    model = tiny_more("olmo2")
    mask = HeadMask.from_pruned({0: [1], 1: [0, 1], 2: [0, 2, 3]}, (3, 4))   # uneven, a whole group, mixed
    cut = prune_model(model, mask)
    core, original = adapt(cut).blocks[2].core, adapt(model).blocks[2].core
    assert torch.equal(core.q_proj.weight, original.q_proj.weight) and torch.equal(core.k_norm.weight,
                                                                                    original.k_norm.weight)
    assert core.v_proj.out_features == 8 and core.o_proj.in_features == 8   # 1 query head of group 0 left
    assert torch.equal(core.o_proj.weight, original.o_proj.weight[:, 8:16])
    batch = inputs("olmo2")
    assert (logits(model, batch, mask) - logits(cut, batch)).abs().max() <= 1e-5
    assert parameters_left(model, mask) == parameter_counts(cut)["total"]["params"]


def test_olmo2_a_plain_slice_of_q_and_k_would_not_be_exact():
    """Why Q/K rows stay. Cut group 1 (heads 2, 3) of layer 1 the way other families are cut -- Q, K, V rows, the
    norm weights and O columns sliced, the stock forward left as it is -- and the RMS norms then run over the kept
    heads' features only: every kept head's queries and keys change, and so does the output. headprune's cut of
    the same mask equals the gated model."""
    model = tiny_more("olmo2")
    mask = HeadMask.from_pruned({1: [2, 3]}, (3, 4))
    naive = prune_model(model, HeadMask.ones((3, 4)))   # an untouched copy, sliced by hand below
    core = naive.model.layers[1].self_attn
    q, kv = list(range(16)), list(range(8))             # heads 0, 1 and their group 0 (8 features a head)

    def keep(module, rows=None, columns=None):
        weight = module.weight.detach()
        weight = weight[rows] if rows is not None else weight
        module.weight = torch.nn.Parameter(weight[:, columns] if columns is not None else weight)

    for module, rows in ((core.q_proj, q), (core.q_norm, q), (core.k_proj, kv), (core.k_norm, kv),
                         (core.v_proj, kv)):
        keep(module, rows)
    keep(core.o_proj, columns=q)
    batch = inputs("olmo2")
    gated = logits(model, batch, mask)
    assert (logits(naive, batch) - gated).abs().max() > 1e-3
    assert (logits(prune_model(model, mask), batch) - gated).abs().max() <= 1e-5


def test_olmo2_masked_export_leaves_q_and_k_rows():
    from headprune.model.export import masked_model

    model = tiny_more("olmo2")
    mask = HeadMask.from_pruned({0: [0, 1]}, (3, 4))   # group 0 whole: its K rows would be dead elsewhere
    stock = masked_model(model, mask)
    for name in ("q_proj", "k_proj"):
        assert torch.equal(getattr(stock.model.layers[0].self_attn, name).weight,
                           getattr(model.model.layers[0].self_attn, name).weight), name
    assert stock.model.layers[0].self_attn.v_proj.weight[:8].abs().max() == 0
    batch = inputs("olmo2")
    assert (logits(model, batch, mask) - logits(stock, batch)).abs().max() <= 1e-5


# -- per-family specifics ---------------------------------------------------------------------------------------

def test_gpt_oss_sinks_go_with_their_heads_and_layers_are_marked():
    model = tiny_more("gpt-oss")
    adapter = adapt(model)
    assert adapter.layer_kinds == ["sliding", "full", "sliding"]
    cut = prune_model(model, HeadMask.from_pruned({1: [0, 3]}, (3, 4)))
    assert torch.equal(adapt(cut).blocks[1].core.sinks, adapter.blocks[1].core.sinks[[1, 2]])


def test_gpt_neo_marks_local_layers():
    assert adapt(tiny_more("gpt-neo")).layer_kinds == ["full", "sliding", "full"]


def test_nystromformer_convolution_is_cut_by_groups():
    model = tiny_more("nystromformer")
    cut = prune_model(model, HeadMask.from_pruned({0: [1, 2]}, (3, 4)))
    conv = adapt(cut).blocks[0].core.conv
    assert (conv.groups, conv.in_channels, conv.out_channels) == (2, 2, 2)
    assert torch.equal(conv.weight, adapt(model).blocks[0].core.conv.weight[[0, 3]])


@pytest.mark.parametrize("arch", ARCHS)
def test_parameters_left_equals_the_cut(arch):
    model = tiny_more(arch)
    mask = mask_for(model)
    assert parameters_left(model, mask) == parameter_counts(prune_model(model, mask))["total"]["params"]


# -- attention maps -------------------------------------------------------------------------------------------

STANDARD_MAPS = tuple(a for a in ARCHS if a != "longformer")


@pytest.mark.parametrize("arch", STANDARD_MAPS)
def test_capture_equals_the_cut_models_own_eager_attentions(arch):
    """capture_attention under a mask == output_attentions of the cut model (its kept heads), zero elsewhere."""
    model = tiny_more(arch)
    mask = mask_for(model, seed=5)
    batch = inputs(arch, seed=2)
    maps = capture_attention(model, batch, mask)
    cut = prune_model(model, mask)
    emptied = HeadMask(torch.cat([torch.zeros(1, 4), torch.ones(2, 4)]))   # a cut model with a block left empty
    assert not capture_attention(prune_model(model, emptied), batch).probs[0].any()
    with torch.no_grad():
        reference = cut(**batch, output_attentions=True).attentions
    valid = batch["attention_mask"].bool()
    pair = (valid[:, None, :, None] & valid[:, None, None, :]).float()
    for block, probs in zip(adapt(cut).blocks, maps.probs):
        if block.kept:
            assert (probs[:, block.kept] - reference[block.index].float() * pair).abs().max() <= 1e-5, block.index
        assert not probs[:, [h for h in range(4) if h not in block.kept]].any()
    last = adapt(cut).blocks[-1]
    rows = maps.probs[-1][:, last.kept].sum(-1).transpose(1, 2)[valid]
    if arch == "gpt-oss":   # each head's sink takes its share of the softmax: real rows sum to less than 1
        assert rows.max() <= 1 + 1e-6 and rows.min() < 0.99
    elif last.kept:
        assert (rows - 1).abs().max() <= 1e-5


def test_longformer_maps_reproduce_each_heads_context():
    """An independent check of the banded -> (T x T) assembly: for every token that is not global, the head's
    context is its map row times the values (local and global keys alike use ``value``); the global token's row
    (position 0) attends with ``value_global``. Rows sum to 1; the window (4 keys) really limits local rows."""
    from headprune.model.capture import crop, record_attention
    from headprune.model.hooks import attached, post_hook

    model = tiny_more("longformer")
    batch = {k: v for k, v in random_batch(seq_len=12, seed=4).items() if k != "labels"}
    adapter = adapt(model)
    seen = {}

    def grab(block):
        def keep(module, args, kwargs, out):
            seen[block.index] = (args[0] if args else kwargs["hidden_states"], out[0])
        return post_hook(block.core, keep, f"test: input and context of block {block.index}")

    with torch.no_grad(), attached(grab(b) for b in adapter.blocks), record_attention(model, adapter) as records:
        model(**batch)
    maps = {i: crop(w, batch["input_ids"].shape[1]) for i, w in records}
    valid = batch["attention_mask"].bool()
    t = valid.shape[1]
    for block in adapter.blocks:
        hidden, context = seen[block.index]
        value, value_global = block.core.value(hidden), block.core.value_global(hidden)
        probs = maps[block.index]
        for h in range(4):
            d = slice(8 * h, 8 * (h + 1))
            expected = torch.einsum("bij,bjd->bid", probs[:, h], value[:, :t, d])
            expected[:, 0] = torch.einsum("bj,bjd->bd", probs[:, h, 0], value_global[:, :t, d])
            got = context[:, :t, d]
            assert (got - expected)[valid].abs().max() <= 1e-5, (block.index, h)
        assert (probs.sum(-1).transpose(1, 2)[valid] - 1).abs().max() <= 1e-5
        far = probs[:, :, 5:, 1:3]   # tokens 5.. see keys 1-2 only through the window (w = 2 each side): never
        assert not far.any()
    empty = prune_model(model, HeadMask(torch.cat([torch.ones(1, 4), torch.zeros(1, 4), torch.ones(1, 4)])))
    assert not capture_attention(empty, batch).probs[1].any()   # a layer cut to no heads: its maps are zero


def test_taylor_on_longformer_is_refused_before_its_weights_load(tmp_path, capsys):
    """The family's refusal comes from the config alone: the folder's weight file is not even valid."""
    from headprune.cli import main
    from headprune.testing import offline_tokenizer

    folder = tmp_path / "longformer"
    tiny_more("longformer", vocab_size=320).save_pretrained(folder)
    offline_tokenizer("byte-level-bpe", ["some words here and there"] * 3).save_pretrained(folder)
    (folder / "model.safetensors").write_bytes(b"not weights")
    out = tmp_path / "scores.json"
    capsys.readouterr()
    assert main(["score", "--model", str(folder), "--criterion", "taylor", "--data", "demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --criterion taylor cannot run") and "banded" in err and not out.exists()


# -- running from a layer, live evaluation ----------------------------------------------------------------------

@pytest.mark.parametrize("arch", tuple(a for a in ARCHS if a != "xlm"))
def test_run_from_every_layer_equals_the_full_forward(arch):
    from headprune.model.layers import record_layer_inputs, start_at_layer

    model = tiny_more(arch)
    adapter = adapt(model)
    batch = inputs(arch, seed=1)
    mask = mask_for(model, seed=4)
    with torch.no_grad(), gate_heads(model, mask, adapter):
        with record_layer_inputs(adapter.layer_modules) as layer_inputs:
            full = model(**batch).logits
        for layer in range(adapter.n_layers):
            with start_at_layer(adapter, layer, layer_inputs[layer]):
                assert (model(**batch).logits - full).abs().max() <= 1e-5, layer


@pytest.mark.parametrize("arch", ["gptj", "olmo2", "mpnet", "longformer", "xlm"])
def test_live_evaluation_follows_toggles_exactly(arch):
    """LiveEvaluator (replays from the toggled layer; XLM, without per-layer modules, runs whole passes) == a
    plain gated evaluation after every toggle."""
    from headprune.evaluation.live import LiveEvaluator
    from headprune.evaluation.metrics import evaluate
    from headprune.model.task import lm_labels

    model = tiny_more(arch)
    batches = []
    for seed in range(2):
        batch = inputs(arch, seed=10 + seed)
        batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"]) if arch in MORE_DECODERS \
            else torch.tensor([0, 1, 2, 0])
        batches.append(batch)
    live = LiveEvaluator(model, batches)
    assert live.incremental == (arch != "xlm")
    for layer, head in ((2, 1), (0, 3), (2, 1)):
        metrics = live.toggle(layer, head)
        assert metrics.loss == pytest.approx(evaluate(model, batches, live.mask).loss, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("arch", ["gpt-neo", "phi", "mpnet", "longformer"])
def test_kl_from_layer_l_equals_full_passes(arch):
    from headprune.criteria.kl import kl_raw_importance

    model = tiny_more(arch)
    batches = [inputs(arch, seed=30 + i) for i in range(2)]
    mask = HeadMask.ones(adapt(model).grid_shape).prune(1, 2)
    cached = kl_raw_importance(model, batches, mask)
    naive = kl_raw_importance(model, batches, mask, cached=False, ablations_per_pass=1)
    np.testing.assert_allclose(cached, naive, rtol=1e-4, atol=1e-7)
    assert np.isnan(cached[1, 2]) and np.nanmin(cached) > 0


# -- refusals ---------------------------------------------------------------------------------------------------

def test_nystrom_approximation_is_refused_by_name_before_weights_load(tmp_path):
    from headprune.errors import UnsupportedArchitecture
    from headprune.model.loading import load_model
    from headprune.testing import offline_tokenizer, tiny_more_config

    config = tiny_more_config("nystromformer")
    config.num_landmarks = 16   # < segment_means_seq_len 64: the Nyström approximation
    from transformers import NystromformerForSequenceClassification

    with pytest.raises(UnsupportedArchitecture, match="Nyström approximation .* couples|ALL heads"):
        adapt(NystromformerForSequenceClassification(config))
    folder = tmp_path / "nystrom"
    folder.mkdir()
    config.save_pretrained(folder)   # a config and a tokenizer, no weights at all: refused before looking
    offline_tokenizer("byte-level-bpe", ["a few words"] * 3).save_pretrained(folder)
    with pytest.raises(UnsupportedArchitecture, match="num_landmarks 16 < segment_means_seq_len 64"):
        load_model(str(folder), "cpu")


def saved(arch: str, folder, **kw):
    from headprune.testing import offline_tokenizer

    tiny_more(arch, vocab_size=320, **kw).save_pretrained(folder)
    offline_tokenizer("byte-level-bpe", ["some words here and there"] * 3).save_pretrained(folder)
    return folder


def mask_file(folder) -> str:
    path = folder / "mask.json"
    path.write_text(json.dumps({"pruned": {"0": [1]}}))
    return str(path)


def refused(argv: list[str], capsys, before_loading: bool = True) -> str:
    """stderr of a CLI run that must fail with an ``error:`` line -- its first line when nothing was loaded."""
    from headprune.cli import main

    capsys.readouterr()   # what saving the folder printed
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") if before_loading else "\nerror: " in err, err
    return err


@pytest.mark.parametrize("how", ["auto_map", "python file"])
def test_remote_code_models_are_refused_and_nothing_is_written(how, tmp_path, capsys):
    folder = saved("opt", tmp_path / "remote")
    if how == "auto_map":
        config = json.loads((folder / "config.json").read_text())
        config["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"}
        (folder / "config.json").write_text(json.dumps(config))
    else:
        (folder / "modeling_custom.py").write_text("raise SystemExit('this must never run')\n")
    out = tmp_path / "cut"
    err = refused(["prune", "--model", folder, "--mask", mask_file(tmp_path), "--out", out], capsys)
    assert "remote-code model" in err and "runs no code from a user's files" in err and "opt (OPT)" in err
    assert not out.exists()
    err = refused(["score", "--model", folder, "--criterion", "random", "--data", "demo"], capsys)
    assert "remote-code model" in err


@pytest.mark.parametrize("arch", ["gptj", "opt", "phi", "olmo2", "mpnet", "xlm"])
def test_heads_that_do_not_divide_the_hidden_size_are_refused_before_work(arch, tmp_path, capsys):
    folder = saved(arch, tmp_path / arch)
    config = json.loads((folder / "config.json").read_text())
    for key in ("num_attention_heads", "n_head", "n_heads", "num_heads"):
        if key in config:
            config[key] = 5   # hidden size 32
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "cut"
    err = refused(["prune", "--model", folder, "--mask", mask_file(tmp_path), "--out", out], capsys)
    assert "hidden size 32 is not a multiple of its 5 attention heads" in err and not out.exists()


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_weights_that_do_not_fit_the_config_are_refused(weights, tmp_path, capsys):
    """safetensors: read from the file's header, before any weight loads; a .bin has no header, so transformers'
    own size check is turned into the same error line."""
    folder = saved("phi", tmp_path / "phi")
    other = tiny_more("phi", vocab_size=320, n_heads=2)   # hidden 16: every tensor a different shape
    (folder / "model.safetensors").unlink()
    if weights.endswith("tensors"):
        other.save_pretrained(tmp_path / "other")
        (folder / weights).write_bytes((tmp_path / "other" / weights).read_bytes())
    else:
        torch.save(other.state_dict(), folder / weights)
    out = tmp_path / "cut"
    err = refused(["prune", "--model", folder, "--mask", mask_file(tmp_path), "--out", out], capsys,
                  before_loading=weights.endswith("tensors"))
    assert "do not match its config.json" in err and not out.exists()
    if weights.endswith("tensors"):
        assert "[16]" in err and "[32]" in err


@pytest.mark.parametrize("arch", ARCHS)
def test_roles_report_on_every_family(arch):
    """Every probe and statistic role of every live head is scored through the captured maps: finite where a head
    is live, NaN where the mask gated it off (the syntactic role needs more parsed arcs than two short texts give,
    NaN then on any family, Llama's included)."""
    from headprune.roles.report import head_roles
    from headprune.testing import offline_tokenizer

    texts = ["The cat sat on the mat while the dogs ran far away.", "I laughed, didn't I?"]
    tokenizer = offline_tokenizer("byte-level-bpe", texts * 3)
    model = tiny_more(arch, vocab_size=320)
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    mask = HeadMask.ones(adapt(model).grid_shape).prune(1, 2)
    report = head_roles(model, tokenizer, [{"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}],
                        texts=texts, mask=mask)
    scores = np.stack([np.asarray(v.scores, dtype=float) for k, v in report.scores.items() if k != "syntactic"])
    assert len(scores) == len(report.scores) - 1 >= 6
    assert np.isnan(scores[:, 1, 2]).all()
    live = np.ones(scores.shape[1:], dtype=bool)
    live[1, 2] = False
    assert np.isfinite(scores[:, live]).all()
