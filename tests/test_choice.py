"""Multiple choice: the split rule (against lm-eval's own _encode_pair), acc / acc_norm / acc_bytes and their
standard errors against a hand computation of batch-of-one summed log-likelihoods, whole-question batches, the
live evaluator against full evaluation under masks, stability, the gold-row loss, KL, and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

from headprune import criteria
from headprune.criteria import onepass
from headprune.criteria.kl import kl_raw_importance
from headprune.data import TextDataset, load_data, make_batches, prefix_token_id, split_context_continuation
from headprune.demos.lm import train_tokenizer, write_cloze_jsonl
from headprune.errors import DataError
from headprune.evaluation.live import LiveEvaluator
from headprune.evaluation.metrics import evaluate
from headprune.evaluation.stability import perturb_batches, stability
from headprune.model.gating import gate_heads
from headprune.model.hooks import structural_copy
from headprune.model.mask import HeadMask
from headprune.model.task import GOLD_KEY, IGNORE_INDEX, Task, TaskError, task_for
from headprune.scoring import ScoringContext
from headprune.trajectory import TrajectorySpec, run_trajectory
from headprune.workspace import Workspace

CORPUS = ["the film is good and the plot is very good", "a bad film with a bad plot", "the actors are fine",
          "it is a very long film about nothing", "good fun for the whole family", "dull, slow and far too long"]
QUESTIONS = [("the film is", ["good", "bad"], 0), ("a bad", ["film", "plot", "actors"], 1),
             ("it is a very ", ["long film", "short", "good fun", "x"], 2), ("good fun", ["for all", "no"], 1),
             ("the actors", ["are fine", "are dull", "slow"], 0), ("dull, slow and", ["far too long", "fun"], 0),
             ("", ["nothing", "the film"], 1)]


@pytest.fixture(scope="module")
def tok():
    """The LM demo's tokenizer recipe (<bos> $A <eos> on every encode) on a tiny corpus."""
    return train_tokenizer(CORPUS * 3)


@pytest.fixture(scope="module")
def model(tok):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def dataset(questions=QUESTIONS) -> TextDataset:
    return TextDataset(texts=[q[0] for q in questions], choices=[list(q[1]) for q in questions],
                       labels=[q[2] for q in questions], task="multiple_choice", source="test")


def reference(model, tok, mask=None) -> dict:
    """acc, acc_norm, acc_bytes and stderrs from batch-of-one forwards and lm-eval's formulas written out."""
    model = structural_copy(model)   # gated below: a private copy, as the library does
    right = {"acc": [], "acc_norm": [], "acc_bytes": []}
    gold_nll = []
    for context, choices, answer in QUESTIONS:
        ll = []
        for choice in choices:
            ctx, cont = split_context_continuation(tok, context, choice)
            ids = torch.tensor([ctx + cont])
            with torch.no_grad(), gate_heads(model, mask):
                logp = F.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            ll.append(sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(cont)))
        ll = np.array(ll)
        chars = np.array([len(c) for c in choices], float)
        n_bytes = np.array([len(c.encode()) for c in choices], float)
        right["acc"].append(float(np.argmax(ll) == answer))
        right["acc_norm"].append(float(np.argmax(ll / chars) == answer))
        right["acc_bytes"].append(float(np.argmax(ll / n_bytes) == answer))
        gold_nll.append(-ll[answer])
    out = {"loss": float(np.mean(gold_nll))}
    for name, values in right.items():
        mean = sum(values) / len(values)
        out[name] = mean
        out[f"{name}_stderr"] = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) / \
            math.sqrt(len(values))
    return out


# -- the split rule --------------------------------------------------------------------------------------------

def test_split_rule_matches_lm_eval_encode_pair(tok):
    lm_eval_model = pytest.importorskip("lm_eval.api.model")
    fake = types.SimpleNamespace(backend="causal", tok_encode=lambda s: tok.encode(s, add_special_tokens=False))
    assert tok.encode("the film")[-1] == tok.eos_token_id   # the demo recipe appends <eos>: why the rule exists
    for context, choices, _ in QUESTIONS[:-1]:
        for choice in choices:
            ctx, cont = split_context_continuation(tok, context, choice)
            their_ctx, their_cont = lm_eval_model.TemplateLM._encode_pair(fake, context, " " + choice)
            assert ctx == [prefix_token_id(tok), *their_ctx]
            assert cont == their_cont
            assert tok.eos_token_id not in ctx + cont
            assert tok.decode(cont).strip() == choice.strip()


