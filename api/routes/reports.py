"""Finance exports: one row per run overlapping a period, clipped to it."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Response

from gpufleet.accounting import CSV_COLUMNS, report_csv, runs_report
from gpufleet.api.deps import AccountingReader, ConnDep, StateDep
from gpufleet.api.routes.accounting import SourceParam, period_error
from gpufleet.api.schemas import QueryTime

router = APIRouter(prefix="/v1/reports", tags=["reports"])


@router.get("/runs.csv", response_class=Response, responses={200: {
    "content": {"text/csv": {"schema": {"type": "string"}}},
    "description": "header row: " + ",".join(CSV_COLUMNS),
}})
def runs_csv(
    conn: ConnDep, s: StateDep, _: AccountingReader,
    since: Annotated[QueryTime, Query(alias="from", description="period start, with a UTC offset")],
    until: Annotated[QueryTime, Query(alias="to", description="period end, with a UTC offset")],
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> Response:
    """Per-run accounting for finance: the contract's fields in order, then extras; RFC 3339 UTC times,
    plain decimal numbers, empty cells for unknown values."""
    period_error(since, until)
    rows = runs_report(conn, since, until, max_gap_s=s.settings.accounting.max_gap_s, source=source)
    name = f"runs_{since:%Y%m%dT%H%M%S}_{until:%Y%m%dT%H%M%S}.csv"
    return Response(report_csv(rows), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})
