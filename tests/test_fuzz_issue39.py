"""Hostile and odd inputs of issue 39, by class (the classes of test_fuzz_inputs.py go on here: this module needs
no demo, so it runs while a demo is being built): options and protocol values that were dropped or mis-filed
without a word, and outputs that must not replace a user's file. Each refusal: exit code 2, one ``error:`` line,
no traceback, nothing created or deleted."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import refused, tiny_protocol
from test_fuzz_inputs import no_weights  # noqa: F401 - the fixture: a refusal comes before any weights load

from headprune.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")



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
def test_two_names_that_become_one_file_name_arerefused(labels, models, tmp_path, tiny_model_dir, tiny_csv, capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv, labels, models)
    line = refused(["run", path, "--out", tmp_path / "out"], capsys)
    assert "name the same result files" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_a_paper_value_that_is_not_a_finite_number_isrefused(value, tmp_path, tiny_model_dir, tiny_csv, capsys):
    paper = f'[[paper]]\nmodel = "m"\nmetric = "accuracy"\ncite = "T1"\nr = {{ "0.5" = {value} }}\n'
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv, paper=paper)
    line = refused(["run", path, "--plan", "--no-timing"], capsys)
    assert "finite number" in line and "paper.0.r" in line


def test_status_and_merge_together_arerefused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    line = refused(["run", "--status", tmp_path / "a", "--merge", tmp_path / "b"], capsys)
    assert "--status" in line and "--merge" in line and "one per call" in line


@pytest.mark.parametrize("executor", [[], ["--executor", "local"], ["--executor", "slurm"]])
@pytest.mark.usefixtures("no_weights")
def test_threads_without_a_pool_isrefused(executor, tmp_path, tiny_model_dir, tiny_csv, capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    line = refused(["run", path, "--out", tmp_path / "out", "--threads", "2", *executor], capsys)
    assert "--threads" in line and "--executor pool" in line and not (tmp_path / "out").exists()


@pytest.mark.parametrize("params", [["sparsity=0.5", "tolerance=0.8"], ["tolerance=0.9", "sparsity=0.25"]])
@pytest.mark.usefixtures("no_weights")
def test_sap_cf_with_a_sparsity_and_a_tolerance_isrefused(params, tiny_model_dir, tiny_csv, capsys):
    argv = ["score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "sap-cf"]
    for p in params:
        argv += ["--param", p]
    line = refused(argv, capsys)
    assert "tolerance" in line and "sparsity 0 only" in line


@pytest.mark.parametrize("extra", [[], ["--param", "sparsity=0"]])
@pytest.mark.usefixtures("no_weights")
def test_sap_cf_widened_pool_without_a_target_isrefused(extra, tiny_model_dir, tiny_csv, capsys):
    """cf_pool = 'widened' builds CF's pool around a target sparsity; with none given (the default 0: the paper's
    tolerance mode) it cannot apply, written or not."""
    argv = ["score", "--model", tiny_model_dir, "--data", tiny_csv, "--criterion", "sap-cf",
            "--param", "cf_pool=widened", *extra]
    line = refused(argv, capsys)
    assert "cf_pool='widened' applies to a target sparsity only" in line, line


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
def test_shard_values_outside_ascii_whole_numbers_or_the_bound_arerefused(shard, tmp_path, tiny_model_dir, tiny_csv,
                                                                           capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    line = refused(["run", path, "--out", tmp_path / "out", f"--shard={shard}"], capsys)
    assert "--shard" in line and "Accepted: I/N" in line and not (tmp_path / "out").exists()


# -- a results folder read as untrusted input (run --merge, run --status) --------------------------------------------

DENSE_CELL, RANDOM_CELL = "cells/{m}__dense__r0.json", "cells/{m}__random__s0.5__r0.json"


@pytest.fixture(scope="module")
def results(tmp_path_factory, tiny_model_dir, tiny_csv, one_thread) -> dict:
    """A finished run of a one-criterion protocol (2 cells, about a second): {"out": folder, "slug": model slug}."""
    root = tmp_path_factory.mktemp("results")
    protocol = tiny_protocol(root / "p.toml", tiny_model_dir, tiny_csv, name="tiny", sparsities="[0.5]")
    assert main(["run", protocol, "--out", str(root / "out"), "--no-plots"]) == 0
    cells = sorted(p.name for p in (root / "out" / "cells").iterdir())
    return {"out": root / "out", "slug": cells[0].split("__")[0]}


def _edit(folder, name, change):
    path = folder / name
    record = json.loads(path.read_text()) if path.exists() else None
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(change(record)))


def _cell(name, change):
    return lambda folder, m: _edit(folder, name.format(m=m), change)


def _pending(name, change):
    """The random cell not computed, and ``name`` (its claim or failure file) written by ``change``."""
    def apply(folder, m):
        (folder / RANDOM_CELL.format(m=m)).unlink()
        _edit(folder, name.format(m=m), lambda _: change)
    return apply


def _without(key):
    return lambda r: {k: v for k, v in r.items() if k != key}


FOLDERS = {   # what a hand, another tool or a copy may leave in a results folder: (change, words the error says)
    "cell without metrics": (_cell(RANDOM_CELL, _without("metrics")), "'metrics' is missing"),
    "metrics that are text": (_cell(RANDOM_CELL, lambda r: {**r, "metrics": "0.9"}), "object of numbers"),
    "a metric that is text": (_cell(DENSE_CELL, lambda r: {**r, "metrics": {**r["metrics"], "accuracy": "high"}}),
                              "object of numbers"),
    "a metric left out": (_cell(DENSE_CELL, lambda r: {**r, "metrics": _without("accuracy")(r["metrics"])}),
                          "lack accuracy"),
    "a cell naming another model": (_cell(RANDOM_CELL, lambda r: {**r, "model": "other"}), "'model' is"),
    "a cell of another repeat": (_cell(RANDOM_CELL, lambda r: {**r, "repeat": "0"}), "(this cell's)"),
    "a cell that is a list": (_cell(DENSE_CELL, lambda r: [r]), "not a JSON object"),
    "roles without the evaluation role": (_cell(DENSE_CELL, lambda r: {**r, "roles": {}}), "evaluation role"),
    "an unknown task": (_cell(DENSE_CELL, lambda r: {**r, "task": "poetry"}), "one of classification"),
    "loaded as null": (_cell(DENSE_CELL, lambda r: {**r, "loaded": None}), "'loaded' is NoneType"),
    "seconds as text": (_cell(DENSE_CELL, lambda r: {**r, "seconds": "1s"}), "'seconds' is str"),
    "a marker whose source is a number": (_cell(".headprune-run.json", lambda r: {**r, "source": 5}),
                                          "names no protocol file"),
    "a marker whose source is null": (_cell(".headprune-run.json", lambda r: {**r, "source": None}),
                                      "names no protocol file"),
    "a failure that is a list": (_pending("failed/{m}__random__s0.5__r0.json", ["boom"]), "not a JSON object"),
    "a failure whose error is a number": (_pending("failed/{m}__random__s0.5__r0.json", {"error": 7}),
                                          "'error' is int"),
    "a claim {}": (_pending("claims/{m}__random__s0.5__r0.json", {}), "'host' is missing"),
    "a claim whose pid is text": (_pending("claims/{m}__random__s0.5__r0.json",
                                           {"host": "h", "pid": "abc", "since": 1.0}), "a process id"),
    "a claim whose pid is 2**80": (_pending("claims/{m}__random__s0.5__r0.json",
                                            {"host": "h", "pid": 2 ** 80, "since": 1.0}), "a process id"),
    "a claim whose pid is 0": (_pending("claims/{m}__random__s0.5__r0.json",
                                        {"host": "h", "pid": 0, "since": 1.0}), "a process id"),
    "a claim whose start is 1e300": (_pending("claims/{m}__random__s0.5__r0.json",
                                              {"host": "h", "pid": 1, "since": 1e300}), "seconds since 1970"),
    "a claim whose host is a list": (_pending("claims/{m}__random__s0.5__r0.json",
                                              {"host": [], "pid": 1, "since": 1.0}), "a host name"),
}
STATUS_ONLY = {"a claim {}", "a claim whose pid is text", "a claim whose pid is 2**80", "a claim whose pid is 0",
               "a claim whose start is 1e300", "a claim whose host is a list"}   # --merge stops at the missing cell


def _snapshot(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("case", list(FOLDERS))
@pytest.mark.parametrize("flag", ["--merge", "--status"])
def test_a_results_folder_is_read_as_untrusted_input(case, flag, results, tmp_path, capsys):
    if flag == "--merge" and case in STATUS_ONLY:
        pytest.skip("--merge refuses the folder for its missing cell first (the claim is --status's)")
    folder = tmp_path / "out"
    shutil.copytree(results["out"], folder)
    change, words = FOLDERS[case]
    change(folder, results["slug"])
    before = _snapshot(folder)
    code = main(["run", flag, str(folder)])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and words in errors[0] and "Accepted" in errors[0], err
    assert _snapshot(folder) == before   # nothing written, nothing deleted


def test_the_untouched_results_folder_merges_and_reports(results, tmp_path, capsys):
    """The reader accepts every file a run wrote: the unchanged copy merges and its status is 2 of 2 done."""
    folder = tmp_path / "out"
    shutil.copytree(results["out"], folder)
    assert main(["run", "--status", str(folder)]) == 0 and "2 done" in capsys.readouterr().err
    assert main(["run", "--merge", str(folder), "--no-plots"]) == 0


# -- files headprune wrote, read back: score files whose own fields are not what `score` writes ----------------------

SAP_FILE = {"criterion": "sap", "layers": 3, "heads": 4, "scores": [[-3.0, -2.0, -1.0, 0.0]] * 3,
            "higher_is_more_important": True, "params": {"k": 0, "sparsity": 0.5, "layer_threshold": 0},
            "best_k": 1, "sap_mask": {"pruned": {"0": [0, 1, 2, 3], "1": [0, 1]}, "shape": [3, 4]},
            "sap_dropped_layers": [], "per_sparsity": {"0.25": {"best_k": 2, "mask": {
                "pruned": {"0": [0, 1, 2]}, "shape": [3, 4], "dropped_layers": []}}}}
KWON_FILE = {"criterion": "kwon", "layers": 3, "heads": 4, "scores": [[0.0, 3.0, 1.0, 2.0], [11.0, 5.0, 4.0, 6.0],
                                                                       [8.0, 9.0, 10.0, 7.0]],
             "higher_is_more_important": True, "params": {"budget": 0.5, "tune": True},
             "kwon_mask": {"pruned": {"0": [0, 1, 2, 3], "1": [1, 2]}, "shape": [3, 4],
                           "scales": {"1": {"0": 0.99}, "2": {"3": 1.01}}}}


def _score_file(tmp_path, base: dict, change) -> str:
    obj = json.loads(json.dumps(base))
    change(obj)
    path = tmp_path / "scores.json"
    path.write_text(json.dumps(obj))
    return str(path)


def _set(*keys_value):
    *keys, value = keys_value

    def change(obj):
        for key in keys[:-1]:
            obj = obj[key]
        obj[keys[-1]] = value
    return change


SCORE_FILES = {   # (the file as written, the change, --sparsity asked, words the error says)
    "sap params a list": (SAP_FILE, _set("params", [0.5]), 0.5, '"params" is list'),
    "sap params null": (SAP_FILE, _set("params", None), 0.5, '"params" is NoneType'),
    "sap params text": (SAP_FILE, _set("params", "sparsity=0.5"), 0.5, '"params" is str'),
    "sap sparsity text": (SAP_FILE, _set("params", "sparsity", "half"), 0.5, '"sparsity" is a number'),
    "sap level without its mask": (SAP_FILE, _set("per_sparsity", "0.25", "mask", None), 0.25, "holds its mask"),
    "sap level a list": (SAP_FILE, _set("per_sparsity", "0.25", []), 0.25, "holds its mask"),
    "sap own level without its mask": (SAP_FILE, _set("sap_mask", "gone"), 0.5, "holds its mask"),
    "sap levels a list": (SAP_FILE, _set("per_sparsity", [0.25]), 0.25, '"per_sparsity" is an object'),
    "sap level key not a number": (SAP_FILE, _set("per_sparsity", {"half": {}}), 0.25, '"per_sparsity" is an obj'),
    "kwon params a list": (KWON_FILE, _set("params", [0.5]), 0.5, '"params" is list'),
    "kwon params null": (KWON_FILE, _set("params", None), 0.5, '"params" is NoneType'),
    "kwon budget text": (KWON_FILE, _set("params", "budget", "half"), 0.5, '"budget" is a number'),
    "kwon budget null": (KWON_FILE, _set("params", "budget", None), 0.5, '"budget" is a number'),
    "kwon mask text": (KWON_FILE, _set("kwon_mask", "pruned"), 0.5, '"kwon_mask" is a mask'),
}


@pytest.mark.parametrize("case", list(SCORE_FILES))
def test_mask_refuses_a_score_file_whose_own_fields_are_not_what_score_writes(case, tmp_path, capsys):
    base, change, sparsity, words = SCORE_FILES[case]
    path = _score_file(tmp_path, base, change)
    line = refused(["mask", "--scores", path, "--sparsity", sparsity, "--out", tmp_path / "mask.json"], capsys)
    assert words in line and "Accepted" in line and not (tmp_path / "mask.json").exists()


@pytest.mark.parametrize("base, sparsity, pruned", [(SAP_FILE, 0.5, 6), (SAP_FILE, 0.25, 3), (KWON_FILE, 0.5, 6)])
def test_mask_reads_the_score_files_as_written(base, sparsity, pruned, tmp_path, capsys):
    """The checks refuse nothing `score` writes: each level's own mask is what `mask --sparsity` writes."""
    path = _score_file(tmp_path, base, lambda obj: None)
    assert main(["mask", "--scores", path, "--sparsity", str(sparsity), "--out", str(tmp_path / "m.json")]) == 0
    written = json.loads((tmp_path / "m.json").read_text())
    assert written["pruned_heads"] == pruned == sum(len(h) for h in written["pruned"].values())


