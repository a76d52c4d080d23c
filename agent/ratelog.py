"""Logging that cannot flood: a failing source logs once, then a summary per period.

A source that fails every second on 10,000 nodes must not turn the fleet's
logs into a denial of service; the count of what was suppressed keeps the
information.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable


class RateLimitedLog:
    """Logs the first message of a key at once, then at most one per ``period_s`` with a count."""

    def __init__(
        self, logger: logging.Logger, period_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.period_s = period_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def log(self, level: int, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` logged within the period; returns whether it logged."""
        now = self.clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.period_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            suppressed = self._suppressed.pop(key, 0)
            self._last[key] = now
        if suppressed:
            self.logger.log(level, msg + " (%d similar messages suppressed)", *args, suppressed)
        else:
            self.logger.log(level, msg, *args)
        return True
