"""DuoAttention as published (issue 37): the gated attention, gates learned by distillation, and the folder
DuoAttention's own loader reads (its documented steps repeated: np.loadtxt of the TSV, config.json's sink and
recent sizes, the sparsity quantile)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import save_tiny_lm

from headprune.cli import main
from headprune.kvcache.duo import gated_copy, train_gates
from headprune.kvcache.exports import CONFIG, TSV, read_duo_folder, write_duo_folder
from headprune.kvcache.plan import KVPlan, KVPlanError, top_share
from headprune.kvcache.restrict import restricted
from headprune.kvcache.scores import RAZOR_ECHO_SHARE, RAZOR_INDUCTION_SHARE, plan_from_scores, razor_share_plan
from headprune.testing import random_decoder_batch, tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")


class VocabOnly:
    """What the gates' passkey rows read of a tokenizer: special ids, BOS and the vocabulary size."""

    all_special_ids = [0, 1, 2]
    bos_token_id = 1

    def __len__(self):
        return 120


def test_gates_of_one_and_zero_are_exactly_full_and_streaming_attention():
    model = tiny_decoder("llama")
    ids = random_decoder_batch(seq_len=20)["input_ids"]
    grid = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    with torch.no_grad():
        dense = model(input_ids=ids).logits
        ones = gated_copy(model, torch.ones(4, 2), 1, 3)(input_ids=ids).logits
        mixed = gated_copy(model, grid, 1, 3)(input_ids=ids).logits
        half = gated_copy(model, torch.full((4, 2), 0.5), 1, 3)(input_ids=ids).logits
        with restricted(model, KVPlan(grid.bool(), 8, 1, 3)) as copy:
            planned = copy(input_ids=ids).logits
    assert torch.equal(ones, dense)
    assert torch.equal(mixed, planned)        # α = 0: the plan's exact streaming head, α = 1: full
    assert not torch.allclose(half, dense, atol=1e-4) and not torch.allclose(half, planned, atol=1e-4)
    assert model.config._attn_implementation == "sdpa" and not hasattr(model.config, "headprune_duo")


def test_training_moves_only_the_gates_and_keeps_them_in_the_unit_interval():
    model = tiny_decoder("llama")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    calib = [random_decoder_batch(seq_len=40, seed=s) for s in range(2)]
    learned = train_gates(model, VocabOnly(), calib, sink=1, window=4, steps=6, lr=0.2, batch_size=4, seed=3)
    assert learned.gates.shape == (4, 2) and ((learned.gates >= 0) & (learned.gates <= 1)).all()
    assert (learned.gates < 1).any() and len(learned.losses) == 6
    assert learned.losses[0] == pytest.approx(2.0)   # gates at 1: no distillation error, L1 = reg x 1
    # rows of the median calibration row's length, the key's two copies filling 3/4 of each (at least 6 tokens)
    lengths = sorted(int(n) for b in calib for n in b["attention_mask"].sum(-1))
    assert learned.params["length"] == int(np.median(lengths))
    assert learned.params["label_tokens"] == max(6, round(0.75 * (learned.params["length"] - 1) / 2))
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    again = train_gates(model, VocabOnly(), calib, sink=1, window=4, steps=6, lr=0.2, batch_size=4, seed=3)
    assert np.array_equal(again.gates, learned.gates)          # seeded
    with pytest.raises(KVPlanError, match="fit inside sink \\+ window"):
        train_gates(model, VocabOnly(), calib, sink=4, window=40, steps=2)


def duo_loader(folder, sparsity):
    """DuoAttention's loader, step for step (``duo_attn/utils.py``: ``load_attn_pattern`` and
    ``sparsify_attention_heads``), with its tie-breaking noise."""
    values = np.clip(np.loadtxt(folder / TSV, dtype=float, delimiter="\t"), 0, 1)
    config = json.load(open(folder / CONFIG))
    values = values + np.random.default_rng(0).uniform(0, 1e-6, values.shape)
    threshold = np.quantile(values, sparsity)
    if sparsity >= 1:
        threshold = 2
    if sparsity <= 0:
        threshold = -1
    return values >= threshold, config["sink_size"], config["recent_size"]


SCORES = {"continuous": np.random.default_rng(1).random((4, 8)),
          "outside [0, 1]": np.random.default_rng(2).normal(0, 5, (4, 8)),
          "gates with ties": np.repeat(np.array([[1, 0], [0, 1], [0.25, 0], [1, 1.0]]), 4, axis=1),
          "a cut group": np.where(np.arange(8) < 4, np.nan, np.random.default_rng(3).random((4, 8)))}


