"""The shape of a run's accounting, as the API answers it (contracts.md section 3).

A ``TypedDict``: the body stays the JSON object callers serialise, and every
reader that indexes a field gets its type checked.  The contract's own fields
come first (:data:`gpufleet.accounting.run.CONTRACT_FIELDS`), then the extras.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Segment(TypedDict):
    """One stretch of constant prices and carbon intensity within the window (``segments=true``)."""

    start: str | None
    end: str | None
    gpu_kwh: float | None
    host_kwh: float | None
    facility_kwh: float | None
    g_co2e_per_kwh: float | None
    price_per_kwh: float
    co2e_kg: float | None
    energy_cost: float | None
    currency: str | None


class AccountingBody(TypedDict):
    """``GET /v1/runs/{run_id}/accounting``."""

    run_id: str
    start: str | None
    end: str | None
    gpu_count: int
    gpu_hours: float
    gpu_kwh: float | None
    host_kwh: float | None
    it_kwh: float | None
    pue: float | None
    facility_kwh: float
    co2e_kg: float | None
    energy_cost: float | None
    compute_cost: float | None
    total_cost: float | None
    currency: str | None
    coverage: float | None
    # extras
    name: str | None
    site: str | None
    team: str | None
    state: str
    #: the end a running run was registered with (null once it ended, or without one)
    planned_end: str | None
    window_start: str | None
    window_end: str | None
    #: window_end - window_start, seconds
    duration_s: float
    source: str
    max_gap_s: float
    carbon_source: str
    #: average | marginal | mixed over the intensities used; null when unknown
    carbon_method: str | None
    #: {region, method, name} of each carbon region in force
    carbon_series: list[dict[str, Any]]
    price_source: str
    gpu_hour_price: float | None
    gpu_equivalents: float
    gpu_models: list[dict[str, Any]]
    co2e_unknown_kwh: float | None
    g_co2e_per_kwh: float | None
    #: average GPU power of the run's GPUs over the window (all of them together), W
    gpu_power_w: float | None
    #: average IT power (GPUs and their host share), W
    it_power_w: float | None
    #: co2e_kg per second of the window (CodeCarbon's emissions_rate), kg/s
    emissions_rate_kg_s: float | None
    minor_units: int | None
    #: currency -> {energy_cost, compute_cost, total_cost}: every currency the window was priced in
    costs_by_currency: dict[str, dict[str, float | None]]
    rates: list[dict[str, Any]]
    gpu_model_prices: list[dict[str, Any]]
    efficiency: dict[str, Any]
    lost_to_incidents: dict[str, Any]
    #: what could not be computed and why (a stored price outside its bounds, ...); empty when all is well
    errors: list[str]
    #: state -> {gpu_hours, gpu_kwh, facility_kwh, co2e_kg, total_cost} (gpufleet.accounting.ledger)
    ledger: NotRequired[dict[str, dict[str, float | None]]]
    segments: NotRequired[list[Segment]]


class LedgerSummary(TypedDict):
    """What the fleet's views need of a run: who it is, its currency, its ledger and its errors, each as
    in the run's :class:`AccountingBody` (:func:`gpufleet.accounting.run.ledger_summaries`)."""

    run_id: str
    name: str | None
    site: str | None
    team: str | None
    currency: str | None
    ledger: dict[str, dict[str, float | None]]
    errors: list[str]


def group_value(body: AccountingBody | LedgerSummary, group_by: str) -> str | None:
    """The value of a report's grouping (``site``, ``team`` or ``run``) for one run's body."""
    return {"site": body["site"], "team": body["team"], "run": body["run_id"]}[group_by]
