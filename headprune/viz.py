"""Figures (Plotly) and tables (pandas) of heads, scores, attention and trajectories; no streamlit here.

The dashboard only places these on the page, so every figure is testable and reusable (notebooks, reports).

Colour conventions, the same on every figure:
    * each criterion has one colour (``criterion_color``): its trajectory curve, and the dark end of its heatmap
      scale (``criterion_colorscale``); the random baseline is always grey;
    * score heatmaps colour a head by its **importance rank** within the map (0 = pruned first, 1 = kept longest),
      so maps of criteria with very different value ranges read the same way; hover gives the raw value and rank;
    * pruned heads are neutral grey cells marked with a cross, on every grid.

Grids are drawn blocks x heads with layer 0 at the top. ALBERT's grid has one row: a tied head is one unit shared
by all layers (``tied=True`` labels it so). With grouped-query attention (``groups``: each query head's key/value
group) a thick line separates the groups in every row and the hover names a head's group; ``grid_options(adapter)``
gives every grid the same rows, layer kinds and groups.

Comparisons between criteria (the dashboard's "do criteria agree?" view) draw what ``headprune.scoring`` computes:
rank correlation, the heads kept at a ratio (``ScoreMap.kept_at``) and their Jaccard overlap. This module only
draws: it takes score maps, masks, arcs and trajectories, never a model.
"""

from __future__ import annotations

import colorsys
import html
import math
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.colors as plotly_colors
import plotly.graph_objects as go
import plotly.io as pio

from .criteria import available
from .model.mask import HeadMask
from .model.task import HIGHER_IS_BETTER
from .scoring import ScoreMap, jaccards, rank_correlations

# Okabe-Ito and Tableau hues: distinguishable with colour-blindness and on light and dark backgrounds.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#8C6D31", "#7F3C8D",
           "#3969AC", "#E73F74", "#11A579", "#F2B701", "#80BA5A", "#008695")
RANDOM_COLOR = "#8c8c8c"
PRUNED_COLOR = "#9e9e9e"
KEPT_COLOR = "#2a9d8f"
DENSE_COLOR = "#6c757d"
TOLERANCE_COLOR = "#d1495b"
GROUP_BORDER_COLOR = "#1f1f1f"
WORD_COLOR = "#31333f"          # streamlit's default text colour
UNSEEN_WORD_COLOR = "#bbbbbb"   # words the model did not read (cut by the max length)
CELL_PX = 30          # grid cell height in pixels
HEAD_LABELS = 16      # head numbers written under a grid at most (every other one past 16 heads, ...)
FONT = dict(size=13)


def _hex_to_rgb(color: str) -> tuple[float, float, float]:
    color = color.lstrip("#")
    return tuple(int(color[i:i + 2], 16) / 255 for i in (0, 2, 4))


def _rgb_to_hex(rgb: Sequence[float]) -> str:
    return "#" + "".join(f"{round(min(max(c, 0), 1) * 255):02x}" for c in rgb)


def _mix(color: str, other: str, t: float) -> str:
    a, b = _hex_to_rgb(color), _hex_to_rgb(other)
    return _rgb_to_hex([x + (y - x) * t for x, y in zip(a, b)])


def criterion_color(name: str) -> str:
    """The colour of criterion ``name`` everywhere (stable: assigned by its place in the sorted registry)."""
    base = name.removeprefix("inverse ").split(" ")[0]
    if base == "random":
        return RANDOM_COLOR
    names = [n for n in available() if n != "random"]
    if base in names:
        return PALETTE[names.index(base) % len(PALETTE)]
    # a name outside the registry (e.g. from an old run file): a stable colour from its text
    hue = (sum(map(ord, base)) * 0.61803398875) % 1.0
    return _rgb_to_hex(colorsys.hls_to_rgb(hue, 0.45, 0.65))


def criterion_colorscale(name: str) -> list[list]:
    """Sequential scale: a pale tint of the criterion's colour (pruned first) to a deep shade (kept longest)."""
    color = criterion_color(name)
    return [[0.0, _mix(color, "#ffffff", 0.85)], [0.5, color], [1.0, _mix(color, "#000000", 0.45)]]


# -- labels that survive an export, text readable on any cell ----------------------------------------------------

DARK_TEXT, LIGHT_TEXT = "#111111", "#ffffff"


def _luminance(color: str) -> float:
    """WCAG 2 relative luminance of a "#rrggbb" colour."""
    rgb = _hex_to_rgb(color)
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast_text(background: str) -> str:
    """Dark or white text, whichever has the higher WCAG contrast ratio on ``background``."""
    lum = _luminance(background)
    dark, light = _luminance(DARK_TEXT), _luminance(LIGHT_TEXT)
    return DARK_TEXT if (lum + 0.05) / (dark + 0.05) >= (light + 0.05) / (lum + 0.05) else LIGHT_TEXT


def cell_colors(z: np.ndarray, colorscale, zmin: float | None = None, zmax: float | None = None) -> np.ndarray:
    """The colour each cell of a heatmap with ``colorscale`` (a list of [position, colour] or a plotly name) gets,
    as plotly maps it: z scaled from [zmin, zmax] (the data's range when None); NaN cells are None."""
    scale = plotly_colors.get_colorscale(colorscale) if isinstance(colorscale, str) else colorscale
    scale = [[float(p), _rgb_to_hex([v / 255 for v in plotly_colors.unlabel_rgb(c)]) if c.startswith("rgb") else c]
             for p, c in scale]
    z = np.asarray(z, dtype=float)
    finite = z[np.isfinite(z)]
    low = float(zmin) if zmin is not None else (float(finite.min()) if finite.size else 0.0)
    high = float(zmax) if zmax is not None else (float(finite.max()) if finite.size else 1.0)
    out = np.empty(z.shape, dtype=object)
    for index, value in np.ndenumerate(z):
        out[index] = None if not np.isfinite(value) else \
            _sample_scale(scale, 0.5 if high == low else (value - low) / (high - low))
    return out


