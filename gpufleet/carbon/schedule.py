"""Carbon intensity on a schedule in the collector: each configured source is fetched every
``every_s`` for the last ``lookback_s`` (late and revised values overwrite their points).

One collector replica fetches at a time (a session advisory lock), so replicas never call a service
twice for one round.  A failing source is logged in one line and retried next round; the others go on.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

import psycopg

from gpufleet.carbon import CarbonFetchError, fetch_into, make_provider
from gpufleet.config import CarbonSettings, CarbonSource

log = logging.getLogger("gpufleet.carbon")

#: pg_try_advisory_lock key of the fetching replica ('gpuf' 'carb').
LOCK = 0x6770756663617262


def fetch_round(url: str, sources: list[CarbonSource], now: datetime | None = None) -> dict[str, int | str]:
    """One round: every source fetched and stored; returns points stored (or the error) per region."""
    now = now or datetime.now(UTC)
    out: dict[str, int | str] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK,)).fetchone()[0]:  # type: ignore[index]
            return out  # another replica fetches this round
        try:
            for s in sources:
                try:
                    provider = make_provider(s.provider, s.token_file, s.base_url)
                    out[s.region] = fetch_into(
                        conn,
                        provider,
                        s.zone or s.region,
                        s.region,
                        now - timedelta(seconds=s.lookback_s),
                        now,
                    )
                except CarbonFetchError as e:
                    log.warning("carbon %s for %s: %s", s.provider, s.region, e)
                    out[s.region] = str(e)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
    return out


def start(url: str, settings: CarbonSettings, stop: threading.Event | None = None) -> threading.Thread | None:
    """A daemon thread fetching every source on its schedule (None when no source is configured)."""
    if not settings.sources:
        return None
    stop = stop or threading.Event()
    every = min(s.every_s for s in settings.sources)

    def loop() -> None:
        while not stop.is_set():
            try:
                fetch_round(url, settings.sources)
            except psycopg.Error as e:
                log.warning("carbon fetch round: database: %s", type(e).__name__)
            stop.wait(every)

    th = threading.Thread(target=loop, name="carbon-fetch", daemon=True)
    th.start()
    return th
