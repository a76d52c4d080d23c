"""WattTime (API v3): marginal operating emissions rate of a grid region, ``co2_moer``.

``GET /login`` with HTTP basic auth answers ``{"token": ...}`` (valid about 30 minutes);
``GET /v3/historical?region=R&start=..&end=..&signal_type=co2_moer`` with ``Authorization: Bearer``
answers ``{"data": [{"point_time": ..., "value": v}, ...], "meta": {"units": "lbs_co2_per_mwh", ...}}``.
Values in lbs/MWh are converted to g/kWh (x 453.59237 / 1000); an answer in other units is refused
rather than stored wrong.  Ranges longer than a month are asked for in parts.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from gpufleet.carbon import CarbonFetchError, Points, get_json
from gpufleet.timeparse import iso

BASE_URL = "https://api.watttime.org"
MAX_RANGE = timedelta(days=31)
G_PER_LB = 453.59237
#: g/kWh per unit of each signal unit the service may report.
UNITS = {"lbs_co2_per_mwh": G_PER_LB / 1000.0, "g_co2_per_kwh": 1.0}


def parse(body: object) -> Points:
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        raise CarbonFetchError("WattTime: answer without a 'data' list")
    meta = body.get("meta") if isinstance(body.get("meta"), dict) else {}
    units = (meta or {}).get("units", "lbs_co2_per_mwh")
    if units not in UNITS:
        raise CarbonFetchError(f"WattTime: values in {units!r}, expected one of {', '.join(UNITS)}")
    factor = UNITS[units]
    out: Points = []
    for i, e in enumerate(body["data"]):
        try:
            t = datetime.fromisoformat(str(e["point_time"]).replace("Z", "+00:00")).astimezone(UTC)
            value = float(e["value"]) * factor
        except (KeyError, TypeError, ValueError):
            raise CarbonFetchError(f"WattTime: data[{i}]: unreadable point_time or value") from None
        if not 0 <= value <= 5000:
            raise CarbonFetchError(f"WattTime: data[{i}]: {value:.1f} g/kWh is outside 0..5000")
        out.append((t, value))
    return sorted(out)


class WattTime:
    name = "watttime"
    method = "marginal"

    def __init__(
        self, user: str, password: str, base_url: str | None = None, timeout_s: float = 30.0
    ) -> None:
        self.user = user
        self.password = password
        self.base_url = (base_url or BASE_URL).rstrip("/")
        self.timeout_s = timeout_s

    def _token(self, client: httpx.Client) -> str:
        body = get_json(client, "WattTime", f"{self.base_url}/login", auth=(self.user, self.password))
        if not isinstance(body, dict) or not isinstance(body.get("token"), str):
            raise CarbonFetchError("WattTime: login answered without a token")
        return body["token"]

    def fetch(self, zone: str, start: datetime, end: datetime) -> Points:
        out: Points = []
        with httpx.Client(timeout=self.timeout_s) as client:
            headers = {"Authorization": f"Bearer {self._token(client)}"}
            t = start
            while t < end:
                u = min(end, t + MAX_RANGE)
                body = get_json(
                    client,
                    "WattTime",
                    f"{self.base_url}/v3/historical",
                    headers=headers,
                    params={
                        "region": zone,
                        "start": iso(t, "seconds", zulu=False),
                        "end": iso(u, "seconds", zulu=False),
                        "signal_type": "co2_moer",
                    },
                )
                out += [p for p in parse(body) if start <= p[0] < end]
                t = u
        return sorted(dict(out).items())
