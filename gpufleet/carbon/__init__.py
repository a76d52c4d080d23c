"""Carbon intensity from the services fleets use, into the carbon step series accounting reads.

Two clients behind one small protocol (:class:`Provider`: ``fetch(zone, start, end) -> points``):
:mod:`~gpufleet.carbon.electricitymaps` (gCO2eq/kWh, ``auth-token`` header) and
:mod:`~gpufleet.carbon.watttime` (v3 login, marginal ``co2_moer`` in lbs/MWh, converted to g/kWh).
Tokens and passwords are read from files, never from the command line or settings values.
:func:`fetch_into` stores what a provider returns as points of a region's series
(``carbon_intensity``: each value holds until the next), and :mod:`~gpufleet.carbon.schedule` does
that on a schedule in the collector.  Errors of a service are translated once, here, into
:class:`CarbonFetchError` with the provider and what went wrong; nothing partial is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Protocol

import httpx
import psycopg

#: (time, g CO2e per kWh), in time order
Points = list[tuple[datetime, float]]


class CarbonFetchError(RuntimeError):
    """A provider refused or answered something unusable; the message says which and why."""


class Provider(Protocol):
    name: str
    #: what its intensities are: ``average`` (the grid mix) or ``marginal`` (the generator answering demand)
    method: str

    def fetch(self, zone: str, start: datetime, end: datetime) -> Points: ...


def read_secret(path: Path, what: str) -> str:
    """A token or password from a file (trailing newline dropped); a clear error when missing or empty."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as e:
        raise CarbonFetchError(f"{what} file {path}: {e.strerror or e}") from None
    if not text:
        raise CarbonFetchError(f"{what} file {path} is empty")
    return text


def get_json(client: httpx.Client, provider: str, url: str, **kw: object) -> object:
    """GET ``url``; every failure (network, HTTP status, non-JSON) as one :class:`CarbonFetchError`."""
    try:
        r = client.get(url, **kw)  # type: ignore[arg-type]
    except httpx.HTTPError as e:
        raise CarbonFetchError(f"{provider}: cannot reach {url}: {type(e).__name__}: {e}") from None
    if r.status_code in (401, 403):
        raise CarbonFetchError(f"{provider}: {r.status_code} from {url}: the token (or login) is refused")
    if r.status_code >= 400:
        raise CarbonFetchError(f"{provider}: {r.status_code} from {url}: {r.text[:200]}")
    try:
        return r.json()
    except ValueError:
        raise CarbonFetchError(f"{provider}: {url} did not answer JSON") from None


def fetch_into(
    conn: psycopg.Connection, provider: Provider, zone: str, region: str, start: datetime, end: datetime
) -> int:
    """Fetch ``zone`` for [start, end) and store it as points of ``region``; returns how many."""
    from gpufleet.store.sites import set_carbon

    points = provider.fetch(zone, start, end)
    if points:
        set_carbon(conn, region, points, method=provider.method, provider=provider.name)
    return len(points)


def make_provider(
    name: str,
    token_file: Path,
    base_url: str | None = None,
    *,
    transport: Callable[..., object] | None = None,
) -> Provider:
    """``electricitymaps`` (token file: the API token) or ``watttime`` (token file: ``user:password``)."""
    if name == "electricitymaps":
        from gpufleet.carbon.electricitymaps import ElectricityMaps

        return ElectricityMaps(read_secret(token_file, "Electricity Maps token"), base_url)
    if name == "watttime":
        from gpufleet.carbon.watttime import WattTime

        user, sep, password = read_secret(token_file, "WattTime credentials").partition(":")
        if not sep or not user or not password:
            raise CarbonFetchError(
                f"WattTime credentials file {token_file}: expected one line 'username:password'"
            )
        return WattTime(user, password, base_url)
    raise CarbonFetchError(f"unknown carbon provider {name!r}: electricitymaps or watttime")
