"""``gpufleet demo``: the whole system, live, on one machine.

Starts (or uses) the database, migrates a fresh demo database, runs the
collector and the API on loopback, registers the simulated fleet's sites,
carbon series and runs through the API, back-fills the last minutes of
telemetry through the collector's ingest so findings show at once, then runs
one real agent per simulated node (real scheduler, spool and shipper) against
a fleet that follows the wall clock.  The terminal shows runs, incidents as
they open and resolve, and energy so far.  Ctrl-C stops everything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg import sql

from gpufleet.config import AgentSettings, Settings
from gpufleet.db.connect import with_database
from gpufleet.db.reader import ensure_reader
from gpufleet.demofile import DEMO_URL_FILE
from gpufleet.timeparse import iso_at


@dataclass
class DemoOptions:
    scenario: str = "demo"
    seed: int | None = None
    backfill_s: float = 900.0
    duration_s: float | None = None
    collector_port: int = 0
    api_port: int = 0
    refresh_s: float = 5.0
    database: str = "gpufleet_demo"
    #: The URL Grafana reaches the demo's database at, as a read-only role (None: not reachable over TCP).
    reader_url: str | None = None


@dataclass
class DemoState:
    api_url: str = ""
    collector_url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    seen_open: dict[int, str] = field(default_factory=dict)


#: The read-only role the demo's database gives Grafana (and anyone reading it over loopback TCP).
READER_ROLE = "gpufleet_reader"
#: Longest line the terminal view prints when it cannot tell the terminal's width.
DEFAULT_WIDTH = 120


def cut(line: str, width: int | None = None) -> str:
    """``line`` cut to the terminal's width (an ellipsis where it was cut)."""
    w = width or shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    w = max(w, 40)
    return line if len(line) <= w else line[: w - 1] + "\u2026"


def reader_role(url: str) -> None:
    """A login role that can read every table of the demo's database and write nothing (Grafana's)."""
    ensure_reader(url, READER_ROLE)


def fresh_database(server_url: str, name: str) -> str:
    """Drop and recreate the demo database so every demo starts clean."""
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return with_database(server_url, name)


def register_fleet(client: httpx.Client, fleet: Any) -> None:
    """Sites, carbon series and runs of the scenario, through the API (as an operator would)."""
    from gpufleet.sim.carbon import scenario_series

    sc = fleet.scenario
    for s in sc.sites:
        body = {
            k: getattr(s, k)
            for k in (
                "pue",
                "price_per_kwh",
                "gpu_hour_price",
                "currency",
                "carbon_region",
                "carbon_g_per_kwh",
            )
        }
        client.put(f"/v1/sites/{s.site}", json=body).raise_for_status()
    for region, points in scenario_series(sc, fleet.plan.seed, fleet.t0 - 86400, fleet.plan.t_end).items():
        client.put(
            f"/v1/carbon/{region}",
            json={"points": [{"time": iso_at(t), "g_co2e_per_kwh": g} for t, g in points]},
        ).raise_for_status()
    for node, plan in fleet.plan.nodes.items():
        client.patch(f"/v1/nodes/{node}", json={"site": plan.site}).raise_for_status()
    for r in fleet.plan.runs:
        allocs: dict[str, list[int]] = {}
        for gi in r.gpu_idx.tolist():
            gp = fleet.plan.gpus[gi]
            allocs.setdefault(gp.node, []).append(gp.gpu)
        body = {
            "run_id": r.run_id,
            "name": r.name,
            "site": r.site,
            "team": r.team,
            "start": iso_at(r.start),
            "allocations": [{"node": n, "gpus": g} for n, g in allocs.items()],
        }
        if r.end is not None:
            body["end"] = iso_at(r.end)
        client.post("/v1/runs", json=body).raise_for_status()


def report_progress(client: httpx.Client, fleet: Any, t: float) -> int:
    """Each started run's tokens so far, as its training loop reports them (``POST /v1/runs/{id}/progress``)."""
    done = fleet.run_progress()
    n = 0
    for r in fleet.plan.runs:
        if r.start <= t and (r.end is None or r.end >= t) and done[r.run_id]["tokens"] > 0:
            client.post(
                f"/v1/runs/{r.run_id}/progress",
                json={"time": iso_at(t), "tokens": int(done[r.run_id]["tokens"])},
            ).raise_for_status()
            n += 1
    return n


