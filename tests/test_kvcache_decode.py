"""A decode step of a bounded number of operations per layer, and compiled decoding (issue 49 items 1-2).

The operators of one decode step are counted with torch.profiler on the CPU (the top-level aten calls: what a GPU
would launch as kernels, less the ones fused inside them) for the stock DynamicCache and the mixed cache under full,
streaming, budget and compensation plans; the count per layer stays within a stated bound of the stock cache's and
does not depend on how many heads or windows a layer has, nor on how many tokens the cache holds. No step reads a
tensor's value on the host (``aten::_local_scalar_dense`` / ``aten::item``, what ``.item()``, ``int()`` and
``bool()`` of a tensor call). A
compiled decode step (inductor, the CPU's default mode) gives the tokens of the uncompiled one.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import test_kvcache_cli
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import DynamicCache

from headprune.kvcache.budgets import budget_plan
from headprune.kvcache.cache import MixedCache, compile_problem, generate
from headprune.kvcache.plan import KVPlan
from headprune.kvcache.restrict import restricted
from headprune.testing import tiny_decoder

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS, KV = 4, 4
lm_dir, run = test_kvcache_cli.lm_dir, test_kvcache_cli.run   # the saved tiny Llama (a fixture) and the CLI runner
# the bounds this test holds (per layer, beyond the stock DynamicCache's operators in one decode step): the mixed
# cache splits each layer into a full and a streaming call, writes by index and masks each head by position
EXTRA_PER_LAYER = 40
EXTRA_PER_LAYER_COMPENSATION = 80   # RazorAttention's entry: the dropped sums and their means, each step


HOST_READS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero", "aten::nonzero")


def ops_of_a_decode_step(model, cache, prompt: int = 30, steps: int = 1) -> tuple[Counter, int]:
    """(the top-level aten operators of the decode step after ``prompt`` tokens and ``steps - 1`` decode steps,
    how many times it read a tensor's value on the host)."""
    ids = torch.randint(3, 100, (1, prompt), generator=torch.Generator().manual_seed(1))
    token = torch.tensor([[5]])
    with torch.no_grad():
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        for _ in range(steps - 1):
            model(input_ids=token, past_key_values=cache, use_cache=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            model(input_ids=token, past_key_values=cache, use_cache=True)
    top = [e.name for e in prof.events() if e.name.startswith("aten::")
           and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))]
    # a read of a tensor's value on the host, at any depth (what .item(), int(), bool() and nonzero() end in)
    reads = [e.name for e in prof.events() if e.name in HOST_READS]
    return Counter(top), len(reads)


