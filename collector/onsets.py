"""Date a new incident from where its data shows it began, also when that is before the window.

A live sweep sees one window (``detect.window_s``) of the latest samples.  When
data arrives late (agents back-filling their spool after an outage, a collector
catching up, a demo replaying its history), a condition may be well under way
before the first window that holds it, and its detector can only date it from
that window's start: an incident opened minutes after the pattern the run page
plots.  So when a sweep is about to open an incident whose finding begins at
the start of its window (the condition was already there when the window
began), :func:`backdate` looks back: it reads earlier windows of the run's
nodes from the sample tables, half a window apart, runs the same detector
there, and moves the start back while the condition is still found, up to
``max_windows`` windows.  Only new incidents are looked back for, so the cost
is a few reads of one run's nodes per incident opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import psycopg

from gpufleet.collector.detectors.registry import DETECTORS
from gpufleet.collector.detectors.window import Finding, RunInfo, Window
from gpufleet.detectconfig import DetectorConfig

log = logging.getLogger(__name__)

#: How far back one incident is dated, in windows.
MAX_WINDOWS = 12


def at_window_start(f: Finding, window: Window, slack_s: float) -> bool:
    """The finding begins where its window does: the condition may have begun earlier."""
    return f.start <= window.t_start + slack_s


def backdate(
    conn: psycopg.Connection,
    findings: Iterable[Finding],
    window: Window,
    config: DetectorConfig,
    window_s: float,
    open_scopes: set[str],
    load: Callable[..., Window] | None = None,
    max_windows: int = MAX_WINDOWS,
) -> int:
    """Move back the start of each new incident's finding (one whose scope is not in ``open_scopes``) that
    begins at its window's start, to where earlier windows of its run still show it.  Returns how many
    findings moved."""
    read = load if load is not None else _window_at
    slack = max(0.25 * window_s, 1.0)
    moved = 0
    for f in findings:
        if f.scope_key in open_scopes or f.run_id is None or not at_window_start(f, window, slack):
            continue
        run = next((r for r in window.runs if r.run_id == f.run_id), None)
        detector = DETECTORS.get(f.kind)
        if run is None or detector is None:
            continue
        nodes = {k[0] for k in run.allocations}
        start = f.start
        t_end = window.t_end
        for _ in range(max_windows):
            t_end -= 0.5 * window_s
            if t_end - window_s < run.start - window_s:
                break
            try:
                past = read(conn, t_end, window_s, nodes, run, window.node_facts)
                same = [g for g in detector(past, config) if g.scope_key == f.scope_key]
            except Exception:  # dating is a refinement: never lose the incident over it
                log.exception("looking back for the onset of %s failed", f.scope_key)
                break
            if not same or same[0].start >= start:
                break
            start = same[0].start
            if not at_window_start(same[0], past, slack):
                break
        if start < f.start:
            f.start = start
            moved += 1
    return moved


def _window_at(
    conn: psycopg.Connection,
    t_end: float,
    window_s: float,
    nodes: set[str],
    run: RunInfo,
    node_facts: Mapping[str, dict[str, Any]],
) -> Window:
    from gpufleet.collector.window_cache import WindowCache

    cache = WindowCache(window_s, node_filter=lambda n: n in nodes)
    cache.load(conn, t_end - window_s, t_end)
    return cache.window(t_end, [run], dict(node_facts))
