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
    out = line_chart("U <&>", [Series("n1/0 <x>", pts), Series("n1/1", [(0.0, 20.0), (1.0, 30.0)])], "%",
                     y_max=100.0, step_s=1.0)
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