def keep_labels(fig: go.Figure) -> go.Figure:
    """Let every axis (tick labels, title) push the margins out as far as it needs, so layer labels, criterion
    names and axis titles are inside the image in every export (PNG, SVG, standalone HTML; titles sit in a top
    margin kept for them). Inside the dashboard plotly's default template is streamlit's, which leaves automargin
    off: the exports cut the L0-L5 labels off at a 10 px margin."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


TITLE_CHARS = 46   # characters of a title line: a half-width column of a 1280 px screen, or a phone, holds them


def plot_text(text) -> str:
    """``text`` (a word, a token, a title) as plotly text that shows it and is no markup: plotly reads a subset of
    HTML in every label, title and hover (``<a href>`` a link to another host, ``<span style>`` any CSS), so a typed
    word such as ``<a href=...>`` would be a link on the page. Its ``&``, ``<`` and ``>`` become entities, which
    plotly shows as the characters."""
    return html.escape(str(text), quote=False)


def wrapped_title(title: str | None, chars: int = TITLE_CHARS) -> tuple[dict | None, int]:
    """A figure title broken into lines of at most ``chars`` characters at spaces (plotly never wraps one: the Roles
    page's probe title was cut at the column's edge), left-aligned, and the top margin its lines need."""
    if not title:
        return None, 10
    lines, line = [], ""
    for word in title.split(" "):
        if line and len(line) + 1 + len(word) > chars:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return dict(text="<br>".join(map(plot_text, lines)), x=0, xanchor="left", font=dict(size=14)), 20 + 18 * len(lines)


# -- head grids ---------------------------------------------------------------------------------------------------

def _layer_labels(n_rows: int, tied: bool, kinds: Sequence[str] | None = None) -> list[str]:
    """Row labels; ``kinds`` (the adapter's ``layer_kinds``: "full"/"sliding" for ModernBERT, Gemma 3, Qwen2)
    tags each row, so local and global layers can be compared at a glance."""
    if tied and n_rows == 1:
        return ["all layers (tied)"]
    return [f"L{i} · {kinds[i]}" if kinds else f"L{i}" for i in range(n_rows)]


def _where(layer: int, tied: bool, kinds: Sequence[str] | None = None) -> str:
    """Hover text naming a grid row."""
    if tied:
        return "all layers"
    return f"layer {layer} ({kinds[layer]} attention)" if kinds else f"layer {layer}"


def grid_options(adapter) -> dict:
    """Keyword arguments drawing a model's head grid: tied rows, per-layer attention kinds and, only under
    grouped-query attention, each query head's key/value group (``ModelAdapter.group_grid``)."""
    return {"tied": adapter.tied, "layer_kinds": adapter.layer_kinds,
            "groups": adapter.group_grid().numpy() if adapter.grouped else None}


def group_borders(groups: np.ndarray) -> list[tuple[float, float, float]]:
    """Vertical segments ``(x, y_top, y_bottom)`` between neighbouring query heads of different key/value groups.

    Consecutive rows with the same border are one segment, so a model whose layers share one layout gets one line
    per border; a layer laid out differently gets its own pieces.
    """
    n_rows, n_heads = groups.shape
    segments = []
    for head in range(1, n_heads):
        differs = groups[:, head] != groups[:, head - 1]
        row = 0
        while row < n_rows:
            if differs[row]:
                end = row
                while end + 1 < n_rows and differs[end + 1]:
                    end += 1
                segments.append((head - 0.5, row - 0.5, end + 0.5))
                row = end + 1
            else:
                row += 1
    return segments


def head_grid(z: np.ndarray, hover: np.ndarray, colorscale, *, tied: bool = False, zmin=None, zmax=None,
              colorbar: dict | None = None, pruned: np.ndarray | None = None, selected: tuple[int, int] | None = None,
              title: str | None = None, showscale: bool = True,
              layer_kinds: Sequence[str] | None = None, groups: np.ndarray | None = None,
              marks: np.ndarray | None = None, roles: np.ndarray | None = None) -> go.Figure:
    """An (L x H) grid of cells with ``hover`` text; pruned cells grey with a cross; ``selected`` outlined;
    ``groups`` (L x H key/value group of each query head, GQA): thick lines between groups, the group in the hover;
    ``marks`` (L x H short role marks, ``RoleReport.marks``) written in the cells, ``roles`` (L x H role names) in
    the hover.

    Heatmap traces do not report clicks to Streamlit's selection events, so a transparent square-marker scatter
    lies over the cells: clicking a cell selects its point, whose ``customdata`` is ``[layer, head]``.
    """
    n_rows, n_heads = z.shape
    if groups is not None:
        hover = np.array([[f"{text}<br>key/value group {int(g)}" for text, g in zip(texts, row)]
                          for texts, row in zip(hover, groups)], dtype=object)
    if roles is not None:
        hover = np.array([[f"{text}<br>roles: {names or 'no clear role'}" for text, names in zip(texts, row)]
                          for texts, row in zip(hover, roles)], dtype=object)
    pruned = np.zeros(z.shape, bool) if pruned is None else pruned
    cell_text = np.where(pruned, "✕", "" if marks is None else marks)
    shown = np.where(pruned, np.nan, z)
    backgrounds = np.where(pruned, PRUNED_COLOR, cell_colors(shown, colorscale, zmin, zmax))
    text_colors = [DARK_TEXT if bg is None else contrast_text(bg) for bg in backgrounds.ravel()]
    fig = go.Figure()
    fig.add_trace(go.Heatmap(z=np.where(pruned, 0.0, np.nan), x=list(range(n_heads)), y=list(range(n_rows)),
                             colorscale=[[0, PRUNED_COLOR], [1, PRUNED_COLOR]], showscale=False, hoverinfo="skip",
                             xgap=2, ygap=2))
    # a grid of a few rows has a short colour bar: a few ticks, or their labels sit on each other (the KV page's)
    colorbar = {"thickness": 12, "len": 0.9, "nticks": int(min(6, max(3, n_rows))), **(colorbar or {})}
    fig.add_trace(go.Heatmap(z=shown, x=list(range(n_heads)), y=list(range(n_rows)), colorscale=colorscale,
                             zmin=zmin, zmax=zmax, showscale=showscale, colorbar=colorbar, hoverinfo="skip",
                             xgap=2, ygap=2))
    rows, cols = np.meshgrid(range(n_rows), range(n_heads), indexing="ij")
    fig.add_trace(go.Scatter(
        x=cols.ravel(), y=rows.ravel(), mode="markers+text",
        text=cell_text.ravel(), textfont=dict(color=text_colors, size=np.where(pruned, 12, 10).ravel().tolist()),
        customdata=np.stack([rows.ravel(), cols.ravel()], axis=1),
        hovertext=hover.ravel(), hoverinfo="text",
        marker=dict(symbol="square", size=CELL_PX - 4, color="rgba(0,0,0,0)"),
        selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1)),
        showlegend=False, name="heads"))
    if selected is not None:
        layer, head = selected
        fig.add_shape(type="rect", x0=head - 0.5, x1=head + 0.5, y0=layer - 0.5, y1=layer + 0.5,
                      line=dict(color="#ff006e", width=3))
    for x, top, bottom in group_borders(groups) if groups is not None else ():
        fig.add_shape(type="line", x0=x, x1=x, y0=top, y1=bottom, line=dict(color=GROUP_BORDER_COLOR, width=4),
                      layer="above", name="key/value group border")
    axis_title = "query head (thick lines: key/value groups)" if groups is not None else "head"
    # every head keeps its tick, at most HEAD_LABELS of them a number (the hover names every head): 32 numbers
    # under a half-width grid ran into each other
    every = math.ceil(n_heads / HEAD_LABELS)
    fig.update_xaxes(title_text=axis_title, tickmode="array", tickvals=list(range(n_heads)),
                     ticktext=[str(h) if h % every == 0 else "" for h in range(n_heads)], showgrid=False,
                     zeroline=False, range=[-0.5, n_heads - 0.5], constrain="domain")
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_rows)), ticktext=_layer_labels(n_rows, tied, layer_kinds),
                     autorange="reversed", showgrid=False, zeroline=False, title_text="layer")
    fig.update_layout(height=max(160, CELL_PX * n_rows + 110), margin=dict(l=10, r=10, t=40 if title else 10, b=40),
                      title=title and plot_text(title), font=FONT, clickmode="event+select", dragmode=False,
                      plot_bgcolor="rgba(0,0,0,0)")
    return keep_labels(fig)


