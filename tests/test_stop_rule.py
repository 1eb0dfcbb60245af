"""`trajectory --tolerance` with selection rows (issue 22): the stop is decided on the selection rows, every step
records their metrics beside the evaluation ones, and `--save-mask stop` is the last step within the tolerance."""

import json

import pytest
import torch
from conftest import sentences, write_csv
from test_trajectory import sharpen

from headprune.cli import main
from headprune.data import align_labels, load_data, make_batches
from headprune.evaluation.metrics import evaluate, predict
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_thread")

TAU = 0.7


def test_cli_tolerance_stops_on_the_selection_data(tiny_model_dir, tiny_csv, tmp_path, capsys):
    loaded = load_model(str(tiny_model_dir), "cpu")   # the tiny classifier with heads that matter (test_trajectory)
    with torch.no_grad():   # confident answers, so losing a head moves the loss
        sharpen(loaded.model).classifier.weight.mul_(100)
    loaded.model.save_pretrained(tmp_path / "model")
    loaded.tokenizer.save_pretrained(tmp_path / "model")
    # selection rows labelled with the model's own answers: pruning can only make their loss worse
    texts = sentences(24, seed=7)
    rows = lambda labels: [[t, loaded.id2label[int(y)]] for t, y in zip(texts, labels)]   # noqa: E731
    select_csv = write_csv(tmp_path / "select.csv", ["text", "label"], rows([0] * len(texts)))
    batches = make_batches(loaded.tokenizer, align_labels(load_data(select_csv), loaded.id2label), 32, 128)
    select_csv = write_csv(tmp_path / "select.csv", ["text", "label"],
                           rows(predict(loaded.model, batches).argmax(-1)))
    out = tmp_path / "run.json"
    rc = main([str(a) for a in ["trajectory", "--model", tmp_path / "model", "--data", tiny_csv, "--select-data",
                                select_csv, "--select-size", 24, "--eval-size", 30, "--criterion", "random",
                                "--metric", "loss", "--tolerance", TAU, "--seed", 2, "--save-mask", "stop",
                                "--out", out]])
    capsys.readouterr()
    assert rc == 0
    run = Trajectory.from_json(json.loads(out.read_text()))
    assert run.data["roles"]["select"]["source"] == select_csv
    # the selection loss under every recorded mask, computed independently
    batches = make_batches(loaded.tokenizer, align_labels(load_data(select_csv), loaded.id2label), 32, 128)
    losses = [evaluate(loaded.model, batches, run.mask_at(i)).loss for i in range(len(run.steps) + 1)]
    assert run.select_dense["loss"] == pytest.approx(losses[0], abs=1e-5)
    assert [s["select_metrics"]["loss"] for s in run.steps] == pytest.approx(losses[1:], abs=1e-5)
    worse = [i for i, v in enumerate(losses) if v > losses[0] / TAU]
    assert run.stop == "tolerance" and worse[0] == len(run.steps) > 1
    # the evaluation rows alone would not have stopped there: the stop did not read them
    assert not any(v > run.dense["loss"] / TAU for v in run.values("loss"))
    # the evaluation metrics are still what each step reports, and the stop mask is the last step within τ
    assert all("loss" in s["metrics"] and s["metrics"] != s["select_metrics"] for s in run.steps)
    saved = json.loads((tmp_path / "run.mask-stop.json").read_text())
    assert saved["step"] == run.stop_index() == len(run.steps) - 1
    assert HeadMask.from_json(saved, run.shape) == run.mask_at(saved["step"])
