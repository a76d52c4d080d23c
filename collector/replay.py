"""``gpufleet replay``: a trace bundle through ingest, detectors and accounting.

contracts.md section 2: the bundle is loaded through the collector's ingest
path (validation and the group-commit writer), rollups are built, every
detector runs over the timeline exactly as the live sweep would (same code,
a simulated clock stepping by the sweep interval) and incidents follow the
same lifecycle; the incidents are then stored as the live collector stores
them, so the accounting's goodput counts the time they lost.  Outputs are
written only when everything succeeded, each
through a temporary file and a rename, so nothing partial is ever left.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from gpufleet.accounting.result import AccountingBody
from gpufleet.collector import rollup
from gpufleet.collector.batch_store import write_batches
from gpufleet.collector.bundle import Bundle, read_bundle
from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.incident_store import clean_json, store_all
from gpufleet.collector.incidents import MemoryIncidentStore
from gpufleet.collector.window_cache import WindowCache, load_runs
from gpufleet.config import Settings
from gpufleet.db.policies import backend_of
from gpufleet.detectconfig import DetectorConfig
from gpufleet.store import runs as run_store
from gpufleet.store import sites as site_store
from gpufleet.timeparse import iso


@dataclass
class ReplayResult:
    findings: list[dict[str, Any]]
    accounting: list[AccountingBody]
    sweeps: int
    gpu_rows: int
    host_rows: int


def load(conn: psycopg.Connection, bundle: Bundle) -> None:
    """Write the bundle in one transaction, storing its batches as the collector's writer does."""
    with conn.transaction():
        register_bundle(conn, bundle)
        for run_id, t, tokens, samples in bundle.progress:
            run_store.record_progress(conn, run_id, t, tokens, samples)
        for k in range(0, len(bundle.batches), 8):
            write_batches(conn, bundle.batches[k : k + 8])
        for node, facts in bundle.facts.items():
            conn.execute(
                "INSERT INTO nodes (node, facts, facts_time) VALUES (%s, %s, now()) ON CONFLICT (node) "
                "DO UPDATE SET facts = EXCLUDED.facts, facts_time = now()",
                (node, Jsonb(facts)),
            )
        # Node sizes, as agents would report them, for host-energy shares.
        conn.execute(
            "INSERT INTO nodes (node, gpu_count) SELECT node, count(DISTINCT gpu) FROM gpu_samples "
            "WHERE mig_instance IS NULL GROUP BY node ON CONFLICT (node) DO UPDATE SET gpu_count = "
            "EXCLUDED.gpu_count"
        )
        assign_node_sites(conn)


def register_bundle(conn: psycopg.Connection, bundle: Bundle) -> None:
    """The bundle's sites, carbon series and runs with their allocations, as operators and schedulers declare them."""
    for s in bundle.sites:
        values = {
            "pue": s["pue"] or 1.0,
            "price_per_kwh": s["price_per_kwh"] or 0.0,
            "gpu_hour_price": s["gpu_hour_price"] or 0.0,
            "currency": s["currency"] or "USD",
            "carbon_region": s["carbon_region"],
            "carbon_g_per_kwh": s["carbon_g_per_kwh"],
        }
        site_store.put_site(conn, s["site"], values, given=values)
    for region, points in bundle.carbon.items():
        site_store.set_carbon(conn, region, points)
    allocs: dict[str, list[tuple[str, int]]] = {}
    for run_id, node, gpu in bundle.allocations:
        allocs.setdefault(run_id, []).append((node, gpu))
    for r in bundle.runs:
        by_node: dict[str, list[int]] = {}
        for node, gpu in allocs.get(r["run_id"], []):
            by_node.setdefault(node, []).append(gpu)
        run_store.create_run(
            conn,
            {
                "run_id": r["run_id"],
                "name": r["name"],
                "site": r["site"],
                "start": datetime.fromtimestamp(r["start"], UTC),
                "end": None if r["end"] is None else datetime.fromtimestamp(r["end"], UTC),
                "allocations": [{"node": n, "gpus": g} for n, g in by_node.items()],
            },
        )


