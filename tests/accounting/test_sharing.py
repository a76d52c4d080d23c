"""Declared sharing: time-slicing, MPS shares and MIG instances split a GPU, nothing is counted twice (issue 15 item 1)."""

from __future__ import annotations

import psycopg
import pytest

from gpufleet.accounting import fleet_accounting, run_accounting
from gpufleet.store import runs as store
from tests.accounting.builders import (
    KWH,
    T0,
    approx,
    at,
    constant_power,
    gpu_samples,
    host_samples,
    node,
    site,
)
from tests.api.conftest import Api


def _run(
    conn: psycopg.Connection, run_id: str, start: float, end: float | None, gpus: list[int], **sharing: object
) -> dict:
    return store.create_run(
        conn,
        {
            "run_id": run_id,
            "site": "s",
            "start": at(start),
            "end": None if end is None else at(end),
            "allocations": [{"node": "n1", "gpus": gpus, **sharing}],
        },
    )[0]


def _fill(conn: psycopg.Connection) -> None:
    site(conn, "s", pue=1.5, price=0.2, gpu_hour=4.0, currency="EUR", carbon=200.0)
    node(conn, "n1", 8, "s")
    gpu_samples(conn, constant_power("n1", range(8), 700.0, 0, 3600, step_s=10.0, counter=True))
    host_samples(conn, [(float(t), "n1", 1600.0) for t in range(0, 3601, 10)])


def test_time_slices_split_energy_hours_and_money(conn: psycopg.Connection) -> None:
    _fill(conn)
    _run(conn, "a", 0, 3600, [0], sharing="time_slice", share=0.5)
    _run(conn, "b", 0, 3600, [0], sharing="time_slice", share=0.5)
    for rid in ("a", "b"):
        a = run_accounting(conn, rid, now=at(7200), source="raw")
        assert a["gpu_count"] == 1 and a["gpu_equivalents"] == 0.5 and approx(a["gpu_hours"], 0.5)
        assert approx(a["gpu_kwh"], 0.5 * 700 * 3600 / KWH)  # half the board
        assert approx(a["host_kwh"], 0.5 / 8 * 1600 * 3600 / KWH)  # half a GPU's share of the host
        assert a["compute_cost"] == 2.0 and a["coverage"] == 1.0
        assert a["gpu_models"] == [{"model": None, "gpus": 1, "sharing": "time_slice", "shares": 0.5}]
    f = fleet_accounting(conn, T0, at(3600), now=at(7200), source="raw", group_by="run")
    assert approx(f["runs"]["gpu_hours"], 1.0) and approx(f["unallocated"]["gpu_hours"], 7.0)
    assert approx(f["runs"]["gpu_kwh"] + f["unallocated"]["gpu_kwh"], f["total"]["gpu_kwh"])
    assert approx(f["total"]["gpu_kwh"], 8 * 700 * 3600 / KWH)


def test_mig_instances_count_by_their_compute_slices(conn: psycopg.Connection) -> None:
    _fill(conn)
    _run(conn, "small", 0, 3600, [3], sharing="mig", mig_profile="3g.40gb", mig_instance=1)
    _run(conn, "big", 0, 3600, [3], sharing="mig", mig_profile="4g.40gb", mig_instance=2)
    small = run_accounting(conn, "small", now=at(7200), source="raw")
    big = run_accounting(conn, "big", now=at(7200), source="raw")
    assert approx(small["gpu_hours"], 3 / 7) and approx(big["gpu_hours"], 4 / 7)
    assert approx(small["gpu_kwh"] + big["gpu_kwh"], 700 * 3600 / KWH)
    assert approx(small["gpu_kwh"] / big["gpu_kwh"], 3 / 4)
    # the GPU is whole: a third instance does not fit, and the same instance cannot be held twice
    with pytest.raises(store.Conflict, match="beyond the whole GPU"):
        _run(conn, "extra", 1800, 3600, [3], sharing="mig", mig_profile="1g.10gb", mig_instance=3)
    with pytest.raises(store.Conflict, match="MIG instance 1 of GPU n1:3 is held by run 'small'"):
        _run(conn, "again", 3600 - 60, 3700, [3], sharing="mig", mig_profile="3g.40gb", mig_instance=1)


def test_sharing_is_refused_where_it_would_count_twice(conn: psycopg.Connection) -> None:
    _fill(conn)
    _run(conn, "whole", 0, 1800, [0])
    with pytest.raises(store.Conflict, match=r"GPU n1:0 is held by run 'whole'"):
        _run(conn, "slice", 600, 1200, [0], sharing="time_slice", share=0.5)
    _run(conn, "slice-a", 0, 3600, [1], sharing="time_slice", share=0.75)
    with pytest.raises(store.Conflict, match="beyond the whole GPU"):
        _run(conn, "slice-b", 1800, 3600, [1], sharing="mps", share=0.5)
    with pytest.raises(store.Conflict, match="do not mix"):
        _run(conn, "mig", 0, 600, [1], sharing="mig", mig_profile="1g.10gb", mig_instance=0)
    with pytest.raises(store.Conflict, match="'slice-a'"):
        _run(conn, "exclusive", 100, 200, [1])
    # a share that fits is accepted, and the shares held at once never pass the whole GPU
    _run(conn, "slice-c", 1800, 3600, [1], sharing="mps", share=0.25)
    with pytest.raises(store.Invalid, match="share"):
        _run(conn, "bad", 0, 10, [2], sharing="time_slice")
    with pytest.raises(store.Invalid, match="no GPUs"):
        _run(conn, "none", 0, 10, [])


def test_api_takes_sharing_and_refuses_over_sharing_with_409(api: Api) -> None:
    base = {"start": "2026-12-01T10:00:00Z", "end": "2026-12-01T11:00:00Z"}
    with api.client("admin") as c:
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "t1",
                **base,
                "allocations": [{"node": "n9", "gpus": [0], "sharing": "time_slice", "share": 0.6}],
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["allocations"] == [
            {
                "node": "n9",
                "gpus": [0],
                "sharing": "time_slice",
                "share": 0.6,
                "mig_profile": None,
                "mig_instance": None,
            }
        ]
        assert r.json()["gpu_equivalents"] == 0.6
        assert "never reported" in r.json()["warnings"][0] and "'n9'" in r.json()["warnings"][0]
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "t2",
                **base,
                "allocations": [{"node": "n9", "gpus": [0], "sharing": "time_slice", "share": 0.6}],
            },
        )
        assert r.status_code == 409 and "'t1'" in r.json()["detail"] and "n9:0" in r.json()["detail"], r.text
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "t3",
                **base,
                "allocations": [{"node": "n9", "gpus": [1], "sharing": "time_slice"}],
            },
        )
        assert r.status_code == 422 and "share" in r.text
        r = c.post("/v1/runs", json={"run_id": "t4", **base, "allocations": [{"node": "n9", "gpus": []}]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "gpus"
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "t5",
                **base,
                "allocations": [
                    {"node": "n9", "gpus": [2], "sharing": "mig", "mig_profile": "9g.1gb", "mig_instance": 0}
                ],
            },
        )
        assert r.status_code == 422 and "mig_profile" in r.text
        assert c.get("/v1/runs/t2").status_code == 404
