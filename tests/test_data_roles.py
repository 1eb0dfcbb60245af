"""Data roles (issue 22 items 1-2): calibration, selection and evaluation each from any data spec, disjoint on one
source by construction, refused when they share rows across sources, recorded with content hashes; ``hf:`` splits
chosen by a stated rule that never evaluates on train."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from conftest import sentences, write_csv

from headprune.cli import main
from headprune.criteria import get
from headprune.criteria.hies import select_alpha
from headprune.criteria.sap import calibration_metric
from headprune.data import (
    TextDataset,
    align_labels,
    content_hash,
    load_data,
    make_batches,
    pick_split,
    row_hashes,
    split_calib_eval,
)
from headprune.errors import DataError
from headprune.evaluation.metrics import evaluate
from headprune.model.mask import HeadMask
from headprune.scoring import ScoringContext
from headprune.workspace import DefaultSize, Workspace, fit_role_sizes

pytestmark = pytest.mark.usefixtures("one_thread")


# -- content hashes ---------------------------------------------------------------------------------------------------

def test_row_and_content_hashes_against_hashlib():
    ds = TextDataset(texts=["a b", "c"], pairs=["x", "y"], labels=[0, 1])
    by_hand = [hashlib.sha256(json.dumps(row).encode()).hexdigest() for row in (["a b", "x", 0], ["c", "y", 1])]
    assert row_hashes(ds) == by_hand
    assert content_hash(ds) == hashlib.sha256("".join(by_hand).encode()).hexdigest()
    # any change of text, pair, label or order changes the hash; equal rows hash alike
    assert content_hash(TextDataset(texts=["a b", "c"], pairs=["x", "y"], labels=[0, 1])) == content_hash(ds)
    for other in (TextDataset(texts=["a b", "c"], pairs=["x", "y"], labels=[1, 1]),
                  TextDataset(texts=["a b", "c"], labels=[0, 1]), ds.subset([1, 0])):
        assert content_hash(other) != content_hash(ds)


# -- sizes ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("n_rows", "sizes", "expected"), [
    # one source for all three: calibration and evaluation as before roles, selection from what they leave
    (1000, {"eval": DefaultSize(500), "calib": DefaultSize(128), "select": DefaultSize(128)},
     {"eval": 500, "calib": 128, "select": 128}),
    (400, {"eval": DefaultSize(500), "calib": DefaultSize(128), "select": DefaultSize(128)},
     {"eval": 272, "calib": 128, "select": 0}),
    (400, {"eval": DefaultSize(500), "calib": DefaultSize(128), "select": 50},   # a chosen size is set aside
     {"eval": 222, "calib": 128, "select": 50}),
    (40, {"eval": None, "calib": 10, "select": 5}, {"eval": 25, "calib": 10, "select": 5}),
    # a role alone on its source: a default shrinks to the source, a chosen size is kept
    (60, {"calib": DefaultSize(128)}, {"calib": 60}),
    (60, {"eval": None}, {"eval": 60}),
    (60, {"select": 20}, {"select": 20}),
])
def test_role_sizes(n_rows, sizes, expected):
    assert fit_role_sizes(n_rows, sizes) == expected


@pytest.mark.parametrize(("sizes", "needle"), [
    ({"calib": 100}, "Calibration size 100 does not fit: its data has only 60 rows"),
    ({"eval": DefaultSize(500), "calib": DefaultSize(128), "select": 61}, "Selection size 61 does not fit: its "
                                                                           "data has only 60 rows"),
    ({"eval": 30, "calib": 20, "select": 20}, "only 40 rows. Choose sizes that sum to at most 40 (evaluation at most "
                                              "20 with this calibration size), or leave the defaults, which shrink to "
                                              "fit. (These are the rows left of 60 after the 20 selection examples"),
    ({"calib": 10, "select": 51}, "Calibration size 10 does not fit: its data has only 9 rows left of 60 after the "
                                  "51 selection examples"),
])
def test_role_sizes_that_do_not_fit(sizes, needle):
    with pytest.raises(DataError) as info:
        fit_role_sizes(60, sizes)
    assert needle in str(info.value)


# -- the workspace --------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_csv):
    """Three disjoint labelled sources for the tiny model, and one that shares rows with the first."""
    root = tmp_path_factory.mktemp("roles")
    rows = lambda seed, n: [[t, "pos" if i % 2 else "neg"] for i, t in enumerate(sentences(n, seed=seed))]  # noqa: E731
    base = rows(11, 80)
    return {"a": write_csv(root / "a.csv", ["text", "label"], base),
            "b": write_csv(root / "b.csv", ["text", "label"], [[f"b {t}", y] for t, y in rows(12, 50)]),
            "c": write_csv(root / "c.csv", ["text", "label"], [[f"c {t}", y] for t, y in rows(13, 40)]),
            "shares_a": write_csv(root / "shares_a.csv", ["text", "label"], base[:30])}


def test_one_source_splits_as_before_plus_a_disjoint_selection(tiny_model_dir, tiny_csv):
    ws = Workspace.build(str(tiny_model_dir), tiny_csv, calib_size=16, eval_size=20, select_size=10, max_length=32)
    ds = align_labels(load_data(tiny_csv), ws.loaded.id2label)
    calib, evals = split_calib_eval(ds, 16, 20, seed=0)        # the split before roles existed
    assert (ws.calib.texts, ws.eval.texts) == (calib.texts, evals.texts)
    assert len(ws.select) == 10 and sum(len(b["input_ids"]) for b in ws.select_batches) == 10
    # the selection is the next 10 rows of the same permutation: disjoint from both by row position
    order = np.random.default_rng(0).permutation(len(ds))
    assert ws.select.texts == [ds.texts[i] for i in order[36:46]]
    roles = ws.roles()
    assert [roles[r]["source"] for r in ("calib", "select", "eval")] == [tiny_csv] * 3
    assert {r: roles[r]["size"] for r in roles} == {"calib": 16, "select": 10, "eval": 20}
    assert roles["eval"]["hash"] == content_hash(evals) and roles["calib"]["hash"] == content_hash(calib)
    assert ws.info()["roles"] == roles and roles["eval"]["seed"] == 0


def test_three_sources_are_recorded_and_overlap_is_refused(tiny_model_dir, files):
    ws = Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["b"], select_data=files["c"],
                         calib_size=12, select_size=8, eval_size=DefaultSize(500), max_length=32)
    roles = ws.roles()
    assert [roles[r]["source"] for r in ("eval", "calib", "select")] == [files["a"], files["b"], files["c"]]
    assert (len(ws.eval), len(ws.calib), len(ws.select)) == (80, 12, 8)   # a source of its own: all of it
    assert len({roles[r]["hash"] for r in roles}) == 3
    assert all(t.startswith("b ") for t in ws.calib.texts) and all(t.startswith("c ") for t in ws.select.texts)
    with pytest.raises(DataError, match=r"evaluation rows .*a.csv.* calibration rows .*shares_a.csv.* share \d+ "
                                        r"row.*--allow-overlap"):
        Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["shares_a"], max_length=32)
    shared = Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["shares_a"], allow_overlap=True,
                             max_length=32)
    assert set(shared.calib.texts) <= set(shared.eval.texts)


def test_selection_batches_reach_the_criteria_that_choose(tiny_model_dir, files):
    """HIES's α sweep evaluates its curves on the selection rows, SAP's k / CF metric reads them: not calibration,
    never evaluation."""
    ws = Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["b"], select_data=files["c"],
                         calib_size=12, select_size=8, max_length=32)
    ctx = ws.scoring_context(None)
    assert ctx.select is ws.select_batches and ctx.selection is ws.select_batches
    assert ScoringContext(ws.loaded.model, ws.calib_batches).selection is ws.calib_batches   # as before roles
    result = select_alpha(ws.loaded.model, ws.calib_batches, alphas=[0.0, 1.0], budget=0.25, step=3,
                          select=ws.select_batches)
    assert {t["dense"]["n"] for t in result["trajectories"]} == {len(ws.select)}
    # hies alpha=auto runs the same sweep on the context's selection batches
    auto = get("hies")(ws.scoring_context(None))
    sweep = select_alpha(ws.loaded.model, ws.calib_batches, select=ws.select_batches)
    assert auto.meta["alpha_selection"]["wauc"] == pytest.approx(sweep["wauc"])
    # SAP's k / CF metric is the selection rows' accuracy, not the calibration rows'
    metric = calibration_metric(ctx, "auto")
    mask = HeadMask.ones(ws.shape)
    assert metric(mask, []) == pytest.approx(evaluate(ws.loaded.model, ws.select_batches).accuracy)


# -- hf: splits said, never guessed ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mnli_like(tmp_path_factory):
    """A save_to_disk DatasetDict with MNLI's split names, and one with only train and an unlabelled test."""
    import datasets

    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})

    def split(prefix, n, label=None):
        return datasets.Dataset.from_dict({"premise": [f"{prefix} good {i}" for i in range(n)],
                                           "hypothesis": [f"{prefix} movie {i}" for i in range(n)],
                                           "label": [i % 2 if label is None else label for i in range(n)]},
                                          features=features)

    root = tmp_path_factory.mktemp("hf-roles")
    datasets.DatasetDict({"train": split("tr", 12), "validation_matched": split("vm", 6),
                          "validation_mismatched": split("vmm", 5)}).save_to_disk(str(root / "mnli"))
    datasets.DatasetDict({"train": split("tr", 12), "test": split("te", 4, label=-1)}).save_to_disk(
        str(root / "train_only"))
    datasets.DatasetDict({"train": split("tr", 12), "test": split("te", 4)}).save_to_disk(str(root / "labelled_test"))
    return root


