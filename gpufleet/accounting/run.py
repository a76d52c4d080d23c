"""Per-run accounting: the body of ``GET /v1/runs/{run_id}/accounting`` (contracts.md section 3).

The API, the CLI report, the web view and ``gpufleet replay`` all call
:func:`run_accounting` (or :func:`account_runs` for many runs); the figures
come from the database's ``gpufleet_accounting`` (:mod:`gpufleet.accounting.lines`),
this module adds the run's facts, the values in force and its efficiency.

The window is the run's [start, end); a run still running (no end, or an end
in the future) is accounted up to ``now``.  ``since``/``until`` clip the
window further (reports for a period); ``gpu_hours``, energy and cost then
cover only the clipped part, while ``start``/``end`` stay the run's own.
With declared sharing a GPU counts with its share: ``gpu_hours`` is the
window times the shares held (``gpu_equivalents``), ``gpu_count`` the GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row

from gpufleet.accounting.efficiency import efficiency
from gpufleet.accounting.ledger import Ledger, ledger_body, losses
from gpufleet.accounting.lines import Line, Source, lines
from gpufleet.accounting.money import number, rounded
from gpufleet.accounting.result import AccountingBody
from gpufleet.accounting.snapshot import snapshot
from gpufleet.config import AccountingSettings
from gpufleet.db.accounting_sql import GPU_MODEL_EXPR
from gpufleet.store.run_model import Run, load_runs
from gpufleet.store.runs import NotFound
from gpufleet.timeparse import iso

#: The contract's fields, in the contract's order (also the CSV's first columns).
CONTRACT_FIELDS: tuple[str, ...] = (
    "run_id", "start", "end", "gpu_count", "gpu_hours", "gpu_kwh", "host_kwh", "it_kwh", "pue", "facility_kwh",
    "co2e_kg", "energy_cost", "compute_cost", "total_cost", "currency", "coverage",
)

_MODELS_SQL = f"""
SELECT a.run_id, a.sharing, {GPU_MODEL_EXPR} AS model, count(*) AS gpus, sum(a.share) AS shares
FROM run_allocations a LEFT JOIN nodes nd ON nd.node = a.node WHERE a.run_id = ANY(%s)
GROUP BY 1, 2, 3 ORDER BY 1, 3 NULLS LAST, 2"""

_RATES_SQL = """
SELECT t0, t1, pue, price_per_kwh, gpu_hour_price, carbon_region, carbon_g_per_kwh
FROM gpufleet_site_periods(%s, %s, %s)"""

_MODEL_PRICES_SQL = """
SELECT t0, t1, gpu_model_key, price FROM gpufleet_gpu_hour_prices(%s, %s, %s, %s) WHERE gpu_model_key <> ''"""


def used_source(source: Source, stale: bool) -> str:
    if source == "raw":
        return "raw"
    return "mixed" if stale and source == "auto" else "rollup"


def _rates(conn: psycopg.Connection, site: str | None, lo: datetime, hi: datetime,
           models: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The site's settings in force during [lo, hi), period by period, and its GPU-model prices."""
    if site is None:
        return [], []
    end = hi if hi > lo else lo + timedelta(microseconds=1)
    periods = [{"from": iso(t0), "to": iso(t1), "pue": pue, "price_per_kwh": price, "gpu_hour_price": ghp,
                "carbon_region": region, "carbon_g_per_kwh": constant}
               for t0, t1, pue, price, ghp, region, constant in conn.execute(_RATES_SQL, (site, lo, end)).fetchall()]
    by_model: list[dict[str, Any]] = []
    for m in models:
        for t0, t1, key, price in conn.execute(_MODEL_PRICES_SQL, (site, m["model"], lo, end)).fetchall():
            entry = {"gpu_model": key, "from": iso(t0), "to": iso(t1), "gpu_hour_price": price}
            if entry not in by_model:
                by_model.append(entry)
    return periods, by_model


