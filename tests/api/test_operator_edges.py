"""Operators' rough edges (issue 15 item 10): a database without the schema says the one command to run,
/docs works offline, incidents by id and state=all, the CLI finds a running demo's database."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.cli import app
from gpufleet.collector.service import check_schema
from gpufleet.config import Settings
from gpufleet.db.scratch import scratch_database
from gpufleet.demofile import DEMO_URL_FILE
from gpufleet.serverthread import serve
from tests.api.conftest import Api


def test_a_database_without_the_schema_says_to_upgrade(
    pg_server: str, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with scratch_database(pg_server, "gpufleet_noschema") as url:
        r = CliRunner().invoke(app, ["site", "show", "lab", "--db", url])
        assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
        assert "has no gpufleet schema" in r.output and "gpufleet db upgrade" in r.output
        with caplog.at_level(logging.ERROR, logger="gpufleet.collector"):
            assert check_schema(url) is not None
        assert [rec.getMessage() for rec in caplog.records if "gpufleet db upgrade" in rec.getMessage()]
        with serve(create_app(url, settings)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
            ready = c.get("/readyz")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert "gpufleet db upgrade" in ready.json()["schema"]
            r2 = c.get("/v1/runs", headers={"Authorization": "Bearer gpf_x"})
            assert r2.status_code == 503 and "gpufleet db upgrade" in r2.json()["detail"], r2.text
        with psycopg.connect(url, autocommit=True) as conn:  # an older schema is named too
            conn.execute("CREATE TABLE alembic_version (version_num text)")
            conn.execute("INSERT INTO alembic_version VALUES ('0003')")
        r = CliRunner().invoke(app, ["report", "--from", "2026-12-01", "--to", "2026-12-02", "--db", url])
        assert r.exit_code == 2 and "schema 0003" in r.output and "gpufleet db upgrade" in r.output


def test_docs_work_offline(api: Api) -> None:
    with httpx.Client(base_url=api.url, timeout=30) as c:
        page = c.get("/docs")
        assert page.status_code == 200
        refs = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text) + re.findall(
            r"""url: ?['"]([^'"]+)['"]""", page.text
        )
        assert refs and all(u.startswith("/") for u in refs), refs  # nothing from another host
        assert "cdn" not in page.text.lower()
        for u in refs:
            r = c.get(u)
            assert r.status_code == 200 and len(r.content) > 100, u
        js = c.get("/docs/assets/swagger-ui-bundle.js")
        assert js.headers["content-type"].startswith("text/javascript") and b"SwaggerUIBundle" in js.content
        assert c.get("/docs/assets/../../etc/passwd").status_code == 404


def test_incident_by_id_and_state_all(api: Api) -> None:
    with psycopg.connect(api.db, autocommit=True) as conn:
        conn.execute("INSERT INTO runs (run_id, start) VALUES ('r', now())")
        ids = [
            conn.execute(
                'INSERT INTO incidents (kind, scope_key, run_id, state, start, last_seen, "end") VALUES '
                "(%s, %s, 'r', %s, now(), now(), %s) RETURNING id",
                (k, k, s, None if s == "open" else "2026-12-03T00:00:00Z"),
            ).fetchone()[0]  # type: ignore[index]
            for k, s in (("starvation", "open"), ("throttling", "resolved"))
        ]
    with api.client("sre") as c:
        r = c.get(f"/v1/incidents/{ids[0]}")
        assert r.status_code == 200 and r.json()["kind"] == "starvation" and r.json()["id"] == ids[0]
        assert c.get("/v1/incidents/999999").status_code == 404
        assert {i["id"] for i in c.get("/v1/incidents", params={"state": "all"}).json()} == set(ids)
        assert [i["id"] for i in c.get("/v1/incidents", params={"state": "resolved"}).json()] == [ids[1]]
        assert len(c.get("/v1/runs/r/incidents", params={"state": "all"}).json()) == 2
        assert c.get("/v1/incidents", params={"state": "closed"}).status_code == 422
    with api.client("finance") as c:
        assert c.get(f"/v1/incidents/{ids[0]}").status_code == 403


def test_the_cli_finds_a_running_demos_database(db: str, tmp_path: Path) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        create_token(conn, "x", "sre")
    (tmp_path / DEMO_URL_FILE).write_text(f"{db}\n{os.getpid()}\n")
    env = {"GPUFLEET_DATA_DIR": str(tmp_path), "GPUFLEET_DATABASE_URL": None}
    r = CliRunner().invoke(app, ["site", "set", "from-demo", "--pue", "1.2"], env=env)
    assert r.exit_code == 0, r.output
    assert "using the running demo's database" in r.stderr
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM sites WHERE site = 'from-demo'").fetchone() == (1,)
    (tmp_path / DEMO_URL_FILE).write_text(f"{db}\n999999999\n")  # a demo that is gone is not used
    from gpufleet.config import load_settings
    from gpufleet.demofile import demo_database

    assert demo_database(load_settings(data_dir=tmp_path)) is None
