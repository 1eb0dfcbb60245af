"""Hostile input of issue 46 (items 3, 4, 6, 7, 8, 9; the lesson, link, port and HTML cases live with their
helpers' suites): files that are no regular file (a FIFO hung the CLI, /dev/zero was a MemoryError), JSON nested
100,000 deep, numbers past any bound, hand-edited results folders, values that ran silently wrong, the CLI's own
plan files refused on a rerun, and `run --out` places that cannot be written. Each refusal: exit code 2, one
``error:`` line naming the file or option and what is accepted, no traceback, before any weights load where the
case allows it; the valid-but-odd cases get their stated behaviour."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from conftest import refused, save_tiny_lm

import headprune.cli.core
import headprune.cli.kvcache
import headprune.cli.recover
import headprune.workspace
from headprune.cli import main
from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.outdir import SIGNATURE
from headprune.protocol import Protocol
from headprune.protocol.run import merge, run_protocol

pytestmark = pytest.mark.usefixtures("one_thread")

DEEP = "[" * 100_000 + "]" * 100_000


def _no_load(*args, **kwargs):
    raise AssertionError("weights were loaded before the input was refused")


@pytest.fixture
def no_weights(monkeypatch):
    """Every way a command loads weights fails the test: a refusal must come first."""
    for module in (headprune.cli.core, headprune.cli.recover, headprune.cli.kvcache, headprune.workspace):
        monkeypatch.setattr(module, "load_model", _no_load)


@pytest.fixture(autouse=True)
def no_hang():
    """A read that blocks (a FIFO opened for reading waits for a writer) fails the test instead of hanging CI."""
    def stop(*_):
        raise AssertionError("the command hung (a FIFO or device was opened?)")
    before = signal.signal(signal.SIGALRM, stop)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)



def _argparserefused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err
    return next(line for line in err.splitlines() if line.startswith("error: "))


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """A tiny Llama LM (4 blocks x 2 key/value groups x 8 query heads, 128 positions) and its rows."""
    return save_tiny_lm(tmp_path_factory.mktemp("lm46"))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Files that are no plan: a FIFO, a link to /dev/zero, JSON nested 100,000 deep, a 10**7 x 10**7 grid, a
    budget plan of 10**30 tokens."""
    root = tmp_path_factory.mktemp("hostile46")
    os.mkfifo(root / "fifo.json")
    (root / "zero.json").symlink_to("/dev/zero")
    (root / "deep.json").write_text(DEEP)
    (root / "huge.json").write_text(json.dumps({"format": "headprune-kv-plan", "version": 1, "shape": [10**7, 10**7],
                                                "n_heads": 10**7, "full": {}}))
    budgets = {"format": "headprune-kv-plan", "version": 2, "kind": "budgets", "shape": [4, 2], "n_heads": 8,
               "sink": 1, "budget": 100, "budgets": [[10, None]] * 4}
    (root / "budget30.json").write_text(json.dumps({**budgets, "budgets": [[10**30, None]] * 4}))
    (root / "total30.json").write_text(json.dumps({**budgets, "budget": 10**30}))
    return root


# -- item 4: devices, FIFOs, depth and sizes in a plan ---------------------------------------------------------------

PLAN_CASES = {"fifo.json": "FIFO", "zero.json": "character device", "deep.json": "100000 deep",
              "huge.json": "10000000", "budget30.json": "budget", "total30.json": "total"}


@pytest.mark.parametrize("command", ["evaluate", "generate"])
@pytest.mark.parametrize("name", list(PLAN_CASES))
@pytest.mark.usefixtures("no_weights")
def test_a_plan_that_is_no_plan_is_refused_before_weights_load(command, name, lm, hostile, capsys):
    model, rows = lm
    extra = ["--data", rows] if command == "evaluate" else ["--prompt", "the plot was"]
    line = refused([command, "--model", model, *extra, "--kv-plan", hostile / name], capsys)
    assert PLAN_CASES[name] in line and ("KV plan" in line or "Budget plan" in line), line


