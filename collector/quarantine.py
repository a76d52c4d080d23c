"""Quarantine that closes the loop: take a failing node out of scheduling, and put it back once it passes.

On by default in dry run (settings ``quarantine``): every action is worked
out, logged and recorded, and none is taken until ``dry_run`` is turned off.
After each sweep the leader looks at each node's **triggers**:

* open incidents of the configured kinds on the node (``kinds``: critical
  ones; ``warning_kinds``: warnings too, a degraded PCIe link by default),
  a repeated-XID ``host_misconfig`` only when an XID points at the hardware
  (:func:`gpufleet.xid.hardware`);
* failed node checks of the configured names in the node's facts
  (``checks``: the PCIe link, NVLink, hardware clock slowdowns, hardware
  XIDs in the kernel log, DCGM's diagnostic, InfiniBand ports), as the agent
  reports them (:mod:`gpufleet.agent.diagnose`).

A node with a trigger is quarantined: drained in Slurm (``scontrol update
nodename=N state=drain reason=...``: running jobs finish, no new ones
start) or, in Kubernetes, cordoned and tainted
(``spec.unschedulable: true`` and a ``NoSchedule`` taint
``gpufleet.io/quarantine``, the other taints kept, with the reason as an
annotation).  A quarantined node whose triggers have all cleared is
released after ``hold_down_s`` of passing (``state=resume``, which Slurm is
only asked for while the node's drain reason is still gpufleet's; uncordon
and the taint removed), and a trigger that comes back in the hold-down
starts it again.  Only nodes gpufleet quarantined are ever released.

Every action, taken, dry-run, refused or failed, goes to ``quarantine_log``
(the node page and ``GET /v1/nodes/{node}/quarantine`` show it), and the
node's state to ``node_quarantine``; an incident that triggered a
quarantine also gets the record on its ``actions`` (what its page, the API
and the Prometheus series show), and another incident on a node already
held gets a ``skipped`` record once.  What is in the database is what makes
the hooks idempotent across sweeps and leader changes:

* a failed action is retried after ``retry_after_s``, at most
  ``max_attempts`` times per episode;
* at most ``max_nodes_per_hour`` nodes are quarantined per hour fleet-wide:
  beyond that the node waits (``rate_limited``, logged once) until the
  budget allows.
"""

from __future__ import annotations

import logging
import re
import ssl
from collections.abc import Mapping, Sequence
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
    retry_due,
    run_command,
)
from gpufleet.config import QuarantineSettings
from gpufleet.evidence import read_evidence
from gpufleet.timeparse import at, iso, iso_at
from gpufleet.wire import NODE_RE
from gpufleet.xid import hardware

log = logging.getLogger(__name__)

__all__ = [
    "DETAIL_CHARS",
    "DONE",
    "DRY_RUN",
    "FAILED",
    "K8S_ANNOTATION",
    "K8S_TAINT",
    "QUARANTINED",
    "QUARANTINE_ACTIONS",
    "RATE_LIMITED",
    "SKIPPED",
    "KubernetesCordon",
    "Outcome",
    "Quarantine",
    "SlurmDrain",
    "Trigger",
    "backend_for",
]

#: ``done`` and ``dry_run`` count as quarantined (or released).
QUARANTINED = ACTED
#: Annotation a cordon sets on the Node with the reason, and the taint it adds.
K8S_ANNOTATION = "gpufleet.io/quarantine-reason"
K8S_TAINT = "gpufleet.io/quarantine"
#: Released is recorded with this result when the scheduler's hold is not gpufleet's any more.
NOT_OURS = "not_ours"

CANDIDATES_SQL = """
SELECT id, kind, node, gpu, run_id, cause, severity, evidence, actions
FROM incidents
WHERE state = 'open' AND node IS NOT NULL AND kind = ANY(%s)
ORDER BY start, id
"""

