"""The evaluation layer: how good a model is under a head mask, how fast, and how that changes click by click.

    harness.py      lm-evaluation-harness on the in-memory model under a mask (optional extra)
    metrics.py      evaluate / predict / lm_stats: accuracy, macro-F1, MCC, Pearson, perplexity (one place)
    live.py         LiveEvaluator: re-evaluate from the changed layer up after a mask change
    progressive.py  the running estimate with its 95% interval while batches arrive
    stability.py    prediction agreement under a seeded word drop
    speed.py        FLOPs of a forward, measured vs ideal speed-up of a pruned model
"""

from .live import LiveEvaluator
from .metrics import Metrics, evaluate, headline_metric, predict

__all__ = ["LiveEvaluator", "Metrics", "evaluate", "headline_metric", "predict"]