def test_split_rule_moves_trailing_space_and_handles_empty_context(tok):
    ctx, cont = split_context_continuation(tok, "the film is ", "good")
    whole = tok.encode("the film is  good", add_special_tokens=False)
    assert ctx[1:] + cont == whole and ctx[1:] == tok.encode("the film is", add_special_tokens=False)
    ctx, cont = split_context_continuation(tok, "", "good")
    assert ctx == [tok.bos_token_id] and cont == tok.encode(" good", add_special_tokens=False)


# -- metrics -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("pruned", [(), ((0, 1), (2, 3)), ((1, 0), (1, 1), (1, 2))])
def test_metrics_equal_batch_of_one_hand_computation(model, tok, pruned):
    mask = HeadMask.ones((3, 4))
    for layer, head in pruned:
        mask = mask.prune(layer, head)
    batches = make_batches(tok, dataset(), batch_size=5)
    got = evaluate(model, batches, mask).to_dict()
    want = reference(model, tok, mask)
    assert got["n"] == len(QUESTIONS)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-4), name


def test_task_comes_from_the_data(model, tok):
    batches = make_batches(tok, dataset(), batch_size=8)
    assert task_for(model, batches) == Task("multiple_choice")
    assert task_for(model, [{"input_ids": torch.ones(1, 2, dtype=torch.long)}]).kind == "lm"
    assert Task("multiple_choice").headline == "acc" and Task("multiple_choice").higher_is_better
    with pytest.raises(TaskError, match="classification"):
        task_for(model, batches, "classification")


# -- batches -----------------------------------------------------------------------------------------------------

def test_batches_keep_questions_whole(tok):
    ds = dataset()
    for size in (1, 3, 4, 5, 9):
        batches = make_batches(tok, ds, batch_size=size)
        seen = [q for b in batches for q in b["index"]]
        assert sorted(seen) == sorted(q for q, (_, ch, _) in enumerate(QUESTIONS) for _ in ch)
        owner = {}
        for i, b in enumerate(batches):
            assert len(b["index"]) <= size or len(set(b["index"])) == 1
            for q in b["index"]:
                assert owner.setdefault(q, i) == i        # a question never spans two batches
            for r, q in enumerate(b["index"]):
                n = int((b["labels"][r] != IGNORE_INDEX).sum())
                c = int(b["choice"][r])
                _, cont = split_context_continuation(tok, ds.texts[q], ds.choices[q][c])
                assert n == len(cont) and bool(b[GOLD_KEY][r]) == (c == ds.labels[q])
                assert int(b["choice_chars"][r]) == len(ds.choices[q][c])


# -- live evaluator ----------------------------------------------------------------------------------------------

def test_live_equals_full_evaluation_and_estimate_counts_questions(model, tok):
    batches = make_batches(tok, dataset(), batch_size=5)
    live = LiveEvaluator(model, batches)
    assert live.task.is_choice and live.metrics().to_dict() == pytest.approx(evaluate(model, batches).to_dict())
    rng = np.random.default_rng(0)
    for _ in range(6):
        layer, head = int(rng.integers(3)), int(rng.integers(4))
        estimates = []
        got = live.toggle(layer, head, on_estimate=estimates.append).to_dict()
        want = evaluate(model, batches, live.mask).to_dict()
        assert got == pytest.approx(want, abs=1e-5)
        assert estimates[-1].exact and estimates[-1].metric == "acc"
        assert estimates[-1].value == pytest.approx(want["acc"]) and estimates[-1].rows == len(QUESTIONS)
    assert live.stats.partial_runs > 0


# -- stability ---------------------------------------------------------------------------------------------------

def test_stability_perturbs_each_context_once_and_keeps_choices(model, tok):
    batches = make_batches(tok, dataset(), batch_size=5)
    noisy = perturb_batches(batches, tok, p=0.5, seed=1)
    changed = False
    for clean, new in zip(batches, noisy):
        contexts = {}
        for r, q in enumerate(new["index"]):
            real = new["attention_mask"][r].bool()
            scored = new["labels"][r][real] != IGNORE_INDEX
            ids = new["input_ids"][r][real]
            assert contexts.setdefault(q, ids[~scored].tolist()) == ids[~scored].tolist()   # shared by choices
            old = clean["input_ids"][r][clean["labels"][r] != IGNORE_INDEX]
            assert ids[scored].tolist() == old.tolist()                                       # choice kept
            changed |= ids[~scored].tolist() != clean["input_ids"][r][clean["attention_mask"][r].bool()][
                clean["labels"][r][clean["attention_mask"][r].bool()] == IGNORE_INDEX].tolist()
        assert all(c[0] == tok.bos_token_id for c in contexts.values())
    assert changed
    assert stability(model, batches, perturb_batches(batches, tok, p=0.0)) == 100.0
    picked = stability(model, batches, noisy)
    assert 0.0 <= picked <= 100.0


