"""A built-in web view served by the API at ``/``, for fleets without Grafana and for the demo.

Server-rendered HTML with SVG charts drawn on the server: no JavaScript, no
external assets, a strict Content-Security-Policy.  Pages: fleet overview,
runs with live accounting, a run with per-GPU utilisation and power, a node
with its checks (:mod:`gpufleet.api.web.nodes`), incidents (one page each,
:mod:`gpufleet.api.web.incident_pages`: the cause in words), accounting, and
the finance page (:mod:`gpufleet.api.web.finance`: periods, totals, per-day
charts, report downloads), where the finance role lands.  Browsers sign in
with an API token (:mod:`gpufleet.api.web.session`).  Also carries the API's
``/readyz`` (:mod:`gpufleet.api.web.readiness`).
"""

from __future__ import annotations

from fastapi import APIRouter

from gpufleet.api.web import (
    assets,
    finance,
    incident_pages,
    nodes,
    pages,
    readiness,
    runbooks,
    session,
    waste,
)

router = APIRouter()
for _r in (
    session.router,
    pages.router,
    incident_pages.router,
    finance.router,
    waste.router,
    nodes.router,
    runbooks.router,
    assets.router,
    readiness.router,
):
    router.include_router(_r)
