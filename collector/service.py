"""Assemble the collector process: the app plus the leader's detector sweep."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

from gpufleet.collector.app import create_app
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings

log = logging.getLogger("gpufleet.collector")


def check_schema(url: str) -> str | None:
    """Log, in one line, that the database needs ``gpufleet db upgrade`` (None when it does not)."""
    from gpufleet.db.schema_check import schema_problem

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            problem = schema_problem(conn)
    except psycopg.Error:
        return None  # unreachable: readiness and the writer report that
    if problem:
        log.error("%s; ingest and the detector sweep fail until then", problem)
    return problem


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for serving the collector (beside the address and TLS):
    idle agent connections are held ``ingest.keep_alive_s``, past the agents'
    ship interval, so each node keeps one connection instead of reconnecting
    for every batch; the protocol answers plain shipments itself, and passes
    verified client certificates on where a client CA is configured."""
    from gpufleet.collector.tls import protocol_class

    return {
        "timeout_keep_alive": settings.ingest.keep_alive_s,
        "http": protocol_class(client_certs=bool(settings.tls.client_ca)),
    }


def build_collector(url: str, settings: Settings) -> Any:
    """The collector ASGI app with the leader's detector sweep wired in."""
    check_schema(url)
    from gpufleet.carbon import schedule

    schedule.start(url, settings.carbon)  # carbon intensity from the configured services, if any
    return create_app(url, settings, sweep=Sweeper(settings), run_leader=settings.leader)
