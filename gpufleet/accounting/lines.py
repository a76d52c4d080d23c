"""Accounting lines from the database's own definition (``gpufleet_accounting``, migration 0004).

Every figure the API, the CLI, replay, the web view and the Grafana energy
board show comes from that one SQL function (``gpufleet.db.accounting_sql``
documents it); this module calls it and hands its rows on as
:class:`Line` values.  Money arrives rounded to the currency's minor units
and energies to 1e-9 kWh, as :class:`~decimal.Decimal`, so sums made here
are exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Literal

import psycopg

Source = Literal["auto", "rollup", "raw"]
SOURCES: tuple[Source, ...] = ("auto", "rollup", "raw")
Detail = Literal["line", "segment", "step"]

ZERO = Decimal(0)


@dataclass(frozen=True)
class Line:
    """One row of ``gpufleet_accounting``: a run, the unallocated part or the total, at one pricing site
    (and, with ``detail`` segment or step, one part of the window)."""

    line: str
    run_id: str | None
    site: str | None
    start: datetime | None
    end: datetime | None
    gpu_count: int | None
    gpu_equivalents: float | None
    #: allocated (runs) or accounted (unallocated, total) GPU-seconds, share-weighted
    gpu_s: float | None
    #: of those, inside counted intervals
    covered_s: float
    #: gpu_s and covered_s in hours, rounded to 1e-9 h
    gpu_hours: Decimal | None
    covered_hours: Decimal | None
    #: covered ÷ accounted GPU-seconds (0 without any)
    coverage: float
    gpu_kwh: Decimal
    host_kwh: Decimal
    it_kwh: Decimal
    facility_kwh: Decimal
    pue: Decimal | None
    co2e_kg: Decimal
    co2e_unknown_kwh: Decimal
    carbon_source: str | None
    g_co2e_per_kwh: float | None
    price_source: str | None
    price_per_kwh: float | None
    currency: str | None
    minor_units: int
    energy_cost: Decimal
    compute_cost: Decimal | None
    total_cost: Decimal
    stale: bool


def lines(conn: psycopg.Connection, since: datetime | None, until: datetime | None, now: datetime, *,
          run_ids: Sequence[str] | None = None, fleet: bool = False, max_gap_s: float = 60.0,
          source: Source = "auto", detail: Detail = "line", step: timedelta | None = None) -> list[Line]:
    """Rows of ``gpufleet_accounting``: runs overlapping [since, until) (or the runs ``run_ids``, each
    clipped to the period when one is given), and with ``fleet`` the unallocated and total lines."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if detail == "step" and step is None:
        raise ValueError("detail 'step' needs a step")
    rows = conn.execute(
        "SELECT * FROM gpufleet_accounting(%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (since, until, now, None if run_ids is None else list(run_ids), fleet, max_gap_s, source, detail, step),
    ).fetchall()
    return [Line(*r) for r in rows]
