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

#: Sixteen colours told apart on white and from each other (every pair at least 30 apart in CIELAB; a test
#: checks it): one per GPU of a 16-GPU run.  More series than this are drawn as small multiples by the
#: pages (a chart per node), never with a colour used twice in one chart.
PALETTE = (
    "#1f77b4",
    "#ffa600",
    "#2ca02c",
    "#e6194b",
    "#000075",
    "#f032e6",
    "#42d4f4",
    "#9a6324",
    "#bcbd22",
    "#7f7f7f",
    "#bc5090",
    "#1b9e77",
    "#4363d8",
    "#ff9896",
    "#dcbeff",
    "#000000",
)
#: Height of an incident's bar along the top of a chart, and how many lanes of them before they repeat, px.
LANE_H = 6
MAX_LANES = 6
#: Round steps for time ticks, seconds.
TICK_STEPS = (
    1,
    2,
    5,
    10,
    15,
    30,
    60,
    120,
    300,
    600,
    900,
    1800,
    3600,
    7200,
    10800,
    21600,
    43200,
    86400,
    2 * 86400,
    7 * 86400,
)


@dataclass(frozen=True)
class Series:
    name: str
    #: (epoch seconds, value or None for a gap), in time order.
    points: Sequence[tuple[float, float | None]]
    #: Fixed colour (an index into :data:`PALETTE` decides it when None).
    color: str | None = None


@dataclass(frozen=True)
class Span:
    """A stretch of time to shade behind the lines: an incident from its start to its end (None: still open)."""

    start: float
    end: float | None
    label: str
    #: ``critical`` or ``warning``: the shade's class.
    severity: str = "warning"
    #: Where the shade links to (the incident's page).
    href: str | None = None


def time_ticks(t0: float, t1: float, most: int = 7) -> list[tuple[float, str]]:
    """Ticks at round UTC times (every 1, 2, 5, 10, 15, 30 s or min, 1, 2, 3, 6, 12 h, days) between ``t0``
    and ``t1``, at most ``most`` of them, labelled as precisely as the step needs."""
    span = max(t1 - t0, 1e-9)
    step = next((s for s in TICK_STEPS if span / s <= most), TICK_STEPS[-1])
    while span / step > most:
        step *= 2
    first = math.ceil(t0 / step) * step
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    if step < 86400 and span > 86400:
        fmt = "%m-%d %H:%M"
    out: list[tuple[float, str]] = []
    t: float = first
    while t <= t1 + 1e-9:
        out.append((t, datetime.fromtimestamp(t, UTC).strftime(fmt)))
        t += step
    return out


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