@pytest.mark.parametrize("key", ["²", "٣", "1_0", " 1", "-0", "0x1"])
def test_a_kv_plan_layer_key_outside_ascii_digits_isrefused(key, tmp_path):
    from headprune.kvcache.plan import KVPlan, KVPlanError

    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"format": "headprune-kv-plan", "version": 1, "shape": [2, 2], "n_heads": 4,
                                "sink": 2, "window": 8, "full": {key: [0]}}))
    with pytest.raises(KVPlanError, match="names layer"):
        KVPlan.read(path)


# -- limits: a protocol file nested past the parser's stack, or with one enormous line -------------------------------

@pytest.mark.parametrize("value", ["[" * 3000 + "]" * 3000, "{a = " * 3000 + "1" + "}" * 3000, "[" * 33 + "]" * 33,
                                   "[{a = " * 17 + "1" + "}]" * 17], ids=["arrays-3000", "tables-3000", "arrays-33",
                                                                        "mixed-34"])
def test_toml_nested_past_the_depth_limit_isrefused(value, tmp_path, tiny_model_dir, tiny_csv, capsys):
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\nx = {value}\n")
    line = refused(["run", path, "--plan", "--no-timing"], capsys)
    assert "nested" in line and "at most 32 levels" in line


def test_brackets_in_strings_and_comments_do_not_count_as_nesting():
    from headprune.protocol.spec import toml_depth

    text = 'a = [[1], [2]]\n[[criteria]]\nb = "[[[[" # [[[[\nc = \'\'\'[[[\n{{\'\'\'\nd = { x = { y = "}}" } }\n'
    assert toml_depth(text) == 2 and toml_depth("e = '[[[' \n") == 0