def test_trajectory_with_stability_runs_on_multiple_choice(model, tok):
    batches = make_batches(tok, dataset(), batch_size=5)
    spec = TrajectorySpec(criterion=criteria.get("random"), step=4, budget=0.5, stability=True, drop=0.3)
    traj = run_trajectory(spec, model, batches, batches, tokenizer=tok)
    assert traj.metric == "acc" and traj.dense["stability"] == 100.0
    last = traj.steps[-1]
    mask = HeadMask.ones((3, 4))
    for step in traj.steps:
        for layer, head in step["removed"]:
            mask = mask.prune(layer, head)
    assert last["metrics"]["acc"] == pytest.approx(evaluate(model, batches, mask).acc)
    want = stability(model, batches, perturb_batches(batches, tok, 0.3, spec.seed), mask)
    assert last["stability"] == pytest.approx(want)


# -- loss and KL -------------------------------------------------------------------------------------------------

def test_gold_row_loss_is_the_right_choices_nll(model, tok):
    batches = make_batches(tok, dataset(), batch_size=64)
    (batch,) = batches
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    per_row = Task("multiple_choice").per_example_loss(logits, batch)
    want = reference(model, tok)["loss"]
    assert float(per_row.sum()) / len(QUESTIONS) == pytest.approx(want, abs=1e-4)
    assert torch.all(per_row[~batch[GOLD_KEY]] == 0)
    assert float(Task("multiple_choice").loss(logits, batch)) == pytest.approx(want, abs=1e-4)
    value = onepass.objective_value(logits, batch["labels"], "loss", batch["attention_mask"], batch[GOLD_KEY])
    assert float(value) == pytest.approx(want * len(QUESTIONS), abs=1e-3)
    log_p, real = Task("multiple_choice").output_log_probs(logits, batch)
    assert torch.equal(real[:, :-1], batch["labels"][:, 1:] != IGNORE_INDEX)


def test_criteria_score_multiple_choice(model, tok):
    batches = make_batches(tok, dataset(), batch_size=5)
    scores = criteria.get("his")(ScoringContext(model, batches))
    assert np.isfinite(scores.scores).all() and (scores.scores != 0).any()
    raw = kl_raw_importance(model, batches)
    assert np.isfinite(raw).all() and (raw >= 0).all()


# -- reading data and bad input --------------------------------------------------------------------------------

def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_field_maps(tmp_path):
    hella = load_data(_jsonl(tmp_path / "h.jsonl", [{"ctx": "a man", "endings": ["runs", "sits", "x", "y"],
                                                      "label": "2"}]))
    assert hella.task == "multiple_choice" and hella.labels == [2] and hella.choices[0][2] == "x"
    arc = load_data(_jsonl(tmp_path / "a.jsonl", [
        {"question": "q?", "choices": {"text": ["p", "q", "r"], "label": ["A", "B", "C"]}, "answerKey": "C"},
        {"question": "q2?", "choices": {"text": ["p", "q"], "label": ["1", "2"]}, "answerKey": "2"}]))
    assert arc.labels == [2, 1] and arc.columns["field_map"] == "arc"
    piqa = load_data(_jsonl(tmp_path / "p.jsonl", [{"goal": "open a jar", "sol1": "twist", "sol2": "bite",
                                                     "label": 0}]))
    assert piqa.choices == [["twist", "bite"]] and piqa.labels == [0]
    csv_file = tmp_path / "g.csv"
    csv_file.write_text('stem,opts,right\nthe film,"[""good"", ""bad""]",B\n')
    generic = load_data(str(csv_file), context_col="stem", choices_col="opts", answer_col="right")
    assert generic.choices == [["good", "bad"]] and generic.labels == [1]
    cloze = tmp_path / "cloze.jsonl"
    write_cloze_jsonl(cloze, n=20)
    from_file, named = load_data(str(cloze)), load_data("demo-lm-cloze")
    assert from_file.texts == named.texts[:20] and from_file.choices == named.choices[:20]
    assert from_file.labels == named.labels[:20] and all(len(c) == 4 for c in named.choices)


@pytest.mark.parametrize("rows, kwargs, message", [
    ([{"context": "c", "choices": ["a", "b"], "answer": 2}], {}, "out of range for its 2 choices"),
    ([{"context": "c", "choices": ["a"], "answer": 0}], {}, "at least two"),
    ([{"context": "c", "choices": ["a", "b"], "answer": 0}], {"choices_col": "options"},
     "no choices column 'options'. Columns found: context, choices, answer"),
])
def test_bad_input(tmp_path, rows, kwargs, message):
    with pytest.raises(DataError, match=message):
        load_data(_jsonl(tmp_path / "bad.jsonl", rows), **kwargs)


