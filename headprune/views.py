"""Views that teach, drawn without plotly: every head's attention as ONE image, and a text coloured by loss change.

A view takes arrays, never a model (as bertviz's ``head_view`` takes attention tensors): the dashboard captures the
attention (``model.capture``) or compares the losses (``evaluation.example``) and hands the numbers here.

``head_atlas``: one thumbnail per head, L rows × H columns, in a single RGB image (numpy, encoded as PNG with the
standard library's zlib): 144 heads are one picture, not 144 figures. A thumbnail is the head's T × T attention
(query rows, key columns), resampled to ``cell`` pixels by nearest neighbour and scaled by the head's own maximum
(a sharp head and a diffuse one both show their pattern; the hover says the maximum). A pruned head is drawn in grey
at a third of the contrast: what it would look at, greyed. A head with no attention (cut from the weights) is a flat
grey cell.

``loss_change_html``: each token on a background whose colour is Δ_t = ℓ_t(pruned) − ℓ_t(dense) (red: worse
after pruning, blue: better), saturating at ``scale`` nats; the tokens the data's metric scores are underlined
(demo-circuit scores the repeated half only: its first half is there to compare with).
"""

from __future__ import annotations

import base64
import html
import struct
import zlib
from dataclasses import dataclass

import numpy as np

# thumbnail colours: white (no attention) to a deep blue (the head's maximum); pruned heads in greys
LOW = np.array([255, 255, 255], dtype=np.float32)
HIGH = np.array([8, 48, 107], dtype=np.float32)
GREY_LOW = np.array([236, 236, 236], dtype=np.float32)
GREY_HIGH = np.array([150, 150, 150], dtype=np.float32)
EMPTY = np.array([215, 215, 215], dtype=np.uint8)
BACKGROUND = np.array([250, 250, 250], dtype=np.uint8)
SELECTED = np.array([214, 39, 40], dtype=np.uint8)


@dataclass
class Atlas:
    """One image of every head's thumbnail (``head_atlas``) and where each thumbnail sits."""

    image: np.ndarray          # (rows · (cell + gap) + gap, cols · (cell + gap) + gap, 3) uint8
    shape: tuple[int, int]     # (layers, heads)
    cell: int
    gap: int
    peak: np.ndarray           # (L, H) each head's maximum attention (its thumbnail's darkest colour)

    def box(self, layer: int, head: int) -> tuple[int, int, int, int]:
        """(x0, y0, x1, y1) pixel box of the thumbnail of (layer, head), x1/y1 exclusive."""
        x0, y0 = self.gap + head * (self.cell + self.gap), self.gap + layer * (self.cell + self.gap)
        return x0, y0, x0 + self.cell, y0 + self.cell

    def png(self) -> bytes:
        return encode_png(self.image)

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png()).decode()


