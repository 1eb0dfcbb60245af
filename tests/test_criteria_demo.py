"""Integration on the real demo model (MiniLM-L6, 6 x 12 heads): every one-pass criterion from one shared pass."""

import math

import numpy as np
import pytest

from headprune.criteria import ScoringContext
from headprune.criteria.onepass import score_many
from headprune.data import align_labels, load_data, make_batches, split_calib_eval

NAMES = ["ae", "ad", "his", "taylor", "gnorm", "hies", "random"]


@pytest.fixture(scope="module")
def demo_calib(demo):
    ds = align_labels(load_data("demo"), demo.id2label)
    calib, _ = split_calib_eval(ds, 16, 0, seed=0)
    return make_batches(demo.tokenizer, calib, batch_size=16, max_length=64)


def test_demo_scores(demo, demo_calib):
    out = score_many(NAMES, ScoringContext(demo.model, demo_calib, seed=0))
    longest = int(demo_calib[0]["attention_mask"].sum(1).max())
    for name in NAMES:
        assert out[name].shape == (6, 12) and np.isfinite(out[name].scores).all(), name
    assert (out["ae"].scores < 0).all() and (out["ae"].scores > -math.log(longest) - 1e-3).all()
    assert ((-out["ad"].scores >= 0) & (-out["ad"].scores <= 1)).all()
    np.testing.assert_allclose(out["taylor"].scores, out["his"].scores, rtol=1e-3)   # eq. 8 == eq. 2 (float32)
    assert out["gnorm"].scores.min() > 0 and len(set(out["gnorm"].order())) == 72
