"""Electricity Maps (API v3): carbon intensity of a zone, gCO2eq/kWh.

``GET /v3/carbon-intensity/past-range?zone=Z&start=..&end=..`` with the ``auth-token`` header answers
``{"zone": Z, "data": [{"datetime": ..., "carbonIntensity": g, ...}, ...]}``; the service caps one
request's range, so a longer one is asked for in parts.  ``history`` (the last 24 hours) has the same
entries under ``"history"``.  Entries without an intensity are skipped, not taken as zero.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from gpufleet.carbon import CarbonFetchError, Points, get_json
from gpufleet.timeparse import iso

BASE_URL = "https://api.electricitymap.org"
#: Longest range asked for in one request (the service refuses longer hourly ranges).
MAX_RANGE = timedelta(days=10)


def parse(body: object, key: str = "data") -> Points:
    if not isinstance(body, dict) or not isinstance(body.get(key), list):
        raise CarbonFetchError(f"Electricity Maps: answer without a {key!r} list")
    out: Points = []
    for i, e in enumerate(body[key]):
        if not isinstance(e, dict) or "datetime" not in e:
            raise CarbonFetchError(f"Electricity Maps: {key}[{i}] has no 'datetime'")
        g = e.get("carbonIntensity")
        if g is None:
            continue
        try:
            t = datetime.fromisoformat(str(e["datetime"]).replace("Z", "+00:00")).astimezone(UTC)
            value = float(g)
        except (TypeError, ValueError):
            raise CarbonFetchError(
                f"Electricity Maps: {key}[{i}]: unreadable datetime or carbonIntensity"
            ) from None
        if not 0 <= value <= 5000:
            raise CarbonFetchError(f"Electricity Maps: {key}[{i}]: {value} g/kWh is outside 0..5000")
        out.append((t, value))
    return sorted(out)


class ElectricityMaps:
    name = "electricitymaps"
    method = "average"

    def __init__(self, token: str, base_url: str | None = None, timeout_s: float = 30.0) -> None:
        self.token = token
        self.base_url = (base_url or BASE_URL).rstrip("/")
        self.timeout_s = timeout_s

    def fetch(self, zone: str, start: datetime, end: datetime) -> Points:
        out: Points = []
        with httpx.Client(timeout=self.timeout_s, headers={"auth-token": self.token}) as client:
            t = start
            while t < end:
                u = min(end, t + MAX_RANGE)
                body = get_json(
                    client,
                    "Electricity Maps",
                    f"{self.base_url}/v3/carbon-intensity/past-range",
                    params={"zone": zone, "start": iso(t, "seconds"), "end": iso(u, "seconds")},
                )
                out += [p for p in parse(body) if start <= p[0] < end]
                t = u
        return sorted(dict(out).items())

    def latest_day(self, zone: str) -> Points:
        """The last 24 hours (``history``)."""
        with httpx.Client(timeout=self.timeout_s, headers={"auth-token": self.token}) as client:
            return parse(
                get_json(
                    client,
                    "Electricity Maps",
                    f"{self.base_url}/v3/carbon-intensity/history",
                    params={"zone": zone},
                ),
                "history",
            )
