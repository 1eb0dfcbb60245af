"""``head_roles``: every role's L × H score map, each head's labels, in one JSON (``RoleReport``).

Two attention passes, each the one capture the statistics need (``benchmarks/bench_roles.py`` times them against a
plain capture):
    probes        ``Probes`` ([BOS] + r + r) through ``model.capture.stream_attention``: duplicate, induction;
    calibration   the calibration texts, parsed, through ``syntax.iter_arcs`` -- its token-level capture feeds the
                  previous-token, sink, positional and broad statistics (``on_capture``) while the word-level arcs
                  feed the syntactic profile; without texts or a parser, the calibration batches through
                  ``stream_attention`` (the syntactic scores are then NaN).
A head cut out of the model, or gated off by ``mask``, has NaN scores and no label. The grid is the model's HeadMask
grid: layers × query heads (grouped-query heads each on their own row of attention), ALBERT 1 × H tied heads whose
statistics add up over every layer the head acts in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from ..data import model_inputs
from ..model.arch import adapt
from ..model.capture import stream_attention
from ..model.mask import HeadMask
from ..provenance import versions
from ..scoring import ScoreMap
from ..syntax import SyntacticProfile, aggregate_arcs, iter_arcs, parse_dataset
from .base import ROLES, RoleError, RoleSpec
from .detectors import Positional, Syntactic
from .probes import Probes, make_probes
from .stats import RoleStats, normalised_entropy, offset_histogram, previous_token, repeat_stripes, sink_mass

NO_ROLE = "no clear role"
# one-letter marks written in head-grid cells (``viz.head_grid``); a positional mark carries its offset ("@+1")
MARKS = {"previous-token": "P", "duplicate-token": "D", "induction": "I", "sink": "S", "positional": "@",
         "syntactic": "Y", "broad": "B"}


@dataclass
class RoleReport:
    """Role scores (one ScoreMap per role, NaN for cut / gated heads), thresholds and labels of every head."""

    scores: dict[str, ScoreMap]
    thresholds: dict[str, float]
    positional_offset: np.ndarray            # (L, H) float: the offset k of the positional score, NaN if none
    syntactic_relation: np.ndarray           # (L, H) object: relation of the best syntactic margin, or None
    probe_ids: np.ndarray                    # (T,) the first probe's token ids
    probe_attention: np.ndarray | None = None   # (n_layers, H, T, T) float32 attention on that probe (views)
    profile: SyntacticProfile | None = None
    meta: dict = field(default_factory=dict)

    @property
    def shape(self) -> tuple[int, int]:
        return next(iter(self.scores.values())).shape

    @property
    def live(self) -> np.ndarray:
        """(L, H) bool: heads with scores (present and not gated)."""
        return ~np.isnan(self.scores["previous-token"].scores)

    def heads_with(self, role: str) -> np.ndarray:
        """(L, H) bool: the heads labelled with ``role`` (``NO_ROLE``: live heads without any label)."""
        if role == NO_ROLE:
            return self.live & ~np.any([self.heads_with(r) for r in self.scores], axis=0)
        if role not in self.scores:
            raise RoleError(f"Unknown head role '{role}'. Known roles: {', '.join(self.scores)}, {NO_ROLE}.")
        return ROLES[role].has_role(self.scores[role].scores, self.thresholds[role])

    @property
    def labels(self) -> np.ndarray:
        """(L, H) object: each head's tuple of role names, () for "no clear role" and for cut heads."""
        out = np.empty(self.shape, dtype=object)
        has = {role: self.heads_with(role) for role in self.scores}
        for (layer, head), _ in np.ndenumerate(out):
            out[layer, head] = tuple(r for r in self.scores if has[r][layer, head])
        return out

    def marks(self) -> np.ndarray:
        """(L, H) str: one-letter marks of each head's labels for grid cells ("P", "S I", "@+1"; ``MARKS``)."""
        out = np.full(self.shape, "", dtype=object)
        for (layer, head), roles in np.ndenumerate(self.labels):
            out[layer, head] = " ".join(MARKS[r] + (f"{int(self.positional_offset[layer, head]):+d}"
                                                    if r == "positional" else "") for r in roles)
        return out

    def names(self) -> np.ndarray:
        """(L, H) str: each head's labels in words, with the positional offset and the syntactic relation
        ("previous-token, syntactic (nsubj)"); "" for none."""
        out = np.full(self.shape, "", dtype=object)
        for (layer, head), roles in np.ndenumerate(self.labels):
            words = []
            for role in roles:
                if role == "positional":
                    role += f" ({int(self.positional_offset[layer, head]):+d})"
                elif role == "syntactic" and self.syntactic_relation[layer, head]:
                    role += f" ({self.syntactic_relation[layer, head]})"
                words.append(role)
            out[layer, head] = ", ".join(words)
        return out

    def counts(self) -> dict[str, int]:
        """How many heads carry each role (a head may carry several), and how many have none."""
        return {role: int(self.heads_with(role).sum()) for role in [*self.scores, NO_ROLE]}

    def to_json(self) -> dict:
        def grid(values):
            return [[None if v is None or (isinstance(v, float) and np.isnan(v)) else v for v in row]
                    for row in values.tolist()]

        return {"roles": {name: m.to_json() for name, m in self.scores.items()},
                "thresholds": self.thresholds, "labels": [[list(t) for t in row] for row in self.labels.tolist()],
                "counts": self.counts(), "positional_offset": grid(self.positional_offset),
                "syntactic_relation": grid(self.syntactic_relation), "probe_ids": self.probe_ids.tolist(),
                "syntactic_profile": None if self.profile is None else self.profile.to_json(), **self.meta}

    @classmethod
    def from_json(cls, obj: dict) -> RoleReport:
        def grid(rows, dtype):
            return np.array([[np.nan if v is None and dtype is float else v for v in row] for row in rows],
                            dtype=dtype)

        known = {"roles", "thresholds", "labels", "counts", "positional_offset", "syntactic_relation",
                 "probe_ids", "syntactic_profile"}
        return cls({name: ScoreMap.from_json(m) for name, m in obj["roles"].items()}, dict(obj["thresholds"]),
                   grid(obj["positional_offset"], float), grid(obj["syntactic_relation"], object),
                   np.array(obj["probe_ids"]), meta={k: v for k, v in obj.items() if k not in known})