@pytest.mark.parametrize("value", ["[" + ".".join(["a"] * 500_000) + "]", "x." * 33 + "y = 1",
                                   "[" + ".".join(['"q"'] * 40) + "]"], ids=["header-500000", "key-34", "quoted-40"])
def test_a_dotted_key_of_too_many_parts_is_refused_before_parsing(value, tmp_path, tiny_model_dir, tiny_csv, capsys):
    """tomllib is quadratic in a dotted key's parts (500,000: minutes); past MAX_KEY_PARTS it is refused unparsed."""
    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"\n{value}\n")
    line = refused(["run", path, "--plan", "--no-timing"], capsys)
    assert "dotted key or table header of" in line and "at most 32" in line, line


def test_numbers_dates_strings_and_comments_are_no_dotted_keys():
    """Independent count: the parts of each chain written out; a float or date-time is a chain of 2, a string 1."""
    from headprune.protocol.spec import longest_key

    values = "z = [" + ", ".join(["0.5"] * 40) + "]\nw = 1979-05-27T07:32:00.999\n"
    assert longest_key(values) == 2
    assert longest_key('k = "' + "a." * 40 + '"\n# ' + "b." * 40 + "\n[c . d . e]\n" + values) == 3


@pytest.mark.parametrize("line", ["[" + " " * 1_000_000, "# " + "a" * 1_000_000, 'note = "' + "[a" * 500_000 + '"',
                                  "x = {" + ", " * 500_000], ids=["header-spaces", "comment", "string", "inline"])
