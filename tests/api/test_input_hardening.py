"""Bad input to the API and its web view answers 4xx, never 5xx, and nothing non-finite is stored
(issue 11, seen 10 and 11): ``?hours=nan``, a NUL in a run id, too many form fields, ``Infinity``
in a site's price or in progress, a token for a node name no agent can send."""

from __future__ import annotations

import httpx
import psycopg
import pytest
from typer.testing import CliRunner

from gpufleet.cli import app
from tests.api.conftest import Api


def _cookie_client(api: Api, who: str = "sre") -> httpx.Client:
    c = api.client("none")
    c.cookies.set("gpufleet_token", api.tokens[who])
    return c


@pytest.fixture
def run_id(api: Api) -> str:
    with api.client("admin") as c:
        r = c.post("/v1/runs", json={"run_id": "web-run", "allocations": [{"node": "n1", "gpus": [0]}]})
        assert r.status_code == 201, r.text
    return "web-run"


@pytest.mark.parametrize("hours", ["nan", "NaN", "-nan", "inf", "-inf", "1e400", "0", "-5", "abc", ""])
def test_run_page_hours_never_500(api: Api, run_id: str, hours: str) -> None:
    with _cookie_client(api) as c:
        r = c.get(f"/runs/{run_id}", params={"hours": hours})
    assert r.status_code < 500, r.text[:300]
    assert r.status_code in (200, 400)


def test_run_page_hours_nan_is_400_naming_the_parameter(api: Api, run_id: str) -> None:
    with _cookie_client(api) as c:
        r = c.get(f"/runs/{run_id}?hours=nan")
    assert r.status_code == 400
    assert "hours" in r.text


@pytest.mark.parametrize(
    "path,status",
    [
        ("/runs/x%00y", 400),
        ("/runs/%00", 400),
        ("/runs/" + "a" * 300, 404),
        ("/runs/x%0Ay", 404),
        ("/runs/web-run%0A", 404),
    ],
)
def test_run_page_with_an_impossible_run_id_is_4xx(api: Api, run_id: str, path: str, status: int) -> None:
    with _cookie_client(api) as c:
        r = c.get(path)
    assert r.status_code == status, r.text[:300]


@pytest.mark.parametrize("path", ["/v1/runs/x%00y", "/v1/runs/x%00y/accounting", "/v1/runs/x%00y/incidents"])
def test_api_run_routes_with_a_nul_are_4xx(api: Api, path: str) -> None:
    with api.client("admin") as c:
        r = c.get(path)
    assert 400 <= r.status_code < 500, r.text[:300]


@pytest.mark.parametrize("fields", [11, 50, 1000])
def test_login_with_too_many_form_fields_is_4xx(api: Api, fields: int) -> None:
    body = "&".join(f"f{i}=x" for i in range(fields))
    with api.client("none") as c:
        r = c.post(
            "/login", content=body[:4000], headers={"Content-Type": "application/x-www-form-urlencoded"}
        )
    assert r.status_code in (400, 413), r.text[:300]