def score_heatmap(score: ScoreMap, *, tied: bool = False, selected: tuple[int, int] | None = None,
                  title: str | None = None, showscale: bool = True,
                  layer_kinds: Sequence[str] | None = None, groups: np.ndarray | None = None,
                  marks: np.ndarray | None = None, roles: np.ndarray | None = None) -> go.Figure:
    """Score map as a grid coloured by importance rank (module doc); hover: layer, head, value, rank."""
    ranks = score.ranks()
    n_live = int(np.sum(~np.isnan(ranks)))
    hover = np.empty(score.shape, dtype=object)
    for (layer, head), value in np.ndenumerate(score.scores):
        where = _where(layer, tied, layer_kinds)
        hover[layer, head] = (f"{where}, head {head}<br>pruned" if np.isnan(value) else
                              f"{where}, head {head}<br>{score.criterion} = {value:.4g}<br>"
                              f"rank {int(ranks[layer, head])} of {n_live} (1 = most important)")
    return head_grid(score.importance(), hover, criterion_colorscale(score.criterion), tied=tied, zmin=0,
                     zmax=1, pruned=np.isnan(score.scores), selected=selected, title=title, showscale=showscale,
                     layer_kinds=layer_kinds, groups=groups, marks=marks, roles=roles,
                     colorbar=dict(tickvals=[0, 1], ticktext=["pruned<br>first", "kept<br>longest"], thickness=12,
                                   len=0.9))


def mask_figure(mask: HeadMask, *, tied: bool = False, selected: tuple[int, int] | None = None,
                score: ScoreMap | None = None, title: str | None = None, cut: HeadMask | None = None,
                layer_kinds: Sequence[str] | None = None, groups: np.ndarray | None = None,
                marks: np.ndarray | None = None, roles: np.ndarray | None = None) -> go.Figure:
    """The head mask as a grid: kept heads coloured (by ``score``'s rank when given), pruned heads grey with ✕.

    ``cut``: heads absent from the loaded weights (0 in ``cut``; a model saved by ``prune``); they are drawn
    pruned whatever ``mask`` says, and their hover says they cannot be restored. A tuned mask's scaled heads
    (``HeadMask.scales``, Kwon et al.'s mask tuning) show "×s" in their cell and their scale in the hover.
    """
    absent = np.zeros(mask.shape, bool) if cut is None else (cut.values == 0).numpy()
    pruned = (mask.values == 0).numpy() | absent
    scales = np.ones(mask.shape) if mask.scales is None else mask.scales.numpy()
    scaled = ~pruned & (scales != 1)
    if scaled.any():   # "×s" after any role mark of the cell
        base = np.full(mask.shape, "", dtype=object) if marks is None else np.asarray(marks, dtype=object)
        marks = np.array([[f"{m} ×{s:.2f}".strip() if on else m for m, s, on in zip(*row)]
                          for row in zip(base, scales, scaled)], dtype=object)
    hover = np.empty(mask.shape, dtype=object)
    for (layer, head), gone in np.ndenumerate(pruned):
        where = _where(layer, tied, layer_kinds)
        state = "pruned — click to restore" if gone else "kept — click to prune"
        if absent[layer, head]:
            state = "cut out of the loaded model — cannot be restored"
        extra = ""
        if scaled[layer, head]:
            extra = f"<br>scaled ×{scales[layer, head]:.4g} (tuned mask: output multiplied by this)"
        if score is not None and not np.isnan(score.scores[layer, head]):
            extra += f"<br>{score.criterion} = {score.scores[layer, head]:.4g}"
        hover[layer, head] = f"{where}, head {head}<br>{state}{extra}"
    if score is not None:
        z = score.importance()
        z = np.where(np.isnan(z), 0.5, z)
        return head_grid(z, hover, criterion_colorscale(score.criterion), tied=tied, zmin=0, zmax=1, pruned=pruned,
                         selected=selected, title=title, showscale=False, layer_kinds=layer_kinds, groups=groups,
                         marks=marks, roles=roles)
    return head_grid(np.ones(mask.shape), hover, [[0, KEPT_COLOR], [1, KEPT_COLOR]], tied=tied, pruned=pruned,
                     selected=selected, title=title, showscale=False, layer_kinds=layer_kinds, groups=groups,
                     marks=marks, roles=roles)


def role_grid(score: ScoreMap, threshold: float, *, tied: bool = False, selected: tuple[int, int] | None = None,
              layer_kinds: Sequence[str] | None = None, groups: np.ndarray | None = None,
              marks: np.ndarray | None = None) -> go.Figure:
    """A role's scores as a grid on an absolute scale (cells at or above ``threshold`` carry the role)."""
    values = score.scores
    hover = np.empty(score.shape, dtype=object)
    for (layer, head), value in np.ndenumerate(values):
        where = _where(layer, tied, layer_kinds)
        hover[layer, head] = (f"{where}, head {head}<br>pruned" if np.isnan(value) else
                              f"{where}, head {head}<br>{score.criterion} = {value:.3f} "
                              f"({'≥' if value >= threshold else '<'} {threshold:g})")
    low = float(min(0.0, np.nanmin(values))) if np.isfinite(values).any() else 0.0
    return head_grid(np.nan_to_num(values, nan=0.0), hover, criterion_colorscale(score.criterion), tied=tied,
                     zmin=low, zmax=1.0, pruned=np.isnan(values), selected=selected, layer_kinds=layer_kinds,
                     groups=groups, marks=marks, colorbar=dict(thickness=12, len=0.9))