def test_a_plan_grid_past_its_bounds_is_refused_before_anything_is_allocated():
    """Without a model to compare with, the shape's own bounds refuse 10**7 blocks (it asked for 100 TB)."""
    with pytest.raises(KVPlanError, match=r"blocks 10000000 must be an integer in \[1, 4096\]"):
        KVPlan.from_json({"format": "headprune-kv-plan", "shape": [10**7, 10**7], "n_heads": 10**7, "full": {}})
    with pytest.raises(KVPlanError, match="n_heads"):
        KVPlan.from_json({"format": "headprune-kv-plan", "shape": [2, 2], "n_heads": 10**30, "full": {}})


@pytest.mark.parametrize("kind", ["fifo", "zero", "deep"])
@pytest.mark.parametrize("command", ["evaluate", "kvplan"])
def test_a_config_json_that_is_no_regular_file_or_too_deep_isrefused(kind, command, lm, tmp_path, capsys):
    """kvplan reads config.json before loading (refused there); evaluate's load_model refuses before any weight."""
    model, rows = lm
    folder = tmp_path / "m"
    shutil.copytree(model, folder)
    (folder / "config.json").unlink()
    if kind == "fifo":
        os.mkfifo(folder / "config.json")
    elif kind == "zero":
        (folder / "config.json").symlink_to("/dev/zero")
    else:
        (folder / "config.json").write_text(DEEP)
    extra = ["--out", tmp_path / "plan.json"] if command == "kvplan" else []
    line = refused([command, "--model", folder, "--data", rows, *extra], capsys)
    assert "config.json" in line and {"fifo": "FIFO", "zero": "character device", "deep": "deep"}[kind] in line


@pytest.mark.parametrize("argv, needle", [
    (["kvplan", "--rule", "random", "--budget", 2**70], "tokens >= 0, at most 1,099,511,627,776"),
    (["kvplan", "--rule", "duo", "--duo-steps", 1000, "--duo-batch", 1000], "1,000,000 passkey rows"),
    (["kvplan", "--rule", "duo", "--duo-steps", 100_000, "--duo-batch", 100_000], "batch size 100000"),
    (["kvplan", "--rule", "duo", "--duo-length", 200], "--duo-length 200 is longer than"),
])
@pytest.mark.usefixtures("no_weights")
def test_numbers_past_their_bounds_are_refused_naming_them(argv, needle, lm, tmp_path, capsys):
    """Each option inside its bound and their product not (1,000 x 1,000 DuoAttention rows hung building them);
    a DuoAttention row longer than the model's 128 positions trained on positions it has no embedding for."""
    model, rows = lm
    line = refused([*argv, "--model", model, "--data", rows, "--out", tmp_path / "p.json"], capsys)
    assert needle in line, line
    if "1,000,000" in needle:
        assert "--duo-steps" in line and "--duo-batch" in line


@pytest.mark.parametrize("command", ["evaluate", "kvplan", "generate", "score"])
def test_a_seed_past_its_bound_is_refused_by_the_parser(command, lm, capsys):
    model, rows = lm
    extra = {"generate": ["--prompt", "the plot", "--sample"], "score": ["--criterion", "random"],
             "kvplan": ["--out", "p.json"]}.get(command, [])
    data = [] if command == "generate" else ["--data", rows]
    line = _argparserefused([command, "--model", model, *data, *extra, "--seed", 2**70], capsys)
    assert "--seed" in line and "2,147,483,647" in line


@pytest.mark.parametrize("field, flag", [("epochs", "--epochs"), ("steps", "--steps"), ("batch_size", "--batch-size"),
                                         ("lora_rank", "--lora-rank"), ("max_length", "--max-length")])
def test_recovery_numbers_past_their_bounds_are_refused_with_the_reason(field, flag):
    """recover's integers had a floor only: 2**70 epochs reached the Trainer (an overflow, or a run of ages)."""
    from headprune.recovery.spec import RecoveryError, RecoverySpec

    with pytest.raises(RecoveryError, match=rf"{flag} {2**70}: .* must be an integer in \[\d+, [\d,]+\] \(.+\)"):
        RecoverySpec(**{field: 2**70})


# -- item 7: values that ran silently wrong ------------------------------------------------------------------------

@pytest.mark.parametrize("command", ["evaluate", "generate"])
@pytest.mark.usefixtures("no_weights")
def test_an_empty_kv_plan_value_is_refused_not_ignored(command, lm, capsys):
    model, rows = lm
    extra = ["--data", rows] if command == "evaluate" else ["--prompt", "the plot was"]
    assert "--kv-plan is empty" in refused([command, "--model", model, *extra, "--kv-plan", ""], capsys)


