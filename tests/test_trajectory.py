"""Trajectories: orders, re-scoring, stops, summaries, reproducibility, stability, α selection (tiny models)."""

import numpy as np
import pytest
import torch
from conftest import trajectory

from headprune.criteria import ScoringContext, get
from headprune.criteria.hies import select_alpha, wauc
from headprune.evaluation.metrics import evaluate
from headprune.evaluation.stability import agreement, perturb_batches
from headprune.model.arch import adapt
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import random_batch, tiny_model
from headprune.trajectory import Trajectory, TrajectoryError, TrajectorySpec, run_seeds, run_trajectory, spread

pytestmark = pytest.mark.usefixtures("one_thread")


def model(arch="bert", seed=0):
    """A tiny model whose heads matter: peakier attention and larger head outputs than the random init, so
    removing a head changes the others' gradients (the premise of Greedy-Gnorm)."""
    return sharpen(tiny_model(arch, seed=seed))


def sharpen(m):
    """``m`` (in place) with the peakier attention and larger head outputs ``model`` describes."""
    with torch.no_grad():
        for block in adapt(m).blocks:
            for linear, factor in ((block.query, 6), (block.key, 6), (block.value, 8), (block.output, 8)):
                linear.weight.mul_(factor)
    return m


def self_labelled(m, batches):
    """Batches labelled with the model's own predictions: dense accuracy 1, so pruning can only lower it."""
    return [{**b, "labels": m(**{k: v for k, v in b.items() if k != "labels"}).logits.argmax(-1)} for b in batches]


CALIB = [random_batch(batch_size=6, seq_len=10, seed=i) for i in range(2)]
EVAL = [random_batch(batch_size=8, seq_len=10, seed=10 + i) for i in range(2)]


def test_static_order_is_the_score_order_and_inverse_reverses_it():
    m = model()
    order = get("ae")(ScoringContext(m, CALIB)).order()
    forward = trajectory(m, CALIB, EVAL, "ae")
    backward = trajectory(m, CALIB, EVAL, "ae", inverse=True, step=5)
    assert forward.order() == order and len(order) == 12
    assert backward.order() == order[::-1]
    assert [s["n_pruned"] for s in backward.steps] == [5, 10, 12] and backward.stop == "end"


def test_metrics_at_each_step_are_those_of_the_masked_model():
    m = model()
    traj = trajectory(m, CALIB, EVAL, "his", budget=0.25)
    mask = HeadMask.ones((3, 4))
    assert traj.dense["accuracy"] == evaluate(m, EVAL).accuracy
    for step in traj.steps:
        for layer, head in step["removed"]:
            mask = mask.prune(layer, head)
        assert step["metrics"]["loss"] == pytest.approx(evaluate(m, EVAL, mask).loss, abs=1e-5)
        assert step["params"] == sum(p.numel() for p in prune_model(m, mask).parameters())
    assert all(a["seconds"] <= b["seconds"] for a, b in zip(traj.steps, traj.steps[1:]))


def test_greedy_rescoring_differs_from_the_static_order():
    m = model()
    static = trajectory(m, CALIB, EVAL, "gnorm", budget=0.5)
    greedy = trajectory(m, CALIB, EVAL, "greedy-gnorm", budget=0.5)
    assert greedy.order()[0] == static.order()[0]         # same first scoring
    assert greedy.order() != static.order()
    # every greedy choice is the argmin of Gnorm re-scored on the model pruned so far
    mask = HeadMask.ones((3, 4))
    for head in greedy.order():
        assert tuple(head) == get("gnorm")(ScoringContext(m, CALIB, mask)).order()[0]
        mask = mask.prune(*head)


def test_inverse_greedy_prunes_the_argmax_each_time():
    m = model()
    traj = trajectory(m, CALIB, EVAL, "greedy-gnorm", inverse=True, count=3)
    mask = HeadMask.ones((3, 4))
    for head in traj.order():
        assert tuple(head) == get("gnorm")(ScoringContext(m, CALIB, mask)).order(inverse=True)[0]
        mask = mask.prune(*head)
    assert traj.stop == "budget" and len(traj.order()) == 3


def test_random_is_reproducible_under_a_seed_and_varies_across_seeds():
    m = model()
    a = trajectory(m, CALIB, EVAL, "random", seed=3, stability=True)
    b = trajectory(m, CALIB, EVAL, "random", seed=3, stability=True)
    c = trajectory(m, CALIB, EVAL, "random", seed=4)
    assert a.order() == b.order() != c.order()
    assert [s["metrics"] for s in a.steps] == [s["metrics"] for s in b.steps]
    assert [s["stability"] for s in a.steps] == [s["stability"] for s in b.steps]
    runs = run_seeds(TrajectorySpec(criterion=get("random"), budget=0.5, step=2), m, CALIB, EVAL, seeds=3)
    box = spread(runs)
    assert len({tuple(r.order()) for r in runs}) == 3 and box["ratios"] == [0, 2 / 12, 4 / 12, 0.5]
    assert all(lo <= med <= hi for lo, med, hi in zip(box["min"], box["median"], box["max"]))


