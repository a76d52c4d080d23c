"""The node-and-GPU board: its figures are the node's samples, for any node, with no run picked."""

from __future__ import annotations

from typing import Any

import psycopg

from gpufleet.dashboards.dryrun import QueryResult, run_dashboard
from gpufleet.dashboards.loader import load_all
from gpufleet.dashboards.macros import TimeRange
from gpufleet.xid import XIDS
from tests.surfaces.fleetdb import FilledFleet


def results(fleet: FilledFleet, node: str, gpu: list[str] | None = None) -> dict[str, QueryResult]:
    picks: dict[str, Any] = {"node": node}
    if gpu is not None:
        picks["gpu"] = gpu
    with psycopg.connect(fleet.url, autocommit=True) as conn:
        out = run_dashboard(conn, load_all()["gpufleet-node"], TimeRange(fleet.start, fleet.end), picks)
    return {r.title: r for r in out if r.title}


def rows(r: QueryResult) -> list[dict[str, Any]]:
    return [dict(zip(r.names(), row, strict=True)) for row in r.rows]


def test_every_node_of_the_fleet_is_offered_and_its_gpus_shown(fleet: FilledFleet) -> None:
    for node in fleet.nodes[:3]:
        got = results(fleet, node)
        with psycopg.connect(fleet.url) as conn:
            gpus = [
                r[0]
                for r in conn.execute(
                    "SELECT DISTINCT gpu FROM gpu_samples WHERE node = %s AND mig_instance IS NULL AND time >= %s "
                    "AND time <= %s ORDER BY 1",
                    (node, fleet.start, fleet.end),
                ).fetchall()
            ]
            xids = dict(
                conn.execute(
                    "SELECT gpu, count(*) FILTER (WHERE xid > 0) FROM gpu_samples WHERE node = %s AND mig_instance IS NULL "
                    "AND time >= %s AND time <= %s GROUP BY gpu",
                    (node, fleet.start, fleet.end),
                ).fetchall()
            )
        assert [r["GPU"] for r in rows(got["XIDs"])] == gpus
        assert {r["GPU"]: r["XIDs"] for r in rows(got["XIDs"])} == xids
        assert [r["GPU"] for r in rows(got["Health"])] == gpus
        now = rows(got["Now"])[0]
        assert now["GPUs reporting"] == len(gpus)
        # Long format, one series per GPU of the node.
        assert {m for _, m, _ in got["GPU utilisation"].rows} == {f"{node}/{g}" for g in gpus}
        throttled = rows(got["Clocks-event reasons"])
        assert throttled and all(0 <= v <= len(gpus) for r in throttled for k, v in r.items() if k != "time")


def test_picking_gpus_narrows_every_panel(fleet: FilledFleet) -> None:
    got = results(fleet, fleet.nodes[0], ["1"])
    assert [r["GPU"] for r in rows(got["XIDs"])] == [1]
    assert {m for _, m, _ in got["Power"].rows} == {f"{fleet.nodes[0]}/1"}
    assert rows(got["Now"])[0]["GPUs reporting"] == 1


def test_the_xid_names_are_gpufleets_own() -> None:
    sql = next(
        t["rawSql"]
        for p in load_all()["gpufleet-node"]["panels"]
        if p.get("title") == "XIDs"
        for t in p["targets"]
    )
    for x in XIDS.values():
        assert f"({x.code}, '{x.name.replace(chr(39), chr(39) * 2)}')" in sql
