"""Recovery after pruning (issue 24): pruned heads stay pruned, LoRA merges exactly, exports load without
headprune, runs are deterministic and resumable, the loss falls, the demo regains accuracy, bad input is refused
before a model loads.

Tiny random models (``headprune.testing``) with offline tokenizers; the demo only in the one integration test.
"""

from __future__ import annotations

import copy
import json
import random
import re
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import headprune.cli.recover
from headprune.cli import main
from headprune.data import TextDataset, align_labels, as_lm_data, make_batches, model_inputs
from headprune.errors import Cancelled
from headprune.model.arch import adapt
from headprune.model.mask import HeadMask
from headprune.model.tokenizer import prepare_tokenizer
from headprune.recovery import RecoveryRun, RecoverySpec, export_recovered
from headprune.testing import offline_tokenizer, tiny_decoder, tiny_model

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "good bad fine awful great poor nice dull bright grim warm cold".split()
POSITIVE = {"good", "fine", "great", "nice", "bright", "warm"}


def _texts(n: int, seed: int = 0) -> tuple[list[str], list[int]]:
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]
    return texts, [int(sum(w in POSITIVE for w in t.split()) * 2 > len(t.split())) for t in texts]


@pytest.fixture(scope="module")
def cls_setup():
    """(tiny BERT classifier, tokenizer, training rows)."""
    texts, labels = _texts(48)
    tok = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_model("bert", num_labels=2, vocab_size=len(tok))
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    prepare_tokenizer(tok, model)
    return model, tok, align_labels(TextDataset(texts, labels=labels, source="tiny"), model.config.id2label)


@pytest.fixture(scope="module")
def lm_setup():
    """(tiny Llama LM with 8 query / 2 key-value heads a layer, tokenizer, training rows)."""
    texts, _ = _texts(32, seed=1)
    tok = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_decoder("llama", vocab_size=len(tok), n_layers=2)
    prepare_tokenizer(tok, model)
    return model, tok, as_lm_data(TextDataset(texts, source="tiny-lm"))


CLS_MASK = {"pruned": {"0": [0, 1], "1": [3], "2": [0, 2, 3]}}
LM_MASK = {"pruned": {"0": [0, 1, 2], "1": [5]}}   # different head counts per layer (a non-uniform GQA cut)


def _mask(model, obj) -> HeadMask:
    adapter = adapt(model)
    return HeadMask.from_json(obj, adapter.grid_shape, adapter.group_grid())


def _spec(**kw) -> RecoverySpec:
    return RecoverySpec(**{"epochs": 2, "batch_size": 8, "lr": 1e-3, "seed": 0, **kw})


def _logits(model, tok, ds, gates=None):
    batch = make_batches(tok, ds.subset(range(8)), 8, 32)[0]
    with torch.no_grad():
        if gates is None:
            return model(**model_inputs(batch)).logits
        with gates:
            return model(**model_inputs(batch)).logits


def _perturb_pruned(model, mask: HeadMask):
    """A copy of ``model`` whose pruned heads' own Q rows and O columns are random (K/V shared under GQA: kept)."""
    noisy = copy.deepcopy(model)
    keep = mask.keep_bool()
    g = torch.Generator().manual_seed(7)
    for block in adapt(noisy).blocks:
        d = block.head_size
        for h in [h for h in block.kept if not keep[block.index, h]]:
            p = block.kept.index(h)
            with torch.no_grad():
                block.query.weight[p * d:(p + 1) * d].normal_(generator=g)
                block.output.weight[:, p * d:(p + 1) * d].normal_(generator=g)
    return noisy


def _recover(model, tok, mask, ds, tmp_path, name, **kw):
    mode = kw.pop("mode", None)
    run = RecoveryRun(_spec(**kw), model, tok, mask, ds, work_dir=tmp_path / name, mode=mode)
    return run.run()


@pytest.mark.parametrize("setup,mask_obj,method,mode", [
    ("cls_setup", CLS_MASK, "finetune", "cut"), ("cls_setup", CLS_MASK, "finetune", "gated"),
    ("cls_setup", CLS_MASK, "lora", "gated"), ("lm_setup", LM_MASK, "lora", "cut"),
    ("lm_setup", LM_MASK, "finetune", "gated")])
