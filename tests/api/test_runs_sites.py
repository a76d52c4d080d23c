"""Runs, sites, carbon, tokens and roles through the real API and database."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

RUN = {
    "run_id": "llm-7b",
    "name": "pretrain",
    "site": "eu1",
    "team": "lm",
    "start": "2026-12-01T10:00:00Z",
    "allocations": [{"node": "n1", "gpus": [0, 1, 2, 3]}, {"node": "n2", "gpus": [0, 1]}],
}


def make_site(api: Api) -> None:
    with api.client("admin") as c:
        r = c.put(
            "/v1/sites/eu1",
            json={
                "pue": 1.2,
                "price_per_kwh": 0.25,
                "gpu_hour_price": 2.0,
                "currency": "EUR",
                "carbon_region": "DE",
            },
        )
        assert r.status_code == 200, r.text


def test_run_lifecycle(api: Api) -> None:
    make_site(api)
    with api.client("admin") as c:
        r = c.post("/v1/runs", json=RUN)
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["gpu_count"] == 6 and run["state"] == "running"
        assert run["allocations"] == [{"node": "n1", "gpus": [0, 1, 2, 3]}, {"node": "n2", "gpus": [0, 1]}]
        # registering again (another node's prolog) merges allocations
        r = c.post("/v1/runs", json={"run_id": "llm-7b", "allocations": [{"node": "n3", "gpus": [7]}]})
        assert r.status_code == 200 and r.json()["gpu_count"] == 7
        r = c.patch("/v1/runs/llm-7b", json={"end": "2026-12-01T12:00:00Z"})
        assert r.status_code == 200 and r.json()["state"] == "ended"
        assert c.patch("/v1/runs/llm-7b", json={"end": "2026-11-01T12:00:00Z"}).status_code == 409
        assert c.get("/v1/runs/nope").status_code == 404
    with api.client("sre") as c:
        assert [x["run_id"] for x in c.get("/v1/runs", params={"state": "ended"}).json()] == ["llm-7b"]
        assert c.get("/v1/runs", params={"state": "running"}).json() == []
        assert (
            c.get("/v1/runs", params={"site": "eu1", "from": "2026-12-01T11:00:00Z"}).json()[0]["run_id"]
            == "llm-7b"
        )
        assert c.get("/v1/runs", params={"from": "2026-12-01T13:00:00Z"}).json() == []


def test_validation_names_the_field(api: Api) -> None:
    make_site(api)
    with api.client("admin") as c:
        r = c.post("/v1/runs", json={**RUN, "colour": "red"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "colour"]
        r = c.post("/v1/runs", json={**RUN, "start": "2026-12-01T10:00:00"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "start"]
        r = c.post("/v1/runs", json={**RUN, "site": "nowhere"})
        assert r.status_code == 422 and "nowhere" in r.text
        r = c.post("/v1/runs", json={**RUN, "allocations": [{"node": "n1", "gpus": [0, 0]}]})
        assert r.status_code == 422
        r = c.put("/v1/sites/eu2", json={"pue": 0.8})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "pue"]


def test_any_offset_python_accepts_is_taken_as_utc_and_out_of_range_times_are_422(api: Api) -> None:
    """PostgreSQL refuses offsets past +-15:59; times reach it in UTC, or are refused naming the field."""
    make_site(api)
    with api.client("admin") as c:
        r = c.post("/v1/runs", json={**RUN, "start": "2026-12-01T10:00:00-23:25"})
        assert r.status_code == 201, r.text
        assert r.json()["start"].startswith("2026-12-02T09:25:00")
        assert c.get("/v1/runs", params={"to": "2026-12-01T09:00:00-23:25"}).json() == []
        assert len(c.get("/v1/runs", params={"to": "2026-12-01T10:30:00-23:25"}).json()) == 1
        r = c.get(
            "/v1/accounting", params={"from": "0071-01-19T02:14:14-23:25", "to": "0071-01-20T02:14:15-02:18"}
        )
        assert r.status_code == 200, r.text
        r = c.get(
            "/v1/accounting", params={"from": "0001-01-01T00:00:00+05:00", "to": "2026-12-01T00:00:00Z"}
        )
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "from"]
        r = c.get("/v1/carbon/DE", params={"from": "2026-12-01T00:00:00"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "from"]


@pytest.mark.parametrize(
    "role,method,path,body,expected",
    [
        ("finance", "put", "/v1/sites/x", {"pue": 1.1}, 403),
        ("finance", "post", "/v1/tokens", {"name": "t", "role": "sre"}, 403),
        ("finance", "get", "/v1/runs", None, 403),
        ("finance", "get", "/v1/sites", None, 200),
        ("node", "get", "/v1/runs", None, 403),
        ("node", "get", "/v1/sites", None, 403),
        ("node", "get", "/v1/incidents", None, 403),
        ("sre", "get", "/v1/incidents", None, 200),
        ("sre", "put", "/v1/sites/x", {"pue": 1.1}, 403),
        ("sre", "post", "/v1/runs", {"run_id": "x"}, 403),
        ("nobody", "get", "/v1/runs", None, 401),
    ],
)
def test_roles(api: Api, role: str, method: str, path: str, body: dict | None, expected: int) -> None:
    with api.client(role) as c:
        r = c.request(method, path, json=body)
        assert r.status_code == expected, r.text


def test_node_token_registers_runs_on_its_node_only(api: Api) -> None:
    with api.client("node") as c:
        r = c.post("/v1/runs", json={"run_id": "slurm-1", "allocations": [{"node": "n1", "gpus": [0]}]})
        assert r.status_code == 201
        r = c.post("/v1/runs", json={"run_id": "slurm-1", "allocations": [{"node": "n2", "gpus": [0]}]})
        assert r.status_code == 403


def test_tokens_shown_once_and_revocable(api: Api) -> None:
    with api.client("admin") as c:
        r = c.post("/v1/tokens", json={"name": "agent-7", "role": "node", "node": "n7"})
        assert r.status_code == 201
        secret = r.json()["token"]
        assert c.post("/v1/tokens", json={"name": "agent-7", "role": "node", "node": "n7"}).status_code == 409
        assert c.post("/v1/tokens", json={"name": "bad", "role": "node"}).status_code == 422
        listed = c.get("/v1/tokens").json()
        assert secret not in str(listed) and {t["name"] for t in listed} >= {"agent-7"}
        assert c.delete("/v1/tokens/agent-7").status_code == 204
        assert c.delete("/v1/tokens/agent-7").status_code == 404


def test_carbon_and_prices(api: Api) -> None:
    make_site(api)
    pts = [
        {"time": "2026-12-01T10:00:00Z", "g_co2e_per_kwh": 300},
        {"time": "2026-12-01T11:00:00Z", "g_co2e_per_kwh": 200},
    ]
    with api.client("admin") as c:
        assert c.put("/v1/carbon/DE", json={"points": pts}).json() == {"region": "DE", "points": 2}
        assert (
            c.put("/v1/carbon/DE", json={"points": [{"time": "x", "g_co2e_per_kwh": 1}]}).status_code == 422
        )
        r = c.put(
            "/v1/sites/eu1/prices", json={"points": [{"time": "2026-12-01T00:00:00Z", "price_per_kwh": 0.3}]}
        )
        assert r.status_code == 200
        assert (
            c.put(
                "/v1/sites/zz/prices",
                json={"points": [{"time": "2026-12-01T00:00:00Z", "price_per_kwh": 0.3}]},
            ).status_code
            == 404
        )
    with api.client("finance") as c:
        got = c.get("/v1/carbon/DE").json()["points"]
        assert [p["g_co2e_per_kwh"] for p in got] == [300, 200]
