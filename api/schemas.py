"""Request and response models of the API (Create / Update / Public per resource).

Every model forbids unknown fields, so a typo answers 422 naming the field
instead of being silently ignored.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator


def _utc(v: datetime) -> datetime:
    """Any offset Python accepts (up to +-23:59) as UTC; PostgreSQL refuses offsets past
    +-15:59, so a time must not reach it with one."""
    try:
        return v.astimezone(UTC)
    except OverflowError:
        raise ValueError("falls outside the years 1..9999 once converted to UTC") from None


#: A time with a UTC offset, normalised to UTC (request input).
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_utc)]

#: Run ids: one path segment of /v1/runs/{run_id}, so no '/' (gpufleet.store.runs.RUN_ID_RE).
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@\-]{0,127}$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,252}$"
#: runs.params is a bigint: a larger count is refused naming the field, not stored as an error.
BIGINT_MAX = 2**63 - 1


class Strict(BaseModel):
    """Unknown fields and non-finite numbers (``Infinity``, ``NaN``, ``1e999``) are refused, naming
    the field: a price or a count of infinity would be stored and turn every sum it enters into
    infinity or null."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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
    start: UtcDatetime | None = Field(None, description="defaults to now")
    end: UtcDatetime | None = None
    params: int | None = Field(None, ge=1, le=BIGINT_MAX, description="model parameters, for MFU")
    labels: dict[str, str] = Field(default_factory=dict)
    allocations: list[Allocation] = Field(default_factory=list)


class RunUpdate(Strict):
    name: str | None = Field(None, max_length=256)
    team: str | None = Field(None, max_length=128)
    end: UtcDatetime | None = None
    params: int | None = Field(None, ge=1, le=BIGINT_MAX)
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
    source: Literal["registered", "inferred"] = Field(
        "registered", description="'inferred': registered by the collector from the runs agents saw on GPUs")
    gpu_count: int
    allocations: list[Allocation]


class SiteUpsert(Strict):
    pue: float = Field(1.0, ge=1.0, le=5.0)
    price_per_kwh: float = Field(0.0, ge=0)
    gpu_hour_price: float = Field(0.0, ge=0)
    currency: str = Field("USD", pattern=r"^[A-Z]{3}$")
    carbon_region: str | None = Field(None, max_length=128)
    carbon_g_per_kwh: float | None = Field(None, ge=0, le=5000)


class SiteUpdate(Strict):
    """PATCH: only the fields given change.  ``carbon_region`` and ``carbon_g_per_kwh`` may be set
    to null (no series, no constant); the other fields cannot be null."""

    pue: float | None = Field(None, ge=1.0, le=5.0)
    price_per_kwh: float | None = Field(None, ge=0)
    gpu_hour_price: float | None = Field(None, ge=0)
    currency: str | None = Field(None, pattern=r"^[A-Z]{3}$")
    carbon_region: str | None = Field(None, max_length=128)
    carbon_g_per_kwh: float | None = Field(None, ge=0, le=5000)

    @field_validator("pue", "price_per_kwh", "gpu_hour_price", "currency", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("cannot be null; leave the field out to keep its value")
        return v


class SitePublic(SiteUpsert):
    site: str


class PricePoint(Strict):
    time: UtcDatetime
    price_per_kwh: float = Field(ge=0)


class CarbonPoint(Strict):
    time: UtcDatetime
    g_co2e_per_kwh: float = Field(ge=0, le=5000)


def _distinct_times(points: list[Any]) -> list[Any]:
    """One value per instant: the upsert cannot set one row twice (same instant, any UTC offset)."""
    seen: set[Any] = set()
    for i, p in enumerate(points):
        if p.time in seen:
            raise ValueError(f"points[{i}]: time {p.time.isoformat()} is given more than once")
        seen.add(p.time)
    return points


class CarbonSeries(Strict):
    points: list[CarbonPoint] = Field(min_length=1, max_length=100_000)

    @field_validator("points")
    @classmethod
    def _distinct(cls, v: list[CarbonPoint]) -> list[CarbonPoint]:
        return _distinct_times(v)


class PriceSeries(Strict):
    points: list[PricePoint] = Field(min_length=1, max_length=100_000)

    @field_validator("points")
    @classmethod
    def _distinct(cls, v: list[PricePoint]) -> list[PricePoint]:
        return _distinct_times(v)


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
    actions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="what the quarantine hooks did: action (slurm_drain, k8s_cordon), target node, time, result "
                    "(done, dry_run, failed, skipped, rate_limited) and detail")