def test_pruned_heads_contribute_nothing_after_recovery(request, tmp_path, setup, mask_obj, method, mode):
    """Recovering a model whose pruned heads' Q rows and O columns were randomised gives the same recovered
    model, logit for logit, as recovering the original: nothing of those heads reaches training or output."""
    model, tok, ds = request.getfixturevalue(setup)
    mask = _mask(model, mask_obj)
    a = _recover(model, tok, mask, ds, tmp_path, "a", method=method, mode=mode, epochs=1)
    b = _recover(_perturb_pruned(model, mask), tok, mask, ds, tmp_path, "b", method=method, mode=mode, epochs=1)
    assert a.mode == mode
    assert not torch.equal(_logits(model, tok, ds), _logits(_perturb_pruned(model, mask), tok, ds))  # it matters
    torch.testing.assert_close(_logits(a.model, tok, ds), _logits(b.model, tok, ds), rtol=0, atol=1e-5)


def _pruned_slices(model, mask):
    keep = mask.keep_bool()
    for block in adapt(model).blocks:
        d = block.head_size
        for h in (h for h in block.kept if not keep[block.index, h]):
            p = block.kept.index(h)
            yield block.query.weight[p * d:(p + 1) * d], block.output.weight[:, p * d:(p + 1) * d]


def _stock_load(jobs: list[dict]) -> dict:
    """Load each folder in a process that never imports headprune; its logits on the saved batch."""
    code = r"""
import json, sys, torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification
out = {}
for job in json.loads(sys.argv[1]):
    auto = AutoModelForCausalLM if job["lm"] else AutoModelForSequenceClassification
    model = auto.from_pretrained(job["folder"]).eval()
    ref = load_file(job["ref"])
    with torch.no_grad():
        logits = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"]).logits
    out[job["folder"]] = (logits - ref["logits"]).abs().max().item()
out["headprune imported"] = any(n.split(".")[0] == "headprune" for n in sys.modules)
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code, json.dumps(jobs)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_lora_merge_exports_equal_the_peft_model_and_load_without_headprune(cls_setup, lm_setup, tmp_path):
    """LoRA on a cut Llama with different head counts per layer (uniform export refused: headprune format) and on a
    gated BERT (masked export): the merged export's logits equal the peft model's within 1e-5; the masked export
    holds zeros in the pruned heads' Q rows and O columns and loads in plain transformers; so does a uniform one."""
    jobs = []
    # gated BERT, LoRA, masked export
    model, tok, ds = cls_setup
    mask = _mask(model, CLS_MASK)
    run = RecoveryRun(_spec(method="lora", epochs=1), model, tok, mask, ds, work_dir=tmp_path / "w1",
                      gated_export=True)
    peft_model, *rest = run.train()
    peft_logits = _logits(peft_model, tok, ds, run.gates())
    result = run.finish(peft_model, *rest)
    assert result.mode == "gated"
    torch.testing.assert_close(_logits(result.model, tok, ds), peft_logits, rtol=0, atol=1e-5)
    export_recovered(result, model, tok, tmp_path / "masked", "masked")
    for q_rows, o_cols in _pruned_slices(result.model, mask):
        assert q_rows.abs().max() == 0 and o_cols.abs().max() == 0
    batch = make_batches(tok, ds.subset(range(8)), 8, 32)[0]
    save_file({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
               "logits": peft_logits.contiguous()}, tmp_path / "masked.ref")
    jobs.append({"folder": str(tmp_path / "masked"), "ref": str(tmp_path / "masked.ref"), "lm": False})

    # cut Llama with 5 / 7 query heads: LoRA trains and merges; headprune export reloads with the peft logits
    lm, lm_tok, lm_ds = lm_setup
    lm_mask = _mask(lm, LM_MASK)
    run = RecoveryRun(_spec(method="lora", epochs=1), lm, lm_tok, lm_mask, lm_ds, work_dir=tmp_path / "w2")
    peft_model, *rest = run.train()
    peft_logits = _logits(peft_model, lm_tok, lm_ds)
    result = run.finish(peft_model, *rest)
    assert [b.n_live for b in adapt(result.model).blocks] == [5, 7]
    export_recovered(result, lm, lm_tok, tmp_path / "cut", "headprune")
    from headprune.model.loading import load_model
    reloaded = load_model(str(tmp_path / "cut"), "cpu").model
    torch.testing.assert_close(_logits(reloaded, lm_tok, lm_ds), peft_logits, rtol=0, atol=1e-5)

    # uniform: 2 of 4 query heads per group... a mask keeping 4 query heads in 2 groups in every layer
    uniform = HeadMask.from_pruned({0: [0, 1, 4, 5], 1: [2, 3, 6, 7]}, adapt(lm).grid_shape)
    run = RecoveryRun(_spec(method="finetune", epochs=1), lm, lm_tok, uniform, lm_ds, work_dir=tmp_path / "w3")
    result = run.run()
    export_recovered(result, lm, lm_tok, tmp_path / "uniform", "uniform")
    batch = make_batches(lm_tok, lm_ds.subset(range(8)), 8, 32)[0]
    save_file({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
               "logits": _logits(result.model, lm_tok, lm_ds).contiguous()}, tmp_path / "uniform.ref")
    jobs.append({"folder": str(tmp_path / "uniform"), "ref": str(tmp_path / "uniform.ref"), "lm": True})

    report = _stock_load(jobs)
    assert report.pop("headprune imported") is False
    assert all(diff <= 1e-5 for diff in report.values()), report


