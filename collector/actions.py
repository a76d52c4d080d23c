"""Run actions: requeue, cancel or annotate a run that holds GPUs without using them (off by default).

Settings ``actions`` (:class:`gpufleet.config.RunActionSettings`).  After each sweep the leader looks at
the open ``idle_allocation`` and ``hung_collective`` incidents and, for each kind given an action, acts
on the incident's run:

* ``notify``: no scheduler action, the record only (the alerts ``GpufleetIdleAllocation`` and
  ``GpufleetHungCollective`` notify the run's owners);
* Slurm ``requeue`` (``scontrol requeue <job>``: the job goes back to the queue and restarts from its
  last checkpoint) or ``cancel`` (``scancel <job>``), the job id being the run's ``slurm.job_id``
  label, else its run id less ``slurm_run_prefix`` when that is a job id (as the deploy/slurm prolog
  registers runs);
* Kubernetes ``annotate``: a merge patch of ``metadata.annotations["gpufleet.io/<kind>"]`` with the
  reason on the run's owner (its PyTorchJob, JobSet, RayJob, Job... or its pod, as attribution
  labelled the run: ``k8s.namespace``, ``k8s.kind``, ``k8s.name``), for the job's controller or an
  admission policy to act on.

A scheduler action is taken only for runs allow-listed by ``teams`` or (Slurm) ``partitions`` (the
run's ``slurm.partition`` label, else ``scontrol show job``'s answer), only
``wait_s`` after the incident opened, never on a run that has ended, and with ``dry_run`` (the default)
only logged and recorded.  The record, appended to the incident's ``actions`` as the quarantine hooks'
are (:mod:`gpufleet.collector.quarantine`, sharing :mod:`gpufleet.collector.scheduler`), says what was
(or would have been) run, when, the result, who decided (``by``: this collector and the setting) and
why (``reason``); it is what keeps the actions idempotent across sweeps and leader changes:

* an incident acted on (``done`` or ``dry_run``) is not acted on again; another incident of a run
  already acted on is recorded ``skipped`` once;
* a failed action is retried after ``retry_after_s``, at most ``max_attempts`` times;
* at most ``max_per_hour`` runs are acted on per hour fleet-wide: beyond that the incident is
  recorded ``rate_limited`` (once) and acted on when the budget allows.
"""

from __future__ import annotations

