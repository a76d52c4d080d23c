"""A notice from the process serving the web view (the demo while it back-fills) shows on every page."""

from __future__ import annotations

import httpx
import psycopg

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.serverthread import serve


def test_the_back_fill_notice_shows_on_every_page_until_cleared(db: str, settings: Settings) -> None:
    with psycopg.connect(db, autocommit=True) as conn:
        token = create_token(conn, "notice-sre", "sre")
    app = create_app(db, settings)
    with (
        serve(app) as srv,
        httpx.Client(base_url=srv.url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as c,
    ):
        app.state.web_notice = "The demo is back-filling the last 15 min of telemetry <now>."
        for path in ("/", "/runs", "/incidents", "/accounting"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert (
                '<p class="notice" role="status" id="web-notice">The demo is back-filling the last 15 min of '
                "telemetry &lt;now&gt;.</p>" in r.text
            ), path
        app.state.web_notice = None
        assert 'id="web-notice"' not in c.get("/").text
