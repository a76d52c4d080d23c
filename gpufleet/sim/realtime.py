"""Drive a fleet with the wall clock, optionally accelerated, for the live demo.

Simulation time is ``t0 + speed * (wall - wall0)``.  The driver makes the
fleet follow that clock, so each source read catches the fleet up first (no
thread needed); :meth:`RealtimeDriver.run` also advances it on its own, for
callers that read the fleet directly.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpufleet.sim.fleet import Fleet


class RealtimeDriver:
    def __init__(self, fleet: Fleet, speed: float = 1.0, wall: Callable[[], float] = time.time) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.fleet = fleet
        self.speed = float(speed)
        self._wall = wall
        self._wall0 = wall()
        self._sim0 = fleet.t
        fleet.follow(self.now)

    def now(self) -> float:
        """Current simulation time, epoch seconds."""
        return self._sim0 + self.speed * (self._wall() - self._wall0)

    def advance(self) -> int:
        """Catch the fleet up with the clock; returns the ticks taken."""
        return self.fleet.advance_to(self.now())

    def run(self, stop: threading.Event, until: float | None = None) -> None:
        """Advance every sampling interval (of wall time / speed) until ``stop`` is set."""
        period = self.fleet.interval_s / self.speed
        while not stop.is_set():
            self.advance()
            if until is not None and self.fleet.t >= until:
                return
            stop.wait(period)

    def start(self, until: float | None = None) -> tuple[threading.Thread, threading.Event]:
        """Run :meth:`run` in a daemon thread; set the returned event to stop it."""
        stop = threading.Event()
        th = threading.Thread(target=self.run, args=(stop, until), name="fleet-sim", daemon=True)
        th.start()
        return th, stop

    def detach(self) -> None:
        """Stop the fleet following this driver's clock."""
        self.fleet.follow(None)
