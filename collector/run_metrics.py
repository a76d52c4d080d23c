"""gpufleet's per-run figures as Prometheus metrics, beside the operational ones on ``/metrics``.

Users who live in Prometheus and Grafana ask for energy and cost per job as
series they can graph, sum by team and alert on.  Per run (labels ``run``,
``team``, ``site``):

* ``gpufleet_run_energy_kwh_total``: facility energy (GPUs, the run's share of
  its hosts, times the site's PUE), kWh;
* ``gpufleet_run_cost_total{currency}``: energy plus compute cost, in the
  currency it was priced in (a run priced in two has two series);
* ``gpufleet_run_co2e_kg_total``: CO2e, kg (no series where it is unknown);
* ``gpufleet_run_gpu_seconds_total{state}``: GPU time by ledger state
  (``productive``, ``idle``, ``hung``, ``starved``, ``checkpoint``,
  ``straggler_wait``, ``throttled``: docs/contracts.md section 3.3); ``all``
  where the accounting gave no ledger.  In seconds, not the accounting's
  GPU-hours: Prometheus names a duration in its base unit (``promtool check
  metrics`` refuses ``_hours``); divide by 3600 for GPU-hours;
* ``gpufleet_run_goodput``: productive share of the GPU-hours, 0-1.

Per GPU, with ``run_metrics.per_gpu`` (labels ``node``, ``gpu`` and ``UUID``,
as dcgm-exporter's ``UUID``, to join its series): what dcgm-exporter does not
say, ``gpufleet_gpu_run_energy_kwh_total{run}`` (the GPU's board energy inside
the run's window, from the minute rollups: no host share, no PUE),
``gpufleet_gpu_incident_open{kind}`` (1 per open incident on the GPU), and
``gpufleet_gpu_run_info{run,team}`` (1 while a running run holds the GPU), to
put dcgm-exporter's series per run: ``DCGM_FI_DEV_GPU_UTIL * on(UUID)
group_left(run, team) gpufleet_gpu_run_info``.

They are figures of the accounting (``gpufleet.accounting``), which is far too
slow to run per scrape: the leader computes them every
``run_metrics.refresh_s`` and stores them (``run_metrics_snapshot``), and
every replica serves the last stored set (read at most every few seconds),
so the series are the same wherever a scrape lands.  Cardinality is bounded:
running runs and those ended within ``run_metrics.horizon_s``, at most
``run_metrics.max_runs`` (most recent first; the rest counted in
``gpufleet_run_metrics_omitted_runs``).

The ``*_total`` series are counters: they only grow while a run runs, but a
revision (samples that arrived late, GPU-time an incident found later moves
from ``productive`` to another state) can move one down, which ``rate()``
reads as a reset: graph them as values, not rates.  With ``metrics.redact``
run ids are not exported: the figures are summed per team and site.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from psycopg.types.json import Jsonb

from gpufleet.accounting import account_runs, load_runs
from gpufleet.config import RunMetricsSettings

log = logging.getLogger(__name__)

#: Runs exported: running (no end, or an end ahead), or ended within the horizon; newest first.
RUNS_SQL = """
SELECT run_id FROM runs
WHERE start <= %(now)s AND ("end" IS NULL OR "end" > %(now)s - make_interval(secs => %(horizon)s))
ORDER BY ("end" IS NULL OR "end" > %(now)s) DESC, COALESCE("end", %(now)s) DESC, start DESC, run_id
LIMIT %(limit)s"""

#: Each allocated GPU's board energy inside its run's window, from the minute rollups (share-weighted).
GPU_ENERGY_SQL = """
SELECT a.run_id, a.node, a.gpu, COALESCE(sum(e.energy_j), 0) * max(a.share) / 3.6e6 AS kwh
FROM run_allocations a JOIN runs r USING (run_id)
LEFT JOIN gpu_energy_1m e ON e.node = a.node AND e.gpu = a.gpu AND e.bucket >= r.start
     AND e.bucket < LEAST(COALESCE(r."end", %(now)s), %(now)s)
