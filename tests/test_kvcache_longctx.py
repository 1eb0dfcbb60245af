"""Long context under a KV plan (issue 32, item 4): the passkey task's rows, its exact-retrieval accuracy against a
by-hand greedy loop, long-row perplexity against a by-hand NLL, and W >= L giving exactly the dense numbers."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from conftest import sentences, write_csv

from headprune.cli import main
from headprune.kvcache.longctx import (
    KEY_TOKENS,
    check_lengths,
    filler_stream,
    long_perplexity,
    long_rows,
    measure,
    passkey_hits,
    passkey_rows,
    token_stream,
)
from headprune.kvcache.plan import KVPlan, KVPlanError
from headprune.kvcache.restrict import restricted
from headprune.testing import offline_tokenizer, tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm():
    texts = sentences(60, seed=5, min_words=8, max_words=14)
    tokenizer = offline_tokenizer("byte-level-bpe", texts)
    model = tiny_decoder("llama", vocab_size=len(tokenizer), max_positions=128)
    return model, tokenizer, texts


def test_passkey_rows_are_seeded_and_hold_the_key_twice(lm):
    _, tok, texts = lm
    rows = passkey_rows(tok, texts, 40, 10, seed=3, depths=(0.0, 0.5, 1.0))
    again = passkey_rows(tok, texts, 40, 10, seed=3, depths=(0.0, 0.5, 1.0))
    other = passkey_rows(tok, texts, 40, 10, seed=4, depths=(0.0, 0.5, 1.0))
    assert torch.equal(rows.input_ids, again.input_ids) and not torch.equal(rows.input_ids, other.input_ids)
    assert rows.input_ids.shape == (10, 40) and rows.answer == KEY_TOKENS - 2
    filler = set(filler_stream(tok, texts).tolist())
    n_fill = 40 - 1 - 2 * KEY_TOKENS
    for row, depth, distance in zip(rows.input_ids.tolist(), rows.depth, rows.distance):
        at = 1 + round(depth * n_fill)                       # the first copy's start, by hand
        key = row[-KEY_TOKENS:]
        assert row[0] == tok.bos_token_id and row[at:at + KEY_TOKENS] == key
        assert distance == (40 - KEY_TOKENS) - at           # first copy to second copy
        rest = row[1:at] + row[at + KEY_TOKENS:-KEY_TOKENS]
        assert set(rest) <= filler and len(rest) == n_fill
        # a key of distinct tokens found nowhere else in its row, and no special token
        assert len(set(key)) == KEY_TOKENS and not set(key) & (set(rest) | set(tok.all_special_ids))
    assert rows.depth.tolist() == [0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 0.0]


def greedy(model, prompt: list[int], n: int) -> list[int]:
    """n tokens of greedy decoding, one full forward per token (no cache)."""
    ids = list(prompt)
    for _ in range(n):
        with torch.no_grad():
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_accuracy_is_greedy_decoding_writing_the_key(lm):
    model, tok, texts = lm
    rows = passkey_rows(tok, texts, 30, 6, seed=0)
    a = rows.answer
    # half the rows get the model's own greedy continuation as their answer: retrieved by construction
    for r in range(0, 6, 2):
        rows.input_ids[r, -a:] = torch.tensor(greedy(model, rows.input_ids[r, :-a].tolist(), a))
    by_hand = [greedy(model, row[:-a], a) == row[-a:] for row in rows.input_ids.tolist()]
    hits = passkey_hits(model, rows, batch_size=4)
    assert hits.tolist() == by_hand and by_hand[0] and by_hand[2] and by_hand[4]
    plan = KVPlan(torch.tensor([[1, 0], [0, 0], [0, 1], [1, 0]], dtype=torch.bool), 8, sink=1, window=3)
    with restricted(model, plan) as copy:   # under a plan: the same by-hand loop on the restricted copy
        assert passkey_hits(copy, rows).tolist() == [greedy(copy, row[:-a], a) == row[-a:]
                                                     for row in rows.input_ids.tolist()]


def test_passkey_under_a_mask_is_the_model_with_those_heads_zeroed(lm):
    """A mask gates a private copy: the hits equal those of a copy whose gated heads' O-projection columns are
    zeroed by hand (the head's output removed), and the caller's model answers as before."""
    import copy as copying

    from headprune.model.mask import HeadMask

    model, tok, texts = lm
    rows = passkey_rows(tok, texts, 30, 8, seed=1)
    a = rows.answer
    for r in range(0, 8, 2):   # half the rows answer what the masked model writes, so both outcomes occur
        zeroed = copying.deepcopy(model)
        zeroed.model.layers[1].self_attn.o_proj.weight.data[:, :4 * 8] = 0.0   # heads 0-3 of block 1 (head size 8)
        rows.input_ids[r, -a:] = torch.tensor(greedy(zeroed, rows.input_ids[r, :-a].tolist(), a))
    mask = HeadMask.ones((4, 8))
    mask.values[1, :4] = 0.0
    before = passkey_hits(model, rows)
    hits = passkey_hits(model, rows, mask)
    assert hits.tolist() == [greedy(zeroed, row[:-a], a) == row[-a:] for row in rows.input_ids.tolist()]
    assert hits[::2].all() and not torch.equal(hits, before)
    assert torch.equal(passkey_hits(model, rows), before)

def test_perplexity_per_length_is_exp_of_the_mean_nll_by_hand(lm):
    model, tok, texts = lm
    stream = token_stream(tok, texts)
    assert stream.tolist() == [t for text in texts for t in tok(text)["input_ids"]]
    for length in (8, 24):
        ids = long_rows(stream, length, 200)
        assert ids.shape == (200 // length, length) and torch.equal(ids.flatten(), stream[:ids.numel()])
        nll = []
        for row in ids:
            with torch.no_grad():
                z = model(input_ids=row[None]).logits[0, :-1].double()
            nll += [float(torch.logsumexp(z[i], 0) - z[i, row[i + 1]]) for i in range(length - 1)]
        got = long_perplexity(model, ids, batch_size=3)
        assert got["targets"] == len(nll)
        assert got["perplexity"] == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-5)


def test_window_covering_each_length_gives_exactly_the_dense_numbers(lm):
    model, tok, texts = lm
    none_full = torch.zeros(4, 2, dtype=torch.bool)
    plans = {"dense": None, "wide": KVPlan(none_full, 8, sink=0, window=32),
             "narrow": KVPlan(none_full, 8, sink=1, window=2)}
    for task in ("passkey", "perplexity"):
        table = measure(model, tok, task, [16, 32], plans, texts, rows=12, tokens=320)
        got = {(r["plan"], r["length"]): r for r in table}
        key = "accuracy" if task == "passkey" else "perplexity"
        for length in (16, 32):
            dense, wide = got["dense", length], got["wide", length]
            assert wide == {**dense, "plan": "wide"}        # every number, per length and per depth
        if task == "perplexity":
            assert got["narrow", 32][key] != got["dense", 32][key]


@pytest.mark.parametrize("task, lengths, words", [
    ("passkey", "8", "--lengths: 8 must be an integer in [13, "),
    ("perplexity", "16,x", "comma-separated list of numbers"),
    ("perplexity", "", "--lengths is empty"),
    ("passkey", "16,200", "--lengths 200 exceeds the model's 128 positions"),
    ("needle", "16", "Long-context task 'needle' is not known"),
])
def test_bad_lengths(task, lengths, words):
    with pytest.raises(KVPlanError, match=re.escape(words)):
        check_lengths(task, lengths, 128)


# -- the command -----------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lm_dir(lm, tmp_path_factory):
    model, tok, texts = lm
    out = tmp_path_factory.mktemp("tiny_llama_long")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out), write_csv(out / "rows.csv", ["text"], [[t] for t in texts])


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else err)


def test_evaluate_long_context_per_length(lm, lm_dir, tmp_path, capsys):
    model, tok, texts = lm
    folder, data = lm_dir
    plan = KVPlan(torch.tensor([[1, 0], [0, 0], [0, 0], [0, 1]], dtype=torch.bool), 8, sink=1, window=4)
    plan.write(tmp_path / "plan.json")
    code, out = run(capsys, "evaluate", "--model", folder, "--data", data, "--eval-size", "all", "--long-context",
                    "perplexity", "--lengths", "16,32", "--long-tokens", "256",
                    "--kv-plan", str(tmp_path / "plan.json"))
    assert code == 0, out
    assert out["lengths"] == [16, 32] and out["text_rows"] == len(texts) and out["kv_plan"]["full_kv_heads"] == 2
    # the same numbers as the library on the evaluation rows' text (in the workspace's seeded order), dense and
    # under the plan
    from headprune.workspace import Workspace
    ws = Workspace.build(folder, data, calib_size=0, select_size=0, eval_size=None)
    assert sorted(ws.eval.texts) == sorted(texts)
    rows = long_rows(token_stream(tok, ws.eval.texts), 32, 256)
    assert out["dense"][1]["perplexity"] == pytest.approx(long_perplexity(model, rows)["perplexity"], rel=1e-6)
    with restricted(model, plan) as copy:
        want = long_perplexity(copy, rows)["perplexity"]
    assert out["kv_plan"]["table"][1]["perplexity"] == pytest.approx(want, rel=1e-6)
    code, key = run(capsys, "evaluate", "--model", folder, "--data", data, "--eval-size", "all", "--long-context",
                    "passkey", "--lengths", "20", "--long-rows", "5", "--depths", "0,1")
    assert code == 0, key
    assert key["dense"][0]["rows"] == 5 and set(key["dense"][0]["by_depth"]) == {"0", "1"} and "kv_plan" not in key


@pytest.mark.parametrize("argv, words", [
    (["--long-context", "passkey", "--lengths", "4"], "--lengths: 4 must be an integer in [13, "),
    (["--long-context", "perplexity", "--lengths", "16,500"], "--lengths 500 exceeds the model's 128 positions"),
    (["--long-context", "passkey", "--depths", "0,1.5"], "--depths: 1.5 must lie in [0, 1]"),
    (["--long-context", "passkey", "--long-rows", "0"], "--long-rows 0 must be an integer in [1, "),
    (["--lengths", "16"], "--lengths set without --long-context"),
    (["--long-context", "passkey", "--model", "demo"], "--model demo is an encoder"),
])
def test_bad_long_context_input_is_refused_before_loading(argv, words, lm_dir, capsys, monkeypatch):
    import headprune.cli.kvcache
    import headprune.workspace

    for module in (headprune.workspace, headprune.cli.kvcache):
        monkeypatch.setattr(module, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    model = [] if "--model" in argv else ["--model", lm_dir[0]]
    code, err = run(capsys, "evaluate", *model, "--data", lm_dir[1], *argv)
    assert code == 2 and err.startswith("error: ") and words in err, err


def test_needle_benchmark_table_shows_each_measured_cell(lm, monkeypatch):
    """benchmarks/needle_haystack.py's printed tables: the dense row by depth and every plan x length cell read back
    equal the numbers ``measure`` returned (the docs' tables are pasted from this print)."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    sys.modules.pop("needle_haystack", None)
    import needle_haystack

    model, tok, texts = lm
    plans = {"dense": None, "narrow": KVPlan(torch.zeros(4, 2, dtype=torch.bool), 8, sink=1, window=2)}
    depths = (0.0, 0.5, 1.0)
    table = measure(model, tok, "passkey", [16, 32], plans, texts, rows=6, depths=depths)
    out = {"lengths": [16, 32], "depths": list(depths), "sink": 1, "table": table}
    lines = needle_haystack.markdown(out).splitlines()
    cells = {(r["plan"], r["length"]): r for r in table}
    parsed = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in lines if line}
    for depth in ("0", "0.5", "1"):
        assert parsed[depth] == [f"{cells['dense', n]['by_depth'][depth]:.2f}" for n in (16, 32)]
    assert parsed["all"] == [f"{cells['dense', n]['accuracy']:.2f}" for n in (16, 32)]
    for plan in plans:
        assert parsed[plan] == [f"{cells[plan, n]['accuracy']:.2f} (6)" for n in (16, 32)]
    assert lines[0] == "| depth | L = 16 | L = 32 |" and "| plan (S = 1) | L = 16 | L = 32 |" in lines
