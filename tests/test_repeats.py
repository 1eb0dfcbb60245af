"""Repeats: re-drawn calibration rows (hashes differ, evaluation rows fixed) and re-seeded criteria, mean ± sd per
step; the random baseline's independent masks at each rate; the band in the plot."""

import hashlib
import json

import numpy as np
import pytest

from headprune.cli import main
from headprune.criteria import get
from headprune.data import TextDataset, content_hash, redraw_calibration, split_calib_eval
from headprune.trajectory import Trajectory, TrajectoryError, TrajectorySpec, read_run_file, spread


def _rows(n=50):
    return TextDataset([f"text {i}" for i in range(n)], labels=[i % 2 for i in range(n)], source="rows")


def test_content_hash_is_sha256_of_the_rows_in_order():
    ds = _rows(3)
    rows = [hashlib.sha256(json.dumps([t, None, y]).encode()).hexdigest() for t, y in zip(ds.texts, ds.labels)]
    by_hand = hashlib.sha256("".join(rows).encode()).hexdigest()
    assert content_hash(ds) == by_hand
    assert content_hash(ds.subset([0, 1])) != content_hash(ds.subset([0, 2])) != content_hash(ds.subset([2, 0]))


def test_redrawn_calibration_keeps_evaluation_rows_out_and_differs_per_repeat():
    ds = _rows()
    _, evals = split_calib_eval(ds, 10, 20, seed=4)
    taken = [ds.texts.index(t) for t in evals.texts]
    draws = [redraw_calibration(ds, 10, 4, r, taken) for r in range(1, 5)]
    assert len({content_hash(d) for d in draws}) == 4 and all(len(d) == 10 for d in draws)
    assert all(not set(d.texts) & set(evals.texts) for d in draws)
    assert content_hash(redraw_calibration(ds, 10, 4, 3, taken)) == content_hash(draws[2])      # seeded
    with pytest.raises(Exception, match="does not fit"):
        redraw_calibration(ds, 40, 4, 1, taken)


def _run(argv, capsys):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


def test_trajectory_repeats_redraw_calibration_and_report_mean_and_sd(tiny_model_dir, tiny_csv, tmp_path, capsys):
    out = tmp_path / "run.json"
    rc, result, _ = _run(["trajectory", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "ae",
                          "--calib-size", 8, "--eval-size", 30, "--step", 3, "--repeats", 3, "--out", out], capsys)
    assert rc == 0 and result["repeats"] == 3 and len(result["runs"]) == 3
    runs = [Trajectory.from_json(r) for r in result["runs"]]
    hashes = [r.data["calib_hash"] for r in runs]
    assert len(set(hashes)) == 3 and result["summary"]["calib_hashes"] == hashes
    assert [r.seed for r in runs] == [0, 1, 2] and [r.repeat for r in runs] == [0, 1, 2]
    assert len({tuple(map(tuple, r.order())) for r in runs}) > 1        # other rows, other orders
    # mean and sample sd per step, for every metric of the set, against numpy over the runs
    for metric in ("accuracy", "f1", "mcc"):
        values = np.stack([r.values(metric) for r in runs])
        assert result["summary"]["metrics"][metric]["mean"] == pytest.approx(values.mean(0).tolist())
        assert result["summary"]["metrics"][metric]["sd"] == pytest.approx(values.std(0, ddof=1).tolist())
    assert runs[0].metric_set == ["accuracy", "f1", "macro_f1", "mcc"] and runs[0].metric == "accuracy"
    assert result["spread"]["band"] is True
    # the dense point is measured on the same evaluation rows every time
    assert len({r.dense["accuracy"] for r in runs}) == 1 and result["summary"]["sd"][0] == 0
    trajs, spreads = read_run_file(out.read_bytes(), "run.json")
    assert len(trajs) == 3 and spreads[0]["band"] and spreads[0]["name"] == "ae (3 runs)"


def test_seeds_and_repeats_are_exclusive_and_checked_first(tiny_model_dir, tiny_csv, capsys):
    rc, _, err = _run(["trajectory", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "random",
                       "--seeds", 2, "--repeats", 2], capsys)
    assert rc == 2 and err.startswith("error: Choose --seeds")
    rc, _, err = _run(["trajectory", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "ae",
                       "--repeats", 0], capsys)
    assert rc == 2 and err.startswith("error: --repeats 0")


