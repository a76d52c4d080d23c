"""The batching, never-raising progress reporter behind :func:`report_progress`.

One POST per run per ``interval_s`` to the gpufleet API's existing route,
``POST /v1/runs/{run_id}/progress`` with ``{"time", "tokens", "samples",
"steps"}``: the latest cumulative counts and the time they were reached.
A send that fails keeps that report pending, unless a newer one replaced it,
and is tried again next interval; a refusal that cannot change by itself
(422: the body) is dropped and counted.  404 is retried too: a run that
gpufleet infers from the GPUs (Kubernetes, a job's environment) appears a
sweep or so after the job starts.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from urllib.parse import quote

log = logging.getLogger("gpufleet_client")

#: Refusals that retrying the same report cannot fix (the request itself is wrong).
_DROP_STATUSES = frozenset({400, 413, 422})


@dataclass
class ReporterStats:
    """Counts since the reporter started."""

    reported: int = 0
    sent: int = 0
    failed: int = 0
    dropped: int = 0


@dataclass
class _Pending:
    time: float
    tokens: float | None
    samples: float | None
    steps: float | None


def _count(name: str, v: float | None) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, not {v!r}") from None
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{name} must be a finite count >= 0, not {v!r}")
    return f


class ProgressReporter:
    """Sends the latest progress of each run every ``interval_s`` from a daemon thread."""

    def __init__(
        self,
        api_url: str | None = None,
        token: str | None = None,
        *,
        interval_s: float = 30.0,
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        start: bool = True,
    ) -> None:
        self.api_url = (api_url or os.environ.get("GPUFLEET_API_URL") or "").rstrip("/")
        self.token = token if token is not None else os.environ.get("GPUFLEET_TOKEN")
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self.stats = ReporterStats()
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._last_log: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        if not self.api_url:
            self._log(
                "config", "gpufleet_client: no API URL (set GPUFLEET_API_URL); progress is kept, not sent"
            )
        if start:
            self._thread = threading.Thread(target=self._run, name="gpufleet-progress", daemon=True)
            self._thread.start()
            atexit.register(self.close)

    # -- the training loop's side ------------------------------------------------------

    def report(
        self,
        run_id: str | None = None,
        *,
        tokens: float | None = None,
        samples: float | None = None,
        steps: float | None = None,
    ) -> None:
        """Record cumulative counts for ``run_id`` (default ``GPUFLEET_RUN_ID``); sent in the background."""
        run = run_id or os.environ.get("GPUFLEET_RUN_ID")
        if not run:
            raise ValueError("no run id: pass run_id or set GPUFLEET_RUN_ID")
        t, s, st = _count("tokens", tokens), _count("samples", samples), _count("steps", steps)
        if t is None and s is None and st is None:
            raise ValueError("give tokens, samples or steps (cumulative counts)")
        with self._lock:
            self._pending[run] = _Pending(self.clock(), t, s, st)
            self.stats.reported += 1

    def flush(self) -> bool:
        """Send what is pending now (from the caller's thread); True when nothing is left pending."""
        self._send_all()
        with self._lock:
            return not self._pending

    def close(self) -> None:
        """Stop the thread after a last send."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self.timeout_s + 1.0)
        self._send_all()

    # -- sending ------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(self.interval_s)
            if self._closed.is_set():
                return
            try:
                self._send_all()
            except Exception as e:  # noqa: BLE001 - the reporter thread must outlive any surprise
                self._log("thread", "gpufleet_client: sending progress failed unexpectedly: %r", e)

    def _send_all(self) -> None:
        if not self.api_url:
            return
        with self._send_lock:
            with self._lock:
                batch = list(self._pending.items())
            for run, p in batch:
                outcome = self._post(run, p)
                with self._lock:
                    if outcome != "retry" and self._pending.get(run) is p:
                        del self._pending[run]

    def _post(self, run: str, p: _Pending) -> str:
        body: dict[str, object] = {"time": datetime.fromtimestamp(p.time, timezone.utc).isoformat()}
        for key in ("tokens", "samples", "steps"):
            v = getattr(p, key)
            if v is not None:
                body[key] = v
        req = urllib.request.Request(
            f"{self.api_url}/v1/runs/{quote(run, safe='')}/progress",
            data=json.dumps(body).encode(),
            method="POST",
            headers={
                "Content-Type": "application/json",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
            self.stats.sent += 1
            return "sent"
        except urllib.error.HTTPError as e:
            detail = _detail(e)
            if e.code in _DROP_STATUSES:
                self.stats.dropped += 1
                self._log(
                    f"drop:{run}",
                    "gpufleet_client: progress for run %r refused (HTTP %d: %s); dropped",
                    run,
                    e.code,
                    detail,
                )
                return "dropped"
            self.stats.failed += 1
            self._log(
                f"http:{run}:{e.code}",
                "gpufleet_client: progress for run %r not taken (HTTP %d: %s); will retry",
                run,
                e.code,
                detail,
            )
            return "retry"
        except (urllib.error.URLError, OSError, ValueError) as e:
            self.stats.failed += 1
            self._log(
                "net",
                "gpufleet_client: cannot reach %s (%s); progress will be retried",
                self.api_url,
                getattr(e, "reason", e),
            )
            return "retry"

    def _log(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, -1e9) >= 300.0:
            self._last_log[key] = now
            log.warning(msg, *args)


def _detail(e: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(e.read().decode("utf-8", "replace"))
        return str(doc.get("detail", doc))[:200] if isinstance(doc, dict) else str(doc)[:200]
    except (ValueError, OSError):
        return e.reason if isinstance(e.reason, str) else ""


_default: ProgressReporter | None = None
_default_lock = threading.Lock()


def default_reporter() -> ProgressReporter:
    """The process's reporter, configured from the environment on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = ProgressReporter()
        return _default


def report_progress(
    run_id: str | None = None,
    *,
    tokens: float | None = None,
    samples: float | None = None,
    steps: float | None = None,
) -> None:
    """Record cumulative progress of ``run_id``; batched and sent in the background, never raising on
    network errors (see the package docstring)."""
    default_reporter().report(run_id, tokens=tokens, samples=samples, steps=steps)