def _weights(model) -> dict:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_deterministic_and_resumed_run_ends_with_the_same_weights(cls_setup, tmp_path):
    model, tok, ds = cls_setup
    mask = _mask(model, CLS_MASK)
    spec = _spec(epochs=3)
    first = RecoveryRun(spec, model, tok, mask, ds, work_dir=tmp_path / "a").run()
    second = RecoveryRun(spec, model, tok, mask, ds, work_dir=tmp_path / "b").run()
    w1, w2 = _weights(first.model), _weights(second.model)
    assert all(torch.equal(w1[k], w2[k]) for k in w1)

    run = RecoveryRun(spec, model, tok, mask, ds, work_dir=tmp_path / "c")
    stop_at = run.steps_per_epoch + 2   # mid-way through epoch 2: the epoch-1 checkpoint is the last one

    def cancel(fraction, message):
        if f"step {stop_at}/" in message:
            raise Cancelled()

    with pytest.raises(Cancelled):
        run.run(progress=cancel)
    assert (tmp_path / "c" / f"checkpoint-{run.steps_per_epoch}").is_dir()
    with pytest.raises(Exception, match="--resume"):   # a fresh run never overwrites an interrupted one
        RecoveryRun(spec, model, tok, mask, ds, work_dir=tmp_path / "c").run()
    resumed = RecoveryRun(spec, model, tok, mask, ds, work_dir=tmp_path / "c").run(resume=True)
    assert resumed.resumed_from.endswith(f"checkpoint-{run.steps_per_epoch}")
    w3 = _weights(resumed.model)
    assert all(torch.equal(w1[k], w3[k]) for k in w1), [k for k in w1 if not torch.equal(w1[k], w3[k])][:3]


@pytest.mark.parametrize("method", ["finetune", "distill", "lora"])
def test_loss_falls(lm_setup, tmp_path, method):
    """A tiny Llama cut to 5 / 7 heads learns its training text: the loss of the last steps is well below the first."""
    model, tok, ds = lm_setup
    result = _recover(model, tok, _mask(model, LM_MASK), ds, tmp_path, "w", method=method, epochs=4, lr=3e-3)
    losses = [loss for _, loss in result.losses]
    assert len(losses) == result.steps == 16
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.1, losses   # LoRA (fewest parameters) falls by ~0.25


def test_distillation_term_is_hintons(cls_setup):
    """T² · KL(teacher_T ‖ student_T) by hand, and zero when the student is the teacher."""
    from headprune.model.task import Task
    from headprune.recovery import distill_kl
    s, t = torch.randn(5, 3), torch.randn(5, 3)
    p_t, p_s = torch.softmax(t / 2, -1), torch.softmax(s / 2, -1)
    by_hand = 4 * (p_t * (p_t.log() - p_s.log())).sum(-1).mean()
    torch.testing.assert_close(distill_kl(Task("classification"), s, t, {}, 2.0), by_hand)
    assert distill_kl(Task("classification"), t, t, {}, 2.0).abs() < 1e-7


