"""lm-evaluation-harness through headprune (headprune/evaluation/harness.py, ``evaluate --lm-eval``).

Checked against independent runs: stock lm-eval (``HFLM(pretrained=folder)`` in a subprocess that never imports
headprune) on the ``masked`` export, the cut model, and a tokenizer that appends an end token to every encode.
Tasks are local JSONL files written here (offline); the model is a tiny random Llama with a word-level tokenizer.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

pytest.importorskip("lm_eval")

from harness_support import QUESTIONS, word_tokenizer, write_task  # noqa: E402

from headprune.cli import main  # noqa: E402
from headprune.data import load_data, make_choice_batches  # noqa: E402
from headprune.demos.lm import write_cloze_jsonl  # noqa: E402
from headprune.evaluation.harness import (  # noqa: E402
    SHIPPED_TASKS,
    HarnessError,
    HarnessSpec,
    harness_metric,
    resolve_tasks,
    run_lm_eval,
)
from headprune.evaluation.metrics import evaluate, lm_stats  # noqa: E402
from headprune.model.export import export_model  # noqa: E402
from headprune.model.hooks import attached_names  # noqa: E402
from headprune.model.mask import HeadMask  # noqa: E402
from headprune.testing import tiny_decoder  # noqa: E402


def heavy_mask() -> HeadMask:
    """Most heads of the tiny Llama (4 layers x 8 heads) pruned: enough to move its answers."""
    return HeadMask.from_pruned({layer: list(range(1, 8)) for layer in range(4)}, (4, 8))


def scores(result: dict, task: str = "tiny_mc") -> tuple[float, float]:
    row = result["results"][task]
    return row["acc,none"], row["acc_norm,none"]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    return write_task(tmp_path_factory.mktemp("tasks"))


@pytest.fixture(scope="module")
def tasks(task_dir):
    return resolve_tasks(HarnessSpec(tasks=("tiny_mc",), include=(str(task_dir),), batch_size=8, loglikelihoods=True))


STOCK = """
import json, sys
from lm_eval import simple_evaluate
from lm_eval.models.huggingface import HFLM
from lm_eval.tasks import TaskManager
folder, include = sys.argv[1], sys.argv[2]
lm = HFLM(pretrained=folder, device="cpu", batch_size=8)
out = simple_evaluate(lm, tasks=["tiny_mc"], task_manager=TaskManager(include_path=include, include_defaults=False),
                      bootstrap_iters=1000, log_samples=True)
lls = [[r[0] for r in s["filtered_resps"]] for s in sorted(out["samples"]["tiny_mc"], key=lambda s: s["doc_id"])]
print(json.dumps({"results": out["results"], "loglikelihoods": lls,
                  "modules": sorted(m for m in sys.modules if m.startswith("headprune"))}))