@pytest.mark.parametrize("rows, extra, message", [
    ([{"context": "c", "choices": ["a", "b"], "answer": 5}], [], "out of range"),
    ([{"context": "c", "choices": ["a"], "answer": 0}], [], "at least two"),
    ([{"stem": "c", "opts": ["a", "b"], "answer": 0}], ["--context-col", "ctx"], "Columns found: stem, opts, answer"),
])
def test_cli_refuses_bad_input_before_any_model_loads(tmp_path, rows, extra, message):
    data = _jsonl(tmp_path / "bad.jsonl", rows)
    missing_model = str(tmp_path / "no-such-model")   # loading it would fail with a model error instead
    done = subprocess.run([sys.executable, "-m", "headprune", "evaluate", "--model", missing_model, "--data", data,
                           *extra], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and message in done.stderr


@pytest.fixture(scope="module")
def folder(tmp_path_factory, model, tok):
    """The tiny decoder and its tokenizer saved like a user's model folder."""
    out = tmp_path_factory.mktemp("choice") / "tiny-llama"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_hf_data_with_arc_fields_makes_the_workspace_multiple_choice(tmp_path, folder):
    datasets = pytest.importorskip("datasets")
    rows = {"question": [q[0] or "?" for q in QUESTIONS],
            "choices": [{"text": q[1], "label": [chr(65 + i) for i in range(len(q[1]))]} for q in QUESTIONS],
            "answerKey": [chr(65 + q[2]) for q in QUESTIONS]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "arc"))
    ws = Workspace.build(str(folder), f"hf:{tmp_path / 'arc'}", calib_size=2, eval_size=5)
    assert ws.task.is_choice and ws.metric == "acc" and ws.dataset.columns["field_map"] == "arc"
    assert ws.dataset.labels == [q[2] for q in QUESTIONS]


def test_cli_evaluate_and_trajectory_on_a_saved_decoder(tmp_path, folder):
    data = _jsonl(tmp_path / "q.jsonl", [{"context": c, "choices": ch, "answer": a} for c, ch, a in QUESTIONS])
    common = ["--model", str(folder), "--data", data, "--calib-size", "3", "--eval-size", "4", "--seed", "1"]
    done = subprocess.run([sys.executable, "-m", "headprune", "evaluate", *common], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed["task"] == "multiple_choice" and printed["n"] == 4
    ws = Workspace.build(str(folder), data, calib_size=3, eval_size=4, seed=1)
    want = evaluate(ws.loaded.model, ws.eval_batches)
    for name in ("acc", "acc_norm", "acc_bytes", "acc_stderr", "acc_norm_stderr", "acc_bytes_stderr", "loss"):
        assert printed[name] == pytest.approx(getattr(want, name), abs=1e-6), name
    out = tmp_path / "run.json"
    done = subprocess.run([sys.executable, "-m", "headprune", "trajectory", *common, "--criterion", "his", "--step",
                           "4", "--budget", "0.5", "--stability", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    run = json.loads(out.read_text())
    assert run["metric"] == "acc" and run["dense"]["stability"] == 100.0
    assert [s["n_pruned"] for s in run["steps"]] == [4, 6]


def test_the_output_head_runs_only_where_a_choice_is_scored(tmp_path):
    """Evaluation forwards of multiple-choice batches ask for the logits of the positions that score a continuation
    only (``logits_to_keep``); the per-row sums equal those of the full logits, computed here independently."""
    from harness_support import random_questions, word_tokenizer, write_task

    from headprune.data import make_choice_batches, model_inputs
    from headprune.evaluation.metrics import evaluation_inputs, scored_tail
    from headprune.model.task import lm_row_stats
    from headprune.testing import tiny_decoder

    rows = write_task(tmp_path, "tail_mc", random_questions(12, seed=3)) / "tail_mc.jsonl"
    batches = make_choice_batches(word_tokenizer(), load_data(str(rows)), batch_size=8, max_length=64)
    model = tiny_decoder("llama")
    with torch.no_grad():
        for batch in batches:
            tail = scored_tail(batch)
            assert tail is not None and tail < batch["labels"].shape[1]
            short = model(**evaluation_inputs(model, batch, "cpu")).logits
            full = model(**model_inputs(batch)).logits
            assert short.shape[1] == tail and full.shape[1] == batch["labels"].shape[1]
            torch.testing.assert_close(lm_row_stats(short, batch["labels"]), lm_row_stats(full, batch["labels"]),
                                       rtol=0, atol=1e-6)
    plain = {"labels": torch.tensor([[-100, 5, 6, 7]])}   # LM text: labels from position 1, every logit is used
    assert scored_tail(plain) is None