def test_random_baseline_draws_independent_masks_at_each_rate(tiny_model_dir, tiny_csv, tmp_path, capsys):
    rc, result, _ = _run(["trajectory", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "random",
                          "--calib-size", 8, "--eval-size", 30, "--step", 2, "--repeats", 4], capsys)
    assert rc == 0 and result["spread"]["band"] is False
    runs = [Trajectory.from_json(r) for r in result["runs"]]
    nested = 0
    for run in runs:
        masks = [run.mask_at(i) for i in range(len(run.steps) + 1)]
        assert [m.n_pruned for m in masks] == [0, 2, 4, 6, 8, 10, 12]
        nested += all(bool((masks[i + 1].values <= masks[i].values).all()) for i in range(len(masks) - 1))
        # each draw is a fresh seeded choice of that many heads (seed sequence (seed, step))
        rng = np.random.default_rng((run.seed, 0))
        assert sorted(map(tuple, run.steps[0]["pruned"])) == sorted(
            divmod(int(i), 4) for i in rng.choice(12, 2, replace=False))
    assert nested < len(runs)             # the prefixes of one order would always be nested
    box = result["spread"]
    values = np.stack([r.values() for r in runs])
    assert box["median"] == pytest.approx(np.median(values, 0).tolist())


def test_independent_draws_are_the_random_baseline_only():
    with pytest.raises(TrajectoryError, match="random baseline"):
        TrajectorySpec(criterion=get("ae"), independent=True)


def test_the_plot_draws_a_band_for_repeats():
    viz = pytest.importorskip("headprune.viz")
    runs = []
    for shift in (0.0, 0.1, 0.2):
        t = Trajectory("his", {}, False, 1, 0, [1, 2], "head", "accuracy", {"accuracy": 0.9 - shift, "ratio": 0.0})
        t.steps = [{"removed": [[0, 0]], "ratio": 0.5, "metrics": {"accuracy": 0.8 - shift}},
                   {"removed": [[0, 1]], "ratio": 1.0, "metrics": {"accuracy": 0.5 - shift}}]
        runs.append(t)
    band = {**spread(runs, band=True), "name": "his (3 runs)"}
    fig = viz.trajectory_figure([], [band])
    fill = next(tr for tr in fig.data if tr.fill == "toself")
    mean, sd = np.array([0.8, 0.7, 0.4]), np.array([0.1, 0.1, 0.1])
    assert np.allclose(fill.y, np.concatenate([mean + sd, (mean - sd)[::-1]]))
    assert np.allclose(next(tr for tr in fig.data if tr.name == "his (3 runs) mean").y, mean)
    assert not any(tr.type == "box" for tr in fig.data)


def test_trajectories_page_picks_a_metric_and_opens_a_step_on_prune():
    from app_support import figures, open_app, problems, run_trajectories, small_env

    with small_env():
        at = open_app("trajectories")
        run_trajectories(at)
        assert not problems(at)
        assert at.selectbox(key="traj-metric").options[:2] == ["accuracy", "f1"]
        at.selectbox(key="traj-metric").set_value("mcc").run()
        fig = figures(at)[0]
        assert "mcc" in fig["layout"]["yaxis"]["title"]["text"] and any(t["type"] == "box" for t in fig["data"])
        at.selectbox(key="traj-open-run").set_value(0).run()
        at.select_slider(key="traj-open-step").set_value(2).run()
        at.button(key="traj-open").click().run()
        assert not problems(at)
        sd = at.session_state["hp_session"]
        assert sd.mask.n_pruned == 24 and sd.mask == sd.trajectories[0].mask_at(2)
        assert at.slider(key="prune-ratio") is not None          # now on the Prune page


def test_prune_page_applies_sap_at_a_sparsity_with_its_best_k():
    """Prune page, criterion SAP at 25 %: the session mask is SAP's own selection at that sparsity (best k)."""
    pytest.importorskip("spacy")
    from app_support import open_app, problems, prune_lowest, small_env, workspace

    with small_env():
        at = open_app("prune")
        at.selectbox(key="prune-crit").set_value("sap").run()
        prune_lowest(at, 25)
        assert not problems(at)
        sd = at.session_state["hp_session"]
        ws = workspace(at)
        ctx = ws.scoring_context(None)
        expected = get("sap").per_sparsity(ctx, [0.25])[0.25]   # chosen on ctx.selection, as the page does
        assert sd.mask == expected.mask and sd.mask.n_pruned == 18
