"""What each KV plan rule is: the published method, a part of it, a proxy, or a baseline (the dashboard's rule card,
the CLI's words). A name promises a method; the card says how far the code keeps that promise.

``duo`` changes meaning when DuoAttention's learned gates land (issue 37 item 1): the attention-mass measure then
keeps its own name, ``far-mass``. Until then ``duo`` *is* that measure, and its card says so -- the card follows the
rules present (``rules``), so it stays true on either side of that change.
"""

from __future__ import annotations

from dataclasses import dataclass

PUBLISHED, PARTIAL, PROXY, BASELINE = "published method", "published scores, simplified", "proxy", "baseline"


@dataclass(frozen=True)
class RuleCard:
    rule: str
    title: str
    status: str      # PUBLISHED, PARTIAL, PROXY or BASELINE
    text: str

    def to_dict(self) -> dict:
        return {"rule": self.rule, "title": self.title, "status": self.status, "text": self.text}


FAR_MASS = ("attention mass a head puts outside its sink + window on the calibration rows: the question "
            "DuoAttention's gates answer, asked directly (kvpress's on-the-fly approximation), not DuoAttention's "
            "gates learned by distillation")
CARDS = {
    "razor": RuleCard("razor", "RazorAttention (Tang et al. 2024)", PARTIAL,
                      "echo and induction scores on repeated random-token probes longer than the window, as the paper "
                      "finds retrieval heads; one share for both kinds (score = max(echo, induction)) and no "
                      "compensation token for the streaming heads, where the reference keeps separate shares and "
                      "adds one"),
    "duo-gates": RuleCard("duo", "DuoAttention (Xiao et al. 2024)", PUBLISHED,
                          "per key/value head gates mixing full and streaming attention, learned by distillation on "
                          "synthetic passkeys in filler text (the paper's loss and L1 penalty), deployed by a "
                          "threshold or a share"),
    "far-mass": RuleCard("far-mass", "Attention mass outside the window", PROXY, FAR_MASS),
    "random": RuleCard("random", "Random (seeded)", BASELINE, "a seeded uniform score: the band a rule must beat"),
}


def rule_card(rule: str, rules=()) -> RuleCard:
    """The card of ``rule`` given the rules present (``scores.RULES``); a pruning criterion's name gets the proxy
    card of importance scores."""
    if rule == "duo":
        return CARDS["duo-gates"] if "far-mass" in rules else RuleCard("duo", "Attention mass outside the window "
                                                                       "(named duo)", PROXY, FAR_MASS)
    if rule in CARDS:
        return CARDS[rule]
    return RuleCard(rule, f"Criterion {rule}", PROXY, "a head-pruning criterion's importance score, read as the "
                    "group's need for far keys: no KV cache paper chose heads this way")


BUDGETS = RuleCard("budgets", "HeadKV's budget allocation (Fu et al. 2024)", PUBLISHED,
                   "each group a base budget plus a share of a pool in proportion to its score (the paper's "
                   "allocation, on whichever score is chosen; HeadKV's own score is its retrieval-reasoning heads "
                   "score, not offered here), every group keeping S + W_g tokens")