def test_demo_at_75_percent_gains_accuracy_after_one_epoch(tmp_path):
    """The demo with 75% of its heads cut (54 of 72, seeded), one epoch on 400 rows of demo:train."""
    import numpy as np

    from headprune.recovery import stage_metrics
    from headprune.workspace import Workspace
    ws = Workspace.build("demo", "demo", calib_size=0, eval_size=200, seed=0)
    order = np.random.default_rng(3).permutation(72)[:54]
    mask = HeadMask.from_pruned({int(i // 12): [] for i in order}, ws.shape)
    for i in order:
        mask = mask.prune(int(i // 12), int(i % 12))
    from headprune.data import load_data
    train = align_labels(load_data("demo:train").subset(range(400)), ws.loaded.id2label)
    spec = RecoverySpec(epochs=1, batch_size=16, lr=2e-4, seed=0, freeze_embeddings=True, max_length=64)
    result = RecoveryRun(spec, ws.loaded.model, ws.loaded.tokenizer, mask, train, work_dir=tmp_path / "w").run()
    metrics = stage_metrics(ws.loaded.model, mask, result, ws.eval_batches, task=ws.task)
    assert metrics["pruned"]["accuracy"] < metrics["dense"]["accuracy"]
    assert metrics["recovered"]["accuracy"] > metrics["pruned"]["accuracy"], metrics


# -- bad input, before any model loads ----------------------------------------------------------------------------

def _no_load(*args, **kwargs):
    raise AssertionError("a model was loaded before the arguments were checked")


@pytest.fixture
def folders(tmp_path, cls_setup):
    """A 2-label student folder, a 3-label teacher folder, an unlabelled CSV and a mask."""
    model, tok, _ = cls_setup
    model.save_pretrained(tmp_path / "student")
    tok.save_pretrained(tmp_path / "student")
    teacher = tiny_model("bert", num_labels=3, vocab_size=len(tok))
    teacher.save_pretrained(tmp_path / "teacher")
    tok.save_pretrained(tmp_path / "teacher")
    (tmp_path / "rows.csv").write_text("text\ngood film\nbad film\n")
    (tmp_path / "mask.json").write_text(json.dumps(CLS_MASK))
    return tmp_path


@pytest.mark.parametrize("extra,message", [
    (["--train-data", "{tmp}/rows.csv"], r"rows.csv: no label column found"),
    (["--method", "distill", "--teacher", "{tmp}/teacher"], r"label counts differ \(3 in the teacher, 2 in"),
    (["--epochs", "0"], r"--epochs 0: .* must be an integer in \[1, "),
    (["--lr", "0"], r"--lr 0.0: the learning rate must be > 0"),
    (["--lr=-1e-4"], r"--lr -0.0001: the learning rate must be > 0"),
    (["--method", "lora", "--lora-rank", "0"], r"--lora-rank 0: .* must be an integer in \[1, "),
])
def test_bad_input_is_refused_before_a_model_loads(folders, monkeypatch, capsys, extra, message):
    monkeypatch.setattr(headprune.cli.recover, "load_model", _no_load)
    tmp = str(folders)
    (folders / "labelled.csv").write_text("text,label\ngood film,pos\nbad film,neg\n")
    argv = ["recover", "--model", f"{tmp}/student", "--mask", f"{tmp}/mask.json", "--out", f"{tmp}/out",
            "--train-data", f"{tmp}/labelled.csv"] + [a.format(tmp=tmp) for a in extra]   # the last one counts
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:"), err
    assert re.search(message, err), err
    assert not (folders / "out").exists()


@pytest.mark.parametrize("name", ["sap_fig6", "demo_recover"])
def test_recovery_protocols_parse(name):
    """The shipped recovery protocols are TOML whose [recovery] table is a valid RecoverySpec, with a training
    source disjoint in name from the evaluation source of every model (parse only: sap_fig6 needs the network)."""
    from pathlib import Path

    import tomllib
    text = (Path(__file__).resolve().parents[1] / "protocols" / f"{name}.toml").read_text(encoding="utf-8")
    protocol = tomllib.loads(text)
    spec = RecoverySpec(**protocol["recovery"])
    assert spec.epochs >= 1 and protocol["sparsities"]
    for model in protocol["models"] if isinstance(protocol["models"][0], dict) else [protocol]:
        assert model["data"]["train"]["source"] != model["data"]["eval"]["source"]
    assert ("NEEDS THE NETWORK" in text) == (name == "sap_fig6")


def test_the_cli_records_its_data_roles_as_the_workspace_does(tiny_model_dir, tiny_csv):
    """``recover``'s evaluation rows are the data roles' evaluation role, and the training role is recorded with
    the same fields (source, split, size, seed, content hash)."""
    import argparse

    from headprune.cli.recover import eval_data
    from headprune.data import content_hash, load_data
    from headprune.model.loading import load_model
    from headprune.recovery import data_role
    from headprune.workspace import Workspace

    loaded = load_model(str(tiny_model_dir), "cpu")
    args = argparse.Namespace(model=str(tiny_model_dir), data=tiny_csv, eval_data=None, text_col=None, pair_col=None,
                              label_col=None, eval_size=15, max_length=32, batch_size=4, seed=3, task=None)
    evals, batches, role = eval_data(args, loaded)
    ws = Workspace.build(str(tiny_model_dir), tiny_csv, calib_size=0, select_size=0, eval_size=15, seed=3,
                         loaded=loaded, max_length=32, batch_size=4)
    assert role == ws.roles()["eval"] and role["hash"] == content_hash(evals) and len(evals) == 15
    assert set(evals.texts) <= set(load_data(tiny_csv).texts)   # a draw of the source (labels aligned to ids)
    assert sum(len(b["input_ids"]) for b in batches) == 15
    train = load_data(tiny_csv).subset(list(range(10)))
    recorded = data_role(train, tiny_csv, 3)
    assert set(recorded) == set(role) and recorded["hash"] == content_hash(train)


# -- the default recipe (issue 29 item 9) ----------------------------------------------------------------------

FILLER = "the a film plot story actor scene music and was".split()


def _first_word_texts(n: int, seed: int) -> tuple[list[str], list[int]]:
    """A learnable task: filler words after one sentiment word in first place; the label is that word's polarity."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        word = rng.choice(WORDS)
        texts.append(" ".join([word] + [rng.choice(FILLER) for _ in range(rng.randint(3, 7))]))
        labels.append(int(word in POSITIVE))
    return texts, labels


def test_the_default_recipe_recovers_a_pruned_model_on_a_learnable_task(tmp_path):
    """A tiny BERT taught the first-word task, 9 of its 12 heads cut: the defaults (distillation from the dense
    model, warm-up and linear decay, dropout off, frozen word embeddings; only the peak rate scaled to a 32-wide
    model) lower the training loss and win back held-out accuracy the cut lost, beyond its binomial noise."""
    from headprune.evaluation.metrics import evaluate
    texts, labels = _first_word_texts(384, seed=3)
    tok = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_model("bert", num_labels=2, vocab_size=len(tok))
    model.config.id2label, model.config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    prepare_tokenizer(tok, model)
    rows = align_labels(TextDataset(texts, labels=labels, source="first-word"), model.config.id2label)
    train, held = rows.subset(range(256)), rows.subset(range(256, 384))
    teach = RecoverySpec(method="finetune", lr=3e-3, epochs=3, batch_size=16, seed=0, freeze_embeddings=False)
    dense = RecoveryRun(teach, model, tok, None, train, work_dir=tmp_path / "dense").run().model
    batches = make_batches(tok, held, 64, 32)
    mask = HeadMask.from_pruned({0: [0, 1, 2], 1: [1, 2, 3], 2: [0, 2, 3]}, (3, 4))
    acc_dense, acc_pruned = evaluate(dense, batches).accuracy, evaluate(dense, batches, mask).accuracy
    assert acc_pruned < acc_dense - 0.15, (acc_dense, acc_pruned)   # the cut costs accuracy
    spec = RecoverySpec(lr=3e-3, epochs=2)
    assert (spec.method, spec.dropout, spec.warmup) == ("distill", False, 0.1)
    result = RecoveryRun(spec, dense, tok, mask, train, work_dir=tmp_path / "rec").run()
    losses = [loss for _, loss in result.losses]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.05, losses
    acc_recovered = evaluate(result.model, batches).accuracy
    se = (acc_pruned * (1 - acc_pruned) / len(held)) ** 0.5
    assert acc_recovered > acc_pruned + 2 * se, (acc_dense, acc_pruned, acc_recovered)
    assert acc_recovered - acc_pruned >= 0.5 * (acc_dense - acc_pruned), (acc_dense, acc_pruned, acc_recovered)


@pytest.mark.parametrize("keep", [False, True])
def test_dropout_is_off_while_training_and_restored_after(cls_setup, tmp_path, keep):
    """Default: every dropout rate of the student is 0 during the run and back to the model's after it; with
    ``dropout=True`` the rates stay as they are throughout. The loaded model is never changed."""
    model, tok, ds = cls_setup
    noisy = copy.deepcopy(model)
    for module in noisy.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.1
    run = RecoveryRun(_spec(method="finetune", epochs=1, dropout=keep), noisy, tok, _mask(noisy, CLS_MASK), ds,
                      work_dir=tmp_path / "w")
    seen = []

    def watch(fraction, message):
        seen.extend(m.p for m in run.student.modules() if isinstance(m, torch.nn.Dropout))

    result = run.run(progress=watch)
    assert seen and set(seen) == ({0.1} if keep else {0.0})
    assert {m.p for m in result.model.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
    assert {m.p for m in noisy.modules() if isinstance(m, torch.nn.Dropout)} == {0.1}