def plans() -> dict:
    """Full, streaming, budget and compensation plans on a 4-layer x 4-group grid; two pairs of the same
    full / streaming pattern, one at a single window, one at a different window for every streaming group."""
    grid = torch.tensor([[1, 0, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    windows = torch.tensor([[1, 3, 6, 9], [2, 4, 7, 11], [5, 1, 1, 8], [1, 2, 13, 1]])
    return {"full": KVPlan.all_full((LAYERS, KV), 8, 2, 5),
            "streaming": KVPlan(grid, 8, 2, 5),
            "budget": KVPlan(grid, 8, 2, 1, windows=windows),
            "budget, every group streaming": budget_plan(torch.arange(16.0).view(4, 4), 8, 16 * 9, sink=2,
                                                         beta=4.0),
            "compensation": KVPlan(grid, 8, 2, 5, compensation=True),
            "budget with compensation": KVPlan(grid, 8, 2, 1, windows=windows, compensation=True)}


@pytest.fixture(scope="module")
def model():
    return tiny_decoder("llama", n_kv_heads=KV)


def test_a_decode_step_has_a_bounded_number_of_operators_per_layer(model):
    stock, stock_reads = ops_of_a_decode_step(model, DynamicCache(config=model.config))
    assert stock_reads == 0
    counts = {}
    for name, plan in plans().items():
        with restricted(model, plan) as copy:
            counted, reads = ops_of_a_decode_step(copy, MixedCache(copy))
            # the same list of operators after more tokens (no growth, no shape-dependent branch)
            assert ops_of_a_decode_step(copy, MixedCache(copy), prompt=45, steps=9) == (counted, 0), name
            static, static_reads = ops_of_a_decode_step(copy, MixedCache(copy, 64))   # the compiled path's cache
        counts[name] = counted.total()
        bound = EXTRA_PER_LAYER_COMPENSATION if plan.compensation else EXTRA_PER_LAYER
        for kind, step, read in (("growing", counted, reads), ("static", static, static_reads)):
            assert read == 0, (name, kind)      # no value read on the host inside the step
            assert (step.total() - stock.total()) / LAYERS <= bound, (name, kind, step.total(), stock.total())
    # the same full / streaming pattern at one window or at a different window for every group: the same count
    # (the cache before issue 49 looped over one ring per window: 178 operators a layer beyond the stock step for
    # "budget" against 83 for "streaming", and 12-207 host reads a step)
    assert counts["budget"] == counts["streaming"]
    assert counts["budget with compensation"] == counts["compensation"]


def test_the_count_does_not_grow_with_the_number_of_heads():
    """Eight groups of eight different windows per layer: as many operators as two groups of one window."""
    few, many = tiny_decoder("llama", n_kv_heads=2), tiny_decoder("llama", n_heads=16, n_kv_heads=8)
    one = KVPlan(torch.tensor([[1, 0]] * LAYERS, dtype=torch.bool), 8, 2, 5)
    windows = torch.arange(1, 9).repeat(LAYERS, 1)
    spread = KVPlan(torch.tensor([[1] + [0] * 7] * LAYERS, dtype=torch.bool), 16, 2, 1, windows=windows)
    with restricted(few, one) as a, restricted(many, spread) as b:
        assert ops_of_a_decode_step(a, MixedCache(a)) == ops_of_a_decode_step(b, MixedCache(b))


def test_a_compiled_decode_step_gives_the_tokens_of_the_uncompiled_one():
    """Inductor (the CPU's default mode) compiles the decode step over the static mixed cache of a plan with a full
    group, per-group windows and the compensation token (every path of the step); greedy and seeded sampling give
    the tokens of the uncompiled static cache, of the growing one and of the restricted full cache."""
    if compile_problem("cpu"):
        pytest.skip(compile_problem("cpu"))
    model = tiny_decoder("llama", n_layers=2)
    plan = KVPlan(torch.tensor([[1, 0], [0, 0]], dtype=torch.bool), 8, 2, 1, windows=torch.tensor([[1, 3], [4, 6]]),
                  compensation=True)
    prompt = torch.randint(3, 100, (1, 20), generator=torch.Generator().manual_seed(5))
    torch.compiler.reset()
    with restricted(model, plan) as copy:
        for options in ({}, {"sample": True, "seed": 4, "temperature": 0.8}):
            compiled = generate(copy, prompt, 12, mode="mixed", compile=True, **options)
            static = generate(copy, prompt, 12, mode="mixed", cache=MixedCache(copy, 32), **options)
            growing = generate(copy, prompt, 12, mode="mixed", **options)
            reference = generate(copy, prompt, 12, mode="restricted", **options)
            assert compiled.tokens == static.tokens == growing.tokens == reference.tokens, options
            assert compiled.compiled and compiled.warmup_s > 0 and not static.compiled
    assert generate(model, prompt, 12).tokens != reference.tokens    # the plan matters on this prompt


@pytest.mark.parametrize("case, words", [
    ("grid", "This KV plan is for 3 blocks x 2 key/value heads (8 query heads); the model has 4 x 2"),
    ("window", "The KV plan's window W = 500 is longer than --model"),
    ("class", "--compile: transformers does not mark GPTNeoForCausalLM as compilable"),
    ("compiler", "--compile: torch.compile on the CPU builds C++ kernels and no C++ compiler"),
    ("device map", "--compile captures one decode step on one device; --device-map spreads"),
])
def test_bad_compile_input_is_refused_before_loading(case, words, lm_dir, tmp_path, capsys, monkeypatch):
    import headprune.cli.kvcache
    import headprune.kvcache.cache

    monkeypatch.setattr(headprune.cli.kvcache, "load_model", lambda *a, **k: pytest.fail("a model was loaded"))
    model = lm_dir[0]
    plan = KVPlan(torch.zeros(3 if case == "grid" else 4, 2, dtype=torch.bool), 8, 1, 500 if case == "window" else 4)
    plan.write(tmp_path / "plan.json")
    argv = ["generate", "--model", model, "--prompt", "the film", "--kv-plan", str(tmp_path / "plan.json"),
            "--compile", "--device", "cpu"]
    if case == "class":
        folder = tmp_path / "neo"
        folder.mkdir()
        config = json.loads((tmp_path.parent / "tiny_llama0" / "config.json").read_text()) \
            if (tmp_path.parent / "tiny_llama0").exists() else json.loads(open(f"{model}/config.json").read())
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GPTNeoForCausalLM"]}))
        argv[2] = str(folder)
        argv = argv[:5] + argv[7:]   # no plan: the class alone is refused
    if case == "compiler":
        monkeypatch.setattr(headprune.kvcache.cache.shutil, "which", lambda name: None)
        monkeypatch.delenv("CXX", raising=False)
    if case == "device map":
        argv += ["--device-map", "auto"]
    code, err = run(capsys, *argv)
    assert code == 2 and err.startswith("error: ") and words in err, err