@pytest.mark.parametrize("name", list(SCORES))
@pytest.mark.parametrize("share", [0.0, 0.125, 0.25, 0.5, 0.625, 1.0])
def test_an_exported_plan_loads_in_duoattention_with_the_same_heads_at_its_share(name, share, tmp_path):
    plan = plan_from_scores(SCORES[name], 2, share, 4, 16)
    config = write_duo_folder(plan, tmp_path)
    full, sink, recent = duo_loader(tmp_path, config["sparsity"])
    assert np.array_equal(full, plan.full.numpy()) and (sink, recent) == (4, 16)
    values = np.loadtxt(tmp_path / TSV, delimiter="\t")
    assert values.shape == (4, 2) and ((values >= 0) & (values <= 1)).all()
    if name == "continuous":   # the continuous scores themselves, to within the ordering steps
        grouped = SCORES[name].reshape(4, 2, 4).max(-1)
        assert np.abs(values - grouped).max() < 1e-4 and len(np.unique(values)) == 8
    back = read_duo_folder(tmp_path, 8, (4, 2), share=share)
    assert torch.equal(back.full, plan.full) and (back.sink, back.window) == (4, 16)


def test_a_plan_switched_by_hand_exports_its_own_heads_with_continuous_scores(tmp_path):
    """The dashboard's plan after clicks keeps full other heads than its highest scores: the folder still holds
    the continuous scores (full heads in the upper half, streaming in the lower, each in score order), config.json
    says S, W and the sparsity, and DuoAttention's loader keeps exactly the clicked heads; the dashboard's zip holds
    the same two files."""
    import io
    import zipfile

    from headprune.kvcache.exports import duo_folder_zip

    scores = SCORES["continuous"].reshape(4, 2, 4).max(-1)
    full = torch.as_tensor(scores <= np.sort(scores.ravel())[1])        # the two LOWEST scores kept full by hand
    plan = KVPlan(full, 8, 4, 16, {"group_scores": scores.tolist(), "rule": "far-mass"})
    config = write_duo_folder(plan, tmp_path / "duo")
    values = np.loadtxt(tmp_path / "duo" / TSV, delimiter="\t")
    assert len(np.unique(values)) == 8 and not np.isin(values, [0.0, 1.0]).any()
    assert (values[full.numpy()] >= 0.5).all() and (values[~full.numpy()] < 0.5).all()
    for kind in (full.numpy(), ~full.numpy()):   # within each kind, the scores' order
        assert np.array_equal(np.argsort(values[kind]), np.argsort(scores[kind]))
    loaded, sink, recent = duo_loader(tmp_path / "duo", config["sparsity"])
    assert np.array_equal(loaded, full.numpy()) and (sink, recent) == (4, 16)
    with zipfile.ZipFile(io.BytesIO(duo_folder_zip(plan))) as archive:
        for name in (TSV, CONFIG):
            assert archive.read(f"duo_attention_pattern/{name}").decode() == (tmp_path / "duo" / name).read_text()


@pytest.mark.parametrize("kind", ["file", "folder"])
def test_the_duo_export_never_replaces_a_users_tmp_file_or_folder(kind, tmp_path):
    """The export writes through outdir.write_atomic (unique temporaries): a user's ".<name>.tmp" beside the files
    is left as it was, whether a file or a folder (before: replaced, or IsADirectoryError)."""
    plan = plan_from_scores(SCORES["continuous"], 2, 0.25, 4, 16)
    for name in (TSV, "config.json"):
        mine = tmp_path / f".{name}.tmp"
        if kind == "file":
            mine.write_text("mine")
        else:
            mine.mkdir()
    write_duo_folder(plan, tmp_path)
    for name in (TSV, "config.json"):
        mine = tmp_path / f".{name}.tmp"
        assert (mine.read_text() == "mine") if kind == "file" else mine.is_dir()
    assert duo_loader(tmp_path, 0.75)[1:] == (4, 16)