#: Failed node checks of the given names, per node, from the agents' node facts.
CHECKS_SQL = """
SELECT n.node, c->>'check', c->>'subject', c->>'finding'
FROM nodes n CROSS JOIN LATERAL jsonb_array_elements(
  CASE WHEN jsonb_typeof(n.facts->'checks') = 'array' THEN n.facts->'checks' ELSE '[]'::jsonb END) c
WHERE c->>'status' = 'fail' AND c->>'check' = ANY(%s)
ORDER BY n.node, c->>'check', c->>'subject'
"""

STATES_SQL = """
SELECT node, state, backend, target, dry_run, reason, triggers, since, passing_since
FROM node_quarantine
"""

#: Nodes quarantined (or dry-run) since a time: the rate budget.
RECENT_SQL = """
SELECT DISTINCT node FROM quarantine_log
WHERE action = ANY(%s) AND result = ANY(%s) AND time >= %s
"""

#: The attempts at one action on one node since its last success (the retry rule's records).
ATTEMPTS_SQL = """
SELECT result, time FROM quarantine_log
WHERE node = %s AND action = %s AND time > coalesce(
  (SELECT max(time) FROM quarantine_log WHERE node = %s AND result = ANY(%s)), '-infinity')
ORDER BY time
"""

LOG_SQL = """
INSERT INTO quarantine_log (node, time, action, result, dry_run, reason, triggers, detail, call)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)
"""

UPSERT_STATE_SQL = """
INSERT INTO node_quarantine (node, state, backend, target, dry_run, reason, triggers, since, passing_since, updated_at)
VALUES (%(node)s, %(state)s, %(backend)s, %(target)s, %(dry_run)s, %(reason)s, %(triggers)s, %(since)s,
        %(passing_since)s, %(now)s)
ON CONFLICT (node) DO UPDATE SET state = EXCLUDED.state, backend = EXCLUDED.backend, target = EXCLUDED.target,
  dry_run = EXCLUDED.dry_run, reason = EXCLUDED.reason, triggers = EXCLUDED.triggers, since = EXCLUDED.since,
  passing_since = EXCLUDED.passing_since, updated_at = EXCLUDED.updated_at
"""


class Trigger(dict[str, Any]):
    """What holds a node: ``{"source": "incident", "kind", "cause", "id", "gpu", "severity"}`` or
    ``{"source": "check", "check", "subject", "finding"}``."""

    def label(self) -> str:
        if self["source"] == "incident":
            where = f" GPU {self['gpu']}" if self.get("gpu") is not None else ""
            return f"{self['kind']} {self.get('cause') or ''}{where} (incident {self['id']})".replace(
                "  ", " "
            )
        return f"check {self['check']} failed on {self['subject']}"


class Backend(Protocol):
    #: Names of the actions in the records (``slurm_drain``/``slurm_resume``, ``k8s_cordon``/``k8s_uncordon``).
    action: str
    release_action: str

    def call(self, node: str, reason: str) -> dict[str, Any]:
        """What ``apply`` would do, for the record and for dry runs."""

    def apply(self, node: str, reason: str) -> Outcome: ...

    def release_call(self, node: str) -> dict[str, Any]: ...

    def release(self, node: str) -> Outcome:
        """Put the node back; ``NOT_OURS`` when the scheduler's hold is not gpufleet's any more."""
        ...