def backfill(
    collector_url: str,
    tokens: dict[str, str],
    fleet: Any,
    until: float,
    every_s: float = 30.0,
    progress: Callable[[float], Any] | None = None,
) -> int:
    """Ship the fleet's past telemetry through real ingest, as agents would have (and the runs' progress,
    every ``every_s`` of it, through ``progress``)."""
    from gpufleet.wire import encode

    pending: dict[str, dict[str, list[dict[str, Any]]]] = {n: {"gpu": [], "host": []} for n in fleet.nodes}
    seq = 0
    sent = 0
    last = fleet.t
    with httpx.Client(base_url=collector_url, timeout=30) as client:

        def ship() -> None:
            nonlocal seq, sent
            for node, rows in pending.items():
                if not rows["gpu"] and not rows["host"]:
                    continue
                seq += 1
                body, headers = encode(
                    {
                        "batch_id": f"demo-backfill:{node}:{seq}",
                        "node": node,
                        "gpu": rows["gpu"] or None,
                        "host": rows["host"] or None,
                        "facts": fleet.facts(node),
                    }
                )
                headers["Authorization"] = f"Bearer {tokens[node]}"
                client.post("/v1/ingest", content=body, headers=headers).raise_for_status()
                sent += len(rows["gpu"])
                rows["gpu"], rows["host"] = [], []

        while fleet.t < until:
            now = fleet.step()
            for node in fleet.nodes:
                if not fleet.node_up(node):
                    continue
                pending[node]["gpu"].extend({**row, "time": now} for row in fleet.gpu_rows(node))
                host = fleet.host_row(node)
                if host is not None:
                    pending[node]["host"].append({**host, "time": now})
            if now - last >= every_s:
                ship()
                if progress is not None:
                    progress(now)
                last = now
        ship()
        if progress is not None:
            progress(fleet.t)
    return sent


def power_cap_line(client: httpx.Client, run_id: str, max_loss: float = 0.1, wait_s: float = 20.0) -> str:
    """The advisor's proposal for one run, in a sentence (the minute rollups may still be catching up)."""
    deadline = time.monotonic() + wait_s
    while True:
        p = client.get(f"/v1/runs/{run_id}/power-cap", params={"max_throughput_loss": max_loss}).json()[
            "proposal"
        ]
        if (
            p.get("enough_data") and p.get("expected_saving", {}).get("gpu_kwh_per_day_saved") is not None
        ) or time.monotonic() >= deadline:
            break
        time.sleep(2.0)
    if not p.get("enough_data"):
        return f"power-cap advisor, {run_id}: {'; '.join(p.get('reasons') or ['no answer'])}"
    exp = p["expected_saving"]
    if p["action"] == "keep":
        return f"power-cap advisor, {run_id}: keep {p['current_limit_w']:g} W ({'; '.join(p['reasons'])})"
    cost = exp.get("cost_per_day_saved")
    money = f", {cost:.2f} {exp['currency']}" if cost is not None else ""
    return (
        f"power-cap advisor, {run_id}: cap its {p['gpus']} GPUs at {p['proposed_limit_w']:g} W (now "
        f"{p['current_limit_w']:g} W): {100 * p['energy_per_token_saving']:.1f} % less energy per token, "
        f"{100 * p['throughput_loss_vs_now']:.1f} % fewer tokens/s; saves {exp['facility_kwh_per_day_saved']:.1f}"
        f" kWh{money} a day, giving up at most {100 * max_loss:g} % of its throughput "
        f"(GET /v1/runs/{run_id}/power-cap?max_throughput_loss={max_loss:g})"
    )


