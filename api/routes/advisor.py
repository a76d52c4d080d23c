"""Advice from the fleet's own data: the power limit with the most tokens per joule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from gpufleet.advisor.plans import MAX_LIMIT_W, PlanError, get_plan, plans_for_node, set_plan, withdraw_plan
from gpufleet.advisor.power_cap import AdviceUnfinished, AdvisorSettings, power_cap_advice
from gpufleet.advisor.run_cap import UnknownRun, propose_run_cap
from gpufleet.api.deps import Admin, ConnDep, PrincipalDep, Reader, StateDep, permit
from gpufleet.api.schemas import QueryTime

router = APIRouter(tags=["advisor"])


class PowerCapModelAdvice(BaseModel):
    model: str = Field(description="the model trained (the run's labels.model, else its name)")
    enough_data: bool = Field(description="false: no advice; reasons say why")
    reasons: list[str]
    recommendation: dict[str, Any] | None = Field(
        description="power_limit_w, tokens_per_joule, tokens_per_s_per_gpu, throughput_loss (vs the reference), "
        "energy_per_token_saving, runs"
    )
    reference: dict[str, Any] | None = Field(description="the level with the highest throughput per GPU")
    levels: list[dict[str, Any]] = Field(description="every power limit observed, pooled over its points")
    points: list[dict[str, Any]] = Field(description="the stretches of runs at one limit that were used")
    excluded_minutes: dict[str, int] = Field(description="minutes left out, by reason")


class PowerCapAdvice(BaseModel):
    gpu_model: str
    max_throughput_loss: float
    model: str | None
    since: str
    until: str
    models: list[PowerCapModelAdvice]
    reasons: list[str] | None = None


@router.get(
    "/v1/advisor/power-cap",
    response_model=PowerCapAdvice,
    response_model_exclude_none=True,
    responses={
        503: {
            "description": "the runs not kept yet took longer than api.statement_timeout_s to read; what was "
            "read is kept, so a retry (Retry-After) goes on from there"
        }
    },
)
def power_cap(
    conn: ConnDep,
    s: StateDep,
    _: Reader,
    gpu_model: str = Query(
        ...,
        min_length=1,
        max_length=200,
        description="GPU product name as NVML reports it, e.g. 'NVIDIA H100 80GB HBM3'",
    ),
    max_throughput_loss: float = Query(
        0.05, ge=0.0, lt=1.0, description="largest share of throughput per GPU to give up"
    ),
    model: str | None = Query(None, max_length=200, description="only this model (labels.model or name)"),
    since: Annotated[
        QueryTime | None, Query(alias="from", description="runs since (default: 30 days before 'to')")
    ] = None,
    until: Annotated[QueryTime | None, Query(alias="to", description="as of (default: now)")] = None,
) -> dict[str, Any]:
    """The power limit that maximises tokens per joule for each model trained on ``gpu_model`` GPUs, within
    ``max_throughput_loss`` of the fastest limit observed, with the points used; ``enough_data: false`` and
    the reasons where the fleet's data cannot tell."""
    # a request reads the runs no earlier one kept for as long as one statement may run, then answers 503
    # (what it read is kept: the next request goes on from there), never for longer than its client waits
    cfg = AdvisorSettings(budget_s=s.settings.api.statement_timeout_s)
    if since is not None and until is not None and until <= since:
        raise HTTPException(
            422, [{"loc": ["query", "to"], "msg": "must be after 'from'", "type": "value_error"}]
        )
    if since is not None:
        end = until or datetime.now(UTC)
        cfg = replace(cfg, lookback=max(end - since, timedelta(seconds=1)))
    try:
        return power_cap_advice(conn, gpu_model, max_throughput_loss, model, now=until, settings=cfg)
    except AdviceUnfinished as e:
        raise HTTPException(503, f"{e}; retry", headers={"Retry-After": "1"}) from None


# --------------------------------------------------------------------------- one run's cap


class RunPowerCapBody(BaseModel):
    model_config = {"extra": "forbid"}

    limit_w: float | None = Field(
        None,
        gt=0,
        le=MAX_LIMIT_W,
        allow_inf_nan=False,
        description="the cap for every GPU of the run, W; absent: the advisor's proposal",
    )
    max_throughput_loss: float = Field(
        0.05, ge=0.0, lt=1.0, description="for the proposal, when limit_w is absent"
    )
    reason: str | None = Field(None, max_length=500)


