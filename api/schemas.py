"""Request and response models of the API (Create / Update / Public per resource).

Every model forbids unknown fields, so a typo answers 422 naming the field
instead of being silently ignored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@/\-]{0,127}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,252}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Allocation(Strict):
    node: str = Field(pattern=NAME_PATTERN)
    gpus: list[int] = Field(min_length=1, max_length=1024)

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int]) -> list[int]:
        if any(g < 0 or g > 32767 for g in v):
            raise ValueError("GPU indexes must be 0..32767")
        if len(set(v)) != len(v):
            raise ValueError("GPU indexes must be unique")
        return sorted(v)


class RunCreate(Strict):
    run_id: str | None = Field(None, pattern=ID_PATTERN, description="generated when omitted")
    name: str | None = Field(None, max_length=256)
    site: str | None = Field(None, pattern=NAME_PATTERN)
    team: str | None = Field(None, max_length=128)
    start: AwareDatetime | None = Field(None, description="defaults to now")
    end: AwareDatetime | None = None
    params: int | None = Field(None, ge=1, description="model parameters, for MFU")
    labels: dict[str, str] = Field(default_factory=dict)
    allocations: list[Allocation] = Field(default_factory=list)


class RunUpdate(Strict):
    name: str | None = Field(None, max_length=256)
    team: str | None = Field(None, max_length=128)
    end: AwareDatetime | None = None
    params: int | None = Field(None, ge=1)
    labels: dict[str, str] | None = None
    allocations: list[Allocation] | None = Field(None, description="added to the run's allocations")


class RunPublic(BaseModel):
    run_id: str
    name: str | None
    site: str | None
    team: str | None
    start: AwareDatetime
    end: AwareDatetime | None
    state: Literal["pending", "running", "ended"]
    params: int | None
    labels: dict[str, Any]
    gpu_count: int
    allocations: list[Allocation]


class SiteUpsert(Strict):
    pue: float = Field(1.0, ge=1.0, le=5.0)
    price_per_kwh: float = Field(0.0, ge=0)
    gpu_hour_price: float = Field(0.0, ge=0)
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    carbon_region: str | None = Field(None, max_length=128)
    carbon_g_per_kwh: float | None = Field(None, ge=0, le=5000)


class SitePublic(SiteUpsert):
    site: str


class PricePoint(Strict):
    time: AwareDatetime
    price_per_kwh: float = Field(ge=0)


class CarbonPoint(Strict):
    time: AwareDatetime
    g_co2e_per_kwh: float = Field(ge=0, le=5000)


class CarbonSeries(Strict):
    points: list[CarbonPoint] = Field(min_length=1, max_length=100_000)


class PriceSeries(Strict):
    points: list[PricePoint] = Field(min_length=1, max_length=100_000)


class TokenCreate(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    role: Literal["node", "finance", "sre", "admin"]
    node: str | None = Field(None, pattern=NAME_PATTERN)


class TokenCreated(BaseModel):
    name: str
    role: str
    node: str | None
    token: str = Field(description="shown once; store it now")


class TokenPublic(BaseModel):
    name: str
    role: str
    node: str | None
    created_at: AwareDatetime
    revoked_at: AwareDatetime | None


class NodePublic(BaseModel):
    node: str
    site: str | None
    first_seen: AwareDatetime | None
    last_seen: AwareDatetime | None
    gpu_count: int | None
    rejected_skew: int
    facts: dict[str, Any]


class NodeUpdate(Strict):
    site: str | None = Field(None, pattern=NAME_PATTERN)


class IncidentPublic(BaseModel):
    id: int
    kind: str
    run_id: str | None
    node: str | None
    gpu: int | None
    cause: str | None
    severity: str
    state: str
    start: AwareDatetime
    end: AwareDatetime | None
    last_seen: AwareDatetime
    evidence: dict[str, Any]


class Progress(Strict):
    time: AwareDatetime | None = Field(None, description="defaults to now")
    tokens: float | None = Field(None, ge=0, description="cumulative tokens processed")
    samples: float | None = Field(None, ge=0, description="cumulative samples processed")
