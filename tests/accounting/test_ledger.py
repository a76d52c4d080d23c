"""The per-run ledger (contracts.md section 3, ``ledger``), worked out by hand.

Site: PUE 1.5, 0.20 USD/kWh, 2.00 USD per GPU-hour, 400 g CO2e/kWh.  Node n1 (8 GPUs) draws
300 W on every GPU and 800 W at the host, sampled every 10 s; run r holds GPUs 0-3 over
[0, 3600): 14,400 GPU-s.  Each GPU-second is 300 J of GPU energy and 100 J of host share, 600 J
at the facility.

* idle_allocation [0, 2700) naming GPUs 2 and 3 (idle: all of their time)
* checkpoint_stall [600, 1200), job-wide, half the run's time
* starvation [900, 1500), job-wide, 0.4 of GPU time
* hung_collective [2400, 3000): every GPU of the run, all of its time
* throttling [3000, 3600) of GPU 0 at half clocks all the time: 0.5
* straggler [3300, 3600), activity 0.6 against 0.8: every GPU loses 0.25
* pcie_degraded on GPU 1 with a lost share in its evidence: a health kind, no state of time

By the one rule (idle, hung, checkpoint, starved, straggler_wait, throttled):

* idle: GPUs 2-3 over [0, 2700) = 5400 GPU-s (the checkpoint, the starvation and the first
  300 s of the hang on them are idle time)
* hung: GPUs 0-1 over [2400, 3000) and GPUs 2-3 over [2700, 3000): 1200 + 600 = 1800
* checkpoint: GPUs 0-1 over [600, 1200) at 0.5 = 600
* starved: GPUs 0-1 over [1200, 1500) at 0.4 = 240 (the checkpoint explains [900, 1200))
* straggler_wait: 4 GPUs over [3300, 3600) at 0.25 = 300 (GPU 0's throttling there is the weaker)
* throttled: GPU 0 over [3000, 3300) at 0.5 = 150
* productive: 14400 - 8490 = 5910
"""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.accounting import run_accounting
from gpufleet.accounting.incidents import Piece
from gpufleet.accounting.ledger import FIELDS, explain
from gpufleet.waste import PRECEDENCE, STATES, explaining_kind
from tests.accounting.builders import (
    KWH,
    T0,
    approx,
    at,
    constant_power,
    drain,
    gpu_samples,
    node,
    run,
)
from tests.accounting.builders import site as make_site
from tests.accounting.test_incident_cost import fleet, incident

EXPECTED_S = {
    "productive": 5910.0,
    "idle": 5400.0,
    "hung": 1800.0,
    "checkpoint": 600.0,
    "starved": 240.0,
    "straggler_wait": 300.0,
    "throttled": 150.0,
}


def gpus(*ids: int, node_name: str = "n1") -> list[dict[str, Any]]:
    return [{"node": node_name, "gpu": g} for g in ids]


def every_kind(conn: psycopg.Connection) -> None:
    fleet(conn)
    incident(conn, "idle_allocation", 0, 2700, {"gpus": gpus(2, 3), "since": at(0).isoformat()})
    incident(conn, "checkpoint_stall", 600, 1200, {"run_time_lost_share": 0.5})
    incident(conn, "starvation", 900, 1500, {"gpu_time_lost_share": 0.4})
    incident(conn, "hung_collective", 2400, 3000, {"gpus": gpus(3)})
    per = {"throttled_share": 1.0, "clock_ratio": 0.5}
    incident(
        conn,
        "throttling",
        3000,
        3600,
        {**per, "gpus": [{"node": "n1", "gpu": 0, **per}]},
        node_name="n1",
        scope="power_cap",
    )
    incident(conn, "straggler", 3300, 3600, {"activity": 0.6, "peer_activity": 0.8}, node_name="n1", gpu=0)
    incident(conn, "pcie_degraded", 0, 3600, {"gpu_time_lost_share": 0.9}, node_name="n1", gpu=1)


def expect_cell(c: dict[str, Any], gpu_s: float, abs_: float = 1e-9) -> None:
    """``gpu_s`` GPU-seconds on this fleet; ``abs_``: a remainder of several lines rounded to 1e-9 each."""
    gpu_kwh = 300.0 * gpu_s / KWH
    fac = (gpu_kwh + 100.0 * gpu_s / KWH) * 1.5
    assert approx(c["gpu_hours"], gpu_s / 3600.0, abs_=abs_), c
    assert approx(c["gpu_kwh"], gpu_kwh, abs_=abs_) and approx(c["facility_kwh"], fac, abs_=abs_), c
    assert approx(c["co2e_kg"], fac * 0.4, abs_=abs_), c
    assert abs(c["total_cost"] - (fac * 0.20 + gpu_s / 3600.0 * 2.0)) <= 0.02, c  # money per line to the cent


def dec(x: float | None) -> Decimal:
    assert x is not None
    return Decimal(repr(x))


def sums_exactly(body: dict[str, Any]) -> None:
    """Every field of the states adds up to the run's own, as decimals (the numbers' shortest forms)."""
    led = body["ledger"]
    assert list(led) == list(STATES)
    for f in FIELDS:
        assert sum((dec(led[s][f]) for s in STATES), Decimal(0)) == dec(body[f]), f
        assert all(led[s][f] >= 0 for s in STATES), (f, led)


