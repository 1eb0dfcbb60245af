"""Head-importance criteria. Every module here is imported so its ``@register``-ed criteria are listed."""

from __future__ import annotations

import importlib
import pkgutil

from ..errors import CriterionError
from .base import REGISTRY, Criterion, Param, ScoreMap, ScoringContext, register

for _info in pkgutil.iter_modules(__path__):
    if _info.name != "base":
        importlib.import_module(f"{__name__}.{_info.name}")


def get(name: str) -> Criterion:
    try:
        return REGISTRY[name]
    except KeyError:
        raise CriterionError(f"Unknown criterion '{name}'. Known criteria: {', '.join(sorted(REGISTRY))}.") from None


def available() -> list[str]:
    return sorted(REGISTRY)


def label_free(params_by_name: dict[str, dict] | None = None) -> list[str]:
    """Criteria that score without labels, each asked with its parameters in ``params_by_name`` (default: its
    defaults); e.g. ``sap`` needs labels with k = 0 (k chosen on the metric) but not with a fixed k."""
    params_by_name = params_by_name or {}
    return sorted(n for n, c in REGISTRY.items() if not c.needs_labels_for(params_by_name.get(n)))


def redundant_pairs(names, params_by_name: dict[str, dict] | None = None) -> list[tuple[str, str]]:
    """Pairs among ``names`` that give identical scores with these parameters (default: the defaults), so that
    choosing both compares a criterion with itself, e.g. ``("his", "taylor")``: Σ A ⊙ ∂L/∂A = ∂L/∂gate (see
    ``gradient.Taylor``). A pair is redundant only while both keep the default parameters the identity needs."""
    params_by_name = params_by_name or {}
    chosen = [get(n) for n in dict.fromkeys(names)]
    pairs = []
    for crit in chosen:
        other = crit.equivalent_to
        if other and other in {c.name for c in chosen} and \
                all(_at_defaults(get(n), params_by_name.get(n)) for n in (crit.name, other)):
            pairs.append(tuple(sorted((crit.name, other))))
    return sorted(set(pairs))


def _at_defaults(crit: Criterion, given: dict | None) -> bool:
    return crit.resolve_params(given) == crit.resolve_params(None)


__all__ = ["REGISTRY", "Criterion", "Param", "ScoreMap", "ScoringContext", "register", "get", "available",
           "label_free", "redundant_pairs"]