"""


def test_stock_lm_eval_on_the_masked_export_equals_lm_eval_through_headprune(tmp_path, task_dir, tasks):
    """The masked stock export, run by lm-eval alone in a process without headprune, scores what headprune's gated
    model and its cut copy score; the mask changes the scores (so the equality is not that of two dense runs)."""
    model, tokenizer, mask = tiny_decoder("llama"), word_tokenizer(), heavy_mask()
    written = export_model(model, tokenizer, mask, tmp_path / "masked", "masked")
    run = subprocess.run([sys.executable, "-c", STOCK, str(written["out"]), str(task_dir)], capture_output=True,
                         text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    stock = json.loads(run.stdout.strip().splitlines()[-1])
    assert stock["modules"] == []
    gated = run_lm_eval(model, tokenizer, tasks, mask)
    cut = run_lm_eval(model, tokenizer, resolve_tasks(HarnessSpec(
        tasks=("tiny_mc",), include=(str(task_dir),), batch_size=8, apply="cut", loglikelihoods=True)), mask)
    dense = run_lm_eval(model, tokenizer, tasks)
    assert scores(stock) == scores(gated) == scores(cut)
    ll = {name: torch.tensor(r["loglikelihoods"]["tiny_mc"] if name != "stock" else r["loglikelihoods"])
          for name, r in (("stock", stock), ("gated", gated), ("cut", cut), ("dense", dense))}
    assert ll["gated"].shape == (len(QUESTIONS), 4)
    torch.testing.assert_close(ll["gated"], ll["stock"], rtol=0, atol=1e-5)
    torch.testing.assert_close(ll["cut"], ll["stock"], rtol=0, atol=1e-5)
    assert (ll["dense"] - ll["gated"]).abs().max() > 1e-3   # the mask matters: not two dense runs
    assert gated["apply"] == "gate" and cut["apply"] == "cut" and gated["pruned_heads"] == 28


@pytest.mark.parametrize("end_token", [False, True], ids=["start-token", "start-and-end-token"])
@pytest.mark.parametrize("mask", [None, heavy_mask()], ids=["dense", "masked"])
def test_headprunes_own_multiple_choice_equals_lm_eval_on_the_same_task(task_dir, tasks, mask, end_token):
    """headprune's acc and acc_norm (data.choice batches, evaluation.metrics) on the task's JSONL equal lm-eval's
    on its YAML, and so does every choice's log-likelihood, dense and under a mask, for a tokenizer that adds a
    start token only and for one that also appends an end token (the LM demo's kind)."""
    model, tokenizer = tiny_decoder("llama"), word_tokenizer(end_token)
    harness = run_lm_eval(model, tokenizer, tasks, mask)
    ds = load_data(str(task_dir / "tiny_mc.jsonl"))
    assert ds.task == "multiple_choice"
    batches = make_choice_batches(tokenizer, ds, batch_size=8, max_length=64)
    own = evaluate(model, batches, mask)
    assert (own.acc, own.acc_norm) == scores(harness)
    ll = -lm_stats(model, batches, mask)[:, 0].double().view(len(QUESTIONS), 4)
    theirs = torch.tensor(harness["loglikelihoods"]["tiny_mc"], dtype=torch.float64)
    torch.testing.assert_close(ll, theirs, rtol=0, atol=1e-4)
    assert own.acc_stderr == pytest.approx(harness["results"]["tiny_mc"]["acc_stderr,none"])


def test_an_end_token_appended_by_the_tokenizer_changes_nothing(tasks):
    """The LM demo's tokenizer reads a row as <s> text </s>: stock lm-eval then splits after the context's </s>,
    dropping the choice's first token. Through headprune the one split rule gives what a start-token-only
    tokenizer gives."""
    model = tiny_decoder("llama")
    plain = run_lm_eval(model, word_tokenizer(), tasks, heavy_mask())
    ending = run_lm_eval(model, word_tokenizer(end_token=True), tasks, heavy_mask())
    assert plain["results"] == ending["results"]

    from lm_eval.models.huggingface import HFLM  # the stock split, to show what the rule avoids
    stock = HFLM(pretrained=model, tokenizer=word_tokenizer(end_token=True), batch_size=1, add_bos_token=True)
    context, continuation = stock._encode_pair("the film was", " good")
    assert continuation[-1] == 2 and len(continuation) == 1   # "good" lost, "</s>" scored


def test_the_callers_model_is_never_hooked_or_changed(tasks):
    model, tokenizer = tiny_decoder("llama"), word_tokenizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_lm_eval(model, tokenizer, tasks, heavy_mask(), progress=lambda f, m: None)
    assert all((before[k] == v).all() for k, v in model.state_dict().items())
    assert not any(attached_names(m) for m in model.modules())
    assert all(not m._forward_pre_hooks for m in model.modules())


def test_the_output_carries_lm_evals_results_and_versions(tasks):
    seen = []
    result = run_lm_eval(tiny_decoder("llama"), word_tokenizer(), tasks, progress=lambda f, m: seen.append(f))
    json.dumps(result, allow_nan=True)   # everything JSON can hold
    assert result["versions"] == {"tiny_mc": 2.0}
    assert result["n-samples"]["tiny_mc"] == {"original": len(QUESTIONS), "effective": len(QUESTIONS)}
    assert result["lm_eval_version"] == "0.4.13" and result["configs"]["tiny_mc"]["output_type"] == "multiple_choice"
    acc = result["results"]["tiny_mc"]["acc,none"]
    assert acc * len(QUESTIONS) == pytest.approx(round(acc * len(QUESTIONS)))
    assert seen[-1] == 1.0 and 0 < seen[0] < 1


def test_harness_metric_reads_one_number(tasks):
    model, tokenizer = tiny_decoder("llama"), word_tokenizer()
    full = run_lm_eval(model, tokenizer, tasks, heavy_mask())
    value = harness_metric(model, tokenizer, heavy_mask(), "lm-eval:tiny_mc/acc_norm", tasks=tasks)
    assert value == full["results"]["tiny_mc"]["acc_norm,none"]
    with pytest.raises(HarnessError, match="lm-eval:TASK/METRIC"):
        harness_metric(model, tokenizer, None, "lm-eval:tiny_mc", tasks=tasks)
    with pytest.raises(HarnessError, match="reported no 'f1'.*acc, acc_norm"):
        harness_metric(model, tokenizer, None, "lm-eval:tiny_mc/f1", tasks=tasks)


@pytest.mark.parametrize("kw, message", [
    ({"tasks": (" ", "")}, "at least one task"),
    ({"tasks": ("x",), "limit": 0}, r"--lm-eval-limit 0: must be an integer in \[1, 10,000,000\]"),
    ({"tasks": ("x",), "num_fewshot": -1}, "--num-fewshot -1"),
    ({"tasks": ("x",), "apply": "zero"}, "gate, cut"),
    ({"tasks": ("x",), "include": ("/no/such/folder",)}, "not a folder"),
])
def test_bad_settings_are_refused(kw, message):
    with pytest.raises(HarnessError, match=message):
        HarnessSpec(**kw)


def test_a_local_task_whose_rows_are_missing_names_the_task_and_the_offline_way(tmp_path):
    folder = write_task(tmp_path / "t", "gone_rows")
    (folder / "gone_rows.jsonl").unlink()
    with pytest.raises(HarnessError, match="'gone_rows' could not load its data.*dataset_path: json"):
        resolve_tasks(HarnessSpec(tasks=("gone_rows",), include=(str(folder),)))


def test_cli_refuses_an_unknown_task_before_any_model_loads(tmp_path, monkeypatch, capsys):
    import headprune.cli.core as core

    def no_loading(*a, **k):
        raise AssertionError("the model was loaded before the task was checked")

    monkeypatch.setattr(core, "load_model", no_loading)
    code = main(["evaluate", "--model", "demo-lm", "--lm-eval", "tiny_mc,no_such_task_zz", "--lm-eval-include",
                 str(write_task(tmp_path / "t"))])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: lm-eval has no task 'no_such_task_zz'")
    assert "--lm-eval-include" in err and "tiny_mc" not in err.split("(near names")[0].split("no task")[1]


def test_lm_eval_options_without_lm_eval_are_refused(capsys):
    assert main(["evaluate", "--model", "demo-lm", "--lm-eval-limit", "3"]) == 2
    assert "--lm-eval-limit set without --lm-eval" in capsys.readouterr().err


def test_the_shipped_cloze_rows_are_what_the_demos_writer_writes(tmp_path):
    """The shipped task's rows are the first 500 questions of demo-lm-cloze (regenerate them with
    ``write_cloze_jsonl(path, n=500)`` when the cloze recipe changes)."""
    shipped = SHIPPED_TASKS / "demo_lm_cloze" / "demo_lm_cloze.jsonl"
    assert shipped.read_bytes() == write_cloze_jsonl(tmp_path / "rows.jsonl", n=500).read_bytes()


def test_shipped_task_is_found_without_include():
    tasks = resolve_tasks(HarnessSpec(tasks=("demo_lm_cloze",)), check_data=True)
    assert str(SHIPPED_TASKS) in tasks.spec.include_paths()
    assert "demo_lm_cloze" in tasks.manager.all_tasks


def cloze_task(folder, n: int):
    """The LM demo's cloze set as a plain local task (dataset_path: json, absolute data_files), not the shipped one."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = write_cloze_jsonl(folder / "cloze_local.jsonl", n=n)
    yaml = (SHIPPED_TASKS / "demo_lm_cloze" / "demo_lm_cloze.yaml").read_text(encoding="utf-8")
    local = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {rows}"
    yaml = yaml.replace("task: demo_lm_cloze", "task: cloze_local").replace(
        "custom_dataset: !function cloze_rows.load", local)
    (folder / "cloze_local.yaml").write_text(yaml, encoding="utf-8")
    return folder


def test_cli_runs_the_cloze_task_offline_on_the_lm_demo(tmp_path, monkeypatch, capsys):
    """`evaluate --model demo-lm --lm-eval TASK --lm-eval-include DIR` with the hub unreachable: a local task and the
    shipped one (found without --lm-eval-include) score the same first questions alike, and --mask is applied."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    mask_file = tmp_path / "mask.json"
    mask_file.write_text(json.dumps({"pruned": {"0": [0, 1, 2, 3], "3": [5]}}))
    runs = {}
    for name, extra in (("cloze_local", ["--lm-eval-include", str(cloze_task(tmp_path / "t", 5))]),
                        ("demo_lm_cloze", [])):
        for masked in (False, True):
            argv = ["evaluate", "--model", "demo-lm", "--lm-eval", name, "--lm-eval-limit", "5", "--device", "cpu",
                    *extra, *(["--mask", str(mask_file)] if masked else [])]
            assert main(argv) == 0, capsys.readouterr().err[-2000:]
            out = json.loads(capsys.readouterr().out)
            runs[name, masked] = out["lm_eval"]
            assert out["lm_eval"]["n-samples"][name]["effective"] == 5
            assert out["lm_eval"]["pruned_heads"] == (5 if masked else 0)
            assert out["software"]["lm_eval"] == "0.4.13"
    for masked in (False, True):
        assert scores(runs["cloze_local", masked], "cloze_local") == scores(runs["demo_lm_cloze", masked],
                                                                          "demo_lm_cloze")
