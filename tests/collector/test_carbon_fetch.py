"""Carbon intensity from Electricity Maps and WattTime into the step series (issue 15 item 3 / 9).

The services are played by a loopback HTTP server answering with responses written from their
documented shapes (tests/fixtures/carbon/README.md): nothing outside is reachable here.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from gpufleet.carbon import CarbonFetchError, fetch_into, make_provider
from gpufleet.carbon.schedule import fetch_round
from gpufleet.cli import app
from gpufleet.config import CarbonSource
from gpufleet.serverthread import serve

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "carbon"
EM_TOKEN = "em-secret-token"
WT_USER, WT_PASSWORD = "fleet-ops", "pa:ss word"


def _load(name: str) -> object:
    return json.loads((FIXTURES / name).read_text())


@dataclass
class Service:
    url: str
    calls: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def _fake() -> tuple[FastAPI, list[tuple[str, dict[str, str]]]]:
    calls: list[tuple[str, dict[str, str]]] = []
    fake = FastAPI()

    @fake.get("/v3/carbon-intensity/past-range")
    def past_range(request: Request) -> JSONResponse:
        calls.append(("em", dict(request.query_params)))
        if request.headers.get("auth-token") != EM_TOKEN:
            return JSONResponse({"message": "bad token"}, status_code=401)
        return JSONResponse(_load("electricitymaps_past_range.json"))

    @fake.get("/login")
    def login(request: Request) -> JSONResponse:
        calls.append(("login", {}))
        want = "Basic " + base64.b64encode(f"{WT_USER}:{WT_PASSWORD}".encode()).decode()
        if request.headers.get("authorization") != want:
            return JSONResponse({"error": "invalid credentials"}, status_code=403)
        return JSONResponse(_load("watttime_login.json"))

    @fake.get("/v3/historical")
    def historical(request: Request) -> JSONResponse:
        calls.append(("wt", dict(request.query_params)))
        if request.headers.get("authorization") != "Bearer wt-bearer-token-0123456789":
            return JSONResponse({"error": "no token"}, status_code=401)
        if request.query_params.get("signal_type") != "co2_moer":
            return JSONResponse({"error": "signal_type"}, status_code=400)
        return JSONResponse(_load("watttime_historical.json"))

    return fake, calls


@pytest.fixture
def service() -> Iterator[Service]:
    fake, calls = _fake()
    with serve(fake) as srv:
        yield Service(srv.url, calls)


def _secret(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text + "\n")
    return p


DAY = (datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC))


def test_electricity_maps_points_land_in_the_series(
    service: Service, conn: psycopg.Connection, tmp_path: Path
) -> None:
    p = make_provider("electricitymaps", _secret(tmp_path, "em", EM_TOKEN), service.url)
    assert fetch_into(conn, p, "DE", "DE", *DAY) == 3  # the entry without an intensity is skipped
    rows = conn.execute(
        "SELECT time, g_co2e_per_kwh FROM carbon_intensity WHERE region = 'DE' ORDER BY 1"
    ).fetchall()
    assert [(t.hour, g) for t, g in rows] == [(0, 402.0), (1, 385.0), (3, 371.0)]
    assert service.calls[0] == (
        "em",
        {"zone": "DE", "start": "2026-12-01T00:00:00Z", "end": "2026-12-02T00:00:00Z"},
    )
    # a long range is asked for in parts; a refused token is one clear error, nothing stored
    fetch_into(conn, p, "DE", "DE", DAY[0], datetime(2026, 12, 25, tzinfo=UTC))
    assert len([c for c in service.calls if c[0] == "em"]) == 1 + 3
    bad = make_provider("electricitymaps", _secret(tmp_path, "bad", "nope"), service.url)
    with pytest.raises(CarbonFetchError, match=r"Electricity Maps: 401.*refused"):
        fetch_into(conn, bad, "DE", "DE2", *DAY)
    assert conn.execute("SELECT count(*) FROM carbon_intensity WHERE region = 'DE2'").fetchone() == (0,)


def test_watttime_logs_in_and_converts_lbs_per_mwh(
    service: Service, conn: psycopg.Connection, tmp_path: Path
) -> None:
    p = make_provider("watttime", _secret(tmp_path, "wt", f"{WT_USER}:{WT_PASSWORD}"), service.url)
    assert fetch_into(conn, p, "CAISO_NORTH", "US-CAL", *DAY) == 3
    rows = conn.execute(
        "SELECT g_co2e_per_kwh FROM carbon_intensity WHERE region = 'US-CAL' ORDER BY time"
    ).fetchall()
    assert [round(g, 4) for (g,) in rows] == [round(v * 0.45359237, 4) for v in (882.0, 900.0, 861.5)]
    kinds = [c[0] for c in service.calls]
    assert kinds == ["login", "wt"] and service.calls[1][1]["signal_type"] == "co2_moer"
    wrong = make_provider("watttime", _secret(tmp_path, "wt2", f"{WT_USER}:wrong"), service.url)
    with pytest.raises(CarbonFetchError, match="WattTime: 403"):
        fetch_into(conn, wrong, "CAISO_NORTH", "US-CAL", *DAY)
    with pytest.raises(CarbonFetchError, match="username:password"):
        make_provider("watttime", _secret(tmp_path, "wt3", "no-colon"), service.url)
    with pytest.raises(CarbonFetchError, match=r"file .*missing"):
        make_provider("electricitymaps", tmp_path / "missing", service.url)


def test_cli_carbon_fetch_and_the_collectors_schedule(service: Service, db: str, tmp_path: Path) -> None:
    token = _secret(tmp_path, "em", EM_TOKEN)
    r = CliRunner().invoke(
        app,
        [
            "carbon",
            "fetch",
            "DE",
            "--provider",
            "electricitymaps",
            "--token-file",
            str(token),
            "--from",
            "2026-12-01",
            "--to",
            "2026-12-02",
            "--base-url",
            service.url,
            "--db",
            db,
        ],
    )
    assert r.exit_code == 0 and "stored 3 points for DE from electricitymaps" in r.output, r.output
    r = CliRunner().invoke(
        app,
        [
            "carbon",
            "fetch",
            "DE",
            "--provider",
            "electricitymaps",
            "--token-file",
            str(tmp_path / "none"),
            "--base-url",
            service.url,
            "--db",
            db,
        ],
    )
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "token file" in r.output, r.output
    sources = [
        CarbonSource(
            region="FR", provider="electricitymaps", zone="DE", token_file=token, base_url=service.url
        ),
        CarbonSource(
            region="US-CAL",
            provider="watttime",
            zone="CAISO_NORTH",
            token_file=_secret(tmp_path, "wt", "x:y"),
            base_url=service.url,
        ),
    ]
    done = fetch_round(db, sources, now=datetime(2026, 12, 2, tzinfo=UTC))
    assert done["FR"] == 3 and "403" in str(done["US-CAL"])  # one failing source does not stop the other
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM carbon_intensity WHERE region = 'FR'").fetchone() == (3,)