@pytest.mark.parametrize("source", ["raw", "auto"])
def test_every_second_lands_in_one_state(conn: psycopg.Connection, source: str) -> None:
    every_kind(conn)
    if source == "auto":
        drain(conn)
    body = run_accounting(conn, "r", now=at(10_000), source=source)  # type: ignore[arg-type]
    for state, s in EXPECTED_S.items():
        expect_cell(body["ledger"][state], s, 1e-8 if state == "productive" else 1e-9)
    sums_exactly(dict(body))
    assert approx(body["efficiency"]["goodput"], 5910.0 / 14400.0)
    assert approx(body["efficiency"]["lost_gpu_hours"], 8490.0 / 3600.0)
    # lost_to_incidents keeps its own definition: every kind's largest share, the health kind included
    # (GPU 1 loses 0.9 wherever no larger share covers it)
    assert body["lost_to_incidents"]["incidents"] == 7


def test_a_period_clips_the_ledger(conn: psycopg.Connection) -> None:
    every_kind(conn)
    # [2500, 3600): idle GPUs 2-3 [2500, 2700) = 400; hung 2 × 500 + 2 × 300 = 1600; straggler 300; throttled 150
    body = run_accounting(conn, "r", now=at(10_000), source="raw", since=at(2500))
    led = body["ledger"]
    for state, s in {
        "idle": 400.0,
        "hung": 1600.0,
        "straggler_wait": 300.0,
        "throttled": 150.0,
        "checkpoint": 0.0,
        "starved": 0.0,
        "productive": 4 * 1100 - 2450.0,
    }.items():
        expect_cell(led[state], s, 1e-8 if state == "productive" else 1e-9)
    sums_exactly(dict(body))


def test_an_open_idle_allocation_counts_up_to_now(conn: psycopg.Connection) -> None:
    fleet(conn)
    incident(conn, "idle_allocation", 1800, None, {"gpus": gpus(0, 1, 2, 3)})
    body = run_accounting(conn, "r", now=at(2400), source="raw")  # running: accounted up to now
    expect_cell(body["ledger"]["idle"], 4 * 600.0)
    expect_cell(body["ledger"]["productive"], 4 * 1800.0, 1e-8)
    assert approx(body["efficiency"]["goodput"], 0.75)
    sums_exactly(dict(body))


def test_a_whole_run_idle_is_the_runs_own_line(conn: psycopg.Connection) -> None:
    """Nothing but idle: the idle state is exactly the run's figures and productive is zero."""
    fleet(conn)
    incident(conn, "idle_allocation", -60, None, {"gpus": gpus(0, 1, 2, 3)})
    body: dict[str, Any] = dict(run_accounting(conn, "r", now=at(10_000), source="raw"))
    idle, prod = body["ledger"]["idle"], body["ledger"]["productive"]
    for f in FIELDS:
        assert idle[f] == body[f], f
        assert prod[f] == 0, f
    assert body["efficiency"]["goodput"] == 0.0
    assert approx(body["ledger"]["idle"]["gpu_hours"], 4.0)


def test_no_incident_is_all_productive_and_no_carbon_is_null(conn: psycopg.Connection) -> None:
    make_site(conn, "bare", pue=1.0, price=0.1, gpu_hour=1.0, currency="EUR")  # no carbon intensity
    node(conn, "m", 2, "bare")
    run(conn, "p", 0, 600, {"m": [0, 1]}, site_name="bare")
    gpu_samples(conn, constant_power("m", range(2), 200.0, 0, 600))
    body = run_accounting(conn, "p", now=at(10_000), source="raw")
    led = body["ledger"]
    assert body["co2e_kg"] is None and all(led[s]["co2e_kg"] is None for s in STATES)
    for f in ("gpu_hours", "gpu_kwh", "facility_kwh", "total_cost"):
        assert led["productive"][f] == body[f]
        assert all(led[s][f] == 0 for s in PRECEDENCE)
    assert body["efficiency"]["goodput"] == 1.0


def test_the_api_serves_the_ledger(api: Any) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        every_kind(conn)
    with api.client("sre") as c:
        body = c.get("/v1/runs/r/accounting").json()
        spec = c.get("/openapi.json").json()
    for state, s in EXPECTED_S.items():
        expect_cell(body["ledger"][state], s, 1e-8 if state == "productive" else 1e-9)
    sums_exactly(body)
    assert "ledger" in spec["components"]["schemas"]["RunAccounting"]["properties"]


# ------------------------------------------------------------------------------ the rule itself


def _t(s: int) -> datetime:
    return T0 + timedelta(seconds=s)


KIND_OF_STATE = {
    "idle": "idle_allocation",
    "hung": "hung_collective",
    "checkpoint": "checkpoint_stall",
    "starved": "starvation",
    "straggler_wait": "straggler",
    "throttled": "throttling",
}

claims_st = st.lists(
    st.tuples(
        st.sampled_from(PRECEDENCE),
        st.integers(0, 1),
        st.integers(0, 50),
        st.integers(1, 50),
        st.sampled_from([0.0, 0.25, 0.5, 1.0]),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(claims_st)
def test_explain_gives_each_instant_to_the_rules_state(raw: list[tuple[str, int, int, int, float]]) -> None:
    claims = [(s, Piece("r", "n", g, _t(a), _t(a + d), w)) for s, g, a, d, w in raw]
    got = explain(claims)
    for g in (0, 1):
        for x in range(0, 101):
            t0 = _t(x)
            covering = [
                (s, p)
                for s, p in claims
                if p.node == "n" and p.gpu == g and p.lo <= t0 < p.hi and p.weight > 0
            ]
            mine = [(s, p) for s, p in got if p.gpu == g and p.lo <= t0 < p.hi]
            if not covering:
                assert mine == []
                continue
            best = explaining_kind(KIND_OF_STATE[s] for s, _ in covering)
            state = next(s for s, k in KIND_OF_STATE.items() if k == best)
            assert len(mine) == 1, (x, mine)
            assert mine[0][0] == state
            assert mine[0][1].weight == max(p.weight for s, p in covering if s == state)
