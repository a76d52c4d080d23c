"""Quarantine hooks: take a node with a critical hardware incident out of scheduling.

Off by default (settings ``quarantine``).  After each sweep the leader looks
at the open incidents and, for each critical one of the configured kinds on a
node, drains the node in Slurm (``scontrol update nodename=N state=drain
reason=...``) or cordons it in Kubernetes (a strategic-merge PATCH of the
Node: ``spec.unschedulable: true`` plus an annotation with the reason, with
the service account's token and CA).  In dry-run mode the action is only
logged.  Either way what was done, when and with what result is appended to
the incident's ``actions``; that record, in the database, is what makes the
hook idempotent across sweeps and leader changes:

* an incident whose node was drained or cordoned (or dry-run) is not acted on
  again; another incident on a node already quarantined is recorded as
  ``skipped`` once;
* a failed action is retried after ``retry_after_s``, at most ``max_attempts``
  times;
* at most ``max_nodes_per_hour`` nodes are quarantined per hour fleet-wide:
  beyond that the incident is recorded ``rate_limited`` (once) and acted on
  when the budget allows.

Never acted on: warnings (GPU-scoped or not), kinds not configured, and a
repeated-XID ``host_misconfig`` whose XIDs are all the application's own
(:func:`gpufleet.xid.hardware`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import httpx
import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from gpufleet.collector.scheduler import (
    ACTED,
    DETAIL_CHARS,
    DONE,
    DRY_RUN,
    FAILED,
    RATE_LIMITED,
    SKIPPED,
    KubernetesApi,
    Outcome,
    iso,
    retry_due,
    run_command,
)
from gpufleet.config import QuarantineSettings
from gpufleet.evidence import read_evidence
from gpufleet.wire import NODE_RE
from gpufleet.xid import hardware

log = logging.getLogger(__name__)

__all__ = [
    "DETAIL_CHARS",
    "DONE",
    "DRY_RUN",
    "FAILED",
    "K8S_ANNOTATION",
    "QUARANTINED",
    "QUARANTINE_ACTIONS",
    "RATE_LIMITED",
    "SKIPPED",
    "KubernetesCordon",
    "Outcome",
    "Quarantine",
    "SlurmDrain",
    "backend_for",
]

#: ``done`` and ``dry_run`` count as quarantined.
QUARANTINED = ACTED
#: Annotation a cordon sets on the Node with the reason.
K8S_ANNOTATION = "gpufleet.io/quarantine-reason"

CANDIDATES_SQL = """
SELECT id, kind, node, gpu, run_id, cause, severity, evidence, actions
FROM incidents
WHERE state = 'open' AND severity = 'critical' AND node IS NOT NULL AND kind = ANY(%s)
ORDER BY start, id
"""

#: Nodes quarantined (or dry-run) since a time, from every incident's record: the rate budget.
RECENT_SQL = """
SELECT DISTINCT a->>'target'
FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a
WHERE jsonb_typeof(i.actions) = 'array' AND a->>'action' = %s AND a->>'result' = ANY(%s)
  AND (a->>'time')::timestamptz >= %s
