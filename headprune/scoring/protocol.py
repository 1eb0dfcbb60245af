"""The one protocol every head scorer implements: criteria (``headprune.criteria``) and head roles
(``headprune.roles``).

A :class:`Scorer` has a name, a one-line description, its source (paper and equation), its formula, and its
parameters declared once as :class:`Param` with their limits (``headprune.limits.Interval``). A criterion turns a
model (with its current HeadMask) and a calibration set, the :class:`ScoringContext`, into a
:class:`~headprune.scoring.scores.ScoreMap`: higher = more important = kept longer, NaN for heads already pruned.

Write a criterion by subclassing :class:`Criterion`, filling the class attributes and ``score``; decorate it with
``@register``. The modules of ``headprune.criteria`` are imported automatically, so it then appears in the CLI
and the dashboard without further changes.

The context takes its own private copy of the model it is given (``hooks.structural_copy``: the same weights, new
module objects), so whatever a criterion hooks, gates or stands in while it runs touches only that copy: two
threads may score one shared model at once.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import CriterionError, HeadpruneError
from ..model.hooks import structural_copy
from ..userinput import MAX_JSON_DEPTH, json_depth
from .scores import ScoreMap

Progress = Callable[[float, str], None]
# A forward + backward costs about three forwards: the backward computes gradients for both the activations and
# the weights of every matrix product, 2x the forward's work (Kaplan et al. 2020, "Scaling laws", C ≈ 6N FLOPs per
# token for training against 2N for a forward).
GRADIENT_PASS = 3.0


@dataclass(frozen=True)
class Param:
    default: Any
    doc: str
    kind: type = float
    check: Callable[[Any], str | None] | None = None   # e.g. Interval(0, 1): an error message, or None when valid
    choices: tuple | None = None
    convert: Callable[[Any], Any] | None = None   # normalises a value before ``check`` (e.g. "0.8" -> 0.8)

    def parse(self, name: str, value: Any, error: type[HeadpruneError] = CriterionError) -> Any:
        """``value`` converted to ``kind`` and checked; ``error`` (naming the parameter and what is accepted)
        otherwise."""
        if isinstance(value, str) and self.kind is not str:
            try:
                if self.kind in (bool, list, dict) and json_depth(value) > MAX_JSON_DEPTH:
                    raise ValueError("nested too deep")   # refused before the (recursive) parser sees it
                value = json.loads(value) if self.kind in (bool, list, dict) else self.kind(value)
            except (ValueError, json.JSONDecodeError):
                raise error(f"Parameter {name}={value!r}: expected {self.kind.__name__}.") from None
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if self.choices is not None and value not in self.choices:
            accepted = ", ".join(map(str, self.choices))
            raise error(f"Parameter {name}={value!r}: accepted values are {accepted}.")
        if self.convert is not None:
            value = self.convert(value)
        if self.check is not None:
            msg = self.check(value)
            if msg:
                raise error(f"Parameter {name}={value!r}: {msg}")
        return value


@dataclass
class ScoringContext:
    """Everything a criterion may read.

    ``model`` is replaced by a private structural copy on construction (module doc), so a criterion may gate and
    hook ``ctx.model`` freely; the caller's model is never touched. Criteria still must not change weights
    (gate via ``mask``; cut a deep copy).
    """

    model: Any                       # torch model: a private copy of the one given
    calib: list[dict]                # calibration batches (input_ids, attention_mask, ..., labels)
    mask: Any = None                 # HeadMask of heads already pruned (None = dense)
    device: Any = None
    tokenizer: Any = None
    texts: list | None = None        # raw calibration texts (syntax criteria)
    seed: int = 0
    progress: Progress | None = None         # called between batches; an exception it raises (errors.Cancelled)
    cache: dict = field(default_factory=dict)   # shared between criteria scored together (one pass for many)
    memory_budget: int | str | None = None   # bytes beyond the weights (model.memory; None: a share of free memory)
    # selection batches: where a criterion makes its choices (HIES's α, SAP's k and candidate filtering), never
    # the evaluation rows; None: the calibration batches, as before data roles existed (``selection``)
    select: list[dict] | None = None

    def __post_init__(self):
        self.model = structural_copy(self.model)

    @property
    def selection(self) -> list[dict]:
        """The batches choices are made on: the selection batches, else the calibration batches."""
        return self.select or self.calib

    def report(self, fraction: float, message: str = "") -> None:
        if self.progress is not None:
            self.progress(min(max(fraction, 0.0), 1.0), message)


class Scorer:
    """What criteria and roles share: a name, what it computes and where it comes from, declared parameters."""

    name: str = ""
    description: str = ""            # one line
    reference: str = ""              # paper + equation
    latex: str = ""                  # the formula, for st.latex
    params: dict[str, Param] = {}
    kind: str = "criterion"          # how messages name it
    error: type[HeadpruneError] = CriterionError

    def resolve_params(self, given: dict | None) -> dict:
        """Every parameter: the ``given`` value parsed and checked, else its default."""
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            accepted = ", ".join(self.params) or "none"
            raise self.error(f"{self.kind.capitalize()} '{self.name}' does not take parameter(s) "
                             f"{', '.join(unknown)}; it accepts: {accepted}.")
        return {k: p.parse(k, given.get(k, p.default), self.error) for k, p in self.params.items()}


class Criterion(Scorer):
    dynamic: bool = False            # re-scored after every removal (Greedy-Gnorm) or scored once
    needs_labels: bool = False       # with the default parameters; ``needs_labels_for(params)`` asks for others
    needs_gradients: bool = False
    needs_parser: bool = False
    equivalent_to: str = ""          # a criterion giving the same scores with the default parameters of both

    def requires_labels(self, params: dict) -> bool:
        """Whether scoring with these resolved ``params`` needs labels (override when a parameter decides)."""
        return self.needs_labels

    def needs_labels_for(self, params: dict | None = None) -> bool:
        """Whether scoring with the parameters ``params`` as a user gives them (defaults filled in) needs labels."""
        return self.requires_labels(self.resolve_params(params))

    def score(self, ctx: ScoringContext, **params) -> ScoreMap:  # pragma: no cover - interface
        raise NotImplementedError

    shares_pass: bool = False        # computed in one pass shared with the other criteria that share it (onepass)

    def work(self, ctx: ScoringContext, params: dict) -> float:
        """What scoring ``ctx`` costs, in forward passes over the calibration set (``headprune.estimate`` turns it
        into seconds): 1 without gradients, ``GRADIENT_PASS`` with a backward. Criteria that run more override."""
        return GRADIENT_PASS if self.needs_gradients else 1.0

    def selection_work(self, ctx: ScoringContext, params: dict) -> float:
        """What scoring costs beyond ``work``, in forward passes over the selection batches (``ctx.selection``: the
        selection role, else the calibration set): choices measured there (SAP's k sweep, candidate filtering's
        evaluations). 0 for criteria that make none; an upper bound where the count is only known while scoring."""
        return 0.0

    def prepare(self, ctx: ScoringContext, params: dict | None = None) -> dict:
        """Resolved parameters, after checking that ``ctx`` has what they need (labels)."""
        resolved = self.resolve_params(params)
        if sum(len(b["input_ids"]) for b in ctx.calib) == 0:
            raise CriterionError(f"Criterion '{self.name}': scoring needs at least one calibration example, but the "
                                 "calibration set is empty. Accepted: a calibration size of 1 or more.")
        if self.requires_labels(resolved) and any("labels" not in b for b in ctx.calib):
            raise CriterionError(f"Criterion '{self.name}' needs labels, but the calibration data has none. "
                                 f"Label-free criteria: {', '.join(label_free())}.")
        return resolved

    def __call__(self, ctx: ScoringContext, params: dict | None = None) -> ScoreMap:
        return self.score(ctx, **self.prepare(ctx, params))


REGISTRY: dict[str, Criterion] = {}


def register(cls: type[Criterion]) -> type[Criterion]:
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in REGISTRY:
        raise ValueError(f"criterion '{cls.name}' registered twice")
    REGISTRY[cls.name] = cls()
    return cls


def get(name: str) -> Criterion:
    """The registered criterion called ``name`` (the criteria register when ``headprune.criteria`` is imported)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise CriterionError(f"Unknown criterion '{name}'. Known criteria: {', '.join(sorted(REGISTRY))}.") from None


def label_free(params_by_name: dict[str, dict] | None = None) -> list[str]:
    """Registered criteria that score without labels, each asked with its parameters in ``params_by_name``
    (default: its defaults); e.g. ``sap`` needs labels with k = 0 (k chosen on the metric) but not with a fixed k."""
    params_by_name = params_by_name or {}
    return sorted(n for n, c in REGISTRY.items() if not c.needs_labels_for(params_by_name.get(n)))
