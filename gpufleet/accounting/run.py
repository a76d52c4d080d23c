"""Per-run accounting: the body of ``GET /v1/runs/{run_id}/accounting`` (contracts.md section 3).

This is the one place that turns a run into numbers; the API, the CLI report
and ``gpufleet replay`` all call :func:`run_accounting` (or
:func:`account_runs` for many runs).

The window is the run's [start, end); a run still running (no end, or an end
in the future) is accounted up to ``now``.  ``since``/``until`` clip the
window further (reports for a period); ``gpu_hours``, energy and cost then
cover only the clipped part, while ``start``/``end`` stay the run's own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.accounting.bill import bill
from gpufleet.accounting.efficiency import efficiency
from gpufleet.accounting.energy import GpuClaim, HostClaim, Source, measure
from gpufleet.accounting.nodes import host_shares, node_gpu_counts
from gpufleet.accounting.snapshot import snapshot
from gpufleet.accounting.tariffs import load_tariff
from gpufleet.config import AccountingSettings
from gpufleet.store.runs import NotFound
from gpufleet.timeparse import iso

#: The contract's fields, in the contract's order (also the CSV's first columns).
CONTRACT_FIELDS: tuple[str, ...] = (
    "run_id", "start", "end", "gpu_count", "gpu_hours", "gpu_kwh", "host_kwh", "it_kwh", "pue", "facility_kwh",
    "co2e_kg", "energy_cost", "compute_cost", "total_cost", "currency", "coverage",
)

_RUNS_SQL = """
SELECT r.run_id, r.name, r.site, r.team, r.start, r."end", r.params,
  COALESCE((SELECT array_agg(a.node ORDER BY a.node, a.gpu) FROM run_allocations a WHERE a.run_id = r.run_id),
           '{}') AS nodes,
  COALESCE((SELECT array_agg(a.gpu ORDER BY a.node, a.gpu) FROM run_allocations a WHERE a.run_id = r.run_id),
           '{}') AS gpus
