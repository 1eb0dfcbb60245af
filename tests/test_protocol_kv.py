"""Protocols with a [kv] table (issue 32): a cell per rule x full share x repeat, each the task's metrics under
its cache plan. Every number equals ``metric_under_plan`` on the plan made directly from the rule's scores, the plan
files are written and recorded, and a bad [kv] table is refused with its key and line before any model loads."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import save_tiny_lm

from headprune.kvcache.plan import KVPlan
from headprune.kvcache.scores import head_scores, plan_from_scores
from headprune.kvcache.tasks import metric_under_plan
from headprune.model.loading import load_model
from headprune.protocol import Protocol, expand
from headprune.protocol.cells import build_workspace_for
from headprune.protocol.plan import Cell, plan, slug
from headprune.protocol.run import run_protocol
from headprune.protocol.spec import ProtocolError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("kv_llama"), n=48, seed=5)


def kv_text(model: str, data: str, kv: str = "", top: str = "") -> str:
    kv = kv or 'rules = ["far-mass", "random"]\nfull_shares = [0.25, 0.5]\nsink = 1\nwindow = 3\n'
    return (f'name = "kvt"\nmodels = ["{model}"]\nrepeats = 2\nbatch_size = 8\n{top}\n'
            f'[data.calib]\nsource = "{data}"\nsize = 8\n\n[data.eval]\nsource = "{data}"\nsize = 12\n\n[kv]\n{kv}')


def test_each_kv_cell_is_the_metric_under_the_plan_made_from_its_rules_scores(lm, tmp_path):
    model, data = lm
    protocol = Protocol.parse(kv_text(model, data), "kvt.toml")
    cells = expand(protocol)
    name = slug(protocol.models[0].name)   # cell keys name the model as a file name
    assert [c.key for c in cells[:3]] == [f"{name}__dense__r0", f"{name}__far-mass__f0.25__r0",
                                          f"{name}__far-mass__f0.5__r0"]
    assert len(cells) == 1 + 2 * 2 * 2 and {c.kind for c in cells} == {"dense", "kv"}
    out = tmp_path / "run"
    summary = run_protocol(protocol, out, plots=False)
    assert summary["computed"] == 9
    run = json.loads((out / "run.json").read_text())
    loaded = load_model(model, "cpu")
    entry = protocol.models[0]
    for repeat in (0, 1):
        rows = build_workspace_for(loaded, entry, protocol, repeat)
        for rule in ("far-mass", "random"):
            scores = head_scores(rule, loaded.model, calib=rows.calib_batches, tokenizer=loaded.tokenizer, sink=1,
                                 window=3, seed=repeat)          # the repeat's seed: protocol seed 0 + repeat
            for share in (0.25, 0.5):
                cell = Cell(entry.name, rule, repeat, full_share=share)
                record = run["cells"][cell.key]
                saved = KVPlan.read(out / record["kv_plan"])
                direct = plan_from_scores(scores, 2, share, 1, 3)
                assert torch.equal(saved.full, direct.full) and int(direct.full.sum()) == round(8 * share)
                assert record["full_kv_heads"] == int(direct.full.sum()) and (saved.sink, saved.window) == (1, 3)
                assert saved.meta["rule"] == rule and saved.meta["repeat"] == repeat
                want = metric_under_plan(loaded.model, rows.eval_batches, direct).to_dict()
                assert record["metrics"]["perplexity"] == pytest.approx(want["perplexity"], rel=1e-12)
                assert record["metrics"]["n"] == want["n"] == 12
                assert record["kv_bytes"]["length"] == protocol.max_length == 128
                assert record["kv_bytes"]["ratio"] == pytest.approx(   # by hand: 128 tokens, sink + window = 4
                    (share * 8 * 128 + (1 - share) * 8 * 4) / (8 * 128))
    dense = run["cells"][f"{name}__dense__r0"]["metrics"]["perplexity"]
    rows0 = build_workspace_for(loaded, entry, protocol, 0)
    assert dense == pytest.approx(metric_under_plan(loaded.model, rows0.eval_batches, None).to_dict()["perplexity"])
    # random draws one plan per repeat (the band); the table has one row per rule and share, the dense row at 1
    assert not torch.equal(KVPlan.read(out / "plans" / f"{name}__random__f0.25__r0.json").full,
                           KVPlan.read(out / "plans" / f"{name}__random__f0.25__r1.json").full)
    table = run["table"]["rows"]
    assert [(r["criterion"], r["full_share"]) for r in table][:3] == [("dense", 1.0), ("far-mass", 0.25),
                                                                      ("far-mass", 0.5)]
    assert all(r["repeats"] == 2 for r in table[1:]) and "kv bytes / full" in run["table"]["columns"]
    assert run["protocol"]["parameters"]["kv"]["window"] == 3
    assert "| full_share |" in (out / "results.md").read_text()
    assert run_protocol(protocol, out, plots=False)["computed"] == 0         # resumed: every cell read back


def test_the_plan_counts_a_rules_scoring_once_per_repeat(lm):
    model, data = lm
    protocol = Protocol.parse(kv_text(model, data), "kvt.toml")
    work = plan(protocol, time_it=False)[0]
    # far-mass: one pass over the 8 calibration rows per repeat; random: none; 9 evaluations of 12 rows
    assert work.calib_row_passes == 2 * 8 and work.eval_row_passes == 9 * 12


def test_cells_of_other_kinds_keep_their_records_and_a_zero_share_is_kept():
    assert "full_share" not in Cell("m", "his", 0, sparsity=0.5).to_json()
    assert Cell("m", "far-mass", 1, full_share=0.0).to_json()["full_share"] == 0.0
    assert Cell("m", "far-mass", 1, full_share=0.0).key == "m__far-mass__f0__r1"


@pytest.mark.parametrize("kv, top, key, words, at", [
    ('rules = ["far-mass"]\nfull_shares = [0.25]\nwindow = 0\n', "", "kv.window", "window (last keys", "window"),
    ('rules = ["far-mass"]\nfull_shares = [0.25]\nsink = -1\n', "", "kv.sink", "integer in [0, 1,048,576]", "sink"),
    ('rules = ["far-mass"]\nfull_shares = [0.25, 1.5]\n', "", "kv.full_shares", "full share 1.5 must lie in [0, 1]",
     "full_shares"),
    ('rules = ["far-mass"]\nfull_shares = [-0.1]\n', "", "kv.full_shares", "full share -0.1", "full_shares"),
    ('rules = ["far-mass", "nope"]\nfull_shares = [0.25]\n', "", "kv.rules", "Unknown KV plan rule 'nope'", "rules"),
    ('rules = []\nfull_shares = [0.25]\n', "", "kv.rules", "distinct rule names", "rules"),
    ('rules = ["far-mass"]\nfull_shares = [0.25]\ngroup = "median"\n', "", "kv.group", "accepted: max, mean", "group"),
    ('rules = ["far-mass"]\nfull_shares = [0.25]\nwindows = 3\n', "", "kv.windows", "unknown key", "windows"),
    ('rules = ["far-mass"]\nfull_shares = [0.25]\n', "sparsities = [0.5]", "sparsities", "no place beside them",
     "sparsities"),
    # a protocol-wide list is every model's: the error names the model's key at the models line (as for any metric)
    ('rules = ["far-mass"]\nfull_shares = [0.25]\n', 'metrics = ["agreement"]', "models.0.metrics", "agreement",
     "models"),
])
def test_a_bad_kv_table_is_named_with_its_key_and_line(lm, kv, top, key, words, at):
    model, data = lm
    text = kv_text(model, data, kv, top)
    with pytest.raises(ProtocolError) as err:
        Protocol.parse(text, "kvt.toml")
    message = str(err.value)
    assert message.startswith("kvt.toml, line ") and f"key '{key}'" in message and words in message
    line = int(message.split("line ")[1].split(":")[0])
    assert text.splitlines()[line - 1].startswith(f"{at} ="), (line, text.splitlines()[line - 1])


def test_kv_on_an_encoder_is_refused_before_anything_loads(monkeypatch, tiny_csv):
    import headprune.model.loading as loading

    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    text = kv_text("demo", tiny_csv, 'rules = ["far-mass"]\nfull_shares = [0.25]\n')
    with pytest.raises(ProtocolError, match=r"kvt.toml, line \d+: key 'kv': model 'demo' \(demo\) is an encoder"):
        Protocol.parse(text, "kvt.toml")
    with pytest.raises(ProtocolError, match="key 'criteria'"):
        Protocol.parse(text.replace("[kv]", '[[criteria]]\nname = "his"\n\n[kv]'), "kvt.toml")
