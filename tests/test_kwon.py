"""Kwon et al. 2022 (criteria/kwon.py): the Fisher of the head masks against per-row autograd with explicit mask
multiplication, the head-budget search and the rearrangement greedy against hand cases, mask tuning against its own
objective measured independently (hooks on full forwards) and against numpy's least squares, tuned (real-valued)
masks through JSON, surgery and the masked export loaded by a process that never imports headprune, and the budget's
limits."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from test_stock_export import LOADER, louder

from headprune.cli import main
from headprune.criteria import get
from headprune.criteria.kwon import (
    LayerFit,
    diagonal,
    fisher_information,
    kept_count,
    rearrange_layer,
    search,
    tune_masks,
)
from headprune.errors import CriterionError, MaskError
from headprune.model.arch import adapt
from headprune.model.export import export_model
from headprune.model.gating import gate_heads
from headprune.model.hooks import attached, post_hook, pre_hook
from headprune.model.layers import input_of
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.protocol.cells import mask_at, scored_params
from headprune.scoring import ScoreMap, ScoringContext
from headprune.testing import random_batch, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model():
    return louder(tiny_model("bert"))


@pytest.fixture(scope="module")
def batches():
    return [random_batch(seed=s) for s in range(3)]


def test_fisher_equals_per_row_autograd_of_an_explicit_mask(model, batches):
    """I = (1/n) Σ_rows g gᵀ per layer, g = ∂L_row/∂m by autograd on one row at a time through gate_heads with a
    ones mask that requires grad; the diagonal is Σ g² / n."""
    g = _row_grads(model, batches)                                     # (rows, L, H)
    expected = torch.einsum("nlh,nlk->lhk", g, g).numpy() / len(g)
    got = fisher_information(ScoringContext(model, batches))
    assert np.abs(expected).max() > 1e-6
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-10)
    np.testing.assert_allclose(diagonal(got), (g ** 2).mean(0).numpy(), rtol=1e-4, atol=1e-10)


def test_search_keeps_the_largest_diagonal_fisher_heads():
    diag = np.array([[0.5, 0.1, 0.9], [0.3, 0.8, 0.2]])
    live = np.ones_like(diag, bool)
    live[0, 2] = False                                                  # already pruned: never kept
    assert kept_count(0.5, 6) == 3
    np.testing.assert_array_equal(search(diag, live, 3), [[True, False, False], [True, True, False]])


def test_rearrangement_swaps_to_the_pair_whose_gradients_cancel():
    """Prune 2 of 3 heads. The two lowest diagonals (heads 0, 1) have correlated gradients: 1ᵀI1 = 1 + 2 + 2·1.5 = 6;
    heads 0 and 2 cancel: 1 + 3 − 2·1.9 = 0.2. The greedy adds head 2 to {0, 1} and drops the head whose removal leaves
    the least: head 1 (0.2) against head 0 (5) or head 2 (6)."""
    block = np.array([[1.0, 1.5, -1.9], [1.5, 2.0, 0.0], [-1.9, 0.0, 3.0]])
    keep = np.array([False, False, True])
    np.testing.assert_array_equal(rearrange_layer(block, keep, np.ones(3, bool)), [False, True, False])
    # nothing to choose: all kept or all pruned stays
    np.testing.assert_array_equal(rearrange_layer(block, np.ones(3, bool), np.ones(3, bool)), np.ones(3, bool))


def test_rearrangement_never_raises_the_block_fisher_loss_and_keeps_counts(model, batches):
    ctx = ScoringContext(model, batches)
    scores = get("kwon")(ctx, {"budget": 0.5, "tune": False})
    fisher = np.array(scores.meta["fisher_blocks"])
    searched = HeadMask.from_json(scores.meta["searched_mask"], scores.shape).keep_bool().numpy()
    kept = HeadMask.from_json(scores.meta["kwon_mask"], scores.shape).keep_bool().numpy()
    np.testing.assert_array_equal(searched.sum(1), kept.sum(1))
    def loss(block, k):
        idx = np.flatnonzero(~k)
        return block[np.ix_(idx, idx)].sum()

    for block, k, s in zip(fisher, kept, searched):
        assert loss(block, k) <= loss(block, s) + 1e-12
    # the ScoreMap's order reproduces the final mask at sparsity 1 - budget
    np.testing.assert_array_equal(scores.kept_at(0.5), kept)


def _sublayer_errors(model, batches, mask: HeadMask) -> list[float]:
    """Per layer Σ ‖(O out + layer input)_pruned − (same)_dense‖² over real tokens, from two full forwards."""
    adapter = adapt(model)

    def record(gates):
        seen = {}

        def on_input(module, args, kwargs, _i):
            seen.setdefault(("x", _i), input_of(args, kwargs))

        def on_output(module, args, kwargs, out, _i):
            seen.setdefault(("o", _i), out)

        hooks = []
        for i, block in enumerate(adapter.blocks):
            hooks.append(pre_hook(adapter.layer_modules[i], lambda m, a, k, _i=i: on_input(m, a, k, _i), "x"))
            hooks.append(post_hook(block.output, lambda m, a, k, o, _i=i: on_output(m, a, k, o, _i), "o"))
        out = []
        for batch in batches:
            seen.clear()
            with torch.no_grad(), gate_heads(model, gates), attached(hooks):
                model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            real = batch["attention_mask"].bool()
            out.append([(seen[("o", i)] + seen[("x", i)])[real].double() for i in range(len(adapter.blocks))])
        return out

    dense, pruned = record(None), record(mask)
    return [sum(float((p[i] - d[i]).square().sum()) for p, d in zip(pruned, dense)) for i in range(len(dense[0]))]


def test_tuning_lowers_the_reconstruction_error_it_minimises(model, batches):
    keep = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.float32)
    mask = HeadMask(keep)
    tuning = tune_masks(model, batches, mask, damp=0.0)
    tuned = mask.with_scales(tuning.scales)
    assert tuned.is_scaled and tuning.stopped_at is None
    drops = []
    for layer in range(3):
        untuned_here = tuning.scales.clone()
        untuned_here[layer:] = 1.0                   # layers below tuned, this one not: the error before its solve
        before = _sublayer_errors(model, batches, mask.with_scales(untuned_here))[layer]
        after = _sublayer_errors(model, batches, mask.with_scales(
            torch.where(torch.arange(3)[:, None] <= layer, tuning.scales, torch.ones(1))))[layer]
        assert after < before, (layer, before, after)
        drops.append(1 - after / before)
        # the errors the tuning reports are the ones measured here, relative to ‖B‖²
        ratio = tuning.error_after[layer] / tuning.error_before[layer]
        assert ratio == pytest.approx(after / before, rel=1e-4)
    assert max(drops) > 0.01, drops


def test_tuning_solves_the_least_squares_numpy_solves():
    """With no damping the layer's scales are numpy's least-squares solution of A s ≈ B."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(50, 3, 7))                                  # tokens x kept heads x hidden
    b = rng.normal(size=(50, 7))
    fit = LayerFit([0, 1, 2], torch.from_numpy(np.einsum("nkd,njd->kj", a, a)),
                   torch.from_numpy(np.einsum("nkd,nd->k", a, b)), float((b ** 2).sum()))
    flat = a.transpose(0, 2, 1).reshape(-1, 3)
    expected = np.linalg.lstsq(flat, b.reshape(-1), rcond=None)[0]
    np.testing.assert_allclose(fit.solve(0.0).numpy(), expected, rtol=1e-8)
    assert fit.error(fit.solve(0.0)) == pytest.approx(float(((flat @ expected - b.reshape(-1)) ** 2).sum()))
    # damping pulls the scales towards 1
    assert np.abs(fit.solve(100.0).numpy() - 1).max() < np.abs(expected - 1).max()


