"""What each head role reads off captured attention: sums and counts per head, one layer at a time.

Every function takes one layer's probabilities ``probs`` (B, H, T, T) -- row i is query i, column j key j, padded
rows and columns zero, as ``headprune.model.capture.stream_attention`` hands them over -- and returns sums over the
rows that count, with how many rows that was, so layers, batches and the tied layers of ALBERT add up before one
division. :class:`RoleStats` holds the running totals per attention block (the HeadMask grid).

Calibration texts (real sentences):
    previous-token   Σ_i A[i, i−1]                        over real rows i ≥ 1 whose key i−1 is real
    sink             Σ_i Σ_{j ∈ S} A[i, j]                over real rows; S = first position (+ special tokens)
    offsets          histogram of argmax_j A[i, j] − i    over real rows, offsets −W..W (others not binned)
    broad            Σ_i H(A[i, ·]) / log k_i             over real rows attending k_i ≥ 2 real keys
Probes ([BOS] + r + r, a block r of n tokens from position s):
    duplicate        Σ_i A[i, i−n]                        over the second block i = s+n .. s+2n−1
    induction        Σ_i A[i, i−n+1]                      over the same rows
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..criteria.onepass import entropy_terms

OFFSET_WINDOW = 8   # the positional role bins argmax offsets −8..+8: fixed offsets further away are not positional


def previous_token(probs: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(H,) Σ A[i, i−1] over real rows i ≥ 1 with a real key i−1, and how many rows that is."""
    rows = (valid[:, 1:] & valid[:, :-1]).to(probs.dtype)                 # (B, T-1): query i = 1..T-1
    below = probs.diagonal(offset=-1, dim1=-2, dim2=-1)                    # (B, H, T-1): A[i, i-1]
    return (below * rows[:, None, :]).sum((0, 2)), int(rows.sum())


def sink_mass(probs: torch.Tensor, valid: torch.Tensor, sink_keys: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(H,) Σ over real rows of the attention on the ``sink_keys`` (B, T) positions, and the number of rows."""
    mass = (probs * sink_keys[:, None, None, :].to(probs.dtype)).sum(-1)   # (B, H, T)
    rows = valid.to(probs.dtype)
    return (mass * rows[:, None, :]).sum((0, 2)), int(rows.sum())


def offset_histogram(probs: torch.Tensor, valid: torch.Tensor, window: int = OFFSET_WINDOW
                     ) -> tuple[torch.Tensor, int]:
    """(H, 2W+1) counts of real rows whose strongest key is at offset −W..W from the query, and the row count."""
    b, h, t, _ = probs.shape
    offsets = probs.argmax(-1) - torch.arange(t, device=probs.device)[None, None, :]   # (B, H, T)
    binned = (offsets.abs() <= window) & valid[:, None, :]
    index = (torch.arange(h, device=probs.device)[None, :, None] * (2 * window + 1) + offsets + window)[binned]
    counts = torch.bincount(index, minlength=h * (2 * window + 1)).view(h, 2 * window + 1)
    return counts.to(torch.float64), int(valid.sum())


def attended_keys(valid: torch.Tensor, causal: bool) -> torch.Tensor:
    """(B, T): how many real keys row i can attend -- all real tokens, or those up to i when ``causal``."""
    real = valid.to(torch.int64)
    counts = real.cumsum(-1) if causal else real.sum(-1, keepdim=True).expand_as(real)
    return counts * real


def normalised_entropy(probs: torch.Tensor, valid: torch.Tensor, causal: bool) -> tuple[torch.Tensor, int]:
    """(H,) Σ over real rows with k_i ≥ 2 attendable keys of H(A[i, ·]) / log k_i, and how many rows that is.

    H is ``criteria.onepass.entropy_terms`` form A (−Σ a log a, 0 log 0 = 0), the entropy AE and AD read. Each row
    is divided by its own maximum, log k_i, so a head spreading evenly over what it may see scores 1 in an encoder
    and in a causal decoder alike (AD's 1/(n log n) would give a uniform causal head log(n!)/(n log n), 0.75 at
    n = 40).
    """
    keys = attended_keys(valid, causal)
    rows = keys >= 2
    entropy = entropy_terms(probs.to(torch.float64), "A", 0.0).sum(-1)           # (B, H, T)
    share = entropy / torch.log(keys.clamp(min=2)).to(torch.float64)[:, None, :]
    return (share * rows[:, None, :]).sum((0, 2)), int(rows.sum())


def repeat_stripes(probs: torch.Tensor, start: int, n: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(H,) Σ A[i, i−n] (duplicate) and (H,) Σ A[i, i−n+1] (induction) over the second block of a probe whose first
    block of ``n`` tokens starts at ``start``, and the number of rows (B·n)."""
    rows = torch.arange(start + n, start + 2 * n, device=probs.device)
    second = probs[:, :, rows, :]                                          # (B, H, n, T)
    duplicate = second.gather(-1, (rows - n).expand(*second.shape[:2], n)[..., None]).squeeze(-1)
    induction = second.gather(-1, (rows - n + 1).expand(*second.shape[:2], n)[..., None]).squeeze(-1)
    return duplicate.sum((0, 2)), induction.sum((0, 2)), probs.shape[0] * n


@dataclass
class RoleStats:
    """Running sums (n_blocks, H) and row counts (n_blocks,) of every statistic (module doc), per attention block."""

    n_blocks: int
    n_heads: int
    layer_to_block: list[int]
    window: int = OFFSET_WINDOW
    sums: dict[str, np.ndarray] = field(default_factory=dict)
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    offsets: np.ndarray | None = None        # (n_blocks, H, 2W+1) counts
    live: np.ndarray | None = None           # (n_blocks, H) bool: present and not gated, in every pass

    def add(self, name: str, block: int, values: torch.Tensor, count: int) -> None:
        if name not in self.sums:
            self.sums[name] = np.zeros((self.n_blocks, self.n_heads))
            self.rows[name] = np.zeros(self.n_blocks)
        self.sums[name][block] += values.detach().double().cpu().numpy()
        self.rows[name][block] += count

    def add_offsets(self, block: int, counts: torch.Tensor, count: int) -> None:
        if self.offsets is None:
            self.offsets = np.zeros((self.n_blocks, self.n_heads, 2 * self.window + 1))
            self.rows["offsets"] = np.zeros(self.n_blocks)
        self.offsets[block] += counts.cpu().numpy()
        self.rows["offsets"][block] += count

    def add_live(self, live: np.ndarray) -> None:
        self.live = live.copy() if self.live is None else self.live & live

    def mean(self, name: str) -> np.ndarray:
        """(n_blocks, H) mean of statistic ``name`` per row (NaN where no row counted)."""
        if name not in self.sums:
            return np.full((self.n_blocks, self.n_heads), np.nan)
        rows = self.rows[name][:, None]
        return np.divide(self.sums[name], rows, out=np.full_like(self.sums[name], np.nan), where=rows > 0)

    def offset_shares(self) -> np.ndarray:
        """(n_blocks, H, 2W+1): share of the rows whose strongest key sits at each offset −W..W."""
        if self.offsets is None:
            return np.full((self.n_blocks, self.n_heads, 2 * self.window + 1), np.nan)
        rows = self.rows["offsets"][:, None, None]
        return np.divide(self.offsets, rows, out=np.full_like(self.offsets, np.nan), where=rows > 0)
