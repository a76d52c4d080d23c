"""The built-in web view end to end: a real API on loopback over the simulated fleet, headless Chromium."""

from __future__ import annotations

import base64
import secrets
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from playwright import sync_api

from gpufleet.api.app import create_app
from gpufleet.auth import create_token, revoke_token
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from tests.surfaces.fleetdb import FilledFleet
from tests.system_tools import unavailable

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Web:
    url: str
    db: str
    tokens: dict[str, str]
    names: dict[str, str]


@dataclass
class Watch:
    """Console errors, page errors and failed or refused loads of one page."""

    problems: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)


@pytest.fixture(scope="module")
def web(fleet: FilledFleet, settings: Settings) -> Iterator[Web]:
    suffix = secrets.token_hex(3)
    names = {role: f"web-{role}-{suffix}" for role in ("sre", "admin", "finance", "spare")}
    with psycopg.connect(fleet.url, autocommit=True) as c:
        tokens = {
            role: create_token(c, names[role], "finance" if role == "spare" else role)  # type: ignore[arg-type]
            for role in names
        }
        tokens["node"] = create_token(c, f"web-node-{suffix}", "node", "h100-01")
    with serve(create_app(fleet.url, settings)) as srv:
        yield Web(srv.url, fleet.url, tokens, names)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        unavailable("Chromium", "chromium")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _page(browser: Any, watch: Watch) -> Any:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(15_000)

    def console(m: Any) -> None:
        if m.type == "error":
            watch.problems.append(f"console: {m.text}")

    def dialog(d: Any) -> None:
        watch.problems.append(f"dialog: {d.message}")
        d.dismiss()

    page.on("console", console)
    page.on("pageerror", lambda e: watch.problems.append(f"page error: {e}"))

    def failed(r: Any) -> None:
        # A load cut short by navigating on (the previous page's icon) is not a fault of the page.
        if r.failure != "net::ERR_ABORTED":
            watch.problems.append(f"failed: {r.url} ({r.failure})")

    page.on("requestfailed", failed)
    page.on("request", lambda r: watch.urls.append(r.url))
    page.on("dialog", dialog)
    return page


def _login(page: Any, web: Web, role: str, next_path: str = "") -> None:
    page.goto(web.url + "/login" + (f"?next={next_path}" if next_path else ""))
    page.fill("#token", web.tokens[role])
    with page.expect_navigation():
        page.click("button[type=submit]")


def test_sre_sees_fleet_runs_and_incidents(web: Web, browser: Any, fleet: FilledFleet) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, web, "sre")
    assert page.url == web.url + "/"
    assert page.title() == "Fleet - gpufleet"
    cards = dict(
        zip(
            page.locator(".card .label").all_inner_texts(),
            page.locator(".card .value").all_inner_texts(),
            strict=True,
        )
    )
    assert cards["GPUs reporting"] == "64"
    assert int(cards["starved"]) > 0 and int(cards["busy"]) > 0
    assert cards["runs running"] == str(len(fleet.runs))
    with psycopg.connect(web.db) as conn:
        open_n = conn.execute("SELECT count(*) FROM incidents WHERE state = 'open'").fetchone()[0]  # type: ignore[index]
    assert cards["open incidents"] == str(open_n)
    assert page.locator("nav a").all_inner_texts()[:5] == [
        "Fleet",
        "Runs",
        "Incidents",
        "Accounting",
        "Finance",
    ]
    assert sorted(
        page.locator("section:has(h2:text('Nodes')) tbody tr td:first-child").all_inner_texts()
    ) == sorted(fleet.nodes)

    page.click("nav >> text=Runs")
    rows = page.locator("tbody tr")
    assert rows.count() == len(fleet.runs)
    listed = page.locator("tbody tr td:first-child a").all_inner_texts()
    assert sorted(listed) == sorted(fleet.runs)
    pretrain = page.locator("tbody tr", has_text="demo-pretrain").inner_text()
    with psycopg.connect(web.db) as conn:
        pretrain_open = [
            (i, k)
            for i, k in conn.execute(
                "SELECT id, kind FROM incidents WHERE state = 'open' AND run_id = 'demo-pretrain'"
            ).fetchall()
        ]
    assert "EUR" in pretrain and pretrain_open and "checkpoint stall" in pretrain
    for iid, kind in pretrain_open:  # each open incident of the run, named and linked from its row
        assert f"#{iid} {kind.replace('_', ' ')}" in pretrain
    assert page.locator(".notice").count() == 0, "accounting should be available"

    page.click("text=demo-pretrain")
    assert page.url.endswith("/runs/demo-pretrain")
    charts = page.locator("figure.chart")
    assert charts.count() == 2
    for i in range(2):
        assert charts.nth(i).locator("ul.legend li:not(.span-key)").count() == 16
        assert charts.nth(i).locator("ul.legend li.span-key").count() >= 1  # the run's incidents, shaded
        assert charts.nth(i).locator("polyline").count() >= 16
    incidents = page.locator("section:has(h2:text('Incidents')) tbody").inner_text()
    assert "Checkpoint stalls" in incidents and all(f"#{iid} " in incidents for iid, _ in pretrain_open)
    assert "kWh" in page.locator("section:has(h2:text('Accounting so far'))").inner_text()

    page.click("nav >> text=Incidents")
    assert page.locator("tbody tr").count() == open_n
    page.click("text=resolved")
    page.click("nav >> text=Accounting")
    assert page.locator("tbody tr").count() == len(fleet.runs)
    assert watch.problems == []
    assert not any(web.tokens["sre"] in u for u in watch.urls)


