"""`headprune mask`: score file -> mask file (the mask ScoreMap.kept_at gives), SAP's per-sparsity selection with its
best k, and SAP's whole-layer rule travelling with the mask into `evaluate`."""

import json

import numpy as np
import pytest
import torch

from headprune.cli import main
from headprune.criteria.sap import apply_layer_rule
from headprune.data import load_data, make_batches
from headprune.evaluation.metrics import evaluate
from headprune.model.layers import skip_layers
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.scoring import ScoreMap
from headprune.trajectory import Trajectory


def _run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


@pytest.fixture
def score_file(tmp_path):
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(3, 4))
    scores[1, 2] = np.nan                          # already pruned: counts towards the ratio
    scores[2, 0] = scores[0, 1]                    # a tie: broken by (layer, head)
    smap = ScoreMap(scores, "his", {"alpha": 0.3})
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(smap.to_json()))
    return smap, path


def _kept(mask_obj, shape=(3, 4)) -> np.ndarray:
    return HeadMask.from_json(mask_obj, shape).keep_bool().numpy()


@pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("inverse", [False, True])
def test_mask_at_a_ratio_is_kept_at(score_file, ratio, inverse, tmp_path, capsys):
    smap, path = score_file
    out = tmp_path / "mask.json"
    rc, printed, _ = _run(["mask", "--scores", path, "--ratio", ratio, "--out", out]
                          + (["--inverse"] if inverse else []), capsys)
    assert rc == 0
    written = json.loads(out.read_text())
    assert np.array_equal(_kept(written), smap.kept_at(ratio, inverse))
    assert printed["pruned_heads"] == 12 - int(smap.kept_at(ratio, inverse).sum()) == round(ratio * 12) or ratio == 0
    # independent of ScoreMap: sort (score, layer, head) of the live heads; the first round(r N) - 1 go (one is NaN)
    sign = -1 if inverse else 1
    live = sorted((sign * smap.scores[l, h], l, h) for l in range(3) for h in range(4)
                  if not np.isnan(smap.scores[l, h]))
    n_more = max(0, round(ratio * 12) - 1)
    assert {(int(l), int(h)) for l, h in np.argwhere(_kept(written))} == {(l, h) for _, l, h in live[n_more:]}


def test_mask_by_count_equals_the_same_ratio(score_file, tmp_path, capsys):
    smap, path = score_file
    rc, by_count, _ = _run(["mask", "--scores", path, "--count", 6], capsys)
    assert rc == 0 and np.array_equal(_kept(by_count), smap.kept_at(0.5)) and by_count["pruned_heads"] == 6


@pytest.mark.parametrize("argv, message", [
    (["--ratio", "1.5"], "--ratio 1.5"), (["--ratio", "-0.1"], "--ratio -0.1"), ([], "exactly one of"),
    (["--ratio", "0.5", "--count", "3"], "exactly one of"), (["--count", "-1"], "--count -1"),
    (["--count", "13"], "has 12 heads"), (["--sparsity", "0.5"], "this score file is 'his'"),
    (["--sparsity", "0.5", "--inverse"], "--inverse applies")])
def test_bad_mask_arguments(score_file, argv, message, capsys):
    _, path = score_file
    rc, _, err = _run(["mask", "--scores", path, *argv], capsys)
    assert rc == 2 and err.startswith("error: ") and message in err


def test_a_missing_or_broken_score_file_is_refused(tmp_path, capsys):
    rc, _, err = _run(["mask", "--scores", tmp_path / "none.json", "--ratio", 0.5], capsys)
    assert rc == 2 and "no such file" in err
    (tmp_path / "bad.json").write_text("{}")
    rc, _, err = _run(["mask", "--scores", tmp_path / "bad.json", "--ratio", 0.5], capsys)
    assert rc == 2 and "not a headprune score file" in err


def test_sap_layer_rule_travels_with_the_mask(tmp_path, capsys):
    rng = np.random.default_rng(0)
    smap = ScoreMap(rng.normal(size=(3, 4)), "sap", {"layer_threshold": 2, "sparsity": 0.5})
    path = tmp_path / "sap.json"
    path.write_text(json.dumps(smap.to_json()))
    rc, written, _ = _run(["mask", "--scores", path, "--ratio", 0.5], capsys)
    expected, dropped = apply_layer_rule(HeadMask(smap.kept_at(0.5).astype(np.float32)), 2)
    assert rc == 0 and written["dropped_layers"] == dropped and dropped
    assert HeadMask.from_json(written, (3, 4)) == expected


def test_evaluate_applies_the_dropped_layers_of_a_mask(tiny_model_dir, tiny_csv, tmp_path, capsys):
    mask = HeadMask.from_pruned({1: [0, 1, 2, 3], 0: [2]}, (3, 4))
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({**mask.to_json(), "dropped_layers": [1]}))
    rc, out, _ = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--eval-size", "all",
                       "--calib-size", 0, "--mask", path], capsys)
    assert rc == 0 and out["dropped_layers"] == [1]
    loaded = load_model(str(tiny_model_dir), "cpu")
    batches = make_batches(loaded.tokenizer, _aligned(tiny_csv, loaded), 32, 128)
    with skip_layers(loaded.adapter, [1]):
        skipped = evaluate(loaded.model, batches, mask)
    gated = evaluate(loaded.model, batches, mask)
    assert out["loss"] == pytest.approx(skipped.loss, abs=1e-5) and out["loss"] != pytest.approx(gated.loss, abs=1e-5)
    path.write_text(json.dumps({**mask.to_json(), "dropped_layers": [7]}))
    rc, _, err = _run(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, "--mask", path], capsys)
    assert rc == 2 and "dropped_layers" in err


