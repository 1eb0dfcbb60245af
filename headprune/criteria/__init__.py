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


def label_free() -> list[str]:
    return sorted(n for n, c in REGISTRY.items() if not c.needs_labels)


__all__ = ["REGISTRY", "Criterion", "Param", "ScoreMap", "ScoringContext", "register", "get", "available",
           "label_free"]
