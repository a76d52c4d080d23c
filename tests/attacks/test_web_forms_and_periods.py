"""Cross-site posts to the web view's forms, and periods that used to overflow.

Probe 8: ``POST /logout`` from another origin signed the user out (``/login``
checked the origin, ``/logout`` did not).  Probe 9: ``GET
/v1/advisor/power-cap?to=0001-01-20T00:00:00Z`` answered 500 (a 30-day
lookback before year 1).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from gpufleet.api.app import create_app
from gpufleet.config import Settings
from tests.attacks.conftest import World

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
FOREIGN = {"Origin": "https://evil.example"}


def _routes(routes: list[Any]) -> list[APIRoute]:
    """Every route of an app, through the routers it includes."""
    out: list[APIRoute] = []
    for r in routes:
        if isinstance(r, APIRoute):
            out.append(r)
        elif hasattr(r, "original_router"):
            out += _routes(r.original_router.routes)
        elif hasattr(r, "routes"):
            out += _routes(r.routes)
    return out


def _signed_in(w: World) -> httpx.Client:
    c = httpx.Client(base_url=w.api, timeout=30, follow_redirects=False)
    host = c.base_url.netloc.decode()
    r = c.post("/login", data={"token": w.tokens["sre"], "next": "/"}, headers={"Origin": f"http://{host}"})
    assert r.status_code == 303 and "gpufleet_token" in c.cookies, r.text
    return c


def test_sign_out_from_another_site_is_refused(world: World) -> None:
    c = _signed_in(world)
    try:
        for headers in (
            FOREIGN,
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Referer": "https://evil.example/page"},
        ):
            r = c.post("/logout", headers=headers)
            assert r.status_code == 403 and "Cross-site sign-out refused" in r.text, (headers, r.status_code)
            assert "set-cookie" not in r.headers
            assert c.get("/").status_code == 200  # still signed in
        host = c.base_url.netloc.decode()
        r = c.post("/logout", headers={"Origin": f"http://{host}"})
        assert r.status_code == 303 and 'gpufleet_token=""' in r.headers.get("set-cookie", "")
    finally:
        c.close()


def test_every_state_changing_web_route_checks_the_origin(world: World, db: str, settings: Settings) -> None:
    """Any form the web view has, or gains, refuses a post from another site before doing anything."""
    routes = [
        (r.path, m)
        for r in _routes(create_app(db, settings).routes)
        for m in sorted((r.methods or set()) & UNSAFE)
        if not r.path.startswith("/v1/")
    ]
    assert ("/logout", "POST") in routes and ("/login", "POST") in routes
    c = _signed_in(world)
    try:
        for path, method in routes:
            r = c.request(method, path, headers=FOREIGN, data={"token": world.tokens["admin"]})
            assert r.status_code == 403, (method, path, r.status_code)
            assert "set-cookie" not in r.headers, (method, path)
    finally:
        c.close()


@pytest.mark.parametrize(
    "period",
    [
        {"to": "0001-01-20T00:00:00Z"},
        {"from": "0001-01-01T00:00:00Z"},
        {"from": "0001-01-01", "to": "0001-01-02"},
        {"to": "9999-12-31T23:59:59Z"},
        {"from": "9999-12-30", "to": "9999-12-31"},
        {"from": "0001-01-01T00:00:00Z", "to": "9999-12-31T23:59:59Z"},
    ],
)
def test_far_periods_never_overflow(world: World, period: dict[str, str]) -> None:
    """Probe 9, and every endpoint that takes a period, at both ends of what a datetime holds."""
    paths = [
        ("/v1/advisor/power-cap", {"gpu_model": "NVIDIA H100 80GB HBM3"}),
        ("/v1/runs", {}),
        ("/v1/accounting", {}),
        ("/v1/reports/finance.csv", {}),
        ("/v1/reports/runs.csv", {}),
        ("/v1/incidents", {}),
    ]
    for path, extra in paths:
        params = {**extra, **period}
        if path in ("/v1/accounting", "/v1/reports/finance.csv", "/v1/reports/runs.csv"):
            params.setdefault("from", "2026-01-01")
            params.setdefault("to", "2026-01-02")
        r = world.call("admin", "get", path, **params)
        assert r.status_code < 500, (path, params, r.status_code, r.text[:300])
    r = world.call(
        "admin", "get", "/v1/advisor/power-cap", gpu_model="NVIDIA H100 80GB HBM3", to="0001-01-20T00:00:00Z"
    )
    assert r.status_code == 200 and r.json()["models"] == [], r.text
