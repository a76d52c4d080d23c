"""GPU run costs as a FOCUS export, so FinOps tools ingest them beside cloud bills.

FOCUS (the FinOps Open Cost and Usage Specification) is the column set cloud
providers' cost exports share; :data:`FOCUS_COLUMNS` are its 1.1 columns in the
specification's (alphabetical) order, then ``x_`` columns of our own, which the
specification reserves for providers' extensions.

Each run is charged per day (``granularity="day"``, the default, as cloud
exports are) or over its whole window in the period (``"run"``), in two rows:
its GPU time (``ServiceName`` GPU compute, in GPU-hours at the GPU-hour price in
force) and its facility energy (GPU energy, in kWh at the energy price in force,
the PUE included).  The GPU time no run held is charged its energy too, at the
node's site (``ResourceId`` ``unallocated``), so the export adds up to the
finance report.  A run across a change of its site's currency has rows in each.

The mapping, for a fleet that bills itself (internal chargeback):

* ``ProviderName``, ``PublisherName``, ``InvoiceIssuerName``, ``BillingAccountId``
  and ``RegionId``: the site, the data center that provides the GPUs and whose
  prices apply; ``SubAccountId``: the run's team;
* ``ResourceId``: the run id; ``ResourceName``: its name; ``ResourceType``:
  ``GPU run``; ``SkuId``: ``gpu-hour`` (or ``gpu-hour:<model key>`` where the
  site prices that model) and ``facility-kwh``;
* ``BilledCost`` = ``EffectiveCost`` = ``ListCost`` = ``ContractedCost``: no
  discounts or commitments exist here; unit prices are the cost per unit over
  the charge period (a time-of-use tariff makes them averages);
* ``Tags``: a JSON object with the run, team and site, and the scheduler's
  labels (Slurm account, user and partition; Kubernetes namespace).

Money keeps the precision the accounting computes (to 1e-9), as cloud cost
exports carry 6-10 decimals: a FinOps tool sums rows and rounds once.  A row
whose money cannot be computed (a stored price outside its bounds) keeps its
quantities, has empty cost cells and says why in ``x_Errors``; nothing is left
out.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, Literal

import psycopg

from gpufleet.accounting.line_errors import problems
from gpufleet.accounting.lines import ZERO, Line, Source, by_day, lines
from gpufleet.accounting.snapshot import snapshot
from gpufleet.config import AccountingSettings
from gpufleet.csvsafe import safe_text
from gpufleet.store.run_model import Run, load_runs
from gpufleet.timeparse import iso

Granularity = Literal["day", "run"]
GRANULARITIES: tuple[Granularity, ...] = ("day", "run")

#: The most days a daily export covers.  Each day is a charge period priced at every site's rates, so
#: the work grows with days times sites whether or not any GPU ran: a period of centuries held the
#: database for minutes.  Ten years of days is more than any cloud bill export offers; longer periods
#: go per run (``granularity="run"``) or in pieces.
MAX_DAYS = 3660


def period_problem(since: datetime, until: datetime, granularity: str) -> str | None:
    """Why [since, until) cannot be exported at ``granularity``, or None."""
    if granularity == "day" and until - since > timedelta(days=MAX_DAYS):
        return (
            f"a daily export covers at most {MAX_DAYS} days, this period has {(until - since).days}: "
            "ask for granularity run, or export shorter periods"
        )
    return None


#: FOCUS 1.1 columns, in the specification's order.
FOCUS_COLUMNS: tuple[str, ...] = (
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
#: Our own columns after FOCUS's (the ``x_`` prefix is the specification's for extensions).
X_COLUMNS: tuple[str, ...] = (
    "x_GpuHours",
    "x_GpuKwh",
    "x_FacilityKwh",
    "x_Co2eKg",
    "x_Coverage",
    "x_GpuModels",
    "x_Team",
    "x_Site",
    "x_Errors",
)
COLUMNS: tuple[str, ...] = FOCUS_COLUMNS + X_COLUMNS

#: Labels of a run carried into ``Tags`` (where its scheduler put them).
TAG_LABELS = ("slurm.account", "slurm.user", "slurm.partition", "k8s.namespace", "k8s.kind", "k8s.name")

_MODELS_SQL = """
SELECT a.run_id, string_agg(DISTINCT coalesce(nd.facts ->> 'gpu_model', x.name), '; ')
FROM run_allocations a LEFT JOIN nodes nd ON nd.node = a.node
LEFT JOIN LATERAL (SELECT e ->> 'name' AS name FROM jsonb_array_elements(
    CASE WHEN jsonb_typeof(nd.facts -> 'gpus') = 'array' THEN nd.facts -> 'gpus' ELSE '[]'::jsonb END) e
  WHERE coalesce(e ->> 'gpu', e ->> 'index') = a.gpu::text LIMIT 1) x ON true
