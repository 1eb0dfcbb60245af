"""``roles``: every head's role scores and labels (previous-token, duplicate-token, induction, sink, positional,
syntactic, broad) as one JSON file, and with ``--criterion``/``--ratio`` which roles each criterion keeps."""

from __future__ import annotations

import time

from ..data import calibration_texts
from ..limits import UNIT
from ..roles import RoleError, RoleSpec, head_roles, kept_by_role
from ..roles.base import PROBE_LENGTH, PROBE_ROWS
from ..scoring import ScoringContext, get
from ..syntax import DEFAULT_PIPELINE
from .common import (
    add_data_args,
    add_mask_arg,
    add_model_args,
    check_args,
    checked,
    load_mask,
    load_model_and_data,
    summary,
    tqdm_progress,
)
from .output import add_force_arg, check_out_arg, write_out


def role_params(pairs: list[str] | None) -> dict:
    """``--role-param ROLE.KEY=VALUE`` pairs as {role: {key: value}} (checked by RoleSpec)."""
    out: dict[str, dict] = {}
    for pair in pairs or []:
        name, sep, value = pair.partition("=")
        role, dot, key = name.partition(".")
        if not sep or not dot or not role or not key:
            raise RoleError(f"--role-param {pair!r}: expected ROLE.KEY=VALUE, e.g. --role-param sink.threshold=0.5.")
        out.setdefault(role.strip(), {})[key.strip()] = value.strip()
    return out


def cmd_roles(args) -> dict:
    check_args(args, calib="head roles")
    check_out_arg(args)
    criteria = [get(name) for name in args.criterion or []]        # unknown names fail before any loading
    if args.ratio and not criteria:
        raise RoleError(f"--ratio {', '.join(map(str, args.ratio))} without --criterion: a ratio says how many heads "
                        "a criterion prunes before its kept heads are read by role, and no criterion was named. "
                        "Accepted: --criterion NAME with --ratio R (e.g. --criterion ae --ratio 0.5), or leave "
                        "--ratio out.")
    spec = RoleSpec(probe_length=args.probe_length, probe_rows=args.probe_rows, seed=args.seed,
                    params=role_params(args.role_param),
                    parser=None if args.no_syntax else args.parser, max_length=args.max_length)
    start = time.perf_counter()
    # selection rows are read only where a criterion runs (it makes its choices there)
    loaded, calib, _, info = load_model_and_data(args, select_size=None if criteria else 0)
    mask = load_mask(args, loaded)
    texts = calibration_texts(info["calib_data"], calib)
    report = head_roles(loaded.model, loaded.tokenizer, calib, spec, texts=texts, mask=mask,
                        progress=tqdm_progress("head roles"))
    result = {**report.to_json(), "model": args.model, "data": summary(info), "seed": args.seed}
    if criteria:
        ctx = ScoringContext(loaded.model, calib, mask, loaded.device, loaded.tokenizer, texts, seed=args.seed,
                             select=info["select_batches"] or None)
        maps = {c.name: c(ctx, {}) for c in criteria}
        # dynamic criteria (greedy-gnorm, hies) re-score while pruning; here they are read in their one-shot order
        result["kept_by_role"] = {str(r): kept_by_role(maps, report, r) for r in args.ratio or [0.5]}
        result["criteria_order"] = {c.name: "re-scored while pruning; one-shot scores used" if c.dynamic
                                    else "one-shot scores" for c in criteria}
    result["seconds"] = time.perf_counter() - start
    return write_out(result, args)


def add_commands(sub) -> None:
    p = sub.add_parser("roles", help="what every head does: role scores and labels (and which roles criteria keep)")
    add_model_args(p)
    add_data_args(p, eval_size=0)
    add_mask_arg(p)
    p.add_argument("--probe-length", type=checked(PROBE_LENGTH, "a block length"), default=20,
                   help="n, the random block of the [BOS] + r + r probes (default: 20, cut to the context)")
    p.add_argument("--probe-rows", type=checked(PROBE_ROWS, "a probe count"), default=8,
                   help="how many probes, each its own block (default: 8)")
    p.add_argument("--role-param", action="append", metavar="ROLE.KEY=VALUE",
                   help="a role parameter, e.g. sink.threshold=0.5 (repeatable)")
    p.add_argument("--parser", default=DEFAULT_PIPELINE,
                   help=f"spaCy pipeline for the syntactic role (default: {DEFAULT_PIPELINE})")
    p.add_argument("--no-syntax", action="store_true", help="skip the syntactic role (no parser; its scores are null)")
    p.add_argument("--criterion", action="append", metavar="NAME",
                   help="also report which roles this criterion keeps (repeatable)")
    p.add_argument("--ratio", action="append", type=checked(UNIT, "a pruning ratio"), metavar="R",
                   help="pruning ratio in [0, 1] for --criterion (repeatable; default 0.5)")
    p.add_argument("--out", help="also write the JSON result to this file (ROLES.json)")
    add_force_arg(p)
    p.set_defaults(handler=cmd_roles)