FROM runs r"""


def load_runs(conn: psycopg.Connection, run_ids: Sequence[str] | None = None, since: datetime | None = None,
              until: datetime | None = None) -> list[dict[str, Any]]:
    """Runs (with ``allocations`` as (node, gpu) pairs) by id, or those overlapping [since, until)."""
    where: list[str] = ["TRUE"]
    params: list[Any] = []
    if run_ids is not None:
        where.append("r.run_id = ANY(%s)")
        params.append(list(run_ids))
    if since is not None:
        where.append('(r."end" IS NULL OR r."end" > %s)')
        params.append(since)
    if until is not None:
        where.append("r.start < %s")
        params.append(until)
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(_RUNS_SQL + " WHERE " + " AND ".join(where) + " ORDER BY r.start, r.run_id",
                           params).fetchall()
    for r in rows:
        r["allocations"] = list(zip(r.pop("nodes"), (int(g) for g in r.pop("gpus")), strict=True))
    return rows


def run_window(run: dict[str, Any], now: datetime, since: datetime | None = None,
               until: datetime | None = None) -> tuple[datetime, datetime]:
    """[lo, hi) accounted for ``run``: its [start, end) up to ``now``, clipped to [since, until)."""
    hi = now if run["end"] is None else min(run["end"], now)
    lo = run["start"] if since is None else max(run["start"], since)
    if until is not None:
        hi = min(hi, until)
    return lo, max(lo, hi)


def _account(conn: psycopg.Connection, run: dict[str, Any], now: datetime, max_gap_s: float, source: Source,
             since: datetime | None, until: datetime | None, segments: bool) -> dict[str, Any]:
    lo, hi = run_window(run, now, since, until)
    allocations: list[tuple[str, int]] = run["allocations"]
    gpu_count = len(allocations)
    duration_s = (hi - lo).total_seconds()
    tariff = load_tariff(conn, run["site"], lo, hi)
    edges = tariff.edges(lo, hi) if hi > lo else [lo, lo]
    held: dict[str, int] = {}
    for node, _ in allocations:
        held[node] = held.get(node, 0) + 1
    used_source: str = source if source != "auto" else "rollup"
    by_segment = {}
    if hi > lo and allocations:
        shares = host_shares(held, node_gpu_counts(conn, held, lo, hi))
        measured = measure(conn, edges, [GpuClaim("run", n, g, lo, hi) for n, g in allocations],
                           [HostClaim("run", n, lo, hi, s) for n, s in shares.items()],
                           max_gap_s=max_gap_s, source=source)
        used_source = measured.source
        by_segment = {seg: s for (_, seg), s in measured.sums.items()}
    b = bill(tariff, edges, by_segment, with_segments=segments)
    gpu_hours = duration_s * gpu_count / 3600.0
    compute_cost = gpu_hours * tariff.gpu_hour_price
    gpu_s = duration_s * gpu_count
    body: dict[str, Any] = {
        "run_id": run["run_id"],
        "start": iso(run["start"]),
        "end": iso(run["end"]),
        "gpu_count": gpu_count,
        "gpu_hours": gpu_hours,
        "gpu_kwh": b.gpu_kwh,
        "host_kwh": b.host_kwh,
        "it_kwh": b.it_kwh,
        "pue": tariff.pue,
        "facility_kwh": b.facility_kwh,
        "co2e_kg": None if tariff.carbon_source == "none" else b.co2e_kg,
        "energy_cost": b.energy_cost,
        "compute_cost": compute_cost,
        "total_cost": b.energy_cost + compute_cost,
        "currency": tariff.currency,
        "coverage": min(b.covered_gpu_s / gpu_s, 1.0) if gpu_s > 0 else 0.0,
        # extras
        "name": run.get("name"),
        "site": run["site"],
        "team": run.get("team"),
        "state": "running" if run["end"] is None or run["end"] > now else "ended",
        "window_start": iso(lo),
        "window_end": iso(hi),
        "source": used_source,
        "max_gap_s": max_gap_s,
        "carbon_source": tariff.carbon_source,
        "price_source": tariff.price_source,
        "gpu_hour_price": tariff.gpu_hour_price,
        "efficiency": efficiency(conn, run, lo, hi, allocations, b.it_kwh,
                                 count_after_end=run["end"] is not None and run["end"] <= now and until is None),
    }
    if segments:
        body["segments"] = b.segments
    return body


def account_runs(conn: psycopg.Connection, runs: Iterable[dict[str, Any]], *, now: datetime | None = None,
                 max_gap_s: float | None = None, source: Source = "auto", since: datetime | None = None,
                 until: datetime | None = None, segments: bool = False) -> list[dict[str, Any]]:
    """Accounting bodies of ``runs`` (rows of :func:`load_runs`), each in one consistent snapshot."""
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    out = []
    for run in runs:
        with snapshot(conn):
            out.append(_account(conn, run, now, gap, source, since, until, segments))
    return out


def run_accounting(conn: psycopg.Connection, run_id: str, *, now: datetime | None = None,
                   max_gap_s: float | None = None, source: Source = "auto", since: datetime | None = None,
                   until: datetime | None = None, segments: bool = False) -> dict[str, Any]:
    """The accounting of one run, exactly the body of ``GET /v1/runs/{run_id}/accounting``.

    ``now``: the clock (replay passes its simulated one); ``max_gap_s``:
    longest interval power integration bridges (default: the settings'
    default, 60 s); ``source``: ``auto`` (rollups where current, raw
    elsewhere), ``rollup`` or ``raw``.  Raises ``NotFound`` for an unknown run.
    """
    runs = load_runs(conn, [run_id])
    if not runs:
        raise NotFound(f"run {run_id!r} not found")
    return account_runs(conn, runs, now=now, max_gap_s=max_gap_s, source=source, since=since, until=until,
                        segments=segments)[0]
