"""Incidents the detector sweep opened and resolved."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from fastapi import APIRouter, HTTPException, Query

from gpufleet.accounting.incidents import incident_costs
from gpufleet.accounting.snapshot import snapshot
from gpufleet.api.deps import ConnDep, Reader, StateDep
from gpufleet.api.schemas import IncidentPublic
from gpufleet.store import runs as run_store
from gpufleet.store.incidents import get_incident, list_incidents
from gpufleet.store.runs import NotFound

router = APIRouter(tags=["incidents"])


StateParam = Query(None, description="open, resolved, or all (the default: both)")


def _with_cost(conn: ConnDep, s: StateDep, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run-scoped incident with what it lost, priced now (an open one up to now)."""
    with snapshot(conn):
        lost = incident_costs(conn, rows, now=datetime.now(UTC), max_gap_s=s.settings.accounting.max_gap_s)
    for r in rows:
        r["lost"] = lost.get(r["id"])
    return rows


@router.get("/v1/incidents", response_model=list[IncidentPublic])
def incidents(
    conn: ConnDep,
    _: Reader,
    s: StateDep,
    state: Literal["open", "resolved", "all"] | None = StateParam,
    kind: str | None = None,
    run_id: str | None = None,
    node: str | None = None,
    limit: int = Query(500, ge=1, le=5000),
    offset: int = Query(0, ge=0),
) -> list[dict]:
    return _with_cost(
        conn, s, list_incidents(conn, None if state == "all" else state, kind, run_id, node, limit, offset)
    )


@router.get(
    "/v1/incidents/{incident_id}",
    response_model=IncidentPublic,
    responses={404: {"description": "no incident with this id"}},
)
def incident(incident_id: int, conn: ConnDep, _: Reader, s: StateDep) -> dict:
    row = get_incident(conn, incident_id)
    if row is None:
        raise HTTPException(404, f"incident {incident_id} not found")
    return _with_cost(conn, s, [row])[0]


@router.get("/v1/runs/{run_id}/incidents", response_model=list[IncidentPublic])
def run_incidents(
    run_id: str,
    conn: ConnDep,
    _: Reader,
    s: StateDep,
    state: Literal["open", "resolved", "all"] | None = StateParam,
) -> list[dict]:
    try:
        run_store.get_run(conn, run_id)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    return _with_cost(conn, s, list_incidents(conn, None if state == "all" else state, None, run_id))
