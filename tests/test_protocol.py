"""``headprune run PROTOCOL.toml``: the file validated with key and line, the plan offline, the run resumable, and
every number of the table traced back to an independent evaluation."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from headprune.cli import main
from headprune.data import content_hash
from headprune.errors import Cancelled
from headprune.protocol import KeyLines, Protocol, ProtocolError, expand, plan
from headprune.protocol import cells as adapter
from headprune.protocol.run import run_protocol

ROOT = Path(__file__).resolve().parent.parent
PROTOCOLS = ROOT / "protocols"


def line_of(text: str, fragment: str, after: str | None = None) -> int:
    """1-based line of the first line containing ``fragment`` (after the first line containing ``after``)."""
    lines = text.splitlines()
    start = 0 if after is None else next(i for i, line in enumerate(lines) if after in line)
    return next(i for i in range(start, len(lines)) if fragment in lines[i]) + 1


BASE = """\
name = "t"
models = ["demo"]
sparsities = [0.25, 0.5]
repeats = 2

[data.calib]
source = "demo:train"
size = 8

[data.eval]
source = "demo"
size = 10

[[criteria]]
name = "ae"

[[criteria]]
name = "random"
"""


# -- the file --------------------------------------------------------------------------------------------------

def test_key_lines_finds_tables_arrays_inline_tables_and_skips_multiline_strings():
    text = 'a = 1\ndescription = """\nb = 2\n"""\n[x.y]\nc = 3\n[[m]]\nd = 4\n[[m]]\nd = 5\ne.f = { g = 6, h = 7 }\n' \
           '[m.data.calib]\nsource = "s"\n'
    lines = KeyLines(text)
    assert lines.line(("a",)) == 1
    assert ("b",) not in lines.lines                  # inside a multi-line string: not a key
    assert lines.line(("x", "y", "c")) == 6
    assert lines.line(("m", 0, "d")) == 8 and lines.line(("m", 1, "d")) == 10
    assert lines.line(("m", 1, "e", "f", "h")) == 11
    assert lines.line(("m", 1, "data", "calib", "source")) == 13   # a sub-table of the last [[m]]
    assert lines.line(("m", 1, "nowhere")) == 9                    # falls back to the nearest written parent


@pytest.mark.parametrize("edit, key, fragment, after", [
    (lambda t: t.replace("repeats = 2", "repeats = 2\nsparsitys = [0.1]"), "sparsitys", "sparsitys", None),
    (lambda t: t.replace('size = 10', 'size = 10\nsplit = "test"'), "data.eval.split", "split", "[data.eval]"),
    (lambda t: t + 'label = "r"\ncolour = "red"\n', "criteria.1.colour", "colour", None),
    (lambda t: t.replace('[data.eval]', '[data.evaluation]'), "data.evaluation", "[data.evaluation]", None),
    (lambda t: t + "[trajectory]\nstep = 1\nstop = 3\n", "trajectory.stop", "stop = 3", None),
])
def test_an_unknown_key_is_named_with_its_line(edit, key, fragment, after):
    text = edit(BASE)
    with pytest.raises(ProtocolError) as err:
        Protocol.parse(text, "p.toml")
    message = str(err.value)
    assert f"p.toml, line {line_of(text, fragment, after)}:" in message, message
    assert f"'{key}'" in message and "unknown" in message


@pytest.mark.parametrize("edit, key, fragment, needle", [
    (lambda t: t.replace("[0.25, 0.5]", "[0.25, 1.5]"), "sparsities", "sparsities", "[0, 1]"),
    (lambda t: t.replace("[0.25, 0.5]", "[-0.1]"), "sparsities", "sparsities", "[0, 1]"),
    (lambda t: t.replace("repeats = 2", "repeats = 0"), "repeats", "repeats", "in [1, 1000]"),
    (lambda t: t.replace("repeats = 2", "repeats = 1000000000"), "repeats", "repeats", "each repeat is"),
    (lambda t: t.replace("repeats = 2", "repeats = 2\nbatch_size = 1000000000"), "batch_size", "batch_size",
     "in [1, 4096] (rows in one forward pass"),
    (lambda t: t.replace("repeats = 2", "repeats = 2\nmax_length = 1000000000"), "max_length", "max_length",
     "in [1, 1,048,576]"),
    (lambda t: t.replace("repeats = 2", "repeats = 2\nseed = 10000000000"), "seed", "seed", "32-bit range"),
    (lambda t: t.replace('size = 8', 'size = -3'), "data.calib.size", "size = -3", "in [1, 100,000,000]"),
    (lambda t: t.replace('size = 8', 'size = 1000000000000'), "data.calib.size", "size = 1000000000000",
     "read into memory"),
    (lambda t: t.replace('name = "ae"', 'name = "entropy"'), "criteria.0.name", '"entropy"', "Known criteria"),
    (lambda t: t.replace('name = "ae"', 'name = "ae"\nparams = { form = "Z" }'), "criteria.0.params.form",
     "params", "accepted values"),
    (lambda t: t.replace('name = "ae"', 'name = "ae"\nparams = { eps = -1 }\n'), "criteria.0.params.eps",
     "params", "> 0"),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nmetrics = ["acuracy"]'), "metrics", "metrics", "accuracy"),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nheadline = "f2"'), "headline", "headline", "accuracy"),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nmemory_budget = "lots"'), "memory_budget", "memory_budget",
     ""),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nlabel_map = ["pos"]'), "label_map", "label_map",
     "a table of data label"),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nlabel_map = { pos = 1.5 }'), "label_map", "label_map",
     "a table of data label"),
    (lambda t: t.replace("repeats = 2", 'repeats = 2\nlabels_by_position = "yes"'), "labels_by_position",
     "labels_by_position", "true or false"),
    (lambda t: t.replace('models = ["demo"]\n', "") + '[[models]]\nmodel = "demo"\nallow_untrained_head = 1\n',
     "models.0.allow_untrained_head", "allow_untrained_head", "true or false"),
    (lambda t: t.replace('size = 8', 'size = 8\nseed = 1'), "data.calib.seed", "seed = 1", "protocol's seed"),
    (lambda t: t.replace('size = 10', 'size = 10\ntext_col = "b"').replace('size = 8', 'size = 8\ntext_col = "a"'),
     "data.eval.text_col", 'text_col = "b"', "one column name per key"),
])
def test_a_bad_value_is_named_with_its_line(edit, key, fragment, needle):
    text = edit(BASE)
    with pytest.raises(ProtocolError) as err:
        Protocol.parse(text, "p.toml")
    message = str(err.value)
    assert f"'{key}'" in message and needle in message, message
    assert f"line {line_of(text, fragment)}:" in message, message


def test_label_guards_are_inherited_by_models_and_recorded():
    text = BASE.replace('models = ["demo"]\n', 'label_map = { good = "pos", bad = "neg" }\n') + \
        '[[models]]\nmodel = "demo"\n\n[[models]]\nname = "B"\nmodel = "demo"\nlabels_by_position = true\n' \
        'allow_untrained_head = true\nlabel_map = { good = 1 }\n'
    a, b = Protocol.parse(text).models
    assert dict(a.label_map) == {"good": "pos", "bad": "neg"} and not a.labels_by_position
    assert dict(b.label_map) == {"good": 1} and b.labels_by_position and b.allow_untrained_head
    assert b.to_json()["allow_untrained_head"] is True and "allow_untrained_head" not in a.to_json()
    mnli = next(m for m in Protocol.read(PROTOCOLS / "hies_table1.toml").models if m.name == "MNLI")
    assert sorted(mnli.label_map) == ["contradiction", "entailment", "neutral"]   # GLUE's names -> textattack's


def test_a_trajectory_ratio_outside_0_1_and_both_kinds_are_refused():
    text = BASE.replace("sparsities = [0.25, 0.5]\n", "") + "[trajectory]\nbudget = 1.5\n"
    with pytest.raises(ProtocolError, match=rf"line {line_of(text, 'budget')}: key 'trajectory.budget'.*\(0, 1\]"):
        Protocol.parse(text, "p.toml")
    with pytest.raises(ProtocolError, match="either sparsities"):
        Protocol.parse(BASE + "[trajectory]\nstep = 2\n")
    with pytest.raises(ProtocolError, match=r"not valid TOML.*line 2"):
        Protocol.parse('name = "x"\nmodels = ["demo" "demo"]\n', "p.toml")


def test_the_cli_refuses_a_bad_protocol_before_any_model_loads(tmp_path, monkeypatch, capsys):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(adapter, "load_model", no_loading)
    path = tmp_path / "bad.toml"
    path.write_text(BASE.replace("[0.25, 0.5]", "[0.25, 2]"), encoding="utf-8")
    assert main(["run", str(path), "--out", str(tmp_path / "out")]) == 2
    first = capsys.readouterr().err.splitlines()[0]
    assert first.startswith("error: ") and "line 3" in first and "sparsities" in first
    assert not (tmp_path / "out").exists()


def test_models_tables_override_the_protocols_roles_key_by_key_and_name_their_lines():
    text = BASE.replace('models = ["demo"]\n', "") + \
        '[[models]]\nmodel = "demo"\n\n[[models]]\nname = "B"\nmodel = "demo"\ndata.eval = { size = 5 }\n'
    protocol = Protocol.parse(text)
    a, b = protocol.models
    assert (a.data["eval"].source, a.data["eval"].size) == ("demo", 10)
    assert (b.data["eval"].source, b.data["eval"].size, b.data["calib"].size) == ("demo", 5, 8)
    bad = text.replace("size = 5 }", "size = 0 }")
    with pytest.raises(ProtocolError, match=rf"line {line_of(bad, 'size = 0')}: key 'models.1.data.eval.size'"):
        Protocol.parse(bad)


# -- the papers' protocols: parse and plan offline --------------------------------------------------------------

@pytest.mark.parametrize("name, n_models, cells_per_model, ids", [
    ("hies_table1", 8, 1 + 4 * 3, ["textattack/bert-base-uncased-SST-2", "textattack/bert-base-uncased-MNLI"]),
    ("sap_fig5", 6, 1 + 3 * 3, ["textattack/bert-base-uncased-STS-B"]),
    ("greedy_gnorm_fig3", 4, 2 * 2 * 3 + 10, ["prajjwal1/albert-base-v2-mnli"]),
    ("sap_fig6", 6, 1 + 3 * 1 * 2, ["textattack/bert-base-uncased-MNLI"]),   # pruned + recovered per sparsity
    ("sap_fig7", 2, 1 + 10 * 3, ["textattack/bert-base-uncased-MNLI", "textattack/bert-base-uncased-STS-B"]),
    ("hies_llama_zeroshot", 3, 1 + 2 * 6, ["meta-llama/Llama-2-7b-hf"]),     # HellaSwag, ARC-e, ARC-c
    ("hies_table2", 4, 1 + 2 * 5, ["textattack/bert-base-uncased-CoLA"]),     # HIS, HIES at 10-50 %
])
def test_the_papers_protocols_parse_and_plan_without_the_network(name, n_models, cells_per_model, ids, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("socket.socket.connect", lambda *a, **k: (_ for _ in ()).throw(OSError("no network")))
    text = (PROTOCOLS / f"{name}.toml").read_text(encoding="utf-8")
    assert "network" in text.lower() and "GPU" in text and "§" in text   # said, and the section cited
    protocol = Protocol.read(PROTOCOLS / f"{name}.toml")
    plans = plan(protocol, time_it=False)
    assert len(plans) == n_models
    assert all(len(p.cells) == cells_per_model for p in plans)
    assert set(ids) <= {p.entry.model for p in plans}
    for p in plans:
        assert p.kind == "hub" and "needs the model" in p.text()
        assert p.entry.data["eval"].source.startswith("hf:")
        # choices are never made on the reported rows: another source, or (a data set of one split) disjoint
        # draws from the evaluation rows' source, as every role on one source is
        assert "select" not in p.entry.data or p.entry.data["select"].source != p.entry.data["eval"].source or \
            p.entry.data["calib"].source == p.entry.data["eval"].source
        if p.entry.harness_metrics:   # lm-eval's numbers: one run per cell, said in the plan
            assert p.lm_eval_runs == cells_per_model and f"{cells_per_model} lm-eval runs" in p.text()


def test_hies_table_1_asks_for_glue_dev_and_the_papers_ratios():
    protocol = Protocol.read(PROTOCOLS / "hies_table1.toml")
    assert protocol.sparsities == (0.0, 0.1, 0.3, 0.5)
    assert [c.name for c in protocol.criteria] == ["random", "ad", "his", "hies"]
    mnli = next(m for m in protocol.models if m.name == "MNLI")
    assert mnli.data["eval"].source.endswith(":validation_matched") and mnli.data["calib"].source.endswith(":train")
    assert {m.name for m in protocol.models} == {"SST-2", "CoLA", "MRPC", "QQP", "STS-B", "QNLI", "MNLI", "RTE"}


def test_hies_table_2_carries_the_papers_values_at_its_five_ratios():
    """Table 2's values as the protocol cites them reproduce the paper's own "Average" column (hies.txt, Table 2:
    the mean of SST-2, CoLA, MRPC and QQP, to the paper's 0.01 rounding), at each of the five ratios."""
    protocol = Protocol.read(PROTOCOLS / "hies_table2.toml")
    assert protocol.sparsities == (0.0, 0.1, 0.2, 0.3, 0.4, 0.5)
    assert [c.label for c in protocol.criteria] == ["his", "hies"]
    average = {"his": [95.85, 93.44, 90.64, 83.48, 72.93], "hies": [95.41, 94.24, 91.44, 89.80, 86.16]}
    papers = {p.model: p for p in protocol.paper}
    assert set(papers) == {"SST-2", "CoLA", "MRPC", "QQP"} and {p.metric for p in papers.values()} == {"agreement"}
    for criterion, means in average.items():
        for ratio, mean in zip((0.1, 0.2, 0.3, 0.4, 0.5), means):
            values = [papers[m].values[criterion][ratio] for m in papers]
            assert sum(values) / 4 == pytest.approx(mean, abs=0.006), (criterion, ratio)


def test_plan_on_the_command_line_prints_every_cell(capsys):
    assert main(["run", str(PROTOCOLS / "sap_fig5.toml"), "--plan", "--no-timing"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["cells"] == 60 and len(result["models"]) == 6
    assert "  CoLA__sap__s0.75__r0" in captured.err.splitlines() and "needs the model" in captured.err
    assert main(["run", str(PROTOCOLS / "sap_fig5.toml")]) == 2
    assert capsys.readouterr().err.startswith("error: --out DIR is needed")


def test_the_demo_plan_counts_the_work_of_a_local_model():
    protocol = Protocol.read(PROTOCOLS / "demo.toml")
    [p] = plan(protocol, time_it=False)
    assert p.grid == (6, 12) and len(p.cells) == 1 + 3 * 2 * 2
    calib, evals = protocol.models[0].data["calib"].size, protocol.models[0].data["eval"].size
    # ae: 1 forward pass, his: a backward too (GRADIENT_PASS = 3), random: 1; scored once per repeat
    assert p.calib_row_passes == 2 * calib * (1 + 3 + 1)
    assert p.eval_row_passes == evals * len(p.cells)


def test_a_local_model_is_timed_without_its_weights(tmp_path, tiny_model_dir, tiny_csv, monkeypatch):
    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read")

    monkeypatch.setattr("headprune.model.loading.load_model", no_weights)
    monkeypatch.setattr("safetensors.torch.load_file", no_weights)
    [p] = plan(tiny_protocol(tmp_path, tiny_model_dir, tiny_csv))
    assert p.grid == (3, 4) and p.seconds is not None and p.seconds > 0 and "at most" in p.text()


# -- running: a tiny model, resumed --------------------------------------------------------------------------------

def tiny_protocol(tmp_path, model_dir, csv_path) -> Protocol:
    """BASE on the tiny model and CSV (12 calibration and 20 evaluation rows drawn apart from one file)."""
    text = BASE.replace('models = ["demo"]', f'models = ["{model_dir}"]\nbatch_size = 8') \
        .replace('"demo:train"', f'"{csv_path}"').replace('source = "demo"', f'source = "{csv_path}"') \
        .replace("size = 8", "size = 12").replace("size = 10", "size = 20")
    path = tmp_path / "tiny.toml"
    path.write_text(text, encoding="utf-8")
    return Protocol.read(path)


class Counting:
    """Counts evaluations; ``stop_after`` raises Cancelled through the progress callback after that many cells."""

    def __init__(self, monkeypatch, stop_after: int | None = None):
        self.calls = 0
        original = adapter.evaluate

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(adapter, "evaluate", counted)
        self.stop_after = stop_after

    def progress(self, fraction, message):
        if self.stop_after is not None and message.endswith(" done") and self.calls >= self.stop_after:
            raise Cancelled()


def test_an_interrupted_run_resumes_without_recomputing_finished_cells(tmp_path, tiny_model_dir, tiny_csv,
                                                                       monkeypatch, one_thread):
    protocol = tiny_protocol(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    counter = Counting(monkeypatch, stop_after=4)
    with pytest.raises(Cancelled):
        run_protocol(protocol, out, progress=counter.progress, plots=False)
    done = sorted((out / "cells").glob("*.json"))
    assert len(done) == 4 and counter.calls == 4
    assert not list(out.rglob("*.tmp")) and not (out / "results.csv").exists()
    stamps = {p.name: p.stat().st_mtime_ns for p in done}
    pending = expand(protocol)[-1].key   # what a SIGKILL mid-write of a cell would leave; and a user's own temp files
    (out / "cells" / f".{pending}.json.x1y2z3.headprune.tmp").write_text('{"half": ')
    (out / "cells" / ".draft.tmp").write_text("the user's")
    (out / ".notes.json.x1.tmp").write_text("the user's")

    counter = Counting(monkeypatch)
    summary = run_protocol(protocol, out, plots=False)
    total = len(expand(protocol))
    assert counter.calls == total - 4 == summary["computed"] and summary["reused"] == 4
    assert {p.name: p.stat().st_mtime_ns for p in done} == stamps      # finished cells untouched
    assert sorted(p.name for p in out.rglob("*.tmp")) == [".draft.tmp", ".notes.json.x1.tmp"]   # ours deleted only
    for user in out.rglob("*.tmp"):
        user.unlink()

    # the same protocol run without interruption gives the same table
    Counting(monkeypatch)
    run_protocol(protocol, tmp_path / "fresh", plots=False)
    assert (out / "results.csv").read_text() == (tmp_path / "fresh" / "results.csv").read_text()

    # a third run recomputes nothing; changing a cell's settings (the calibration size) recomputes the scored cells
    counter = Counting(monkeypatch)
    assert run_protocol(protocol, out, plots=False)["computed"] == 0 and counter.calls == 0
    changed = Protocol.parse(protocol.text.replace("size = 12", "size = 10"), protocol.source)
    counter = Counting(monkeypatch)
    assert run_protocol(changed, out, plots=False)["computed"] == total and counter.calls == total


def test_every_number_of_the_table_is_an_evaluation_of_its_mask(tmp_path, tiny_model_dir, tiny_csv, one_thread):
    from headprune.evaluation.metrics import evaluate
    from headprune.model.loading import load_model
    from headprune.model.mask import HeadMask
    from headprune.scoring import ScoreMap

    protocol = tiny_protocol(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())
    loaded = load_model(str(tiny_model_dir), "cpu")
    entry = protocol.models[0]
    hashes = set()
    for repeat in range(protocol.repeats):
        data = adapter.build_workspace_for(loaded, entry, protocol, repeat)
        calib_rows = {(t, y) for t, y in zip(data.calib.texts, data.calib.labels)}
        assert len(data.calib) == 12 and len(data.eval) == 20
        assert data.roles["eval"]["hash"] == content_hash(data.eval)
        assert calib_rows != {(t, y) for t, y in zip(data.eval.texts, data.eval.labels)}
        hashes.add(data.roles["calib"]["hash"])
        for crit in ("ae", "random"):
            for sparsity in protocol.sparsities:
                cell = next(c for c in run["cells"].values() if c["criterion"] == crit
                            and c["sparsity"] == sparsity and c["repeat"] == repeat)
                assert cell["roles"]["calib"]["hash"] == data.roles["calib"]["hash"]
                mask = HeadMask.load(out / cell["mask"], loaded.adapter.grid_shape)
                assert cell["dropped_layers"] == []
                scores = ScoreMap.from_json(json.loads((out / cell["scores"]).read_text()))
                assert torch.equal(mask.keep_bool(), torch.from_numpy(scores.kept_at(sparsity)))
                assert mask.n_pruned == round(sparsity * 12)
                again = evaluate(loaded.model, data.eval_batches, mask).to_dict()
                assert cell["metrics"]["accuracy"] == pytest.approx(again["accuracy"])
                assert cell["metrics"]["mcc"] == pytest.approx(again["mcc"])
    assert len(hashes) == protocol.repeats              # a re-drawn calibration subset per repeat
    seeds = {(c["criterion"], c["sparsity"], c["repeat"]): c.get("score_seed") for c in run["cells"].values()}
    assert seeds[("ae", 0.25, 1)] == seeds[("ae", 0.5, 1)] == 1   # one score map per repeat, seed + repeat
    random_seeds = {seeds[("random", s, r)] for s in (0.25, 0.5) for r in (0, 1)}
    assert len(random_seeds) == 4                       # an independent random mask at every rate and repeat
    eval_hashes = {c["roles"]["eval"]["hash"] for c in run["cells"].values()}
    assert len(eval_hashes) == 1                        # the same evaluation rows in every cell

    # the table: mean and sample sd over the repeats' cells, as numpy computes them
    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        cells = [c for c in run["cells"].values() if c["criterion"] == row["criterion"]
                 and (c["sparsity"] or 0.0) == float(row["sparsity"])]
        values = [c["metrics"]["accuracy"] for c in cells]
        assert float(row["accuracy mean"]) == pytest.approx(np.mean(values), abs=1e-6)
        if len(values) > 1:
            assert float(row["accuracy sd"]) == pytest.approx(np.std(values, ddof=1), abs=1e-6)
    assert {r["criterion"] for r in rows} == {"dense", "ae", "random"} and len(rows) == 1 + 2 * 2
    assert run["protocol"]["sha256"] and run["protocol"]["text"] == protocol.text and run["versions"]["torch"]
    assert "± " in (out / "results.md").read_text()


def test_plots_are_written_with_plotly_and_skipped_with_a_note_without(tmp_path, tiny_model_dir, tiny_csv,
                                                                        monkeypatch, one_thread):
    import importlib.util

    protocol = tiny_protocol(tmp_path, tiny_model_dir, tiny_csv).text.replace("repeats = 2", "repeats = 1")
    protocol = Protocol.parse(protocol, "plots.toml")
    out = tmp_path / "plots"
    summary = run_protocol(protocol, out)
    html = out / summary["plots"][0]
    assert html.suffix == ".html" and "plotly" in html.read_text()[:5000].lower()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "plotly" else real(name, *a))
    summary = run_protocol(protocol, tmp_path / "plain")
    assert summary["plots"] == [] and "plotly is not installed" in summary["notes"][0]
    assert (tmp_path / "plain" / "results.md").exists()


def test_a_trajectory_protocol_writes_orders_boxes_and_the_final_mask(tmp_path, tiny_model_dir, tiny_csv,
                                                                      one_thread):
    from headprune.model.mask import HeadMask

    text = tiny_protocol(tmp_path, tiny_model_dir, tiny_csv).text.replace("sparsities = [0.25, 0.5]\n", "") + \
        "[trajectory]\nstep = 3\nbudget = 0.5\ninverse = [false, true]\nrandom_boxes = 3\nreport_at = [0.25]\n"
    protocol = Protocol.parse(text, "traj.toml")
    out = tmp_path / "traj"
    run_protocol(protocol, out, plots=False, memory_budget="512MiB")
    run = json.loads((out / "run.json").read_text())
    assert run["memory_budget"] == "512MiB" and run["models"][0]["grid"] == [3, 4]
    kinds = {(c["criterion"], c["inverse"]) for c in run["cells"].values()}
    assert kinds == {("ae", False), ("ae", True), ("random", False)}
    assert sum(c["criterion"] == "random" for c in run["cells"].values()) == 3
    for cell in run["cells"].values():
        traj = cell["trajectory"]
        mask = HeadMask.load(out / cell["mask"], (3, 4))
        removed = {tuple(h) for step in traj["steps"] for h in step["removed"]}
        assert mask.n_pruned == len(removed) == 6 and all(mask.values[h] == 0 for h in removed)
    rows = (out / "results.md").read_text().splitlines()
    assert rows[0].startswith("| model | criterion | order | repeats | auc accuracy |")
    assert len(rows) == 2 + 3


def test_the_demo_protocol_runs_from_the_command_line(tmp_path, capsys, demo_model_path):
    """The protocol the README shows, end to end (about 2-4 min on 2 shared cores)."""
    out = tmp_path / "demo"
    assert main(["run", str(PROTOCOLS / "demo.toml"), "--out", str(out), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "estimate: protocol demo" in captured.err
    result = json.loads(captured.out)
    table = (out / "results.md").read_text()
    assert result["table"] == table and result["computed"] == 13
    lines = table.splitlines()
    # a two-class classifier's metric set (metric_set: f1 applies to two classes), no GLUE name in the sources
    assert lines[0] == "| model | criterion | sparsity | repeats | accuracy | f1 | macro_f1 | mcc |"
    assert [line.split(" | ")[1:3] for line in lines[2:]] == [
        ["dense", "0"], ["ae", "0.25"], ["ae", "0.5"], ["his", "0.25"], ["his", "0.5"], ["random", "0.25"],
        ["random", "0.5"]]
    assert len(list((out / "masks").glob("*.json"))) == 12
    assert os.path.getsize(out / "run.json") > 0


def test_the_sparsity_figure_draws_each_criterion_with_its_sd_bars():
    viz = pytest.importorskip("headprune.viz")
    points = [{"criterion": "his", "sparsity": 0.5, "mean": 0.8, "sd": 0.02},
              {"criterion": "his", "sparsity": 0.25, "mean": 0.84, "sd": None},
              {"criterion": "random", "sparsity": 0.25, "mean": 0.7, "sd": 0.05}]
    fig = viz.sparsity_figure(points, "accuracy", dense=0.85)
    his, random = fig.data
    assert list(his.x) == [25, 50] and list(his.y) == [0.84, 0.8] and list(his.error_y.array) == [0.0, 0.02]
    assert random.name == "random" and list(random.error_y.array) == [0.05]
    assert fig.layout.shapes[0].y0 == 0.85


# -- the data-roles, metric-set and SAP APIs reach the cells --------------------------------------------------------

def roles_protocol(tmp_path, model_dir, csv_path, criteria: str, sparsities: str = "[0.5]") -> Protocol:
    """One repeat on the tiny model: 12 calibration, 10 selection and 20 evaluation rows of one CSV (disjoint)."""
    text = (f'name = "roles"\nmodels = ["{model_dir}"]\nsparsities = {sparsities}\nbatch_size = 8\n\n'
            f'[data.calib]\nsource = "{csv_path}"\nsize = 12\n\n[data.select]\nsource = "{csv_path}"\nsize = 10\n\n'
            f'[data.eval]\nsource = "{csv_path}"\nsize = 20\n\n{criteria}')
    path = tmp_path / "roles.toml"
    path.write_text(text, encoding="utf-8")
    return Protocol.read(path)


def test_sap_cells_use_sap_at_their_sparsity_with_k_chosen_on_the_selection_rows(tmp_path, tiny_model_dir,
                                                                                tiny_csv, monkeypatch, one_thread):
    from headprune.criteria import get
    from headprune.criteria import sap as sap_module
    from headprune.evaluation.metrics import evaluate
    from headprune.model.layers import skip_layers
    from headprune.model.loading import load_model
    from headprune.model.mask import HeadMask, dropped_layers

    seen = []   # the batches SAP's k sweep reads (ctx.selection)
    original = sap_module.calibration_metric
    monkeypatch.setattr(sap_module, "calibration_metric", lambda ctx, name: seen.append(ctx.selection)
                        or original(ctx, name))
    # layer_threshold = 1: at 50 % of a 3 x 4 grid (6 heads) some layer loses 2 heads, so the layer rule fires
    protocol = roles_protocol(tmp_path, tiny_model_dir, tiny_csv,
                              '[[criteria]]\nname = "sap"\nparams = { k_max = 2, layer_threshold = 1 }\n')
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())

    loaded = load_model(str(tiny_model_dir), "cpu")
    cache: dict = {}
    data = adapter.build_workspace_for(loaded, protocol.models[0], protocol, 0, cache)
    [ws] = cache.values()
    assert len(data.select_batches) == 2 and data.roles["select"]["used"] and data.roles["select"]["size"] == 10
    # SAP's sweep read the selection batches, never the calibration or evaluation ones
    assert seen and all(torch.equal(b["input_ids"], ref["input_ids"]) for s in seen
                        for b, ref in zip(s, data.select_batches))
    [cell] = [c for c in run["cells"].values() if c["criterion"] == "sap"]
    stamp = json.loads((out / cell["scores"]).read_text())["stamp"]
    assert stamp["select_hash"] == cell["roles"]["select"]["hash"] == content_hash(ws.select)

    # the cell's mask is SAP's own at 0.5 with its best k (per_sparsity), and its layer rule travels in the file
    ctx = adapter.scoring_context(loaded, data, protocol.seed, None, None)
    expected = get("sap").per_sparsity(ctx, [0.5], {"k_max": 2, "layer_threshold": 1})[0.5]
    saved = json.loads((out / cell["mask"]).read_text())
    mask = HeadMask.from_json(saved, loaded.adapter.grid_shape)
    assert torch.equal(mask.keep_bool(), expected.mask.keep_bool())
    assert expected.dropped_layers and cell["dropped_layers"] == expected.dropped_layers
    assert dropped_layers(saved, 3) == expected.dropped_layers
    with skip_layers(loaded.adapter, expected.dropped_layers):
        again = evaluate(loaded.model, data.eval_batches, mask).to_dict()
    assert cell["metrics"]["accuracy"] == pytest.approx(again["accuracy"])
    assert cell["metrics"]["loss"] == pytest.approx(again["loss"])


def test_a_glue_named_evaluation_source_reports_glues_metric_set(tmp_path, tiny_model_dir, tiny_csv, one_thread):
    from headprune.evaluation.metrics import GLUE_METRICS

    glue_csv = tmp_path / "mrpc_dev.csv"
    glue_csv.write_text(Path(tiny_csv).read_text(encoding="utf-8"), encoding="utf-8")
    protocol = roles_protocol(tmp_path, tiny_model_dir, str(glue_csv), '[[criteria]]\nname = "ae"\n')
    run_protocol(protocol, tmp_path / "out", plots=False)
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    assert run["table"]["columns"] == list(GLUE_METRICS["mrpc"]) == ["f1", "accuracy"]
    header = (tmp_path / "out" / "results.csv").read_text().splitlines()[0]
    assert header == "model,criterion,sparsity,repeats,f1 mean,f1 sd,accuracy mean,accuracy sd"
    # the same rows under a neutral name: the classifier's own set
    plain = roles_protocol(tmp_path, tiny_model_dir, tiny_csv, '[[criteria]]\nname = "ae"\n')
    run_protocol(plain, tmp_path / "plain", plots=False)
    columns = json.loads((tmp_path / "plain" / "run.json").read_text())["table"]["columns"]
    assert columns[0] == "accuracy" and {"f1", "macro_f1", "mcc"} <= set(columns)   # a two-class classifier's


# -- recovery after pruning ([recovery] and [data.train]) ------------------------------------------------------------

RECOVERY = """
[data.train]
source = "{csv}"
size = 24

[recovery]
steps = 3
batch_size = 8
lr = 1e-3
"""


def recovery_protocol(tmp_path, model_dir, csv_path) -> Protocol:
    """The tiny protocol at one sparsity and repeat, every pruned cell recovered for 3 steps on 24 rows."""
    text = tiny_protocol(tmp_path, model_dir, csv_path).text.replace("repeats = 2", "repeats = 1") \
        .replace("sparsities = [0.25, 0.5]", "sparsities = [0.5]") + RECOVERY.format(csv=csv_path)
    return Protocol.parse(text, str(tmp_path / "recover.toml"))


def test_a_recovery_table_is_checked_key_by_key_with_its_line():
    text = BASE + '\n[data.train]\nsource = "demo:train"\nsize = 16\n\n[recovery]\nmethod = "finetune"\nepochs = 0\n'
    with pytest.raises(ProtocolError, match=f"line {line_of(text, 'epochs = 0')}: key 'recovery.epochs'"):
        Protocol.parse(text)
    bad = text.replace("epochs = 0", "epoch = 1")
    with pytest.raises(ProtocolError, match=f"line {line_of(bad, 'epoch = 1')}: key 'recovery.epoch': unknown"):
        Protocol.parse(bad)
    bad = text.replace('method = "finetune"', 'method = "prune-more"').replace("epochs = 0", "epochs = 1")
    with pytest.raises(ProtocolError, match="key 'recovery.method'.*finetune, lora"):
        Protocol.parse(bad)
    alone = BASE + '\n[recovery]\nepochs = 1\n'
    with pytest.raises(ProtocolError, match=r"\[data.train\]"):
        Protocol.parse(alone)
    good = Protocol.parse(text.replace("epochs = 0", "epochs = 2"))
    assert good.recovery.epochs == 2 and good.recovery.seed == good.seed and good.models[0].data["train"].size == 16
    assert [c.key for c in expand(good)][:3] == ["demo__dense__r0", "demo__ae__s0.25__r0",
                                                 "demo__ae__s0.25__r0__recovered"]


def test_the_recovery_demo_plan_counts_its_training_rows():
    protocol = Protocol.read(PROTOCOLS / "demo_recover.toml")
    (p,) = plan(protocol, time_it=False)
    # 3 criteria x 2 sparsities recovered, 1 epoch over 2,048 rows, a training row-pass counted as 3 forwards and
    # the default recipe's teacher (distillation) as one more
    assert protocol.recovery.distill
    assert len(p.cells) == 1 + 3 * 2 * 2 and p.train_row_passes == 3 * 2 * 2048 * (3 + 1)
    assert "training row-passes" in p.text()


def test_recovered_cells_evaluate_the_recovered_model_and_resume(tmp_path, tiny_model_dir, tiny_csv, monkeypatch,
                                                                 one_thread):
    from headprune.data import row_hashes
    from headprune.evaluation.metrics import evaluate
    from headprune.model.loading import load_model
    from headprune.model.mask import HeadMask
    from headprune.recovery import RecoveryRun

    protocol = recovery_protocol(tmp_path, tiny_model_dir, tiny_csv)
    out = tmp_path / "out"

    def cancel_in_recovery(fraction, message):
        if "__recovered:" in message:
            raise Cancelled()

    with pytest.raises(Cancelled):   # cancelled inside the first recovered cell: the cells before it stay
        run_protocol(protocol, out, progress=cancel_in_recovery, plots=False)
    first = [c.key for c in expand(protocol)[:3]]
    assert first[2].endswith("__recovered")
    assert sorted(p.stem for p in (out / "cells").glob("*.json")) == sorted(first[:2])
    summary = run_protocol(protocol, out, plots=False)
    assert summary["computed"] == 3 and summary["reused"] == 2
    assert not (out / "recovery").exists()   # checkpoints gone once the recovered cells are written

    run = json.loads((out / "run.json").read_text())
    loaded = load_model(str(tiny_model_dir), "cpu")
    entry = protocol.models[0]
    data = adapter.build_workspace_for(loaded, entry, protocol, 0)
    recovered = [c for c in run["cells"].values() if c["kind"] == "recovered"]
    assert len(recovered) == 2
    for cell in recovered:
        pruned = next(c for c in run["cells"].values() if c["kind"] == "sparsity"
                      and c["criterion"] == cell["criterion"])
        train_role = cell["recovery"]["train"]
        assert train_role["size"] == 24 and cell["recovery"]["steps"] == 3
        train = adapter.train_rows(loaded, entry, protocol, data)
        assert content_hash(train) == train_role["hash"]
        assert not set(row_hashes(train)) & set(row_hashes(data.eval))   # never trained on what is reported
        mask = HeadMask.load(out / pruned["mask"], loaded.adapter.grid_shape)
        assert HeadMask.load(out / cell["mask"], loaded.adapter.grid_shape).to_json() == mask.to_json()
        # an independent recovery of the same mask on the same rows, evaluated on the cell's evaluation rows
        result = RecoveryRun(protocol.recovery, loaded.model, loaded.tokenizer, mask, train,
                             work_dir=tmp_path / f"again-{cell['criterion']}", task=data.task).run()
        again = evaluate(result.model, data.eval_batches, mask if result.mode == "gated" else None).to_dict()
        assert cell["metrics"]["accuracy"] == pytest.approx(again["accuracy"])
        assert cell["metrics"]["mcc"] == pytest.approx(again["mcc"])
        assert cell["stages"]["pruned"]["accuracy"] == pytest.approx(pruned["metrics"]["accuracy"])
        assert cell["roles"]["eval"]["hash"] == pruned["roles"]["eval"]["hash"] and cell["roles"]["train"] == train_role

    with open(out / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["criterion"], r["stage"]) for r in rows] == [
        ("dense", "dense"), ("ae", "pruned"), ("ae", "recovered"), ("random", "pruned"), ("random", "recovered")]
    for row in rows[2::2]:
        cell = next(c for c in recovered if c["criterion"] == row["criterion"])
        assert float(row["accuracy mean"]) == pytest.approx(cell["metrics"]["accuracy"], abs=1e-6)
    assert "| stage |" in (out / "results.md").read_text()

    # finished recovered cells are read, not trained again; a changed recovery setting retrains only them
    monkeypatch.setattr(adapter, "recover_cell", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trained")))
    assert run_protocol(protocol, out, plots=False)["computed"] == 0
    monkeypatch.undo()
    changed = Protocol.parse(protocol.text.replace("steps = 3", "steps = 2"), protocol.source)
    assert run_protocol(changed, out, plots=False)["computed"] == 2


def test_the_recovery_demo_protocol_runs_from_the_command_line(tmp_path, capsys, demo_model_path):
    """protocols/demo_recover.toml end to end: HIS, SAP and random at 50 % and 75 %, each recovered with the
    default recipe; on 256 training and 200 evaluation rows (8 steps a cell) so the suite stays short: the shipped
    sizes (2,048 and 1,000: 64 steps a cell) take several minutes a cell on 2 cores, and `--smoke` runs the file."""
    text = (PROTOCOLS / "demo_recover.toml").read_text(encoding="utf-8")
    assert "size = 2048" in text and "size = 1000" in text
    path = tmp_path / "demo_recover.toml"
    path.write_text(text.replace("size = 2048", "size = 256").replace("size = 1000", "size = 200"), encoding="utf-8")
    out = tmp_path / "demo_recover"
    assert main(["run", str(path), "--out", str(out), "--no-plots"]) == 0
    captured = capsys.readouterr()
    assert "estimate: protocol demo_recover" in captured.err
    result = json.loads(captured.out)
    assert result["computed"] == 13
    lines = result["table"].splitlines()
    assert lines[0] == "| model | criterion | sparsity | stage | repeats | accuracy | f1 | macro_f1 | mcc |"
    assert [line.split(" | ")[1:4] for line in lines[2:]] == [["dense", "0", "dense"]] + [
        [crit, s, stage] for crit in ("his", "sap", "random") for s in ("0.5", "0.75")
        for stage in ("pruned", "recovered")]
    run = json.loads((out / "run.json").read_text())
    for cell in run["cells"].values():
        if cell["kind"] == "recovered":
            assert cell["recovery"]["train"]["size"] == 256 and cell["recovery"]["train"]["source"] == "demo:train"
            assert cell["roles"]["eval"]["size"] == 200


def test_sap_cf_target_tables_name_their_pool():
    from headprune.protocol.run import pool_note

    fig5 = Protocol.read(PROTOCOLS / "sap_fig5.toml")
    note = pool_note(fig5)   # the paper protocols filter SAP's own candidates (issue 39)
    assert "CF's candidate pool is the paper's" in note and "cnt ≥ S·R" in note and "s + (1 − s)/2" not in note
    widened = Protocol.parse(fig5.text.replace('cf_pool = "paper"', 'cf_pool = "widened"'), "w.toml")
    note = pool_note(widened)
    assert "s + (1 − s)/2" in note and "headprune's construction" in note and "cnt ≥ S·R" in note
    assert pool_note(Protocol.read(PROTOCOLS / "hies_table1.toml")) == ""
