"""Per-GPU charts of a run or a node, with the incidents that touch them shaded behind the lines.

Up to :data:`MAX_SERIES` GPUs share one chart, each in a colour of its own;
more are drawn as small multiples, one chart per node, so that no colour
means two GPUs in one picture.  Each GPU keeps its colour across the
utilisation and power charts of a page.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from gpufleet.api.web.cause import explain
from gpufleet.api.web.common import incident_href
from gpufleet.api.web.html import Markup, join
from gpufleet.api.web.svg import PALETTE, Series, Span, line_chart
from gpufleet.store.views import GpuSeries

MAX_SERIES = len(PALETTE)


def incident_spans(incidents: Iterable[Mapping[str, Any]], lo: datetime, hi: datetime) -> list[Span]:
    """A shade per incident overlapping [lo, hi): its kind and cause in words, linking to its page."""
    spans = []
    for i in incidents:
        start, end = i.get("start"), i.get("end")
        if start is None or start >= hi or (end is not None and end < lo):
            continue
        title = explain(i).title
        spans.append(
            Span(
                start.timestamp(),
                None if end is None else end.timestamp(),
                f"#{i['id']} {title}",
                str(i.get("severity") or "warning"),
                incident_href(int(i["id"])),
            )
        )
    return spans


def gpu_charts(series: GpuSeries, lo: datetime, hi: datetime, spans: Sequence[Span] = ()) -> Markup:
    """GPU-Util and board power per GPU over [lo, hi): one pair of charts, or one pair per node beyond
    :data:`MAX_SERIES` GPUs."""
    keys = sorted(series.points)
    rng = (lo.timestamp(), max(hi.timestamp(), lo.timestamp() + 1.0))
    groups: list[tuple[str, list[tuple[str, int]]]]
    if len(keys) <= MAX_SERIES:
        groups = [("", keys)]
    else:
        by_node: dict[str, list[tuple[str, int]]] = {}
        for k in keys:
            by_node.setdefault(k[0], []).append(k)
        groups = [(f" on {node}", ks) for node, ks in sorted(by_node.items())]
    out = []
    for suffix, ks in groups:
        one_node = len({k[0] for k in ks}) == 1 and suffix
        colours = {k: PALETTE[i % MAX_SERIES] for i, k in enumerate(ks)}

        def name(k: tuple[str, int], one: bool = bool(one_node)) -> str:
            return f"GPU {k[1]}" if one else f"{k[0]}/{k[1]}"

        util = [Series(name(k), [(t, u) for t, u, _ in series.points[k]], colours[k]) for k in ks]
        power = [Series(name(k), [(t, p) for t, _, p in series.points[k]], colours[k]) for k in ks]
        out.append(
            line_chart(
                f"GPU-Util per GPU{suffix}",
                util,
                "%",
                y_max=100.0,
                step_s=series.step_s,
                spans=spans,
                t_range=rng,
            )
        )
        out.append(
            line_chart(
                f"Board power per GPU{suffix}", power, "W", step_s=series.step_s, spans=spans, t_range=rng
            )
        )
    return join(out)
