"""Every cell of the manual's support table (docs/reference/support.md), executed on each family's tiny random model.

tests/support_table.py computes the page from the family registry and what the code declares; here each claim
runs: gated = cut exactly (float32, uneven masks, whole key/value groups where attention is grouped, a block with no
head left, a padded batch: left-padded for decoders, as batched generation pads), every criterion scores (the
refused ones fail with their reason), every export format is written and loaded back (stock formats by plain
transformers), decoders take a KV plan or are refused by name, before any weight loads too. A family added to the
registry without a tiny model, or a page that no longer matches, fails here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from support_table import PAGE, VOCAB, facts, render, tiny
from transformers import AutoConfig

from headprune.criteria import ScoringContext, get
from headprune.errors import CriterionError, UnsupportedArchitecture
from headprune.model.arch import FAMILIES, adapt, supported
from headprune.model.export import FORMATS, ExportError, export_model, format_problem, nearest_uniform
from headprune.model.gating import gate_heads
from headprune.model.loading import auto_class, declared_refusal, load_model
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.model.task import lm_labels
from headprune.testing import TINY_FAMILIES, left_padded, offline_tokenizer

NAMES = [f.name for f in FAMILIES]
TEXTS = ["the cat sat on the mat while dogs ran far away", "Dolphins were washed up on beaches in Africa.",
         "I laughed, didn't I?", "More than fifty beaked whales died last spring."]
# cheap settings of the criteria that sweep (HIES's alpha, SAP's k), so one family scores everything in ~2 s
LIGHT = {"hies": {"alpha": 0.5}, "sap": {"k": 2}, "sap-cf": {"k": 2}}

pytestmark = pytest.mark.usefixtures("one_thread")


@functools.cache
def tokenizer():
    tok = offline_tokenizer("byte-level-bpe", TEXTS * 3)
    assert len(tok) <= VOCAB
    return tok


def batch(name: str, left: bool = True, labels: bool = False) -> dict:
    """The four texts padded (decoders on the left unless ``left`` is False), with labels when asked."""
    adapter = adapt(tiny(name))
    enc = tokenizer()(TEXTS, padding=True, return_tensors="pt")
    out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    if adapter.causal and left:
        out = left_padded(out, pad_id=int(tokenizer().pad_token_id))
    if labels:
        out["labels"] = lm_labels(out["input_ids"], out["attention_mask"]) if adapter.causal \
            else torch.tensor([0, 1, 2, 0])
    return out


def logits(model, inputs: dict, mask=None) -> torch.Tensor:
    """Logits of the real positions (a decoder's padded positions are never read)."""
    inputs = {k: v for k, v in inputs.items() if k != "labels"}
    with torch.no_grad(), gate_heads(model, mask):
        out = model(**inputs).logits
    return out[inputs["attention_mask"].bool()] if out.ndim == 3 else out


def masks(name: str) -> dict[str, HeadMask]:
    """An uneven random mask with block 0 emptied; where attention is grouped, whole groups and an uneven group."""
    adapter = adapt(tiny(name))
    shape = adapter.grid_shape
    values = (torch.rand(shape, generator=torch.Generator().manual_seed(7)) > 0.5).float()
    values[-1, 0] = 1.0
    if shape[0] > 1:
        values[0] = 0.0
    cases = {"uneven": HeadMask(values)}
    if adapter.grouped:
        group = adapter.blocks[0].group_size
        cases["whole groups"] = HeadMask.from_pruned({0: list(range(group)), shape[0] - 1: [shape[1] - 1]}, shape)
        cases["uneven groups"] = HeadMask.from_pruned({shape[0] - 1: [0, group, group + 1]}, shape)
    return cases


def close(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference, relative to the logits' scale where it is over 1."""
    return float((a - b).abs().max() / max(1.0, float(a.abs().max())))


def moved(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference relative to the logits' scale (tiny BERT-family models have logits ~0.01)."""
    return float((a - b).abs().max() / a.abs().max())


def test_every_family_has_a_tiny_model_that_it_detects():
    assert set(TINY_FAMILIES) == set(NAMES), "a family of the registry needs its line in testing.TINY_FAMILIES"
    assert [adapt(tiny(n)).family for n in NAMES] == NAMES


def test_the_support_page_is_current():
    assert PAGE.read_text(encoding="utf-8") == render(), \
        "docs/reference/support.md is stale: run PYTHONPATH=. python3 tests/support_table.py"


def test_an_unknown_model_is_refused_with_every_family_named():
    from transformers import T5Config, T5ForConditionalGeneration

    model = T5ForConditionalGeneration(T5Config(vocab_size=50, d_model=16, d_kv=4, d_ff=32, num_layers=1,
                                                num_heads=4))
    with pytest.raises(UnsupportedArchitecture) as info:
        adapt(model)
    assert "model type 't5'" in str(info.value) and supported() in str(info.value)
    assert all(f"{n} (" in str(info.value) for n in NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_gated_equals_cut(name):
    model = tiny(name)
    inputs = batch(name)
    for case, mask in masks(name).items():
        cut = prune_model(model, mask)
        assert adapt(cut).live_grid().equal(mask.keep_bool()), case
        assert close(logits(model, inputs, mask), logits(cut, inputs)) <= 1e-5, case
        assert moved(logits(model, inputs, mask), logits(model, inputs)) > 1e-3, case   # the heads mattered


@pytest.mark.parametrize("name", NAMES)
def test_every_criterion_scores_or_is_refused_by_name(name):
    model, row = tiny(name), facts(name)
    calib = [batch(name, left=False, labels=True)]
    live = adapt(model).live_grid().numpy()
    for criterion in row["criteria"]:
        params = dict(LIGHT.get(criterion, {}))
        if criterion == "kwon" and adapt(model).layer_modules is None:
            params["tune"] = False
        scores = get(criterion)(ScoringContext(model, calib, tokenizer=tokenizer(), texts=TEXTS), params).scores
        assert scores.shape == live.shape and np.isfinite(scores[live]).all(), criterion
    for criterion, why in row["refused_criteria"].items():
        with pytest.raises(CriterionError, match="cannot run") as info:
            get(criterion)(ScoringContext(model, calib, tokenizer=tokenizer(), texts=TEXTS), None)
        assert why in str(info.value)


@pytest.mark.parametrize("name", NAMES)
def test_every_export_format_is_written_and_loads_back(name, tmp_path):
    """headprune: back through load_model; masked and uniform: plain transformers (the family's Auto class);
    a format that refuses the family says so; any other format must at least write."""
    model = tiny(name)
    mask = masks(name)["uneven"]
    inputs = batch(name)
    for fmt in FORMATS:
        out = tmp_path / fmt
        problem = format_problem(fmt, model)
        if problem is not None:
            with pytest.raises(ExportError):
                export_model(model, tokenizer(), mask, out, fmt)
            continue
        used = nearest_uniform(model, mask).mask if fmt == "uniform" else mask
        export_model(model, tokenizer(), used, out, fmt)
        if fmt == "headprune":
            reloaded = load_model(str(out), "cpu", attn_implementation=model.config._attn_implementation).model
        elif fmt in ("masked", "uniform"):
            reloaded = auto_class(AutoConfig.from_pretrained(out)).from_pretrained(
                out, attn_implementation=model.config._attn_implementation).eval()
            assert not any(k.startswith("headprune") for k in reloaded.config.to_dict()), fmt
        else:
            continue
        assert close(logits(model, inputs, used), logits(reloaded, inputs)) <= 1e-5, fmt


@pytest.mark.parametrize("name", NAMES)
def test_a_decoder_takes_a_kv_plan_or_is_refused_by_name(name, tmp_path):
    from headprune.kvcache.plan import KVPlan, KVPlanError
    from headprune.kvcache.restrict import restricted

    model = tiny(name)
    adapter = adapt(model)
    inputs = batch(name, left=False)   # a plan reads key positions as token indices: right padding
    length = inputs["input_ids"].shape[1]

    def plan(window: int) -> KVPlan:
        return KVPlan(torch.zeros(adapter.n_layers, adapter.n_kv_heads, dtype=torch.bool), adapter.n_heads, sink=1,
                      window=window)

    if facts(name)["kv"] != "yes":
        reason = adapter.refuses.get("kv", "is an encoder")
        with pytest.raises(KVPlanError, match="encoder" if not adapter.causal else "cannot run") as info:
            plan(4).check_fits(adapter)
        assert reason in str(info.value)
        if adapter.causal:   # said from the config alone, before any weight loads
            model.save_pretrained(tmp_path)
            assert declared_refusal(str(tmp_path), "kv") == reason
        return
    with restricted(model, plan(length)) as whole:   # a window holding the whole row: the dense model
        assert close(logits(model, inputs), logits(whole, inputs)) <= 1e-5
    with restricted(model, plan(2)) as short:        # sink 1 + 2 keys: the plan really restricts
        assert moved(logits(model, inputs), logits(short, inputs)) > 1e-3
