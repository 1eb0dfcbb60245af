"""Head-importance criteria, one module per family; every module here is imported so its ``@register``-ed
criteria are listed (the protocol itself is ``headprune.scoring.protocol``).

    onepass.py   the shared forward (and backward) pass: AE, AD, HIS, Taylor and Gnorm read one pass
    entropy.py   ae, ad                    gradient.py  his, taylor
    gnorm.py     gnorm, greedy-gnorm       hies.py      hies (α by wAUC)
    kl.py        kl (ablation + recursive layer smoothing)
    sap.py       sap, sap-cf (dependency arcs, Candidate Filtering)
    random.py    random (the seeded baseline)
    kwon.py      kwon (Kwon et al. 2022: Fisher mask search, rearrangement, mask tuning; real-valued head scales)
"""

from __future__ import annotations

import importlib
import pkgutil

from ..scoring import REGISTRY, Criterion, Param, ScoreMap, ScoringContext, get, label_free, register

for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")


def available() -> list[str]:
    return sorted(REGISTRY)


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
