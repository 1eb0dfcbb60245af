"""SAP+CF as the paper defines it (sap-syntactic-attention-pruning.txt §3.4): candidate filtering re-ranks a pool
larger than its target by measured single-head degradation, in protocol cells, ``mask --sparsity`` and the
tolerance mode; a pool smaller than its target is refused with its key and line."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import save_classifier, sentences, write_csv
from test_kl import spread_weights

from headprune.cli import main
from headprune.criteria import ScoringContext, get
from headprune.criteria.sap import pool_fraction, select_for_sparsity
from headprune.errors import CriterionError
from headprune.evaluation.metrics import evaluate
from headprune.model.loading import load_model
from headprune.model.mask import HeadMask
from headprune.protocol import Protocol, ProtocolError
from headprune.protocol import cells as adapter
from headprune.protocol.run import run_protocol

CRITERIA = ('[[criteria]]\nname = "sap"\nparams = { k = 2 }\n\n'
            '[[criteria]]\nname = "sap-cf"\nparams = { k = 2 }\n')


@pytest.fixture(scope="module")
def sensitive_model_dir(tmp_path_factory, tiny_tokenizer):
    """The tiny 3 x 4 BERT classifier with spread weights, so its predictions depend on single heads."""
    from headprune.testing import tiny_model

    model = spread_weights(tiny_model("bert", num_labels=2, vocab_size=tiny_tokenizer.vocab_size), 0.2, seed=1)
    return save_classifier(model, tiny_tokenizer, tmp_path_factory.mktemp("sensitive_bert"))


@pytest.fixture(scope="module")
def labelled_csv(tmp_path_factory) -> str:
    texts = sentences(80, seed=3, min_words=4)
    labels = ["pos" if i % 2 else "neg" for i in range(80)]
    return write_csv(tmp_path_factory.mktemp("cf") / "cf.csv", ["text", "label"], list(zip(texts, labels)))


def protocol_text(model_dir, csv_path, criteria: str, sparsities: str = "[0.5]") -> str:
    return (f'name = "cf"\nmodels = ["{model_dir}"]\nsparsities = {sparsities}\nbatch_size = 16\n\n'
            f'[data.calib]\nsource = "{csv_path}"\nsize = 16\n\n[data.select]\nsource = "{csv_path}"\nsize = 40\n\n'
            f'[data.eval]\nsource = "{csv_path}"\nsize = 20\n\n{criteria}')


def test_sap_and_sap_cf_cells_differ_and_cf_prunes_the_head_of_its_degradation_ranking(
        tmp_path, sensitive_model_dir, labelled_csv, one_thread):
    path = tmp_path / "cf.toml"
    path.write_text(protocol_text(sensitive_model_dir, labelled_csv, CRITERIA), encoding="utf-8")
    protocol = Protocol.read(path)
    out = tmp_path / "out"
    run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())
    cells = {c["criterion"]: c for c in run["cells"].values() if c["criterion"] != "dense"}
    masks = {name: HeadMask.from_json(json.loads((out / c["mask"]).read_text()), (3, 4)) for name, c in cells.items()}
    assert masks["sap"].n_pruned == masks["sap-cf"].n_pruned == 6
    assert not torch.equal(masks["sap"].keep_bool(), masks["sap-cf"].keep_bool())     # CF chose its own heads

    scores = json.loads((out / cells["sap-cf"]["scores"]).read_text())
    meta = scores
    assert scores["params"]["sparsity"] == 0.5 and meta["mode"] == "target" and meta["pool_fraction"] == 0.75
    pool = [tuple(h) for h in meta["pool"]]
    # the pool is SAP's ranking at the larger target (9 of 12 heads), with SAP's k at the cell's target
    counters = np.array([[np.nan if v is None else v for v in row] for row in meta["counters"]])
    expected_pool, _ = select_for_sparsity(counters, meta["S"], 9, 0.5, 0.05)
    assert pool == expected_pool and len(pool) == 9
    assert set(map(tuple, meta["sap_selected"])) < set(pool)
    # pruned = the first 6 of the pool ranked by the recorded degradation (ties: SAP's order, a stable sort)
    degradation = {tuple(map(int, k.split(","))): v for k, v in meta["degradation"].items()}
    assert set(degradation) == set(pool)
    ranking = sorted(pool, key=lambda h: degradation[h])
    pruned = {tuple(h) for h in (masks["sap-cf"].values == 0).nonzero().tolist()}
    assert pruned == set(ranking[:6]) and [tuple(h) for h in meta["selected"]] == ranking[:6]

    # the recorded degradations are measured: m0 − accuracy with that head alone pruned, on the selection rows
    loaded = load_model(str(sensitive_model_dir), "cpu")
    data = adapter.build_workspace_for(loaded, protocol.models[0], protocol, 0, {})
    dense = evaluate(loaded.model, data.select_batches).accuracy
    assert meta["dense_metric"] == pytest.approx(dense)
    for head in ranking[:2] + ranking[-2:]:
        alone = evaluate(loaded.model, data.select_batches, HeadMask.ones((3, 4)).prune(*head)).accuracy
        assert degradation[head] == pytest.approx(dense - alone)
    # the cell's number is the evaluation of CF's mask on the evaluation rows
    again = evaluate(loaded.model, data.eval_batches, masks["sap-cf"]).accuracy
    assert cells["sap-cf"]["metrics"]["accuracy"] == pytest.approx(again)


def test_a_tolerance_cell_reports_the_sparsity_cf_reached(tmp_path, sensitive_model_dir, labelled_csv, one_thread):
    criteria = '[[criteria]]\nname = "sap-cf"\nlabel = "cf"\nparams = { k = 2, sparsity = 0, tolerance = 0.9 }\n'
    path = tmp_path / "tol.toml"
    path.write_text(protocol_text(sensitive_model_dir, labelled_csv, criteria, "[0]"), encoding="utf-8")
    protocol = Protocol.read(path)
    out = tmp_path / "out"
    summary = run_protocol(protocol, out, plots=False)
    run = json.loads((out / "run.json").read_text())
    [cell] = [c for c in run["cells"].values() if c["criterion"] == "cf"]
    assert cell["key"].endswith("__cf__tol__r0") and cell["kind"] == "tolerance"
    meta = json.loads((out / cell["scores"]).read_text())
    mask = HeadMask.from_json(json.loads((out / cell["mask"]).read_text()), (3, 4))
    assert meta["mode"] == "tolerance" and meta["pool"] == meta["sap_selected"]   # the S·R candidates
    assert sorted((mask.values == 0).nonzero().tolist()) == sorted(meta["selected"])
    assert cell["sparsity_reached"] == mask.n_pruned / 12 == meta["sparsity_reached"]
    # the paper's stop: every accepted step within tolerance · m0, the rejected head below it
    assert all(v >= 0.9 * meta["dense_metric"] for v in meta["metric_trace"])
    if meta["rejected"] is not None:
        assert meta["rejected"]["metric"] < 0.9 * meta["dense_metric"]
    [row] = [r for r in run["table"]["rows"] if r["criterion"] == "cf"]
    assert row["sparsity"] == "tolerance" and row["sparsity reached"][0] == pytest.approx(cell["sparsity_reached"])
    assert "| cf | tolerance |" in summary["table"]


def test_a_pool_smaller_than_its_target_is_refused_with_its_key_and_line():
    text = protocol_text("demo", "demo", '[[criteria]]\nname = "sap-cf"\nparams = { k = 2, pool = 0.6 }\n',
                         "[0.25, 0.75]")
    line = text.splitlines().index("params = { k = 2, pool = 0.6 }") + 1
    with pytest.raises(ProtocolError, match=rf"line {line}: key 'criteria\.0\.params\.pool'.*pool=0\.6.*smaller "
                                            r"than the target sparsity=0\.75.*Accepted: pool >= sparsity"):
        Protocol.parse(text, "p.toml")
    Protocol.parse(text.replace("pool = 0.6", "pool = 0.75"), "p.toml")   # a pool equal to the target is enough
    with pytest.raises(CriterionError, match="pool=0.3.*smaller than the target sparsity=0.5"):
        get("sap-cf").resolve_params({"sparsity": 0.5, "pool": 0.3})
    assert pool_fraction(0.5, 0.0) == 0.75 and pool_fraction(0.0, 0.0) == 0.0 and pool_fraction(0.5, 0.9) == 0.9


def self_labelled_context(model_dir) -> ScoringContext:
    """24 sentences labelled by the model's own answers, as one calibration batch with its raw texts."""
    loaded = load_model(str(model_dir), "cpu")
    texts = sentences(24, seed=5, min_words=4)
    batch = dict(loaded.tokenizer(texts, padding=True, return_tensors="pt"))
    with torch.no_grad():
        batch["labels"] = loaded.model(**batch).logits.argmax(-1)
    return ScoringContext(loaded.model, [batch], tokenizer=loaded.tokenizer, texts=texts)