def assign_node_sites(conn: psycopg.Connection) -> None:
    """Nodes without a site join the site their facts name (``nodes.json``: ``site``) when the bundle has
    it, else the site of the runs on them (the earliest such run's, if runs of two sites share a node), so
    GPU time no run held is priced like the runs around it and the fleet total reconciles with them:
    facility kWh, CO2e and cost."""
    conn.execute("""
UPDATE nodes n SET site = n.facts ->> 'site' FROM sites s
WHERE n.site IS NULL AND jsonb_typeof(n.facts -> 'site') = 'string' AND s.site = n.facts ->> 'site'""")
    conn.execute("""
INSERT INTO nodes (node, site)
SELECT DISTINCT ON (a.node) a.node, r.site FROM run_allocations a JOIN runs r ON r.run_id = a.run_id
WHERE r.site IS NOT NULL ORDER BY a.node, r.start, r.run_id
ON CONFLICT (node) DO UPDATE SET site = EXCLUDED.site WHERE nodes.site IS NULL""")


def sweep_timeline(
    conn: psycopg.Connection,
    bundle: Bundle,
    settings: Settings,
    config: DetectorConfig | None = None,
    store: MemoryIncidentStore | None = None,
) -> tuple[MemoryIncidentStore, int]:
    """Every sweep the live collector would have made over the trace."""
    det = settings.detect
    cfg = config if config is not None else settings.detect
    cache = WindowCache(det.window_s)
    cache.load(conn, bundle.t_min - det.window_s, bundle.t_max)
    runs = load_runs(conn, bundle.t_min - det.window_s, bundle.t_max + det.sweep_interval_s)
    store = store if store is not None else MemoryIncidentStore()
    times = np.arange(
        bundle.t_min + det.sweep_interval_s, bundle.t_max + det.sweep_interval_s, det.sweep_interval_s
    )
    for now in times.tolist():
        active = [r for r in runs if r.overlaps(now - det.window_s, now)]
        window = cache.window(now, active, bundle.facts)
        store.sweep(run_detectors(window, cfg).findings, now, det.resolve_after_s)
    return store, len(times)


def accounting_for(conn: psycopg.Connection, bundle: Bundle, settings: Settings) -> list[AccountingBody]:
    from gpufleet.accounting import run_accounting

    now = datetime.fromtimestamp(bundle.t_max, UTC)
    return [
        run_accounting(conn, r["run_id"], now=now, max_gap_s=settings.accounting.max_gap_s)
        for r in sorted(bundle.runs, key=lambda r: (r["start"], r["run_id"]))
    ]


def replay(
    url: str, bundle_dir: Path, settings: Settings, progress: Callable[[str], None] | None = None
) -> ReplayResult:
    say = progress or (lambda _m: None)
    bundle = read_bundle(bundle_dir)
    say(f"bundle: {bundle.gpu_rows} GPU and {bundle.host_rows} host samples, {len(bundle.runs)} runs")
    with psycopg.connect(url, autocommit=True) as conn:
        load(conn, bundle)
        rollup.drain(conn, settings.accounting.max_gap_s, backend_of(conn) != "timescaledb")
        store, sweeps = sweep_timeline(conn, bundle, settings)
        say(f"{sweeps} sweeps, {len(store.incidents())} incidents")
        # The incidents feed the accounting's goodput as the live store's do.
        with conn.transaction():
            store_all(conn, store.incidents())
        accounting = accounting_for(conn, bundle, settings)
    return ReplayResult(store.records(), accounting, sweeps, bundle.gpu_rows, bundle.host_rows)


def write_atomic(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def findings_jsonl(findings: list[dict[str, Any]]) -> str:
    return "".join(json.dumps(clean_json(f), default=_json, allow_nan=False) + "\n" for f in findings)


def _json(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, datetime):
        return iso(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