class Progress(Strict):
    time: UtcDatetime | None = Field(None, description="defaults to now")
    tokens: float | None = Field(None, ge=0, description="cumulative tokens processed")
    samples: float | None = Field(None, ge=0, description="cumulative samples processed")
    steps: float | None = Field(None, ge=0, description="cumulative optimizer steps")


# ---------------------------------------------------------------- accounting (contracts.md section 3)

def _time(description: str) -> Any:
    return Field(description=description + " (RFC 3339 UTC)", json_schema_extra={"format": "date-time"})


class Efficiency(BaseModel):
    tokens: float | None = Field(description="tokens processed in the window (cumulative progress reports)")
    samples: float | None = Field(description="samples processed in the window")
    tokens_per_s: float | None = Field(description="tokens ÷ seconds between the reports that bound the window")
    tokens_per_joule: float | None = Field(description="tokens per joule of IT energy (GPU + host share)")
    tokens_per_kwh: float | None = Field(description="tokens per kWh of IT energy")
    samples_per_kwh: float | None
    params: int | None = Field(description="model parameters (runs.params)")
    gpu_model: str | None = Field(description="GPU model from node facts; 'mixed' when the run's GPUs differ")
    peak_flops: float | None = Field(description="sum of the run's GPUs' peak dense BF16 FLOP/s")
    mfu: float | None = Field(description="6 × params × tokens_per_s ÷ peak_flops")
    lost_gpu_hours: float = Field(description="GPU-hours lost to starvation and checkpoint stalls (incidents)")
    goodput: float | None = Field(description="share of the run's GPU time not lost")


class AccountingSegment(BaseModel):
    start: str = _time("segment start")
    end: str = _time("segment end")
    gpu_kwh: float
    host_kwh: float
    facility_kwh: float
    g_co2e_per_kwh: float | None
    price_per_kwh: float
    co2e_kg: float | None
    energy_cost: float


class RunAccounting(BaseModel):
    """Per-run accounting; the first fields are the contract's, in its order."""

    run_id: str
    start: str = _time("run start")
    end: str | None = _time("run end; null while running")
    gpu_count: int
    gpu_hours: float = Field(description="wall-clock duration of the window × gpu_count")
    gpu_kwh: float
    host_kwh: float = Field(description="host energy × GPUs held ÷ GPUs the node reports")
    it_kwh: float
    pue: float
    facility_kwh: float
    co2e_kg: float | None = Field(description="null when the site has no carbon intensity (or the run no site)")
    energy_cost: float
    compute_cost: float
    total_cost: float
    currency: str | None = Field(description="the site's currency; null for a run without a site")
    coverage: float = Field(description="share of allocated GPU-seconds inside counted intervals, 0-1")
    name: str | None
    site: str | None
    team: str | None
    state: Literal["running", "ended"]
    window_start: str = _time("start of the accounted window")
    window_end: str = _time("end of the accounted window (now for a running run)")
    source: Literal["rollup", "raw", "mixed"] = Field(
        description="rollups (with raw partial minutes), raw samples, or both (data pending in the rollup queue)")
    max_gap_s: float
    carbon_source: Literal["series", "site_constant", "none"]
    price_source: Literal["time_of_use", "flat", "none"]
    gpu_hour_price: float
    efficiency: Efficiency
    segments: list[AccountingSegment] | None = Field(None, description="per tariff segment, when asked for")


class CurrencyCost(BaseModel):
    energy_cost: float
    compute_cost: float
    total_cost: float


class FleetBlock(BaseModel):
    runs: int
    gpu_hours: float
    gpu_kwh: float
    host_kwh: float
    it_kwh: float
    facility_kwh: float
    co2e_kg: float = Field(description="CO2e of the energy whose carbon intensity is known")
    co2e_unknown_kwh: float = Field(description="facility energy with no known carbon intensity")
    energy_cost: float | None = Field(description="null when the block mixes currencies")
    compute_cost: float | None
    total_cost: float | None
    currency: str | None
    costs_by_currency: dict[str, CurrencyCost]
    coverage: float


class FleetGroup(FleetBlock):
    key: str | None = Field(description="site, team or run id; null for runs without one")


class FleetAccounting(BaseModel):
    from_: str = Field(alias="from", description="period start (RFC 3339 UTC)",
                       json_schema_extra={"format": "date-time"})
    to: str = _time("period end")
    window_end: str = _time("end of the accounted period (now, when the period reaches into the future)")
    group_by: Literal["site", "team", "run"]
    source: Literal["rollup", "raw", "mixed"]
    max_gap_s: float
    groups: list[FleetGroup]
    runs: FleetBlock = Field(description="all runs in the period (the groups together)")
    unallocated: FleetBlock = Field(description="GPUs while no run held them, and the hosts' idle share")
    total: FleetBlock = Field(description="every GPU and host of the fleet in the period")
