"""Accounting lines from the database's own definition (``gpufleet_accounting``, migration 0004).

Every figure the API, the CLI, replay, the web view and the Grafana energy
board show comes from that one SQL function (``gpufleet.db.accounting_sql``
documents it); this module calls it and hands its rows on as
:class:`Line` values.  Money arrives as the accounting computes it (to 1e-9
of the currency) and energies to 1e-9 kWh, as :class:`~decimal.Decimal`, so
sums made here are exact; rounding money to minor units is for people
(:mod:`gpufleet.accounting.money`).

A line is priced in one currency: a run whose window crosses a change of its
site's currency has one line per currency (:func:`per_run` gathers them,
:func:`combine` adds them up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal, ParamSpec

import psycopg

from gpufleet.db.accounting_sql import GONE_AFTER_S

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
    #: Currencies a combined line's money is in (:func:`combine`); empty: just ``currency``.  With more
    #: than one, the money fields hold nothing meaningful and readers take ``costs`` instead.
    currencies: tuple[str, ...] = ()
    #: Money by currency of a combined line: currency -> (energy cost, compute cost).
    costs: tuple[tuple[str, Decimal, Decimal], ...] = ()

    @property
    def mixed(self) -> bool:
        """Whether the line's money is in more than one currency (no single figure exists)."""
        return len(self.currencies) > 1

    def by_currency(self) -> dict[str, tuple[Decimal, Decimal]]:
        """(energy cost, compute cost) per currency (none without a currency: prices are 0 there)."""
        if self.costs:
            return {c: (e, k) for c, e, k in self.costs}
        if self.currency is None:
            return {}
        return {self.currency: (self.energy_cost, self.compute_cost or ZERO)}


P = ParamSpec("P")


