"""Request and response models of the API (Create / Update / Public per resource).

Every model forbids unknown fields, so a typo answers 422 naming the field
instead of being silently ignored.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from gpufleet.accounting import bounds
from gpufleet.timeparse import period_bound


def _utc(v: datetime) -> datetime:
    """Any offset Python accepts (up to +-23:59) as UTC; PostgreSQL refuses offsets past
    +-15:59, so a time must not reach it with one."""
    try:
        return v.astimezone(UTC)
    except OverflowError:
        raise ValueError("falls outside the years 1..9999 once converted to UTC") from None


#: A time with a UTC offset, normalised to UTC (request input).
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_utc)]

QUERY_TIME_FORMAT = (
    "RFC 3339 with a UTC offset (2026-12-01T10:00:00Z, 2026-12-01T11:00:00+01:00) or a bare date "
    "(2026-12-01, read as 00:00 UTC)"
)
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def _query_time(v: Any) -> Any:
    """A period bound in a query string: RFC 3339 with an offset, or a bare date as UTC midnight."""
    if not isinstance(v, str):
        return v
    text = v.strip()
    try:
        if _DATE.fullmatch(text):
            return period_bound(datetime.fromisoformat(text).replace(tzinfo=UTC))
        t = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected {QUERY_TIME_FORMAT}") from None
    if t.tzinfo is None:
        raise ValueError(f"has no UTC offset; expected {QUERY_TIME_FORMAT}")
    return period_bound(_utc(t))


#: A period bound of a query string (``from``, ``to``, ``at``): RFC 3339 with offset or a bare UTC date.
QueryTime = Annotated[AwareDatetime, BeforeValidator(_query_time), AfterValidator(_utc)]

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
    """GPUs of one node a run holds: alone (``exclusive``, the default), or shared as declared."""

    node: str = Field(pattern=NAME_PATTERN)
    gpus: list[int] = Field(min_length=1, max_length=1024)
    sharing: Literal["exclusive", "time_slice", "mps", "mig"] = Field(
        "exclusive",
        description="exclusive: the whole GPU; time_slice / mps: a declared share of it; mig: one MIG "
        "instance of it. Runs may hold one GPU at once only when all declare sharing of one "
        "kind and the shares stay within the whole GPU",
    )
    share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="share of the GPU's energy and hours (time_slice, "
        "mps: required; mig: default the profile's compute "
        "slices of 7)",
    )
    mig_profile: str | None = Field(None, pattern=r"^[1-8]g\.\d{1,3}gb(\+me)?$", description="e.g. 3g.40gb")
    mig_instance: int | None = Field(None, ge=0, le=32767, description="GPU-instance id of the MIG instance")

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: list[int]) -> list[int]:
        if any(g < 0 or g > 32767 for g in v):
            raise ValueError("GPU indexes must be 0..32767")
        if len(set(v)) != len(v):
            raise ValueError("GPU indexes must be unique")
        return sorted(v)

    @model_validator(mode="after")
    def _sharing(self) -> Allocation:
        if self.sharing == "exclusive" and (
            self.share not in (None, 1.0) or self.mig_profile or self.mig_instance is not None
        ):
            raise ValueError("an exclusive allocation takes the whole GPU; declare sharing to give a share")
        if self.sharing in ("time_slice", "mps") and self.share is None:
            raise ValueError(
                f"{self.sharing} needs 'share', the part of the GPU the run declares (0 < share <= 1)"
            )
        if self.sharing == "mig" and (self.mig_profile is None or self.mig_instance is None):
            raise ValueError("a MIG allocation needs 'mig_profile' (e.g. 3g.40gb) and 'mig_instance'")
        if self.sharing != "mig" and (self.mig_profile is not None or self.mig_instance is not None):
            raise ValueError("'mig_profile' and 'mig_instance' are for sharing 'mig'")
        return self


_SLURM_NAME = r"^[A-Za-z0-9_][A-Za-z0-9._@+\-]{0,127}$"


class SlurmJob(Strict):
    """Whose a Slurm job is, as its prolog saw it (``SLURM_JOB_ACCOUNT``, ``SLURM_JOB_USER``,
    ``SLURM_JOB_PARTITION``, else ``sacct``): the run's ``slurm.*`` labels, and its team through
    the ``teams`` settings when the registration names none."""

    account: str | None = Field(None, pattern=_SLURM_NAME)
    user: str | None = Field(None, pattern=_SLURM_NAME)
    partition: str | None = Field(None, pattern=_SLURM_NAME)


class RunCreate(Strict):
    run_id: str | None = Field(None, pattern=ID_PATTERN, description="generated when omitted")
    name: str | None = Field(None, max_length=256)
    site: str | None = Field(None, pattern=NAME_PATTERN)
    team: str | None = Field(
        None,
        max_length=128,
        description="default: from the job's scheduler (slurm account, "
        "Kubernetes namespace) as the teams settings map it",
    )
    start: UtcDatetime | None = Field(None, description="defaults to now")
    end: UtcDatetime | None = None
    params: int | None = Field(None, ge=1, le=BIGINT_MAX, description="model parameters, for MFU")
    labels: dict[str, str] = Field(default_factory=dict)
    slurm: SlurmJob | None = Field(
        None, description="a Slurm job's account, user and partition (its prolog sends them; node tokens may)"
    )
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
        "registered", description="'inferred': registered by the collector from the runs agents saw on GPUs"
    )
    gpu_count: int
    gpu_equivalents: float = Field(description="GPUs' worth held: the sum of the allocations' shares")
    allocations: list[Allocation]
    warnings: list[str] = Field(
        default_factory=list,
        description="what was accepted but may be a mistake (e.g. a node that never reported)",
    )


_MODEL_KEY = r"^[A-Za-z0-9][A-Za-z0-9 ._\-]{0,63}$"


def _model_prices(v: dict[str, float | None] | None) -> dict[str, float | None] | None:
    if v is None:
        return v
    for key, price in v.items():
        if not re.fullmatch(_MODEL_KEY, key):
            raise ValueError(f"GPU model key {key!r} must match {_MODEL_KEY} (e.g. 'H100', 'A100 80GB')")
        if price is not None and (why := bounds.problem("gpu_hour_price", price)) is not None:
            raise ValueError(f"GPU-hour price of {key!r}: {why}")
    return v


def _bounded(setting: str) -> Any:
    """A validator of a numeric site setting against its bound (gpufleet.accounting.bounds), naming it."""

    def check(v: float | None) -> float | None:
        return bounds.check(setting, v)

    return check


_CURRENCY = Field(
    None,
    pattern=r"^[A-Z]{3}$",
    description="ISO 4217 code of every price of the site; required once it has a price (amounts are "
    "never assumed to be in one). A change holds from `from` like any setting: amounts "
    "before it stay in the old currency, and the prices in force then must be given "
    "again in the new one (they are not converted)",
)


class SiteUpsert(Strict):
    pue: Annotated[float, AfterValidator(_bounded("pue"))] = Field(1.0, description=bounds.PUE.text)
    price_per_kwh: Annotated[float, AfterValidator(_bounded("price_per_kwh"))] = Field(
        0.0, description=bounds.PRICE_PER_KWH.text
    )
    gpu_hour_price: Annotated[float, AfterValidator(_bounded("gpu_hour_price"))] = Field(
        0.0, description=f"default price of a GPU-hour: {bounds.GPU_HOUR_PRICE.text}"
    )
    currency: str | None = _CURRENCY
    carbon_region: str | None = Field(None, max_length=128)
    carbon_g_per_kwh: Annotated[float | None, AfterValidator(_bounded("carbon_g_per_kwh"))] = Field(
        None, description=bounds.CARBON_G_PER_KWH.text
    )
    gpu_hour_prices: dict[str, float] = Field(
        default_factory=dict,
        max_length=64,
        description="GPU-hour price per GPU model: a key matches GPUs whose model name contains it "
        '(case-insensitive; the longest key wins), e.g. {"H100": 3.1, "A100": 1.9}',
    )

    @field_validator("gpu_hour_prices")
    @classmethod
    def _models(cls, v: dict[str, float]) -> dict[str, float]:
        _model_prices(v)  # type: ignore[arg-type]
        return v


class SiteUpdate(Strict):
    """PATCH: only the fields given change.  ``carbon_region`` and ``carbon_g_per_kwh`` may be set
    to null (no series, no constant); the other fields cannot be null.  In ``gpu_hour_prices`` a
    null ends that model's own price (the default applies again)."""

    pue: Annotated[float | None, AfterValidator(_bounded("pue"))] = Field(None, description=bounds.PUE.text)
    price_per_kwh: Annotated[float | None, AfterValidator(_bounded("price_per_kwh"))] = Field(
        None, description=bounds.PRICE_PER_KWH.text
    )
    gpu_hour_price: Annotated[float | None, AfterValidator(_bounded("gpu_hour_price"))] = Field(
        None, description=bounds.GPU_HOUR_PRICE.text
    )
    currency: str | None = _CURRENCY
    carbon_region: str | None = Field(None, max_length=128)
    carbon_g_per_kwh: Annotated[float | None, AfterValidator(_bounded("carbon_g_per_kwh"))] = Field(
        None, description=bounds.CARBON_G_PER_KWH.text
    )
    gpu_hour_prices: dict[str, float | None] | None = Field(None, max_length=64)

    @field_validator("pue", "price_per_kwh", "gpu_hour_price", "currency", "gpu_hour_prices", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("cannot be null; leave the field out to keep its value")
        return v

    @field_validator("gpu_hour_prices")
    @classmethod
    def _models(cls, v: dict[str, float | None] | None) -> dict[str, float | None] | None:
        return _model_prices(v)


class SitePublic(BaseModel):
    """A site's settings in force at ``as_of`` (dated changes: ``GET /v1/sites/{site}/history``)."""

    site: str
    pue: float
    price_per_kwh: float
    gpu_hour_price: float
    currency: str | None = Field(
        description="the currency in force; null for a site that has no prices and was given none"
    )
    carbon_region: str | None
    carbon_g_per_kwh: float | None
    gpu_hour_prices: dict[str, float] = Field(description="GPU-model prices in force (model key -> price)")
    as_of: AwareDatetime = Field(description="the time these values are in force at")


class SiteSettingPoint(BaseModel):
    setting: Literal[
        "pue", "price_per_kwh", "gpu_hour_price", "carbon_region", "carbon_g_per_kwh", "currency"
    ]
    gpu_model: str | None = Field(description="for a GPU-hour price of one GPU model")
    valid_from: AwareDatetime | None = Field(
        description="in force from this time until the next change of the setting; null: from the beginning"
    )
    value: float | str | None
    set_at: AwareDatetime = Field(description="when the change was made")


class PuePoint(Strict):
    time: UtcDatetime
    pue: Annotated[float, AfterValidator(_bounded("pue"))]


class PricePoint(Strict):
    time: UtcDatetime
    price_per_kwh: Annotated[float, AfterValidator(_bounded("price_per_kwh"))]


class CarbonPoint(Strict):
    time: UtcDatetime
    g_co2e_per_kwh: Annotated[float, AfterValidator(_bounded("carbon_g_per_kwh"))]


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
    method: Literal["average", "marginal"] | None = Field(
        None,
        description="what the intensities are: the grid mix's average (Electricity Maps, inventories) or the "
        "marginal generator's (WattTime's MOER); recorded for the region, 'average' when a "
        "region's first series says nothing",
    )
    name: str | None = Field(
        None, max_length=128, description="readable name of the region (country or grid), for reports"
    )

    @field_validator("points")
    @classmethod
    def _distinct(cls, v: list[CarbonPoint]) -> list[CarbonPoint]:
        return _distinct_times(v)


class PueSeries(Strict):
    points: list[PuePoint] = Field(min_length=1, max_length=100_000)

    @field_validator("points")
    @classmethod
    def _distinct(cls, v: list[PuePoint]) -> list[PuePoint]:
        return _distinct_times(v)


class PriceSeries(Strict):
    points: list[PricePoint] = Field(min_length=1, max_length=100_000)

    @field_validator("points")
    @classmethod
    def _distinct(cls, v: list[PricePoint]) -> list[PricePoint]:
        return _distinct_times(v)


class TokenCreate(Strict):
    name: str = Field(pattern=NAME_PATTERN)
    role: Literal["node", "progress", "finance", "sre", "admin", "remote_write"]
    node: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        description="node: the node it writes (required); progress: only runs on this node",
    )


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