def test_reading_a_duo_folder_refuses_another_grid_and_a_window_of_zero(tmp_path):
    plan = plan_from_scores(SCORES["continuous"], 2, 0.25, 4, 16)
    write_duo_folder(plan, tmp_path)
    with pytest.raises(KVPlanError, match="4 layers x 2 key/value heads; the model has 6 x 2"):
        read_duo_folder(tmp_path, 8, (6, 2), share=0.25)
    by_threshold = read_duo_folder(tmp_path, 8, (4, 2), threshold=0.5)
    assert torch.equal(by_threshold.full, torch.as_tensor(np.loadtxt(tmp_path / TSV, delimiter="\t") >= 0.5))
    config = json.loads((tmp_path / CONFIG).read_text())
    (tmp_path / CONFIG).write_text(json.dumps({**config, "recent_size": 0}))
    with pytest.raises(KVPlanError, match="recent_size 0"):
        read_duo_folder(tmp_path, 8, (4, 2), share=0.25)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_llama"))


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_kvplan_duo_learns_gates_exports_the_folder_and_reads_it_back(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    folder = tmp_path / "duo"
    code, out = run(capsys, "kvplan", "--model", model, "--data", data, "--rule", "duo", "--full-share", "0.25",
                    "--sink", "1", "--window", "4", "--calib-size", "8", "--duo-steps", "4", "--duo-batch", "2",
                    "--duo-lr", "0.3", "--out", str(tmp_path / "plan.json"), "--export-duo", str(folder))
    assert code == 0, out
    plan = KVPlan.read(tmp_path / "plan.json")
    gates = np.array(plan.meta["duo_training"]["gates"])
    assert plan.meta["rule"] == "duo" and out["duo_training"]["steps_run"] == 4 and out["duo_training"]["seconds"] > 0
    # the plan keeps the groups with the highest learned gates; the folder holds those gates
    assert torch.equal(plan.full, top_share(torch.as_tensor(gates), 0.25))
    assert np.array_equal(np.array(plan.meta["group_scores"]), gates)
    assert np.abs(np.loadtxt(folder / TSV, delimiter="\t") - gates).max() < 1e-4
    code, back = run(capsys, "kvplan", "--model", model, "--from-duo", str(folder), "--full-share", "0.25",
                     "--out", str(tmp_path / "back.json"))
    assert code == 0, back
    assert torch.equal(KVPlan.read(tmp_path / "back.json").full, plan.full) and back["window"] == 4


@pytest.mark.parametrize("case, words", [
    ("grid", "3 layers x 2 key/value heads; the model has 4 x 2"),
    ("window", "recent_size 0 must be an integer >= 1"),
    ("foreign", "already holds a DuoAttention pattern or a config.json headprune did not write"),
    ("threshold", "--threshold deploys DuoAttention's learned gates"),
    ("options", "--duo-steps train DuoAttention's gates: they apply to --rule duo only"),
    ("trajectory", "--from-duo apply to one plan, not to --trajectory"),
    ("both", "--threshold and --full-share are two ways"),
])
def test_bad_duo_input_is_refused_before_loading(case, words, lm_dir, tmp_path, capsys, monkeypatch):
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    folder = tmp_path / "duo"
    folder.mkdir()
    (folder / TSV).write_text("\n".join("\t".join(["0.5"] * 2) for _ in range(3 if case == "grid" else 4)) + "\n")
    (folder / CONFIG).write_text(json.dumps({"sink_size": 4, "recent_size": 0 if case == "window" else 16}))
    argv = {"grid": ["--from-duo", str(folder)], "window": ["--from-duo", str(folder)],
            "foreign": ["--rule", "duo", "--export-duo", str(folder)],
            "threshold": ["--rule", "far-mass", "--threshold", "0.5"],
            "options": ["--rule", "far-mass", "--duo-steps", "3"],
            "trajectory": ["--trajectory", "--from-duo", str(folder)],
            "both": ["--rule", "duo", "--threshold", "0.5", "--full-share", "0.5"]}[case]
    code, err = run(capsys, "kvplan", "--model", lm_dir[0], *argv, "--out", str(tmp_path / "p.json"))
    assert code == 2 and err.startswith("error: ") and words in err, err
    assert (folder / TSV).read_text().startswith("0.5")          # a user's folder is never overwritten


def test_razor_separate_shares_keep_the_union_of_top_echo_and_top_induction_heads():
    rng = np.random.default_rng(5)
    echo, induction = rng.random((4, 8)), rng.random((4, 8))
    echo[0, 1] = np.nan                                   # a cut head is never a retrieval head
    plan = razor_share_plan(echo, induction, 2, 4, 16, echo_share=0.0625, induction_share=0.125)
    # by hand: 2 of 32 heads by echo, 4 by induction, the union; a group is full when any of its heads is chosen
    flat_e, flat_i = np.nan_to_num(echo, nan=-1).ravel(), induction.ravel()
    chosen = set(np.argsort(-flat_e)[:2]) | set(np.argsort(-flat_i)[:4])
    want = np.zeros((4, 2), dtype=bool)
    for i in chosen:
        want[i // 8, (i % 8) // 4] = True
    assert np.array_equal(plan.full.numpy(), want) and (plan.sink, plan.window) == (4, 16)
    assert sorted(tuple(h) for h in plan.meta["retrieval_query_heads"]) == sorted((i // 8, i % 8) for i in chosen)
    assert (RAZOR_ECHO_SHARE, RAZOR_INDUCTION_SHARE) == (0.01, 0.14)     # the reference's RAConfig defaults
    with pytest.raises(KVPlanError, match="echo share 1.5"):
        razor_share_plan(echo, induction, 2, 4, 16, echo_share=1.5)


@pytest.mark.parametrize("argv, words", [
    (["--rule", "far-mass", "--echo-share", "0.1"], "--echo-share and --induction-share are RazorAttention's"),
    (["--rule", "razor", "--echo-share", "0.1", "--full-share", "0.5"], "Give one or the other"),
    (["--rule", "razor", "--induction-share", "2"], "--induction-share 2.0 must lie in [0, 1]"),
    (["--trajectory", "--rule", "razor", "--echo-share", "0.1"], "--echo-share apply to one plan"),
])
def test_bad_razor_shares_are_refused_before_loading(argv, words, lm_dir, tmp_path, capsys, monkeypatch):
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    code, err = run(capsys, "kvplan", "--model", lm_dir[0], *argv, "--out", str(tmp_path / "p.json"))
    assert code == 2 and err.startswith("error: ") and words in err, err


def test_kvplan_razor_with_shares_writes_the_union_plan(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    code, out = run(capsys, "kvplan", "--model", model, "--data", data, "--rule", "razor", "--echo-share", "0.05",
                    "--induction-share", "0.1", "--sink", "1", "--window", "3", "--out", str(tmp_path / "r.json"))
    assert code == 0, out
    plan = KVPlan.read(tmp_path / "r.json")
    heads = plan.meta["retrieval_query_heads"]
    assert len(heads) <= round(0.05 * 32) + round(0.1 * 32) and out["echo_share"] == 0.05
    want = np.zeros((4, 2), dtype=bool)
    for layer, head in heads:
        want[layer, head // 4] = True
    assert np.array_equal(plan.full.numpy(), want)


def test_on_demo_circuit_learned_gates_keep_the_six_induction_heads_full_at_a_third():
    """The published method on a model whose answer is known, at S = 1, W = 4 (the copy a head reads lies outside
    the window): the induction heads (found by headprune's role detector, an independent measure) must keep the whole
    cache. With the defaults (30 steps of 4 rows, reg 2, rows of the median calibration length, the key filling 3/4
    of a row) the six are the six highest gates, so a plan keeping a third of the 24 groups full keeps all six; the
    last layer streams (no retrieval head there: README "The circuit demo"). Measured on this build over seeds 0-3:
    the lowest induction gate 0.57-0.70, the highest other 0.42-0.51 (docs/explanation/kv-duo.md); with the
    previous defaults (60 steps of 8 rows of the longest calibration row, reg 0.05, a 6-token key) 3 of the 6 were
    in the top 8."""
    from headprune.data import load_data, make_batches, split_calib_eval
    from headprune.model.loading import load_model
    from headprune.roles import RoleSpec, head_roles

    loaded = load_model("demo-circuit", device="cpu")
    calib_ds, _ = split_calib_eval(load_data("demo-circuit"), 64, 192, seed=0)
    calib = make_batches(loaded.tokenizer, calib_ds, 32)
    induction = np.asarray(head_roles(loaded.model, loaded.tokenizer, calib,
                                      RoleSpec(parser=None)).heads_with("induction"))
    assert induction.sum() == 6
    learned = train_gates(loaded.model, loaded.tokenizer, calib, sink=1, window=4, seed=0)
    plan = plan_from_scores(learned.query_scores(8), 8, 1 / 3, 1, 4)
    assert plan.full.numpy()[induction].all(), (learned.gates.round(2), induction)
    assert np.array_equal(top_share(torch.as_tensor(learned.gates), 0.25).numpy(), induction)   # the top 6 exactly
    assert not plan.full[2].any()                                     # the last layer streams
    assert np.mean(learned.losses[-5:]) < learned.losses[0]          # from reg x 1 at gates of 1, down
    assert learned.params["steps"] * learned.params["batch_size"] == 120 and learned.seconds > 0


def test_the_gated_attention_refuses_what_it_does_not_implement():
    model = tiny_decoder("qwen2")          # its tiny config has sliding-window layers
    assert "sliding_attention" in model.config.layer_types
    with pytest.raises(KVPlanError, match="does not implement sliding_window"):
        gated_copy(model, torch.ones(4, 2), 1, 3)(input_ids=random_decoder_batch(seq_len=16)["input_ids"])
