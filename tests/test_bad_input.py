"""Bad input never ends in a traceback (issue 10 §3): every case below gets a message naming the problem and what
is accepted, the CLI exits 2 and prints no JSON, nothing (not even a temporary file) is left on disk, and a model
given to the library is unchanged afterwards.

Cases already in tests/test_cli.py, tests/test_criteria_cli.py and tests/test_app_errors.py are not repeated here.
The CLI runs in-process on the tiny saved BERT (conftest), so each case takes milliseconds to a second.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from app_support import shown
from conftest import sentences, write_csv

from headprune.cli import main
from headprune.criteria import ScoringContext, get
from headprune.criteria.onepass import score_many
from headprune.errors import HeadpruneError
from headprune.model.mask import HeadMask
from headprune.testing import random_batch, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir):
    """Every bad file and folder the cases name, built once (the cases check they stay unchanged)."""
    root = tmp_path_factory.mktemp("bad-inputs")
    write_csv(root / "rows40.csv", ["text", "label"],
              [[t, "pos" if i % 3 else "neg"] for i, t in enumerate(sentences(40, seed=2))])
    (root / "empty.csv").write_text("")
    (root / "list.jsonl").write_text("[1, 2]\n")
    (root / "broken.jsonl").write_text('{"text": "good", "label": "pos"}\n{oops\n')
    masks = {"bad-json": "{not json", "list": "[1, 2]", "negative-head": '{"pruned": {"0": [-1]}}',
             "word-head": '{"pruned": {"0": ["x"]}}', "word-layer": '{"pruned": {"a": [0]}}',
             "pruned-list": '{"pruned": [0, 1]}', "empty": ""}
    for name, text in masks.items():
        (root / f"mask-{name}.json").write_text(text)
    model_files = ("config.json", "model.safetensors")

    def folder(name, files=model_files):
        (root / name).mkdir()
        for f in files:
            shutil.copy(tiny_model_dir / f, root / name / f)
        return root / name

    pickled = folder("pickle-only", ("config.json", "tokenizer.json", "tokenizer_config.json"))
    torch.save(tiny_model("bert", num_labels=2), pickled / "pytorch_model.bin")   # a whole pickled module
    (folder("broken-safetensors", ("config.json", "tokenizer.json", "tokenizer_config.json"))
     / "model.safetensors").write_bytes(b"not safetensors" * 8)
    (folder("config-not-json", ()) / "config.json").write_text("{oops")
    (folder("config-without-type", ()) / "config.json").write_text('{"hidden_size": 8}')
    folder("no-tokenizer")
    (root / "outputs").mkdir()
    return root


def _tree(root) -> dict:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def cli_cases(root, model, data) -> dict[str, tuple[list, str]]:
    """case -> (argv, regex the message must match)."""
    m, d = ["--model", model], ["--data", data]
    md = [*m, *d, "--calib-size", "8", "--eval-size", "8"]
    small = [*m, "--data", root / "rows40.csv"]
    mask = {name: root / f"mask-{name}.json" for name in
            ("bad-json", "list", "negative-head", "word-head", "word-layer", "pruned-list", "empty")}
    out = root / "outputs"
    return {
        # data files
        "data file missing": (["evaluate", *m, "--data", root / "none.csv"], r"Data file not found.*Accepted: 'demo'"),
        "data path is a folder": (["evaluate", *m, "--data", root / "outputs"],
                                  r"outputs is a folder, not a data file. Accepted: 'demo'.*hf:"),
        "data file empty": (["evaluate", *m, "--data", root / "empty.csv"], r"is empty: expected a header row"),
        "jsonl line not an object": (["evaluate", *m, "--data", root / "list.jsonl"],
                                     r"line 1: expected a JSON object per line"),
        "jsonl line not json": (["evaluate", *m, "--data", root / "broken.jsonl"], r"line 2.*JSON"),
        "text column named but absent": (["evaluate", *md, "--text-col", "body"],
                                         r"no text column 'body'. Columns found: text, label"),
        "label column named but absent": (["evaluate", *md, "--label-col", "stars"],
                                          r"no label column 'stars'. Columns found: text, label"),
        "pair column named but absent": (["evaluate", *md, "--pair-col", "second"], r"no pair column 'second'"),
        "hub dataset offline": (["evaluate", *m, "--data", "hf:no_such_dataset_xyz"],
                                r"Could not load Hugging Face dataset.*Accepted: hf:NAME"),
        # masks
        "mask not json": (["evaluate", *md, "--mask", mask["bad-json"]], r"not valid UTF-8 JSON"),
        "mask empty file": (["evaluate", *md, "--mask", mask["empty"]], r"not valid UTF-8 JSON"),
        "mask path is a folder": (["evaluate", *md, "--mask", root / "outputs"],
                                  r"Mask file .*outputs is a folder; give the JSON file"),
        "mask is a list": (["evaluate", *md, "--mask", mask["list"]], r"A mask file is a JSON object \{\"pruned\""),
        "mask 'pruned' is a list": (["evaluate", *md, "--mask", mask["pruned-list"]], r"\"pruned\" must be an object"),
        "mask negative head": (["evaluate", *md, "--mask", mask["negative-head"]], r"head -1 in layer 0.*heads 0\.\.3"),
        "mask head not a number": (["score", *md, "--criterion", "ae", "--mask", mask["word-head"]],
                                   r"head 'x' in layer 0.*heads 0\.\.3"),
        "mask layer not a number": (["prune", *m, "--mask", mask["word-layer"], "--out", out / "cut"],
                                    r"layer 'a' is not an integer; layers are 0\.\.2"),
        # criterion parameters
        "sap negative k": (["score", *md, "--criterion", "sap", "--param", "k=-1"], r"k=-1: must be >= 0"),
        "sap k not a number": (["score", *md, "--criterion", "sap", "--param", "k=abc"], r"k='abc': expected int"),
        "kl unknown variant": (["score", *md, "--criterion", "kl", "--param", "variant=smooth"],
                               r"accepted values are as-written, normalized"),
        "kl alpha auto": (["score", *md, "--criterion", "kl", "--param", "alpha=auto"],
                          r"alpha='auto': expected float"),
        "hies alpha a word": (["score", *md, "--criterion", "hies", "--param", "alpha=half"],
                              r"accepted: 'auto' .* or a number in \[0, 1\]"),
        "taylor unknown objective": (["score", *md, "--criterion", "taylor", "--param", "objective=l1"],
                                     r"accepted values are loss, logits_norm"),
        "param without a name": (["score", *md, "--criterion", "ae", "--param", "=3"], r"expected KEY=VALUE"),
        "sap parser not installed": (["score", *md, "--criterion", "sap", "--param", "k=2", "--param",
                                      "parser=xx_no_parser"], r"'xx_no_parser' is not installed \(installed: "),
        "sap unknown metric": (["score", *md, "--criterion", "sap", "--param", "metric=bleu", "--param", "k_max=2"],
                               r"metric='bleu' is not available.*accepted: auto, accuracy"),
        # trajectory and select-alpha settings
        "step 0": (["trajectory", *md, "--criterion", "ae", "--step", "0"], r"Step 0 must be a positive integer"),
        "count 0": (["trajectory", *md, "--criterion", "ae", "--count", "0"], r"count 0 must be a positive integer"),
        "tolerance above 1": (["trajectory", *md, "--criterion", "ae", "--tolerance", "2"], r"must lie in \(0, 1\]"),
        "unknown trajectory metric": (["trajectory", *md, "--criterion", "ae", "--metric", "bleu"],
                                      r"'bleu' is unknown; accepted: accuracy"),
        "zero seeds": (["trajectory", *md, "--criterion", "random", "--seeds", "0"], r"seeds 0 must be a positive"),
        "word drop above 1": (["trajectory", *md, "--criterion", "ae", "--stability", "--drop", "1.5"],
                              r"Word-drop probability must lie in \[0, 1\)"),
        "select-alpha budget above 1": (["select-alpha", *md, "--budget", "2"],
                                        r"Budget 2.0 is not a ratio in \(0, 1\]"),
        "select-alpha alpha above 1": (["select-alpha", *md, "--alphas", "0.5,1.5"], r"α values must lie in \[0, 1\]"),
        "select-alpha step 0": (["select-alpha", *md, "--step", "0"], r"Step 0 must be a positive integer"),
        "syntax parser not installed": (["syntax", *md, "--parser", "xx_no_parser"],
                                        r"'xx_no_parser' is not installed"),
        # sizes
        "calibration larger than the data": (["score", *small, "--criterion", "ae", "--calib-size", "1000"],
                                             r"Calibration size 1000 does not fit: the data has only 40 rows"),
        "no calibration example for a trajectory": (["trajectory", *md[:4], "--calib-size", "0", "--criterion", "ae"],
                                                    r"needs at least one calibration example"),
        "no evaluation example": (["evaluate", *m, *d, "--eval-size", "0"], r"needs at least one example.*--eval-size"),
        "max length 1": (["evaluate", *md, "--max-length", "1"], r"max_length >= 2"),
        # devices
        "device map not json": (["evaluate", *md, "--device-map", "nonsense"],
                                r"--device-map is not JSON .*got 'nonsense'.*Accepted: 'auto', a JSON object"),
        "device map to a missing device": (["evaluate", *md, "--device-map", '{"bert": 7}'],
                                           r"sends 'bert' to '7', which this machine does not have. Available: "),
        "gpu asked for scoring without one": (["score", *md, "--criterion", "ae", "--device", "cuda"],
                                              r"no CUDA GPU is available here. Use --device auto or --device cpu"),
        # model folders
        "pickle-only weights": (["evaluate", "--model", root / "pickle-only", *d],
                                r"pytorch_model.bin .* is a pickle holding more than tensors.*"
                                r"Accepted: model.safetensors"),
        "broken safetensors": (["evaluate", "--model", root / "broken-safetensors", *d],
                               r"not a readable safetensors file.*Accepted: a model.safetensors"),
        "config not json": (["evaluate", "--model", root / "config-not-json", *d], r"Could not read the config"),
        "config without model type": (["evaluate", "--model", root / "config-without-type", *d], r"model_type"),
        "model path is a file": (["evaluate", "--model", data, *d], r"is not a model folder: it needs config.json"),
        "no tokenizer files": (["evaluate", "--model", root / "no-tokenizer", *d],
                               r"has no tokenizer files \(one of tokenizer.json"),
        # outputs
        "score into a missing folder": (["score", *md, "--criterion", "ae", "--out", out / "new" / "s.json"],
                                        r"the folder .*new does not exist. Accepted: a file path inside an existing"),
        "score onto a folder": (["score", *md, "--criterion", "ae", "--out", out], r"is a folder; give a file path"),
        "score under a file": (["score", *md, "--criterion", "ae", "--out", root / "rows40.csv" / "s.json"],
                               r"rows40.csv is a file, not a folder"),
        "trajectory into a missing folder": (["trajectory", *md, "--criterion", "ae", "--count", "1", "--out",
                                              out / "new" / "run.json"], r"does not exist"),
        "select-alpha into a missing folder": (["select-alpha", *md, "--out", out / "new" / "a.json"],
                                               r"does not exist"),
        "syntax into a missing folder": (["syntax", *md, "--out", out / "new" / "p.json"], r"does not exist"),
    }


ARGPARSE_CASES = {  # refused by the argument parser itself: usage line + message, exit 2
    "batch size 0": (["evaluate", "--batch-size", "0"], r"--batch-size: expected a positive integer"),
    "calibration size a word": (["score", "--criterion", "ae", "--calib-size", "many"],
                                r"--calib-size: expected a non-negative integer"),
    "unknown device": (["evaluate", "--device", "tpu"], r"--device: invalid choice: 'tpu' \(choose from 'auto'"),
    "unknown dtype": (["evaluate", "--dtype", "fp8"], r"--dtype: invalid choice: 'fp8' \(choose from 'fp32'"),
    "syntax top-k 0": (["syntax", "--k", "0"], r"--k: expected a positive integer"),
}

CLI_NAMES = ["data file missing", "data path is a folder", "mask path is a folder",
             "data file empty", "jsonl line not an object", "jsonl line not json",
             "text column named but absent", "label column named but absent", "pair column named but absent",
             "hub dataset offline", "mask not json", "mask empty file", "mask is a list", "mask 'pruned' is a list",
             "mask negative head", "mask head not a number", "mask layer not a number", "sap negative k",
             "sap k not a number", "kl unknown variant", "kl alpha auto", "hies alpha a word",
             "taylor unknown objective", "param without a name", "sap parser not installed", "sap unknown metric",
             "step 0", "count 0", "tolerance above 1", "unknown trajectory metric", "zero seeds", "word drop above 1",
             "select-alpha budget above 1", "select-alpha alpha above 1", "select-alpha step 0",
             "syntax parser not installed", "calibration larger than the data",
             "no calibration example for a trajectory", "no evaluation example", "max length 1",
             "device map not json", "device map to a missing device", "gpu asked for scoring without one",
             "pickle-only weights", "broken safetensors", "config not json", "config without model type",
             "model path is a file", "no tokenizer files", "score into a missing folder", "score onto a folder",
             "score under a file", "trajectory into a missing folder", "select-alpha into a missing folder",
             "syntax into a missing folder"]


def _refused(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:   # argparse
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CLI_NAMES)
def test_cli_refuses_bad_input_with_a_message(case, inputs, tiny_model_dir, tiny_csv, capsys, monkeypatch):
    if case == "gpu asked for scoring without one" and torch.cuda.is_available():
        pytest.skip("a GPU is present, so asking for one is not an error")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)   # no network: fail at once
    cases = cli_cases(inputs, str(tiny_model_dir), tiny_csv)
    assert sorted(cases) == sorted(CLI_NAMES)
    argv, expected = cases[case]
    before = _tree(inputs)
    code, out, err = _refused(argv, capsys)
    assert code == 2, (code, err)
    assert out == "" and "Traceback" not in err and "error: " in err
    assert re.search(expected, err), err
    assert _tree(inputs) == before          # nothing written, not even half a file or a temporary one


@pytest.mark.parametrize("case", list(ARGPARSE_CASES))
def test_cli_argument_errors_exit_2_with_the_accepted_form(case, capsys):
    argv, expected = ARGPARSE_CASES[case]
    code, out, err = _refused(argv, capsys)
    assert code == 2 and out == "" and "Traceback" not in err and re.search(expected, err), err


def test_a_good_out_file_is_written_whole_and_alone(inputs, tiny_model_dir, tiny_csv, capsys):
    """The atomic write leaves exactly the requested file (its JSON equal to what was printed), no temporary."""
    target = inputs / "outputs" / "ok" / "scores.json"
    target.parent.mkdir()
    code = main(["score", "--model", str(tiny_model_dir), "--data", tiny_csv, "--criterion", "ae",
                 "--calib-size", "8", "--out", str(target)])
    printed = json.loads(capsys.readouterr().out)
    assert code == 0 and [p.name for p in target.parent.iterdir()] == ["scores.json"]
    assert json.loads(target.read_text()) == printed


# -- the library: a failing call leaves the given model as it was ----------------------------------------------------

def _state(model) -> dict:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules())


def _unlabelled(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


LIBRARY_CASES = {  # case -> (model kwargs, criterion names, params, calib maker, mask shape or None, message)
    "regression model for KL": (dict(num_labels=1), ["kl"], {}, lambda: [random_batch(4, seed=1)], None,
                                r"needs a class distribution.*Use a gradient or entropy criterion"),
    "mask of another model": ({}, ["ae"], {}, lambda: [random_batch(4, seed=1)], (2, 4),
                              r"Mask shape \(2, 4\) does not fit this model's 3x4 heads"),
    "labels missing for HIES": ({}, ["ae", "hies"], {}, lambda: [_unlabelled(random_batch(4, seed=1))], None,
                                r"'hies' needs labels.*Label-free criteria: ad, ae"),
    "bad parameter among several": ({}, ["ae", "gnorm"], {"gnorm": {"reduction": "mean"}},
                                    lambda: [random_batch(4, seed=1)], None,
                                    r"reduction='mean': accepted values are per_sentence, batch"),
    "labels missing in one batch": ({}, ["his"], {}, lambda: [random_batch(4, seed=1),
                                                              _unlabelled(random_batch(4, seed=2))], None,
                                    r"'his' needs labels"),
    "empty calibration set": ({}, ["ae", "his"], {}, lambda: [], None, r"at least one calibration example"),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
def test_library_refuses_bad_input_and_leaves_the_model_intact(case):
    model_kw, names, params, calib, mask_shape, expected = LIBRARY_CASES[case]
    model = tiny_model("bert", **model_kw)
    before, hooks = _state(model), _hooks(model)
    mask = HeadMask.ones(mask_shape) if mask_shape else None
    with pytest.raises(HeadpruneError, match=expected):
        score_many(names, ScoringContext(model, calib(), mask), params)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before) and _hooks(model) == hooks
    assert not model.training


def test_sap_failing_after_its_metric_runs_leaves_the_model_as_it_was():
    """An unknown metric is found only after a first evaluation under skipped layers (stand-ins installed): the
    error must leave no stand-in, hook or changed weight behind."""
    from transformers import AutoTokenizer

    from headprune.demos.classifier import encoder_path

    tokenizer = AutoTokenizer.from_pretrained(encoder_path())
    model = tiny_model("bert", num_labels=2, vocab_size=tokenizer.vocab_size)
    texts = ["The old fisherman caught three large fish today.", "Strong winds pushed the waves onto the rocks."]
    batch = dict(tokenizer(texts, padding=True, return_tensors="pt"), labels=torch.tensor([0, 1]))
    modules_before, before = [type(m) for m in model.modules()], _state(model)
    with pytest.raises(HeadpruneError, match=r"metric='bleu' is not available"):
        get("sap")(ScoringContext(model, [batch], tokenizer=tokenizer, texts=texts),
                   {"metric": "bleu", "k_max": 2, "layer_threshold": 1})
    assert [type(m) for m in model.modules()] == modules_before and _hooks(model) == 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


# -- the dashboard: an error box naming the problem, the page and the loaded model untouched ---------------------

@pytest.fixture(scope="module")
def app_setup(tmp_path_factory):
    """A tiny classifier folder and a small CSV for the dashboard (labels rotten/fresh)."""
    from app_support import save_tiny_classifier

    root = tmp_path_factory.mktemp("bad-input-app")
    save_tiny_classifier(root / "model")
    rows = [[t, "fresh" if i % 2 else "rotten"] for i, t in enumerate(sentences(24, seed=4))]
    return {"model": str(root / "model"), "data": write_csv(root / "rows.csv", ["text", "label"], rows)}


def _open(page, app_setup, **changes):
    from app_support import open_app

    from dashboard.config import Setup

    setup = Setup(**{**dict(model=app_setup["model"], data=app_setup["data"], data_label="rows.csv",
                            calib_size=4, eval_size=8, max_length=32), **changes})
    return open_app(page, setup)


def _errors(at) -> str:
    assert not at.exception, [e.value for e in at.exception]
    return " ".join(shown(e) for e in at.error)


@pytest.mark.parametrize("text, words", [
    ('{"pruned": {"0": [-1]}}', "head -1 in layer 0"),
    ('{"pruned": {"a": [0]}}', "layer 'a' is not an integer"),
    ('{"pruned": [0, 1]}', '"pruned" must be an object'),
])
def test_dashboard_refuses_a_bad_pasted_mask_and_keeps_the_mask(app_setup, text, words):
    from app_support import metric

    at = _open("prune", app_setup)
    before, version = metric(at, "heads left"), at.session_state["hp_session"].grid_version
    at.text_area(key=f"prune-mask-text-{version}").set_value(text).run()
    at.button(key="prune-mask-apply").click().run()
    assert words in _errors(at)
    assert metric(at, "heads left") == before


def test_dashboard_scoring_with_no_calibration_text_says_so(app_setup):
    at = _open("scores", app_setup, calib_size=0)
    at.button(key="scores-compute").click().run()
    assert re.search(r"[Ss]coring needs (at least one )?calibration example.*at least 1|1 or more", _errors(at))
    assert not at.session_state["hp_session"].scores      # no grid of zeros drawn


RUN_FILES = {  # uploaded run file -> words of the error
    "latin-1 bytes": ("run.json", "caf\u00e9".encode("latin-1"), "is not UTF-8 JSON"),
    "no trajectories": ("run.json", b'{"criterion": "ae"}', "holds no trajectories"),
    "a step without metrics": ("run.json", json.dumps({"steps": [{"ratio": 0.1}], "criterion": "ae"}).encode(),
                               "is not a headprune run file"),
}


@pytest.mark.parametrize("case", list(RUN_FILES))
def test_dashboard_refuses_a_bad_run_file_and_draws_nothing(app_setup, case):
    name, data, words = RUN_FILES[case]
    at = _open("trajectories", app_setup)
    at.file_uploader(key="traj-files").set_value([(name, data, "application/json")]).run()
    at.button(key="traj-add").click().run()
    message = _errors(at)
    assert words in message and "Accepted: a run file from" in message
    assert not at.session_state["hp_session"].trajectories


def test_dashboard_refuses_a_bad_uploaded_mask_file(app_setup):
    from app_support import metric

    at = _open("prune", app_setup)
    before, version = metric(at, "heads left"), at.session_state["hp_session"].grid_version
    upload = at.file_uploader(key=f"prune-mask-upload-{version}")
    upload.set_value(("mask.json", b'{"pruned": {"9": [0]}}', "application/json")).run()
    assert "Mask names layer 9, but this model has layers 0..1" in _errors(at)
    assert metric(at, "heads left") == before


# -- data roles and label maps (issue 22): refused before any model loads ---------------------------------------------

ROLE_CASES = {  # argv after the command -> regex of the message
    "unknown calibration source": (["--calib-data", "no-such-source"],
                                   r"--calib-data no-such-source: Data file not found.*Accepted: 'demo'"),
    "evaluation data file missing": (["--eval-data", "missing.csv"], r"--eval-data missing.csv: Data file not found"),
    "selection data a folder": (["--select-data", "."], r"--select-data \.: \. is a folder, not a data file"),
    "selection data a bad hf spec": (["--select-data", "hf:a:b:c:d"], r"Bad Hugging Face dataset spec"),
    "selection size 0 for its own data": (["--select-data", "demo:train", "--select-size", "0"],
                                          r"--select-size 0 with --select-data demo:train: a role given its own data"),
    "calibration size 0 for its own data": (["--calib-data", "demo:train", "--calib-size", "0"],
                                            r"--calib-size 0(: scoring needs| with --calib-data demo:train)"),
    "label map not json": (["--label-map", "{oops"], r"label map is not JSON.*e.g. '\{\"negative\": 0"),
    "label map a list": (["--label-map", "[0, 1]"], r"label map must be a non-empty JSON object"),
}


@pytest.mark.parametrize("case", list(ROLE_CASES))
@pytest.mark.parametrize("command", ["evaluate", "score"])
def test_cli_refuses_bad_roles_before_the_model_loads(case, command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra, pattern = ROLE_CASES[case]
    argv = [command, "--model", str(tmp_path / "no-model-here"), *extra,
            *(["--criterion", "ae"] if command == "score" else [])]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith("error: ") and re.search(pattern, err, re.S), err
    assert "Model path not found" not in err and list(tmp_path.iterdir()) == []