class LostCost(BaseModel):
    """GPU-time lost to incidents and what it cost, at the run's prices (contracts.md section 3.2)."""

    gpu_hours: float = Field(
        description="lost GPU-hours: Σ lost share × allocation share × hours of the claim"
    )
    gpu_kwh: float
    host_kwh: float = Field(description="host energy × lost GPU shares ÷ GPUs the node reports")
    it_kwh: float
    facility_kwh: float = Field(description="IT energy × the PUE in force")
    co2e_kg: float | None = Field(
        description="null when the site has no carbon intensity (or the run no site)"
    )
    energy_cost: float | None = Field(description="null when the run's money cannot be computed (its errors)")
    compute_cost: float | None = Field(description="lost GPU-hours × the GPU-hour price in force")
    total_cost: float | None
    currency: str | None = Field(description="the run's site's currency (money as computed, to 1e-9)")
    minor_units: int


class IncidentLost(LostCost):
    """What one run-scoped incident lost: its GPUs over its span, at its kind's lost share."""

    gpus: int = Field(description="GPUs of the run the incident holds back")
    span_s: float = Field(description="seconds of the incident inside the run's window (open: up to now)")
    lost_share: float = Field(description="mean lost share (0-1) of its GPUs over the span")
    basis: str = Field(
        description="what the lost share rests on: an evidence field, a formula, whole_span or "
        "not_estimated (a kind without a loss model: nothing counted as lost)"
    )