def line_chart(
    title: str,
    series: Sequence[Series],
    unit: str,
    *,
    y_max: float | None = None,
    width: int = 760,
    height: int = 240,
    step_s: float | None = None,
    spans: Sequence[Span] = (),
    t_range: tuple[float, float] | None = None,
) -> Markup:
    """An SVG line chart with a time axis (UTC, ticks at round times), incident spans shaded behind the
    lines, and a legend under it.

    ``step_s``: the expected spacing of points; a longer gap breaks the line.  ``t_range``: the time axis
    (default: the points' own).
    """
    pts = [(t, v) for s in series for t, v in s.points if v is not None and math.isfinite(v)]
    if not pts:
        return h(
            '<figure class="chart"><figcaption>{}</figcaption><p class="empty">No samples in this window.'
            "</p></figure>",
            title,
        )
    left, right, top, bottom = 56, 12, 10, 26
    pw, ph = width - left - right, height - top - bottom
    t0 = t_range[0] if t_range else min(t for t, _ in pts)
    t1 = t_range[1] if t_range else max(t for t, _ in pts)
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
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(_label(level))}</text>'
        )
    for at, label in time_ticks(t0, t1):
        xx = x(at)
        anchor = "start" if xx - left < 20 else ("end" if left + pw - xx < 20 else "middle")
        parts.append(f'<line class="grid" x1="{xx:.1f}" x2="{xx:.1f}" y1="{top}" y2="{top + ph}"/>')
        parts.append(
            f'<text class="tick" x="{xx:.1f}" y="{height - 8}" text-anchor="{anchor}">{esc(label)}</text>'
        )
    # each incident: a light shade over its stretch, and a bar of its own in a lane along the top, so that
    # incidents that overlap stay told apart
    shades: list[str] = []
    lane = 0
    for sp in spans:
        a, b = max(sp.start, t0), min(sp.end if sp.end is not None else t1, t1)
        if b < a or sp.start > t1:
            continue
        xa, xb = x(a), max(x(b), x(a) + 2.0)
        sev = "critical" if sp.severity == "critical" else "warning"
        tip = f"<title>{esc(sp.label)}</title>"
        rect = (
            f'<rect class="span {sev}" x="{xa:.1f}" y="{top}" width="{xb - xa:.1f}" height="{ph}">{tip}</rect>'
            f'<rect class="lane {sev}" x="{xa:.1f}" y="{top + 1 + LANE_H * lane:.1f}" width="{xb - xa:.1f}" '
            f'height="{LANE_H - 1}">{tip}</rect>'
        )
        shades.append(f'<a href="{esc(sp.href)}">{rect}</a>' if sp.href else rect)
        lane = (lane + 1) % MAX_LANES
    parts.append(f'<text class="unit" x="4" y="{top + 10}">{esc(unit)}</text>')
    gap = 3.0 * step_s if step_s else None
    legend: list[str] = []
    for k, s in enumerate(series):
        color = s.color or PALETTE[k % len(PALETTE)]
        segments: list[list[str]] = [[]]
        last_t: float | None = None
        for t, v in s.points:
            if (
                v is None
                or not math.isfinite(v)
                or (gap is not None and last_t is not None and t - last_t > gap)
            ):
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
                parts.append(
                    f'<polyline fill="none" stroke="{color}" stroke-width="1.3" points="{" ".join(seg)}"/>'
                )
        legend.append(
            f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
            f'fill="{color}"/></svg>{esc(s.name)}</li>'
        )
    for sp in spans:
        if sp.start <= t1 and (sp.end is None or sp.end >= t0):
            cls = "critical" if sp.severity == "critical" else "warning"
            item = (
                f'<svg width="10" height="10" aria-hidden="true"><rect class="lane {cls}" width="10" '
                f'height="10"/></svg>{esc(sp.label)}'
            )
            legend.append(
                f'<li class="span-key"><a href="{esc(sp.href)}">{item}</a></li>'
                if sp.href
                else f'<li class="span-key">{item}</li>'
            )
    svg = (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
        f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>{"".join(shades)}'
        f"{''.join(parts)}</svg>"
    )
    return Markup(
        f'<figure class="chart"><figcaption>{esc(title)}</figcaption>{svg}'
        f'<ul class="legend">{"".join(legend)}</ul></figure>'
    )


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Sequence[tuple[str, Sequence[float]]],
    unit: str,
    *,
    width: int = 760,
    height: int = 240,
) -> Markup:
    """Stacked bars: one bar per category (e.g. a day), one colour per series (e.g. a team), legend under it.

    ``series``: (name, one value per category); negative values are drawn as zero.
    """
    totals = [
        sum(max(v[i], 0.0) for _, v in series if i < len(v) and math.isfinite(v[i]))
        for i in range(len(categories))
    ]
    if not categories or not series or max(totals, default=0.0) <= 0:
        return h(
            '<figure class="chart"><figcaption>{}</figcaption><p class="empty">Nothing in this range.</p>'
            "</figure>",
            title,
        )
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
        parts.append(
            f'<text class="tick" x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{esc(_label(level))}</text>'
        )
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
            parts.append(
                f'<rect class="bar" x="{x0:.1f}" y="{base:.1f}" width="{bar:.1f}" height="{hh:.1f}" '
                f'fill="{PALETTE[k % len(PALETTE)]}"><title>{esc(f"{name} {cat}: {v:,.2f} {unit}")}</title>'
                "</rect>"
            )
        if i % every == 0:
            parts.append(
                f'<text class="tick" x="{x0 + bar / 2:.1f}" y="{height - 8}" text-anchor="middle">'
                f"{esc(cat)}</text>"
            )
    parts.append(f'<text class="unit" x="4" y="{top + 10}">{esc(unit)}</text>')
    legend = "".join(
        f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
        f'fill="{PALETTE[k % len(PALETTE)]}"/></svg>{esc(name)}</li>'
        for k, (name, _) in enumerate(series)
    )
    svg = (
        f'<svg class="plot" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{esc(title)}"><title>{esc(title)}</title>'
        f'<rect class="frame" x="{left}" y="{top}" width="{pw}" height="{ph}"/>{"".join(parts)}</svg>'
    )
    return Markup(
        f'<figure class="chart"><figcaption>{esc(title)}</figcaption>{svg}'
        f'<ul class="legend">{legend}</ul></figure>'
    )