def _aligned(spec, loaded):
    from headprune.data import align_labels

    return align_labels(load_data(str(spec)), loaded.id2label)


def test_score_sap_per_sparsity_then_mask(tiny_model_dir, tiny_csv, tmp_path, capsys):
    """`score --sap-sparsities` keeps each level's own best-k selection; `mask --sparsity` writes it."""
    pytest.importorskip("spacy")
    scores = tmp_path / "sap.json"
    rc, out, err = _run(["score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "sap",
                         "--param", "k_max=2", "--sap-sparsities", "0.25,0.75", "--out", scores], capsys)
    if rc == 2 and "spaCy" in err:
        pytest.skip(err)
    assert rc == 0 and set(out["per_sparsity"]) == {"0.25", "0.75"}
    for level in (0.25, 0.75):
        entry = out["per_sparsity"][str(level)]
        rc, written, _ = _run(["mask", "--scores", scores, "--sparsity", level], capsys)
        assert rc == 0 and written["best_k"] == entry["best_k"] in (1, 2)
        assert HeadMask.from_json(written, (3, 4)) == HeadMask.from_json(entry["mask"], (3, 4))
        assert HeadMask.from_json(written, (3, 4)).n_pruned == round(level * 12)
    rc, _, err = _run(["mask", "--scores", scores, "--sparsity", 0.3], capsys)
    assert rc == 2 and "--sap-sparsities 0.3" in err
    assert torch.equal(HeadMask.from_json(out["sap_mask"], (3, 4)).values,
                       HeadMask.from_json(_run(["mask", "--scores", scores, "--sparsity", 0.5], capsys)[1],
                                          (3, 4)).values)   # the score's own sparsity (default 0.5)


def _saved_masks_and_model_score_as_the_run(model, data, trajectory_args, tmp_path, capsys, fmt="headprune"):
    """Run a trajectory saving masks at 0.25 and at its stop point and the model at the stop point; `evaluate` on
    each mask and on the model must give the run's own numbers at those steps. Returns (run file, result)."""
    run_file, model_dir = tmp_path / "run.json", tmp_path / "pruned"
    rc, result, _ = _run(["trajectory", "--model", model, *data, *trajectory_args, "--save-mask", "0.25,stop",
                          "--prune-out", model_dir, "--format", fmt, "--out", run_file], capsys)
    assert rc == 0
    run = json.loads(run_file.read_text())
    steps = [{"metrics": run["dense"], "n_pruned": 0}] + run["steps"]
    stop = result["pruned_model"]["step"]
    first = Trajectory.from_json(run).point_at_ratio(0.25)
    assert steps[first]["n_pruned"] <= 0.25 * np.prod(run["shape"]) < steps[first + 1]["n_pruned"]
    for point, index in (("0.25", first), ("stop", stop)):
        (path,) = result["masks"][point]
        saved = json.loads(open(path).read())
        assert saved["step"] == index and HeadMask.from_json(saved, tuple(run["shape"])).n_pruned == \
            steps[index]["n_pruned"]
        rc, scored, _ = _run(["evaluate", "--model", model, *data, "--mask", path], capsys)
        assert rc == 0
        for metric in ("accuracy", "f1", "mcc", "macro_f1"):
            assert scored[metric] == pytest.approx(steps[index]["metrics"][metric], abs=1e-9)
        assert scored["loss"] == pytest.approx(steps[index]["metrics"]["loss"], abs=1e-5)
    rc, cut, _ = _run(["evaluate", "--model", model_dir, *data], capsys)
    assert rc == 0 and cut["accuracy"] == pytest.approx(steps[stop]["metrics"]["accuracy"], abs=1e-9)
    assert cut["loss"] == pytest.approx(steps[stop]["metrics"]["loss"], abs=1e-5)
    if fmt == "headprune":
        assert cut["pruned_heads"] == steps[stop]["n_pruned"]
    return run, stop


@pytest.mark.parametrize("fmt", ["headprune", "masked"])
def test_trajectory_masks_and_model_at_the_end_of_a_budget(fmt, tiny_model_dir, tiny_csv, tmp_path, capsys):
    run, stop = _saved_masks_and_model_score_as_the_run(
        tiny_model_dir, ["--data", tiny_csv, "--eval-size", 30, "--seed", 3],
        ["--calib-size", 10, "--criterion", "ae", "--step", 2, "--budget", 0.5], tmp_path, capsys, fmt)
    assert run["stop"] == "budget" and stop == len(run["steps"]) == 3      # Algorithm 1's M: the last step