def test_login_with_a_long_field_is_4xx(api: Api) -> None:
    with api.client("none") as c:
        r = c.post(
            "/login",
            content="token=" + "a" * 3000,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert r.status_code in (400, 401, 413)


def test_login_with_undecodable_bytes_is_4xx(api: Api) -> None:
    with api.client("none") as c:
        r = c.post(
            "/login",
            content=b"token=\xff\xfe&next=%ff",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    assert 400 <= r.status_code < 500


def test_login_still_works(api: Api) -> None:
    with api.client("none") as c:
        r = c.post("/login", data={"token": api.tokens["sre"], "next": "/runs"})
    assert r.status_code == 303 and r.headers["location"] == "/runs"


# ------------------------------------------------------------------ non-finite numbers


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e999"])
@pytest.mark.parametrize("field", ["price_per_kwh", "gpu_hour_price", "pue", "carbon_g_per_kwh"])
def test_site_put_and_patch_refuse_non_finite(api: Api, field: str, value: str) -> None:
    with api.client("admin") as c:
        for method in ("PUT", "PATCH"):
            r = c.request(
                method,
                "/v1/sites/eu9",
                content=f'{{"{field}": {value}}}',
                headers={"Content-Type": "application/json"},
            )
            if method == "PATCH" and r.status_code == 404:
                continue
            assert r.status_code == 422, (method, r.text)
            assert r.json()["detail"][0]["loc"][-1] == field
        c.put("/v1/sites/eu9", json={})
        r = c.patch(
            "/v1/sites/eu9", content=f'{{"{field}": {value}}}', headers={"Content-Type": "application/json"}
        )
        assert r.status_code == 422, r.text
    with psycopg.connect(api.db) as conn:  # the site's dated settings: only the defaults PUT {} wrote
        rows = conn.execute(
            "SELECT setting, num FROM site_settings WHERE site = 'eu9' AND setting <> 'carbon_region'"
        ).fetchall()
    assert dict(rows) == {"pue": 1.0, "price_per_kwh": 0.0, "gpu_hour_price": 0.0, "carbon_g_per_kwh": None}


@pytest.mark.parametrize(
    "body", ['{"tokens": Infinity}', '{"samples": NaN}', '{"tokens": 1e400}', '{"tokens": -Infinity}']
)
def test_progress_refuses_non_finite(api: Api, run_id: str, body: str) -> None:
    with api.client("admin") as c:
        r = c.post(f"/v1/runs/{run_id}/progress", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    with psycopg.connect(api.db) as conn:
        assert conn.execute("SELECT count(*) FROM run_progress").fetchone() == (0,)


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/sites/eu1/prices", '{"points": [{"time": "2026-01-01T00:00:00Z", "price_per_kwh": Infinity}]}'),
        ("/v1/carbon/DE", '{"points": [{"time": "2026-01-01T00:00:00Z", "g_co2e_per_kwh": NaN}]}'),
    ],
)
def test_series_refuse_non_finite(api: Api, path: str, body: str) -> None:
    with api.client("admin") as c:
        c.put("/v1/sites/eu1", json={})
        r = c.put(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422, r.text


@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_cli_site_set_refuses_non_finite(db: str, value: str) -> None:
    r = CliRunner().invoke(app, ["site", "set", "eu1", "--price-per-kwh", value, "--db", db])
    assert r.exit_code != 0
    assert "--price-per-kwh" in r.output


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("node", ["node-01\n", "node 01", "", "-node", "n/1", "x" * 300, "nöde"])
def test_cli_token_create_checks_the_node_name(db: str, node: str) -> None:
    r = CliRunner().invoke(app, ["token", "create", "t1", "--role", "node", "--node", node, "--db", db])
    assert r.exit_code != 0, r.output
    assert "--node" in r.output
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM agent_tokens").fetchone() == (0,)


def test_cli_token_create_accepts_a_real_node_name(db: str) -> None:
    r = CliRunner().invoke(
        app, ["token", "create", "t1", "--role", "node", "--node", "gpu-node-01.dc1", "--db", db]
    )
    assert r.exit_code == 0, r.output
    assert r.output.strip().startswith("gpf_")


def test_one_node_name_pattern() -> None:
    from gpufleet import names, wire

    assert names.NODE_RE.pattern == wire.NODE_RE.pattern


def test_api_token_create_refuses_a_node_name_with_a_newline(api: Api) -> None:
    with api.client("admin") as c:
        r = c.post("/v1/tokens", json={"name": "t1", "role": "node", "node": "node-01\n"})
    assert r.status_code == 422


@pytest.mark.parametrize("method,path", [("POST", "/v1/runs"), ("PATCH", "/v1/runs/web-run")])
def test_params_beyond_bigint_is_422_naming_the_field(api: Api, run_id: str, method: str, path: str) -> None:
    with api.client("admin") as c:
        r = c.request(method, path, json={"params": 2**63, **({"run_id": "big"} if method == "POST" else {})})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "params", r.text