def kept_share_figure(curve: Mapping[str, Sequence[float | None]], ratios: Sequence[float],
                      title: str | None = None) -> go.Figure:
    """Share of each role's heads a criterion keeps (y) against the pruning ratio (x); ``kept_curve`` output."""
    fig = go.Figure()
    for i, (role, shares) in enumerate(curve.items()):
        if all(v is None for v in shares):
            continue
        fig.add_trace(go.Scatter(x=[100 * r for r in ratios], y=[None if v is None else 100 * v for v in shares],
                                 mode="lines+markers", name=role, line=dict(color=PALETTE[i % len(PALETTE)])))
    fig.add_trace(go.Scatter(x=[0, 100], y=[100, 0], mode="lines", name="share kept by chance",
                             line=dict(color=RANDOM_COLOR, dash="dot")))
    fig.update_xaxes(title_text="heads pruned (%)", range=[0, 100])
    fig.update_yaxes(title_text="heads of the role kept (%)", range=[0, 102])
    fig.update_layout(height=340, margin=dict(l=10, r=10, t=40 if title else 10, b=40),
                      title=title and plot_text(title), font=FONT)
    return keep_labels(fig)


def kept_share_table(table: Mapping[str, Mapping]) -> pd.DataFrame:
    """Criterion x role: the share (%) of each role's heads kept (``kept_by_role`` output); NaN: no such head."""
    return pd.DataFrame({name: {role: (np.nan if v is None else round(100 * v, 1))
                                for role, v in row["kept_share"].items()} for name, row in table.items()}).T


def clicked_head(selection: Mapping | None) -> tuple[int, int] | None:
    """(layer, head) of the first clicked cell in a Streamlit plotly selection event (None when nothing)."""
    points = (selection or {}).get("points") or []
    for point in points:
        data = point.get("customdata")
        if isinstance(data, Mapping):  # a browser may send an array as {"0": .., "1": ..}
            data = [data[k] for k in sorted(data, key=lambda k: int(k))] if all(str(k).isdigit() for k in data) \
                else None
        for pair in ((data[0], data[1]) if isinstance(data, (list, tuple)) and len(data) >= 2 else None,
                     (point.get("y"), point.get("x"))):
            try:
                return int(round(float(pair[0]))), int(round(float(pair[1])))
            except (TypeError, ValueError):
                continue
    return None



def atlas_figure(uri: str, shape: tuple[int, int], *, hover: np.ndarray, marks: np.ndarray | None = None,
                 tied: bool = False, layer_kinds: Sequence[str] | None = None, cell_px: int = 56) -> go.Figure:
    """Every head's thumbnail (``views.head_atlas``, given as a PNG data URI) under a transparent click layer like
    ``head_grid``'s (``customdata`` = [layer, head], so ``clicked_head`` reads a click), role ``marks`` written on the
    thumbnails. One image and one scatter, whatever the number of heads."""
    n_rows, n_heads = shape
    rows, cols = np.meshgrid(range(n_rows), range(n_heads), indexing="ij")
    fig = go.Figure(go.Scatter(
        x=cols.ravel(), y=rows.ravel(), mode="markers+text", name="heads",
        text=(np.full(shape, "", dtype=object) if marks is None else marks).ravel(), textposition="middle center",
        textfont=dict(color="#d62728", size=13, family="monospace"),
        customdata=np.stack([rows.ravel(), cols.ravel()], axis=1), hovertext=hover.ravel(), hoverinfo="text",
        marker=dict(symbol="square", size=cell_px - 6, color="rgba(0,0,0,0)"),
        selected=dict(marker=dict(opacity=1)), unselected=dict(marker=dict(opacity=1)), showlegend=False))
    fig.add_layout_image(source=uri, xref="x", yref="y", x=-0.5, y=-0.5, sizex=n_heads, sizey=n_rows,
                         sizing="stretch", layer="below", xanchor="left", yanchor="top")
    fig.update_xaxes(title_text="head", tickmode="array", tickvals=list(range(n_heads)), showgrid=False,
                     zeroline=False, range=[-0.5, n_heads - 0.5], constrain="domain")
    fig.update_yaxes(tickmode="array", tickvals=list(range(n_rows)), ticktext=_layer_labels(n_rows, tied, layer_kinds),
                     range=[n_rows - 0.5, -0.5], showgrid=False, zeroline=False, scaleanchor="x", constrain="domain")
    fig.update_layout(height=cell_px * n_rows + 80, width=cell_px * n_heads + 90, margin=dict(l=10, r=10, t=10, b=40),
                      font=FONT, clickmode="event+select", dragmode=False, plot_bgcolor="rgba(0,0,0,0)")
    return fig

# -- comparing criteria -------------------------------------------------------------------------------------------

def rank_correlation(scores: Mapping[str, ScoreMap]) -> pd.DataFrame:
    """``scoring.rank_correlations`` as a table: Spearman's rho between every pair of score maps."""
    names = list(scores)
    return pd.DataFrame(rank_correlations(scores), index=names, columns=names)


def correlation_figure(corr: pd.DataFrame) -> go.Figure:
    """Spearman's rho between criteria as a matrix, each cell's value written in the colour that reads on it."""
    names_x, names_y = list(corr.columns), list(corr.index)
    values = corr.values.astype(float)
    fig = go.Figure(go.Heatmap(z=values, x=names_x, y=names_y, zmin=-1, zmax=1, colorscale="RdBu",
                               hovertemplate="%{y} vs %{x}<br>Spearman ρ = %{z:.3f}<extra></extra>",
                               colorbar=dict(title="ρ", thickness=12)))
    backgrounds = cell_colors(values, "RdBu", -1, 1)
    cells = [(x, y, f"{values[i, j]:.2f}", contrast_text(backgrounds[i, j]))
             for i, y in enumerate(names_y) for j, x in enumerate(names_x) if np.isfinite(values[i, j])]
    fig.add_trace(go.Scatter(x=[c[0] for c in cells], y=[c[1] for c in cells], mode="text",
                             text=[c[2] for c in cells], textfont=dict(color=[c[3] for c in cells]),
                             hoverinfo="skip", showlegend=False, name="values"))
    fig.update_xaxes(title_text="criterion", tickangle=-30, showgrid=False)
    fig.update_yaxes(title_text="criterion", autorange="reversed", showgrid=False)
    fig.update_layout(height=max(260, 46 * len(corr) + 150), margin=dict(l=10, r=10, t=10, b=10), font=FONT,
                      plot_bgcolor="rgba(0,0,0,0)")
    return keep_labels(fig)