def _resample(maps: np.ndarray, cell: int) -> np.ndarray:
    """(..., T, T) → (..., cell, cell) by nearest neighbour (a token spans cell / T pixels)."""
    t = maps.shape[-1]
    index = np.minimum((np.arange(cell) * t) // cell, t - 1)
    return maps[..., index[:, None], index[None, :]]


def head_atlas(attention: np.ndarray, live: np.ndarray, *, cell: int = 40, gap: int = 3,
               selected: tuple[int, int] | None = None) -> Atlas:
    """Every head's attention as one image (module doc).

    attention : (L, H, T, T) attention probabilities of one text (query rows, key columns), as captured densely.
    live      : (L, H) bool, False for a head pruned now (drawn greyed).
    selected  : a head outlined in red.
    """
    attention = np.asarray(attention, dtype=np.float32)
    if attention.ndim != 4 or attention.shape[-1] != attention.shape[-2] or attention.shape[-1] == 0:
        raise ValueError(f"attention must be (layers, heads, T, T) with T ≥ 1, got {attention.shape}")
    n_layers, n_heads = attention.shape[:2]
    live = np.asarray(live, dtype=bool).reshape(n_layers, n_heads)
    peak = attention.max(axis=(-1, -2))
    scaled = _resample(attention / np.maximum(peak, 1e-12)[..., None, None], cell)[..., None]   # (L,H,c,c,1)
    colour = np.where(live[..., None, None, None], LOW + (HIGH - LOW) * scaled,
                      GREY_LOW + (GREY_HIGH - GREY_LOW) * scaled)
    colour = np.where((peak > 0)[..., None, None, None], colour, EMPTY.astype(np.float32))
    step = cell + gap
    image = np.empty((gap + n_layers * step, gap + n_heads * step, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    # place the (L, H, c, c) thumbnails with one reshape: rows of cells with their gaps
    tiles = np.full((n_layers, step, n_heads, step, 3), BACKGROUND, dtype=np.uint8)
    tiles[:, :cell, :, :cell] = np.round(colour).astype(np.uint8).transpose(0, 2, 1, 3, 4)
    image[gap:, gap:] = tiles.reshape(n_layers * step, n_heads * step, 3)
    atlas = Atlas(image, (n_layers, n_heads), cell, gap, peak)
    if selected is not None:
        x0, y0, x1, y1 = atlas.box(*selected)
        frame = slice(max(y0 - gap, 0), y1 + gap), slice(max(x0 - gap, 0), x1 + gap)
        inner = image[y0:y1, x0:x1].copy()
        image[frame] = SELECTED
        image[y0:y1, x0:x1] = inner
    return atlas


def encode_png(image: np.ndarray) -> bytes:
    """An (H, W, 3) uint8 image as PNG bytes (8-bit RGB, no filter; zlib from the standard library)."""
    image = np.ascontiguousarray(image, dtype=np.uint8)
    height, width = image.shape[:2]

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = np.concatenate([np.zeros((height, 1), dtype=np.uint8), image.reshape(height, width * 3)], axis=1)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw.tobytes(), 6)) + chunk(b"IEND", b""))


def delta_colour(delta: float, scale: float = 3.0) -> str:
    """Background colour of a loss change: white at 0, red at +scale nats and beyond, blue at −scale."""
    if not np.isfinite(delta):
        return "transparent"
    share = float(min(abs(delta) / scale, 1.0))
    far = (214, 39, 40) if delta > 0 else (31, 119, 180)
    r, g, b = (round(255 + (c - 255) * share) for c in far)
    return f"rgb({r},{g},{b})"


def loss_change_html(tokens: list[str], dense: np.ndarray, pruned: np.ndarray, scored: np.ndarray, *,
                     scale: float = 3.0, selected: int | None = None) -> str:
    """The text as HTML spans, each token after the first on ``delta_colour(pruned − dense)`` with its two losses in
    the hover, the ``scored`` ones underlined; ``selected`` (a position) outlined."""
    spans = []
    for i, token in enumerate(tokens):
        text = html.escape(token) or "&#8203;"   # spaces kept: the strip wraps at them (pre-wrap, below)
        style = "padding:1px 0;border-radius:2px;"
        title = ""
        if np.isfinite(dense[i]):
            delta = float(pruned[i] - dense[i])
            style += f"background:{delta_colour(delta, scale)};"
            title = f"loss {dense[i]:.2f} → {pruned[i]:.2f} nats (Δ {delta:+.2f})"
        if scored[i]:
            style += "border-bottom:2px solid #333;"
        if i == selected:
            style += "outline:2px solid #444;"
        spans.append(f'<span data-pos="{i}" style="{style}" title="{title}">{text}</span>')
    # pre-wrap keeps each token's own spaces and breaks lines at them; overflow-wrap breaks a token longer than the
    # column: the strip fits its column (a 940 px one, a phone's 390 px) instead of running off its edge
    return ('<div style="font-family:monospace;line-height:2;font-size:1.05em;white-space:pre-wrap;'
            'overflow-wrap:anywhere;max-width:100%">' + "".join(spans) + "</div>")