class RunPowerCap(BaseModel):
    run_id: str
    proposal: dict[str, Any] = Field(
        description="the advisor's cap for every GPU of the run from measured tokens per joule: current_limit_w, "
        "proposed_limit_w, action (cap, keep, none), energy_per_token_saving, throughput_loss_vs_now, "
        "expected_saving (gpu_kwh_per_day_saved, facility_kwh_per_day_saved, cost_per_day_saved, "
        "currency), the levels compared; enough_data false and reasons where the data cannot tell"
    )
    plan: dict[str, Any] | None = Field(
        description="the cap set for the run (limit_w, revision, state active|withdrawn|failed) and each node's "
        "report (applied, failed with the reason, restored)"
    )


@router.get("/v1/runs/{run_id}/power-cap", response_model=RunPowerCap)
def run_power_cap(
    run_id: str,
    conn: ConnDep,
    _: Reader,
    max_throughput_loss: float = Query(
        0.05, ge=0.0, lt=1.0, description="largest share of throughput per GPU to give up"
    ),
) -> dict[str, Any]:
    """One power cap for every GPU of the run, from measured tokens per joule of its model on its GPUs, with
    the energy and money it saves a day; and the cap set for it, if any, with what its nodes did."""
    try:
        proposal = propose_run_cap(conn, run_id, max_throughput_loss)
    except UnknownRun:
        raise HTTPException(404, f"run {run_id!r} not found or holds no GPU") from None
    return {"run_id": run_id, "proposal": proposal, "plan": get_plan(conn, run_id)}


@router.put("/v1/runs/{run_id}/power-cap", response_model=RunPowerCap)
def set_run_power_cap(run_id: str, body: RunPowerCapBody, conn: ConnDep, who: Admin) -> dict[str, Any]:
    """Cap every GPU of the run at ``limit_w`` (or at the advisor's proposal): the agents of its nodes that have
    ``agent.power_caps`` on apply it to all its GPUs or none, and restore the previous limits when the run ends
    or the cap is withdrawn."""
    try:
        proposal = propose_run_cap(conn, run_id, body.max_throughput_loss)
    except UnknownRun:
        raise HTTPException(404, f"run {run_id!r} not found or holds no GPU") from None
    limit = body.limit_w
    if limit is None:
        if proposal["action"] != "cap" or proposal["proposed_limit_w"] is None:
            why = "; ".join(proposal["reasons"]) or "the advisor proposes no cap"
            raise HTTPException(
                409, f"no proposal to apply for run {run_id!r}: {why}; give limit_w to set one"
            )
        limit = float(proposal["proposed_limit_w"])
    reason = body.reason or ("advisor proposal" if body.limit_w is None else None)
    try:
        plan = set_plan(conn, run_id, limit, who.name, reason)
    except PlanError as e:
        raise HTTPException(e.status, str(e)) from None
    return {"run_id": run_id, "proposal": proposal, "plan": plan}


@router.delete("/v1/runs/{run_id}/power-cap", response_model=RunPowerCap)
def withdraw_run_power_cap(run_id: str, conn: ConnDep, who: Admin) -> dict[str, Any]:
    """Withdraw the run's cap: its nodes' agents put the previous limits back at their next poll."""
    try:
        plan = withdraw_plan(conn, run_id, who.name)
    except PlanError as e:
        raise HTTPException(e.status, str(e)) from None
    return {"run_id": run_id, "proposal": {}, "plan": plan}


class NodePowerCaps(BaseModel):
    node: str
    plans: list[dict[str, Any]] = Field(
        description="run_id, limit_w, revision, gpus: what this node applies now"
    )


@router.get("/v1/nodes/{node}/power-caps", response_model=NodePowerCaps)
def node_power_caps(node: str, conn: ConnDep, who: PrincipalDep) -> dict[str, Any]:
    """The caps a node's agent applies now (read with that node's token, or any reading role)."""
    if who.may("read_own_node"):
        if who.node != node:
            raise HTTPException(403, f"this token is node {who.node!r}'s, not {node!r}'s")
    else:
        permit(who, "read")
    return {"node": node, "plans": plans_for_node(conn, node)}