def test_hf_without_a_split_reads_validation_matched(mnli_like):
    ds = load_data(f"hf:{mnli_like / 'mnli'}")
    assert ds.split == "validation_matched" and ds.texts[0].startswith("vm ") and len(ds) == 6
    named = load_data(f"hf:{mnli_like / 'mnli'}::validation_mismatched")
    assert named.split == "validation_mismatched" and len(named) == 5


def test_hf_never_evaluates_on_train_unless_said(mnli_like):
    spec = f"hf:{mnli_like / 'train_only'}"
    # GLUE's hidden test labels are -1: not an evaluation split; train is refused for evaluation ...
    with pytest.raises(DataError, match=r"no split to use for evaluation.*Splits found: train, test.*:train"):
        load_data(spec)
    # ... fine for calibration (and said by the workspace), and for evaluation when named
    assert load_data(spec, role="calib").split == "train"
    assert load_data(f"{spec}::train").split == "train"
    assert load_data(f"hf:{mnli_like / 'labelled_test'}").split == "test"     # a test split with labels
    with pytest.raises(DataError, match=r"no split 'dev'. Splits found: train, validation_matched"):
        load_data(f"hf:{mnli_like / 'mnli'}::dev")


def test_a_command_that_evaluates_nothing_may_score_on_train(tiny_model_dir, mnli_like):
    spec = f"hf:{mnli_like / 'train_only'}"
    ws = Workspace.build(str(tiny_model_dir), spec, calib_size=4, eval_size=0, select_size=0, max_length=32)
    assert ws.roles()["calib"]["split"] == "train" and len(ws.eval) == 0
    assert ws.notes == [f"{spec} -> split train (for calibration) (the training split: fine for these roles, never "
                        "chosen for evaluation)"]
    with pytest.raises(DataError, match="no split to use for evaluation"):
        Workspace.build(str(tiny_model_dir), spec, calib_size=4, max_length=32)


