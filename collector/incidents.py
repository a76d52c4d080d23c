"""The incident lifecycle: findings of successive sweeps become incidents.

Pure and storage-agnostic.  :func:`plan_sweep` takes the open incidents and
the findings of one sweep at time ``now`` and returns a :class:`Plan` of
actions — open, update, resolve — that a store applies: the database layer in
production, :class:`MemoryIncidentStore` in replay and tests.

Rules:

* one open incident per ``(kind, scope)`` (:attr:`Finding.scope_key`): a
  finding whose scope is open updates it (evidence, severity, ``last_seen``;
  the cause only from ``unknown`` or with a higher severity), otherwise it
  opens a new incident starting at the finding's ``start``;
* an open incident whose scope had no finding this sweep stays open until it
  has been clear for ``resolve_after_s`` since it was last seen (hold-off), so
  a finding that blinks off for a sweep or two neither resolves nor reopens;
  an intermittent condition may ask for a longer hold-off (``Finding.hold_s``:
  checkpoints further apart than the window, sparse XIDs);
* a resolved incident ends where the condition was last active (the
  finding's ``last_active``, else the sweep that last saw it), not at the
  sweep that noticed;
* a finding after a resolution opens a new incident (a real recovery).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.collector.detectors.window import Finding
from gpufleet.timeparse import rfc3339

#: Kinds whose findings name one GPU (contracts.md section 2): ``node`` and ``gpu`` set.
GPU_SCOPED_KINDS = frozenset({"straggler", "throttling", "pcie_degraded"})

OPEN = "open"
RESOLVED = "resolved"
_SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}


@dataclass
class Incident:
    """One incident, as stored (schema table ``incidents``)."""

    kind: str
    scope_key: str
    cause: str | None
    severity: str
    #: When the condition began (epoch seconds).
    start: float
    #: Sweep time the condition was last reported.
    last_seen: float
    evidence: dict[str, Any] = field(default_factory=dict)
    run_id: str | None = None
    node: str | None = None
    gpu: int | None = None
    #: Last time the condition itself was active (epoch seconds).
    last_active: float | None = None
    #: Resolution time: where the condition ended.  None while open.
    end: float | None = None
    #: Hold-off the detector asked for (``Finding.hold_s``), seconds.
    hold_s: float | None = None
    state: str = OPEN
    #: Store-assigned identity (database id); None until stored.
    id: int | None = None

    def records(self) -> list[dict[str, Any]]:
        """The FINDINGS.jsonl objects of this incident (contracts.md section 2).

        GPU-scoped kinds are one row per GPU with ``node`` and ``gpu`` set, as the
        contract says.  An incident that groups a run's GPUs (throttling for one
        reason: ``evidence.gpus``, each GPU with its own evidence) is one incident
        for people and alerts, and one row per GPU for outside tools: each row
        carries that GPU's own evidence and onset, the incident's end and severity.
        """
        gpus = self.evidence.get("gpus") if self.gpu is None and self.kind in GPU_SCOPED_KINDS else None
        if not isinstance(gpus, list) or not gpus:
            return [self.record()]
        rows = []
        for g in gpus:
            ev = {k: v for k, v in g.items() if k not in ("node", "gpu")}
            since = g.get("since")
            row = self.record()
            row.update(
                node=g.get("node"),
                gpu=g.get("gpu"),
                evidence=ev,
                start=since if isinstance(since, str) else rfc3339(self.start),
            )
            rows.append(row)
        return rows

    def record(self) -> dict[str, Any]:
        """This incident as one FINDINGS.jsonl object (a grouped incident's summary row)."""
        return {
            "kind": self.kind,
            "run_id": self.run_id,
            "node": self.node,
            "gpu": self.gpu,
            "start": rfc3339(self.start),
            "end": rfc3339(self.end) if self.state == RESOLVED else None,
            "cause": self.cause,
            "severity": self.severity,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Open:
    incident: Incident


@dataclass(frozen=True)
class Update:
    scope_key: str
    id: int | None
    cause: str | None
    severity: str
    evidence: dict[str, Any]
    last_seen: float
    last_active: float | None
    #: Possibly earlier than the stored start when a later sweep dated the
    #: condition's onset further back; never later.
    start: float
    hold_s: float | None = None
    #: An incident whose GPUs may change (a run's GPUs throttled for one reason, ``Finding.qualifier``)
    #: takes the node of its latest finding: set when they are all on one node, else None.
    node: str | None = None
    renode: bool = False


@dataclass(frozen=True)
class Resolve:
    scope_key: str
    id: int | None
    end: float


@dataclass
class Plan:
    """What one sweep changes, in the order a store should apply it:
    resolves, then updates, then opens."""

    now: float
    opens: list[Open] = field(default_factory=list)
    updates: list[Update] = field(default_factory=list)
    resolves: list[Resolve] = field(default_factory=list)

    @property
    def actions(self) -> list[Open | Update | Resolve]:
        return [*self.resolves, *self.updates, *self.opens]

    def __bool__(self) -> bool:
        return bool(self.opens or self.updates or self.resolves)


def _dedupe(findings: Iterable[Finding]) -> dict[str, Finding]:
    """One finding per scope: the most severe, then the earliest start."""
    best: dict[str, Finding] = {}
    for f in findings:
        key = f.scope_key
        cur = best.get(key)
        if cur is None or (_SEVERITY_RANK.get(f.severity, 1), -f.start) > (
            _SEVERITY_RANK.get(cur.severity, 1),
            -cur.start,
        ):
            best[key] = f
    return best


def _cause(inc: Incident, f: Finding) -> str | None:
    """An incident keeps the cause it was opened with (a recovering GPU's
    symptoms drift: a cooling straggler is "clocks" after being "thermal"),
    unless that was unknown or the new finding is more severe."""
    if inc.cause in (None, "unknown") or _SEVERITY_RANK.get(f.severity, 1) > _SEVERITY_RANK.get(
        inc.severity, 1
    ):
        return f.cause
    return inc.cause


def plan_sweep(
    open_incidents: Iterable[Incident],
    findings: Iterable[Finding],
    now: float,
    resolve_after_s: float,
    last_ends: Mapping[str, float] | None = None,
) -> Plan:
    """Decide what the findings of a sweep at ``now`` change.

    ``open_incidents`` are the incidents currently open (at most one per scope
    key); ``resolve_after_s`` is the hold-off before a clear scope resolves;
    ``last_ends`` the end of each scope's latest resolved incident, so that a
    reopened incident never starts before its predecessor ended.
    """
    if resolve_after_s < 0:
        raise ValueError("resolve_after_s must be >= 0")
    plan = Plan(now=now)
    current = {i.scope_key: i for i in open_incidents if i.state == OPEN}
    seen = _dedupe(findings)
    for key, f in seen.items():
        inc = current.get(key)
        last_active = f.last_active if f.last_active is not None else now
        if inc is None:
            start = min(f.start, now)
            if last_ends and key in last_ends:
                start = max(start, min(last_ends[key], now))
            plan.opens.append(
                Open(
                    Incident(
                        kind=f.kind,
                        scope_key=key,
                        cause=f.cause,
                        severity=f.severity,
                        start=start,
                        last_seen=now,
                        evidence=dict(f.evidence),
                        run_id=f.run_id,
                        node=f.node,
                        gpu=f.gpu,
                        last_active=last_active,
                        hold_s=f.hold_s,
                    )
                )
            )
        else:
            plan.updates.append(
                Update(
                    scope_key=key,
                    id=inc.id,
                    cause=_cause(inc, f),
                    severity=f.severity,
                    evidence=_keep_onsets(inc.evidence, dict(f.evidence)),
                    last_seen=max(now, inc.last_seen),
                    last_active=max(last_active, inc.last_active)
                    if inc.last_active is not None
                    else last_active,
                    start=min(inc.start, f.start),
                    hold_s=f.hold_s,
                    node=f.node,
                    renode=f.qualifier is not None,
                )
            )
    for key, inc in current.items():
        if key in seen:
            continue
        if now - inc.last_seen >= max(resolve_after_s, inc.hold_s or 0.0):
            end = inc.last_active if inc.last_active is not None else inc.last_seen
            plan.resolves.append(Resolve(scope_key=key, id=inc.id, end=max(end, inc.start)))
    return plan


def _keep_onsets(old: Mapping[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """``new`` evidence, each GPU it lists (``gpus``) keeping the earliest ``since`` any sweep saw: a
    later window dates a long condition from its own start, not from when the GPU began."""
    gpus, before = new.get("gpus"), old.get("gpus")
    if not isinstance(gpus, list) or not isinstance(before, list):
        return new
    seen = {(g.get("node"), g.get("gpu")): g.get("since") for g in before if isinstance(g, Mapping)}
    out = []
    for g in gpus:
        if isinstance(g, Mapping):
            was = seen.get((g.get("node"), g.get("gpu")))
            if isinstance(was, str) and isinstance(g.get("since"), str) and was < g["since"]:
                g = {**g, "since": was}
        out.append(g)
    return {**new, "gpus": out}


class MemoryIncidentStore:
    """Applies plans in memory: the store of replay and the tests."""

    def __init__(self) -> None:
        self.open: dict[str, Incident] = {}
        self.resolved: list[Incident] = []
        #: End of each scope's latest resolved incident.
        self.last_ends: dict[str, float] = {}
        self._next_id = 1

    def open_incidents(self) -> list[Incident]:
        return list(self.open.values())

    def apply(self, plan: Plan) -> None:
        for r in plan.resolves:
            inc = self.open.pop(r.scope_key)
            inc.state = RESOLVED
            inc.end = r.end
            self.resolved.append(inc)
            self.last_ends[r.scope_key] = r.end
        for u in plan.updates:
            inc = self.open[u.scope_key]
            inc.cause = u.cause
            inc.severity = u.severity
            inc.evidence = u.evidence
            inc.last_seen = u.last_seen
            inc.last_active = u.last_active
            inc.start = u.start
            inc.hold_s = u.hold_s
            if u.renode:
                inc.node = u.node
        for o in plan.opens:
            if o.incident.scope_key in self.open:
                raise ValueError(f"incident already open for {o.incident.scope_key}")
            inc = replace(o.incident, id=self._next_id)
            self._next_id += 1
            self.open[inc.scope_key] = inc

    def sweep(self, findings: Iterable[Finding], now: float, resolve_after_s: float) -> Plan:
        """Plan and apply one sweep."""
        plan = plan_sweep(self.open.values(), findings, now, resolve_after_s, self.last_ends)
        self.apply(plan)
        return plan

    def incidents(self) -> list[Incident]:
        """Every incident, resolved and open, by start time."""
        return sorted([*self.resolved, *self.open.values()], key=lambda i: (i.start, i.id or 0))

    def records(self) -> list[dict[str, Any]]:
        """FINDINGS.jsonl objects of every incident (open ones with ``end`` null)."""
        return [row for i in self.incidents() for row in i.records()]
