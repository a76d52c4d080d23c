"""Pages as a person sees them: the API on loopback over the simulated fleet, in the system's Chromium.

Playwright drives Debian's ``chromium`` (tools/system-deps.sh installs it; playwright's own browser
download is not used).  The fleet is the surfaces' session database: 15 minutes of the demo scenario
ending about now.
"""

from __future__ import annotations

import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright import sync_api

from gpufleet.api.app import create_app
from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.serverthread import serve
from tests.surfaces.conftest import fleet  # noqa: F401  (the session's filled fleet)
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
    "--disable-quic",
]


@dataclass
class Site:
    url: str
    db: str
    token: str


@pytest.fixture(scope="module")
def site(fleet: FilledFleet, settings: Settings) -> Iterator[Site]:  # noqa: F811
    with psycopg.connect(fleet.url, autocommit=True) as c:
        token = create_token(c, f"browser-sre-{secrets.token_hex(3)}", "sre")
    with serve(create_app(fleet.url, settings)) as srv:
        yield Site(srv.url, fleet.url, token)


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


def signed_in(browser: Any, site: Site, width: int = 1280) -> Any:
    """A page at ``width`` px signed in as sre, the way a person pastes the token the demo prints."""
    ctx = browser.new_context(viewport={"width": width, "height": 900})
    page = ctx.new_page()
    page.set_default_timeout(20_000)
    page.goto(site.url + "/login")
    page.fill("#token", f"Bearer {site.token}")
    with page.expect_navigation():
        page.click("button[type=submit]")
    return page