def jaccard_table(scores: Mapping[str, ScoreMap], ratio: float) -> pd.DataFrame:
    """``scoring.jaccards`` as a table: the overlap of the sets every pair of criteria keeps at ``ratio``."""
    names = list(scores)
    return pd.DataFrame(jaccards(scores, ratio), index=names, columns=names)


def overlap_figure(scores: Mapping[str, ScoreMap], ratio: float, *, tied: bool = False,
                   layer_kinds: Sequence[str] | None = None, groups: np.ndarray | None = None) -> go.Figure:
    """Per head, how many criteria keep it at ``ratio``; hover lists which."""
    kept = {name: s.kept_at(ratio) for name, s in scores.items()}
    first = next(iter(scores.values()))
    count = np.sum(np.stack(list(kept.values())), axis=0).astype(float)
    pruned = np.isnan(first.scores) & np.all([np.isnan(s.scores) for s in scores.values()], axis=0)
    hover = np.empty(first.shape, dtype=object)
    for (layer, head), n in np.ndenumerate(count):
        keepers = [name for name, k in kept.items() if k[layer, head]] or ["none"]
        where = _where(layer, tied, layer_kinds)
        hover[layer, head] = f"{where}, head {head}<br>kept by {int(n)}/{len(kept)}: {', '.join(keepers)}"
    n = len(kept)
    scale = [[0.0, "#f1f1f1"], [0.5, "#7fb8d8"], [1.0, "#08306b"]]
    return head_grid(count, hover, scale, tied=tied, zmin=0, zmax=n, pruned=pruned, layer_kinds=layer_kinds,
                     groups=groups,
                     colorbar=dict(title="kept by", tickvals=list(range(n + 1)), thickness=12, len=0.9))


def scores_frame(scores: Mapping[str, ScoreMap]) -> pd.DataFrame:
    """Long table: criterion, layer, head, score, rank (1 = most important), pruned."""
    rows = []
    for name, s in scores.items():
        ranks = s.ranks()
        for (layer, head), value in np.ndenumerate(s.scores):
            rows.append({"criterion": name, "layer": layer, "head": head,
                         "score": None if np.isnan(value) else float(value),
                         "rank": None if np.isnan(ranks[layer, head]) else int(ranks[layer, head]),
                         "pruned": bool(np.isnan(value))})
    return pd.DataFrame(rows, columns=["criterion", "layer", "head", "score", "rank", "pruned"])


# -- attention ------------------------------------------------------------------------------------------------------

def attention_figure(words: Sequence[str], matrix: np.ndarray, title: str | None = None) -> go.Figure:
    """Word-level attention: row = query word (attends from), column = key word (attends to)."""
    labels = [f"{i}:{plot_text(w)}" for i, w in enumerate(words)]   # index prefix keeps repeated words apart
    fig = go.Figure(go.Heatmap(z=matrix, x=labels, y=labels, colorscale="Blues", zmin=0,
                               zmax=max(float(np.max(matrix)) if matrix.size else 0.0, 1e-6),
                               hovertemplate="%{y} → %{x}<br>attention %{z:.3f}<extra></extra>",
                               colorbar=dict(title="attention", thickness=12)))
    fig.update_xaxes(title_text="attends to (key word)", tickangle=-45)
    fig.update_yaxes(title_text="query word", autorange="reversed")
    size = max(320, min(640, 16 * len(words) + 200))
    head, top = wrapped_title(title)
    fig.update_layout(height=size + top, margin=dict(l=10, r=10, t=top, b=10), title=head, font=FONT)
    return keep_labels(fig)


def word_positions(words: Sequence[str]) -> np.ndarray:
    """x of each word's centre, in characters, so long words get room and labels do not overlap."""
    widths = np.array([max(len(w), 1) + 2 for w in words], dtype=float)
    return np.cumsum(widths) - widths / 2