@pytest.fixture(scope="module")
def tuned(model, batches):
    scores = get("kwon")(ScoringContext(model, batches), {"budget": 0.6, "damp": 0.0})
    return scores, HeadMask.from_json(scores.meta["kwon_mask"], scores.shape)


def test_tuned_mask_round_trips_through_json_and_old_files_still_load(tuned, tmp_path):
    scores, mask = tuned
    assert mask.is_scaled and mask.n_kept == kept_count(0.6, 12)
    path = tmp_path / "mask.json"
    mask.save(path)
    again = HeadMask.load(path, mask.shape)
    assert again == mask and torch.equal(again.gates, mask.gates)
    old = {"pruned": {"0": [1]}, "shape": [3, 4]}
    assert not HeadMask.from_json(old, (3, 4)).is_scaled
    with pytest.raises(MaskError, match=r"names head \(0, 1\), which the mask prunes"):
        HeadMask.from_json({**old, "scales": {"0": {"1": 2.0}}}, (3, 4))
    with pytest.raises(MaskError, match="finite number"):
        HeadMask.from_json({**old, "scales": {"0": {"2": "x"}}}, (3, 4))


def test_surgery_and_the_masked_export_keep_the_scales(model, tuned, tmp_path):
    """The cut model and the masked export (loaded by a process that never imports headprune) give the gated
    model's logits, and those differ from the untuned mask's: the scales are really there."""
    _, mask = tuned
    batch = random_batch(seed=9)
    batch.pop("labels")
    with torch.no_grad():
        with gate_heads(model, mask):
            gated = model(**batch).logits
        with gate_heads(model, mask.with_scales(None)):
            binary = model(**batch).logits
        cut = prune_model(model, mask)(**batch).logits
    assert (gated - binary).abs().max() > 1e-4
    assert (cut - gated).abs().max() <= 1e-5
    folder = export_model(model, None, mask, tmp_path / "masked", format="masked")["out"]
    reference = tmp_path / "reference.safetensors"
    save_file({**{k: v.contiguous() for k, v in batch.items()}, "logits": gated.contiguous()}, str(reference))
    job = [{"name": "tuned", "folder": folder, "head": "cls", "reference": str(reference)}]
    proc = subprocess.run([sys.executable, "-c", LOADER, json.dumps(job)], capture_output=True, text=True,
                          cwd=str(tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["headprune imported"] is False
    assert report["tuned"]["problems"] == {} and report["tuned"]["diff"] <= 1e-5


@pytest.mark.parametrize("budget", [0, -0.1, 1.5, float("nan")])
def test_a_budget_outside_0_1_is_an_error_naming_it(budget):
    with pytest.raises(CriterionError, match=r"budget=.*must (lie|be a finite number) in \(0, 1\]"):
        get("kwon").resolve_params({"budget": budget})


def test_cli_refuses_a_bad_budget_before_loading(capsys):
    rc = main(["score", "--model", "no/such-model", "--criterion", "kwon", "--param", "budget=0"])
    err = capsys.readouterr().err
    assert rc == 2 and "error:" in err and "budget=0" in err and "(0, 1]" in err


def test_a_protocol_cell_scores_budget_1_minus_s_and_evaluates_the_tuned_mask(tuned):
    scores, mask = tuned
    assert scored_params(get("kwon"), {}, 0.25) == {"budget": 0.75}
    assert scored_params(get("kwon"), {"budget": 0.3}, 0.25) == {"budget": 0.3}    # the protocol fixed it
    got, dropped = mask_at(scores, 0.4)
    assert got == mask and got.is_scaled and dropped == []
    other, _ = mask_at(scores, 0.5)                                  # another level: the order's binary mask
    assert not other.is_scaled and other.n_pruned == 6


def test_mask_command_reads_the_tuned_mask_at_its_sparsity(tuned, tmp_path, capsys):
    scores, mask = tuned
    path = tmp_path / "kwon.json"
    path.write_text(json.dumps(ScoreMap.to_json(scores)))
    assert main(["mask", "--scores", str(path), "--sparsity", "0.4"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert HeadMask.from_json(obj, mask.shape) == mask and obj["scales"]
    assert main(["mask", "--scores", str(path), "--sparsity", "0.5"]) == 2
    assert "budget 0.6" in capsys.readouterr().err


def test_the_mask_grid_shows_scaled_heads_as_such():
    pytest.importorskip("plotly")
    from headprune import viz

    scales = torch.ones(3, 4)
    scales[0, 0], scales[1, 2] = 1.5, -0.25
    mask = HeadMask(torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.float32), scales)
    fig = viz.mask_figure(mask)
    def values(name):
        return [str(t) for trace in fig.data if getattr(trace, name, None) is not None
                for t in np.ravel(np.asarray(getattr(trace, name), dtype=object))]

    hovers, texts = " ".join(values("hovertext") + values("customdata") + values("hovertemplate")), values("text")
    assert "scaled ×1.5" in hovers and "scaled ×-0.25" in hovers and hovers.count("scaled ×") == 2
    assert "×1.50" in texts and "×-0.25" in texts


# -- the reference code's choices (fisher_batch, teacher, skip_first_layer, bias_column) against today's ---------

def _row_grads(model, batches) -> torch.Tensor:
    """(rows, L, H): each row's ∂L/∂m by autograd through an explicit ones mask, rows in calibration order."""
    adapter = adapt(model)
    grads = []
    for batch in batches:
        for r in range(len(batch["input_ids"])):
            m = torch.ones(adapter.grid_shape, requires_grad=True)
            with gate_heads(model, m):
                logits = model(input_ids=batch["input_ids"][r:r + 1],
                               attention_mask=batch["attention_mask"][r:r + 1]).logits
            grads.append(torch.autograd.grad(F.cross_entropy(logits, batch["labels"][r:r + 1]), m)[0].double())
    return torch.stack(grads)


@pytest.mark.parametrize("size", [1, 3, 5, 32])
def test_per_batch_fisher_squares_each_mini_batchs_mean_gradient(model, batches, size):
    """The reference's Fisher (fisher.py: per batch, the gradient of the batch's mean loss, squared and summed) by
    hand: rows in calibration order cut into batches of ``size`` (across the calibration batches' seams; the last
    one shorter), each batch's mean gradient ḡ, Σ ḡ ḡᵀ per layer / rows. size 1 is eq. 6 per example."""
    g = _row_grads(model, batches)
    expected = sum(torch.einsum("lh,lk->lhk", g[i:i + size].mean(0), g[i:i + size].mean(0))
                   for i in range(0, len(g), size)) / len(g)
    got = fisher_information(ScoringContext(model, batches), batch=size)
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-12)
    if size > 1:   # cancelling gradients: per-batch and per-example Fishers differ (they may choose other heads)
        assert not np.allclose(got, fisher_information(ScoringContext(model, batches)), rtol=1e-3)


def test_the_bias_column_solves_the_least_squares_numpy_solves_with_a_constant():
    """With the bias column the scales are the first k of numpy's solution of [A, 1] x ≈ B (1 at every entry)."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(40, 3, 5))
    b = rng.normal(size=(40, 5)) + 0.7                               # an offset only the constant can take
    aug = np.concatenate([a, np.ones((40, 1, 5))], 1)
    fit = LayerFit([0, 1, 2], torch.from_numpy(np.einsum("nkd,njd->kj", aug, aug)),
                   torch.from_numpy(np.einsum("nkd,nd->k", aug, b)), float((b ** 2).sum()), bias=True)
    flat = aug.transpose(0, 2, 1).reshape(-1, 4)
    expected = np.linalg.lstsq(flat, b.reshape(-1), rcond=None)[0]
    np.testing.assert_allclose(fit.solve(0.0).numpy(), expected[:3], rtol=1e-8)
    assert abs(expected[3]) > 0.3                                      # the constant was used, then dropped
    # the error is the heads' columns alone: ‖A s − B‖² without the constant
    s = expected[:3]
    heads_only = a.transpose(0, 2, 1).reshape(-1, 3)
    assert fit.error(fit.solve(0.0)) == pytest.approx(float(((heads_only @ s - b.reshape(-1)) ** 2).sum()))


TODAY = {"fisher_batch": 1, "teacher": "dense", "skip_first_layer": False, "bias_column": False}


def test_kwon_runs_the_references_choices_by_default_and_todays_on_request(model, batches):
    """Both settings on the tiny model, each step against an independent computation: the search on the Fisher by
    hand (per-batch of 32 for the reference, per row today), the teacher the search at budget^(1/2), layer 0 left at
    scale 1 by the reference, and each run's scales those tune_masks gives for that teacher and those options."""
    budget = 0.6
    g = _row_grads(model, batches)
    n = len(g)
    fishers = {"reference": sum(torch.einsum("lh,lk->lhk", g[i:i + 32].mean(0), g[i:i + 32].mean(0))
                                for i in range(0, n, 32)) / n,
               "today": torch.einsum("nlh,nlk->lhk", g, g) / n}
    live = np.ones(adapt(model).grid_shape, bool)
    for name, params in (("reference", {}), ("today", TODAY)):
        scores = get("kwon")(ScoringContext(model, batches), {"budget": budget, "damp": 0.0, **params})
        diag = diagonal(fishers[name].numpy())
        searched = HeadMask.from_json(scores.meta["searched_mask"], scores.shape).keep_bool().numpy()
        np.testing.assert_array_equal(searched, search(diag, live, kept_count(budget, live.size)))
        kept = HeadMask(torch.from_numpy(HeadMask.from_json(scores.meta["kwon_mask"], scores.shape)
                                         .keep_bool().numpy()).float())
        teacher = HeadMask(torch.from_numpy(search(diag, live, kept_count(budget ** 0.5, live.size))).float()) \
            if name == "reference" else None
        expected = tune_masks(model, batches, kept, teacher, damp=0.0, skip_first=name == "reference",
                              bias=name == "reference")
        got = HeadMask.from_json(scores.meta["kwon_mask"], scores.shape)
        np.testing.assert_allclose(got.gates.numpy(), kept.with_scales(expected.scales).gates.numpy(), rtol=1e-5)
        if name == "reference":   # layer 0 is never tuned (today it is, towards the dense model)
            assert bool(torch.all(expected.scales[0][kept.keep_bool()[0]] == 1.0))
        else:
            assert expected.scales[1:].ne(1).any()


@pytest.mark.parametrize("params, found", [({"fisher_batch": 0}, "fisher_batch"), ({"fisher_batch": 2.5}, "int"),
                                           ({"teacher": "half"}, "partial, dense"),
                                           ({"bias_column": "maybe"}, "bool")])
def test_bad_reference_choices_are_errors_naming_them(params, found):
    with pytest.raises(CriterionError, match=found):
        get("kwon").resolve_params(params)