class LostToIncidents(LostCost):
    """The run's GPU-time lost to its incidents in the window, overlaps counted once."""

    incidents: int = Field(description="incidents of the run with GPU-time in the window")


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
    lost: IncidentLost | None = Field(
        None,
        description="run-scoped incidents: the GPU-time they lost and its cost "
        "at the run's prices; null for node-scoped ones",
    )
    actions: list[dict[str, Any]] = Field(
        default_factory=list,
        description="what the quarantine hooks and the run actions did: action (slurm_drain, k8s_cordon; "
        "notify, slurm_requeue, slurm_cancel, k8s_annotate), target (node, job or object), time, "
        "result (done, dry_run, failed, skipped, rate_limited) and detail; run actions also say who "
        "decided (by), why (reason) and what allow-listed the run (allowed_by)",
    )


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
    tokens_per_s: float | None = Field(
        description="tokens ÷ seconds between the reports that bound the window"
    )
    tokens_per_joule: float | None = Field(description="tokens per joule of IT energy (GPU + host share)")
    tokens_per_kwh: float | None = Field(description="tokens per kWh of IT energy")
    samples_per_kwh: float | None
    params: int | None = Field(description="model parameters (runs.params)")
    gpu_model: str | None = Field(description="GPU model from node facts; 'mixed' when the run's GPUs differ")
    peak_flops: float | None = Field(description="sum of the run's GPUs' peak dense BF16 FLOP/s")
    peak_dtype: str | None = Field(
        None,
        description="precision of the peaks: bf16 (fp16 on GPUs without BF16, such "
        "as V100); mixed when the run's GPUs differ",
    )
    peak_sources: list[str] = Field(
        default_factory=list, description="the datasheet (or node fact) of each peak"
    )
    mfu: float | None = Field(
        description="6 × params × tokens_per_s ÷ peak_flops; null when above 1 (see mfu_problem)"
    )
    mfu_unchecked: float | None = Field(None, description="the MFU as computed, also when above 1")
    mfu_problem: str | None = Field(
        None, description="why the MFU cannot be right (above 1: wrong params, token count or peak)"
    )
    lost_gpu_hours: float | None = Field(
        description="GPU-hours the ledger puts in a state other than productive"
    )
    goodput: float | None = Field(description="the ledger's productive share of the run's GPU-hours")


