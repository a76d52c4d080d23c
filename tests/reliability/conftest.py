"""Fixtures of the fault-injection suite: fresh databases, tokens, size knobs, measured figures.

Every scenario runs at a size that keeps the default suite to a few minutes
on a small machine; ``GPUFLEET_RELIABILITY_FULL=1`` switches every knob to the
issue's full size, and ``GPUFLEET_REL_<KNOB>`` sets one knob (see
:func:`knob`).  Each test reports what it measured through ``figures``; the
figures are printed at the end of the run and, with
``GPUFLEET_RELIABILITY_REPORT=path``, appended there as JSON lines.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from gpufleet.auth import create_token
from gpufleet.config import Settings
from gpufleet.db import migrate
from gpufleet.db.scratch import scratch_database
from gpufleet.wire import encode
from testsupport.procs import CollectorProc

FULL = os.environ.get("GPUFLEET_RELIABILITY_FULL", "") not in ("", "0")

_FIGURES: list[dict[str, Any]] = []


def knob(name: str, default: float, full: float) -> float:
    """A size knob: ``GPUFLEET_REL_<NAME>`` if set, else the full size under FULL, else the default."""
    env = os.environ.get(f"GPUFLEET_REL_{name.upper()}")
    if env:
        return float(env)
    return full if FULL else default


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _FIGURES:
        return
    terminalreporter.section("reliability figures")
    for fig in _FIGURES:
        terminalreporter.write_line(json.dumps(fig, default=str))


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A dict the test fills with what it measured; printed (and saved) at the end."""
    fig: dict[str, Any] = {}
    yield fig
    if fig:
        entry = {"test": request.node.nodeid.split("::", 1)[-1], "full": FULL, **fig}
        _FIGURES.append(entry)
        path = os.environ.get("GPUFLEET_RELIABILITY_REPORT")
        if path:
            with open(path, "a") as f:
                f.write(json.dumps(entry, default=str) + "\n")


@pytest.fixture
def fresh_db(pg_server: str, settings: Settings) -> Iterator[str]:
    """A migrated database of this test's own (collector processes connect to it)."""
    with scratch_database(pg_server, "gpufleet_rel") as url:
        migrate.upgrade(url, settings)
        yield url


def node_tokens(url: str, nodes: list[str]) -> dict[str, str]:
    with psycopg.connect(url, autocommit=True) as c:
        return {n: create_token(c, f"tok-{n}", "node", n) for n in nodes}


def role_token(url: str, name: str, role: str) -> str:
    with psycopg.connect(url, autocommit=True) as c:
        return create_token(c, name, role)  # type: ignore[arg-type]


#: Collector settings of the suite: quick readiness, short Retry-After, frequent sweeps.
COLLECTOR_SETTINGS: dict[str, Any] = {"ingest": {"retry_after_s": 1}, "detect": {"sweep_interval_s": 1.0}}


def merged(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


@pytest.fixture
def collectors(tmp_path: Path) -> Iterator[Callable[..., CollectorProc]]:
    """Makes collector processes (not started); every one is killed when the test ends."""
    made: list[CollectorProc] = []

    def make(db: str, settings: dict[str, Any] | None = None, **kw: Any) -> CollectorProc:
        proc = CollectorProc(
            db,
            tmp_path,
            merged(COLLECTOR_SETTINGS, settings or {}),
            name=kw.pop("name", f"collector{len(made)}"),
            **kw,
        )
        made.append(proc)
        return proc

    try:
        yield make
    finally:
        for proc in made:
            proc.kill()


def gpu_batch(batch_id: str, node: str, n: int = 8, t0: float | None = None, gpus: int = 8) -> dict[str, Any]:
    """A valid batch of ``n`` GPU samples (``gpus`` GPUs, one second apart) and one host sample."""
    t0 = time.time() - 5 if t0 is None else t0
    return {
        "batch_id": batch_id,
        "node": node,
        "gpu": {
            "time": [t0 + i // gpus for i in range(n)],
            "gpu": [i % gpus for i in range(n)],
            "util_pct": [50.0] * n,
            "power_w": [300.0] * n,
            "temp_c": [60] * n,
        },
        "host": {"time": [t0], "cpu_user_pct": [10.0]},
    }


def post(
    url: str, token: str | None, doc: Any, fmt: str = "msgpack", comp: str | None = "zstd", **kw: Any
) -> httpx.Response:
    body, headers = encode(doc, fmt, comp)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.post(
        url.rstrip("/") + "/v1/ingest", content=body, headers=headers, timeout=kw.pop("timeout", 10), **kw
    )