WHERE a.run_id = ANY(%s) GROUP BY a.run_id"""


@dataclass(frozen=True)
class FocusExport:
    since: datetime
    until: datetime
    granularity: Granularity
    rows: list[dict[str, Any]]


def _decimal(v: Decimal | None) -> str:
    if v is None:
        return ""
    text = format(v.normalize(), "f")
    return text if "." not in text else text.rstrip("0").rstrip(".") or "0"


def _unit_price(cost: Decimal, qty: Decimal) -> Decimal | None:
    return (cost / qty).quantize(Decimal("1e-9")) if qty > 0 else None


def _row(
    line: Line,
    run: Run | None,
    charge: str,
    since: datetime,
    until: datetime,
    models: Mapping[str, str],
    errors: Mapping[str, str],
) -> dict[str, Any]:
    site = line.site or ""
    compute = charge == "compute"
    if compute:
        qty, cost, unit, service, sku = (
            line.gpu_hours or ZERO,
            line.compute_cost,
            "GPU-Hours",
            "GPU compute",
            "gpu-hour",
        )
        broken = "compute_cost" in errors
    else:
        qty, cost, unit, service, sku = (
            line.facility_kwh,
            line.energy_cost,
            "kWh",
            "GPU energy",
            "facility-kwh",
        )
        broken = "energy_cost" in errors
    money = None if broken or cost is None else cost
    who = run.run_id if run is not None else "unallocated"
    what = (
        (f"GPU time of run {who}" if compute else f"facility energy of run {who} (IT energy x PUE)")
        if run is not None
        else "facility energy of GPU time no run held"
    )
    tags: dict[str, Any] = {"gpufleet/site": line.site}
    if run is not None:
        tags.update({"gpufleet/run": run.run_id, "gpufleet/team": run.team})
        tags.update({k: v for k, v in run.labels.items() if k in TAG_LABELS})
    row: dict[str, Any] = dict.fromkeys(COLUMNS)
    row.update(
        {
            "BilledCost": _decimal(money),
            "EffectiveCost": _decimal(money),
            "ListCost": _decimal(money),
            "ContractedCost": _decimal(money),
            "BillingAccountId": site,
            "BillingAccountName": site,
            "BillingCurrency": line.currency or "",
            "BillingPeriodStart": iso(since),
            "BillingPeriodEnd": iso(until),
            "ChargeCategory": "Usage",
            "ChargeDescription": what,
            "ChargeFrequency": "Usage-Based",
            "ChargePeriodStart": iso(line.start),
            "ChargePeriodEnd": iso(line.end),
            "ConsumedQuantity": _decimal(qty),
            "ConsumedUnit": unit,
            "PricingQuantity": _decimal(qty),
            "PricingUnit": unit,
            "PricingCategory": "Standard",
            "ListUnitPrice": _decimal(None if money is None else _unit_price(money, qty)),
            "ContractedUnitPrice": _decimal(None if money is None else _unit_price(money, qty)),
            "InvoiceIssuerName": site,
            "ProviderName": site,
            "PublisherName": site,
            "RegionId": site,
            "RegionName": site,
            "ResourceId": who,
            "ResourceName": (run.name or run.run_id) if run is not None else "GPU time no run held",
            "ResourceType": "GPU run" if run is not None else "Idle GPU capacity",
            "ServiceCategory": "AI and Machine Learning",
            "ServiceSubcategory": "Machine Learning",
            "ServiceName": service,
            "SkuId": sku,
            "SkuMeter": unit,
            "SubAccountId": (run.team or "") if run is not None else "",
            "SubAccountName": (run.team or "") if run is not None else "",
            "Tags": json.dumps({k: v for k, v in tags.items() if v is not None}, sort_keys=True),
            "x_GpuHours": _decimal(line.gpu_hours if compute else None),
            "x_GpuKwh": _decimal(line.gpu_kwh),
            "x_FacilityKwh": _decimal(line.facility_kwh),
            "x_Co2eKg": _decimal(line.co2e_kg if line.carbon_source not in (None, "none") else None),
            "x_Coverage": _decimal(Decimal(repr(line.coverage))),
            "x_GpuModels": models.get(who, "") if run is not None else "",
            "x_Team": run.team if run is not None else "",
            "x_Site": site,
            "x_Errors": "; ".join(
                errors[k] for k in sorted(errors) if k == ("compute_cost" if compute else "energy_cost")
            ),
        }
    )
    return row


def focus_export(
    conn: psycopg.Connection,
    since: datetime,
    until: datetime,
    *,
    granularity: Granularity = "day",
    now: datetime | None = None,
    max_gap_s: float | None = None,
    source: Source = "auto",
    gone_after_s: float | None = None,
) -> FocusExport:
    """The FOCUS rows of [since, until): per run (and the GPU time no run held), per charge and per day (or
    over each run's window), in each currency its window was priced in."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, not {granularity!r}")
    if (why := period_problem(since, until, granularity)) is not None:
        raise ValueError(why)
    now = now or datetime.now(UTC)
    gap = AccountingSettings().max_gap_s if max_gap_s is None else max_gap_s
    gone = AccountingSettings().gone_after_s if gone_after_s is None else gone_after_s
    read = by_day if granularity == "day" else lines
    with snapshot(conn):
        got = read(conn, since, until, now, fleet=True, max_gap_s=gap, source=source, gone_after_s=gone)
        ids = sorted({ln.run_id for ln in got if ln.line == "run" and ln.run_id is not None})
        runs = {r.run_id: r for r in load_runs(conn, ids)}
        models: dict[str, str] = dict(conn.execute(_MODELS_SQL, (ids,)).fetchall()) if ids else {}
    rows: list[dict[str, Any]] = []
    for ln in got:
        if ln.start is None or ln.end is None or ln.start >= ln.end:
            continue
        found = problems([ln])
        if ln.line == "run" and ln.run_id in runs:
            run = runs[ln.run_id]
            if (ln.gpu_hours or ZERO) > 0 or (ln.compute_cost or ZERO) > 0:
                rows.append(_row(ln, run, "compute", since, until, models, found))
            if ln.facility_kwh > 0 or ln.energy_cost > 0:
                rows.append(_row(ln, run, "energy", since, until, models, found))
        elif ln.line == "unallocated" and (ln.facility_kwh > 0 or ln.energy_cost > 0):
            rows.append(_row(ln, None, "energy", since, until, models, found))
    rows.sort(key=lambda r: (r["ChargePeriodStart"], r["ResourceId"], r["ServiceName"], r["BillingCurrency"]))
    return FocusExport(since, until, granularity, rows)


def focus_csv(export: FocusExport) -> str:
    """The export as CSV: a header of :data:`COLUMNS`, then its rows (text cells never start a formula)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in export.rows:
        w.writerow(["" if r[c] is None else safe_text(str(r[c])) for c in COLUMNS])
    return buf.getvalue()
