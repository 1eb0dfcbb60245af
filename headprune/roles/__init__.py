"""Head roles: what each head does (previous-token, duplicate-token, induction, sink, positional, syntactic,
broad), scored as L × H maps from captured attention, and which roles a criterion keeps.

Layers inside (independent / depends on independent / interdependent, as TransformerLens groups components):
    stats.py      per-layer attention statistics and their running sums (torch only)
    base.py       the Role protocol, ROLES registry, RoleSpec
    probes.py     repeated random-token probes [BOS] + r + r
    detectors.py  the seven roles (each formula and its source in its docstring)
    report.py     head_roles -> RoleReport (scores, labels, thresholds; one JSON)
    analysis.py   kept_by_role / kept_curve (criteria) and role_ablation (live evaluator)
"""

from .stats import OFFSET_WINDOW, RoleStats  # isort: skip
from .base import ROLES, Role, RoleError, RoleSpec, get_role, register_role  # isort: skip
from .probes import Probes, make_probes  # isort: skip
from . import detectors  # noqa: F401  (registers the roles)  # isort: skip
from .report import MARKS, NO_ROLE, RoleReport, build_report, head_roles  # isort: skip
from .analysis import kept_by_role, kept_curve, kept_set, role_ablation  # isort: skip

ROLE_NAMES = tuple(ROLES)

__all__ = ["MARKS", "NO_ROLE", "OFFSET_WINDOW", "ROLES", "ROLE_NAMES", "Probes", "Role", "RoleError", "RoleReport",
           "RoleSpec", "RoleStats", "build_report", "get_role", "head_roles", "kept_by_role", "kept_curve",
           "kept_set", "make_probes", "register_role", "role_ablation"]