def test_pick_split_rule_order():
    splits = {name: None for name in ("train", "validation_mismatched", "validation_matched")}
    assert pick_split(splits, None, "hf:x") == "validation_matched"
    assert pick_split({"train": None, "validation": None, "validation_matched": None}, None, "hf:x") == "validation"
    assert pick_split({"train": None}, None, "hf:x", role="select") == "train"


def test_cli_prints_the_chosen_split_and_records_it(tiny_model_dir, mnli_like, capsys):
    spec = f"hf:{mnli_like / 'mnli'}"
    assert main(["evaluate", "--model", str(tiny_model_dir), "--data", spec,
                 "--calib-data", f"hf:{mnli_like / 'train_only'}", "--calib-size", "4", "--max-length", "32"]) == 0
    out, err = capsys.readouterr()
    assert f"note: {spec} -> split validation_matched" in err
    assert f"hf:{mnli_like / 'train_only'} -> split train (for calibration) (the training split" in err
    roles = json.loads(out)["roles"]
    assert (roles["eval"]["split"], roles["calib"]["split"], roles["eval"]["size"]) == ("validation_matched",
                                                                                        "train", 6)


# -- the CLI on the demo: three distinct sources ----------------------------------------------------------------------

def test_evaluate_on_the_demo_with_three_sources(demo, tmp_path, capsys):
    third = write_csv(tmp_path / "select.csv", ["text", "label"],
                      [["a gripping, beautifully acted film", "fresh"], ["a dull and lifeless mess", "rotten"]] * 5)
    argv = ["evaluate", "--model", "demo", "--calib-data", "demo:train", "--eval-data", "demo", "--select-data",
            third, "--calib-size", "16", "--select-size", "6", "--eval-size", "40"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    roles = result["roles"]
    assert [roles[r]["source"] for r in ("calib", "select", "eval")] == ["demo:train", third, "demo"]
    assert {roles[r]["size"] for r in roles} == {16, 6, 40} and len({roles[r]["hash"] for r in roles}) == 3
    # the evaluation rows are the ones the pre-roles split gives, and the metric is measured on them
    _, evals = split_calib_eval(align_labels(load_data("demo"), demo.id2label), 0, 40, seed=0)
    assert roles["eval"]["hash"] == content_hash(evals) and result["n"] == 40
    # the same with the selection from the training split and calibration from the demo's held-out rows
    assert main(["evaluate", "--model", "demo", "--select-data", "demo:train", "--calib-data", "demo",
                 "--calib-size", "16", "--select-size", "6", "--eval-size", "40"]) == 0
    roles = json.loads(capsys.readouterr().out)["roles"]
    assert [roles[r]["source"] for r in ("calib", "select", "eval")] == ["demo", "demo:train", "demo"]
    # calibration and evaluation share the demo: split as before roles existed (disjoint, one permutation)
    calib, evals = split_calib_eval(align_labels(load_data("demo"), demo.id2label), 16, 40, seed=0)
    assert (roles["eval"]["hash"], roles["calib"]["hash"]) == (content_hash(evals), content_hash(calib))
    assert not set(row_hashes(calib)) & set(row_hashes(evals))


def test_cli_refuses_roles_that_share_rows(tiny_model_dir, files, capsys):
    code = main(["evaluate", "--model", str(tiny_model_dir), "--data", files["a"], "--calib-data",
                 files["shares_a"], "--max-length", "32"])
    assert code == 2
    out, err = capsys.readouterr()
    assert not out and "\nerror: The evaluation rows" in "\n" + err and "--allow-overlap" in err


def test_score_records_roles_in_its_output(tiny_model_dir, files, tmp_path, capsys):
    out = tmp_path / "scores.json"
    assert main(["score", "--model", str(tiny_model_dir), "--data", files["a"], "--calib-data", files["b"],
                 "--select-data", files["c"], "--criterion", "ae", "--calib-size", "8", "--max-length", "32",
                 "--out", str(out)]) == 0
    written = json.loads(out.read_text())
    assert written["data"]["roles"]["calib"]["source"] == files["b"]
    assert written["data"]["roles"]["select"]["source"] == files["c"]
    assert json.loads(capsys.readouterr().out)["data"]["roles"] == written["data"]["roles"]


def test_trajectory_run_file_records_roles(tiny_model_dir, files, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["trajectory", "--model", str(tiny_model_dir), "--data", files["a"], "--calib-data", files["b"],
                 "--criterion", "ae", "--calib-size", "8", "--eval-size", "20", "--count", "2", "--max-length", "32",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    roles = json.loads(out.read_text())["data"]["roles"]
    assert (roles["calib"]["source"], roles["eval"]["source"], roles["eval"]["size"]) == (files["b"], files["a"], 20)
    expected = Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["b"], calib_size=8, eval_size=20,
                               max_length=32).roles()
    assert roles == expected


def test_batches_of_a_role_are_its_rows(tiny_model_dir, files):
    ws = Workspace.build(str(tiny_model_dir), files["a"], calib_data=files["b"], calib_size=12, max_length=32)
    again = make_batches(ws.loaded.tokenizer, ws.calib, 32, 32)
    assert [b["input_ids"].tolist() for b in again] == [b["input_ids"].tolist() for b in ws.calib_batches]


# -- the dashboard ---------------------------------------------------------------------------------------------------

def test_dashboard_key_includes_the_roles():
    from app_support import ROOT  # noqa: F401  (puts the repository root on sys.path for `dashboard`)

    from dashboard.config import Setup

    base = Setup(model="demo", data="demo")
    keys = {base.key, Setup(model="demo", data="demo", calib_data="demo:train").key,
            Setup(model="demo", data="demo", select_data="demo:train").key,
            Setup(model="demo", data="demo", eval_data="demo:train").key,
            Setup(model="demo", data="demo", select_size=DefaultSize(64)).key,
            Setup(model="demo", data="demo", select_size=64).key}
    assert len(keys) == 6


def test_dashboard_sets_a_separate_calibration_set_and_shows_the_roles(demo_model_path):
    from app_support import open_app, problems, shown, small_env

    with small_env():
        at = open_app("model")
        assert not problems(at)
        at.selectbox(key="md-calib-data").set_value("demo:train").run()
        at.button(key="md-load").click().run()
        assert not problems(at)
        setup = at.session_state["hp_setup"]
        assert (setup.calib_data, setup.eval_data, setup.data) == ("demo:train", None, "demo")
        table = next(d.value for d in at.dataframe if "role" in d.value.columns)
        rows = {r["role"]: r for r in table.to_dict("records")}
        assert (rows["calibration"]["source"], rows["evaluation"]["source"]) == ("demo:train", "demo")
        assert rows["calibration"]["rows"] == 32 and rows["evaluation"]["rows"] == 64
        assert any("Labels matched by name: rotten → 0 (rotten), fresh → 1 (fresh)" in shown(c) for c in at.caption)


# -- a command reads only the roles it uses (issue 30 §6) -------------------------------------------------------------

def test_evaluate_on_held_out_demo_rows_runs(demo, tmp_path, capsys, monkeypatch):
    """60 of the demo's own held-out reviews as --eval-data: evaluate reads no selection or calibration rows, so
    the default --data (the same held-out reviews) is never drawn from and nothing is refused."""
    import headprune.workspace

    held_out = load_data("demo")
    rows = [[held_out.texts[i], held_out.labels[i]] for i in range(0, 600, 10)]
    path = write_csv(tmp_path / "mine.csv", ["text", "label"], rows)
    read = []
    real = headprune.workspace.load_data
    monkeypatch.setattr(headprune.workspace, "load_data",
                        lambda spec, *a, **k: read.append(spec) or real(spec, *a, **k))
    assert main(["evaluate", "--model", "demo", "--eval-data", path, "--eval-size", "all"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["n"] == 60 and set(read) == {path}   # the demo's rows were not even read
    assert result["roles"]["select"]["size"] == 0 and result["roles"]["calib"]["size"] == 0
    # the same rows by hand: the metric is the accuracy on exactly these 60 rows
    ds = align_labels(load_data(path), demo.id2label)
    assert result["accuracy"] == pytest.approx(evaluate(demo.model, make_batches(demo.tokenizer, ds, 32, 128))
                                               .to_dict()["accuracy"])


def test_roles_overlap_is_refused_before_the_weights_load(tiny_model_dir, files, monkeypatch, capsys):
    import headprune.workspace

    def no_load(*args, **kwargs):
        raise AssertionError("weights loaded before the overlap check")

    monkeypatch.setattr(headprune.workspace, "load_model", no_load)
    code = main(["evaluate", "--model", str(tiny_model_dir), "--data", files["a"], "--calib-data",
                 files["shares_a"], "--max-length", "32"])
    assert code == 2 and "--allow-overlap" in capsys.readouterr().err
