"""Accounting: per-run energy, cost and CO2e, and the fleet view (read-only; finance, sre, admin)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query

from gpufleet.accounting import fleet_accounting, run_accounting
from gpufleet.accounting.result import AccountingBody
from gpufleet.api.deps import AccountingReader, ConnDep, StateDep
from gpufleet.api.schemas import FleetAccounting, QueryTime, RunAccounting
from gpufleet.store.runs import NotFound

router = APIRouter(tags=["accounting"])

SourceParam = Query(
    "auto", description="auto: rollups where current, raw samples elsewhere; rollup or raw to force one"
)


def period_error(since: datetime | None, until: datetime | None) -> None:
    """422 naming 'to' when the period is empty or reversed."""
    if since is not None and until is not None and until <= since:
        raise HTTPException(
            422, [{"loc": ["query", "to"], "msg": "must be after 'from'", "type": "value_error"}]
        )


@router.get(
    "/v1/runs/{run_id}/accounting",
    response_model=RunAccounting,
    response_model_exclude_unset=True,
    response_model_by_alias=True,
    responses={404: {"description": "unknown run"}},
)
def get_run_accounting(
    run_id: str,
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    source: Literal["auto", "rollup", "raw"] = SourceParam,
    segments: bool = Query(False, description="include energy, CO2e and cost per tariff segment"),
    since: Annotated[
        QueryTime | None, Query(alias="from", description="clip the run to this period start")
    ] = None,
    until: Annotated[
        QueryTime | None, Query(alias="to", description="clip the run to this period end")
    ] = None,
) -> AccountingBody:
    """Energy, cost and CO2e of one run (contracts.md section 3); a running run up to now."""
    period_error(since, until)
    try:
        body = run_accounting(
            conn,
            run_id,
            max_gap_s=s.settings.accounting.max_gap_s,
            source=source,
            since=since,
            until=until,
            segments=segments,
        )
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    return body


@router.get("/v1/accounting", response_model=FleetAccounting, response_model_by_alias=True)
def get_fleet_accounting(
    conn: ConnDep,
    s: StateDep,
    _: AccountingReader,
    since: Annotated[QueryTime, Query(alias="from", description="period start, with a UTC offset")],
    until: Annotated[QueryTime, Query(alias="to", description="period end, with a UTC offset")],
    group_by: Literal["site", "team", "run"] = Query("site", description="how runs are grouped"),
    source: Literal["auto", "rollup", "raw"] = SourceParam,
) -> dict[str, Any]:
    """Runs grouped by site, team or run; GPUs no run held ("unallocated", and "no_telemetry" from when each
    GPU joined the fleet until it left); the fleet total.  Money as computed (not rounded); ``errors`` names
    what could not be computed."""
    period_error(since, until)
    return fleet_accounting(
        conn,
        since,
        until,
        group_by=group_by,
        max_gap_s=s.settings.accounting.max_gap_s,
        source=source,
        gone_after_s=s.settings.accounting.gone_after_s,
    )
