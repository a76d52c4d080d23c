"""Assemble the collector process: the app plus the leader's detector sweep."""

from __future__ import annotations

from fastapi import FastAPI

from collector.app import create_app
from gpufleet.config import Settings


def build_collector(url: str, settings: Settings) -> FastAPI:
    return create_app(url, settings, sweep=None, run_leader=settings.leader)