class Summary:
    """The terminal view: incidents as they open/resolve, and a table of runs now and then."""

    def __init__(self, api_url: str, token: str, say: Callable[[str], None]) -> None:
        self.client = httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        self.say = lambda line: say(cut(line))
        self.open: dict[int, dict[str, Any]] = {}
        self.last_table = 0.0

    def poll(self, table_every_s: float = 30.0) -> None:
        try:
            incidents = self.client.get("/v1/incidents", params={"state": "open"}).json()
        except httpx.HTTPError as e:
            self.say(f"(API not answering: {e})")
            return
        now_open = {i["id"]: i for i in incidents}
        from gpufleet.api.web.cause import explain

        for iid, i in sorted(now_open.items()):
            if iid not in self.open:
                ex = explain(i)
                self.say(f"  + {i['kind']:<16} #{iid} {ex.title}: {ex.sentence}")
        for iid, i in self.open.items():
            if iid not in now_open:
                self.say(f"  - resolved {i['kind']} #{iid} {i['run_id'] or ''} {i['node'] or ''}")
        self.open = now_open
        if time.monotonic() - self.last_table >= table_every_s:
            self.last_table = time.monotonic()
            self.table()

    def table(self) -> None:
        try:
            runs = self.client.get("/v1/runs", params={"state": "running"}).json()
        except httpx.HTTPError:
            return
        self.say(f"{'run':<22}{'GPUs':>5}{'kWh':>9}{'cost':>14}{'kg CO2e':>9}  open incidents")
        for r in runs:
            acc: dict[str, Any] = {}
            with contextlib.suppress(httpx.HTTPError, ValueError):
                resp = self.client.get(f"/v1/runs/{r['run_id']}/accounting")
                if resp.status_code == 200:
                    acc = resp.json()
            kinds = sorted({i["kind"] for i in self.open.values() if i["run_id"] == r["run_id"]})
            self.say(
                f"{r['run_id']:<22}{r['gpu_count']:>5}{_fmt(acc.get('facility_kwh')):>9}"
                f"{_money(acc):>14}{_fmt(acc.get('co2e_kg')):>9}  {', '.join(kinds) or '-'}"
            )

    def close(self) -> None:
        self.client.close()


def _money(acc: dict[str, Any]) -> str:
    """Total cost with its currency, in the currency's minor units (``12.30 EUR``)."""
    if acc.get("total_cost") is None:
        return "-"
    places = int(acc.get("minor_units", 2))
    return f"{acc['total_cost']:,.{places}f} {acc.get('currency') or ''}".rstrip()


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


@contextlib.contextmanager
def _services(url: str, settings: Settings, opts: DemoOptions) -> Iterator[tuple[str, str, Any]]:
    from gpufleet.api.app import create_app as create_api
    from gpufleet.collector.service import build_collector, server_options
    from gpufleet.serverthread import ServerThread

    col = ServerThread(
        build_collector(url, settings), port=opts.collector_port or None, **server_options(settings)
    ).start()
    api_app = create_api(url, settings)
    api = ServerThread(api_app, port=opts.api_port or None).start()
    try:
        yield col.url, api.url, api_app
    finally:
        api.stop()
        col.stop()


