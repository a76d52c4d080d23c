"""What incidents cost (contracts.md section 3.8), worked out by hand.

Site: PUE 1.5, 0.20 USD/kWh, 2.00 USD per GPU-hour, 400 g CO2e/kWh.  Node n1
(8 GPUs) draws 300 W on every GPU and 800 W at the host, sampled every 10 s;
run r holds GPUs 0-3 over [0, 3600).

* A: a job-wide checkpoint stall over [600, 1200) losing half the run's time:
  4 GPUs × 600 s × 0.5 = 1200 GPU-s.
* B: throttling of GPUs 0 and 1 over [900, 1500), clocks at 0.25 of maximum
  all the time: each loses 0.75, 2 × 600 s × 0.75 = 900 GPU-s.

Union (never the sum): GPUs 0-1 lose 0.5 over [600, 900) and 0.75 over
[900, 1500) (the larger of A and B where both hold) = 600 GPU-s each; GPUs 2-3
lose 0.5 over [600, 1200) = 300 GPU-s each; 1800 GPU-s in all, not 2100.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpufleet.accounting import run_accounting
from gpufleet.accounting.incidents import Piece, incident_costs, union
from tests.accounting.builders import (
    KWH,
    approx,
    at,
    carbon,
    constant_power,
    drain,
    gpu_samples,
    host_samples,
    node,
    run,
    setting,
    site,
)
from tests.api.conftest import Api


def incident(
    conn: psycopg.Connection,
    kind: str,
    start_s: float,
    end_s: float | None,
    evidence: dict[str, Any],
    *,
    run_id: str = "r",
    node_name: str | None = None,
    gpu: int | None = None,
    scope: str = "",
) -> int:
    row = conn.execute(
        'INSERT INTO incidents (kind, scope_key, run_id, node, gpu, cause, severity, state, start, "end", last_seen, '
        "evidence) VALUES (%s, %s, %s, %s, %s, NULL, 'warning', %s, %s, %s, %s, %s) RETURNING id",
        (
            kind,
            f"{kind}|{scope or start_s}",
            run_id,
            node_name,
            gpu,
            "open" if end_s is None else "resolved",
            at(start_s),
            None if end_s is None else at(end_s),
            at(end_s or start_s),
            json.dumps(evidence),
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def fleet(conn: psycopg.Connection) -> None:
    site(conn, "s1", pue=1.5, price=0.20, gpu_hour=2.0, currency="USD", carbon=400.0)
    node(conn, "n1", 8, "s1")
    run(conn, "r", 0, 3600, {"n1": [0, 1, 2, 3]}, site_name="s1")
    gpu_samples(conn, constant_power("n1", range(8), 300.0, 0, 3600))
    host_samples(conn, [(s, "n1", 800.0) for s in range(0, 3601, 10)])


def stall_and_throttle(conn: psycopg.Connection) -> tuple[int, int]:
    a = incident(conn, "checkpoint_stall", 600, 1200, {"run_time_lost_share": 0.5})
    per = {"throttled_share": 1.0, "clock_ratio": 0.25}
    b = incident(
        conn,
        "throttling",
        900,
        1500,
        {
            "throttled_share": 1.0,
            "clock_ratio": 0.25,
            "gpus": [{"node": "n1", "gpu": 0, **per}, {"node": "n1", "gpu": 1, **per}],
        },
        node_name="n1",
        scope="power_cap",
    )
    return a, b


def expect(lost: dict[str, Any], gpu_s: float) -> None:
    """Figures of ``gpu_s`` lost GPU-seconds on this fleet: 300 W per GPU, host 800 W ÷ 8 per GPU."""
    gpu_kwh = 300.0 * gpu_s / KWH
    host_kwh = 800.0 * gpu_s / 8 / KWH
    fac = (gpu_kwh + host_kwh) * 1.5
    assert approx(lost["gpu_hours"], gpu_s / 3600.0), lost
    assert approx(lost["gpu_kwh"], gpu_kwh) and approx(lost["host_kwh"], host_kwh), lost
    assert approx(lost["it_kwh"], gpu_kwh + host_kwh) and approx(lost["facility_kwh"], fac), lost
    assert approx(lost["co2e_kg"], fac * 0.4), lost
    assert lost["currency"] == "USD" and lost["minor_units"] == 2


@pytest.mark.parametrize("source", ["raw", "rollup"])
def test_each_incident_costs_its_own_gpu_time(conn: psycopg.Connection, source: str) -> None:
    fleet(conn)
    a, b = stall_and_throttle(conn)
    if source == "rollup":
        drain(conn)
    incs = [
        dict(zip(("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence"), r, strict=True))
        for r in conn.execute(
            'SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents ORDER BY id'
        ).fetchall()
    ]
    costs = incident_costs(conn, incs, now=at(10_000), source=source)  # type: ignore[arg-type]
    la, lb = costs[a], costs[b]
    assert la is not None and lb is not None
    # A: 1200 GPU-s; 0.1 kWh GPU + 0.0333 kWh host, ×1.5 = 0.2 kWh; 0.04 USD energy + 0.6667 compute
    expect(la, 1200.0)
    assert la["gpus"] == 4 and la["span_s"] == 600.0 and la["lost_share"] == 0.5
    assert la["basis"] == "run_time_lost_share"
    assert (
        la["energy_cost"] == 0.04
        and approx(la["compute_cost"], 2 / 3)
        and approx(la["total_cost"], 0.04 + 2 / 3)
    )
    # B: 900 GPU-s; 0.075 + 0.025 kWh, ×1.5 = 0.15 kWh; 0.03 USD energy + 0.50 compute
    expect(lb, 900.0)
    assert lb["gpus"] == 2 and approx(lb["lost_share"], 0.75)
    assert lb["energy_cost"] == 0.03 and lb["compute_cost"] == 0.5 and lb["total_cost"] == 0.53


def test_run_accounting_counts_overlapping_incidents_once(conn: psycopg.Connection) -> None:
    fleet(conn)
    stall_and_throttle(conn)
    body = run_accounting(conn, "r", now=at(10_000), source="raw")
    lost = body["lost_to_incidents"]
    # 1800 GPU-s = 0.5 GPU-h (the incidents alone add up to 2100 GPU-s)
    expect(lost, 1800.0)
    assert lost["incidents"] == 2
    # 0.15 kWh GPU + 0.05 host = 0.2 IT, 0.3 facility: 0.06 USD energy, 1.00 compute
    assert lost["energy_cost"] == 0.06 and lost["compute_cost"] == 1.0 and lost["total_cost"] == 1.06
    drain(conn)
    rolled = run_accounting(conn, "r", now=at(10_000), source="auto")["lost_to_incidents"]
    for k in ("gpu_hours", "gpu_kwh", "host_kwh", "facility_kwh", "co2e_kg", "energy_cost", "compute_cost"):
        assert approx(rolled[k], lost[k]), k
    # the run's whole line is unchanged by its incidents
    assert approx(body["gpu_hours"], 4.0) and body["compute_cost"] == 8.0


def test_a_period_clips_the_lost_line(conn: psycopg.Connection) -> None:
    fleet(conn)
    stall_and_throttle(conn)
    # [1000, 3600): A keeps [1000, 1200) (4 × 200 × 0.5 = 400), B [1000, 1500) on GPUs 0-1 (2 × 500 × 0.75 = 750);
    # union: GPUs 0-1 0.75 over [1000, 1500) = 375 each, GPUs 2-3 0.5 over [1000, 1200) = 100 each: 950 GPU-s
    body = run_accounting(conn, "r", now=at(10_000), source="raw", since=at(1000))
    expect(body["lost_to_incidents"], 950.0)


def test_whole_run_lost_equals_the_runs_own_accounting(conn: psycopg.Connection) -> None:
    """The relation to the one definition: an incident losing every GPU of the run for all of its window
    costs exactly the run's line, across PUE, energy-price and GPU-hour-price changes and a carbon series."""
    site(conn, "s2", pue=1.2, price=0.10, gpu_hour=1.5, currency="EUR", region="DE")
    setting(conn, "s2", "pue", 1234, 1.4)
    setting(conn, "s2", "price_per_kwh", 2222, 0.35)
    setting(conn, "s2", "gpu_hour_price", 3000, 2.25)
    carbon(conn, "DE", [(0, 300.0), (1800, 500.0), (2700, 100.0)])
    node(conn, "n2", 4, "s2")
    run(conn, "w", 5, 3595, {"n2": [0, 2]}, site_name="s2")
    gpu_samples(
        conn,
        constant_power("n2", range(4), 210.0, 0, 1800) + constant_power("n2", range(4), 420.0, 1810, 3600),
    )
    host_samples(conn, [(s, "n2", 500.0 + s / 10) for s in range(0, 3601, 10)])
    incident(conn, "starvation", -100, None, {}, run_id="w")  # open, before the run: clipped to the run
    body = run_accounting(conn, "w", now=at(10_000), source="raw")
    lost = body["lost_to_incidents"]
    for k in (
        "gpu_hours",
        "gpu_kwh",
        "host_kwh",
        "it_kwh",
        "facility_kwh",
        "co2e_kg",
        "energy_cost",
        "compute_cost",
        "total_cost",
        "currency",
    ):
        assert lost[k] == body[k], (k, lost[k], body[k])
    assert body["energy_cost"] > 0 and body["price_source"] == "time_of_use"


