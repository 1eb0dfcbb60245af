"""Hostile and odd inputs of issue 30, many per class: each ends in exit code 2 and an ``error:`` line naming the
problem and what is accepted, with no traceback, and (where the class says so) before any weights load.

Classes: paths the operating system cannot look up; "JSON or a file" values; every state of recover's work folder;
teachers that cannot distil; non-finite hyper-parameters; training rows among the evaluation rows; score files
without finite scores; ``roles --ratio`` without a criterion; ``--lm-eval`` on a classifier; whitespace-only
multiple-choice options. The CLI runs in-process on the tiny saved BERT (conftest), so each case takes
milliseconds.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import refused, sentences, write_csv

import headprune.cli.common
import headprune.cli.core
import headprune.cli.recover
import headprune.workspace
from headprune.cli import main
from headprune.evaluation.harness import HarnessError, HarnessSpec, user_code
from headprune.testing import tiny_model
from headprune.userinput import json_or_file, kind_of, path_problem

pytestmark = pytest.mark.usefixtures("one_thread")


def _no_load(*args, **kwargs):
    raise AssertionError("weights were loaded before the input was refused")


@pytest.fixture
def no_weights(monkeypatch):
    """Every way a command loads weights fails the test: a refusal must come first."""
    for module in (headprune.cli.core, headprune.cli.recover, headprune.workspace):
        monkeypatch.setattr(module, "load_model", _no_load)


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dir):
    """Data, teachers, score files and recover work folders the cases name (built once)."""
    root = tmp_path_factory.mktemp("fuzz")
    rows = [[t, "pos" if i % 3 else "neg"] for i, t in enumerate(sentences(80, seed=5, min_words=3))]
    write_csv(root / "train.csv", ["text", "label"], rows[:40])
    write_csv(root / "eval.csv", ["text", "label"], rows[40:])
    write_csv(root / "eval_plus_train.csv", ["text", "label"], rows[40:] + rows[:3])
    write_csv(root / "shuffled_train.csv", ["text", "label"], rows[:40][::-1])
    vocab = json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]
    for name, kw in {"three-labels": dict(num_labels=3, vocab_size=vocab),
                     "other-vocab": dict(num_labels=2, vocab_size=vocab + 7)}.items():
        tiny_model("bert", **kw).save_pretrained(root / name)
    tiny_model("roberta", num_labels=2, vocab_size=vocab).save_pretrained(root / "other-family")
    from transformers import GPT2Config, GPT2LMHeadModel
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=16, vocab_size=vocab, n_positions=64)) \
        .save_pretrained(root / "causal-lm")
    scores = {"nan": [[math.nan] * 4] * 3, "inf": [[1.0, math.inf, 0.5, 0.2]] * 3,
              "partial-nan": [[0.1, math.nan, 0.3, 0.4]] * 3, "minus-inf": [[-math.inf] * 4] * 3,
              "all-null": [[None] * 4] * 3}
    for name, grid in scores.items():   # json writes NaN / Infinity literals, as a hand-edited file may hold
        (root / f"scores-{name}.json").write_text(json.dumps({"criterion": "ae", "scores": grid, "params": {}}))
    write_csv(root / "choices.csv", ["goal", "sol1", "sol2", "label"],
              [["open a jar", "twist the lid", "  ", 0], ["boil water", "heat it", "\t", 0]])
    write_csv(root / "choices-newline.csv", ["goal", "sol1", "sol2", "label"], [["cut bread", " \n ", "a knife", 1]])
    return root


@pytest.fixture(scope="module")
def work_states(files) -> dict:
    """{state: OUT} for OUT.work states recover must refuse (recover --out OUT reads OUT.work)."""
    return _work_folders(files / "work")


def _work_folders(root) -> dict:
    states = {}

    def out(name):
        states[name] = root / name / "OUT"
        states[name].parent.mkdir(parents=True)
        return root / name / "OUT.work"

    out("a-file").write_text("my notes")
    (work := out("foreign")).mkdir()
    (work / "thesis.tex").write_text("\\begin{document}")
    (work := out("broken-spec")).mkdir()
    (work / "recovery_spec.json").write_text("{oops")
    (work := out("spec-a-list")).mkdir()
    (work / "recovery_spec.json").write_text("[1, 2]")
    (work := out("no-checkpoint")).mkdir()
    (work / "recovery_spec.json").write_text("{}")
    out("missing")
    (work := out("other-settings")).mkdir()
    (work / "recovery_spec.json").write_text(json.dumps({"method": "lora", "epochs": 9}))
    (work / "checkpoint-1").mkdir()
    (work := out("pickles")).mkdir()
    (work / "recovery_spec.json").write_text("{}")
    (work / "checkpoint-2").mkdir()
    torch.save({"state": torch.nn.Linear(2, 2)}, work / "checkpoint-2" / "optimizer.pt")   # a pickled module
    (work := out("not-a-checkpoint-file")).mkdir()
    (work / "recovery_spec.json").write_text("{}")
    (work / "checkpoint-3").mkdir()
    (work / "checkpoint-3" / "scheduler.pt").write_bytes(b"not a torch file")
    return states



LONG, DEEP = "x" * 300, "a/" * 2100
PATHS = [LONG, f"{LONG}.csv", f"dir/{LONG}", DEEP, "nul\x00byte.csv", "é" * 200]


@pytest.mark.parametrize("value", PATHS, ids=range(len(PATHS)))
@pytest.mark.parametrize("option", ["--data", "--model", "--mask", "--calib-data", "--eval-data", "--out"])
def test_paths_the_system_cannot_look_up(option, value, no_weights, tiny_model_dir, tiny_csv, capsys):
    argv = ["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, option, value]
    if option == "--out":
        argv = ["prune", "--model", tiny_model_dir, "--mask", tiny_csv, "--out", value]
    line = refused(argv, capsys)
    assert option in line and "Accepted:" in line


@pytest.mark.parametrize("option,value", [("--scores", LONG), ("--scores", DEEP), ("--out", LONG)])
def test_mask_paths(option, value, files, capsys):
    argv = ["mask", "--scores", files / "scores-inf.json", "--ratio", "0.5", option, value]
    assert option in refused(argv, capsys)


def test_path_helpers_never_raise(tmp_path):
    assert path_problem("a" * 255) is None and "255" in path_problem("a" * 256)
    assert "4096" in path_problem("a/" * 2049) and "NUL" in path_problem("a\x00")
    assert [kind_of(p) for p in ("a" * 300, tmp_path, tmp_path / "none", "nul\x00")] == \
        ["unreadable", "dir", "missing", "unreadable"]


BAD_JSON = ["{oops" + "x" * 400, "[" * 300, '{"a": ' * 100, "{" + LONG, "[1, 2, 3]" + "," * 300,
            "[" + ",".join(["1"] * 200) + "]", '{"' + "k" * 300 + '": true}', LONG, DEEP]


@pytest.mark.parametrize("value", BAD_JSON, ids=range(len(BAD_JSON)))
@pytest.mark.parametrize("option", ["--label-map", "--device-map"])
def test_json_or_file_values(option, value, no_weights, tiny_model_dir, tiny_csv, capsys):
    line = refused(["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, option, value], capsys)
    assert "map" in line and ("Accepted:" in line or "Available:" in line) and "File name too long" not in line


def test_long_inline_json_is_json_not_a_file(tmp_path):
    labels = {f"label {i} " + "x" * 40: i % 2 for i in range(40)}   # 2 kB of JSON: longer than any file name
    assert json_or_file(json.dumps(labels), "label map", "a JSON object")[0] == labels
    (tmp_path / "map.json").write_text(json.dumps({"neg": 0}))
    assert json_or_file(str(tmp_path / "map.json"), "label map", "x") == ({"neg": 0}, f"label map file "
                                                                                      f"{tmp_path / 'map.json'}")


WORK_STATES = ["a-file", "foreign", "broken-spec", "spec-a-list", "no-checkpoint", "missing", "other-settings",
               "pickles", "not-a-checkpoint-file"]


@pytest.mark.parametrize("state", WORK_STATES)
def test_every_resume_state(state, files, work_states, no_weights, tiny_model_dir, capsys):
    out = work_states[state]
    argv = ["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv", "--eval-data",
            files / "eval.csv", "--out", out, "--resume"]
    before = sorted(p.name for p in out.parent.rglob("*"))
    line = refused(argv, capsys)
    assert "Accepted" in line or "settings" in line
    assert sorted(p.name for p in out.parent.rglob("*")) == before   # nothing written, nothing removed


@pytest.mark.parametrize("state", ["a-file", "foreign", "broken-spec"])
def test_a_fresh_run_refuses_a_work_folder_it_did_not_write(state, files, no_weights, tiny_model_dir, capsys):
    out = _work_folders(files / f"fresh-{state}")[state]   # its own copy: a fresh run must not touch it either
    before = sorted(p.name for p in out.parent.rglob("*"))
    refused(["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv", "--eval-data",
              files / "eval.csv", "--out", out], capsys)
    assert sorted(p.name for p in out.parent.rglob("*")) == before


@pytest.mark.parametrize("teacher,found", [("three-labels", "label counts differ"),
                                           ("other-vocab", "vocabularies differ"),
                                           ("other-family", "families differ"),
                                           ("causal-lm", "teacher is a language model")])
@pytest.mark.parametrize("method", ["distill", "lora+distill"])
def test_teachers_that_cannot_distil(teacher, found, method, files, no_weights, tiny_model_dir, capsys):
    line = refused(["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv", "--eval-data",
                     files / "eval.csv", "--method", method, "--teacher", files / teacher, "--out",
                     files / f"t-{teacher}-{method}"], capsys)
    assert found in line and "Accepted:" in line


NON_FINITE = [("--lr", "inf"), ("--lr", "nan"), ("--lr", "-inf"), ("--temperature", "inf"), ("--temperature", "nan"),
              ("--alpha", "nan"), ("--alpha", "inf"), ("--lora-alpha", "inf"), ("--weight-decay", "inf"),
              ("--warmup", "nan"), ("--lr", "1e999")]


@pytest.mark.parametrize("option,value", NON_FINITE)
def test_non_finite_hyper_parameters(option, value, files, no_weights, tiny_model_dir, capsys):
    line = refused(["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv", "--eval-data",
                     files / "eval.csv", "--method", "lora+distill", f"{option}={value}", "--out", files / "nf"],
                    capsys)
    assert option in line and ("finite" in line or "must" in line)


@pytest.mark.parametrize("eval_file,shared", [("train.csv", 40), ("eval_plus_train.csv", 3),
                                              ("shuffled_train.csv", 40)])
def test_training_rows_among_the_evaluation_rows(eval_file, shared, files, no_weights, tiny_model_dir, capsys):
    line = refused(["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv", "--eval-data",
                     files / eval_file, "--eval-size", "all", "--out", files / "ov"], capsys)
    assert f"share {shared} row(s)" in line and "--allow-overlap" in line


def test_allow_overlap_goes_on_and_is_recorded(files, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "rec"
    assert main([str(a) for a in ["recover", "--model", tiny_model_dir, "--train-data", files / "train.csv",
                                  "--eval-data", files / "eval_plus_train.csv", "--eval-size", "all", "--steps", "1",
                                  "--batch-size", "8", "--max-length", "16", "--out", out, "--allow-overlap"]]) == 0
    capsys.readouterr()
    record = json.loads((tmp_path / "rec.run.json").read_text())
    assert record["train_eval_overlap"] == {"rows": 3, "allowed": True}


@pytest.mark.parametrize("name", ["nan", "inf", "partial-nan", "minus-inf", "all-null"])
@pytest.mark.parametrize("how", [["--ratio", "0.1"], ["--ratio", "0.9"], ["--count", "3"]])
def test_score_files_without_finite_scores(name, how, files, capsys):
    line = refused(["mask", "--scores", files / f"scores-{name}.json", *how], capsys)
    assert ("non-finite" in line or "no score" in line) and "Accepted:" in line


@pytest.mark.parametrize("ratios", [["0.5"], ["0"], ["1"], ["0.2", "--ratio", "0.7"]])
def test_roles_ratio_without_a_criterion(ratios, no_weights, tiny_model_dir, tiny_csv, capsys):
    line = refused(["roles", "--model", tiny_model_dir, "--data", tiny_csv, "--ratio", *ratios], capsys)
    assert "without --criterion" in line


@pytest.mark.parametrize("tasks", ["arc_easy", "demo_lm_cloze", "hellaswag,arc_easy"])
def test_lm_eval_on_a_classifier(tasks, no_weights, tiny_model_dir, capsys):
    line = refused(["evaluate", "--model", tiny_model_dir, "--lm-eval", tasks], capsys)
    assert "causal language model" in line and "classifier" in line


@pytest.mark.parametrize("name", ["choices.csv", "choices-newline.csv"])
def test_whitespace_only_choices(name, files, no_weights, tiny_model_dir, capsys):
    line = refused(["evaluate", "--model", tiny_model_dir, "--data", files / name], capsys)
    assert "visible character" in line


# -- lm-eval include folders: the Python a task's YAML imports is named first ------------------------------------

@pytest.fixture
def include(tmp_path):
    folder = tmp_path / "tasks" / "mine"
    folder.mkdir(parents=True)
    (folder / "cloze.yaml").write_text("task: my_cloze\ninclude: base.yaml\ndoc_to_text: !function helpers.text\n")
    (folder / "base.yaml").write_text("process_docs: !function prep.docs\n")
    (folder / "other.yaml").write_text("task: other\nprocess_docs: !function elsewhere.docs\n")
    return tmp_path / "tasks"


def test_user_code_lists_the_helpers_of_the_requested_tasks(include):
    found = user_code(HarnessSpec(tasks=("my_cloze", "arc_easy"), include=(str(include),)))
    assert {k: [p.name for p in v] for k, v in found.items()} == {"my_cloze": ["helpers.py", "prep.py"]}
    assert user_code(HarnessSpec(tasks=("demo_lm_cloze",))) == {}   # shipped tasks import nothing


def test_evaluate_names_the_helpers_before_resolving(include, files, monkeypatch, capsys):
    def stop(spec, *args, **kwargs):
        raise HarnessError("stopped where the tasks would be resolved")

    monkeypatch.setattr(headprune.cli.core, "resolve_tasks", stop)
    code = main(["evaluate", "--model", str(files / "causal-lm"), "--lm-eval", "my_cloze", "--lm-eval-include",
                 str(include)])
    err = capsys.readouterr().err
    assert code == 2 and "error: stopped where" in err
    assert err.index("note: lm-eval task my_cloze imports Python code") < err.index("error:")
    assert "helpers.py" in err and "prep.py" in err and "elsewhere.py" not in err


def test_the_dashboard_takes_no_include_folder():
    import inspect

    from dashboard import export
    source = inspect.getsource(export.harness_tasks)
    assert "include" not in source and "include" not in inspect.signature(export.harness_tasks).parameters


# -- the suite builds the demos its selected tests name, before the first test -------------------------------------

def test_demos_needed_reads_the_selected_tests(tmp_path):
    from types import SimpleNamespace

    from conftest import demos_needed

    lm = tmp_path / "test_lm.py"
    lm.write_text('at.radio(key="md-model-kind").set_value("demo-lm")\n')
    plain = tmp_path / "test_plain.py"
    plain.write_text('task = "demo_lm_cloze"  # data only\n')
    items = [SimpleNamespace(path=lm, fixturenames=[]), SimpleNamespace(path=plain, fixturenames=["demo"])]
    assert demos_needed(items) == ["demo", "demo-lm"]
    assert demos_needed([SimpleNamespace(path=plain, fixturenames=["tmp_path"])]) == []