class LedgerState(BaseModel):
    """One state of a run's ledger: its GPU-hours and what they drew and cost, at the run's prices."""

    gpu_hours: float
    gpu_kwh: float
    facility_kwh: float = Field(description="IT energy (GPU and host share) × the PUE in force")
    co2e_kg: float | None = Field(description="null when the run's CO2e is (no carbon intensity known)")
    total_cost: float | None = Field(
        description="energy and compute cost of these GPU-hours, in the run's currency "
        "(null when the run's money cannot be computed)"
    )


class Ledger(BaseModel):
    """Where every GPU-hour of the window went: mutually exclusive states adding up to the run's gpu_hours,
    energies, CO2e and total_cost.  On each GPU at each instant the incident whose state comes first in
    idle, hung, checkpoint, starved, straggler_wait, throttled takes its lost share; the rest is productive."""

    productive: LedgerState = Field(description="GPU-time no incident explains as lost")
    idle: LedgerState = Field(description="GPUs held that did no work (idle_allocation)")
    hung: LedgerState = Field(description="a collective that hung: every GPU of the run (hung_collective)")
    starved: LedgerState = Field(description="GPUs waiting on their input (starvation)")
    checkpoint: LedgerState = Field(description="pauses spent writing checkpoints (checkpoint_stall)")
    straggler_wait: LedgerState = Field(description="GPUs waiting on a slow peer (straggler)")
    throttled: LedgerState = Field(description="clocks held down (throttling)")