import logging
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from gpufleet.collector.scheduler import (
    ACTED,
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
from gpufleet.config import RunActionSettings
from gpufleet.timeparse import iso, iso_at

log = logging.getLogger(__name__)

#: The action each setting records (``notify`` acts on nothing).
ACTION_NAMES = {
    "notify": "notify",
    "requeue": "slurm_requeue",
    "cancel": "slurm_cancel",
    "annotate": "k8s_annotate",
}
RUN_ACTIONS = tuple(ACTION_NAMES.values())
#: Actions that change something in a scheduler: these are rate-limited and hold a run.
SCHEDULER_ACTIONS = ("slurm_requeue", "slurm_cancel", "k8s_annotate")
#: A Slurm job id: a job, an array task (``123_4``) or a heterogeneous job component (``123+1``).
SLURM_JOB_RE = re.compile(r"[0-9]{1,12}(?:_[0-9]{1,9}|\+[0-9]{1,4})?")
#: Owner kinds attribution labels runs with (agent/k8s/runs.py), and where their objects live.
K8S_RESOURCES: dict[str, str] = {
    "Pod": "v1/pods",
    "Job": "batch/v1/jobs",
    "JobSet": "jobset.x-k8s.io/v1alpha2/jobsets",
    "TrainJob": "trainer.kubeflow.org/v1alpha1/trainjobs",
    "PyTorchJob": "kubeflow.org/v1/pytorchjobs",
    "TFJob": "kubeflow.org/v1/tfjobs",
    "MPIJob": "kubeflow.org/v1/mpijobs",
    "XGBoostJob": "kubeflow.org/v1/xgboostjobs",
    "PaddleJob": "kubeflow.org/v1/paddlejobs",
    "JAXJob": "kubeflow.org/v1/jaxjobs",
    "RayJob": "ray.io/v1/rayjobs",
}
#: The partition in ``scontrol show job -o``'s one line.
PARTITION_RE = re.compile(r"(?:^|\s)Partition=(\S+)")
K8S_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")

CANDIDATES_SQL = """
SELECT i.id, i.kind, i.run_id, i.cause, i.start, i.evidence, i.actions, r.team, r.labels, r."end" AS run_end
FROM incidents i JOIN runs r ON r.run_id = i.run_id
WHERE i.state = 'open' AND i.kind = ANY(%s)
ORDER BY i.start, i.id
"""

#: Runs acted on (or dry-run) since a time: the rate budget.
RECENT_SQL = """
SELECT DISTINCT a->>'run_id'
FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a
WHERE jsonb_typeof(i.actions) = 'array' AND a->>'action' = ANY(%s) AND a->>'result' = ANY(%s)
  AND (a->>'time')::timestamptz >= %s
"""

#: Runs an open incident has acted on: another incident of the run has nothing to add.
HELD_SQL = """
SELECT a->>'run_id', min(i.id)
FROM incidents i CROSS JOIN LATERAL jsonb_array_elements(i.actions) a
WHERE i.state = 'open' AND jsonb_typeof(i.actions) = 'array' AND a->>'action' = ANY(%s) AND a->>'result' = ANY(%s)
GROUP BY 1
"""


@dataclass(frozen=True)
class Target:
    """What an action applies to: a Slurm job or a Kubernetes object (its API path)."""

    text: str
    job: str | None = None
    path: str | None = None


def slurm_job(run_id: str, labels: Mapping[str, Any], prefix: str) -> str | None:
    """The Slurm job id of a run: its ``slurm.job_id`` label, else its id less ``prefix`` when that is one."""
    job = labels.get("slurm.job_id")
    if isinstance(job, str) and SLURM_JOB_RE.fullmatch(job):
        return job
    if run_id.startswith(prefix) and SLURM_JOB_RE.fullmatch(run_id[len(prefix) :]):
        return run_id[len(prefix) :]
    return None


def k8s_path(labels: Mapping[str, Any], resources: Mapping[str, str]) -> tuple[str | None, str]:
    """(API path of the run's owner, what it is) from attribution's labels; path None with the reason."""
    ns, kind, name = (labels.get(k) for k in ("k8s.namespace", "k8s.kind", "k8s.name"))
    if not (isinstance(ns, str) and isinstance(kind, str) and isinstance(name, str)):
        return None, "the run has no Kubernetes owner (labels k8s.namespace, k8s.kind, k8s.name)"
    if not (K8S_NAME_RE.fullmatch(ns) and K8S_NAME_RE.fullmatch(name)):
        return None, f"{kind} {ns}/{name} is not a Kubernetes object name"
    where = resources.get(kind) or K8S_RESOURCES.get(kind)
    if where is None:
        return None, f"no API path known for kind {kind} (set actions.k8s_resources.{kind})"
    parts = where.split("/")
    plural = quote(parts[-1], safe="")
    if len(parts) == 2:
        return f"/api/{parts[0]}/namespaces/{ns}/{plural}/{name}", f"{kind} {ns}/{name}"
    return f"/apis/{'/'.join(parts[:-1])}/namespaces/{ns}/{plural}/{name}", f"{kind} {ns}/{name}"


def annotation(kind: str) -> str:
    return "gpufleet.io/" + kind.replace("_", "-")


def reason_for(inc: Mapping[str, Any]) -> str:
    cause = f" ({inc['cause']})" if inc.get("cause") else ""
    start = iso(inc["start"], "seconds")
    return f"gpufleet {inc['kind']}{cause}: run {inc['run_id']} since {start} (incident {inc['id']})"


class RunActions:
    """Applies the run actions after a sweep; see the module docstring for the rules."""

    def __init__(
        self, settings: RunActionSettings, kubernetes: KubernetesApi | None = None, by: str | None = None
    ) -> None:
        self.settings = settings
        self.kube = (
            kubernetes
            if kubernetes is not None
            else KubernetesApi(
                settings.k8s_api_url,
                settings.k8s_token_file,
                settings.k8s_ca_file,
                settings.command_timeout_s,
            )
        )
        self.by = by if by is not None else f"gpufleet collector {socket.gethostname()}"
        #: Slurm job -> (partition or None, why unknown), asked of scontrol once per job per sweep.
        self._partitions: dict[str, tuple[str | None, str]] = {}

    def run(self, conn: psycopg.Connection, now: float) -> list[dict[str, Any]]:
        """Act on the open incidents at sweep time ``now``; returns the records appended."""
        s = self.settings
        with conn.cursor(row_factory=dict_row) as cur:
            rows = cur.execute(CANDIDATES_SQL, (list(s.kinds),)).fetchall()
        if not rows:
            return []
        self._partitions = {}
        since = datetime.fromtimestamp(now - 3600.0, UTC)
        acted_runs = {
            r[0] for r in conn.execute(RECENT_SQL, (list(SCHEDULER_ACTIONS), list(ACTED), since)).fetchall()
        }
        held = {r: i for r, i in conn.execute(HELD_SQL, (list(SCHEDULER_ACTIONS), list(ACTED))).fetchall()}
        out = []
        for inc in rows:
            policy = s.kinds[inc["kind"]]
            action = ACTION_NAMES[policy]
            mine = [a for a in inc["actions"] or [] if isinstance(a, dict) and a.get("action") == action]
            if any(a.get("result") in ACTED for a in mine):
                continue
            if inc["run_end"] is not None and inc["run_end"].timestamp() <= now:
                continue  # the run has ended: nothing to act on (its incident resolves)
            if now - inc["start"].timestamp() < s.wait_s:
                continue
            record = self._decide(inc, policy, action, mine, now, acted_runs, held)
            if record is None:
                continue
            conn.execute(
                "UPDATE incidents SET actions = actions || %s WHERE id = %s", (Jsonb([record]), inc["id"])
            )
            out.append(record)
            if record["result"] in ACTED and action in SCHEDULER_ACTIONS:
                acted_runs.add(inc["run_id"])
                held[inc["run_id"]] = inc["id"]
        return out

    def _partition(self, inc: Mapping[str, Any]) -> tuple[str | None, str]:
        """(the run's Slurm partition, or None with why it is unknown): its ``slurm.partition`` label, else
        what ``scontrol show job`` says of its job."""
        s = self.settings
        labels = inc["labels"] if isinstance(inc["labels"], dict) else {}
        label = labels.get("slurm.partition")
        if isinstance(label, str):
            return label, ""
        job = slurm_job(inc["run_id"], labels, s.slurm_run_prefix)
        if job is None:
            return None, "no Slurm job id"
        if job not in self._partitions:
            got = run_command(
                [s.scontrol, "show", "job", "-o", job], s.command_timeout_s, "", "actions.scontrol"
            )
            found = PARTITION_RE.search(got.output) if got.result == DONE else None
            self._partitions[job] = (
                (found.group(1), "") if found else (None, got.detail or "no Partition= in its answer")
            )
        return self._partitions[job]

    def _allowed(self, inc: Mapping[str, Any]) -> tuple[str | None, str]:
        """(what allow-lists the run: ``team X``, ``partition Y``; or None) and what was seen of it."""
        s = self.settings
        if inc["team"] is not None and inc["team"] in s.teams:
            return f"team {inc['team']}", ""
        seen = f"team {inc['team'] or 'none'}"
        if s.backend == "slurm" and s.partitions:
            partition, why = self._partition(inc)
            if partition is not None and partition in s.partitions:
                return f"partition {partition}", ""
            seen += f", partition {partition}" if partition is not None else f", partition unknown: {why}"
        return None, seen

    def _target(self, inc: Mapping[str, Any], policy: str) -> Target | str:
        """The action's target, or why there is none."""
        s = self.settings
        labels = inc["labels"] if isinstance(inc["labels"], dict) else {}
        if policy in ("requeue", "cancel"):
            job = slurm_job(inc["run_id"], labels, s.slurm_run_prefix)
            if job is None:
                return (
                    f"no Slurm job id for run {inc['run_id']} (a slurm.job_id label, or a run id that is one "
                    f"after actions.slurm_run_prefix {s.slurm_run_prefix!r})"
                )
            return Target(f"job {job}", job=job)
        path, what = k8s_path(labels, s.k8s_resources)
        return what if path is None else Target(what, path=path)

    def _call(self, policy: str, target: Target, kind: str, reason: str) -> tuple[dict[str, Any], Any]:
        """(the record of the call, a function making it)."""
        s = self.settings
        if policy == "requeue":
            cmd = [s.scontrol, "requeue", str(target.job)]
            return {"command": cmd}, lambda: run_command(
                cmd, s.command_timeout_s, "requeued", "actions.scontrol"
            )
        if policy == "cancel":
            cmd = [s.scancel, str(target.job)]
            return {"command": cmd}, lambda: run_command(
                cmd, s.command_timeout_s, "cancelled", "actions.scancel"
            )
        body = {"metadata": {"annotations": {annotation(kind): reason}}}
        path = str(target.path)
        return (
            {"request": f"PATCH {self.kube.api_url}{path}", "body": body},
            lambda: self.kube.patch(
                path, body, "application/merge-patch+json", f"annotated {annotation(kind)}"
            ),
        )

    def _decide(
        self,
        inc: dict[str, Any],
        policy: str,
        action: str,
        mine: list[dict[str, Any]],
        now: float,
        acted_runs: set[str],
        held: dict[str, int],
    ) -> dict[str, Any] | None:
        s = self.settings
        run_id = inc["run_id"]
        reason = reason_for(inc)
        base = {
            "action": action,
            "run_id": run_id,
            "time": iso_at(now),
            "dry_run": s.dry_run and policy != "notify",
            "by": f"{self.by} (actions.kinds.{inc['kind']} = {policy})",
            "reason": reason,
        }
        last = mine[-1] if mine else None

        def once(result: str, detail: str, same: bool = True, **extra: Any) -> dict[str, Any] | None:
            """A record, unless the last one already says it (``same``: with the same detail)."""
            if (
                last is not None
                and last.get("result") == result
                and (not same or last.get("detail") == detail)
            ):
                return None
            return {
                **base,
                "target": extra.pop("target", run_id),
                "result": result,
                "detail": detail,
                **extra,
            }

        if policy == "notify":
            return {
                **base,
                "target": run_id,
                "result": DONE,
                "detail": "notify only: no scheduler action; the incident's alert notifies the run's owners",
            }
        allowed, seen = self._allowed(inc)
        if allowed is None:
            return once(
                SKIPPED, f"run {run_id} is not allow-listed ({seen}; actions.teams, actions.partitions)"
            )
        base["allowed_by"] = allowed
        if run_id in held and held[run_id] != inc["id"]:
            return once(SKIPPED, f"run {run_id} already acted on for incident {held[run_id]}")
        target = self._target(inc, policy)
        if isinstance(target, str):
            return once(FAILED, target)
        if not retry_due(mine, now, s.retry_after_s, s.max_attempts):
            return None
        if len(acted_runs) >= s.max_per_hour:
            return once(
                RATE_LIMITED,
                f"{len(acted_runs)} runs acted on in the last hour (actions.max_per_hour "
                f"{s.max_per_hour}); acted on when the budget allows",
                same=False,
                target=target.text,
            )
        call, apply = self._call(policy, target, inc["kind"], reason)
        if s.dry_run:
            log.warning("run action (dry run): would %s %s: %s; %s", action, target.text, reason, call)
            return {
                **base,
                "target": target.text,
                "result": DRY_RUN,
                "detail": f"dry run: would {action} {target.text}",
                **call,
            }
        outcome: Outcome = apply()
        (log.warning if outcome.result == DONE else log.error)(
            "run action: %s %s for incident %s: %s (%s)",
            action,
            target.text,
            inc["id"],
            outcome.result,
            outcome.detail,
        )
        return {
            **base,
            "target": target.text,
            "result": outcome.result,
            "detail": outcome.detail,
            **outcome.call,
        }