WHERE a.run_id = ANY(%(runs)s)
GROUP BY a.run_id, a.node, a.gpu"""

#: The GPUs running runs hold now.
GPU_RUNS_SQL = """
SELECT a.run_id, coalesce(r.team, ''), a.node, a.gpu FROM run_allocations a JOIN runs r USING (run_id)
WHERE r.start <= %(now)s AND (r."end" IS NULL OR r."end" > %(now)s) AND a.run_id = ANY(%(runs)s)"""

#: Open incidents on one GPU, by kind.
GPU_INCIDENTS_SQL = """
SELECT node, gpu, kind, count(*) FROM incidents
WHERE state = 'open' AND node IS NOT NULL AND gpu IS NOT NULL
GROUP BY node, gpu, kind"""

#: Each GPU's UUID as its node's facts name it.
UUIDS_SQL = """
SELECT n.node, (g->>'gpu')::int, g->>'uuid' FROM nodes n, jsonb_array_elements(
  CASE WHEN jsonb_typeof(n.facts->'gpus') = 'array' THEN n.facts->'gpus' ELSE '[]'::jsonb END) g
WHERE g->>'uuid' IS NOT NULL AND (g->>'gpu') ~ '^[0-9]{1,5}$'"""

STORE_SQL = """
INSERT INTO run_metrics_snapshot (id, computed_at, body) VALUES (1, %s, %s)
ON CONFLICT (id) DO UPDATE SET computed_at = EXCLUDED.computed_at, body = EXCLUDED.body"""

LOAD_SQL = "SELECT extract(epoch FROM computed_at), body FROM run_metrics_snapshot WHERE id = 1"


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def run_figures(body: dict[str, Any]) -> dict[str, Any]:
    """What is exported of one run's accounting body."""
    costs: dict[str, float] = {}
    by_currency = body.get("costs_by_currency")
    if isinstance(by_currency, dict) and by_currency:
        for cur, c in by_currency.items():
            total = _number(c.get("total_cost")) if isinstance(c, dict) else None
            if total is not None:
                costs[str(cur)] = total
    elif body.get("currency") is not None and _number(body.get("total_cost")) is not None:
        costs[str(body["currency"])] = float(body["total_cost"])
    hours: dict[str, float] = {}
    ledger = body.get("ledger")
    if isinstance(ledger, dict) and ledger:
        for state, line in ledger.items():
            h = _number(line.get("gpu_hours")) if isinstance(line, dict) else None
            if h is not None:
                hours[str(state)] = h * 3600.0
    elif _number(body.get("gpu_hours")) is not None:
        hours["all"] = float(body["gpu_hours"]) * 3600.0
    efficiency = body.get("efficiency")
    goodput = body.get("goodput")
    if goodput is None and isinstance(efficiency, dict):
        goodput = efficiency.get("goodput")
    return {
        "run": body["run_id"],
        "team": body.get("team") or "",
        "site": body.get("site") or "",
        "energy_kwh": _number(body.get("facility_kwh")),
        "costs": costs,
        "co2e_kg": _number(body.get("co2e_kg")),
        "gpu_seconds": hours,
        "goodput": _number(goodput),
    }


def compute(
    conn: psycopg.Connection, settings: RunMetricsSettings, now: datetime, max_gap_s: float | None = None
) -> dict[str, Any]:
    """The snapshot: every exported run's figures, and per GPU when ``settings.per_gpu``."""
    ids = [
        r[0]
        for r in conn.execute(
            RUNS_SQL, {"now": now, "horizon": settings.horizon_s, "limit": settings.max_runs + 1}
        ).fetchall()
    ]
    omitted = 0
    if len(ids) > settings.max_runs:
        omitted = (
            int(
                conn.execute(
                    'SELECT count(*) FROM runs WHERE start <= %(now)s AND ("end" IS NULL OR "end" > %(now)s - '
                    "make_interval(secs => %(horizon)s))",
                    {"now": now, "horizon": settings.horizon_s},
                ).fetchone()[0]  # type: ignore[index]
            )
            - settings.max_runs
        )
        ids = ids[: settings.max_runs]
    runs = load_runs(conn, ids)
    bodies = account_runs(conn, runs, now=now, max_gap_s=max_gap_s) if runs else []
    out: dict[str, Any] = {"runs": [run_figures(dict(b)) for b in bodies], "omitted": omitted}
    if settings.per_gpu:
        uuids = {(n, g): u for n, g, u in conn.execute(UUIDS_SQL).fetchall()}
        out["gpu_energy"] = [
            {"run": r, "node": n, "gpu": g, "uuid": uuids.get((n, g), ""), "kwh": float(kwh)}
            for r, n, g, kwh in conn.execute(GPU_ENERGY_SQL, {"now": now, "runs": ids}).fetchall()
        ]
        out["gpu_incidents"] = [
            {"node": n, "gpu": g, "uuid": uuids.get((n, g), ""), "kind": k, "open": int(c)}
            for n, g, k, c in conn.execute(GPU_INCIDENTS_SQL).fetchall()
        ]
        out["gpu_runs"] = [
            {"run": r, "team": t, "node": n, "gpu": g, "uuid": uuids.get((n, g), "")}
            for r, t, n, g in conn.execute(GPU_RUNS_SQL, {"now": now, "runs": ids}).fetchall()
        ]
    return out