def rows(
    conn: psycopg.Connection,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
    *,
    run_ids: Sequence[str] | None = None,
    fleet: bool = False,
    max_gap_s: float = 60.0,
    source: Source = "auto",
    detail: Detail = "line",
    step: timedelta | None = None,
    gone_after_s: float = GONE_AFTER_S,
) -> list[tuple[Any, ...]]:
    """Rows of ``gpufleet_accounting``, as the database returns them: runs overlapping [since, until) (or
    the runs ``run_ids``, each clipped to the period when one is given), and with ``fleet`` the
    unallocated and total lines (a fleet GPU counted from when it joined until it was silent for
    ``gone_after_s``).  :func:`lines` reads them as lines; the priced store keeps them as they are."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {source!r}")
    if detail == "step" and step is None:
        raise ValueError("detail 'step' needs a step")
    return conn.execute(
        "SELECT * FROM gpufleet_accounting(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            since,
            until,
            now,
            None if run_ids is None else list(run_ids),
            fleet,
            max_gap_s,
            source,
            detail,
            step,
            gone_after_s,
        ),
    ).fetchall()


def _as_lines(read: Callable[P, list[tuple[Any, ...]]]) -> Callable[P, list[Line]]:
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> list[Line]:
        return [Line(*r) for r in read(*args, **kwargs)]

    wrapped.__doc__ = read.__doc__
    return wrapped


#: :func:`rows`, each read as a :class:`Line` (same arguments).
lines = _as_lines(rows)


def by_day(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    now: datetime,
    *,
    fleet: bool = False,
    max_gap_s: float = 60.0,
    source: Source = "auto",
    gone_after_s: float = GONE_AFTER_S,
) -> list[Line]:
    """The lines of detail ``step`` with a step of one UTC day, read as one line-detail call per day.

    The lines are the same (their decimal figures equal; the float seconds may differ in their last bit,
    summed in another order), but a fleet-wide line over whole hours is summed from the fleet's kept hours
    (:mod:`gpufleet.accounting.fleet_hours`), where detail ``step`` prices every GPU's time live: a week
    of 10,000 GPUs by day took 56 s in one step call and 2.5 s a day at a time.  The days are separate
    statements: call it inside one snapshot (:func:`gpufleet.accounting.snapshot.snapshot`)."""
    kw: dict[str, Any] = {
        "fleet": fleet,
        "max_gap_s": max_gap_s,
        "source": source,
        "gone_after_s": gone_after_s,
    }
    if since >= now:  # nothing to price: the step's own empty lines
        return lines(conn, since, until, now, detail="step", step=timedelta(days=1), **kw)
    out: list[Line] = []
    lo = since
    while lo < until and lo < now:  # a day after now has no time to account (a step has no part there)
        day = lo.astimezone(UTC)
        midnight = datetime(day.year, day.month, day.day, tzinfo=UTC)
        hi = min(until, midnight + timedelta(days=1))
        for ln in lines(conn, lo, hi, now, **kw):
            # a step's fleet lines start at their day's midnight, even where the period starts later
            out.append(ln if ln.line == "run" else replace(ln, start=midnight))
        lo = hi
    return out


def per_run(rows: Iterable[Line]) -> dict[str, list[Line]]:
    """The run lines of ``rows`` by run id (one per currency the run's window was priced in)."""
    out: dict[str, list[Line]] = {}
    for ln in rows:
        if ln.line == "run" and ln.run_id is not None:
            out.setdefault(ln.run_id, []).append(ln)
    return out


def combine(parts: Sequence[Line]) -> Line:
    """One run's lines as one: time, energies and CO2e added up, coverage and PUE of the sums, money
    added up per currency (:attr:`Line.costs`); the money fields are the sums when there is one currency.

    Lines of one run in several currencies cover disjoint parts of its window, so every figure but
    money adds up; money in two currencies has no one figure.
    """
    if len(parts) == 1:
        return parts[0]
    if not parts:
        raise ValueError("no line to combine")
    first = parts[0]

    def total(name: str) -> Decimal:
        return sum((getattr(p, name) or ZERO for p in parts), ZERO)

    gpu_s = sum(p.gpu_s or 0.0 for p in parts)
    covered = sum(p.covered_s for p in parts)
    it, fac = total("it_kwh"), total("facility_kwh")
    costs: dict[str, list[Decimal]] = {}
    for p in parts:
        for cur, (e, c) in p.by_currency().items():
            acc = costs.setdefault(cur, [ZERO, ZERO])
            acc[0] += e
            acc[1] += c
    currencies = tuple(sorted(costs))
    single = costs[currencies[0]] if len(currencies) == 1 else None
    sources = {p.carbon_source for p in parts}
    prices = {p.price_source for p in parts}
    return replace(
        first,
        start=min((p.start for p in parts if p.start), default=None),
        end=max((p.end for p in parts if p.end), default=None),
        gpu_s=gpu_s,
        covered_s=covered,
        gpu_hours=total("gpu_hours"),
        covered_hours=total("covered_hours"),
        coverage=min(covered / gpu_s, 1.0) if gpu_s > 0 else 0.0,
        gpu_kwh=total("gpu_kwh"),
        host_kwh=total("host_kwh"),
        it_kwh=it,
        facility_kwh=fac,
        pue=(fac / it).quantize(Decimal("1e-6")) if it > 0 else first.pue,
        co2e_kg=total("co2e_kg"),
        co2e_unknown_kwh=total("co2e_unknown_kwh"),
        carbon_source=sources.pop() if len(sources) == 1 else "mixed",
        g_co2e_per_kwh=first.g_co2e_per_kwh if len({p.g_co2e_per_kwh for p in parts}) == 1 else None,
        price_source=prices.pop() if len(prices) == 1 else "time_of_use",
        price_per_kwh=first.price_per_kwh if len({p.price_per_kwh for p in parts}) == 1 else None,
        currency=currencies[0] if len(currencies) == 1 else None,
        energy_cost=single[0] if single else ZERO,
        compute_cost=single[1] if single else (None if currencies else ZERO),
        total_cost=single[0] + single[1] if single else ZERO,
        stale=any(p.stale for p in parts),
        currencies=currencies,
        costs=tuple((c, e, k) for c, (e, k) in sorted(costs.items())),
    )
