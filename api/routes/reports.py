"""Finance exports: the per-run CSV of the contract, and the finance report with its totals."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Response

from gpufleet.accounting import CSV_COLUMNS, report_csv, runs_report
from gpufleet.accounting.focus import COLUMNS as FOCUS_COLUMNS
from gpufleet.accounting.focus import focus_csv, focus_export, period_problem
from gpufleet.accounting.report import FINANCE_COLUMNS, finance_csv, finance_report
from gpufleet.api.deps import AccountingReader, ConnDep, StateDep
from gpufleet.api.routes.accounting import SourceParam, period_error
from gpufleet.api.schemas import QUERY_TIME_FORMAT, QueryTime

router = APIRouter(prefix="/v1/reports", tags=["reports"])

FromQuery = Query(alias="from", description=f"period start: {QUERY_TIME_FORMAT}")
ToQuery = Query(alias="to", description=f"period end (exclusive): {QUERY_TIME_FORMAT}")
GroupQuery = Query("run", description="rows per run, site or team (then unallocated, no_telemetry and total)")
COLUMN_DOCS = "; ".join(f"`{k}`: {v}" for k, v in FINANCE_COLUMNS.items())


def _name(prefix: str, since: datetime, until: datetime, ext: str) -> str:
    return f'attachment; filename="{prefix}_{since:%Y%m%dT%H%M%S}_{until:%Y%m%dT%H%M%S}.{ext}"'


@router.get(
    "/runs.csv",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "header row: " + ",".join(CSV_COLUMNS),
        }
    },
)
def runs_csv(
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    since: Annotated[QueryTime, FromQuery],
    until: Annotated[QueryTime, ToQuery],
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> Response:
    """Per-run accounting for finance (contracts.md section 3): one row per run overlapping the period, clipped
    to it; the contract's fields in order, then extras; RFC 3339 UTC times, plain decimal numbers, money in the
    currency's minor units (energy and compute rounded by largest remainder so they add up to the total), empty
    cells for unknown values (``end`` while a run is running; money that cannot be computed, with ``errors``)."""
    period_error(since, until)
    rows = runs_report(conn, since, until, max_gap_s=s.settings.accounting.max_gap_s, source=source)
    return Response(
        report_csv(rows),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": _name("runs", since, until, "csv")},
    )


@router.get(
    "/finance.csv",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "header row: " + ",".join(FINANCE_COLUMNS) + ". Columns: " + COLUMN_DOCS,
        }
    },
)
def finance_report_csv(
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    since: Annotated[QueryTime, FromQuery],
    until: Annotated[QueryTime, ToQuery],
    group_by: Literal["run", "site", "team"] = GroupQuery,
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> Response:
    """The finance report: one row per run (or site or team) and currency, the GPU time no run held (with and
    without telemetry) and a total per currency whose money is the sum of the rows to the cent."""
    period_error(since, until)
    rep = finance_report(
        conn,
        since,
        until,
        group_by=group_by,
        max_gap_s=s.settings.accounting.max_gap_s,
        source=source,
        gone_after_s=s.settings.accounting.gone_after_s,
    )
    return Response(
        finance_csv(rep),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": _name(f"finance_{group_by}", since, until, "csv")},
    )


@router.get(
    "/finance.json",
    description="The finance report as JSON: `columns` documents each column, `rows` "
    "are those of finance.csv (money as numbers in minor units). Columns: " + COLUMN_DOCS,
)
def finance_report_json(
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    since: Annotated[QueryTime, FromQuery],
    until: Annotated[QueryTime, ToQuery],
    group_by: Literal["run", "site", "team"] = GroupQuery,
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> dict[str, Any]:
    period_error(since, until)
    return finance_report(
        conn,
        since,
        until,
        group_by=group_by,
        max_gap_s=s.settings.accounting.max_gap_s,
        source=source,
        gone_after_s=s.settings.accounting.gone_after_s,
    ).body()


@router.get(
    "/focus.csv",
    response_class=Response,
    responses={
        200: {
            "content": {"text/csv": {"schema": {"type": "string"}}},
            "description": "FOCUS 1.1 columns (FinOps Open Cost and Usage Specification), then x_ columns: "
            + ",".join(FOCUS_COLUMNS),
        }
    },
)
def focus_report_csv(
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    since: Annotated[QueryTime, FromQuery],
    until: Annotated[QueryTime, ToQuery],
    granularity: Literal["day", "run"] = Query(
        "day", description="a charge row per run per day (as cloud exports), or per run over its window"
    ),
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> Response:
    """GPU run costs as a FOCUS export, so FinOps tools ingest them beside cloud bills (contracts.md section 5.3):
    per run, a GPU-compute row (GPU-hours) and a GPU-energy row (facility kWh) per charge period, and the energy of
    GPU time no run held; money as the accounting computes it; tags for run, team and site."""
    period_error(since, until)
    if (why := period_problem(since, until, granularity)) is not None:
        raise HTTPException(422, [{"loc": ["query", "to"], "msg": why, "type": "value_error"}])
    export = focus_export(
        conn,
        since,
        until,
        granularity=granularity,
        max_gap_s=s.settings.accounting.max_gap_s,
        source=source,
        gone_after_s=s.settings.accounting.gone_after_s,
    )
    return Response(
        focus_csv(export),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": _name("focus", since, until, "csv")},
    )