@pytest.mark.parametrize("spellings", [("0.5", "0.50"), ("0.5", "5e-1"), ("0.25", ".25")])
def test_paper_values_under_two_spellings_of_one_sparsity_arerefused(spellings, tmp_path, tiny_model_dir, tiny_csv,
                                                                       capsys):
    first, second = spellings
    text = (f'name = "pp"\nmodels = ["{tiny_model_dir}"]\nsparsities = [0.5]\n[data.calib]\nsource = "{tiny_csv}"\n'
            f'size = 8\n[data.eval]\nsource = "{tiny_csv}"\nsize = 8\n[[criteria]]\nname = "random"\n[[paper]]\n'
            f'model = "m"\nmetric = "accuracy"\ncite = "T1"\nrandom = {{ "{first}" = 0.8, "{second}" = 0.7 }}\n')
    (tmp_path / "pp.toml").write_text(text)
    line = refused(["run", tmp_path / "pp.toml", "--plan", "--no-timing"], capsys)
    assert f'"{first}" and "{second}" are the same sparsity' in line and "line 16" in line


# -- item 8: the CLI's own outputs are its own on a rerun ----------------------------------------------------------

@pytest.mark.parametrize("extra", [["--rule", "random", "--window", "4", "--head-ids", "ids.json"],
                                   ["--rule", "random", "--budget", "100"],
                                   ["--rule", "razor", "--window", "4", "--compensation"]],
                         ids=["plan", "budget", "compensation"])
