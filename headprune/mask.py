"""HeadMask: which heads are kept, as an (n_blocks x n_heads) grid in original head ids.

1 keeps a head, 0 prunes it; values in between scale the head's output (soft gates, differentiable).
On disk a mask is ``{"pruned": {"<layer>": [head, ...]}}`` (0-based), the dict shape the old
``prune_heads`` took; ``"shape": [L, H]`` is written too so a file says which model it fits.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .errors import MaskError


class HeadMask:
    def __init__(self, values: torch.Tensor):
        values = torch.as_tensor(values, dtype=torch.float32)
        if values.ndim != 2:
            raise MaskError(f"A head mask is a 2-D grid (layers x heads); got shape {tuple(values.shape)}.")
        if torch.isnan(values).any() or (values < 0).any() or (values > 1).any():
            raise MaskError("Head-mask values must lie in [0, 1] (1 = keep, 0 = prune).")
        self.values = values

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
            try:
                layer = int(layer_key)
            except (TypeError, ValueError):
                raise MaskError(
                    f"Mask layer '{layer_key}' is not an integer; layers are 0..{n_layers - 1}.") from None
            if not 0 <= layer < n_layers:
                raise MaskError(f"Mask names layer {layer}, but this model has layers 0..{n_layers - 1}.")
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
    def from_json(cls, obj: dict, shape: tuple[int, int]) -> HeadMask:
        if not isinstance(obj, dict) or "pruned" not in obj:
            raise MaskError('A mask file is a JSON object {"pruned": {"<layer>": [head, ...]}} (0-based).')
        if "shape" in obj and tuple(obj["shape"]) != tuple(shape):
            raise MaskError(f"Mask was made for a {obj['shape'][0]}x{obj['shape'][1]} model; "
                            f"this model is {shape[0]}x{shape[1]} (layers x heads).")
        return cls.from_pruned(obj["pruned"], shape)

    @classmethod
    def load(cls, path: str | Path, shape: tuple[int, int]) -> HeadMask:
        path = Path(path)
        if not path.is_file():
            raise MaskError(f"Mask file not found: {path}")
        try:
            obj = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise MaskError(f"Mask file {path} is not valid UTF-8 JSON ({exc}).") from exc
        return cls.from_json(obj, shape)

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

    def to_json(self) -> dict:
        return {"pruned": {str(k): v for k, v in self.pruned().items()}, "shape": list(self.shape)}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1), encoding="utf-8")

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
        return HeadMask(values)

    def prune(self, layer: int, head: int) -> HeadMask:
        return self._set(layer, head, 0.0)

    def restore(self, layer: int, head: int) -> HeadMask:
        return self._set(layer, head, 1.0)

    def __and__(self, other: HeadMask) -> HeadMask:
        return HeadMask(torch.minimum(self.values, other.values))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HeadMask) and torch.equal(self.values, other.values)

    def __hash__(self) -> int:
        return hash(tuple(self.values.flatten().tolist()))

    def __repr__(self) -> str:
        return f"HeadMask({self.shape[0]}x{self.shape[1]}, pruned={self.n_pruned})"