def test_finance_lands_on_the_finance_page_and_sees_accounting_only(
    web: Web, browser: Any, fleet: FilledFleet
) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, web, "finance")
    assert page.url == web.url + "/finance"
    assert page.locator("nav a").all_inner_texts() == ["Accounting", "Finance", "Waste"]
    page.click("nav >> text=Accounting")
    assert page.locator("tbody tr").count() == len(fleet.runs)
    assert page.locator("tbody a").count() == 0  # run pages are not theirs to open
    assert "EUR" in page.locator("tbody").inner_text()
    for path in ("/runs", "/runs/demo-pretrain", "/incidents"):
        response = page.goto(web.url + path)
        assert response.status == 403, path
        assert "may not open" in page.inner_text("main")
    # the web view's own address is the finance page for them
    response = page.goto(web.url + "/")
    assert response.status == 200 and page.url == web.url + "/finance"
    # the 403 responses above are the only expected console noise
    assert [p for p in watch.problems if "403" not in p] == []


def test_finance_page_periods_groups_totals_charts_and_downloads(
    web: Web, browser: Any, fleet: FilledFleet, tmp_path: Path
) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, web, "finance")
    assert page.title() == "Finance - gpufleet"
    assert page.locator("#group_by").input_value() == "team"
    teams = page.locator("section:has(h2:text('By team')) tbody tr td:first-child").all_inner_texts()
    with psycopg.connect(web.db) as conn:
        expected = sorted(
            {t or "no team" for (t,) in conn.execute("SELECT DISTINCT team FROM runs").fetchall()}
        )
    assert sorted(t.replace("no team", "no team") for t in teams) == expected, teams
    others = page.locator("section:has(h2:text('totals')) tbody").inner_text()
    assert "No run (with telemetry)" in others and "No run, no telemetry" in others and "Total" in others
    assert "EUR" in others
    charts = page.locator("figure.chart")
    assert charts.count() == 2 and page.locator("figure.chart rect.bar").count() > 0
    assert "per team" in charts.nth(0).inner_text()
    # the page shows what the API reports for the same period (running runs cost more every second: the
    # page's figure lies between the API's just before and just after it)
    day_from, day_to = page.locator("#from").input_value(), page.locator("#to").input_value()

    def api_eur() -> float:
        with httpx.Client(
            base_url=web.url, headers={"Authorization": f"Bearer {web.tokens['finance']}"}
        ) as c:
            body = c.get("/v1/reports/finance.json", params={"from": day_from, "to": day_to}).json()
        return next(
            r["total_cost"] for r in body["rows"] if r["row_type"] == "total" and r["currency"] == "EUR"
        )

    before = api_eur()
    page.reload()
    shown = float(page.locator(".card .value").first.inner_text().replace(" EUR", "").replace(",", ""))
    after = api_eur()
    assert before <= shown <= after, (before, shown, after)
    # the CSV downloads with the browser's session (the cookie), no bearer token
    with page.expect_download() as dl:
        page.click("text=CSV")
    path = tmp_path / "finance.csv"
    dl.value.save_as(path)
    text = path.read_text()
    assert text.startswith("row_type,key,name,team,site,state,") and "\ntotal,total," in text
    assert dl.value.suggested_filename.startswith("finance_team_")
    # another grouping through the form
    page.select_option("#group_by", "site")
    with page.expect_navigation():
        page.click("form.period button")
    assert "group_by=site" in page.url
    sites = page.locator("section:has(h2:text('By site')) tbody tr td:first-child").all_inner_texts()
    assert sites and all(s for s in sites)
    # a bad date says what it expects
    response = page.goto(web.url + "/finance?from=yesterday")
    assert response.status == 422 and "YYYY-MM-DD" in page.inner_text("main")
    assert [p for p in watch.problems if "422" not in p] == []
    with httpx.Client(base_url=web.url) as c:  # no session: the download is not open to anyone
        r = c.get("/finance/report.csv", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_sign_in_flow_and_refusals(web: Web, browser: Any) -> None:
    watch = Watch()
    page = _page(browser, watch)
    page.goto(web.url + "/runs?x=1")
    assert page.url == web.url + "/login?next=%2Fruns%3Fx%3D1"
    page.fill("#token", "gpf_not-a-real-token")
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "not valid" in page.inner_text(".error")
    assert "gpf_not-a-real-token" not in page.content()
    page.fill("#token", web.tokens["node"])  # node tokens may ingest, not read
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert "not valid" in page.inner_text(".error")
    page.fill("#token", web.tokens["admin"])
    with page.expect_navigation():
        page.click("button[type=submit]")
    assert page.url == web.url + "/runs?x=1"
    cookie = next(c for c in page.context.cookies() if c["name"] == "gpufleet_token")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    assert not any(web.tokens["admin"] in u for u in watch.urls)
    assert page.evaluate("document.cookie") == ""  # invisible to scripts
    page.click("text=Log out")
    assert page.url == web.url + "/login"
    assert not [c for c in page.context.cookies() if c["name"] == "gpufleet_token"]
    page.goto(web.url + "/")
    assert page.url.startswith(web.url + "/login")
    assert [p for p in watch.problems if "401" not in p] == []


def test_open_redirects_are_refused(web: Web) -> None:
    with httpx.Client(base_url=web.url, follow_redirects=False) as c:
        for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example"):
            r = c.post("/login", data={"token": web.tokens["sre"], "next": target})
            assert r.status_code == 303 and r.headers["location"] == "/", target
        r = c.post("/login", data={"token": web.tokens["sre"]}, headers={"Origin": "https://evil.example"})
        assert r.status_code == 403 and "set-cookie" not in r.headers


def test_bearer_header_and_revocation(web: Web) -> None:
    with httpx.Client(base_url=web.url, follow_redirects=False, timeout=30) as c:
        r = c.get("/", headers={"Authorization": f"Bearer {web.tokens['sre']}"})
        assert r.status_code == 200 and "64" in r.text
        for name, value in (
            ("Content-Security-Policy", "default-src 'none'"),
            ("X-Frame-Options", "DENY"),
            ("X-Content-Type-Options", "nosniff"),
            ("Cache-Control", "no-store"),
        ):
            assert value in r.headers[name]
        assert c.get("/", headers={"Authorization": "Bearer gpf_wrong"}).status_code == 401
        c.cookies.set("gpufleet_token", web.tokens["spare"])
        assert c.get("/accounting").status_code == 200
        with psycopg.connect(web.db, autocommit=True) as conn:
            revoke_token(conn, web.names["spare"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            r = c.get("/accounting")
            if r.status_code == 303:
                break
            time.sleep(0.3)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        assert c.get("/readyz").json() == {"ready": True, "database": True}


def test_everything_from_the_database_is_escaped(web: Web, browser: Any) -> None:
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    with psycopg.connect(web.db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO runs (run_id, name, team, start) VALUES ('xss-run', %s, %s, now())", (evil, evil)
        )
        conn.execute(
            "INSERT INTO incidents (kind, scope_key, run_id, cause, start, last_seen, evidence) VALUES "
            "('starvation', 'xss', 'xss-run', %s, now(), now(), jsonb_build_object('k', %s::text))",
            (evil, evil),
        )
        xss_id = conn.execute("SELECT id FROM incidents WHERE scope_key = 'xss'").fetchone()[0]  # type: ignore[index]
    try:
        watch = Watch()
        page = _page(browser, watch)
        _login(page, web, "sre")
        for path in ("/runs", "/runs/xss-run", "/incidents", f"/incidents/{xss_id}", "/accounting"):
            page.goto(web.url + path)
            assert evil in page.inner_text("main"), path  # shown as text ...
            assert page.locator("main script, main img").count() == 0, path  # ... never as markup
        assert watch.problems == []
    finally:
        with psycopg.connect(web.db, autocommit=True) as conn:
            conn.execute("DELETE FROM incidents WHERE run_id = 'xss-run'")
            conn.execute("DELETE FROM runs WHERE run_id = 'xss-run'")


PIXEL_STATS_JS = """async (src) => {
  const img = new Image();
  img.src = src;
  await img.decode();
  const c = document.createElement('canvas');
  c.width = img.width; c.height = img.height;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const colors = new Set();
  let n = 0, sum = 0, sq = 0;
  for (let i = 0; i < d.length; i += 4 * 7) {
    const y = 0.2126 * d[i] + 0.7152 * d[i + 1] + 0.0722 * d[i + 2];
    sum += y; sq += y * y; n++;
    colors.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  }
  const mean = sum / n;
  return {width: c.width, height: c.height, colors: colors.size, std: Math.sqrt(sq / n - mean * mean)};
}"""


def test_run_page_screenshot_is_a_real_picture(web: Web, browser: Any, tmp_path: Path) -> None:
    watch = Watch()
    page = _page(browser, watch)
    _login(page, web, "sre", "/runs/demo-pretrain")
    assert page.url.endswith("/runs/demo-pretrain")
    shot = tmp_path / f"run-demo-pretrain-{datetime.now(UTC):%H%M%S}.png"
    page.screenshot(path=str(shot), full_page=True)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 40_000
    blank = browser.new_page()
    try:
        stats = blank.evaluate(PIXEL_STATS_JS, "data:image/png;base64," + base64.b64encode(data).decode())
    finally:
        blank.close()
    assert stats["width"] == 1400 and stats["height"] > 900
    assert stats["colors"] > 40, stats  # 16 GPU colours, text, grid, badges
    assert stats["std"] > 8, stats
    assert watch.problems == []