def test_incident_kinds_and_scopes(conn: psycopg.Connection) -> None:
    fleet(conn)
    run(conn, "q", 0, 3600, {"n1": [4, 5]}, site_name="s1")
    ids = {
        # one GPU of the run, no lost-share evidence: all of its span on that GPU (100 s)
        "gpu": incident(conn, "starvation", 0, 100, {}, gpu=2, node_name="n1"),
        # a straggler holds every GPU of the run back by its activity gap: 4 × 100 × (1 - 0.6/0.8) = 100
        "straggler": incident(
            conn, "straggler", 0, 100, {"activity": 0.8, "peer_activity": 0.6}, gpu=1, node_name="n1"
        ),
        # no loss model: zero lost, said so
        "pcie": incident(conn, "pcie_degraded", 0, 100, {"degraded_share": 1.0}, gpu=0, node_name="n1"),
        # node-scoped (no run): no lost block
        "node": incident(conn, "host_misconfig", 0, 100, {}, run_id=None, node_name="n1"),  # type: ignore[arg-type]
        # open: counts up to now (3000 s) at 1 - duty_cycle, on the other run
        "open": incident(conn, "starvation", 2000, None, {"duty_cycle": 0.75}, run_id="q"),
    }
    incs = [
        dict(zip(("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence"), r, strict=True))
        for r in conn.execute(
            'SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents'
        ).fetchall()
    ]
    costs = incident_costs(conn, incs, now=at(3000), source="raw")  # type: ignore[arg-type]
    assert costs[ids["node"]] is None
    g, s, p, o = (costs[ids[k]] for k in ("gpu", "straggler", "pcie", "open"))
    assert g is not None and s is not None and p is not None and o is not None
    expect(g, 100.0)
    assert g["gpus"] == 1 and g["basis"] == "whole_span"
    expect(s, 100.0)
    assert s["gpus"] == 4 and s["basis"] == "activity_gap"
    assert p["gpu_hours"] == 0.0 and p["total_cost"] == 0.0 and p["basis"] == "not_estimated"
    assert p["currency"] == "USD"
    expect(o, 2 * 1000 * 0.25)
    assert o["basis"] == "1-duty_cycle" and o["span_s"] == 1000.0