class SlurmDrain:
    """``scontrol update nodename=N state=drain reason=R``: running jobs finish, no new ones start."""

    action = "slurm_drain"
    release_action = "slurm_resume"

    def __init__(self, scontrol: str = "scontrol", timeout_s: float = 30.0) -> None:
        self.scontrol = scontrol
        self.timeout_s = timeout_s

    def command(self, node: str, reason: str) -> list[str]:
        return [self.scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]

    def call(self, node: str, reason: str) -> dict[str, Any]:
        return {"command": self.command(node, reason)}

    def apply(self, node: str, reason: str) -> Outcome:
        return run_command(self.command(node, reason), self.timeout_s, "drained", "quarantine.scontrol")

    def release_command(self, node: str) -> list[str]:
        return [self.scontrol, "update", f"nodename={node}", "state=resume"]

    def release_call(self, node: str) -> dict[str, Any]:
        return {"command": self.release_command(node)}

    def release(self, node: str) -> Outcome:
        shown = run_command([self.scontrol, "show", "node", node], self.timeout_s, "", "quarantine.scontrol")
        if shown.result != DONE:
            return Outcome(FAILED, f"reading the node's state first: {shown.detail}", shown.call)
        m = re.search(r"\bReason=(.*?)(?:\s+\[|\s*$)", shown.detail, re.MULTILINE)
        if m and not m.group(1).startswith("gpufleet"):
            # Drained again since, by someone else and for their reason: theirs to resume.
            return Outcome(
                NOT_OURS,
                f"drained for another reason now (Reason={m.group(1)[:200]}); left as it is",
                self.release_call(node),
            )
        return run_command(self.release_command(node), self.timeout_s, "resumed", "quarantine.scontrol")


class NodeApi(KubernetesApi):
    """The Kubernetes API with a GET, to read a Node's taints before changing them."""

    def get(self, path: str) -> tuple[dict[str, Any] | None, str]:
        """The object as JSON, or None and why."""
        try:
            token = self.token_file.read_text().strip()
        except OSError as e:
            return None, f"cannot read the service account token {self.token_file}: {e.strerror or e}"
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        url = self.api_url + path
        try:
            if self._client is not None:
                r = self._client.get(url, headers=headers, timeout=self.timeout_s)
            else:
                try:
                    verify = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
                except (OSError, ssl.SSLError) as e:
                    return None, f"cannot load the CA {self.ca_file}: {e}"
                with httpx.Client(verify=verify, timeout=self.timeout_s) as c:
                    r = c.get(url, headers=headers)
        except (httpx.HTTPError, ssl.SSLError) as e:
            return None, f"API server unreachable: {type(e).__name__}: {e}"[:DETAIL_CHARS]
        if r.status_code != 200:
            try:
                msg = str(r.json().get("message") or r.text)
            except ValueError:
                msg = r.text
            return None, f"HTTP {r.status_code}: {msg}"[:DETAIL_CHARS]
        try:
            doc = r.json()
        except ValueError:
            return None, "the API server's answer is not JSON"
        return (doc, "") if isinstance(doc, dict) else (None, "the API server's answer is not an object")