def _arc_path(x0: float, x1: float, height: float, n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    t = np.linspace(0, np.pi, n)
    mid, half = (x0 + x1) / 2, (x1 - x0) / 2
    return mid - half * np.cos(t), np.sin(t) * height


def _sample_scale(scale: list[list], value: float) -> str:
    value = min(max(value, 0.0), 1.0)
    for (p0, c0), (p1, c1) in zip(scale, scale[1:]):
        if value <= p1:
            return _mix(c0, c1, 0 if p1 == p0 else (value - p0) / (p1 - p0))
    return scale[-1][1]


ARC_SCALE = [[0.0, "#c7d4e8"], [0.5, "#4a7fc1"], [1.0, "#b3001e"]]


def arc_figure(words: Sequence[str], arcs: Sequence, weights: np.ndarray | None, title: str | None = None,
               seen: Sequence[bool] | None = None) -> go.Figure:
    """Dependency arcs over the words (dependent → head, arrow at the head, label on top); colour and width =
    this head's attention from the dependent to its head (0..1, one scale for every head). ``weights`` None:
    plain arcs. Arc height grows with the number of words spanned, so nested arcs stack.

    The words are the x axis's tick labels, which plotly turns (30°, then 90°) when the figure is too narrow for
    them side by side: a text trace sized for 1,100 px overlapped its words in a half-width column and on a phone."""
    fig = go.Figure()
    x = word_positions(words)
    span = float(x[-1] + 2) if len(x) else 1.0
    unit = span / 40                        # arc height scale; square root keeps long arcs from towering
    heights = [unit * (0.8 + 1.6 * np.sqrt(abs(a.head - a.dependent))) for a in arcs]
    for i, arc in enumerate(arcs):
        w = None if weights is None else float(weights[i])
        xs, ys = _arc_path(x[arc.dependent], x[arc.head], heights[i])
        color = "#888888" if w is None else _sample_scale(ARC_SCALE, w)
        width = 1.5 if w is None else 1 + 7 * min(w, 1.0)
        hover = f"{plot_text(words[arc.dependent])} → {plot_text(words[arc.head])} ({arc.label})"
        if w is not None:
            hover += f"<br>attention {w:.3f}"
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=width), hoverinfo="text",
                                 hovertext=hover, showlegend=False))
        fig.add_trace(go.Scatter(x=[x[arc.head]], y=[0], mode="markers", hoverinfo="skip", showlegend=False,
                                 marker=dict(symbol="triangle-down", size=9, color=color)))
        fig.add_annotation(x=(x[arc.dependent] + x[arc.head]) / 2, y=heights[i], text=arc.label, showarrow=False,
                           yshift=7, font=dict(size=10))
    # words the model did not read (cut by the max length) greyed; a word is text, never markup
    labels = [f'<span style="color:{UNSEEN_WORD_COLOR}">{plot_text(w)}</span>'
              if seen is not None and not seen[i] else plot_text(w) for i, w in enumerate(words)]
    if weights is not None:  # colour bar for the arc scale
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", showlegend=False, hoverinfo="skip",
                                 marker=dict(colorscale=ARC_SCALE, cmin=0, cmax=1, color=[0],
                                             colorbar=dict(title="attention<br>dep → head", thickness=12, len=0.9,
                                                           nticks=5))))
    top = max(heights + [unit])
    # a long sentence's words, turned upright on a phone, stand closer than a 13 px line: a smaller font
    size = 13 if len(words) <= 15 else 11 if len(words) <= 25 else 9
    fig.update_xaxes(range=[0, span], tickmode="array", tickvals=x.tolist(), ticktext=labels, showgrid=False,
                     zeroline=False, showline=False, ticks="", tickfont=dict(size=size, color=WORD_COLOR))
    fig.update_yaxes(visible=False, range=[-unit * 0.4, top + unit * 1.2])
    head, margin_top = wrapped_title(title)
    fig.update_layout(height=int(min(560, 200 + 22 * top / unit)) + margin_top,
                      margin=dict(l=10, r=10, t=margin_top, b=10), title=head, font=FONT, plot_bgcolor="rgba(0,0,0,0)")
    return keep_labels(fig)


