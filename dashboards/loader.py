"""The dashboards as shipped: the JSON files next to this module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DIR = Path(__file__).resolve().parent


def files() -> list[Path]:
    return sorted(DIR.glob("*.json"))


def load_all() -> dict[str, dict[str, Any]]:
    """Dashboards by uid, read from the JSON files (what Grafana is given)."""
    out: dict[str, dict[str, Any]] = {}
    for path in files():
        d = json.loads(path.read_text())
        out[d["uid"]] = d
    return out


def load_prometheus() -> dict[str, dict[str, Any]]:
    """The boards over Prometheus (``prometheus/``), by uid."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted((DIR / "prometheus").glob("*.json")):
        d = json.loads(path.read_text())
        out[d["uid"]] = d
    return out
