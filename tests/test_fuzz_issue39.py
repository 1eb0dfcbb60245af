"""Hostile and odd inputs of issue 39, by class (the classes of test_fuzz_inputs.py go on here: this module needs
no demo, so it runs while a demo is being built): options and protocol values that were dropped or mis-filed
without a word, and outputs that must not replace a user's file. Each refusal: exit code 2, one ``error:`` line,
no traceback, nothing created or deleted."""

from __future__ import annotations

import pytest
import torch
from test_fuzz_inputs import no_weights  # noqa: F401 - the fixture: a refusal comes before any weights load

from headprune.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _refused(argv, capsys) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert not out and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and len(lines[-1]) > 40
    return lines[-1]


# -- issue 39: options and protocol values that were dropped or mis-filed without a word -----------------------------

PROTOCOL = ('name = "p"\nsparsities = [0.5]\n[data.calib]\nsource = "{csv}"\nsize = 4\n[data.eval]\nsource = "{csv}"\n'
            'size = 4\n[[models]]\nname = "{m1}"\nmodel = "{model}"\n{more_models}{criteria}{paper}')
CRITERION = '[[criteria]]\nname = "random"\nlabel = "{}"\n'


def _protocol(tmp_path, model, csv, labels=("r",), models=("m",), paper="") -> str:
    more = "".join(f'[[models]]\nname = "{m}"\nmodel = "{model}"\n' for m in models[1:])
    text = PROTOCOL.format(csv=csv, m1=models[0], model=model, more_models=more,
                           criteria="".join(CRITERION.format(label) for label in labels), paper=paper)
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("labels, models", [
    (("rand a", "rand-a"), ("m",)), (("rand/a", "rand a"), ("m",)), (("Rand", "rand"), ("m",)),
    (("r",), ("model one", "model-one")), (("r",), ("M1", "m1")),
])
@pytest.mark.usefixtures("no_weights")
def test_two_names_that_become_one_file_name_are_refused(labels, models, tmp_path, tiny_model_dir, tiny_csv, capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv, labels, models)
    line = _refused(["run", path, "--out", tmp_path / "out"], capsys)
    assert "name the same result files" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_a_paper_value_that_is_not_a_finite_number_is_refused(value, tmp_path, tiny_model_dir, tiny_csv, capsys):
    paper = f'[[paper]]\nmodel = "m"\nmetric = "accuracy"\ncite = "T1"\nr = {{ "0.5" = {value} }}\n'
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv, paper=paper)
    line = _refused(["run", path, "--plan", "--no-timing"], capsys)
    assert "finite number" in line and "paper.0.r" in line


def test_status_and_merge_together_are_refused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    line = _refused(["run", "--status", tmp_path / "a", "--merge", tmp_path / "b"], capsys)
    assert "--status" in line and "--merge" in line and "one per call" in line


@pytest.mark.parametrize("executor", [[], ["--executor", "local"], ["--executor", "slurm"]])
@pytest.mark.usefixtures("no_weights")
def test_threads_without_a_pool_is_refused(executor, tmp_path, tiny_model_dir, tiny_csv, capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    line = _refused(["run", path, "--out", tmp_path / "out", "--threads", "2", *executor], capsys)
    assert "--threads" in line and "--executor pool" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("params", [["sparsity=0.5", "tolerance=0.8"], ["tolerance=0.9", "sparsity=0.25"]])
@pytest.mark.usefixtures("no_weights")
def test_sap_cf_with_a_sparsity_and_a_tolerance_is_refused(params, tiny_model_dir, tiny_csv, capsys):
    argv = ["score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "sap-cf"]
    for p in params:
        argv += ["--param", p]
    line = _refused(argv, capsys)
    assert "tolerance" in line and "sparsity 0 only" in line


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_a_kv_plan_never_replaces_a_users_tmp_file_or_folder(kind, tmp_path):
    """kvplan --out plan.json beside the user's plan.json.tmp: the plan goes through outdir.write_atomic (its own
    temporary name), so the user's file or folder of that name is left byte for byte."""
    from headprune.kvcache.plan import KVPlan

    user = tmp_path / "plan.json.tmp"
    if kind == "file":
        user.write_text("my notes")
    else:
        user.mkdir()
        (user / "keep.txt").write_text("mine")
    plan = KVPlan(torch.tensor([[True, False], [False, True]]), 4, sink=2, window=8)
    plan.write(tmp_path / "plan.json")
    assert KVPlan.read(tmp_path / "plan.json").full.tolist() == plan.full.tolist()
    assert (user.read_text() == "my notes") if kind == "file" else (user / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.json.tmp"]   # no temporary left


@pytest.mark.parametrize("shard", ["0/²", "٣/4", "0/1000000000000", "0/100001", "1/ 2x", "0/" + "9" * 400, "-1/4"])
@pytest.mark.usefixtures("no_weights")
def test_shard_values_outside_ascii_whole_numbers_or_the_bound_are_refused(shard, tmp_path, tiny_model_dir, tiny_csv,
                                                                           capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    line = _refused(["run", path, "--out", tmp_path / "out", f"--shard={shard}"], capsys)
    assert "--shard" in line and "Accepted: I/N" in line and not (tmp_path / "out").exists()
