"""The head-role protocol: a role is a :class:`~headprune.scoring.protocol.Scorer` (name, description, source,
formula, declared parameters), like a criterion, whose score is read off attention statistics (``stats.RoleStats``)
and whose label is "score ≥ threshold".

Write a role by subclassing :class:`Role`, filling the class attributes, ``score`` and (when it has one) the
threshold ``Param``; decorate it with ``@register_role``. ``RoleSpec`` holds the settings of one ``head_roles`` run,
validated once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..errors import HeadpruneError
from ..limits import ROWS_PER_BATCH, TOKENS_PER_ROW, Interval
from ..scoring import Scorer
from ..syntax import DEFAULT_PIPELINE
from .stats import OFFSET_WINDOW, RoleStats


class RoleError(HeadpruneError):
    """A head-role request that cannot be served: an unknown role, a bad threshold, a model without the role."""


class Role(Scorer):
    """A head role: ``score(stats, profile, **params)`` -> (n_blocks, H) scores in [0, 1]; a head has the role when
    its score reaches ``params["threshold"]``."""

    kind = "role"
    error = RoleError
    reads: str = "calibration"     # "calibration" texts, "probe" sequences, or dependency "arcs"

    def score(self, stats: RoleStats, profile=None, **params) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def has_role(self, scores: np.ndarray, threshold: float) -> np.ndarray:
        """(n_blocks, H) bool: the heads whose score reaches ``threshold`` (NaN -- a cut head -- never does)."""
        return np.nan_to_num(scores, nan=-np.inf) >= threshold


ROLES: dict[str, Role] = {}


def register_role(cls: type[Role]) -> type[Role]:
    if not cls.name or cls.name in ROLES:
        raise ValueError(f"role {cls.__name__} needs a unique name")
    ROLES[cls.name] = cls()
    return cls


def get_role(name: str) -> Role:
    try:
        return ROLES[name]
    except KeyError:
        raise RoleError(f"Unknown head role '{name}'. Known roles: {', '.join(ROLES)}.") from None


PROBE_LENGTH = Interval(2, TOKENS_PER_ROW.high, integer=True, why="tokens of a probe's random block; cut to the "
                                                                  "model's context")
PROBE_ROWS = Interval(1, ROWS_PER_BATCH.high, integer=True, why="probes, run as one batch")
ROLE_LENGTH = Interval(2, TOKENS_PER_ROW.high, integer=True, why=TOKENS_PER_ROW.why)
WINDOW = Interval(1, TOKENS_PER_ROW.high, integer=True, why="offsets binned on either side; no row is longer")


@dataclass(frozen=True, kw_only=True)
class RoleSpec:
    """Settings of one ``head_roles`` run; validated on construction.

    probe_length   n, the tokens of the random block r of the probes [BOS] + r + r (default 20, Olsson et al.; cut
                   to what the model's context allows)
    probe_rows     how many probes (each its own seeded block r)
    seed           seed of the probe tokens
    params         per role, its parameters as given (``{"sink": {"threshold": 0.5}}``), checked against the
                   role's declared limits
    parser         the spaCy pipeline of the syntactic role; None skips that role (its scores are NaN)
    max_length     tokens per calibration text in the syntax pass
    window         the positional role bins offsets −window..+window
    """

    probe_length: int = 20
    probe_rows: int = 8
    seed: int = 0
    params: Mapping = field(default_factory=dict)
    parser: str | None = DEFAULT_PIPELINE
    max_length: int = 128
    window: int = OFFSET_WINDOW

    def __post_init__(self):
        for name, limit in (("probe_length", PROBE_LENGTH), ("probe_rows", PROBE_ROWS),
                            ("max_length", ROLE_LENGTH), ("window", WINDOW)):
            problem = limit(getattr(self, name))
            if problem:
                raise RoleError(f"{name}={getattr(self, name)!r} {problem}.")
        unknown = sorted(set(self.params) - set(ROLES))
        if unknown:
            raise RoleError(f"Unknown head role(s) {', '.join(unknown)} in the parameters; known roles: "
                            f"{', '.join(ROLES)}.")
        self.resolved()   # every role's parameters checked now, before any pass over the data

    def resolved(self) -> dict[str, dict]:
        """Every role's parameters: the given ones checked, the rest at their defaults."""
        return {name: role.resolve_params(dict(self.params.get(name) or {})) for name, role in ROLES.items()}