class LedgerSumState(BaseModel):
    """A state (or the waste) of several runs' ledgers added up."""

    gpu_hours: float
    gpu_kwh: float
    facility_kwh: float
    co2e_kg: float = Field(description="CO2e of the energy whose carbon intensity is known")
    total_cost: float | None = Field(
        description="null when the runs' currencies differ (see costs_by_currency)"
    )
    costs_by_currency: dict[str, float]


class LedgerSum(BaseModel):
    productive: LedgerSumState
    idle: LedgerSumState
    hung: LedgerSumState
    starved: LedgerSumState
    checkpoint: LedgerSumState
    straggler_wait: LedgerSumState
    throttled: LedgerSumState


class WasteSum(LedgerSumState):
    """Every state but productive."""

    share: float = Field(description="waste GPU-hours ÷ the runs' GPU-hours (0 without any)")


class AccountingSegment(BaseModel):
    start: str = _time("segment start")
    end: str = _time("segment end")
    gpu_kwh: float
    host_kwh: float
    facility_kwh: float
    g_co2e_per_kwh: float | None
    price_per_kwh: float
    co2e_kg: float | None
    energy_cost: float | None
    currency: str | None = Field(None, description="the currency the segment is priced in")


class RatePeriod(BaseModel):
    """Site settings in force over one period of the window (a dated change starts a new period)."""

    from_: str = Field(
        alias="from", description="period start (RFC 3339 UTC)", json_schema_extra={"format": "date-time"}
    )
    to: str = _time("period end")
    pue: float
    price_per_kwh: float
    gpu_hour_price: float = Field(description="the site's default GPU-hour price")
    carbon_region: str | None
    carbon_g_per_kwh: float | None = Field(
        description="the site's constant intensity (used without a series)"
    )
    currency: str | None = Field(None, description="the currency in force (a dated setting like the others)")


class ModelPrice(BaseModel):
    gpu_model: str = Field(description="model key of the site's price (matched inside the GPU model name)")
    from_: str = Field(alias="from", json_schema_extra={"format": "date-time"})
    to: str = _time("period end")
    gpu_hour_price: float


class GpuModelCount(BaseModel):
    model: str | None = Field(description="GPU model from node facts (null: unknown)")
    gpus: int
    sharing: Literal["exclusive", "time_slice", "mps", "mig"]
    shares: float = Field(description="GPUs' worth held: the sum of the allocations' shares")


class CarbonRegionUsed(BaseModel):
    region: str
    method: Literal["average", "marginal"] | None = Field(
        description="as recorded for the series; null if never"
    )
    name: str | None = Field(description="country or region name, as recorded")


