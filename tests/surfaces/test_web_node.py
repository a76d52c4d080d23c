"""The node page end to end: agents' node checks sent as facts, a real API on loopback, headless Chromium.

A fleet of its own (the host_placement scenario, five minutes ending now):
every node's facts go with its first batch as its agent sends them, the
detector sweep runs on the live cadence, so the page shows what an SRE
would see on a deployment: the checks with their decisions, the job cgroups,
the NUMA placement, the NFS figures and the node's incidents.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.serverthread import serve
from tests.surfaces.fleetdb import FilledFleet, fill
from tests.surfaces.test_web import Watch, Web, _login, _page
from tests.surfaces.test_web import browser as browser  # the shared Chromium fixture

SECONDS = 300.0


@pytest.fixture(scope="module")
def placed(pg_server: str, settings: Settings) -> Iterator[FilledFleet]:
    with scratch_database(pg_server, "gpufleet_web_nodes") as url:
        migrate.upgrade(url, settings)
        start = math.floor((time.time() - SECONDS) / 60.0) * 60.0
        yield fill(url, settings, "host_placement", SECONDS, start_time=start, send_facts=True)


@pytest.fixture(scope="module")
def site(placed: FilledFleet, settings: Settings) -> Iterator[Web]:
    suffix = secrets.token_hex(3)
    names = {role: f"webnode-{role}-{suffix}" for role in ("sre", "finance")}
    with psycopg.connect(placed.url, autocommit=True) as c:
        tokens = {role: create_token(c, names[role], role) for role in names}  # type: ignore[arg-type]
    with serve(create_app(placed.url, settings)) as srv:
        yield Web(srv.url, placed.url, tokens, names)


def checks_of(page: Any) -> dict[tuple[str, str], tuple[str, str, str]]:
    """(check, subject) -> (status, finding, decision) from the Checks table."""
    out = {}
    for row in page.locator("section:has(h2:text('Checks')) tbody tr").all():
        cells = row.locator("td").all_inner_texts()
        out[(cells[1], cells[2])] = (cells[0], cells[4], cells[5])
    return out


def test_the_node_page_shows_the_checks_and_their_decisions(
    site: Web, browser: Any, placed: FilledFleet
) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, site, "sre")
    assert page.url == site.url + "/"
    # The fleet's node table links every node to its page.
    page.click("section:has(h2:text('Nodes')) >> text=p-01")
    assert page.url == site.url + "/nodes/p-01"
    assert page.title() == "Node p-01 - gpufleet"
    summary = page.locator("main section").first.inner_text()
    assert "NVIDIA H100" in summary and "fail" in summary
    checks = checks_of(page)
    status, finding, decision = checks[("numa affinity", "gpu0")]
    assert status == "fail" and "the GPU is on node 0" in finding and "numactl --cpunodebind=0" in decision
    assert checks[("pcie link", "gpu0")][0] == "ok"
    numa = (
        page.locator("section:has(h2:text('NUMA placement')) tbody tr").first.locator("td").all_inner_texts()
    )
    assert numa[0] == "0" and numa[2] == "0" and numa[4] == "1"
    incidents = page.locator("section:has(h2:text('Incidents')) tbody").inner_text()
    assert "Host misconfiguration (numa affinity)" in incidents and "NUMA node" in incidents

    page.goto(site.url + "/nodes/p-02")
    status, finding, decision = checks_of(page)[("nfs", "/datasets")]
    assert status == "fail" and "37 retransmissions" in finding and "NFS server" in decision
    nfs = page.locator("section:has(h2:text('NFS')) tbody tr").first.locator("td").all_inner_texts()
    assert nfs[0] == "/datasets" and nfs[4] == "37"

    page.goto(site.url + "/nodes/p-03")
    checks = checks_of(page)
    quota = next(v for (c, _), v in checks.items() if c == "cpu quota")
    assert quota[0] == "fail" and "4 cores" in quota[1] and "at least 8 cores" in quota[2]
    jobs = (
        page.locator("section:has(h2:text('Job cgroups')) table")
        .first.locator("tbody tr td")
        .all_inner_texts()
    )
    assert "quota-short" in jobs[0] and jobs[4] == "4.0 cores"
    newest = page.locator("section:has(h2:text('Job cgroups')) table").nth(1).locator("tbody tr")
    assert newest.count() == 8  # every GPU's newest sample carries its job's cgroup figures
    cells = newest.first.locator("td").all_inner_texts()
    assert cells[0] == "0" and cells[3].endswith("cores") and cells[4] == "4.0 cores"

    page.goto(site.url + "/nodes/p-04")  # a 2-GPU job under the same 4 cores: enough
    checks = checks_of(page)
    assert [v[0] for (c, _), v in checks.items() if c == "cpu quota"] == ["ok"]
    assert "No incidents on this node or on the runs it holds." in page.inner_text(
        "section:has(h2:text('Incidents'))"
    )

    response = page.goto(site.url + "/nodes/no-such-node")
    assert response.status == 404 and "No node no-such-node" in page.inner_text("main")
    assert [p for p in watch.problems if "404" not in p] == []


def test_the_node_page_is_for_readers_of_the_fleet(site: Web, browser: Any) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, site, "finance")
    response = page.goto(site.url + "/nodes/p-01")
    assert response.status == 403 and "may not open" in page.inner_text("main")
    page.context.clear_cookies()
    page.goto(site.url + "/nodes/p-01")
    assert page.url == site.url + "/login?next=%2Fnodes%2Fp-01"
