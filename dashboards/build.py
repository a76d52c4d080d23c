"""Write the dashboards' JSON files from their Python definitions.

The JSON files are what Grafana loads (file provisioning, ``gpufleet
dashboards push``); the Python modules are where they are edited, so SQL is
readable and shared fragments stay in one place.  ``--check`` fails when a
file is out of date (the tests run it).

    python -m gpufleet.dashboards.build [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufleet.dashboards import energy_cost, fleet_overview, node_gpu, prom_runs, run_detail, starvation

DIR = Path(__file__).resolve().parent

BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    fleet_overview.UID: fleet_overview.build,
    run_detail.UID: run_detail.build,
    starvation.UID: starvation.build,
    energy_cost.UID: energy_cost.build,
    node_gpu.UID: node_gpu.build,
}
#: Boards over Prometheus (not gpufleet's database), written to ``prometheus/`` so that the PostgreSQL
#: checks (dashboards.validate, dashboards.dryrun, ``gpufleet dashboards check``) never see them.
PROMETHEUS_BUILDERS: dict[str, Callable[[], dict[str, Any]]] = {
    prom_runs.UID: prom_runs.build,
}
PROMETHEUS_DIR = DIR / "prometheus"


def render(dashboard: dict[str, Any]) -> str:
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"


def expected() -> dict[Path, str]:
    return {
        **{DIR / f"{uid}.json": render(build()) for uid, build in BUILDERS.items()},
        **{PROMETHEUS_DIR / f"{uid}.json": render(build()) for uid, build in PROMETHEUS_BUILDERS.items()},
    }


def stale() -> list[Path]:
    """Files whose content differs from what the definitions produce."""
    return [p for p, text in expected().items() if not p.is_file() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if a JSON file is out of date; write nothing")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for p in bad:
            print(f"{p.name} is out of date: run python -m gpufleet.dashboards.build", file=sys.stderr)
        return 1 if bad else 0
    for path, text in expected().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