def test_a_plan_an_earlier_kvplan_wrote_is_replaced_on_a_rerun(extra, lm, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model, rows = lm
    argv = ["kvplan", "--model", model, "--data", rows, "--sink", "1", "--out", "plan.json", *extra]
    for _ in range(2):   # the second run replaced the first's files: they are signed as the CLI's own
        assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    for name in ["plan.json"] + (["ids.json"] if "--head-ids" in extra else []):
        assert next(iter(json.loads((tmp_path / name).read_text()))) == SIGNATURE
    plan = KVPlan.read(tmp_path / "plan.json")
    assert SIGNATURE not in plan.to_json() and plan.shape == (4, 2)   # the signature is no part of the plan
    assert plan.compensation == ("--compensation" in extra) and plan.is_budget == ("--budget" in extra)
    (tmp_path / "mine.json").write_text('{"my": "notes"}')   # a user's own file is still refused
    line = refused([*argv[:-len(extra) - 2], "--out", "mine.json", *extra], capsys)
    assert "was not written by headprune" in line and (tmp_path / "mine.json").read_text() == '{"my": "notes"}'


# -- item 9: the residue of the previous set -----------------------------------------------------------------------

@pytest.mark.usefixtures("no_weights")
def test_a_model_type_that_is_a_list_isrefused(lm, tmp_path, capsys):
    model, rows = lm
    folder = tmp_path / "m"
    shutil.copytree(model, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": ["llama"]}))
    line = refused(["kvplan", "--model", folder, "--data", rows, "--out", tmp_path / "p.json"], capsys)
    assert "'model_type' (if any) is a name" in line
    (tmp_path / "kv.toml").write_text(
        f'name = "kv"\nmodels = ["{folder}"]\n[data.calib]\nsource = "{rows}"\nsize = 8\n[data.eval]\n'
        f'source = "{rows}"\nsize = 8\n[kv]\nrules = ["random"]\nfull_shares = [0.5]\nsink = 1\nwindow = 3\n')
    assert "'model_type' (if any) is a name" in refused(["run", tmp_path / "kv.toml", "--plan", "--no-timing"],
                                                          capsys)


def _unwritable(tmp_path) -> Path:
    """A new folder this user cannot create: inside a read-only folder, or for root (whom modes do not stop) in
    sysfs, which refuses new folders to everyone."""
    if os.geteuid() == 0:
        return Path("/sys/headprune-issue46-out")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    return locked / "out"


@pytest.mark.parametrize("kind", ["dangling", "loop", "inside a loop", "unwritable"])
@pytest.mark.usefixtures("no_weights")
def test_run_out_that_cannot_be_written_is_refused_in_words(kind, tmp_path, tiny_model_dir, tiny_csv, capsys):
    (tmp_path / "p.toml").write_text(
        f'name = "p"\nmodels = ["{tiny_model_dir}"]\nsparsities = [0.5]\n[data.calib]\nsource = "{tiny_csv}"\n'
        f'size = 8\n[data.eval]\nsource = "{tiny_csv}"\nsize = 8\n[[criteria]]\nname = "random"\n')
    if kind == "unwritable":
        out = _unwritable(tmp_path)
    else:
        (tmp_path / "link").symlink_to(tmp_path / ("nowhere" if kind == "dangling" else "link"))
        out = tmp_path / "link" / ("sub" if kind == "inside a loop" else "")
    line = refused(["run", tmp_path / "p.toml", "--out", out], capsys)
    said = {"dangling": "which does not exist", "loop": "Too many levels of symbolic links",
            "inside a loop": "Too many levels of symbolic links", "unwritable": "Accepted: a new or empty folder"}
    assert said[kind] in line, line
    assert not os.path.lexists(tmp_path / "nowhere") and (kind != "unwritable" or not os.path.lexists(out))


def test_stability_measures_of_a_language_model_are_said_left_out_in_the_table_and_run_file(lm, tmp_path):
    """Stated behaviour (not refused: the task is known once the data is read; a multiple-choice LM answers): the
    table leaves the measures out of the LM's rows and says so under the table and in run.json's notes."""
    model, rows = lm
    text = (f'name = "s"\nmodels = ["{model}"]\nsparsities = [0.5]\nbatch_size = 8\n'
            f'metrics = ["perplexity", "agreement", "stability"]\n[data.calib]\nsource = "{rows}"\nsize = 6\n'
            f'[data.eval]\nsource = "{rows}"\nsize = 6\n[[criteria]]\nname = "random"\n')
    summary = run_protocol(Protocol.parse(text, str(tmp_path / "s.toml")), tmp_path / "out", plots=False)
    said = f"agreement, stability not reported for {model}"
    header = summary["table"].splitlines()[0]
    assert said in summary["table"] and "perplexity" in header and "agreement" not in header \
        and "stability" not in header
    notes = json.loads((tmp_path / "out" / "run.json").read_text())["notes"]
    assert any(note.startswith(said) and "gives no answers to compare" in note for note in notes)


# -- item 3: protocol files ----------------------------------------------------------------------------------------

def test_a_protocol_file_linked_to_another_file_shows_none_of_it(tmp_path, capsys):
    """What a protocol file may be (docs/reference/formats.md): a regular UTF-8 TOML file of at most 1 MiB,
    wherever its links lead (the user's own file, read with the user's rights); errors name a key and a line,
    never the file's lines."""
    (tmp_path / "x.toml").symlink_to("/etc/passwd")
    line = refused(["run", tmp_path / "x.toml", "--plan", "--no-timing"], capsys)
    assert "not valid TOML" in line and ":0:0:" not in line and "/bin/" not in line
    os.mkfifo(tmp_path / "f.toml")
    assert "FIFO" in refused(["run", tmp_path / "f.toml", "--plan", "--no-timing"], capsys)
    (tmp_path / "big.toml").write_text("# " + "x" * 2**20 + "\n")
    assert "over the 1,048,576 bytes read" in refused(["run", tmp_path / "big.toml", "--plan", "--no-timing"],
                                                       capsys)


# -- item 6: a results folder's saved_mask fields, edited -----------------------------------------------------------

@pytest.fixture(scope="module")
def trajectory_folder(tmp_path_factory, tiny_model_dir, tiny_csv):
    """A trajectory protocol's results folder whose cell saved its mask by a tolerance rule (the fields edited)."""
    root = tmp_path_factory.mktemp("saved46")
    text = (f'name = "g"\nmodels = ["{tiny_model_dir}"]\nbatch_size = 8\n\n[data.calib]\nsource = "{tiny_csv}"\n'
            f'size = 12\n\n[data.select]\nsource = "{tiny_csv}"\nsize = 12\n\n[data.eval]\nsource = "{tiny_csv}"\n'
            'size = 12\n\n[[criteria]]\nname = "random"\n\n[trajectory]\nstep = 2\nmask_tolerance = 0.95\n')
    (root / "g.toml").write_text(text)
    protocol = Protocol.read(root / "g.toml")
    run_protocol(protocol, root / "out", plots=False)
    return protocol, root / "out"


SAVED_EDITS = {
    "empty": ({}, "has no 'step'"), "step text": ({"step": "3"}, "'saved_mask.step' is '3'"),
    "step 10**9": ({"step": 10**9}, "'saved_mask.step' is 1000000000"),
    "step -1": ({"step": -1}, "'saved_mask.step' is -1"), "step float": ({"step": 1.0}, "is 1.0"),
    "step bool": ({"step": True}, "is True"), "ratio text": ({"ratio": "a"}, "'saved_mask.ratio' is 'a'"),
    "ratio of another step": (None, "not the pruned ratio of its step"),
    "rule number": ({"rule": 3}, "'saved_mask.rule' is 3"), "size text": ({"size": "x"}, "'saved_mask.size' is 'x'"),
    "size of texts": ({"size": {"params_before": "a"}}, "not an object of numbers"),
    "points list": ({"points": []}, "'saved_mask.points' is []"),
    "point number": ({"points": {"tolerance": 1}}, "'saved_mask.points.tolerance' is 1"),
    "point ratio text": ({"points": {"tolerance": {"step": 0, "ratio": "a", "value": 0.5}}},
                         "'saved_mask.points.tolerance.ratio' is 'a'"),
}


@pytest.mark.parametrize("edit", list(SAVED_EDITS))
def test_an_edited_saved_mask_is_refused_naming_the_cell_file_and_field(edit, trajectory_folder, tmp_path, capsys):
    protocol, out = trajectory_folder
    folder = tmp_path / "out"
    shutil.copytree(out, folder)
    [cell] = (folder / "cells").glob("*.json")
    record = json.loads(cell.read_text())
    change, needle = SAVED_EDITS[edit]
    if change is None:   # another step under the saved step's ratio: a table mixing two steps' numbers
        last = len(record["trajectory"]["steps"])
        change = {"step": (record["saved_mask"]["step"] + 1) % (last + 1)}
    record["saved_mask"] = {} if not change else {**record["saved_mask"], **change}
    cell.write_text(json.dumps(record))
    line = refused(["run", protocol.source, "--merge", folder, "--no-plots"], capsys)
    assert str(cell) in line and needle in line, line


def test_a_results_folder_file_that_is_no_regular_file_is_refused_not_waited_on(trajectory_folder, tmp_path, capsys):
    protocol, out = trajectory_folder
    folder = tmp_path / "out"
    shutil.copytree(out, folder)
    merge(protocol, folder, plots=False)   # the folder as written merges
    [cell] = (folder / "cells").glob("*.json")
    cell.unlink()
    os.mkfifo(cell)
    line = refused(["run", protocol.source, "--merge", folder, "--no-plots"], capsys)
    assert str(cell) in line and "FIFO" in line
    cell.unlink()
    cell.write_text(DEEP)
    assert "100000 deep" in refused(["run", protocol.source, "--merge", folder, "--no-plots"], capsys)


# -- item 3: the other readers of a user's file --------------------------------------------------------------------

@pytest.mark.parametrize("option", ["--mask", "--data"])
@pytest.mark.usefixtures("no_weights")
def test_a_mask_or_data_file_that_is_a_fifo_isrefused(option, tiny_model_dir, tiny_csv, tmp_path, capsys):
    os.mkfifo(tmp_path / "f.json")
    argv = ["evaluate", "--model", tiny_model_dir, "--data", tiny_csv, option, tmp_path / "f.json"]
    assert "FIFO" in refused(argv, capsys)


def test_a_deep_mask_upload_or_run_file_is_refused_by_depth():
    from headprune.errors import MaskError
    from headprune.model.mask import HeadMask
    from headprune.trajectory import TrajectoryError, read_run_file

    with pytest.raises(MaskError, match="100000 deep"):
        HeadMask.from_bytes(DEEP.encode(), "m.json", (2, 2))
    with pytest.raises(TrajectoryError, match="100000 deep"):
        read_run_file(DEEP.encode(), "run.json")
    plan = KVPlan(torch.zeros(2, 2, dtype=torch.bool), 4, sink=1, window=2)
    assert plan.to_json() == KVPlan.from_json(plan.to_json()).to_json()