def store(conn: psycopg.Connection, snapshot: dict[str, Any], at: datetime) -> None:
    conn.execute(STORE_SQL, (at, Jsonb(snapshot)))


class RunMetricsRefresher:
    """Recomputes the snapshot every ``refresh_s`` on the replica that leads (``is_leader``)."""

    def __init__(
        self,
        url: str,
        settings: RunMetricsSettings,
        is_leader: Callable[[], bool],
        max_gap_s: float | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.url = url
        self.settings = settings
        self.is_leader = is_leader
        self.max_gap_s = max_gap_s
        self.clock = clock
        self.refreshed = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self, conn: psycopg.Connection) -> dict[str, Any]:
        now = self.clock()
        snap = compute(conn, self.settings, now, self.max_gap_s)
        store(conn, snap, now)
        self.refreshed += 1
        return snap

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-run-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        due = 0.0
        while not self._stop.wait(min(1.0, self.settings.refresh_s)):
            if not self.is_leader() or time.monotonic() < due:
                continue
            t0 = time.monotonic()
            due = t0 + self.settings.refresh_s
            try:
                with psycopg.connect(
                    self.url, autocommit=True, connect_timeout=3, application_name="gpufleet-run-metrics"
                ) as conn:
                    self.refresh(conn)
                self.last_error = None
            except psycopg.Error as e:
                self.last_error = f"{e.__class__.__name__}: {e}"
                log.warning("run metrics: refresh failed (%s); the last snapshot stays", self.last_error)
            if time.monotonic() - t0 > self.settings.refresh_s:
                log.warning(
                    "run metrics: computing took %.0f s, longer than run_metrics.refresh_s",
                    time.monotonic() - t0,
                )