def _taint_value(text: str) -> str:
    """A label value (at most 63 characters of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    v = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    return v or "failing"


class KubernetesCordon:
    """Cordon (``spec.unschedulable``, what ``kubectl cordon`` does) and taint the Node, with the reason.

    Node taints are an atomic list in the API: the Node is read first and the whole list written back with
    gpufleet's taint added (or removed) and the others untouched, under the Node's ``resourceVersion``, so a
    concurrent change fails the PATCH (retried at the next sweep) instead of being overwritten."""

    action = "k8s_cordon"
    release_action = "k8s_uncordon"

    def __init__(
        self,
        api_url: str,
        token_file: Path,
        ca_file: Path | None,
        timeout_s: float = 30.0,
        client: httpx.Client | None = None,
        taint: bool = True,
        taint_effect: str = "NoSchedule",
    ) -> None:
        self.api = NodeApi(api_url, token_file, ca_file, timeout_s, client)
        self.taint = taint
        self.taint_effect = taint_effect

    def path(self, node: str) -> str:
        return f"/api/v1/nodes/{quote(node, safe='')}"

    def url(self, node: str) -> str:
        return self.api.api_url + self.path(node)

    def body(
        self,
        reason: str,
        taints: Sequence[Mapping[str, Any]] | None = None,
        resource_version: str | None = None,
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {"annotations": {K8S_ANNOTATION: reason}}
        spec: dict[str, Any] = {"unschedulable": True}
        if taints is not None:
            spec["taints"] = [
                *(t for t in taints if t.get("key") != K8S_TAINT),
                {
                    "key": K8S_TAINT,
                    "value": _taint_value(reason.split(" (")[0].removeprefix("gpufleet ")),
                    "effect": self.taint_effect,
                },
            ]
        if resource_version is not None:
            meta["resourceVersion"] = resource_version
        return {"spec": spec, "metadata": meta}

    def call(self, node: str, reason: str) -> dict[str, Any]:
        return {"request": f"PATCH {self.url(node)}", "body": self.body(reason, [] if self.taint else None)}

    def _read(self, node: str) -> tuple[list[dict[str, Any]], str | None, str | None]:
        doc, why = self.api.get(self.path(node))
        if doc is None:
            return [], None, why
        taints = [t for t in (doc.get("spec") or {}).get("taints") or [] if isinstance(t, dict)]
        return taints, (doc.get("metadata") or {}).get("resourceVersion"), None

    def apply(self, node: str, reason: str) -> Outcome:
        taints: list[dict[str, Any]] | None = None
        version = None
        if self.taint:
            taints, version, why = self._read(node)
            if why is not None:
                return Outcome(FAILED, f"reading the node's taints first: {why}", self.call(node, reason))
        return self.api.patch(
            self.path(node),
            self.body(reason, taints, version),
            "application/strategic-merge-patch+json",
            "cordoned (spec.unschedulable = true)" + (f", tainted {K8S_TAINT}" if self.taint else ""),
        )

    def release_body(
        self, taints: Sequence[Mapping[str, Any]] | None, resource_version: str | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "spec": {"unschedulable": False},
            "metadata": {"annotations": {K8S_ANNOTATION: None}},
        }
        if taints is not None:
            body["spec"]["taints"] = [t for t in taints if t.get("key") != K8S_TAINT]
        if resource_version is not None:
            body["metadata"]["resourceVersion"] = resource_version
        return body

    def release_call(self, node: str) -> dict[str, Any]:
        return {
            "request": f"PATCH {self.url(node)}",
            "body": self.release_body([] if self.taint else None, None),
        }

    def release(self, node: str) -> Outcome:
        taints, version, why = self._read(node)
        if why is not None:
            return Outcome(FAILED, f"reading the node first: {why}", self.release_call(node))
        return self.api.patch(
            self.path(node),
            self.release_body(taints, version),
            "application/strategic-merge-patch+json",
            "uncordoned" + (f", taint {K8S_TAINT} removed" if self.taint else ""),
        )


#: The actions this hook records (the run actions of gpufleet.collector.actions record others).
QUARANTINE_ACTIONS = (SlurmDrain.action, KubernetesCordon.action)
RELEASE_ACTIONS = (SlurmDrain.release_action, KubernetesCordon.release_action)


def backend_for(settings: QuarantineSettings) -> Backend:
    if settings.backend == "slurm":
        return SlurmDrain(settings.scontrol, settings.command_timeout_s)
    return KubernetesCordon(
        settings.k8s_api_url,
        settings.k8s_token_file,
        settings.k8s_ca_file,
        settings.command_timeout_s,
        taint=settings.k8s_taint,
    )


def qualifies(incident: Mapping[str, Any], settings: QuarantineSettings) -> bool:
    """An open incident of a configured kind on a node, of a severity that counts, caused by the hardware."""
    kind = incident["kind"]
    if not incident["node"] or kind not in (*settings.kinds, *settings.warning_kinds):
        return False
    if incident["severity"] != "critical" and kind not in settings.warning_kinds:
        return False
    if kind == "host_misconfig":
        codes = read_evidence("host_misconfig", incident.get("evidence")).get("xid_codes") or []
        return incident["cause"] == "repeated_xid" and any(hardware(c) for c in codes)
    return True


def reason_for(triggers: Sequence[Trigger]) -> str:
    first = triggers[0].label()
    more = f" and {len(triggers) - 1} more" if len(triggers) > 1 else ""
    return f"gpufleet {first}{more}"


class Quarantine:
    """Applies the hooks after a sweep; see the module docstring for the rules."""

    def __init__(self, settings: QuarantineSettings, backend: Backend | None = None) -> None:
        self.settings = settings
        self.backend = backend if backend is not None else backend_for(settings)

    # -- what holds each node ------------------------------------------------------------------

    def triggers(self, conn: psycopg.Connection) -> tuple[dict[str, list[Trigger]], list[dict[str, Any]]]:
        """Triggers per scheduler node name, and the qualifying incidents (for their records)."""
        s = self.settings
        out: dict[str, list[Trigger]] = {}
        with conn.cursor(row_factory=dict_row) as cur:
            incidents = [
                r
                for r in cur.execute(CANDIDATES_SQL, (list({*s.kinds, *s.warning_kinds}),)).fetchall()
                if qualifies(r, s)
            ]
        for inc in incidents:
            node = self.target(inc["node"])
            out.setdefault(node, []).append(
                Trigger(
                    source="incident",
                    kind=inc["kind"],
                    cause=inc["cause"],
                    id=inc["id"],
                    gpu=inc["gpu"],
                    severity=inc["severity"],
                )
            )
        if s.checks:
            for node, check, subject, finding in conn.execute(CHECKS_SQL, (list(s.checks),)).fetchall():
                out.setdefault(self.target(node), []).append(
                    Trigger(source="check", check=check, subject=subject, finding=(finding or "")[:300])
                )
        return out, incidents

    def target(self, node: str) -> str:
        return str(self.settings.node_names.get(node, node))

    # -- one sweep -----------------------------------------------------------------------------

    def run(self, conn: psycopg.Connection, now: float) -> list[dict[str, Any]]:
        """Quarantine and release at sweep time ``now``; returns the records logged."""
        triggers, incidents = self.triggers(conn)
        with conn.cursor(row_factory=dict_row) as cur:
            states = {r["node"]: r for r in cur.execute(STATES_SQL).fetchall()}
        since = at(now - 3600.0)
        this_hour = {
            r[0]
            for r in conn.execute(RECENT_SQL, (list(QUARANTINE_ACTIONS), list(QUARANTINED), since)).fetchall()
        }
        out: list[dict[str, Any]] = []
        by_node_incidents: dict[str, list[dict[str, Any]]] = {}
        for inc in incidents:
            by_node_incidents.setdefault(self.target(inc["node"]), []).append(inc)
        for node in sorted(triggers):
            state = states.get(node)
            # A dry-run quarantine holds nothing once dry runs are off: the node is then acted on for real.
            held = (
                state is not None
                and state["state"] == "quarantined"
                and (self.settings.dry_run or not state["dry_run"])
            )
            if held:
                assert state is not None
                self._still_held(conn, state, triggers[node], now)
                out += self._skip_records(conn, node, by_node_incidents.get(node, []), state, now)
                continue
            record = self._quarantine(conn, node, triggers[node], now, this_hour)
            if record is None:
                continue
            out.append(record)
            self._incident_records(conn, node, by_node_incidents.get(node, []), record, now)
            if record["result"] in QUARANTINED:
                this_hour.add(node)
        for node, state in sorted(states.items()):
            if state["state"] == "quarantined" and node not in triggers:
                record = self._passing(conn, state, now)
                if record is not None:
                    out.append(record)
        return out

    # -- quarantine ----------------------------------------------------------------------------

    def _log(
        self,
        conn: psycopg.Connection,
        node: str,
        now: float,
        action: str,
        result: str,
        reason: str | None,
        triggers: Sequence[Mapping[str, Any]],
        detail: str,
        call: Mapping[str, Any],
    ) -> dict[str, Any]:
        dry = result == DRY_RUN
        conn.execute(
            LOG_SQL,
            (
                node,
                at(now),
                action,
                result,
                dry,
                reason,
                Jsonb([dict(t) for t in triggers]),
                detail[:DETAIL_CHARS],
                Jsonb(dict(call)),
            ),
        )
        return {
            "action": action,
            "target": node,
            "time": iso_at(now),
            "result": result,
            "dry_run": dry,
            "reason": reason,
            "detail": detail[:DETAIL_CHARS],
            "triggers": [dict(t) for t in triggers],
            **dict(call),
        }

    def _attempts(self, conn: psycopg.Connection, node: str, action: str) -> list[dict[str, Any]]:
        return [
            {"result": r, "time": iso(t)}
            for r, t in conn.execute(ATTEMPTS_SQL, (node, action, node, list(QUARANTINED))).fetchall()
        ]

    def _quarantine(
        self, conn: psycopg.Connection, node: str, triggers: list[Trigger], now: float, this_hour: set[str]
    ) -> dict[str, Any] | None:
        s, action = self.settings, self.backend.action
        reason = reason_for(triggers)
        attempts = self._attempts(conn, node, action)
        last = attempts[-1]["result"] if attempts else None
        if not NODE_RE.fullmatch(node):
            if last == FAILED:
                return None
            return self._log(
                conn,
                node,
                now,
                action,
                FAILED,
                reason,
                triggers,
                f"node name {node!r} is not a host name; not passed on",
                {},
            )
        if not retry_due(attempts, now, s.retry_after_s, s.max_attempts):
            return None
        if len(this_hour) >= s.max_nodes_per_hour:
            if last == RATE_LIMITED:
                return None
            return self._log(
                conn,
                node,
                now,
                action,
                RATE_LIMITED,
                reason,
                triggers,
                f"{len(this_hour)} nodes quarantined in the last hour (max_nodes_per_hour "
                f"{s.max_nodes_per_hour}); acted on when the budget allows",
                {},
            )
        if s.dry_run:
            call = self.backend.call(node, reason)
            log.info("quarantine (dry run): would %s %s: %s; %s", action, node, reason, call)
            record = self._log(
                conn, node, now, action, DRY_RUN, reason, triggers, f"dry run: would {action} {node}", call
            )
        else:
            outcome = self.backend.apply(node, reason)
            (log.warning if outcome.result == DONE else log.error)(
                "quarantine: %s %s (%s): %s (%s)", action, node, reason, outcome.result, outcome.detail
            )
            record = self._log(
                conn, node, now, action, outcome.result, reason, triggers, outcome.detail, outcome.call
            )
        if record["result"] in QUARANTINED:
            conn.execute(
                UPSERT_STATE_SQL,
                {
                    "node": node,
                    "state": "quarantined",
                    "backend": self.settings.backend,
                    "target": node,
                    "dry_run": record["dry_run"],
                    "reason": reason,
                    "triggers": Jsonb([dict(t) for t in triggers]),
                    "since": at(now),
                    "passing_since": None,
                    "now": at(now),
                },
            )
        return record

    def _incident_records(
        self,
        conn: psycopg.Connection,
        node: str,
        incidents: list[dict[str, Any]],
        record: dict[str, Any],
        now: float,
    ) -> None:
        """The quarantine's record on the first incident behind it; ``skipped`` on the others."""
        if not incidents:
            return
        first, *rest = incidents
        conn.execute(
            "UPDATE incidents SET actions = actions || %s WHERE id = %s", (Jsonb([record]), first["id"])
        )
        if record["result"] in QUARANTINED:
            for inc in rest:
                self._skip(conn, inc, node, f"incident {first['id']}", now)

    def _skip(
        self, conn: psycopg.Connection, inc: Mapping[str, Any], node: str, holder: str, now: float
    ) -> None:
        mine = [
            a for a in inc["actions"] or [] if isinstance(a, dict) and a.get("action") == self.backend.action
        ]
        if mine and mine[-1].get("result") in (SKIPPED, *QUARANTINED):
            return
        rec = {
            "action": self.backend.action,
            "target": node,
            "time": iso_at(now),
            "dry_run": self.settings.dry_run,
            "result": SKIPPED,
            "detail": f"node {node} already quarantined for {holder}",
        }
        conn.execute("UPDATE incidents SET actions = actions || %s WHERE id = %s", (Jsonb([rec]), inc["id"]))

    def _skip_records(
        self,
        conn: psycopg.Connection,
        node: str,
        incidents: list[dict[str, Any]],
        state: Mapping[str, Any],
        now: float,
    ) -> list[dict[str, Any]]:
        holder = next((Trigger(t).label() for t in state["triggers"] or []), "an earlier trigger")
        for inc in incidents:
            self._skip(conn, inc, node, holder, now)
        return []

    def _still_held(
        self, conn: psycopg.Connection, state: Mapping[str, Any], triggers: list[Trigger], now: float
    ) -> None:
        conn.execute(
            "UPDATE node_quarantine SET triggers = %s, passing_since = NULL, updated_at = %s WHERE node = %s",
            (Jsonb([dict(t) for t in triggers]), at(now), state["node"]),
        )

    # -- release -------------------------------------------------------------------------------

    def _passing(
        self, conn: psycopg.Connection, state: Mapping[str, Any], now: float
    ) -> dict[str, Any] | None:
        """A held node with no trigger: start or continue its hold-down, and release it at its end."""
        s, node = self.settings, state["node"]
        if state["passing_since"] is None:
            conn.execute(
                "UPDATE node_quarantine SET passing_since = %s, updated_at = %s WHERE node = %s",
                (at(now), at(now), node),
            )
            return None
        passing_s = now - state["passing_since"].timestamp()
        if not s.release or passing_s < s.hold_down_s:
            return None
        action = self.backend.release_action
        attempts = self._attempts(conn, node, action)
        if not retry_due(attempts, now, s.retry_after_s, s.max_attempts):
            return None
        reason = f"passed for {passing_s:.0f} s (hold-down {s.hold_down_s:g} s) after: {state['reason']}"
        triggers = list(state["triggers"] or [])
        if state["dry_run"] or s.dry_run:
            call = self.backend.release_call(node)
            log.info("quarantine (dry run): would %s %s: %s", action, node, reason)
            record = self._log(
                conn, node, now, action, DRY_RUN, reason, triggers, f"dry run: would {action} {node}", call
            )
        else:
            outcome = self.backend.release(node)
            (log.warning if outcome.result in (DONE, NOT_OURS) else log.error)(
                "quarantine: %s %s: %s (%s)", action, node, outcome.result, outcome.detail
            )
            record = self._log(
                conn, node, now, action, outcome.result, reason, triggers, outcome.detail, outcome.call
            )
        if record["result"] in (*QUARANTINED, NOT_OURS):
            conn.execute(
                "UPDATE node_quarantine SET state = 'released', updated_at = %s WHERE node = %s",
                (at(now), node),
            )
        return record


def node_log(conn: psycopg.Connection, node: str, limit: int = 50) -> list[dict[str, Any]]:
    """The node's quarantine actions, newest first (for its page and the API)."""
    with conn.cursor(row_factory=dict_row) as cur:
        rows = cur.execute(
            "SELECT time, action, result, dry_run, reason, triggers, detail, call FROM quarantine_log "
            "WHERE node = %s ORDER BY time DESC, id DESC LIMIT %s",
            (node, limit),
        ).fetchall()
    for r in rows:
        r["time"] = iso(r["time"])
    return rows


def node_state(conn: psycopg.Connection, node: str) -> dict[str, Any] | None:
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute(STATES_SQL + " WHERE node = %s", (node,)).fetchone()
    if row is None:
        return None
    for k in ("since", "passing_since"):
        row[k] = iso(row[k]) if row[k] is not None else None
    return row
