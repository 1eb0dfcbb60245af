"""One example through the dense and the pruned model (issue 36 item 3): the library's per-token losses and label
probabilities against an independent computation -- the heads cut out by surgery, cross-entropy by torch."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from headprune.errors import DataError
from headprune.evaluation.example import MAX_CHARS, compare_classifier, compare_lm
from headprune.model.hooks import structural_copy
from headprune.model.mask import HeadMask
from headprune.model.surgery import prune_model
from headprune.testing import offline_tokenizer, tiny_decoder, tiny_model

CORPUS = ["the cat sat on the mat", "a dog ran in the park", "the film was slow but good"] * 5


@pytest.fixture(scope="module")
def lm():
    tok = offline_tokenizer("byte-level-bpe", CORPUS)
    model = tiny_decoder("llama", vocab_size=len(tok), n_kv_heads=8)
    return model, tok


def test_per_token_losses_match_surgery_and_cross_entropy(lm):
    model, tok = lm
    mask = HeadMask.from_pruned({0: [1, 2], 2: [0, 5, 7]}, (4, 8))
    before = {n: p.clone() for n, p in model.state_dict().items()}
    hooks_before = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    out = compare_lm(model, tok, "the cat sat in the park", mask, top_k=3)
    ids = torch.tensor(tok("the cat sat in the park")["input_ids"])
    assert out.ids.tolist() == ids.tolist() and len(out.tokens) == len(ids)
    for reference, losses in ((model, out.dense_loss), (prune_model(model, mask), out.pruned_loss)):
        with torch.no_grad():
            logits = reference(input_ids=ids[None]).logits[0]
        expect = F.cross_entropy(logits[:-1], ids[1:], reduction="none").numpy()
        assert np.isnan(losses[0])
        np.testing.assert_allclose(losses[1:], expect, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.delta[1:], out.pruned_loss[1:] - out.dense_loss[1:])
    assert np.abs(out.delta[1:]).max() > 1e-4       # the mask changed something
    # top-k: the pruned model's most likely next token at the last position, by hand
    with torch.no_grad():
        probs = prune_model(model, mask)(input_ids=ids[None]).logits[0, -1].softmax(-1)
    assert out.pruned_top[-1][0] == (tok.decode([int(probs.argmax())]), pytest.approx(float(probs.max()), rel=1e-4))
    assert len(out.dense_top[0]) == 3 and out.dense_top[0][0][1] >= out.dense_top[0][1][1]
    # the model given was neither changed nor hooked
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    assert sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules()) == hooks_before
    assert out.perplexity("dense") == pytest.approx(float(np.exp(np.mean(out.dense_loss[1:]))))


def test_targets_from_marks_the_scored_tokens(lm):
    model, tok = lm
    text = "the cat sat the cat sat"
    out = compare_lm(model, tok, text, None, targets_from=text.index(" the", 3) + 1)
    # <s> the cat sat | the cat sat | </s>: the second copy's three words only (special tokens are never targets)
    assert out.tokens[4:7] == [" the", " cat", " sat"]
    assert out.scored.tolist() == [False] * 4 + [True] * 3 + [False]
    np.testing.assert_allclose(out.delta[1:], 0.0, atol=1e-6)      # no mask: pruned == dense


def test_classifier_label_probabilities_match_surgery():
    tok = offline_tokenizer("unigram", CORPUS)
    model = tiny_model("bert", vocab_size=max(len(tok), 120))
    model.config.id2label = {0: "neg", 1: "neu", 2: "pos"}
    mask = HeadMask.from_pruned({0: [0, 1, 2], 1: [3]}, (3, 4))
    out = compare_classifier(model, tok, "the film was good", mask)
    enc = tok("the film was good", return_tensors="pt")
    with torch.no_grad():
        expect = prune_model(structural_copy(model), mask)(**enc).logits[0].softmax(-1).numpy()
        dense = model(**enc).logits[0].softmax(-1).numpy()
    np.testing.assert_allclose(out.pruned, expect, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(out.dense, dense, rtol=1e-4, atol=1e-6)
    assert out.labels == ["neg", "neu", "pos"] and out.dense_label == out.labels[int(dense.argmax())]


def test_bad_text_is_refused(lm):
    model, tok = lm
    with pytest.raises(DataError, match="empty"):
        compare_lm(model, tok, "   ", None)
    with pytest.raises(DataError, match=f"at most {MAX_CHARS:,}"):
        compare_lm(model, tok, "word " * MAX_CHARS, None)
