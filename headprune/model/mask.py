"""HeadMask: which heads are kept, as an (n_blocks x n_heads) grid in original head ids.

1 keeps a head, 0 prunes it; values in between scale the head's output (soft gates, differentiable).
On disk a mask is ``{"pruned": {"<layer>": [head, ...]}}`` (0-based), the dict shape the old
``prune_heads`` took; ``"shape": [L, H]`` is written too so a file says which model it fits. With grouped-query
attention a file may also (or instead) name whole key/value groups: ``{"pruned_groups": {"<layer>": [g, ...]}}``
prunes every query head of group g (heads h with h // (H / H_kv) == g); the grid itself stays layers x query heads.
A tuned mask (Kwon et al. 2022's mask tuning, ``criteria.kwon``) also carries real-valued scales of kept heads,
``"scales": {"<layer>": {"<head>": s}}`` (heads not named keep scale 1): the gate of a kept head is its scale, so a
head's output is multiplied by s (any finite real; > 1 and < 0 included). ``values`` stays the keep/prune grid
(every view below reads it); ``gates`` = values x scales is what ``gating`` applies. Files without "scales" load
as before.
A mask written with SAP's whole-layer rule (``criteria.sap.layer_rule_json``) also names
``"dropped_layers": [layer, ...]``: layers skipped whole (their heads are pruned in ``"pruned"`` too);
:func:`dropped_layers` reads them, and commands that apply a mask apply them (``evaluate`` skips those layers,
``prune`` records them in the saved model).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..errors import MaskError
from ..outdir import write_atomic
from ..userinput import (
    MAX_FILE_BYTES,
    MAX_JSON_DEPTH,
    is_dir,
    json_depth,
    parse_user_json,
    read_user_bytes,
    user_path,
)

MASK_ACCEPTED = 'a JSON file holding {"pruned": {"<layer>": [head, ...]}}'


def mask_json(raw: bytes, source: str, kind: str):
    """The JSON value of a mask file's bytes, or MaskError naming ``source``: not UTF-8 JSON, or nested past
    ``MAX_JSON_DEPTH`` (refused before parsing: ``userinput.parse_user_json``)."""
    try:
        text = raw.decode("utf-8")
        if json_depth(text) > MAX_JSON_DEPTH:
            return parse_user_json(text, source, MASK_ACCEPTED, error=MaskError)   # raises, naming the depth
        return json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MaskError(f"{source} is not {kind} ({exc}). Accepted: {MASK_ACCEPTED}.") from None


class HeadMask:
    def __init__(self, values: torch.Tensor, scales: torch.Tensor | None = None):
        values = torch.as_tensor(values, dtype=torch.float32)
        if values.ndim != 2:
            raise MaskError(f"A head mask is a 2-D grid (layers x heads); got shape {tuple(values.shape)}.")
        if torch.isnan(values).any() or (values < 0).any() or (values > 1).any():
            raise MaskError("Head-mask values must lie in [0, 1] (1 = keep, 0 = prune).")
        if scales is not None:
            scales = torch.as_tensor(scales, dtype=torch.float32)
            if tuple(scales.shape) != tuple(values.shape):
                raise MaskError(f"Head scales of shape {tuple(scales.shape)} do not fit the mask's "
                                f"{tuple(values.shape)} grid.")
            if not torch.isfinite(scales).all():
                raise MaskError("Head scales must be finite numbers.")
            # a pruned head has no scale; an all-ones grid is no scaling at all (a plain mask compares equal)
            scales = torch.where(values == 0, torch.ones_like(scales), scales)
            if bool((scales == 1).all()):
                scales = None
        self.values = values
        self.scales = scales

    # -- construction -------------------------------------------------------------------------------------
    @classmethod
    def ones(cls, shape: tuple[int, int]) -> HeadMask:
        return cls(torch.ones(shape))

    @classmethod
    def from_pruned(cls, pruned: dict, shape: tuple[int, int]) -> HeadMask:
        n_layers, n_heads = shape
        values = torch.ones(shape)
        if not isinstance(pruned, dict):
            raise MaskError('A mask is {"pruned": {"<layer>": [head, ...]}}; "pruned" must be an object.')
        for layer_key, heads in pruned.items():
            layer = cls._layer_index(layer_key, n_layers)
            if not isinstance(heads, (list, tuple)):
                raise MaskError(f"Mask layer {layer}: expected a list of head indices, got {heads!r}.")
            for head in heads:
                if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < n_heads:
                    raise MaskError(
                        f"Mask names head {head!r} in layer {layer}, but each layer has heads 0..{n_heads - 1}."
                    )
                values[layer, head] = 0.0
        return cls(values)

    @classmethod
    def from_json(cls, obj: dict, shape: tuple[int, int], groups: torch.Tensor | None = None) -> HeadMask:
        """Mask from ``{"pruned": {...}}``, ``{"pruned_groups": {...}}`` or both (their union).

        ``pruned_groups`` names grouped-query-attention key/value groups, ``{"<layer>": [group, ...]}``: every
        query head of a named group is pruned. ``groups`` (n_blocks, n_heads) gives each query head's group
        (``ModelAdapter.group_grid()``); without it every head is its own group (multi-head attention).
        """
        if not isinstance(obj, dict) or not ({"pruned", "pruned_groups"} & obj.keys()):
            raise MaskError('A mask file is a JSON object {"pruned": {"<layer>": [head, ...]}} (0-based), '
                            'and/or {"pruned_groups": {"<layer>": [key/value group, ...]}}.')
        if "shape" in obj and tuple(obj["shape"]) != tuple(shape):
            raise MaskError(f"Mask was made for a {obj['shape'][0]}x{obj['shape'][1]} model; "
                            f"this model is {shape[0]}x{shape[1]} (layers x heads).")
        mask = cls.from_pruned(obj.get("pruned", {}), shape)
        if "pruned_groups" in obj:
            mask = mask & cls.from_pruned_groups(obj["pruned_groups"], shape, groups)
        if obj.get("scales"):
            mask = mask.with_scales(cls.scales_from_json(obj["scales"], mask))
        return mask

    @classmethod
    def scales_from_json(cls, scales: dict, mask: HeadMask) -> torch.Tensor:
        """The (n_blocks, n_heads) scale grid of ``{"<layer>": {"<head>": s}}`` (1 where not named); MaskError
        naming the entry when a layer or head is out of range, a head named is pruned, or s is not a finite number."""
        grid = torch.ones(mask.shape)
        if not isinstance(scales, dict):
            raise MaskError('"scales" must be an object {"<layer>": {"<head>": scale}}.')
        for layer_key, heads in scales.items():
            layer = cls._layer_index(layer_key, mask.shape[0])
            if not isinstance(heads, dict):
                raise MaskError(f'"scales" layer {layer}: expected an object {{"<head>": scale}}, got {heads!r}.')
            for head_key, value in heads.items():
                head = int(head_key) if str(head_key).isdigit() else -1
                if not 0 <= head < mask.shape[1]:
                    raise MaskError(f'"scales" layer {layer} names head {head_key!r}; heads are '
                                    f"0..{mask.shape[1] - 1}.")
                if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                    raise MaskError(f'"scales" of head ({layer}, {head}) is {value!r}; accepted: a finite number.')
                if mask.values[layer, head] == 0:
                    raise MaskError(f'"scales" names head ({layer}, {head}), which the mask prunes; only kept heads '
                                    "carry a scale.")
                grid[layer, head] = float(value)
        return grid

    @classmethod
    def from_pruned_groups(cls, pruned_groups: dict, shape: tuple[int, int],
                           groups: torch.Tensor | None = None) -> HeadMask:
        """Prune every query head of the named key/value groups ``{"<layer>": [group, ...]}``."""
        if groups is None:
            groups = torch.arange(shape[1]).expand(shape)
        n_groups = [int(row.max()) + 1 for row in groups]
        checked: dict[str, list[int]] = {}
        for layer_key, names in (pruned_groups or {}).items() if isinstance(pruned_groups, dict) else [(None, 0)]:
            if layer_key is None:
                raise MaskError('"pruned_groups" must be an object {"<layer>": [group, ...]}.')
            layer = cls._layer_index(layer_key, shape[0])
            if not isinstance(names, (list, tuple)):
                raise MaskError(f"Mask layer {layer}: expected a list of key/value group indices, got {names!r}.")
            for group in names:
                if not isinstance(group, int) or isinstance(group, bool) or not 0 <= group < n_groups[layer]:
                    raise MaskError(f"Mask names key/value group {group!r} in layer {layer}, but that layer has "
                                    f"groups 0..{n_groups[layer] - 1}.")
                checked.setdefault(str(layer), []).extend(
                    int(h) for h in (groups[layer] == group).nonzero().flatten().tolist())
        return cls.from_pruned(checked, shape)

    @staticmethod
    def _layer_index(layer_key, n_layers: int) -> int:
        try:
            layer = int(layer_key)
        except (TypeError, ValueError):
            raise MaskError(f"Mask layer '{layer_key}' is not an integer; layers are 0..{n_layers - 1}.") from None
        if not 0 <= layer < n_layers:
            raise MaskError(f"Mask names layer {layer}, but this model has layers 0..{n_layers - 1}.")
        return layer

    @classmethod
    def load(cls, path: str | Path, shape: tuple[int, int], groups: torch.Tensor | None = None) -> HeadMask:
        return cls.from_json(cls.read_file(path), shape, groups)

    @staticmethod
    def read_file(path: str | Path):
        """The JSON object in mask file ``path``, unchecked against any model (the CLI reads it before loading one).

        Raises MaskError when the path is a folder, missing, or not UTF-8 JSON.
        """
        path = user_path(str(path), "Mask file", MASK_ACCEPTED, MaskError)
        if is_dir(path):
            raise MaskError(f"Mask file {path} is a folder; give the JSON file, e.g. {path / 'mask.json'}, holding "
                            '{"pruned": {"<layer>": [head, ...]}}.')
        # the one safe reader: a FIFO or a device is refused before it is opened, the size and the nesting bounded
        return mask_json(read_user_bytes(path, "Mask file", MASK_ACCEPTED, error=MaskError), f"Mask file {path}",
                         "valid UTF-8 JSON")

    @classmethod
    def from_bytes(cls, raw: bytes, name: str, shape: tuple[int, int],
                   groups: torch.Tensor | None = None) -> HeadMask:
        """Mask from the bytes of an uploaded or pasted JSON mask called ``name`` (as :meth:`from_json` reads it).

        Raises MaskError naming ``name`` when the bytes are not UTF-8 JSON or not a mask of this shape.
        """
        if len(raw) > MAX_FILE_BYTES:
            raise MaskError(f"{name} is {len(raw):,} bytes, over the {MAX_FILE_BYTES:,} bytes read. Accepted: "
                            f"{MASK_ACCEPTED}.")
        return cls.from_json(mask_json(raw, name, "UTF-8 JSON"), shape, groups)

    # -- views --------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.values.shape)

    def pruned(self) -> dict[int, list[int]]:
        """{layer: [heads]} of heads whose gate is exactly 0."""
        out: dict[int, list[int]] = {}
        for layer, head in (self.values == 0).nonzero().tolist():
            out.setdefault(layer, []).append(head)
        return out

    @property
    def gates(self) -> torch.Tensor:
        """What gating multiplies each head's output by: 0 for a pruned head, its scale (default 1) for a kept one."""
        return self.values if self.scales is None else self.values * self.scales

    @property
    def is_scaled(self) -> bool:
        return self.scales is not None

    def with_scales(self, scales: torch.Tensor | None) -> HeadMask:
        """This keep/prune grid with ``scales`` (None: unscaled)."""
        return HeadMask(self.values, scales)

    def scales_json(self) -> dict:
        """{"<layer>": {"<head>": s}} of the kept heads whose scale is not 1 (empty when unscaled)."""
        if self.scales is None:
            return {}
        out: dict[str, dict[str, float]] = {}
        for layer, head in ((self.scales != 1) & (self.values != 0)).nonzero().tolist():
            out.setdefault(str(layer), {})[str(head)] = float(self.scales[layer, head])
        return out

    def to_json(self) -> dict:
        obj = {"pruned": {str(k): v for k, v in self.pruned().items()}, "shape": list(self.shape)}
        if self.scales is not None:
            obj["scales"] = self.scales_json()
        return obj

    def save(self, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(self.to_json(), indent=1))   # whole or not at all

    @property
    def n_pruned(self) -> int:
        return int((self.values == 0).sum())

    @property
    def n_kept(self) -> int:
        return self.values.numel() - self.n_pruned

    @property
    def is_binary(self) -> bool:
        return bool(((self.values == 0) | (self.values == 1)).all())

    def keep_bool(self) -> torch.Tensor:
        return self.values != 0

    # -- edits (return new masks; masks are values, not shared state) --------------------------------------
    def _set(self, layer: int, head: int, value: float) -> HeadMask:
        n_layers, n_heads = self.shape
        if not (0 <= layer < n_layers and 0 <= head < n_heads):
            raise MaskError(f"No head ({layer}, {head}): layers are 0..{n_layers - 1}, heads 0..{n_heads - 1}.")
        values = self.values.clone()
        values[layer, head] = value
        return HeadMask(values, self.scales)

    def prune(self, layer: int, head: int) -> HeadMask:
        return self._set(layer, head, 0.0)

    def restore(self, layer: int, head: int) -> HeadMask:
        return self._set(layer, head, 1.0)

    def __and__(self, other: HeadMask) -> HeadMask:
        """Heads kept by both; a head scaled in either keeps the product of its scales."""
        if self.scales is None and other.scales is None:
            scales = None
        else:
            scales = (torch.ones(self.shape) if self.scales is None else self.scales) * \
                (torch.ones(self.shape) if other.scales is None else other.scales)
        return HeadMask(torch.minimum(self.values, other.values), scales)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadMask) and torch.equal(self.gates, other.gates) \
            and torch.equal(self.values, other.values)

    def __hash__(self) -> int:
        return hash(tuple(self.gates.flatten().tolist()))

    def __repr__(self) -> str:
        scaled = f", scaled={int(((self.scales != 1) & (self.values != 0)).sum())}" if self.scales is not None else ""
        return f"HeadMask({self.shape[0]}x{self.shape[1]}, pruned={self.n_pruned}{scaled})"


def dropped_layers(obj: dict, n_layers: int) -> list[int]:
    """The layers a mask file drops whole (SAP's layer rule; module doc), sorted; [] when it names none.

    Raises MaskError when ``"dropped_layers"`` is not a list of layer indices 0..n_layers-1.
    """
    layers = obj.get("dropped_layers") or [] if isinstance(obj, dict) else []
    if not isinstance(layers, list) or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < n_layers
                                               for x in layers):
        raise MaskError(f'"dropped_layers" must be a list of layer indices 0..{n_layers - 1} (SAP\'s whole-layer '
                        f"rule); got {layers!r}.")
    return sorted(set(layers))
