"""Limits of parameters, declared once next to the parameter and checked in one place.

In the style of scikit-learn's ``Interval(Real, 0, 1, closed="both")``: a limit is a small value object that
says what it accepts in words, so every error message names the accepted range the same way::

    Param(0.5, "balancing factor", float, check=Interval(0, 1))      # "must lie in [0, 1]"
    Interval(0, None, closed="neither")                               # "must be > 0"
    Interval(1, None, integer=True)                                   # "must be an integer >= 1"
    Interval(1, 1000, integer=True, why="each repeat is a full set of cells")   # the reason joins the message

Infinity and NaN are refused unless ``infinite=True`` (an open end admits every finite number, never inf: a
learning rate of inf "is > 0" but trains a NaN model). An upper bound says why it stops there (``why``), so
a user meeting it learns the reason, not just the number.

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

    ``integer=True`` accepts integers only (bools are never numbers here). NaN is refused on every side, and so
    are infinities unless ``infinite=True`` admits ±inf where the ends allow it ("must be a finite number > 0");
    ``why`` is the reason for the limits, added to every message.
    """

    low: float | None
    high: float | None
    closed: str = "both"
    integer: bool = False
    infinite: bool = False
    why: str = ""

    def __post_init__(self):
        if self.closed not in CLOSED:
            raise ValueError(f"closed must be one of {CLOSED}, not {self.closed!r}")

    def __call__(self, value) -> str | None:
        """None when ``value`` lies in the interval, else a message saying what is accepted."""
        kind = Integral if self.integer else Real
        valid = not isinstance(value, bool) and isinstance(value, kind)
        if valid and not self.integer and not math.isfinite(value) and not (math.isinf(value) and self.infinite):
            # inf passes an unbounded side's comparison, NaN fails every one silently: name both
            return f"must be a finite number {self.describe().removeprefix('a number')}".rstrip() + self._reason()
        if valid:
            low_ok = self.low is None or (value >= self.low if self.closed in ("both", "left") else value > self.low)
            high_ok = self.high is None or \
                (value <= self.high if self.closed in ("both", "right") else value < self.high)
            valid = low_ok and high_ok
        if valid:
            return None
        return f"must {'lie' if self.describe().startswith('in ') else 'be'} {self.describe()}{self._reason()}"

    def _reason(self) -> str:
        return f" ({self.why})" if self.why else ""

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
    """A bound in words: 0.5, 1, 4096, 1,048,576 (large whole numbers with thousands separators, not 1.04858e+06)."""
    if float(value).is_integer():
        return f"{int(value):,}" if abs(value) >= 10_000 else str(int(value))
    return f"{value:g}"


UNIT = Interval(0, 1)                                   # a share or a weight: [0, 1]
POSITIVE = Interval(0, None, closed="neither")          # > 0
NON_NEGATIVE_INT = Interval(0, None, integer=True)      # 0, 1, 2, ...
POSITIVE_INT = Interval(1, None, integer=True)          # 1, 2, ...
NON_NEGATIVE = Interval(0, None)                        # >= 0

# limits many commands share, each with its reason: a plan or a tensor is sized by these numbers, so a number past
# them is refused before anything is allocated
ROWS_PER_BATCH = Interval(1, 4096, integer=True, why="rows in one forward pass; the memory planner splits what does "
                                                     "not fit anyway")
TOKENS_PER_ROW = Interval(1, 1_048_576, integer=True, why="tokens per row; rows are cut to the model's context")
# a seed: numpy's legacy generator and torch's take 32-bit seeds, and seeds are derived from it (seed + repeat, seed +
# order, up to 1,000 more), so the bound leaves them room below 2**32
SEED = Interval(0, 2**31 - 1, integer=True, why="seeds derived from it (seed + repeat, + order) stay in the random "
                                               "generators' 32-bit range")
