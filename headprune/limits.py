"""Limits of parameters, declared once next to the parameter and checked in one place.

In the style of scikit-learn's ``Interval(Real, 0, 1, closed="both")``: a limit is a small value object that
says what it accepts in words, so every error message names the accepted range the same way::

    Param(0.5, "balancing factor", float, check=Interval(0, 1))      # "must lie in [0, 1]"
    Interval(0, None, closed="neither")                               # "must be > 0"
    Interval(1, None, integer=True)                                   # "must be an integer >= 1"

A check returns None for a valid value and the message otherwise; it never raises, so the caller decides which
error class a user sees (a criterion's parameter, a trajectory's step, a role's threshold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

CLOSED = ("both", "left", "right", "neither")


@dataclass(frozen=True)
class Interval:
    """Numbers between ``low`` and ``high`` (None: unbounded on that side); ``closed`` says which ends belong.

    ``integer=True`` accepts integers only (bools are never numbers here). Infinities and NaN are refused on
    every side, bounded or not ("must be a finite number > 0").
    """

    low: float | None
    high: float | None
    closed: str = "both"
    integer: bool = False

    def __post_init__(self):
        if self.closed not in CLOSED:
            raise ValueError(f"closed must be one of {CLOSED}, not {self.closed!r}")

    def __call__(self, value) -> str | None:
        """None when ``value`` lies in the interval, else a message saying what is accepted."""
        kind = Integral if self.integer else Real
        valid = not isinstance(value, bool) and isinstance(value, kind)
        if valid and not self.integer and not math.isfinite(value):
            # inf passes an unbounded side's comparison, NaN fails every one silently: name both
            return f"must be a finite number {self.describe().removeprefix('a number')}".rstrip()
        if valid:
            low_ok = self.low is None or (value >= self.low if self.closed in ("both", "left") else value > self.low)
            high_ok = self.high is None or \
                (value <= self.high if self.closed in ("both", "right") else value < self.high)
            valid = low_ok and high_ok
        return None if valid else f"must {'lie' if self.describe().startswith('in ') else 'be'} {self.describe()}"

    def describe(self) -> str:
        """The accepted values in words: "in [0, 1]", "> 0", "an integer >= 1" (messages read "must lie in [0, 1]",
        "must be > 0")."""
        what = "an integer " if self.integer else ""
        if self.low is not None and self.high is not None:
            left = "[" if self.closed in ("both", "left") else "("
            right = "]" if self.closed in ("both", "right") else ")"
            return f"{what}in {left}{_number(self.low)}, {_number(self.high)}{right}"
        if self.low is not None:
            return f"{what}{'>=' if self.closed in ('both', 'left') else '>'} {_number(self.low)}"
        if self.high is not None:
            return f"{what}{'<=' if self.closed in ('both', 'right') else '<'} {_number(self.high)}"
        return what.strip() or "a number"


def _number(value: float) -> str:
    return f"{value:g}"


UNIT = Interval(0, 1)                                   # a share or a weight: [0, 1]
POSITIVE = Interval(0, None, closed="neither")          # > 0
NON_NEGATIVE_INT = Interval(0, None, integer=True)      # 0, 1, 2, ...
POSITIVE_INT = Interval(1, None, integer=True)          # 1, 2, ...
NON_NEGATIVE = Interval(0, None)                        # >= 0