def test_budget_count_and_tolerance_stops():
    m = model()
    assert trajectory(m, CALIB, EVAL, "ae", budget=0.5, step=5).steps[-1]["n_pruned"] == 6
    assert len(trajectory(m, CALIB, EVAL, "ae", count=2).steps) == 2
    with torch.no_grad():
        evals = self_labelled(m, EVAL)
    traj = trajectory(m, CALIB, evals, "random", tolerance=0.9, seed=1)
    values = traj.values()
    assert values[0] == 1.0 and traj.stop == "tolerance"
    assert values[-1] < 0.9 and (values[1:-1] >= 0.9).all()
    assert traj.tolerance_ratio() == traj.ratios()[-2]


def test_summaries_by_hand():
    steps = [{"ratio": r, "metrics": {"accuracy": a}} for r, a in ((0.25, 0.8), (0.5, 0.4), (0.75, 0.7))]
    traj = Trajectory("x", {}, False, 1, 0, [1, 4], "head", "accuracy", {"accuracy": 0.8}, steps=steps)
    assert traj.auc() == pytest.approx((0.2 + 0.15 + 0.1375) / 0.75)
    assert traj.tolerance_ratio(0.9) == 0.25 and traj.tolerance_ratio(0.6) == 0.25
    assert traj.tolerance_ratio(0.5) == 0.75   # 0.4 is not below 0.5 x 0.8
    weights = np.array([0, 0.25, 0.5, 0.75])
    expected = np.trapezoid(weights * [0.8, 0.8, 0.4, 0.7], weights) / np.trapezoid(weights, weights)
    assert wauc(traj) == pytest.approx(expected)


def test_albert_prunes_tied_heads_and_json_round_trips(tmp_path):
    m = model("albert")
    traj = trajectory(m, CALIB, EVAL, "greedy-gnorm", step=2, model_name="tiny", data_info={"n": 16})
    assert traj.shape == [1, 4] and traj.unit == "tied head (all layers)" and len(traj.steps) == 2
    assert sorted(traj.order()) == [(0, h) for h in range(4)]
    traj.save(tmp_path / "run.json")
    import json

    obj = json.loads((tmp_path / "run.json").read_text())
    back = Trajectory.from_json(obj)
    assert back == traj and obj["summary"]["auc"] == traj.auc() and set(obj["versions"]) >= {"torch", "transformers"}


def test_the_callers_model_is_untouched():
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    trajectory(m, CALIB, EVAL, "greedy-gnorm", count=4)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())
    assert all(b.kept == [0, 1, 2, 3] for b in adapt(m).blocks)


@pytest.mark.parametrize("kwargs, words", [
    ({"budget": 0}, "not a ratio in (0, 1]"), ({"budget": 1.5}, "not a ratio in (0, 1]"),
    ({"step": 0}, "positive integer"), ({"tolerance": 1.2}, "(0, 1]"), ({"count": 0}, "positive integer"),
    ({"metric": "perplexity"}, "accepted: accuracy, macro_f1, mcc"),
    ({"params": {"alpha": 2}}, "or a number in [0, 1]"),
])
def test_bad_trajectory_input(kwargs, words):
    from headprune.errors import HeadpruneError

    criterion = "hies" if "params" in kwargs else "ae"
    with pytest.raises(HeadpruneError) as err:
        trajectory(tiny_model("bert"), CALIB, EVAL, criterion, **kwargs)
    assert words in str(err.value)
    with pytest.raises(TrajectoryError):
        run_seeds(TrajectorySpec(criterion=get("random")), tiny_model("bert"), CALIB, EVAL, seeds=0)


def test_word_level_perturbation_with_a_tokenizer():
    from transformers import AutoTokenizer

    from headprune.demos.classifier import encoder_path

    tok = AutoTokenizer.from_pretrained(encoder_path())
    enc = tok(["a fine and moving film about love", "dull"], ["second segment here", "ok"], padding=True,
              return_tensors="pt")
    batch = {**enc, "labels": torch.tensor([1, 0]), "index": [0, 1]}
    same = perturb_batches([batch], tok, p=0.0)[0]
    assert torch.equal(same["input_ids"], batch["input_ids"]) and same["index"] == [0, 1]
    dropped = perturb_batches([batch], tok, p=0.5, seed=1)[0]
    assert torch.equal(dropped["input_ids"], perturb_batches([batch], tok, p=0.5, seed=1)[0]["input_ids"])
    first = tok.decode(dropped["input_ids"][0], skip_special_tokens=True).split()
    assert 0 < len(first) < 10 and set(first) <= set("a fine and moving film about love second segment here".split())
    assert (dropped["token_type_ids"][0] == 1).any()          # the pair stays a pair


