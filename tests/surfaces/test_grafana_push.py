"""``gpufleet dashboards push`` against a recording fake of Grafana's HTTP API on loopback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from gpufleet.dashboards.loader import load_all
from gpufleet.dashboards.model import DS_TYPE
from gpufleet.dashboards.provision import DataSource, ProvisionError, connect, push
from tests.surfaces.fake_grafana import FakeGrafana

TOKEN = "glsa_test_0123456789"
DB_PASSWORD = "s3cret-db-pw"


def test_first_push_creates_then_second_overwrites() -> None:
    ds = DataSource.from_url(f"postgresql://grafana_ro:{DB_PASSWORD}@db.internal:5433/gpufleet")
    boards = load_all()
    with FakeGrafana(TOKEN) as g:
        first = push(connect(g.url, TOKEN), ds, boards.values())
        assert (first.datasource, first.folder) == ("created", "created")
        assert sorted(first.dashboards) == sorted(boards)
        calls = [(r.method, r.path) for r in g.requests]
        assert calls[:4] == [
            ("GET", "/api/datasources/uid/gpufleet-pg"),
            ("POST", "/api/datasources"),
            ("GET", "/api/folders/gpufleet"),
            ("POST", "/api/folders"),
        ]
        assert calls[4:] == [("POST", "/api/dashboards/db")] * len(boards)
        assert {r.authorization for r in g.requests} == {f"Bearer {TOKEN}"}

        created = g.requests[1].body
        assert created["type"] == DS_TYPE and created["uid"] == "gpufleet-pg" and created["access"] == "proxy"
        assert created["url"] == "db.internal:5433" and created["user"] == "grafana_ro"
        assert created["jsonData"]["database"] == "gpufleet" and created["jsonData"]["sslmode"] == "require"
        assert created["secureJsonData"] == {"password": DB_PASSWORD}
        assert DB_PASSWORD not in str(created["jsonData"])

        for r in g.requests[4:]:
            assert r.body["overwrite"] is True and r.body["folderUid"] == "gpufleet"
            d = r.body["dashboard"]
            assert d["id"] is None and d["uid"] in boards
            ds_var = next(v for v in d["templating"]["list"] if v["name"] == "datasource")
            assert ds_var["current"]["value"] == "gpufleet-pg"
            assert d["panels"] == boards[d["uid"]]["panels"]

        g.requests.clear()
        second = push(connect(g.url, TOKEN), ds, boards.values())
        assert (second.datasource, second.folder) == ("updated", "exists")
        assert [(r.method, r.path) for r in g.requests][:3] == [
            ("GET", "/api/datasources/uid/gpufleet-pg"),
            ("PUT", "/api/datasources/uid/gpufleet-pg"),
            ("GET", "/api/folders/gpufleet"),
        ]
        assert {v["version"] for v in g.dashboards.values()} == {2}
        assert len(g.datasources) == 1


def test_wrong_token_is_reported_without_echoing_it() -> None:
    ds = DataSource.from_url("postgresql://ro@db/gpufleet")
    with FakeGrafana(TOKEN) as g, pytest.raises(ProvisionError) as e:
        push(connect(g.url, "glsa_wrong_token"), ds, load_all().values())
    assert "HTTP 401" in str(e.value) and "glsa_wrong_token" not in str(e.value)


def test_unreachable_grafana_and_bad_urls() -> None:
    ds = DataSource.from_url("postgresql://ro@db/gpufleet")
    with FakeGrafana(TOKEN) as g:
        url = g.url
    with pytest.raises(ProvisionError, match=r"cannot reach Grafana|no HTTP answer"):
        push(connect(url, TOKEN, timeout_s=2), ds, [])
    with pytest.raises(ProvisionError, match="not in the Grafana URL"):
        connect("http://admin:admin@127.0.0.1:3000", TOKEN)
    with pytest.raises(ProvisionError, match="needs a user"):
        DataSource.from_url("postgresql://db:5432/gpufleet")


def test_cli_push_reads_the_password_file(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text(DB_PASSWORD + "\n")
    with FakeGrafana(TOKEN) as g:
        out = CliRunner().invoke(
            app,
            [
                "dashboards",
                "push",
                "--grafana-url",
                g.url,
                "--datasource-url",
                "postgresql://ro@pg:5432/gpufleet",
                "--datasource-password-file",
                str(pw),
                "--sslmode",
                "disable",
                "--folder",
                "ops",
            ],
            env={"GRAFANA_TOKEN": TOKEN},
        )
        assert out.exit_code == 0, out.output
        assert "data source gpufleet-pg created" in out.output and TOKEN not in out.output
        assert DB_PASSWORD not in out.output
        assert g.datasources["gpufleet-pg"]["secureJsonData"] == {"password": DB_PASSWORD}
        assert g.datasources["gpufleet-pg"]["jsonData"]["sslmode"] == "disable"
        assert set(g.folders) == {"ops"} and len(g.dashboards) == len(load_all())

        bad = CliRunner().invoke(
            app,
            [
                "dashboards",
                "push",
                "--grafana-url",
                g.url,
                "--token",
                "nope",
                "--datasource-url",
                "postgresql://ro@pg/gpufleet",
            ],
        )
        assert bad.exit_code == 2 and "HTTP 401" in bad.output