"""

#: Nodes an open incident has quarantined: another incident there has nothing to add.  A
#: resolved incident's quarantine does not count (the node may be back in service).
HELD_SQL = """
SELECT a->>'target', min(i.id)
FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a
WHERE i.state = 'open' AND jsonb_typeof(i.actions) = 'array' AND a->>'action' = %s AND a->>'result' = ANY(%s)
GROUP BY 1
"""


class Backend(Protocol):
    #: Name of the action in the incident's record (``slurm_drain``, ``k8s_cordon``).
    action: str

    def call(self, node: str, reason: str) -> dict[str, Any]:
        """What ``apply`` would do, for the record and for dry runs."""

    def apply(self, node: str, reason: str) -> Outcome: ...


class SlurmDrain:
    """``scontrol update nodename=N state=drain reason=R``: running jobs finish, no new ones start."""

    action = "slurm_drain"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    def command(self, node: str, reason: str) -> list[str]:
        return [self.scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]

    def call(self, node: str, reason: str) -> dict[str, Any]:
        return {"command": self.command(node, reason)}

    def apply(self, node: str, reason: str) -> Outcome:
        return run_command(self.command(node, reason), self.timeout_s, "drained", "quarantine.scontrol")


class KubernetesCordon:
    """PATCH the Node: ``spec.unschedulable: true`` (what ``kubectl cordon`` does), with the reason."""

    action = "k8s_cordon"

    def __init__(self, api_url: str, token_file: Path, ca_file: Path | None, timeout_s: float = 30.0,
                 client: httpx.Client | None = None) -> None:
        self.api = KubernetesApi(api_url, token_file, ca_file, timeout_s, client)

    def path(self, node: str) -> str:
        return f"/api/v1/nodes/{quote(node, safe='')}"

    def url(self, node: str) -> str:
        return self.api.api_url + self.path(node)

    @staticmethod
    def body(reason: str) -> dict[str, Any]:
        return {"spec": {"unschedulable": True}, "metadata": {"annotations": {K8S_ANNOTATION: reason}}}

    def call(self, node: str, reason: str) -> dict[str, Any]:
        return {"request": f"PATCH {self.url(node)}", "body": self.body(reason)}

    def apply(self, node: str, reason: str) -> Outcome:
        return self.api.patch(self.path(node), self.body(reason), "application/strategic-merge-patch+json",
                              "cordoned (spec.unschedulable = true)")


#: The actions this hook records (the run actions of gpufleet.collector.actions record others).
QUARANTINE_ACTIONS = (SlurmDrain.action, KubernetesCordon.action)


def backend_for(settings: QuarantineSettings) -> Backend:
    if settings.backend == "slurm":
        return SlurmDrain(settings.scontrol, settings.command_timeout_s)
    return KubernetesCordon(settings.k8s_api_url, settings.k8s_token_file, settings.k8s_ca_file,
                            settings.command_timeout_s)


def qualifies(incident: dict[str, Any], kinds: Sequence[str]) -> bool:
    """A critical incident of a configured kind on a node, caused by the hardware."""
    if incident["severity"] != "critical" or incident["kind"] not in kinds or not incident["node"]:
        return False
    if incident["kind"] == "host_misconfig":
        codes = read_evidence("host_misconfig", incident.get("evidence")).get("xid_codes") or []
        return incident["cause"] == "repeated_xid" and any(hardware(c) for c in codes)
    return True


def reason_for(incident: dict[str, Any]) -> str:
    where = f" GPU {incident['gpu']}" if incident.get("gpu") is not None else ""
    return f"gpufleet {incident['kind']} {incident['cause'] or ''}{where} (incident {incident['id']})".replace("  ", " ")


class Quarantine:
    """Applies the hooks after a sweep; see the module docstring for the rules."""

    def __init__(self, settings: QuarantineSettings, backend: Backend | None = None) -> None:
        self.settings = settings
        self.backend = backend if backend is not None else backend_for(settings)

    def run(self, conn: psycopg.Connection, now: float) -> list[dict[str, Any]]:
        """Act on the open incidents at sweep time ``now``; returns the records appended."""
        s = self.settings
        action = self.backend.action
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(CANDIDATES_SQL, (list(s.kinds),)).fetchall()
        rows = [r for r in rows if qualifies(r, s.kinds)]
        if not rows:
            return []
        since = datetime.fromtimestamp(now - 3600.0, UTC)
        nodes_this_hour = {r[0] for r in conn.execute(RECENT_SQL, (action, list(QUARANTINED), since)).fetchall()}
        quarantined_by = {n: i for n, i in conn.execute(HELD_SQL, (action, list(QUARANTINED))).fetchall()}
        out = []
        for inc in rows:
            mine = [a for a in inc["actions"] or [] if isinstance(a, dict) and a.get("action") == action]
            if any(a.get("result") in QUARANTINED for a in mine):
                continue
            node = str(s.node_names.get(inc["node"], inc["node"]))
            record = self._decide(inc, node, mine, now, nodes_this_hour, quarantined_by)
            if record is None:
                continue
            conn.execute("UPDATE incidents SET actions = actions || %s WHERE id = %s", (Jsonb([record]), inc["id"]))
            out.append(record)
            if record["result"] in QUARANTINED:
                nodes_this_hour.add(node)
                quarantined_by[node] = inc["id"]
        return out

    def _decide(self, inc: dict[str, Any], node: str, mine: list[dict[str, Any]], now: float,
                nodes_this_hour: set[str], quarantined_by: dict[str, int]) -> dict[str, Any] | None:
        s = self.settings
        base = {"action": self.backend.action, "target": node, "time": iso(now), "dry_run": s.dry_run}
        last = mine[-1] if mine else None
        if node in quarantined_by:
            if last is not None and last.get("result") == SKIPPED:
                return None
            return {**base, "result": SKIPPED,
                    "detail": f"node {node} already quarantined for incident {quarantined_by[node]}"}
        if not NODE_RE.fullmatch(node):
            if last is not None and last.get("result") == FAILED:
                return None
            return {**base, "result": FAILED, "detail": f"node name {node!r} is not a host name; not passed on"}
        if not retry_due(mine, now, s.retry_after_s, s.max_attempts):
            return None
        if len(nodes_this_hour) >= s.max_nodes_per_hour:
            if last is not None and last.get("result") == RATE_LIMITED:
                return None
            return {**base, "result": RATE_LIMITED,
                    "detail": f"{len(nodes_this_hour)} nodes quarantined in the last hour "
                              f"(max_nodes_per_hour {s.max_nodes_per_hour}); retried when the budget allows"}
        reason = reason_for(inc)
        if s.dry_run:
            call = self.backend.call(node, reason)
            log.warning("quarantine (dry run): would %s %s: %s; %s", self.backend.action, node, reason, call)
            return {**base, "result": DRY_RUN, "detail": f"dry run: would {self.backend.action} {node}",
                    "reason": reason, **call}
        outcome = self.backend.apply(node, reason)
        (log.warning if outcome.result == DONE else log.error)(
            "quarantine: %s %s for incident %s: %s (%s)", self.backend.action, node, inc["id"], outcome.result,
            outcome.detail)
        return {**base, "result": outcome.result, "detail": outcome.detail, "reason": reason, **outcome.call}