def profile_figure(profile, layer: int, head: int, top: int = 12) -> go.Figure:
    """Dependency accuracy of head (layer, head) per relation (bars) beside the best head of each (diamonds)."""
    relations = profile.relations[:top]
    mine = [float(profile.accuracy[r][layer, head]) for r in relations]
    best = [profile.best_head(r) for r in relations]
    labels = [f"{r} (n={profile.counts[r]})" for r in relations]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=labels, x=mine, orientation="h", name=f"L{layer} H{head}", marker_color="#4a7fc1",
                         hovertemplate="%{y}: %{x:.2f}<extra></extra>"))
    fig.add_trace(go.Scatter(y=labels, x=[b["accuracy"] for b in best], mode="markers", name="best head",
                             marker=dict(symbol="diamond", size=10, color="#E69F00"),
                             customdata=[[b["layer"], b["head"]] for b in best],
                             hovertemplate="best: L%{customdata[0]} H%{customdata[1]} = %{x:.2f}<extra></extra>"))
    fig.update_xaxes(title_text="dependency accuracy (dependent's strongest attention is its head)", range=[0, 1])
    fig.update_yaxes(title_text="relation (n = arcs)", autorange="reversed")
    fig.update_layout(height=90 + 26 * len(relations), margin=dict(l=10, r=10, t=10, b=10), font=FONT,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    return keep_labels(fig)


# -- trajectories ---------------------------------------------------------------------------------------------------

def trajectory_label(traj) -> str:
    label = ("inverse " if traj.inverse else "") + traj.criterion
    return label if traj.criterion != "random" else f"random (seed {traj.seed})"


def tolerance_bound(dense: float, tau: float, higher_is_better: bool) -> float:
    """The worst value tolerance τ allows (``trajectory.degraded``'s boundary): τ × dense when higher is better,
    dense / τ when lower is better (perplexity 279 at τ = 0.9 allows up to 310)."""
    return tau * dense if higher_is_better else dense / tau


def tolerance_rule(tau: float | str, higher_is_better: bool) -> str:
    """When a metric is past tolerance ``tau`` (a number, or a symbol such as "τ"), in words for its direction:
    "below 0.9 × dense" or "above dense / 0.9"."""
    tau = f"{tau:g}" if isinstance(tau, (int, float)) else tau
    return f"below {tau} × dense" if higher_is_better else f"above dense / {tau}"


def trajectory_figure(trajectories: Sequence, spreads: Sequence[dict] = (), tolerance: float | None = None,
                      metric: str | None = None) -> go.Figure:
    """Metric vs pruning ratio: a line per trajectory (criterion colour, inverse dashed), random seeds as a box
    per ratio (``trajectory.spread`` dicts; a spread with ``band`` -- repeats of one criterion -- as its mean line
    and a shaded mean ± sd), the dense metric and the tolerance line, stop points as stars.

    The tolerance line follows the metric's direction (``tolerance_bound``): τ × dense for accuracy, dense / τ
    for perplexity or loss; the y-axis title says which way is better."""
    fig = go.Figure()
    metric = metric or (trajectories[0].metric if trajectories else spreads[0]["metric"] if spreads else "metric")
    higher = HIGHER_IS_BETTER.get(metric, True)
    dense = None
    for traj in trajectories:
        ratios, values = traj.ratios() * 100, traj.values(metric)
        dense = values[0] if dense is None else dense
        color = criterion_color(traj.criterion)
        fig.add_trace(go.Scatter(x=ratios, y=values, mode="lines+markers", name=trajectory_label(traj),
                                 line=dict(color=color, width=2.5, dash="dash" if traj.inverse else "solid"),
                                 marker=dict(size=5), legendgroup=trajectory_label(traj),
                                 hovertemplate="%{x:.1f}% pruned<br>" + metric + " %{y:.4f}<extra>%{fullData.name}"
                                               "</extra>"))
        tau = tolerance if tolerance is not None else traj.tolerance
        stop = traj.tolerance_ratio(tau) if tau is not None else None
        if stop is not None:
            y = float(np.interp(stop * 100, ratios, values))
            fig.add_trace(go.Scatter(x=[stop * 100], y=[y], mode="markers", legendgroup=trajectory_label(traj),
                                     marker=dict(symbol="star", size=15, color=color, line=dict(width=1, color="#fff")),
                                     showlegend=False, hovertemplate=f"{trajectory_label(traj)} stops at "
                                                                     "%{x:.1f}% pruned<extra></extra>"))
    for spread in spreads:
        if spread.get("metric", metric) != metric:
            continue   # computed for another metric
        x = np.array(spread["ratios"]) * 100
        if spread.get("band"):   # repeats of one criterion: mean ± sd
            band_figure_traces(fig, x, spread)
            dense = spread["mean"][0] if dense is None else dense
            continue
        fig.add_trace(go.Box(x=x, q1=spread["q1"], median=spread["median"], q3=spread["q3"],
                             lowerfence=spread["min"], upperfence=spread["max"], name=spread.get("name", "random"),
                             marker_color=RANDOM_COLOR, line=dict(color=RANDOM_COLOR), boxpoints=False,
                             width=max(0.8, float(np.min(np.diff(x))) * 0.6) if len(x) > 1 else 1.0))
        dense = spread["median"][0] if dense is None else dense
    if dense is not None:
        fig.add_hline(y=dense, line=dict(color=DENSE_COLOR, dash="dot"), annotation_text=f"dense {metric_text(dense)}",
                      annotation_position="bottom left")
        if tolerance is not None:
            fig.add_hline(y=tolerance_bound(dense, tolerance, higher), line=dict(color=TOLERANCE_COLOR, dash="dash"),
                          annotation_text=f"past tolerance: {tolerance_rule(tolerance, higher)}",
                          annotation_position="bottom right" if higher else "top right")
    fig.update_xaxes(title_text="heads pruned (%)", ticksuffix="%")
    fig.update_yaxes(title_text=f"{metric} ({'higher' if higher else 'lower'} is better)")
    fig.update_layout(height=460, margin=dict(l=10, r=10, t=10, b=10), font=FONT, hovermode="closest",
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    return keep_labels(fig)


def band_figure_traces(fig: go.Figure, x: np.ndarray, spread: Mapping) -> None:
    """Add a repeats band to ``fig``: the mean line and a shaded mean ± sd (``trajectory.spread`` with band)."""
    name = spread.get("name", "repeats")
    color = criterion_color(name.split(" ")[0])
    mean, sd = np.array(spread["mean"]), np.array(spread["sd"])
    r, g, b = (round(255 * c) for c in _hex_to_rgb(color))
    fig.add_trace(go.Scatter(x=np.concatenate([x, x[::-1]]), y=np.concatenate([mean + sd, (mean - sd)[::-1]]),
                             fill="toself", fillcolor=f"rgba({r},{g},{b},0.2)", line=dict(width=0), name=f"{name} ± sd",
                             legendgroup=name, hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=x, y=mean, mode="lines+markers", name=f"{name} mean", legendgroup=name,
                             line=dict(color=color, width=2.5), marker=dict(size=5),
                             customdata=sd, hovertemplate="%{x:.1f}% pruned<br>mean %{y:.4f} ± %{customdata:.4f}"
                                                          "<extra>%{fullData.name}</extra>"))


def trajectory_table(trajectories: Sequence, tolerance: float | None = None) -> pd.DataFrame:
    rows = []
    for traj in trajectories:
        s = traj.summary()
        tau = tolerance if tolerance is not None else traj.tolerance
        stop = traj.tolerance_ratio(tau) if tau is not None else None
        rows.append({"order": trajectory_label(traj), "metric": traj.metric, "AUC": s["auc"],
                     "dense": float(traj.values()[0]), "final": s["final_metric"],
                     "pruned at end (%)": 100 * s["final_ratio"],
                     "stop point (%)": None if stop is None else 100 * stop, "steps": s["n_steps"],
                     "ended by": traj.stop})
    return pd.DataFrame(rows)


def sparsity_figure(points: Sequence[Mapping], metric: str, dense: float | None = None,
                    x_title: str = "heads pruned (%)") -> go.Figure:
    """A metric vs sparsity, one line per criterion with ± sd bars over repeats (a protocol's results table).

    ``points``: dicts with "criterion", "sparsity" (ratio), "mean" and "sd" (None or 0 with one repeat);
    ``x_title``: what the ratio is (a [kv] protocol's: the share of key/value heads kept full)."""
    fig = go.Figure()
    for name in dict.fromkeys(p["criterion"] for p in points):
        mine = sorted((p for p in points if p["criterion"] == name), key=lambda p: p["sparsity"])
        fig.add_trace(go.Scatter(x=[100 * p["sparsity"] for p in mine], y=[p["mean"] for p in mine],
                                 error_y=dict(type="data", array=[p["sd"] or 0.0 for p in mine], visible=True),
                                 mode="lines+markers", name=name,
                                 line=dict(color=criterion_color(name))))
    if dense is not None:
        fig.add_hline(y=dense, line=dict(color=DENSE_COLOR, dash="dot"), annotation_text=f"dense {metric_text(dense)}",
                      annotation_position="bottom left")
    higher = HIGHER_IS_BETTER.get(metric, True)
    fig.update_xaxes(title_text=x_title, ticksuffix="%")
    fig.update_yaxes(title_text=f"{metric} ({'higher' if higher else 'lower'} is better), mean ± sd")
    fig.update_layout(height=460, margin=dict(l=10, r=10, t=10, b=10), font=FONT,
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    return keep_labels(fig)


# -- numbers for people ---------------------------------------------------------------------------------------------

def number_text(value) -> str:
    """A number as people read it, the one rule of every table: whole numbers without decimals and with thousands
    separators (100, not 100.0000; 22,713,986), four significant digits otherwise (0.8403, 256.5, 0.0012), a
    thousand or more rounded to a whole number (1,627); None and NaN as "—". Anything else as its text."""
    if value is None:
        return "—"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        return str(value)
    value = float(value)
    if not np.isfinite(value):
        return "—" if np.isnan(value) else ("∞" if value > 0 else "−∞")
    if value.is_integer() or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


def metric_decimals(value: float) -> int:
    """Decimals that show a metric to four significant digits: at most four (accuracy 0.8125), none from a
    thousand up (perplexity 6,101, not 6100.8386)."""
    value = abs(float(value))
    if not np.isfinite(value) or value == 0:
        return 4
    return int(min(4, max(0, 3 - math.floor(math.log10(value)))))


def metric_text(value: float, like: float | None = None) -> str:
    """A metric as people read it: "0.8125", "1.234", "965.6", "6,101" (``metric_decimals``, thousands separated).
    ``like``: write it with the decimals of that value instead (a spread beside its mean: "4,887 ± 3,348")."""
    value = float(value)
    if not np.isfinite(value):
        return number_text(value)
    return f"{value:,.{metric_decimals(value if like is None else like)}f}"


def change_text(value: float, reference: float) -> str:
    """``value - reference`` signed, at the decimals of the larger of the two ("+0.0312", "-1.20", "+6,100"); the
    minus is ASCII: ``st.metric`` reads its arrow from the sign. A change that rounds to zero is "±0"."""
    decimals = metric_decimals(max(abs(float(value)), abs(float(reference))))
    change = round(float(value) - float(reference), decimals)
    return "±0" if change == 0 else f"{change:+,.{decimals}f}"


def readable(frame: pd.DataFrame):
    """``frame`` styled with ``number_text`` in every cell (what the dashboard's tables show)."""
    return frame.style.format(number_text)


# -- sizes ----------------------------------------------------------------------------------------------------------

def size_table(report: Mapping[str, Mapping]) -> pd.DataFrame:
    """``surgery.size_report`` as a table: parameters and MB before/after per module group."""
    rows = []
    for group, r in report.items():
        before, after = r["before"], r["after"]
        rows.append({"part": group.replace("_", " "), "params before": before["params"],
                     "params after": after["params"], "removed": r["removed_params"],
                     "removed (%)": 100 * r["removed_params"] / before["params"] if before["params"] else 0.0,
                     "MB before": before["mb"], "MB after": after["mb"]})
    return pd.DataFrame(rows)


def figure_images(fig: go.Figure, formats: Sequence[str], width: int = 1100, height: int | None = None,
                  scale: float = 2.0) -> dict[str, bytes]:
    """{format: bytes} of ``fig`` in each of ``formats`` ("png", "svg") through kaleido, one browser start for all
    of them (a start is most of a render's time: about 15 s each on the 2-core box, one after the other); needs a
    local Chrome/Chromium, raises RuntimeError with the reason otherwise. ``scale`` enlarges a PNG's pixels (an
    SVG's text stays text: titles, tick labels and legend entries)."""
    fig = keep_labels(go.Figure(fig))   # a copy: a figure built elsewhere gets its labels too, the caller's is kept
    height = height or fig.layout.height or 500
    try:
        with tempfile.TemporaryDirectory() as folder:
            paths = [Path(folder) / f"figure.{kind}" for kind in formats]
            pio.write_images([fig] * len(paths), paths, format=list(formats), width=width, height=height,
                             scale=scale)
            return {kind: path.read_bytes() for kind, path in zip(formats, paths)}
    except Exception as exc:  # kaleido reports a missing browser or a failed render in many ways
        raise RuntimeError(f"{'/'.join(formats).upper()} export unavailable ({type(exc).__name__}: {exc}); use the "
                           "HTML export.") from exc


def figure_png(fig: go.Figure, width: int = 1100, height: int | None = None, scale: float = 2.0) -> bytes:
    """PNG bytes through kaleido (``figure_images``)."""
    return figure_images(fig, ["png"], width, height, scale)["png"]


def figure_svg(fig: go.Figure, width: int = 1100, height: int | None = None) -> bytes:
    """SVG bytes through kaleido (``figure_images``)."""
    return figure_images(fig, ["svg"], width, height, 1.0)["svg"]


def figure_html(fig: go.Figure) -> str:
    """A self-contained HTML page (plotly.js inlined, so it opens offline)."""
    return keep_labels(go.Figure(fig)).to_html(include_plotlyjs=True, full_html=True)


# -- KV cache plans ------------------------------------------------------------------------------------------------

FULL_MARK, STREAM_MARK = "F", "S"


def kv_plan_grid(scores: np.ndarray, full: np.ndarray, *, selected: tuple[int, int] | None = None,
                 title: str | None = None) -> go.Figure:
    """(L x H_kv) key/value heads coloured by a rule's group score; full ones marked F, streaming ones S; a cell
    click reports (layer, key/value head)."""
    full = np.asarray(full, dtype=bool)
    finite = np.where(np.isfinite(scores), scores, np.nan)
    hover = np.array([[f"layer {b} · key/value head {g}<br>{'full cache' if full[b, g] else 'streaming'}"
                       f"<br>score {finite[b, g]:.3f}" for g in range(full.shape[1])] for b in range(full.shape[0])],
                     dtype=object)
    marks = np.where(full, FULL_MARK, STREAM_MARK)
    return head_grid(finite, hover, "Viridis", selected=selected, marks=marks, title=title,
                     colorbar={"title": "score"})


def kv_budget_grid(budgets: np.ndarray, scores: np.ndarray, *, title: str | None = None) -> go.Figure:
    """(L x H_kv) key/value groups coloured by their KV budget in tokens (S + W_g; inf = full), each cell's budget
    written in it, the rule's group score in the hover (``kvcache.budgets``)."""
    budgets = np.asarray(budgets, dtype=float)
    finite = np.where(np.isfinite(scores), scores, np.nan)
    shown = np.where(np.isfinite(budgets), budgets, np.nan)
    hover = np.array([[f"layer {b} · key/value head {g}<br>budget "
                       f"{'every key (full)' if not np.isfinite(budgets[b, g]) else f'{int(budgets[b, g])} tokens'}"
                       f"<br>score {finite[b, g]:.3f}" for g in range(budgets.shape[1])]
                      for b in range(budgets.shape[0])], dtype=object)
    marks = np.where(np.isfinite(budgets), np.nan_to_num(budgets, posinf=0).astype(int).astype(str), FULL_MARK)
    return head_grid(shown, hover, "Viridis", marks=marks, title=title, colorbar={"title": "tokens"})


def kv_bytes_figure(counted: Mapping[str, float], length: int) -> go.Figure:
    """Two bars: the full cache's and the plan's KV bytes (MiB) at ``length`` tokens (``kvcache.tasks.bytes_at``)."""
    mib = [counted["full_cache"] / 2**20, counted["plan"] / 2**20]
    fig = go.Figure(go.Bar(x=["full cache", "plan"], y=mib, marker_color=[PRUNED_COLOR, KEPT_COLOR],
                           text=[f"{v:.2f} MiB" for v in mib], textposition="auto", name="kv bytes"))
    title, top = wrapped_title(f"KV cache at {length:,} tokens: {counted['ratio']:.0%} of the full cache")
    fig.update_layout(title=title, xaxis_title="key/value cache", yaxis_title="MiB", height=270 + top,
                      margin={"t": top, "b": 30, "l": 50, "r": 10})
    return keep_labels(fig)
