"""A database filled by a simulated fleet, the way a live deployment fills it.

Sites, carbon series and runs are registered as operators and schedulers
would; samples arrive through the collector's writer in agent-sized batches;
the detector sweep runs on the live cadence; progress is reported as a
training loop would; rollups are drained at the end.  Dashboards and the web
view are then checked against this data rather than against hand-made rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from gpufleet.collector import rollup
from gpufleet.collector.sweep import Sweeper
from gpufleet.config import Settings
from gpufleet.db.policies import backend_of
from gpufleet.sim import Fleet
from gpufleet.sim.carbon import scenario_series
from gpufleet.store import nodes as node_store
from gpufleet.store import runs as run_store
from gpufleet.store import sites as site_store
from testsupport.simfeed import SimFeed


@dataclass(frozen=True)
class FilledFleet:
    url: str
    scenario: str
    t0: float
    t1: float
    runs: tuple[str, ...]
    nodes: tuple[str, ...]
    backend: str

    @property
    def start(self) -> datetime:
        return datetime.fromtimestamp(self.t0, UTC)

    @property
    def end(self) -> datetime:
        return datetime.fromtimestamp(self.t1, UTC)


def _ts(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def fill(
    url: str,
    settings: Settings,
    scenario: str = "demo",
    seconds: float = 900.0,
    sweep_every_s: float = 15.0,
    progress_every_s: float = 30.0,
    start_time: float | None = None,
    send_facts: bool = False,
    after_sweep: Callable[[float], None] | None = None,
) -> FilledFleet:
    """Simulate ``seconds`` of ``scenario`` from ``start_time`` (default: the scenario's own start);
    ``send_facts``: the agents send their node facts (GPU models...) with their first batch;
    ``after_sweep(t)``: called after each detector sweep with the simulated time (what a scrape would see then)."""
    fleet = Fleet.from_scenario(scenario, start_time=start_time)
    t_end = fleet.t0 + seconds
    with psycopg.connect(url, autocommit=True) as conn:
        for s in fleet.scenario.sites:
            values = {
                "pue": s.pue,
                "price_per_kwh": s.price_per_kwh,
                "gpu_hour_price": s.gpu_hour_price,
                "currency": s.currency,
                "carbon_region": s.carbon_region,
                "carbon_g_per_kwh": s.carbon_g_per_kwh,
            }
            site_store.put_site(conn, s.site, values, given=values)
        for region, points in scenario_series(fleet.scenario, fleet.seed, fleet.t0, t_end).items():
            site_store.set_carbon(conn, region, [(_ts(t), g) for t, g in points])
        runs = [r for r in fleet.plan.runs if r.start < t_end]
        for r in runs:
            allocs: dict[str, list[int]] = {}
            for gi in r.gpu_idx.tolist():
                gp = fleet.plan.gpus[gi]
                allocs.setdefault(gp.node, []).append(gp.gpu)
            run_store.create_run(
                conn,
                {
                    "run_id": r.run_id,
                    "name": r.name,
                    "site": r.site,
                    "team": r.team,
                    "start": _ts(r.start),
                    "end": None if r.end is None or r.end > t_end else _ts(r.end),
                    "allocations": [{"node": n, "gpus": g} for n, g in allocs.items()],
                },
            )
        for node in fleet.nodes:
            node_store.set_node_site(conn, node, fleet.plan.nodes[node].site)

        feed = SimFeed(conn, fleet, send_facts=send_facts)
        sweeper = Sweeper(settings)
        t = fleet.t0 + sweep_every_s
        next_progress = fleet.t0 + progress_every_s
        while t <= t_end:
            feed.run_until(t)
            sweeper(conn, fleet.t)
            if after_sweep is not None:
                after_sweep(fleet.t)
            if fleet.t >= next_progress:
                done = fleet.run_progress()
                for r in runs:
                    if r.start <= fleet.t and r.run_id in done:
                        run_store.record_progress(
                            conn, r.run_id, _ts(fleet.t), done[r.run_id]["tokens"], None
                        )
                next_progress += progress_every_s
            t += sweep_every_s
        feed.ship()
        feed.close()
        backend = backend_of(conn) or "postgresql"
        rollup.drain(conn, settings.accounting.max_gap_s, plain_stats=backend != "timescaledb")
        if backend == "timescaledb":
            for view in ("gpu_stats_1m", "host_stats_1m"):
                conn.execute(f"CALL refresh_continuous_aggregate('{view}', NULL, NULL)")
        return FilledFleet(
            url, scenario, fleet.t0, fleet.t, tuple(r.run_id for r in runs), tuple(fleet.nodes), backend
        )