def test_token_level_perturbation_and_agreement():
    batch = random_batch(batch_size=5, seq_len=12, seed=2)
    out = perturb_batches([batch], p=0.5, seed=0)[0]
    lengths, new = batch["attention_mask"].sum(1), out["attention_mask"].sum(1)
    assert (new <= lengths).all() and (new < lengths).any() and torch.equal(out["labels"], batch["labels"])
    for i in range(5):   # first and last real tokens survive
        assert out["input_ids"][i, 0] == batch["input_ids"][i, 0]
        assert out["input_ids"][i, new[i] - 1] == batch["input_ids"][i, lengths[i] - 1]
    assert agreement(torch.tensor([[1.0, 0], [0, 1]]), torch.tensor([[2.0, 0], [1, 0]])) == 50.0


def test_select_alpha_reports_the_best_wauc():
    m = model()
    result = select_alpha(m, CALIB, alphas=(0.0, 1.0), budget=0.5, step=2)
    assert set(result["wauc"]) == {"0.0", "1.0"}
    for run in result["trajectories"]:
        traj = Trajectory.from_json(run)
        assert result["wauc"][str(traj.params["alpha"])] == pytest.approx(wauc(traj))
    assert result["wauc"][str(result["best_alpha"])] == max(result["wauc"].values())
    with pytest.raises(TrajectoryError, match=r"\[0, 1\]"):
        select_alpha(m, CALIB, alphas=(0.5, 1.5))


SELECT = [random_batch(batch_size=8, seq_len=10, seed=20 + i) for i in range(2)]


def _first_degraded(values, tau) -> int | None:
    return next((i for i, v in enumerate(values) if v < tau * values[0]), None)


def test_tolerance_stop_reads_the_selection_rows_when_given():
    """Issue 22: the stop is a choice, made on the selection rows; evaluation is still what every step reports."""
    m = model()
    with torch.no_grad():
        evals, select = self_labelled(m, EVAL), self_labelled(m, SELECT)
    spec = TrajectorySpec(criterion=get("random"), tolerance=0.6, seed=0)
    traj = run_trajectory(spec, m, CALIB, evals, select=select)
    # the selection metric of every saved mask, computed independently
    chosen = [evaluate(m, select, traj.mask_at(i)).accuracy for i in range(len(traj.steps) + 1)]
    assert traj.select_dense["accuracy"] == chosen[0]
    assert [s["select_metrics"]["accuracy"] for s in traj.steps] == pytest.approx(chosen[1:], abs=1e-9)
    assert traj.stop == "tolerance" and _first_degraded(chosen, 0.6) == len(traj.steps)
    # the evaluation rows are still what each step reports, and they alone would have stopped earlier
    assert [s["metrics"]["accuracy"] for s in traj.steps] == \
        pytest.approx([evaluate(m, evals, traj.mask_at(i)).accuracy for i in range(1, len(traj.steps) + 1)])
    assert _first_degraded(traj.values(), 0.6) < len(traj.steps)
    assert traj.stop_index() == len(traj.steps) - 1 and traj.tolerance_ratio() == traj.ratios()[-2]
    # without selection rows: the old rule, on the evaluation metric, and nothing of selection recorded
    plain = run_trajectory(spec, m, CALIB, evals)
    assert plain.select_dense == {} and all("select_metrics" not in s for s in plain.steps)
    assert plain.stop == "tolerance" and _first_degraded(plain.values(), 0.6) == len(plain.steps) < len(traj.steps)
    assert plain.order() == traj.order()[:len(plain.steps)]
    assert plain.stop_index() == len(plain.steps) - 1 and plain.tolerance_ratio() == plain.ratios()[-2]
    # repeats fork one selection evaluator per run: each run's stop is still its own selection rows' reading
    for run in run_seeds(spec, m, CALIB, evals, seeds=2, select=select):
        chosen = [evaluate(m, select, run.mask_at(i)).accuracy for i in range(len(run.steps) + 1)]
        assert [s["select_metrics"]["accuracy"] for s in run.steps] == pytest.approx(chosen[1:], abs=1e-9)
        assert run.stop == "tolerance" and _first_degraded(chosen, 0.6) == len(run.steps)
    # a saved run keeps what the stop read
    again = Trajectory.from_json(traj.to_json())
    assert again.stop_index() == traj.stop_index() and again.tolerance_ratio() == traj.tolerance_ratio()