def test_a_one_megabyte_line_is_read_in_bounded_time(line, tmp_path, tiny_model_dir, tiny_csv, capsys):
    """The key-line scan (KeyLines) skips lines past MAX_SCANNED_LINE and scans headers without backtracking: a
    1 MB line costs the parser's time, not minutes (the regex it replaced was polynomial on "[" and spaces)."""
    import time

    path = _protocol(tmp_path, tiny_model_dir, tiny_csv)
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n" + line + "\n")
    start = time.perf_counter()
    code = main(["run", path, "--plan", "--no-timing"])
    capsys.readouterr()
    assert time.perf_counter() - start < 30 and code in (0, 2)   # a comment plans; the rest are refused


# -- issue 39, limits: numbers and files that reached a tensor or a dict method unchecked ---------------------------

@pytest.mark.parametrize("option, value, named", [("--probe-rows", 0, "a probe count 0"),
                                                   ("--sink", 10**20, "KV plan sink 100000000000000000000"),
                                                   ("--window", 10**20, "KV plan window 100000000000000000000")])
def test_kvplan_sizes_past_their_limits_are_refused_before_weights_load(option, value, named, tmp_path, capsys):
    argv = ["kvplan", "--model", "/nonexistent-model", "--data", "demo-lm", option, value,
            "--out", tmp_path / "plan.json"]
    try:
        line = refused(argv, capsys)
    except SystemExit as exit_:     # argparse's own refusal (an option's type): exit 2, its message on stderr
        err = capsys.readouterr().err
        assert exit_.code == 2 and "Traceback" not in err, err
        line = next(ln for ln in err.splitlines() if "error:" in ln)
    assert named in line and ("1,048,576" in line or "[1, 4096]" in line), line
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("config", ["[1, 2]", '{"architectures": 5}', '{"architectures": [7]}', '"text"',
                                    '{"model_type": "llama", "text_config": [1]}'])