def _body(conn: psycopg.Connection, run: Run, line: Line, now: datetime, max_gap_s: float,
          source: Source, since: datetime | None, until: datetime | None, models: list[dict[str, Any]],
          segments: list[Line] | None, lost: dict[str, Any], ledger: Ledger | None) -> AccountingBody:
    lo, hi = run.window(now, since, until)
    gpu_hours = number(line.gpu_hours) or 0.0
    compute = line.compute_cost
    carbon_known = line.carbon_source not in (None, "none")
    rates, model_prices = _rates(conn, run.site, lo, hi, [m for m in models if m["model"]])
    effective_price = (float(compute) / gpu_hours if compute is not None and gpu_hours > 0
                       else (rates[0]["gpu_hour_price"] if rates else 0.0))
    fac = float(line.facility_kwh)
    body: AccountingBody = {
        "run_id": run.run_id,
        "start": iso(run.start),
        "end": iso(run.end),
        "gpu_count": line.gpu_count or len(run.allocations),
        "gpu_hours": gpu_hours,
        "gpu_kwh": number(line.gpu_kwh),
        "host_kwh": number(line.host_kwh),
        "it_kwh": number(line.it_kwh),
        "pue": number(line.pue) if line.pue is not None else 1.0,
        "facility_kwh": fac,
        "co2e_kg": number(line.co2e_kg) if carbon_known else None,
        "energy_cost": number(line.energy_cost),
        "compute_cost": number(compute) or 0.0,
        "total_cost": number(line.total_cost),
        "currency": line.currency,
        "coverage": line.coverage,
        # extras
        "name": run.name,
        "site": run.site,
        "team": run.team,
        "state": run.state_at(now),
        "window_start": iso(lo),
        "window_end": iso(hi),
        "source": used_source(source, line.stale),
        "max_gap_s": max_gap_s,
        "carbon_source": line.carbon_source or "none",
        "price_source": line.price_source or "none",
        "gpu_hour_price": rounded(effective_price, 6),
        "gpu_equivalents": line.gpu_equivalents if line.gpu_equivalents is not None else 0.0,
        "gpu_models": [{"model": m["model"], "gpus": m["gpus"], "sharing": m["sharing"], "shares": m["shares"]}
                       for m in models],
        "co2e_unknown_kwh": number(line.co2e_unknown_kwh),
        "g_co2e_per_kwh": (rounded(float(line.co2e_kg) * 1000.0 / (fac - float(line.co2e_unknown_kwh)), 6)
                           if carbon_known and fac - float(line.co2e_unknown_kwh) > 0 else None),
        "minor_units": line.minor_units,
        "rates": rates,
        "gpu_model_prices": model_prices,
        "efficiency": efficiency(conn, run, lo, hi, run.allocations, float(line.it_kwh),
                                 count_after_end=run.end is not None and run.end <= now and until is None,
                                 gpu_hours=gpu_hours,
                                 productive_gpu_hours=None if ledger is None
                                 else number(ledger["productive"].gpu_hours) or 0.0),
        "lost_to_incidents": {**lost, "currency": line.currency, "minor_units": line.minor_units}
        if lost.get("currency") is None else lost,
    }
    if ledger is not None:
        body["ledger"] = ledger_body(ledger, carbon_known)
    if segments is not None:
        body["segments"] = [{
            "start": iso(s.start), "end": iso(s.end), "gpu_kwh": number(s.gpu_kwh), "host_kwh": number(s.host_kwh),
            "facility_kwh": number(s.facility_kwh), "g_co2e_per_kwh": s.g_co2e_per_kwh,
            "price_per_kwh": s.price_per_kwh if s.price_per_kwh is not None else 0.0,
            "co2e_kg": None if s.g_co2e_per_kwh is None else number(s.co2e_kg),
            "energy_cost": number(s.energy_cost),
        } for s in segments]
    return body


def account_runs(conn: psycopg.Connection, runs: Iterable[Run], *, now: datetime | None = None,
                 max_gap_s: float | None = None, source: Source = "auto", since: datetime | None = None,
                 until: datetime | None = None, segments: bool = False, ledger: bool = True) -> list[AccountingBody]:
    """Accounting bodies of ``runs``, all in one consistent snapshot (``ledger``: with each run's ledger)."""
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    runs = list(runs)
    if not runs:
        return []
    ids = [r.run_id for r in runs]
    with snapshot(conn):
        by_run = {ln.run_id: ln for ln in lines(conn, since, until, now, run_ids=ids, max_gap_s=gap, source=source)
                  if ln.line == "run"}
        segs: dict[str, list[Line]] | None = None
        if segments:
            segs = {}
            for ln in lines(conn, since, until, now, run_ids=ids, max_gap_s=gap, source=source, detail="segment"):
                if ln.line == "run" and ln.run_id is not None and ln.start is not None and ln.end is not None:
                    segs.setdefault(ln.run_id, []).append(ln)
        return bodies(conn, runs, by_run, now=now, max_gap_s=gap, source=source, since=since, until=until,
                      segments=segs, ledger=ledger)


def bodies(conn: psycopg.Connection, runs: Sequence[Run], by_run: Mapping[str | None, Line], *,
           now: datetime, max_gap_s: float, source: Source, since: datetime | None, until: datetime | None,
           segments: Mapping[str, list[Line]] | None = None, ledger: bool = True) -> list[AccountingBody]:
    """Bodies of ``runs`` from their accounting lines (in the caller's snapshot), with (``ledger``) each
    run's ledger and the goodput it gives."""
    models: dict[str, list[dict[str, Any]]] = {}
    with conn.cursor(row_factory=dict_row) as cur:
        for m in cur.execute(_MODELS_SQL, ([r.run_id for r in runs],)).fetchall():
            models.setdefault(m.pop("run_id"), []).append(m)
    lost, ledgers = losses(conn, runs, {r.run_id: r.window(now, since, until) for r in runs}, by_run, now=now,
                           max_gap_s=max_gap_s, source=source, with_ledger=ledger)
    out = []
    for r in runs:
        segs = None if segments is None else sorted(segments.get(r.run_id, []), key=_start)
        out.append(_body(conn, r, by_run[r.run_id], now, max_gap_s, source, since, until,
                         models.get(r.run_id, []), segs, lost[r.run_id], ledgers.get(r.run_id)))
    return out


def _start(ln: Line) -> datetime:
    assert ln.start is not None
    return ln.start


def run_accounting(conn: psycopg.Connection, run_id: str, *, now: datetime | None = None,
                   max_gap_s: float | None = None, source: Source = "auto", since: datetime | None = None,
                   until: datetime | None = None, segments: bool = False) -> AccountingBody:
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