def test_union_takes_the_largest_share_never_the_sum() -> None:
    t = [datetime.fromisoformat(f"2026-12-01T10:00:{s:02d}+00:00") for s in range(0, 60, 10)]
    ps = [
        Piece("r", "n", 0, t[0], t[3], 0.5),
        Piece("r", "n", 0, t[1], t[2], 0.25),
        Piece("r", "n", 0, t[2], t[4], 0.75),
        Piece("r", "n", 1, t[4], t[5], 1.0),
    ]
    assert union(ps) == [
        Piece("r", "n", 0, t[0], t[2], 0.5),
        Piece("r", "n", 0, t[2], t[4], 0.75),
        Piece("r", "n", 1, t[4], t[5], 1.0),
    ]
    # gaps stay gaps
    assert union([Piece("r", "n", 0, t[0], t[1], 1.0), Piece("r", "n", 0, t[2], t[3], 1.0)]) == [
        Piece("r", "n", 0, t[0], t[1], 1.0),
        Piece("r", "n", 0, t[2], t[3], 1.0),
    ]


def _covered(pieces: list[Piece]) -> dict[tuple[str, int, datetime], float]:
    """Each (node, GPU, second) some piece covers, with the largest weight covering it: the union by
    definition, second by second."""
    got: dict[tuple[str, int, datetime], float] = {}
    for p in pieces:
        t = p.lo
        while t < p.hi:
            key = (p.node, p.gpu, t)
            got[key] = max(got.get(key, p.weight), p.weight)
            t += timedelta(seconds=1)
    return got


