"""Assemble the collector process: the app plus the leader's detector sweep."""

from __future__ import annotations

from typing import Any

from gpufleet.collector.app import create_app
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings


def build_collector(url: str, settings: Settings) -> Any:
    """The collector ASGI app with the leader's detector sweep wired in."""
    return create_app(url, settings, sweep=Sweeper(settings), run_leader=settings.leader)