def test_trajectory_stop_point_is_the_last_step_within_tolerance(demo_model_path, tmp_path, capsys):
    """On the demo, accuracy falls past τ = 0.9 within half the heads: the stop mask and model are the step before.
    The stop reads the selection rows (the share of demo that evaluation and calibration leave), never evaluation."""
    run, stop = _saved_masks_and_model_score_as_the_run(
        "demo", ["--data", "demo", "--eval-size", 60], ["--calib-size", 16, "--criterion", "ae", "--step", 4,
                                                        "--tolerance", 0.9, "--budget", 0.5], tmp_path, capsys)
    accuracy = [run["select_dense"]["accuracy"]] + [s["select_metrics"]["accuracy"] for s in run["steps"]]
    assert run["stop"] == "tolerance" and stop == len(run["steps"]) - 1 > 0
    assert accuracy[-1] < 0.9 * accuracy[0] <= min(accuracy[:stop + 1])


@pytest.mark.parametrize("argv, message", [
    (["--save-mask", "0.3"], "give --out FILE"), (["--save-mask", "1.5", "--out", "x.json"], "'1.5' is neither"),
    (["--save-mask", "half", "--out", "x.json"], "'half' is neither")])
def test_bad_save_mask_is_refused_before_loading(argv, message, tiny_model_dir, tiny_csv, capsys):
    rc, _, err = _run(["trajectory", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "ae", *argv], capsys)
    assert rc == 2 and err.startswith("error: ") and message in err


def test_prune_honours_dtype(tiny_model_dir, tmp_path, capsys):
    """`prune --dtype bf16` cuts the model as loaded in bf16: the saved model is bf16 and computes what gating
    the bf16 model computes."""
    from headprune.model.gating import gate_heads
    from headprune.testing import random_batch

    mask = HeadMask.from_pruned({0: [1, 3], 2: [0]}, (3, 4))
    path = tmp_path / "mask.json"
    path.write_text(json.dumps(mask.to_json()))
    rc, report, _ = _run(["prune", "--model", tiny_model_dir, "--mask", path, "--dtype", "bf16",
                          "--out", tmp_path / "cut"], capsys)
    assert rc == 0 and report["pruned_heads"] == 3
    cut = load_model(str(tmp_path / "cut"), "cpu")
    assert {p.dtype for p in cut.model.parameters()} == {torch.bfloat16}
    full = load_model(str(tiny_model_dir), "cpu", dtype="bf16")
    batch = {k: v for k, v in random_batch(4, 10, vocab_size=full.tokenizer.vocab_size, num_labels=2).items()
             if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        with gate_heads(full.model, mask):
            gated = full.model(**batch).logits.float()
        pruned = cut.model(**batch).logits.float()
        fp32 = load_model(str(tiny_model_dir), "cpu").model
        with gate_heads(fp32, mask):
            reference = fp32(**batch).logits
    assert torch.allclose(pruned, gated, atol=2e-2)              # bf16 rounding only
    assert (pruned - reference).abs().max() > 0                    # really computed in bf16, not fp32
    capsys.readouterr()
    rc, _, err = _run(["prune", "--model", tiny_model_dir, "--mask", path, "--device-map", "nonsense.json",
                       "--out", tmp_path / "cut2"], capsys)
    assert rc == 2 and err.startswith("error: ")


def test_prune_writes_the_dropped_layers_of_a_mask(tiny_model_dir, tiny_csv, tmp_path, capsys):
    """SAP's layer rule in prune: the saved model skips the dropped layer, so it scores what `evaluate --mask`
    (which skips it) scores; stock formats cannot record it and are refused before loading."""
    mask = HeadMask.from_pruned({1: [0, 1, 2, 3], 2: [1]}, (3, 4))
    path = tmp_path / "mask.json"
    path.write_text(json.dumps({**mask.to_json(), "dropped_layers": [1]}))
    data = ["--data", tiny_csv, "--eval-size", "all", "--calib-size", 0]
    rc, report, _ = _run(["prune", "--model", tiny_model_dir, "--mask", path, "--out", tmp_path / "cut"], capsys)
    assert rc == 0 and report["dropped_layers"] == [1] and report["pruned_heads"] == 5
    rc, masked, _ = _run(["evaluate", "--model", tiny_model_dir, "--mask", path, *data], capsys)
    rc2, cut, _ = _run(["evaluate", "--model", tmp_path / "cut", *data], capsys)
    assert rc == rc2 == 0 and cut["accuracy"] == masked["accuracy"]
    assert cut["loss"] == pytest.approx(masked["loss"], abs=1e-5)
    rc, plain, _ = _run(["evaluate", "--model", tiny_model_dir, *data, "--mask", _plain(mask, tmp_path)], capsys)
    assert plain["loss"] != pytest.approx(cut["loss"], abs=1e-5)      # the skip matters: not heads alone
    rc, _, err = _run(["prune", "--model", tiny_model_dir, "--mask", path, "--format", "masked",
                       "--out", tmp_path / "stock"], capsys)
    assert rc == 2 and err.startswith("error: ") and "only --format headprune" in err


def _plain(mask, tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(mask.to_json()))
    return path