def calibration_stats(stats: RoleStats, block: int, probs: torch.Tensor, valid: torch.Tensor,
                      sink_keys: torch.Tensor, causal: bool) -> None:
    """Add one layer's previous-token, sink, offset and entropy sums over real rows. probs (B, H, T, T)."""
    valid = valid.to(probs.device)
    stats.add("previous", block, *previous_token(probs, valid))
    stats.add("sink", block, *sink_mass(probs, valid, sink_keys.to(probs.device)))
    stats.add_offsets(block, *offset_histogram(probs, valid, stats.window))
    stats.add("broad", block, *normalised_entropy(probs, valid, causal))


def probe_stats(stats: RoleStats, block: int, probs: torch.Tensor, probes: Probes) -> None:
    """Add one layer's duplicate and induction stripe sums over the probes' second blocks. probs (B, H, T, T)."""
    duplicate, induction, rows = repeat_stripes(probs, probes.start, probes.n)
    stats.add("duplicate", block, duplicate, rows)
    stats.add("induction", block, induction, rows)


def sink_positions(input_ids: torch.Tensor, valid: torch.Tensor, special: torch.Tensor | None,
                   causal: bool) -> torch.Tensor:
    """(B, T) bool: each row's first real position, plus (encoders) its real special tokens ([SEP], ...)."""
    first = torch.zeros_like(valid)
    first[torch.arange(len(valid)), valid.int().argmax(-1)] = True
    if causal or special is None:
        return first
    return first | (special.bool() & valid)


def special_mask(tokenizer, input_ids: torch.Tensor) -> torch.Tensor | None:
    if tokenizer is None:
        return None
    return torch.isin(input_ids, torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=input_ids.dtype))


