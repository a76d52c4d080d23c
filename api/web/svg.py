"""Line charts as inline SVG, drawn on the server.

No JavaScript and no chart library: the page stays small, works under a
strict Content-Security-Policy, and renders the same in every browser.  A
series breaks where samples are missing (a gap is a gap, not a line drawn
across it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpufleet.api.web.html import Markup, esc, h

#: Distinguishable on white, in order (Tableau 10 and a few more).
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


@dataclass(frozen=True)
class Series:
    name: str
    #: (epoch seconds, value or None for a gap), in time order.
    points: Sequence[tuple[float, float | None]]


def _nice_max(v: float) -> float:
    if v <= 0 or not math.isfinite(v):
        return 1.0
    exp = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if v <= m * exp:
            return m * exp
    return 10 * exp


def _label(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 10 or v == 0 else f"{v:.2g}"


def line_chart(title: str, series: Sequence[Series], unit: str, *, y_max: float | None = None,
               width: int = 760, height: int = 240, step_s: float | None = None) -> Markup:
    """An SVG line chart with a time axis (UTC) and a legend under it.

    ``step_s``: the expected spacing of points; a longer gap breaks the line.
    """
    pts = [(t, v) for s in series for t, v in s.points if v is not None and math.isfinite(v)]
    if not pts:
        return h('<figure class="chart"><figcaption>{}</figcaption><p class="empty">No samples in this window.'
                 "</p></figure>", title)
    left, right, top, bottom = 56, 12, 10, 26
    pw, ph = width - left - right, height - top - bottom
    t0 = min(t for t, _ in pts)
    t1 = max(t for t, _ in pts)
    if t1 <= t0:
        t1 = t0 + 1.0
    ymax = y_max if y_max is not None else _nice_max(max(v for _, v in pts))
    ymax = max(ymax, 1e-9)

    def x(t: float) -> float:
        return left + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return top + ph - min(max(v, 0.0), ymax) / ymax * ph

    parts: list[str] = []
    for i in range(5):
        level = ymax * i / 4
        yy = y(level)
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(_label(level))}</text>')
    for i in range(5):
        at = t0 + (t1 - t0) * i / 4
        xx = x(at)
        label = datetime.fromtimestamp(at, UTC).strftime("%H:%M" if t1 - t0 > 120 else "%H:%M:%S")
        anchor = "start" if i == 0 else ("end" if i == 4 else "middle")
        parts.append(f'<text class="tick" x="{xx:.1f}" y="{height - 8}" text-anchor="{anchor}">{esc(label)}</text>')
    parts.append(f'<text class="unit" x="4" y="{top + 10}">{esc(unit)}</text>')
    gap = 3.0 * step_s if step_s else None
    legend: list[str] = []
    for k, s in enumerate(series):
        color = PALETTE[k % len(PALETTE)]
        segments: list[list[str]] = [[]]
        last_t: float | None = None
        for t, v in s.points:
            if v is None or not math.isfinite(v) or (gap is not None and last_t is not None and t - last_t > gap):
                if segments[-1]:
                    segments.append([])
                if v is None or not math.isfinite(v):
                    last_t = None
                    continue
            segments[-1].append(f"{x(t):.1f},{y(v):.1f}")
            last_t = t
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="1.5" fill="{color}"/>')
            elif seg:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{" ".join(seg)}"/>')
        legend.append(f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
                      f'fill="{color}"/></svg>{esc(s.name)}</li>')
    svg = (f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
           f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>{"".join(parts)}</svg>')
    return Markup(f'<figure class="chart"><figcaption>{esc(title)}</figcaption>{svg}'
                  f'<ul class="legend">{"".join(legend)}</ul></figure>')


def bar_chart(title: str, categories: Sequence[str], series: Sequence[tuple[str, Sequence[float]]], unit: str, *,
              width: int = 760, height: int = 240) -> Markup:
    """Stacked bars: one bar per category (e.g. a day), one colour per series (e.g. a team), legend under it.

    ``series``: (name, one value per category); negative values are drawn as zero.
    """
    totals = [sum(max(v[i], 0.0) for _, v in series if i < len(v) and math.isfinite(v[i]))
              for i in range(len(categories))]
    if not categories or not series or max(totals, default=0.0) <= 0:
        return h('<figure class="chart"><figcaption>{}</figcaption><p class="empty">Nothing in this range.</p>'
                 "</figure>", title)
    left, right, top, bottom = 56, 12, 10, 26
    pw, ph = width - left - right, height - top - bottom
    ymax = _nice_max(max(totals))
    slot = pw / len(categories)
    bar = max(1.0, slot * 0.7)
    parts: list[str] = []
    for i in range(5):
        level = ymax * i / 4
        yy = top + ph - level / ymax * ph
        parts.append(f'<line class="grid" x1="{left}" x2="{left + pw}" y1="{yy:.1f}" y2="{yy:.1f}"/>')
        parts.append(f'<text class="tick" x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(_label(level))}</text>')
    every = max(1, math.ceil(len(categories) / 12))
    for i, cat in enumerate(categories):
        x0 = left + i * slot + (slot - bar) / 2
        base = float(top + ph)
        for k, (name, values) in enumerate(series):
            v = values[i] if i < len(values) else 0.0
            if not math.isfinite(v) or v <= 0:
                continue
            hh = v / ymax * ph
            base -= hh
            parts.append(f'<rect class="bar" x="{x0:.1f}" y="{base:.1f}" width="{bar:.1f}" height="{hh:.1f}" '
                         f'fill="{PALETTE[k % len(PALETTE)]}"><title>{esc(f"{name} {cat}: {v:,.2f} {unit}")}</title>'
                         "</rect>")
        if i % every == 0:
            parts.append(f'<text class="tick" x="{x0 + bar / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                         f"{esc(cat)}</text>")
    parts.append(f'<text class="unit" x="4" y="{top + 10}">{esc(unit)}</text>')
    legend = "".join(f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
                     f'fill="{PALETTE[k % len(PALETTE)]}"/></svg>{esc(name)}</li>' for k, (name, _) in enumerate(series))
    svg = (f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
           f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>{"".join(parts)}</svg>')
    return Markup(f'<figure class="chart"><figcaption>{esc(title)}</figcaption>{svg}'
                  f'<ul class="legend">{legend}</ul></figure>')
