"""The papers' table columns (``[table] baseline``: "Average" over models and "% vs" a baseline criterion, as HIES
Table 1) and the paper's own values beside ours (``[[paper]]``: paper | ours | Δ), in headprune/protocol/run.py."""

from __future__ import annotations

import json

import numpy as np
import pytest

from headprune.protocol import Protocol, ProtocolError
from headprune.protocol.run import run_protocol

PAPER = """
[table]
baseline = "random"

[[paper]]
model = "one"
metric = "accuracy"
cite = "Table 9, row one"
dense = 0.8
his = { "0.5" = 0.75 }
random = { "0.5" = 0.5 }
"""


def protocol_text(model_dir, csv_path) -> str:
    """Two models (the tiny classifier under two names, so the average is over two), HIS and random at 0.5."""
    models = "".join(f'[[models]]\nname = "{n}"\nmodel = "{model_dir}"\n' for n in ("one", "two"))
    return (f'name = "tables"\nsparsities = [0.5]\nbatch_size = 8\n\n[data.calib]\nsource = "{csv_path}"\nsize = 12\n\n'
            f'[data.eval]\nsource = "{csv_path}"\nsize = 20\n\n[[criteria]]\nname = "his"\n\n[[criteria]]\n'
            f'name = "random"\n\n{models}')


@pytest.mark.parametrize("edit, key, line_of", [
    (('his = { "0.5" = 0.75 }', 'his = { "0.2" = 0.75 }'), "paper.0.his.0.2", 'his = { "0.2"'),
    (('his = { "0.5" = 0.75 }', 'ae = { "0.5" = 0.75 }'), "paper.0.ae", 'ae = {'),
    (('model = "one"\nmetric', 'model = "three"\nmetric'), "paper.0.model", 'model = "three"'),
    (('baseline = "random"', 'baseline = "hies"'), "table.baseline", 'baseline = "hies"'),
    (('dense = 0.8', 'dense = "high"'), "paper.0.dense.0", 'dense = "high"'),
])
def test_paper_values_for_a_cell_the_protocol_lacks_name_the_key_and_line(tmp_path, edit, key, line_of):
    text = protocol_text(tmp_path, "x.csv") + PAPER.replace(*edit)
    line = next(i for i, t in enumerate(text.splitlines(), start=1) if line_of in t)
    with pytest.raises(ProtocolError) as err:
        Protocol.parse(text, "p.toml")
    assert f"p.toml, line {line}: key '{key}'" in str(err.value)


def test_average_percent_vs_baseline_and_paper_deltas_equal_a_hand_computation(tmp_path, tiny_model_dir, tiny_csv,
                                                                              one_thread):
    protocol = Protocol.parse(protocol_text(tiny_model_dir, tiny_csv) + PAPER, str(tmp_path / "p.toml"))
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())
    cells = run["cells"]

    def acc(model, criterion):
        key = f"{model}__{criterion}__s0.5__r0" if criterion != "dense" else f"{model}__dense__r0"
        return cells[key]["metrics"]["accuracy"]   # the tiny classifier's headline (no GLUE name)

    averages = {(r["criterion"], r["sparsity"]): r for r in run["table"]["average"]}
    for criterion in ("his", "random", "dense"):
        where = 0.0 if criterion == "dense" else 0.5
        expected = np.mean([acc("one", criterion), acc("two", criterion)])
        assert averages[(criterion, where)]["average"] == pytest.approx(expected)
        assert averages[(criterion, where)]["models"] == 2
    his, rnd = averages[("his", 0.5)]["average"], averages[("random", 0.5)]["average"]
    assert averages[("his", 0.5)]["% vs random"] == pytest.approx(100 * (his / rnd - 1))
    assert averages[("random", 0.5)]["% vs random"] == pytest.approx(0.0)
    assert averages[("dense", 0.0)]["% vs random"] is None        # no random cell at 0: nothing to compare

    papers = {(r["criterion"], r["sparsity"]): r for r in run["table"]["paper"]}
    assert papers[("his", 0.5)]["ours"] == pytest.approx(acc("one", "his"))
    assert papers[("his", 0.5)]["delta"] == pytest.approx(acc("one", "his") - 0.75)
    assert papers[("dense", 0.0)]["delta"] == pytest.approx(acc("one", "dense") - 0.8)
    md = (out / "results.md").read_text()
    assert "## Average over models" in md and "% vs random" in md
    assert f"| one | his | 0.5 | accuracy | 0.7500 | {acc('one', 'his'):.4f} | " \
           f"{acc('one', 'his') - 0.75:+.4f} | Table 9, row one |" in md
