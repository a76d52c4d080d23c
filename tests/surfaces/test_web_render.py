"""The web view's HTML and SVG helpers, without a server."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from gpufleet.api.web.html import Markup, esc, h, num, table
from gpufleet.api.web.session import _safe_next
from gpufleet.api.web.svg import Series, line_chart


def test_values_are_escaped_unless_already_markup() -> None:
    assert esc('<b a="1">&') == "&lt;b a=&quot;1&quot;&gt;&amp;"
    assert h("<td>{}</td>", "<i>") == "<td>&lt;i&gt;</td>"
    assert h("<td>{}</td>", Markup("<i>x</i>")) == "<td><i>x</i></td>"
    assert "&lt;script&gt;" in table(["a"], [["<script>"]])
    assert num(None) == "&mdash;" and num(float("nan")) == "&mdash;" and num(1234.5, 1, "W") == "1,234.5 W"


def test_chart_breaks_lines_at_gaps_and_is_valid_svg() -> None:
    pts: list[tuple[float, float | None]] = [(float(t), 50.0) for t in range(0, 60)]
    pts += [(float(t), 70.0) for t in range(120, 180)]  # a minute without samples
    pts += [(180.0, None), (181.0, 10.0)]  # an explicit gap, then a lone point
    out = line_chart(
        "U <&>",
        [Series("n1/0 <x>", pts), Series("n1/1", [(0.0, 20.0), (1.0, 30.0)])],
        "%",
        y_max=100.0,
        step_s=1.0,
    )
    svg = re.search(r"<svg class=\"plot\".*?</svg>", out, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(0))  # well-formed, names escaped
    polylines = root.findall("polyline")
    assert len(polylines) == 3  # two segments of the first series, one of the second
    assert len(root.findall("circle")) == 1
    assert "n1/0 &lt;x&gt;" in out and "U &lt;&amp;&gt;" in out
    ys = [float(p.split(",")[1]) for pl in polylines for p in pl.get("points", "").split()]
    assert min(ys) >= 10 and max(ys) <= 10 + 240 - 36  # inside the plot area


def test_empty_chart_says_so() -> None:
    assert "No samples" in line_chart("x", [Series("a", [(0.0, None)])], "W")


def test_login_redirects_stay_on_this_site() -> None:
    assert _safe_next("/runs/a?hours=6", "/") == "/runs/a?hours=6"
    for bad in ("https://evil.example/", "//evil.example", "/\\evil", "javascript:alert(1)", "runs", ""):
        assert _safe_next(bad, "/") == "/"


def test_sixteen_gpu_colours_are_told_apart() -> None:
    """Every pair of the palette at least 30 apart in CIELAB (the palette it replaced had pairs 10 apart)."""
    import itertools
    import math

    from gpufleet.api.web.svg import PALETTE

    def lab(hex_colour: str) -> tuple[float, float, float]:
        def lin(c: float) -> float:
            return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

        r, g, b = (lin(int(hex_colour[i : i + 2], 16) / 255) for i in (1, 3, 5))
        x, y, z = (
            (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047,
            0.2126 * r + 0.7152 * g + 0.0722 * b,
            (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883,
        )

        def f(t: float) -> float:
            return t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116

        return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))

    assert len(set(PALETTE)) == 16
    assert min(math.dist(lab(a), lab(b)) for a, b in itertools.combinations(PALETTE, 2)) >= 30


def test_time_ticks_fall_on_round_times() -> None:
    from datetime import UTC, datetime

    from gpufleet.api.web.svg import time_ticks

    t0 = datetime(2026, 12, 6, 1, 29, 17, tzinfo=UTC).timestamp()
    ticks = time_ticks(t0, t0 + 3600)
    assert [label for _, label in ticks] == ["01:30", "01:40", "01:50", "02:00", "02:10", "02:20"]
    assert all(t % 600 == 0 for t, _ in ticks)
    assert [label for _, label in time_ticks(t0, t0 + 90)][:3] == ["01:29:30", "01:29:45", "01:30:00"]
    assert all(t % 86400 == 0 for t, _ in time_ticks(t0, t0 + 6 * 86400))


def test_more_than_sixteen_gpus_become_small_multiples() -> None:
    from datetime import UTC, datetime

    from gpufleet.api.web.charts import gpu_charts
    from gpufleet.store.views import GpuSeries

    lo, hi = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 10, tzinfo=UTC)
    pts = [(lo.timestamp() + s, 50.0, 300.0) for s in range(0, 600, 10)]
    many = GpuSeries(10.0, {(f"n{n}", g): pts for n in range(3) for g in range(8)})
    out = gpu_charts(many, lo, hi)
    assert out.count('<figure class="chart">') == 6  # utilisation and power for each of 3 nodes
    assert "GPU-Util per GPU on n2" in out
    one = gpu_charts(GpuSeries(10.0, {("n0", g): pts for g in range(16)}), lo, hi)
    assert one.count('<figure class="chart">') == 2


def test_incident_spans_are_shaded_and_link_to_the_incident() -> None:
    from gpufleet.api.web.svg import Span

    pts: list[tuple[float, float | None]] = [(float(t), 50.0) for t in range(0, 600, 10)]
    out = line_chart(
        "U",
        [Series("n1/0", pts)],
        "%",
        spans=[Span(100.0, None, "#7 Starved <cpu>", "critical", "/incidents/7")],
    )
    svg = re.search(r"<svg class=\"plot\".*?</svg>", out, re.S)
    assert svg is not None
    root = ET.fromstring(svg.group(0))
    (a,) = root.findall("a")
    shade, bar = a.findall("rect")
    assert (
        a.get("href") == "/incidents/7"
        and shade.get("class") == "span critical"
        and bar.get("class") == "lane critical"
    )
    assert float(shade.get("x", 0)) > 56 and "#7 Starved &lt;cpu&gt;" in out
    assert "<figcaption>U</figcaption>" in out  # the chart keeps its own title