class RunMetrics(Collector):
    """The stored snapshot as metric families; read from the database at most every ``cache_s``."""

    def __init__(
        self, url: str, *, redact: bool = False, cache_s: float = 5.0, statement_timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self.redact = redact
        self.cache_s = cache_s
        self.statement_timeout_s = statement_timeout_s
        self._at = -1e9
        self._snapshot: dict[str, Any] = {}
        self._computed_at: float | None = None

    def _load(self) -> dict[str, Any]:
        if time.monotonic() - self._at > self.cache_s:
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    conn.execute(
                        "SELECT set_config('statement_timeout', %s, false)",
                        (f"{self.statement_timeout_s * 1000:.0f}",),
                    )
                    row = conn.execute(LOAD_SQL).fetchone()
                if row is not None:
                    self._computed_at, self._snapshot = float(row[0]), row[1]
            except psycopg.Error as e:
                log.warning(
                    "run metrics: cannot read the snapshot (%s); serving the last one", e.__class__.__name__
                )
            self._at = time.monotonic()
        return self._snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self._load()
        runs = snap.get("runs") or []
        keys = ["run", "team", "site"]
        if self.redact:  # no run ids: per team and site
            runs = _summed(runs)
        energy = CounterMetricFamily(
            "gpufleet_run_energy_kwh", "Run's facility energy (GPUs, host share, times PUE), kWh", labels=keys
        )
        cost = CounterMetricFamily(
            "gpufleet_run_cost", "Run's energy plus compute cost, in its currency", labels=[*keys, "currency"]
        )
        co2e = CounterMetricFamily("gpufleet_run_co2e_kg", "Run's CO2e, kg", labels=keys)
        seconds = CounterMetricFamily(
            "gpufleet_run_gpu_seconds",
            "Run's GPU time by ledger state (docs/contracts.md "
            "3.3; all where no ledger was computed), GPU-seconds",
            labels=[*keys, "state"],
        )
        goodput = GaugeMetricFamily(
            "gpufleet_run_goodput", "Run's productive share of its GPU-hours, 0-1", labels=keys
        )
        for r in runs:
            lv = [r["run"], r["team"], r["site"]]
            if r.get("energy_kwh") is not None:
                energy.add_metric(lv, r["energy_kwh"])
            for cur, total in (r.get("costs") or {}).items():
                cost.add_metric([*lv, cur], total)
            if r.get("co2e_kg") is not None:
                co2e.add_metric(lv, r["co2e_kg"])
            for state, h in (r.get("gpu_seconds") or {}).items():
                seconds.add_metric([*lv, state], h)
            if r.get("goodput") is not None:
                goodput.add_metric(lv, r["goodput"])
        yield from (energy, cost, co2e, seconds, goodput)
        exported = GaugeMetricFamily("gpufleet_run_metrics_runs", "Runs the gpufleet_run_* series cover")
        exported.add_metric([], len(snap.get("runs") or []))
        yield exported
        omitted = GaugeMetricFamily(
            "gpufleet_run_metrics_omitted_runs",
            "Runs within run_metrics.horizon_s left out by run_metrics.max_runs",
        )
        omitted.add_metric([], float(snap.get("omitted") or 0))
        yield omitted
        age = GaugeMetricFamily(
            "gpufleet_run_metrics_age_seconds", "Seconds since the run figures were computed"
        )
        if self._computed_at is not None:
            age.add_metric([], max(0.0, time.time() - self._computed_at))
        yield age
        if "gpu_energy" in snap:
            gkeys = ["node", "gpu", "UUID"]
            ge = CounterMetricFamily(
                "gpufleet_gpu_run_energy_kwh",
                "GPU board energy inside the window of the run "
                "that holds it (minute rollups; no host share, no PUE), kWh",
                labels=[*gkeys, "run"],
            )
            if self.redact:
                summed: dict[tuple[str, ...], float] = defaultdict(float)
                for e in snap["gpu_energy"]:
                    summed[(e["node"], str(e["gpu"]), e["uuid"], "")] += e["kwh"]
                for k, v in summed.items():
                    ge.add_metric(list(k), v)
            else:
                for e in snap["gpu_energy"]:
                    ge.add_metric([e["node"], str(e["gpu"]), e["uuid"], e["run"]], e["kwh"])
            yield ge
            gi = GaugeMetricFamily(
                "gpufleet_gpu_incident_open", "Open incidents on the GPU, by kind", labels=[*gkeys, "kind"]
            )
            for i in snap.get("gpu_incidents") or []:
                gi.add_metric([i["node"], str(i["gpu"]), i["uuid"], i["kind"]], i["open"])
            yield gi
            held = GaugeMetricFamily(
                "gpufleet_gpu_run_info",
                "1 while a running run holds the GPU (join dcgm-exporter's series on UUID)",
                labels=[*gkeys, "run", "team"],
            )
            for h in snap.get("gpu_runs") or []:
                held.add_metric(
                    [h["node"], str(h["gpu"]), h["uuid"], "" if self.redact else h["run"], h["team"]], 1
                )
            yield held


def _summed(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs' figures added up per (team, site), with an empty run label."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in runs:
        t = out.setdefault(
            (r["team"], r["site"]),
            {
                "run": "",
                "team": r["team"],
                "site": r["site"],
                "energy_kwh": None,
                "costs": {},
                "co2e_kg": None,
                "gpu_seconds": {},
                "goodput": None,
            },
        )
        for key in ("energy_kwh", "co2e_kg"):
            if r.get(key) is not None:
                t[key] = (t[key] or 0.0) + r[key]
        for cur, v in (r.get("costs") or {}).items():
            t["costs"][cur] = t["costs"].get(cur, 0.0) + v
        for state, h in (r.get("gpu_seconds") or {}).items():
            t["gpu_seconds"][state] = t["gpu_seconds"].get(state, 0.0) + h
    for t in out.values():
        total = sum(t["gpu_seconds"].values())
        if total > 0 and "productive" in t["gpu_seconds"]:
            t["goodput"] = t["gpu_seconds"]["productive"] / total
    return list(out.values())