def test_mask_sparsity_reads_cf_s_own_selection(tmp_path, sensitive_model_dir, one_thread):
    ctx = self_labelled_context(sensitive_model_dir)
    scores = get("sap-cf")(ctx, {"k": 2, "sparsity": 0.25})
    path = tmp_path / "cf.json"
    path.write_text(json.dumps(scores.to_json()), encoding="utf-8")
    assert main(["mask", "--scores", str(path), "--sparsity", "0.25", "--out", str(tmp_path / "m.json")]) == 0
    written = json.loads((tmp_path / "m.json").read_text())
    assert torch.equal(HeadMask.from_json(written, (3, 4)).keep_bool(),
                       HeadMask.from_json(scores.meta["mask"], (3, 4)).keep_bool())
    assert written["pruned_heads"] == 3 and written["criterion"] == "sap-cf"
    assert main(["mask", "--scores", str(path), "--sparsity", "0.5", "--out", str(tmp_path / "n.json")]) == 2


def test_score_refuses_a_pool_below_a_requested_level_before_loading(sensitive_model_dir, labelled_csv, capsys,
                                                                    monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("headprune.cli.scoring.load_model_and_data", no_loading)
    assert main(["score", "--model", str(sensitive_model_dir), "--data", labelled_csv, "--criterion", "sap-cf",
                 "--param", "pool=0.3", "--sap-sparsities", "0.25,0.5"]) == 2
    assert "pool=0.3" in capsys.readouterr().err


def test_the_papers_pool_is_saps_own_candidates_at_the_target(sensitive_model_dir, one_thread):
    """cf_pool = "paper" (issue 39): CF filters the heads with cnt ≥ S·R at the R SAP lowers from 0.5 (by 0.05)
    until the target qualifies -- computed here from the recorded counters -- and prunes the target's count of
    them by ascending recorded degradation."""
    ctx = self_labelled_context(sensitive_model_dir)
    for sparsity, n in ((0.25, 3), (0.5, 6)):
        meta = get("sap-cf")(ctx, {"k": 2, "sparsity": sparsity, "cf_pool": "paper"}).meta
        counters = np.array([[np.nan if v is None else v for v in row] for row in meta["counters"]])
        r = 0.5
        while np.sum(counters >= meta["S"] * r) < n and r > 0:   # by hand: §4.1's lowering of R
            r = max(0.0, round(r - 0.05, 10))
        by_hand = {(int(l), int(h)) for l, h in zip(*np.nonzero(counters >= meta["S"] * r))}
        pool = {tuple(h) for h in meta["pool"]}
        assert pool == by_hand and len(pool) >= n and meta["ratio_used"] == pytest.approx(r)
        assert meta["pool_fraction"] == 0.0 and meta["pool_rule"].startswith("the paper's")
        degradation = {tuple(map(int, k.split(","))): v for k, v in meta["degradation"].items()}
        pruned = {tuple(h) for h in meta["selected"]}
        assert set(degradation) == pool and len(pruned) == n and pruned <= pool
        assert max(degradation[h] for h in pruned) <= min([degradation[h] for h in pool - pruned], default=np.inf)
        assert HeadMask.from_json(meta["mask"], (3, 4)).n_pruned == n


def test_cf_pool_is_refused_where_it_cannot_apply():
    cf = get("sap-cf")
    with pytest.raises(CriterionError, match="cf_pool='paper' applies to pool = 0 only"):
        cf.resolve_params({"sparsity": 0.5, "pool": 0.8, "cf_pool": "paper"})
    with pytest.raises(CriterionError, match="cf_pool='widened' applies to a target sparsity only"):
        cf.resolve_params({"sparsity": 0, "cf_pool": "widened"})
    with pytest.raises(CriterionError, match="cf_pool='x': accepted values are paper, widened"):
        cf.resolve_params({"cf_pool": "x"})
    assert cf.resolve_params({"sparsity": 0, "cf_pool": "paper"})["cf_pool"] == "paper"   # the tolerance mode's
    assert pool_fraction(0.5, 0.0, "paper") == 0.0 and pool_fraction(0.5, 0.0, "widened") == 0.75
