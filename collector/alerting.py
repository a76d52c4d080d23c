"""Open incidents as alerts: Prometheus metrics and Alertmanager's v2 API.

Every replica exports the open incidents it reads from the database (not from
the leader's memory), so a scrape of any collector gives the same answer.
The leader also pushes alerts straight to Alertmanager: open incidents are
re-sent each sweep (Alertmanager expires alerts that stop arriving), and a
resolved incident is sent once more with its ``endsAt``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpufleet.collector.actions import RUN_ACTIONS
from gpufleet.collector.incident_series import IDENTITY, identity, incident_families
from gpufleet.collector.quarantine import QUARANTINE_ACTIONS

log = logging.getLogger(__name__)

OPEN_INCIDENTS_SQL = (
    "SELECT id, kind, run_id, node, gpu, cause, severity, start, evidence, "
    "(SELECT r.team FROM runs r WHERE r.run_id = incidents.run_id) AS team FROM incidents WHERE state = 'open'"
)
#: Per node: when its last batch arrived (the "agent silent" alert) and samples refused for clock skew.
NODES_SQL = "SELECT node, extract(epoch FROM last_seen), rejected_skew FROM nodes WHERE last_seen IS NOT NULL"
#: Numeric evidence exported per open incident, so alert rules can threshold it
#: (e.g. checkpoint stalls costing more than a share of run time).
EVIDENCE_FIELDS = (
    "gpu_time_lost_share",
    "run_time_lost_share",
    "throttled_share",
    "degraded_share",
    "links_down",
    "errors_per_min",
    "sbe_per_h",
    "pcie_replays_per_min",
)
#: The latest quarantine attempt of each action on each open incident (``incidents.actions``).
QUARANTINE_SQL = (
    "SELECT DISTINCT ON (i.id, a->>'action') i.kind, i.node, a->>'action', a->>'result' "
    "FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a "
    "WHERE i.state = 'open' AND jsonb_typeof(i.actions) = 'array' AND a->>'action' = ANY(%s) "
    "ORDER BY i.id, a->>'action', a->>'time' DESC"
)
#: The latest run action of each open incident (gpufleet.collector.actions).
RUN_ACTIONS_SQL = (
    "SELECT DISTINCT ON (i.id, a->>'action') i.kind, i.run_id, a->>'action', a->>'result' "
    "FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a "
    "WHERE i.state = 'open' AND jsonb_typeof(i.actions) = 'array' AND a->>'action' = ANY(%s) "
    "ORDER BY i.id, a->>'action', a->>'time' DESC"
)


def _label(v: Any) -> str:
    return "" if v is None else str(v)


def listed_gpus(node: Any, gpu: Any, evidence: Any) -> list[tuple[Any, Any, dict[str, Any]]]:
    """(node, gpu, evidence) per GPU an incident is about: each GPU its ``evidence.gpus`` lists (with
    that GPU's own evidence), else the incident's own node and GPU."""
    ev = evidence if isinstance(evidence, dict) else {}
    gpus = ev.get("gpus") if gpu is None else None
    if isinstance(gpus, list):
        out = [(g.get("node"), g.get("gpu"), g) for g in gpus if isinstance(g, dict)]
        if out:
            return out
    return [(node, gpu, ev)]


class IncidentMetrics(Collector):
    """``gpufleet_incident_open{kind,run_id,node,gpu,cause,severity} 1`` per open incident (per GPU of one
    that lists its GPUs in ``evidence.gpus``), and ``gpufleet_incident_run{kind,incident_id,run_id,run_team,
    cause,severity} 1`` once per open run-scoped incident, for alerts that name the incident and the run's team."""

    def __init__(
        self, url: str, cache_s: float = 5.0, redact: bool = False, statement_timeout_s: float = 5.0
    ) -> None:
        self.url = url
        self.cache_s = cache_s
        self.statement_timeout_s = statement_timeout_s
        #: Leave run ids and evidence out: ``run_id`` is empty (series that then coincide are one,
        #: value 1) and no ``gpufleet_incident_evidence`` is exported.
        self.redact = redact
        self._at = 0.0
        self._rows: list[tuple[Any, ...]] = []
        self._nodes: list[tuple[Any, ...]] = []
        self._quarantine: list[tuple[Any, ...]] = []
        self._run_actions: list[tuple[Any, ...]] = []
        self._up = 1.0

    def _rows_now(self) -> list[tuple[Any, ...]]:
        if time.monotonic() - self._at > self.cache_s:
            try:
                with psycopg.connect(self.url, connect_timeout=2, autocommit=True) as conn:
                    # A scrape is answered within its timeout or not at all; a locked table
                    # must not hold it (and the thread that renders /metrics) for good.
                    conn.execute(
                        "SELECT set_config('statement_timeout', %s, false)",
                        (f"{self.statement_timeout_s * 1000:.0f}",),
                    )
                    self._rows = conn.execute(OPEN_INCIDENTS_SQL).fetchall()
                    self._nodes = conn.execute(NODES_SQL).fetchall()
                    self._quarantine = conn.execute(QUARANTINE_SQL, (list(QUARANTINE_ACTIONS),)).fetchall()
                    self._run_actions = conn.execute(RUN_ACTIONS_SQL, (list(RUN_ACTIONS),)).fetchall()
                self._up = 1.0
            except psycopg.Error:
                self._up = 0.0  # keep the last known set; report that it is stale
            self._at = time.monotonic()
        return self._rows

    def collect(self) -> Iterator[Metric]:
        rows = self._rows_now()
        g = GaugeMetricFamily(
            "gpufleet_incident_open",
            "Open incidents (one series per incident, value 1)",
            labels=["kind", "run_id", "node", "gpu", "cause", "severity"],
        )
        ev = GaugeMetricFamily(
            "gpufleet_incident_evidence",
            "Numeric evidence of open incidents, by field",
            labels=["kind", "run_id", "node", "gpu", "field"],
        )
        # run-scoped incidents once each, with the run's team, for rules that select by run (the shipped
        # rules read gpufleet_incident, which has every incident once)
        per_run = GaugeMetricFamily(
            "gpufleet_incident_run",
            "Open run-scoped incidents, one series per incident (value 1), with the run's team",
            labels=["kind", "incident_id", "run_id", "run_team", "cause", "severity"],
        )
        shown: set[tuple[str, ...]] = set()
        for id_, kind, run_id, node, gpu, cause, severity, _start, evidence, team in rows:
            if run_id is not None and not self.redact:
                per_run.add_metric([kind, str(id_), run_id, _label(team), _label(cause), severity], 1.0)
            # an incident listing GPUs (a run's GPUs throttled for one reason) is a series per GPU, so rules
            # and boards that read node and gpu keep seeing each one
            for node_, gpu_, ev_ in listed_gpus(node, gpu, evidence):
                labels = (
                    kind,
                    "" if self.redact else _label(run_id),
                    _label(node_),
                    _label(gpu_),
                    _label(cause),
                    severity,
                )
                if labels not in shown:
                    shown.add(labels)
                    g.add_metric(list(labels), 1.0)
                if self.redact:
                    continue
                for f in EVIDENCE_FIELDS:
                    v = ev_.get(f)
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        ev.add_metric([kind, _label(run_id), _label(node_), _label(gpu_), f], float(v))
        yield g
        yield from incident_families(rows, self.redact)
        if not self.redact:
            yield ev
            yield per_run
        q = GaugeMetricFamily(
            "gpufleet_incident_quarantine",
            "Latest quarantine action on a node for an open incident (value 1; result done, "
            "dry_run or failed)",
            labels=["kind", "node", "action", "result"],
        )
        for kind, node, action, result in self._quarantine:
            q.add_metric([kind, _label(node), _label(action), _label(result)], 1.0)
        yield q
        if not self.redact:
            ra = GaugeMetricFamily(
                "gpufleet_incident_run_action",
                "Latest run action (requeue, cancel, annotate, notify) for an open incident "
                "(value 1; result done, dry_run, failed, skipped or rate_limited)",
                labels=["kind", "run_id", "action", "result"],
            )
            for kind, run_id, action, result in self._run_actions:
                ra.add_metric([kind, _label(run_id), _label(action), _label(result)], 1.0)
            yield ra
        seen = GaugeMetricFamily(
            "gpufleet_node_last_seen_timestamp_seconds",
            "When the collector last stored a batch from the node (any replica)",
            labels=["node"],
        )
        skew = CounterMetricFamily(
            "gpufleet_node_rejected_skew_samples",
            "Samples of the node refused for clock skew, all replicas",
            labels=["node"],
        )
        for node, last_seen, rejected in self._nodes:
            seen.add_metric([node], float(last_seen))
            skew.add_metric([node], float(rejected))
        yield seen
        yield skew
        yield GaugeMetricFamily(
            "gpufleet_incidents_fresh",
            "1 when the open-incident set was read from the database on the last scrape",
            value=self._up,
        )


def alertname(kind: str) -> str:
    return "Gpufleet" + "".join(p.capitalize() for p in kind.split("_"))


def to_alert(row: dict[str, Any], ends_at: datetime | None = None) -> dict[str, Any]:
    """The Alertmanager alert of an incident: labelled as the rules label theirs (what stays fixed while it is
    open: id, kind, run, the run's team, node and GPU), so a severity or cause that moves never starts a new
    alert; severity and cause are annotations."""
    ident = identity(
        row["id"],
        row["kind"],
        row.get("run_id"),
        row.get("team"),
        row.get("node"),
        row.get("gpu"),
        row.get("evidence"),
    )
    labels = {
        "alertname": alertname(row["kind"]),
        "source": "gpufleet",
        **{k: v for k, v in zip(IDENTITY, ident, strict=True) if v},
    }
    scope = row.get("run_id") or f"{row.get('node')}/{row.get('gpu')}"
    listed = listed_gpus(row.get("node"), row.get("gpu"), row.get("evidence"))
    lists = listed[0][2] is not row.get("evidence")  # the incident names its GPUs in evidence.gpus
    gpus = {"gpus": ", ".join(f"{n}/{g}" for n, g, _ in listed)} if lists else {}
    alert: dict[str, Any] = {
        "labels": labels,
        "annotations": {
            **gpus,
            "summary": f"{row['kind'].replace('_', ' ')} on {scope}"
            + (f" (cause: {row['cause']})" if row.get("cause") else ""),
            "evidence": json.dumps(row.get("evidence") or {}, sort_keys=True, default=str),
            "incident_id": str(row["id"]),
            "severity": str(row.get("severity") or "warning"),
            **({"cause": str(row["cause"])} if row.get("cause") else {}),
        },
        "startsAt": row["start"].astimezone(UTC).isoformat(),
    }
    if ends_at is not None:
        alert["endsAt"] = ends_at.astimezone(UTC).isoformat()
    return alert


class AlertmanagerPusher:
    def __init__(self, base_url: str, timeout_s: float = 5.0) -> None:
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self.client = httpx.Client(timeout=timeout_s)
        self.failures = 0

    def push(self, alerts: list[dict[str, Any]]) -> bool:
        if not alerts:
            return True
        try:
            r = self.client.post(self.url, json=alerts)
            r.raise_for_status()
            return True
        except httpx.HTTPError as e:
            self.failures += 1
            log.warning("Alertmanager push failed: %s", e)
            return False

    def sync(
        self,
        conn: psycopg.Connection,
        resolved_ids: Iterable[int],
        owns: Callable[[str | None, str | None], bool] | None = None,
    ) -> bool:
        """Send every open incident, and the ones just resolved with endsAt.

        ``owns(run_id, node)``: send only the open incidents it accepts (a sweep shard's: each
        shard re-sends its own, so Alertmanager gets every alert once a sweep interval, not once
        per shard)."""
        cols = ["id", "kind", "run_id", "node", "gpu", "cause", "severity", "start", "evidence", "team"]
        current = [dict(zip(cols, r, strict=True)) for r in conn.execute(OPEN_INCIDENTS_SQL).fetchall()]
        alerts = [to_alert(r) for r in current if owns is None or owns(r["run_id"], r["node"])]
        ids = list(resolved_ids)
        if ids:
            rows = conn.execute(
                "SELECT id, kind, run_id, node, gpu, cause, severity, start, evidence, "
                '(SELECT r.team FROM runs r WHERE r.run_id = incidents.run_id), "end" FROM incidents '
                "WHERE id = ANY(%s)",
                (ids,),
            ).fetchall()
            alerts += [to_alert(dict(zip(cols, r[:-1], strict=True)), ends_at=r[-1]) for r in rows]
        return self.push(alerts)

    def close(self) -> None:
        self.client.close()
