"""A run's own accounting lines, kept between readers once its window has closed.

After the incident costs and the ledger (:mod:`gpufleet.accounting.incidents`), what an ended run's
accounting spends its time on is its own lines: ``gpufleet_accounting`` reads the energy of every GPU
and host of the run again, for every reader (the run's page, the Runs page, the finance report, the
fleet's ledger, ``/metrics``), about 22 ms per GPU-week.  Once the run has ended, the answer over its
whole window depends only on inputs the priced store's marks watch:
the run and its allocations, its nodes, its site's settings, the days of samples and of carbon
intensity it covers (:mod:`gpufleet.accounting.priced_store`).  So the first reader keeps the lines and
the next reads them back while every mark is current, exactly as incident pieces are kept.

A key is the run, its window [lo, hi) as :meth:`~gpufleet.store.run_model.Run.window` gives it, the
gap rule, the source and the accounting's text.  Lines are kept only for the whole window of an ended
run (a report's period that cuts it asks another question, answered live), when the database priced
that same window over the caller's allocations (a run changed since the caller loaded it gives other
lines, answered live and not kept), none is stale, and retention does not reach it; a running run's
window grows: never kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import psycopg

from gpufleet.accounting import priced_store
from gpufleet.accounting.incidents import Piece
from gpufleet.accounting.lines import Line, Source, per_run, rows
from gpufleet.store.run_model import Run, load_runs


def run_lines(
    conn: psycopg.Connection,
    runs: Sequence[Run],
    since: datetime | None,
    until: datetime | None,
    now: datetime,
    *,
    max_gap_s: float,
    source: Source,
    kept: bool = True,
) -> dict[str, list[Line]]:
    """Each run's own lines (one per currency its window was priced in), clipped to [since, until).

    ``kept``: read the lines an earlier reader kept while their inputs are unchanged, and keep the lines
    of closed windows priced here; the figures are the same either way.  Call it in the snapshot the
    rest of the answer reads (:func:`gpufleet.accounting.snapshot.snapshot`)."""
    ids = [r.run_id for r in runs]
    if not ids:
        return {}
    if not kept:
        live = rows(conn, since, until, now, run_ids=ids, max_gap_s=max_gap_s, source=source)
        return per_run(Line(*r) for r in live)
    caller = {r.run_id: r for r in runs}
    windows = {r.run_id: r.window(now, since, until) for r in runs}
    windows = {rid: w for rid, w in windows.items() if priced_store.whole_window(caller[rid], w, now)}
    digests = {
        rid: priced_store.run_digest(rid, lo, hi, max_gap_s, source) for rid, (lo, hi) in windows.items()
    }
    have = priced_store.lookup(conn, set(digests.values()))
    out: dict[str, list[Line]] = {}
    for rid, d in digests.items():
        if d in have:
            out[rid] = [Line(*r) for r in have[d]]
    todo = [rid for rid in dict.fromkeys(ids) if rid not in out]
    if not todo:
        return out
    keyed = {
        rid: [Piece(rid, node, gpu, *windows[rid], 1.0) for node, gpu in r.allocations]
        for r in runs
        if (rid := r.run_id) in windows and rid in todo and r.allocations
    }
    fills = priced_store.plan(conn, keyed, {rid: digests[rid] for rid in keyed})
    # the key and the marks follow the caller's run: lines priced over another window or other
    # allocations (the run changed since the caller loaded it) would rest on marks of neither, so they
    # are answered and not kept
    same = {r.run_id for r in load_runs(conn, list(fills)) if r == caller[r.run_id]} if fills else set()
    got: dict[str, list[tuple[Any, ...]]] = {}
    for r in rows(conn, since, until, now, run_ids=todo, max_gap_s=max_gap_s, source=source):
        if r[0] == "run" and r[1] is not None:
            got.setdefault(r[1], []).append(r)
    keep = []
    for rid in todo:
        mine = got.get(rid, [])
        out[rid] = [Line(*r) for r in mine]
        fill = fills.get(rid)
        if (
            fill is not None and rid in same and mine and not any(r[-1] for r in mine)  # never a stale answer
        ):
            keep.append(replace(fill, rows=tuple(mine)))
    priced_store.keep(conn, keep)
    return out