def head_roles(model, tokenizer, calib: Sequence[dict], spec: RoleSpec | None = None, *,
               texts: Sequence[str] | None = None, mask: HeadMask | None = None,
               progress: Callable[[float, str], None] | None = None) -> RoleReport:
    """Score every head on every role (module doc).

    model       any supported model (never hooked: each pass runs on a private copy)
    tokenizer   its tokenizer (probe frame and ordinary tokens; None: the config's ids, every id ordinary)
    calib       calibration batches (input_ids, attention_mask (B, T), ...): read when ``texts`` is None
    texts       raw calibration texts: parsed for the syntactic role, and their capture read for the others
    mask        heads gated off (NaN, like cut heads)
    """
    spec = spec or RoleSpec()
    params = spec.resolved()
    adapter = adapt(model)
    causal = adapter.causal
    n_blocks, n_heads = adapter.grid_shape
    stats = RoleStats(n_blocks, n_heads, list(adapter.layer_to_block), spec.window)
    report = progress or (lambda fraction, message: None)

    def live_blocks(live_layers: torch.Tensor) -> np.ndarray:
        live = np.ones((n_blocks, n_heads), dtype=bool)
        for layer, block in enumerate(adapter.layer_to_block):
            live[block] &= live_layers[layer].numpy()
        return live

    # -- probes: duplicate and induction stripes ------------------------------------------------------------
    report(0.0, "probe pass")
    probes = make_probes(model, tokenizer, spec.probe_length, spec.probe_rows, spec.seed, causal)
    first_probe: list[np.ndarray] = []

    def on_probe_layer(layer: int, probs: torch.Tensor) -> None:
        probe_stats(stats, adapter.layer_to_block[layer], probs, probes)
        first_probe.append(probs[0].float().cpu().numpy())

    _, live = stream_attention(model, probes.batch, on_probe_layer, mask)   # it places the inputs
    stats.add_live(live_blocks(live))

    # -- calibration: token-level statistics (and arcs when texts can be parsed) ----------------------------
    profile = None
    if texts is not None and spec.parser is not None:
        report(0.2, "parsing the calibration texts")
        parses = parse_dataset(list(texts), spec.parser)

        def on_capture(batch: dict, maps) -> None:
            valid = batch["attention_mask"].bool().cpu()
            sinks = sink_positions(batch["input_ids"].cpu(), valid, batch["special_tokens_mask"], causal)
            for layer, probs in enumerate(maps.probs):
                calibration_stats(stats, adapter.layer_to_block[layer], probs, valid, sinks, causal)
            stats.add_live(live_blocks(maps.live))

        arcs = iter_arcs(model, tokenizer, parses, mask, spec.max_length, on_capture=on_capture,
                         progress=lambda f, m: report(0.3 + 0.7 * f, m))
        profile = SyntacticProfile.from_arcs(aggregate_arcs(arcs))
    else:
        if not calib:
            raise RoleError("Head roles need calibration data: give calibration batches or texts.")
        for index, batch in enumerate(calib):
            report(0.2 + 0.8 * index / len(calib), f"calibration batch {index + 1}/{len(calib)}")
            valid = batch["attention_mask"].bool()
            sinks = sink_positions(batch["input_ids"], valid, special_mask(tokenizer, batch["input_ids"]), causal)
            _, live = stream_attention(
                model, model_inputs(batch),
                lambda layer, probs, v=valid, s=sinks: calibration_stats(stats, adapter.layer_to_block[layer],
                                                                         probs, v, s, causal), mask)
            stats.add_live(live_blocks(live))
    report(1.0, "scoring roles")
    return build_report(stats, profile, spec, params, probes, np.stack(first_probe),
                        {"model_family": adapter.family, "causal": causal, "mask_pruned": None if mask is None
                         else int((~mask.keep_bool()).sum())})


def build_report(stats: RoleStats, profile, spec: RoleSpec, params: dict, probes: Probes,
                 probe_attention: np.ndarray | None = None, meta: dict | None = None) -> RoleReport:
    """RoleReport of accumulated statistics: every role scored, NaN outside ``stats.live``."""
    live = stats.live if stats.live is not None else np.ones((stats.n_blocks, stats.n_heads), dtype=bool)
    scores, thresholds = {}, {}
    for name, role in ROLES.items():
        values = np.where(live, role.score(stats, profile, **params[name]), np.nan)
        scores[name] = ScoreMap(values, name, params[name], {"kind": "role"})
        thresholds[name] = float(params[name]["threshold"])
    offsets = np.where(live, Positional.offsets(stats), np.nan)
    relation = Syntactic().relation(stats, profile, params["syntactic"]["min_arcs"])
    relation[~live] = None
    run = {"probe_length": probes.n, "probe_rows": int(probes.input_ids.shape[0]), "seed": spec.seed,
           "parser": spec.parser if profile is not None else None, "window": spec.window,
           "versions": versions(), **(meta or {})}
    return RoleReport(scores, thresholds, offsets, relation, probes.input_ids[0].numpy(), probe_attention, profile,
                      run)