@pytest.mark.parametrize("command", [["evaluate", "--data", "demo"], ["generate", "--prompt", "the film"]])
def test_a_config_json_that_is_not_a_configuration_isrefused(config, command, no_weights, tmp_path,  # noqa: F811
                                                              capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(config)
    line = refused([*command, "--model", tmp_path / "m"], capsys)
    assert "is not a model configuration" in line and "JSON object" in line, line


# -- issue 39, generate: options that ran for minutes, crashed the sampler or were ignored --------------------------

@pytest.mark.parametrize("extra, words", [
    (["--temperature", "1e-45"], "applies to sampling only"),                     # was ignored without a word
    (["--sample", "--temperature", "1e-45"], "must lie in [0.01, 100]"),          # was a RuntimeError in the sampler
    (["--max-new-tokens", str(10**9)], "must be an integer in [1, 1,048,576]"),   # ran for minutes
    (["--prompt", "   "], "--prompt is empty"),                                   # became [bos, eos] silently
    (["--prompt", "caf\udcc3"], "not valid UTF-8"),                               # bytes the shell passed as-is
])
def test_generate_refuses_what_it_cannot_do_before_weights_load(extra, words, capsys):
    line = refused(["generate", "--model", "/nonexistent-model", "--prompt", "the film", *extra], capsys)
    assert words in line, line


def _never_load(*args, **kwargs):
    raise AssertionError("weights loaded before the refusal")


def test_generate_refuses_more_tokens_than_the_models_positions(monkeypatch, capsys):
    """Past the positions config.json declares: refused before weights load; within them but past them with the
    prompt: refused once the prompt is tokenised (demo-lm: 128 positions, a 4-token prompt)."""
    import headprune.cli.kvcache as cli_kv

    with monkeypatch.context() as patch:
        patch.setattr(cli_kv, "load_model", _never_load)
        line = refused(["generate", "--model", "demo-lm", "--prompt", "the film", "--max-new-tokens", 5000], capsys)
    assert "does not fit the model's 128 positions" in line, line
    line = refused(["generate", "--model", "demo-lm", "--prompt", "the film", "--max-new-tokens", 126], capsys)
    assert "exceeds the model's 128 positions" in line and "at most 124" in line, line


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory) -> str:
    from conftest import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny_llama"))[0]      # 128 positions


