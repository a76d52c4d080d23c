"""Runs: register, list, end, allocate GPUs, report progress.

A node token's powers are narrower than an admin's (gpufleet.store.authority):
its own GPUs, runs of the same scheduler job, start/end near now, never team,
name or labels of an existing run, never an end for a run no scheduler hook
registered.  A progress token (training code) reports progress and nothing
else.  An allocation overlapping another run's answers 409 naming that run,
the node and the GPU.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query, Response

from gpufleet.api.deps import ConnDep, ProgressWriter, Reader, RunWriter, StateDep
from gpufleet.api.schemas import Progress, QueryTime, RunCreate, RunPublic, RunUpdate
from gpufleet.auth import Principal
from gpufleet.store import runs as store
from gpufleet.store.authority import actor
from gpufleet.store.runs import Conflict, Invalid, NotFound, RunAuthorityError

router = APIRouter(prefix="/v1/runs", tags=["runs"])


def _as_node(who: Principal) -> str | None:
    """The node a node token speaks for; None for roles that keep every power over runs."""
    writer = actor(who.role, who.node)
    return writer.node if writer.is_node else None


@router.get("", response_model=list[RunPublic], response_model_exclude_unset=True)
def list_runs(
    conn: ConnDep,
    _: Reader,
    state: Literal["pending", "running", "ended"] | None = None,
    site: str | None = None,
    since: Annotated[QueryTime | None, Query(alias="from")] = None,
    until: Annotated[QueryTime | None, Query(alias="to")] = None,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0),
) -> list[dict]:
    return store.list_runs(conn, state, site, since, until, limit, offset)


@router.get("/{run_id}", response_model=RunPublic, response_model_exclude_unset=True)
def get_run(run_id: str, conn: ConnDep, _: Reader) -> dict:
    try:
        return store.get_run(conn, run_id)
    except NotFound as e:
        raise HTTPException(404, str(e)) from None


@router.post("", response_model=RunPublic, status_code=201, response_model_exclude_unset=True)
def create_run(body: RunCreate, conn: ConnDep, who: RunWriter, response: Response, s: StateDep) -> dict:
    try:
        run, created = store.create_run(
            conn, body.model_dump(exclude_unset=True), as_node=_as_node(who), teams=s.settings.teams
        )
    except (NotFound, Invalid) as e:
        raise HTTPException(422, str(e)) from None
    except RunAuthorityError as e:
        raise HTTPException(403, str(e)) from None
    except Conflict as e:
        raise HTTPException(409, str(e)) from None
    if not created:
        response.status_code = 200
    return run


@router.patch("/{run_id}", response_model=RunPublic, response_model_exclude_unset=True)
def update_run(run_id: str, body: RunUpdate, conn: ConnDep, who: RunWriter) -> dict:
    try:
        return store.update_run(conn, run_id, body.model_dump(exclude_unset=True), as_node=_as_node(who))
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    except Invalid as e:
        raise HTTPException(422, str(e)) from None
    except RunAuthorityError as e:
        raise HTTPException(403, str(e)) from None
    except Conflict as e:
        raise HTTPException(409, str(e)) from None


@router.post("/{run_id}/progress", status_code=204)
def progress(run_id: str, body: Progress, conn: ConnDep, who: ProgressWriter) -> Response:
    if body.tokens is None and body.samples is None and body.steps is None:
        raise HTTPException(422, "give 'tokens', 'samples' or 'steps' (cumulative counts)")
    try:
        store.record_progress(
            conn,
            run_id,
            body.time or datetime.now(UTC),
            body.tokens,
            body.samples,
            who=actor(who.role, who.node),
            steps=body.steps,
        )
    except NotFound as e:
        raise HTTPException(404, str(e)) from None
    except RunAuthorityError as e:
        raise HTTPException(403, str(e)) from None
    return Response(status_code=204)
