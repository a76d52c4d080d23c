"""The ledger's SQL twin (gpufleet.db.ledger_sql, for the Grafana board) against the API's ledger:
the same pieces on random incidents, the same figures on the worked fleet."""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import psycopg
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpufleet.accounting import run_accounting
from gpufleet.accounting.incidents import claim
from gpufleet.accounting.ledger import FIELDS, explain
from gpufleet.store.run_model import load_runs
from gpufleet.waste import STATES, state_of
from tests.accounting.builders import at
from tests.accounting.test_incident_cost import fleet, incident
from tests.accounting.test_ledger import every_kind


def sql_ledger(
    conn: psycopg.Connection,
    since: Any,
    until: Any,
    now: Any,
    runs: list[str] | None = None,
    source: str = "raw",
) -> dict[str, dict[str, dict[str, Decimal | None]]]:
    out: dict[str, dict[str, dict[str, Decimal | None]]] = {}
    for row in conn.execute(
        "SELECT run_id, state, gpu_hours, gpu_kwh, facility_kwh, co2e_kg, total_cost "
        "FROM gpufleet_ledger(%s, %s, %s, %s, 60, %s)",
        (since, until, now, runs, source),
    ):
        out.setdefault(row[0], {})[row[1]] = dict(zip(FIELDS, row[2:], strict=True))
    return out


def test_the_board_ledger_is_the_apis(conn: psycopg.Connection) -> None:
    every_kind(conn)
    for since, until in ((None, None), (at(2500), at(3300)), (at(-100), at(1000))):
        body = run_accounting(conn, "r", now=at(10_000), source="raw", since=since, until=until)
        got = sql_ledger(conn, since, until, at(10_000))["r"]
        assert list(got) == list(STATES)
        for s in STATES:
            for f in FIELDS:
                want = body["ledger"][s][f]
                have = got[s][f]
                assert (have is None) == (want is None), (s, f)
                if want is not None:
                    assert Decimal(repr(want)) == have, (since, s, f, want, have)


KINDS = (
    "idle_allocation",
    "hung_collective",
    "checkpoint_stall",
    "starvation",
    "straggler",
    "throttling",
    "pcie_degraded",
)
EVIDENCE = st.fixed_dictionaries(
    {},
    optional={
        "gpu_time_lost_share": st.sampled_from([0.0, 0.3, 1.5, -0.2, "x", None]),
        "run_time_lost_share": st.sampled_from([0.25, 0.6]),
        "duty_cycle": st.sampled_from([0.75, 2.0]),
        "throttled_share": st.sampled_from([1.0, 0.5, True]),
        "clock_ratio": st.sampled_from([0.25, 0.7, None]),
        "activity": st.sampled_from([0.6, 0.0]),
        "peer_activity": st.sampled_from([0.8, 0.0]),
        "gpus": st.lists(
            st.fixed_dictionaries(
                {"node": st.just("n1"), "gpu": st.sampled_from([0, 1, 3, 5, 2.0])},
                optional={"throttled_share": st.sampled_from([0.9, None]), "clock_ratio": st.just(0.5)},
            ),
            max_size=3,
        ),
    },
)
INCIDENT = st.tuples(
    st.sampled_from(KINDS),
    st.integers(-300, 3500),
    st.one_of(st.none(), st.integers(10, 2000)),
    EVIDENCE,
    st.sampled_from([None, 0, 2]),
    st.booleans(),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(INCIDENT, max_size=7), st.sampled_from([(None, None), (900, 2700)]))
# a GPU listed twice, once with its own throttled share: claimed once, at the larger share
@example(
    [
        (
            "throttling",
            0,
            1000,
            {
                "throttled_share": 0.5,
                "clock_ratio": 0.7,
                "gpus": [
                    {"node": "n1", "gpu": 0, "throttled_share": 0.9, "clock_ratio": 0.5},
                    {"node": "n1", "gpu": 0},
                ],
            },
            None,
            True,
        )
    ],
    (None, None),
)
def test_the_same_pieces_on_random_incidents(conn: psycopg.Connection, incs: list[Any], period: Any) -> None:
    conn.execute("DELETE FROM incidents")
    if not conn.execute("SELECT 1 FROM runs WHERE run_id = 'r'").fetchone():
        fleet(conn)
    for k, (kind, start, dur, ev, gpu, on_node) in enumerate(incs):
        incident(
            conn,
            kind,
            start,
            None if dur is None else start + dur,
            ev,
            gpu=gpu,
            node_name="n1" if gpu is not None or on_node else None,
            scope=str(k),
        )
    now = at(3000)
    since, until = (None, None) if period[0] is None else (at(period[0]), at(period[1]))
    (run,) = load_runs(conn, ["r"])
    lo, hi = run.window(now, since, until)
    rows = conn.execute(
        'SELECT id, kind, run_id, node, gpu, start, "end", evidence FROM incidents'
    ).fetchall()
    claims = []
    for r in rows:
        inc = dict(zip(("id", "kind", "run_id", "node", "gpu", "start", "end", "evidence"), r, strict=True))
        s = state_of(inc["kind"])
        if s is not None:
            claims += [(s, p) for p in claim(inc, run, now, lo, hi)[0]]
    python = sorted((s, p.node, p.gpu, p.lo, p.hi, round(p.weight, 12)) for s, p in explain(claims))
    sql = sorted(
        (s, n, g, a, b, round(w, 12))
        for _, s, n, g, a, b, w in conn.execute(
            "SELECT * FROM gpufleet_ledger_pieces(%s, %s, %s, NULL)", (since, until, now)
        ).fetchall()
    )
    assert sql == python, json.dumps([incs], default=str)