def test_generation_stops_at_end_of_text_and_a_huge_window_allocates_little(lm_folder):
    """Independent reference: the same greedy run without an end token; with token k of it declared end-of-text the
    run is its prefix up to that token's first occurrence. A plan window of 10**9 (W >= every length) generates
    exactly the full cache's tokens while its rings hold at most RING_START slots, not S + 10**9."""
    from transformers import AutoModelForCausalLM

    from headprune.kvcache.cache import RING_START, generate
    from headprune.kvcache.plan import KVPlan
    from headprune.kvcache.restrict import restricted

    model = AutoModelForCausalLM.from_pretrained(lm_folder).eval()
    ids = torch.tensor([[5, 9, 17, 3, 22]])
    free = generate(model, ids, 12).tokens
    eos = free[6]
    stopped = generate(model, ids, 12, eos_token_id=eos).tokens
    assert stopped == free[:free.index(eos) + 1] and len(stopped) < 12
    plan = KVPlan(torch.tensor([[True, False]] * 4), 8, sink=2, window=10**6)
    with restricted(model, plan) as copy:
        mixed = generate(copy, ids, 12, mode="mixed")
    assert mixed.tokens == free
    d = model.config.hidden_size // model.config.num_attention_heads
    assert mixed.kv_bytes_allocated <= 4 * 2 * 2 * (RING_START + 17) * d * 4     # layers x (K, V) x groups x slots


@pytest.mark.parametrize("window", [10**6, 7])
def test_rings_that_grow_from_a_few_slots_generate_what_preallocated_ones_do(window, lm_folder, monkeypatch):
    """RING_START = 3: the rings grow (3, 6, 12, ... up to S + W) while generating; the tokens are those of rings
    allocated whole (RING_START past S + W), with a window that wraps (7) and one that never does (10**6)."""
    from transformers import AutoModelForCausalLM

    import headprune.kvcache.cache as cache
    from headprune.kvcache.plan import KVPlan
    from headprune.kvcache.restrict import restricted

    model = AutoModelForCausalLM.from_pretrained(lm_folder).eval()
    ids = torch.tensor([[5, 9, 17, 3, 22, 8, 11]])
    plan = KVPlan(torch.tensor([[True, False]] * 4), 8, sink=2, window=window)
    runs = []
    for start in (3, 4096):
        monkeypatch.setattr(cache, "RING_START", start)
        with restricted(model, plan) as copy:
            runs.append(cache.generate(copy, ids, 14, mode="mixed").tokens)
    assert runs[0] == runs[1] and len(runs[0]) == 14


def test_positions_are_read_by_one_rule_before_and_after_loading(tmp_path, monkeypatch, capsys):
    """generate's and evaluate --long-context's checks before loading read the context as model_context does after
    it: GPT-2's n_positions counts (it was ignored by the long-context check), a declared 0 declares nothing."""
    import headprune.cli.kvcache as cli_kv
    from headprune.model.tokenizer import declared_context, model_context

    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], '
                                        '"n_positions": 64, "n_layer": 2, "n_head": 2, "n_embd": 16}')
    monkeypatch.setattr(cli_kv, "load_model", _never_load)
    line = refused(["generate", "--model", str(folder), "--prompt", "the film", "--max-new-tokens", 64], capsys)
    assert "does not fit the model's 64 positions" in line, line
    line = refused(["evaluate", "--model", str(folder), "--data", "demo-lm", "--long-context", "passkey",
                     "--lengths", "16,100"], capsys)
    assert "--lengths 100 exceeds the model's 64 positions" in line, line
    from transformers import GPT2Config, LlamaConfig

    gpt2 = type("Model", (), {"config": GPT2Config(n_positions=64)})
    assert declared_context({"n_positions": 64}) == model_context(gpt2) == 64
    assert declared_context({"max_position_embeddings": 0}) is None
    assert declared_context({"text_config": {"max_position_embeddings": 32}, "max_position_embeddings": 8}) == 32
    assert declared_context(LlamaConfig(max_position_embeddings=128)) == 128
