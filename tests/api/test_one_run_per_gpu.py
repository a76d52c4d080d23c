"""A GPU belongs to at most one run at any instant (issue 15 item 1): API, CLI, store and races."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.store import runs as store
from tests.api.conftest import Api

T = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def iso(t: datetime) -> str:
    return t.isoformat().replace("+00:00", "Z")


def test_overlapping_allocation_is_409_naming_run_node_and_gpu(api: Api) -> None:
    with api.client("admin") as c:
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "demo-pretrain",
                "start": iso(T),
                "allocations": [{"node": "h100-01", "gpus": [0, 1]}],
            },
        )
        assert r.status_code == 201, r.text
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "nc-7",
                "start": iso(T + timedelta(hours=1)),
                "allocations": [{"node": "h100-01", "gpus": [1, 2]}],
            },
        )
        assert r.status_code == 409, r.text
        detail = r.json()["detail"]
        assert "'demo-pretrain'" in detail and "h100-01:1" in detail and "'nc-7'" in detail, detail
        # nothing of the refused run was written
        assert c.get("/v1/runs/nc-7").status_code == 404
        # other GPUs of the node are free; a run after demo-pretrain ended may take its GPUs
        assert (
            c.post(
                "/v1/runs",
                json={
                    "run_id": "nc-8",
                    "start": iso(T + timedelta(hours=1)),
                    "allocations": [{"node": "h100-01", "gpus": [2]}],
                },
            ).status_code
            == 201
        )
        assert c.patch("/v1/runs/demo-pretrain", json={"end": iso(T + timedelta(hours=2))}).status_code == 200
        r = c.post(
            "/v1/runs",
            json={
                "run_id": "nc-9",
                "start": iso(T + timedelta(hours=2)),
                "allocations": [{"node": "h100-01", "gpus": [0, 1]}],
            },
        )
        assert r.status_code == 201, r.text  # [start, end) windows: touching is not overlapping
        # adding a held GPU by PATCH is refused too
        r = c.patch("/v1/runs/nc-8", json={"allocations": [{"node": "h100-01", "gpus": [0]}]})
        assert (
            r.status_code == 409
            and "'demo-pretrain'" in r.json()["detail"]
            and "h100-01:0" in r.json()["detail"]
        )
        assert c.get("/v1/runs/nc-8").json()["gpu_count"] == 1


def test_moving_an_end_into_another_runs_allocation_is_409(api: Api) -> None:
    with api.client("admin") as c:
        assert (
            c.post(
                "/v1/runs",
                json={
                    "run_id": "a",
                    "start": iso(T),
                    "end": iso(T + timedelta(hours=1)),
                    "allocations": [{"node": "n1", "gpus": [3]}],
                },
            ).status_code
            == 201
        )
        assert (
            c.post(
                "/v1/runs",
                json={
                    "run_id": "b",
                    "start": iso(T + timedelta(hours=2)),
                    "end": iso(T + timedelta(hours=3)),
                    "allocations": [{"node": "n1", "gpus": [3]}],
                },
            ).status_code
            == 201
        )
        assert c.patch("/v1/runs/a", json={"end": iso(T + timedelta(hours=2))}).status_code == 200
        r = c.patch("/v1/runs/a", json={"end": iso(T + timedelta(hours=2, minutes=1))})
        assert r.status_code == 409 and "'b'" in r.json()["detail"] and "n1:3" in r.json()["detail"]
        r = c.patch("/v1/runs/a", json={"end": None})  # reopening: open-ended overlaps b
        assert r.status_code == 409, r.text
        assert c.get("/v1/runs/a").json()["end"].startswith("2026-12-01T12:00:00")


def test_cli_refuses_in_one_line_with_nonzero_exit(db: str) -> None:
    runner = CliRunner()
    ok = runner.invoke(
        app,
        ["run", "create", "--run-id", "demo-pretrain", "--alloc", "h100-01:0", "--start", iso(T), "--db", db],
    )
    assert ok.exit_code == 0, ok.output
    r = runner.invoke(app, ["run", "create", "--run-id", "nc-7", "--alloc", "h100-01:0", "--db", db])
    assert r.exit_code != 0
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and "'demo-pretrain'" in lines[0] and "h100-01:0" in lines[0], r.output
    r = runner.invoke(app, ["run", "create", "--run-id", "ns/job-1", "--db", db])
    assert r.exit_code != 0 and "--run-id" in r.output and "ns/job-1" in r.output, r.output


def test_plain_sql_writers_are_held_to_it_too(conn: psycopg.Connection) -> None:
    conn.execute("INSERT INTO runs (run_id, start) VALUES (%s, %s), (%s, %s)", ("x", T, "y", T))
    conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES ('x', 'n1', 0)")
    with pytest.raises(psycopg.errors.ExclusionViolation, match="run 'x'"):
        conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES ('y', 'n1', 0)")
    conn.execute("INSERT INTO run_allocations (run_id, node, gpu) VALUES ('y', 'n1', 1)")
    with pytest.raises(psycopg.errors.ExclusionViolation):
        conn.execute("UPDATE run_allocations SET gpu = 0 WHERE run_id = 'y'")


def _register(db: str, name: str, k: int, barrier: threading.Barrier, results: list[str]) -> None:
    with psycopg.connect(db, autocommit=True) as c:
        barrier.wait()
        try:
            store.create_run(
                c,
                {
                    "run_id": f"{name}-{k}",
                    "start": T + timedelta(days=k),
                    "end": T + timedelta(days=k, hours=1),
                    "allocations": [{"node": "race", "gpus": [0]}],
                },
            )
            results.append("ok")
        except store.Conflict as e:
            assert "race:0" in str(e)
            results.append("conflict")


def test_concurrent_registrations_of_one_gpu_admit_exactly_one(db: str) -> None:
    """Two writers racing for one GPU: the database admits exactly one, every round."""
    rounds = 20
    for k in range(rounds):
        results: list[str] = []
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=_register, args=(db, n, k, barrier, results)) for n in ("p", "q")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == ["conflict", "ok"], (k, results)
    with psycopg.connect(db) as c:
        row = c.execute("SELECT count(*) FROM run_allocations WHERE node = 'race'").fetchone()
        assert row is not None and row[0] == rounds
