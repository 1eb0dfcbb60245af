"""No silent answers under a KV plan (issue 37 item 4): every case applies the plan or is refused by name.

Logit soft-capping (Gemma 2) and learned sink logits (gpt-oss) are applied; other attention arguments, left
padding, a batch in the mixed cache, rows too short for the outside-window mass, and a budget plan file that
breaks its own total are refused; ``evaluate --lm-eval`` applies the plan through the lm-eval bridge."""

from __future__ import annotations

import json

import pytest
import torch
import transformers as tf
from conftest import save_tiny_lm

from headprune.cli import main
from headprune.kvcache.budgets import budget_plan
from headprune.kvcache.cache import MixedCache, generate
from headprune.kvcache.exports import duo_folder_files
from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.kvcache.restrict import eager_kv_attention, restricted
from headprune.kvcache.scores import RULES, head_scores
from headprune.testing import random_decoder_batch, tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")

STREAM = torch.zeros(4, 2, dtype=torch.bool)   # tiny decoders: 4 blocks x 2 groups, every group streaming
# the attention mass outside sink + window: named duo until DuoAttention's learned gates take that name (far-mass)
FAR_MASS = "far-mass" if "far-mass" in RULES else "duo"


def tiny_eager(arch: str):
    """A tiny Gemma 2 (soft-capping 50 -> tightened to 0.5 so it bites) or gpt-oss (learned sinks), eager."""
    common = dict(vocab_size=120, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                  hidden_size=64, max_position_embeddings=64, pad_token_id=0, sliding_window=4)
    if arch == "gemma2":
        config = tf.Gemma2Config(**common, intermediate_size=128, query_pre_attn_scalar=8,
                                 attn_logit_softcapping=0.5)
    else:
        config = tf.GptOssConfig(**common, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    if arch == "gpt_oss":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.sinks.normal_(0, 2.0)   # learned sinks that matter
    return model


@pytest.mark.parametrize("arch", ["gemma2", "gpt_oss"])
def test_soft_capping_and_learned_sinks_are_applied(arch):
    model = tiny_eager(arch)
    batch = random_decoder_batch(seq_len=12)
    with torch.no_grad():
        dense = model(**batch).logits
        with restricted(model, KVPlan(STREAM, 8, sink=0, window=12)) as copy:
            whole = copy(**batch).logits
        with restricted(model, KVPlan(STREAM, 8, sink=1, window=2)) as copy:
            narrow = copy(**batch).logits
    assert torch.equal(whole, dense)            # a window covering the row changes nothing (was 0.48 off)
    assert not torch.allclose(narrow, dense, atol=1e-4)
    # the mixed cache (eager arithmetic per part) generates what the restricted full cache does
    prompt = torch.randint(3, 100, (1, 20), generator=torch.Generator().manual_seed(2))
    with restricted(model, KVPlan(torch.tensor([[1, 0], [0, 0], [0, 1], [0, 0]]), 8, sink=1, window=3)) as copy:
        assert generate(copy, prompt, 6, mode="mixed").tokens == generate(copy, prompt, 6, mode="restricted").tokens


def test_an_attention_argument_the_restriction_does_not_implement_is_refused_by_name():
    model = tiny_decoder("llama", attn_implementation="eager")
    with restricted(model, KVPlan(STREAM, 8, sink=1, window=2)) as copy:
        attention = copy.model.layers[0].self_attn
        q = torch.zeros(1, 8, 3, 8)
        kv = torch.zeros(1, 2, 3, 8)
        with pytest.raises(KVPlanError, match="passes alibi_slopes, which a KV plan's restricted attention"):
            eager_kv_attention(attention, q, kv, kv, None, 1.0, alibi_slopes=torch.ones(8))


def test_left_padding_is_refused_and_right_padding_attended():
    model = tiny_decoder("llama")
    ids = torch.randint(3, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    right = torch.tensor([[1] * 8, [1] * 5 + [0] * 3])
    left = right.flip(-1)
    with torch.no_grad(), restricted(model, KVPlan(STREAM, 8, sink=1, window=3)) as copy:
        copy(input_ids=ids * right, attention_mask=right)
        with pytest.raises(KVPlanError, match="left padding"):
            copy(input_ids=ids * left, attention_mask=left)
        with pytest.raises(KVPlanError, match="one row at a time; got a batch of 2"):
            copy(input_ids=ids, past_key_values=MixedCache(copy), use_cache=True)
        one = generate(copy, ids[:1], 3, mode="mixed")   # one row: the mixed cache
    assert len(one.tokens) == 3


def test_outside_window_mass_on_rows_too_short_is_refused():
    model = tiny_decoder("llama")
    batch = random_decoder_batch(seq_len=6)
    with pytest.raises(KVPlanError, match="rows longer than S \\+ W = 12 tokens; the longest calibration row has 6"):
        head_scores(FAR_MASS, model, calib=[batch], sink=4, window=8)
    assert head_scores(FAR_MASS, model, calib=[batch], sink=1, window=2).shape == (4, 8)


def run(capsys, *argv) -> tuple[int, dict | str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("tiny_llama"))


def test_kvplan_budget_evaluate_and_generate(lm_dir, tmp_path, capsys):
    model, data = lm_dir
    out = tmp_path / "budget.json"
    code, made = run(capsys, "kvplan", "--model", model, "--data", data, "--rule", "random", "--budget", "96",
                     "--sink", "1", "--beta", "2", "--out", str(out))
    assert code == 0, made
    plan = KVPlan.read(out)
    assert plan.is_budget and plan.budget == 96 and plan.budget_tokens() == 96
    # the allocation is HeadKV's on the file's own group scores (an independent call on what the file records)
    again = budget_plan(torch.tensor(plan.meta["group_scores"]), 8, 96, 1, 2.0)
    assert torch.equal(again.windows, plan.windows)
    code, gen = run(capsys, "generate", "--model", model, "--prompt", "the film was good and the story was long",
                    "--max-new-tokens", "4", "--kv-plan", str(out))
    assert code == 0, gen
    assert gen["kv_plan"]["measured_byte_ratio"] == pytest.approx(gen["kv_plan"]["ideal_byte_ratio"])
    assert gen["kv_plan"]["budget_tokens"] == 96
    with pytest.raises(KVPlanError, match="one window for every streaming head"):
        duo_folder_files(plan)
    code, ev = run(capsys, "evaluate", "--model", model, "--data", data, "--eval-size", "6", "--kv-plan", str(out))
    assert code == 0 and ev["kv_plan_window"] == plan.window and ev["kv_plan_budget_tokens"] == 96


@pytest.mark.parametrize("argv, words", [
    (["kvplan", "--budget", "-5"], "--budget -5 must be a whole number of tokens >= 0"),
    (["kvplan", "--budget", "16"], "each needs at least S + 1 = 5"),
    (["kvplan", "--budget", "400", "--full-share", "0.5"], "--full-share cannot apply to a budget plan"),
    (["kvplan", "--budget", "400", "--trajectory"], "--trajectory cannot apply to a budget plan"),
    (["kvplan", "--beta", "2"], "--beta shape a budget plan's allocation: add --budget"),
    (["evaluate", "--kv-plan", "over.json"], "sum to 10 tokens, more than its total budget 9"),
    (["evaluate", "--kv-plan", "negative.json"], "budget -1 must be a whole number of tokens >= 0"),
    (["evaluate", "--kv-plan", "v99.json"], "version 99 is not one this headprune reads"),
    (["evaluate", "--kv-plan", "over.json", "--lm-eval", "x"], "sum to 10 tokens, more than its total budget 9"),
])
def test_bad_budget_input_is_refused_before_loading(argv, words, tmp_path, capsys, monkeypatch, lm_dir):
    import headprune.cli.core
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache, headprune.cli.core):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    budgets = {"format": "headprune-kv-plan", "version": 2, "kind": "budgets", "shape": [4, 2], "n_heads": 8,
               "sink": 1, "budget": 9, "budgets": [[2, None]] * 4 + []}
    (tmp_path / "over.json").write_text(json.dumps({**budgets, "budgets": [[2, 4], [2, None], [1 + 1, None],
                                                                          [None, None]]}))
    (tmp_path / "negative.json").write_text(json.dumps({**budgets, "budgets": [[-1, 2]] + [[2, None]] * 3}))
    (tmp_path / "v99.json").write_text(json.dumps({**KVPlan(STREAM, 8).to_json(), "version": 99}))
    argv = [str(tmp_path / a) if a.endswith(".json") else a for a in argv] + ["--model", lm_dir[0]]
    if argv[0] == "kvplan":
        argv += ["--out", str(tmp_path / "p.json")]
    elif "--lm-eval" not in argv:
        argv += ["--data", lm_dir[1]]
    code, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and words in err, err


def test_lm_eval_scores_under_the_kv_plan(tmp_path, capsys):
    """``evaluate --lm-eval TASK --kv-plan`` scores the restricted model: the CLI's numbers are lm-eval's on the
    restricted copy (the API), which moves the log-likelihoods; ``--lm-eval-apply cut`` with a mask is refused."""
    pytest.importorskip("lm_eval")
    from harness_support import model_folder, word_tokenizer, write_task

    from headprune.evaluation.harness import HarnessSpec, resolve_tasks, run_lm_eval

    folder, task_dir = model_folder(tmp_path / "model"), write_task(tmp_path / "tasks")
    plan_file = tmp_path / "plan.json"
    plan = KVPlan(STREAM, 8, sink=0, window=1)
    plan.write(plan_file)
    tasks = resolve_tasks(HarnessSpec(tasks=("tiny_mc",), include=(str(task_dir),), batch_size=8,
                                      loglikelihoods=True))
    model = tiny_decoder("llama")
    dense = run_lm_eval(model, word_tokenizer(), tasks)
    with restricted(model, plan) as copy:
        under = run_lm_eval(copy, word_tokenizer(), tasks)
    assert under["loglikelihoods"] != dense["loglikelihoods"]
    assert under["results"]["tiny_mc"]["acc_norm,none"] != dense["results"]["tiny_mc"]["acc_norm,none"]
    argv = ["evaluate", "--model", str(folder), "--lm-eval", "tiny_mc", "--lm-eval-include", str(task_dir),
            "--batch-size", "8", "--device", "cpu"]
    code, out = run(capsys, *argv, "--kv-plan", str(plan_file))
    assert code == 0, out
    assert out["kv_plan"] == str(plan_file) and out["lm_eval"]["results"] == under["results"]
    mask = tmp_path / "mask.json"
    mask.write_text("{}")
    code, err = run(capsys, *argv, "--kv-plan", str(plan_file), "--mask", str(mask), "--lm-eval-apply", "cut")
    assert code == 2 and "--kv-plan with --lm-eval-apply cut" in err