class CurrencyCostOrNull(BaseModel):
    energy_cost: float | None
    compute_cost: float | None
    total_cost: float | None


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
    co2e_kg: float | None = Field(
        description="null when the site has no carbon intensity (or the run no site)"
    )
    energy_cost: float | None = Field(
        description="facility energy × the energy price in force, as computed (to 1e-9 "
        "of the currency; rounding to minor units is presentation); null "
        "when it cannot be computed (see errors) or the window crosses a "
        "currency change (see costs_by_currency)"
    )
    compute_cost: float | None = Field(
        description="gpu_hours × the GPU-hour price in force; null as energy_cost"
    )
    total_cost: float | None = Field(description="energy_cost + compute_cost; null as energy_cost")
    currency: str | None = Field(
        description="the site's currency; null for a run without a site (or across a currency change)"
    )
    coverage: float = Field(description="share of allocated GPU-seconds inside counted intervals, 0-1")
    name: str | None
    site: str | None
    team: str | None
    state: Literal["pending", "running", "ended"] = Field(description="as GET /v1/runs/{id} says it")
    planned_end: str | None = _time(
        "the end a running run was registered with; null once it ended or without one"
    )
    window_start: str = _time("start of the accounted window")
    window_end: str = _time("end of the accounted window (now for a running run)")
    duration_s: float = Field(description="window_end - window_start, seconds")
    source: Literal["rollup", "raw", "mixed"] = Field(
        description="rollups (with raw partial minutes), raw samples, or both (data pending in the rollup queue)"
    )
    max_gap_s: float
    carbon_source: Literal["series", "site_constant", "none", "mixed"]
    carbon_method: Literal["average", "marginal", "mixed"] | None = Field(
        description="carbon intensities used: grid average or marginal (as recorded for each series; a site's "
        "constant is an average factor); null when unknown"
    )
    carbon_series: list[CarbonRegionUsed] = Field(
        description="carbon regions in force during the window: their method and name as recorded"
    )
    price_source: Literal["time_of_use", "flat", "none"]
    gpu_hour_price: float | None = Field(
        description="compute_cost ÷ gpu_hours (the price in force when no hours)"
    )
    gpu_equivalents: float = Field(
        description="GPUs' worth held: Σ shares (gpu_count without declared sharing)"
    )
    gpu_models: list[GpuModelCount]
    co2e_unknown_kwh: float = Field(description="facility energy with no known carbon intensity")
    g_co2e_per_kwh: float | None = Field(
        description="energy-weighted carbon intensity used (co2e ÷ facility kWh)"
    )
    gpu_power_w: float | None = Field(
        description="average power of the run's GPUs together over the window, W"
    )
    it_power_w: float | None = Field(description="average IT power (GPUs and their host share), W")
    emissions_rate_kg_s: float | None = Field(
        description="co2e_kg ÷ duration_s (CodeCarbon's emissions_rate)"
    )
    minor_units: int = Field(
        description="decimal places of the currency's minor unit (2 for EUR, 0 for JPY), for presentation"
    )
    costs_by_currency: dict[str, CurrencyCostOrNull] = Field(
        description="money per currency the window was priced in (one, unless it crosses a currency change)"
    )
    rates: list[RatePeriod] = Field(description="the site's settings in force during the window, per period")
    gpu_model_prices: list[ModelPrice] = Field(description="GPU-model prices in force for the run's GPUs")
    efficiency: Efficiency
    lost_to_incidents: LostToIncidents = Field(
        description="GPU-time of the window lost to the run's incidents and what it cost (contracts.md section 3.2)"
    )
    ledger: Ledger | None = Field(
        None, description="where every GPU-hour of the window went (contracts.md section 3)"
    )
    errors: list[str] = Field(
        description="figures that could not be computed and why (null above); empty when none"
    )
    segments: list[AccountingSegment] | None = Field(None, description="per tariff segment, when asked for")


class CurrencyCost(BaseModel):
    energy_cost: float | None
    compute_cost: float | None
    total_cost: float | None


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
    ledger: LedgerSum | None = Field(None, description="blocks of runs: their ledgers added up, per state")
    waste: WasteSum | None = Field(
        None, description="blocks of runs: every state of their ledgers but productive"
    )


class FleetGroup(FleetBlock):
    key: str | None = Field(description="site, team or run id; null for runs without one")


class FleetAccounting(BaseModel):
    from_: str = Field(
        alias="from", description="period start (RFC 3339 UTC)", json_schema_extra={"format": "date-time"}
    )
    to: str = _time("period end")
    window_end: str = _time("end of the accounted period (now, when the period reaches into the future)")
    group_by: Literal["site", "team", "run"]
    source: Literal["rollup", "raw", "mixed"]
    max_gap_s: float
    groups: list[FleetGroup]
    runs: FleetBlock = Field(description="all runs in the period (the groups together)")
    unallocated: FleetBlock = Field(
        description="GPU time no run held, inside sample intervals (with telemetry), "
        "and the hosts' idle share"
    )
    no_telemetry: FleetBlock = Field(
        description="GPU time no run held and no sample covers: no energy is known; "
        "a GPU counts from when it joined the fleet (first sample, first "
        "run, registration) until it left (silent past "
        "accounting.gone_after_s)"
    )
    total: FleetBlock = Field(
        description="every GPU and host of the fleet in the period; its money is runs + unallocated"
    )
    errors: list[str] = Field(
        default_factory=list,
        description="lines whose money could not be computed and why "
        "(their currency's money is null in every block "
        "they are in)",
    )