_T = datetime.fromisoformat("2026-12-01T10:00:00+00:00")


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["n1", "n2"]),
            st.integers(0, 1),
            st.integers(0, 40),
            st.integers(0, 12),
            st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]),
        ),
        max_size=12,
    )
)
@settings(max_examples=200, deadline=None)
def test_union_is_the_largest_weight_at_every_instant(raw: list[tuple[str, int, int, int, float]]) -> None:
    pieces = [
        Piece("r", n, g, _T + timedelta(seconds=a), _T + timedelta(seconds=a + d), w) for n, g, a, d, w in raw
    ]
    got = union(pieces)
    assert _covered(got) == _covered(pieces)
    # pieces of one GPU never overlap, and neighbours of equal weight are one piece
    for a, b in pairwise(sorted(got, key=lambda p: (p.node, p.gpu, p.lo))):
        if (a.node, a.gpu) == (b.node, b.gpu):
            assert a.hi <= b.lo and not (a.hi == b.lo and a.weight == b.weight)


def test_api_incidents_and_run_accounting_carry_the_cost(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        fleet(conn)
        a, b = stall_and_throttle(conn)
        node_only = incident(conn, "host_misconfig", 0, 100, {}, run_id=None, node_name="n1")  # type: ignore[arg-type]
    with api.client("sre") as c:
        listed = {i["id"]: i for i in c.get("/v1/incidents").json()}
        one = c.get(f"/v1/incidents/{b}").json()
        of_run = {i["id"]: i for i in c.get("/v1/runs/r/incidents").json()}
        body = c.get("/v1/runs/r/accounting").json()
    assert listed[node_only]["lost"] is None
    expect(listed[a]["lost"], 1200.0)
    assert approx(listed[a]["lost"]["total_cost"], 0.04 + 2 / 3)
    assert one["lost"] == listed[b]["lost"] == of_run[b]["lost"]
    expect(one["lost"], 900.0)
    assert one["lost"]["total_cost"] == 0.53 and one["lost"]["gpus"] == 2
    expect(body["lost_to_incidents"], 1800.0)
    assert body["lost_to_incidents"]["total_cost"] == 1.06 and body["lost_to_incidents"]["incidents"] == 2


def test_a_run_without_incidents_loses_nothing_in_its_currency(conn: psycopg.Connection) -> None:
    fleet(conn)
    lost = run_accounting(conn, "r", now=at(10_000), source="raw")["lost_to_incidents"]
    assert lost["gpu_hours"] == 0.0 and lost["total_cost"] == 0.0 and lost["incidents"] == 0
    assert lost["currency"] == "USD" and lost["minor_units"] == 2


def test_pages_show_what_incidents_lost(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        fleet(conn)
        stall_and_throttle(conn)
    with httpx.Client(base_url=api.url, cookies={"gpufleet_token": api.tokens["sre"]}, timeout=30) as c:
        run_page = c.get("/runs/r?hours=all")
        listing = c.get("/incidents?state=all")
    assert run_page.status_code == 200 and listing.status_code == 200
    # the run's lost line: 0.5 GPU-h, 1.06 USD of its 8.xx USD
    assert "Lost to incidents (2 incidents, overlaps counted once): 0.50 GPU-hours" in run_page.text
    assert "1.06 USD" in run_page.text
    # each incident's own: 0.33 GPU-h / 0.71 USD and 0.25 GPU-h / 0.53 USD; the throttle names its GPUs
    assert "0.33 GPU-h<br>0.71 USD" in listing.text and "0.25 GPU-h<br>0.53 USD" in listing.text
    assert '<a href="/nodes/n1">n1</a> <span class="gpus">GPU 0,1</span>' in listing.text
