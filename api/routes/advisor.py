"""Advice from the fleet's own data: the power limit with the most tokens per joule."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from pydantic import BaseModel, Field

from gpufleet.advisor.power_cap import AdvisorSettings, power_cap_advice
from gpufleet.api.deps import ConnDep, Reader
from gpufleet.api.schemas import QueryTime

router = APIRouter(tags=["advisor"])


class PowerCapModelAdvice(BaseModel):
    model: str = Field(description="the model trained (the run's labels.model, else its name)")
    enough_data: bool = Field(description="false: no advice; reasons say why")
    reasons: list[str]
    recommendation: dict[str, Any] | None = Field(
        description="power_limit_w, tokens_per_joule, tokens_per_s_per_gpu, throughput_loss (vs the reference), "
                    "energy_per_token_saving, runs")
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


@router.get("/v1/advisor/power-cap", response_model=PowerCapAdvice, response_model_exclude_none=True)
def power_cap(conn: ConnDep, _: Reader,
              gpu_model: str = Query(..., min_length=1, max_length=200,
                                     description="GPU product name as NVML reports it, e.g. 'NVIDIA H100 80GB HBM3'"),
              max_throughput_loss: float = Query(0.05, ge=0.0, lt=1.0,
                                                 description="largest share of throughput per GPU to give up"),
              model: str | None = Query(None, max_length=200, description="only this model (labels.model or name)"),
              since: Annotated[QueryTime | None, Query(alias="from", description="runs since (default: 30 days "
                                                                                     "before 'to')")] = None,
              until: Annotated[QueryTime | None, Query(alias="to", description="as of (default: now)")] = None,
              ) -> dict[str, Any]:
    """The power limit that maximises tokens per joule for each model trained on ``gpu_model`` GPUs, within
    ``max_throughput_loss`` of the fastest limit observed, with the points used; ``enough_data: false`` and
    the reasons where the fleet's data cannot tell."""
    cfg = AdvisorSettings()
    if since is not None and until is not None and until <= since:
        raise HTTPException(422, [{"loc": ["query", "to"], "msg": "must be after 'from'", "type": "value_error"}])
    if since is not None:
        end = until or datetime.now(UTC)
        cfg = replace(cfg, lookback=max(end - since, timedelta(seconds=1)))
    return power_cap_advice(conn, gpu_model, max_throughput_loss, model, now=until, settings=cfg)