def run_demo(
    settings: Settings, server_url: str, opts: DemoOptions, say: Callable[[str], None], stop: threading.Event
) -> DemoState:
    from gpufleet.agent.runtime import Agent
    from gpufleet.auth import create_token
    from gpufleet.db import migrate
    from gpufleet.sim import Fleet

    st = DemoState()
    url = fresh_database(server_url, opts.database)
    migrate.upgrade(url, settings)
    fleet = Fleet.from_scenario(opts.scenario, seed=opts.seed, start_time=time.time() - opts.backfill_s)
    with psycopg.connect(url, autocommit=True) as conn:
        for role in ("admin", "sre", "finance"):
            st.tokens[role] = create_token(conn, f"demo-{role}", role)
        for node in fleet.nodes:
            st.tokens[node] = create_token(conn, f"agent-{node}", "node", node)
    spool_root = settings.data_dir / "demo-spool"
    shutil.rmtree(spool_root, ignore_errors=True)
    reader = None
    if opts.reader_url:
        reader_role(url)
        reader = with_database(opts.reader_url, opts.database)
    with _services(url, settings, opts) as (collector_url, api_url, api_app):
        st.collector_url, st.api_url = collector_url, api_url
        with httpx.Client(
            base_url=api_url, headers={"Authorization": f"Bearer {st.tokens['admin']}"}, timeout=30
        ) as admin:
            register_fleet(admin, fleet)
        say(
            f"gpufleet demo: {len(fleet.nodes)} simulated nodes, {sum(len(n.gpu_idx) for n in fleet.plan.nodes.values())}"
            f" GPUs, {len(fleet.plan.runs)} runs (scenario '{opts.scenario}')"
        )
        say(f"  API        {api_url}/docs      web view {api_url}/")
        say(f"  collector  {collector_url}/metrics")
        say(f"  read token Authorization: Bearer {st.tokens['sre']}")
        say(f"  finance    Authorization: Bearer {st.tokens['finance']}")
        say(
            f"  e.g.       curl -H 'Authorization: Bearer {st.tokens['sre']}' {api_url}/v1/incidents?state=open"
        )
        say(
            f"  CLI        export GPUFLEET_DATABASE_URL='{url}'   (gpufleet commands here use it while the demo runs)"
        )
        if reader:
            say(
                "  Grafana    gpufleet dashboards push --grafana-url http://127.0.0.1:3000 --token <service token>"
            )
            say(f"             (data source {reader}: read-only, loopback only; docs/demo.md)")
        marker = settings.data_dir / DEMO_URL_FILE
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{url}\n{os.getpid()}\n{reader or ''}\n", encoding="utf-8")
        minutes = opts.backfill_s / 60
        api_app.state.web_notice = (
            f"The demo is back-filling the last {minutes:.0f} min of telemetry through "
            "ingest: pages show it as it arrives, and the fleet goes live in about a minute."
        )
        say(
            f"back-filling the last {minutes:.0f} min of telemetry through ingest (about a minute; the web view "
            "says so meanwhile) ..."
        )
        with httpx.Client(
            base_url=api_url, headers={"Authorization": f"Bearer {st.tokens['admin']}"}, timeout=30
        ) as admin:
            n = backfill(
                collector_url,
                st.tokens,
                fleet,
                time.time(),
                progress=lambda t: report_progress(admin, fleet, t),
            )
        api_app.state.web_notice = None
        say(f"back-filled {n} GPU samples ({minutes:.0f} min); starting one agent per node")
        fleet.follow(time.time)
        agents = []
        for node in fleet.nodes:
            a = AgentSettings(
                collector_url=collector_url,
                token=st.tokens[node],
                node=node,
                interval_s=1.0,
                ship_interval_s=5.0,
                metrics_port=0,
                sources=["sim"],
            )
            agent = Agent(
                a,
                fleet.sources_for(node),
                node=node,
                spool_dir=spool_root / node,
                facts_of_node=lambda node=node: fleet.facts(node),  # type: ignore[misc]
            )
            agent.start(serve_metrics=False)
            th = threading.Thread(target=agent.run, args=(stop,), name=f"agent-{node}", daemon=True)
            th.start()
            agents.append((agent, th))
        progress = threading.Thread(
            target=_progress_loop,
            args=(api_url, st.tokens["admin"], fleet, stop),
            name="demo-progress",
            daemon=True,
        )
        progress.start()
        with httpx.Client(
            base_url=api_url, headers={"Authorization": f"Bearer {st.tokens['sre']}"}, timeout=30
        ) as sre:
            try:
                say(power_cap_line(sre, "demo-sweep"))
            except (httpx.HTTPError, KeyError, ValueError) as e:
                say(f"power-cap advisor: no answer ({e})")
        say("incidents as they open (+) and resolve (-); a table of running runs every 30 s; Ctrl-C stops")
        summary = Summary(api_url, st.tokens["sre"], say)
        deadline = None if opts.duration_s is None else time.monotonic() + opts.duration_s
        try:
            while not stop.is_set():
                summary.poll()
                if deadline is not None and time.monotonic() >= deadline:
                    break
                stop.wait(opts.refresh_s)
        finally:
            stop.set()
            summary.close()
            marker.unlink(missing_ok=True)
            for agent, th in agents:
                th.join(5)
                agent.shutdown(ship_s=3.0)
    return st


def _progress_loop(
    api_url: str, token: str, fleet: Any, stop: threading.Event, every_s: float = 30.0
) -> None:
    """The live runs' training loops reporting their tokens every ``every_s``."""
    with httpx.Client(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
        while not stop.wait(every_s):
            try:
                report_progress(client, fleet, time.time())
            except httpx.HTTPError:
                continue  # the API is going away with the demo, or briefly busy: report at the next turn


def default_data_dir(settings: Settings) -> Path:
    return settings.data_dir
