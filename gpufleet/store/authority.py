"""Who may change what about runs: every write's authority, by role, in one place.

Three kinds of writer reach runs:

* **admin** (an admin token, the CLI, replay, a bundle): every power;
* **node** (a node token: an agent, or the node's Slurm prolog and epilog):
  only what its own node observed or its own scheduler hook registers;
* **progress** (a progress token: training code with ``gpufleet-client``):
  progress reports of runs, nothing else; optionally only runs holding a GPU
  of one node.

What a node may do, and why each bound is where it is:

* register a run on its own GPUs at its node's site, with a ``start`` and
  ``end`` within :data:`NODE_TIME_BOUND` of now, never ``team``, ``params``
  or ``labels`` (the server labels it :data:`REGISTERED_BY` ``node:<node>``);
* add its GPUs to a run only when another node's hook registered it for the
  same job (same name), while it runs and began within :data:`JOIN_WINDOW`
  (allocations hold for a run's whole window: a GPU that joins later would be
  billed for time it was not in the run);
* end a run only when a scheduler hook registered it and it holds a GPU of
  this node, at a time within :data:`NODE_TIME_BOUND` before now and
  :data:`END_SKEW` after; an ended run's end only moves forward, and only
  within :data:`END_SKEW` of when it ended (the last node of a multi-node job
  to finish sets the end).  A node never ends, extends or reopens a run an
  admin, the CLI or the collector registered, never changes name, team,
  params, labels or start, and never reopens with ``end: null``;
* adopt a run the collector inferred from its own GPUs' samples (register its
  id), keeping its start; a registration of its own takes GPUs from inferred
  runs that are running or just ended, never from a closed one (the
  overlap is refused);
* report progress of a run holding a GPU of its node, at a time near now;
* through its samples (:mod:`gpufleet.store.inferred`): add its GPUs to an
  inferred run only while it runs and only when it showed them from the
  run's start (:data:`SIGHTING_JOIN_WINDOW`), never move that start, and
  extend or end it only from its own allocated GPUs' samples; once an
  inferred run ended, samples about the past never change it (only samples
  of now reopen it: the job is back); a batch names at most a bounded number
  of runs (``ingest.max_runs_per_batch``);
* never set a label the server owns (:func:`is_server_label`), from the API
  or from its node facts.

The functions here decide; :mod:`gpufleet.store.runs` and
:mod:`gpufleet.store.inferred` ask them before writing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

#: How far from now (either way) a node token may set a run's start or end, or a progress time.
#: A scheduler hook runs at the job's start and end, within seconds of it; a day covers clocks
#: and queued retries, and bounds what a misbehaving node can bill (8 GPUs x 1 day = 192 GPU-hours).
NODE_TIME_BOUND = timedelta(days=1)
#: How far into the future a node may end a run, and how long after a run ended another node of the
#: same job may still move its end forward (its epilog finished later).  Epilogs of one job run
#: within seconds of each other; clocks within the ingest's future grace.
END_SKEW = timedelta(minutes=5)
#: A node joins another node's hook-registered run only while it began at most this long ago
#: (prologs of one job run at its start).
JOIN_WINDOW = timedelta(minutes=15)
#: A GPU a node's samples show on an existing inferred run is allocated only when the node showed
#: it from within this long of the run's start (pods of one job start within minutes of each other).
SIGHTING_JOIN_WINDOW = timedelta(minutes=10)

#: Label the server sets on a run registered by a node token: ``node:<node>``.
REGISTERED_BY = "gpufleet.registered_by"
#: Labels in this namespace without a domain (``gpufleet.ended_by``) are the server's own.
SERVER_LABEL_PREFIX = "gpufleet."

Kind = Literal["admin", "node", "progress"]


class RunAuthorityError(PermissionError):
    """A node or progress token asked to change a run beyond what its node observed or its hook
    registered (403); which routes a role may call at all is :mod:`gpufleet.auth`'s to say."""


@dataclass(frozen=True)
class Actor:
    """Who writes: ``admin`` with every power, a ``node`` for one node, or ``progress``."""

    kind: Kind = "admin"
    #: The node a node token speaks for; for a progress token, the node it is limited to (or None).
    node: str | None = None

    @property
    def is_node(self) -> bool:
        return self.kind == "node"


ADMIN = Actor()


def actor(role: str, node: str | None) -> Actor:
    """The actor of a token's role (``finance`` and ``sre`` write nothing: their routes refuse them first)."""
    if role == "node":
        return Actor("node", node)
    if role == "progress":
        return Actor("progress", node)
    return ADMIN


def as_node(node: str | None) -> Actor:
    """The actor behind the store's ``as_node`` argument: a node's, or admin when None."""
    return ADMIN if node is None else Actor("node", node)


def is_server_label(key: str) -> bool:
    """Labels the server sets (``gpufleet.ended_by``, ``gpufleet.registered_by``, ...); a label with a
    domain, such as a Kubernetes ``gpufleet.io/team``, is the user's."""
    return key.startswith(SERVER_LABEL_PREFIX) and "/" not in key


def without_server_labels(labels: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in labels.items() if not is_server_label(k)}


def hook_registered(run: Mapping[str, Any]) -> bool:
    """Whether a scheduler hook (a node token) registered the run."""
    return str((run.get("labels") or {}).get(REGISTERED_BY, "")).startswith("node:")


def holds_gpu_of(run: Mapping[str, Any], node: str) -> bool:
    return any(a["node"] == node for a in run["allocations"])


def _near_now(field: str, t: datetime | None, now: datetime, ahead: timedelta = NODE_TIME_BOUND) -> None:
    if t is not None and (t < now - NODE_TIME_BOUND or t > now + ahead):
        bound = (
            f"{NODE_TIME_BOUND.days} day"
            if ahead == NODE_TIME_BOUND
            else f"{NODE_TIME_BOUND.days} day before now or {int(ahead.total_seconds() // 60)} minutes after"
        )
        raise RunAuthorityError(
            f"a node token may set {field!r} only within {bound} ({now.isoformat()}), not {t.isoformat()}"
        )


def _own_gpus_only(node: str, allocations: list[dict[str, Any]]) -> None:
    for a in allocations:
        if a["node"] != node:
            raise RunAuthorityError(
                f"a node token may allocate GPUs of node {node!r} only, not {a['node']!r}"
            )


def _touches_own_node(run: Mapping[str, Any], node: str) -> None:
    if not holds_gpu_of(run, node):
        raise RunAuthorityError(
            f"run {run['run_id']!r} holds no GPU of node {node!r}; a node token may change "
            "only runs on its own GPUs"
        )


# -- the API's and the CLI's writes ----------------------------------------------------------------


def check_create(who: Actor, spec: Mapping[str, Any], now: datetime) -> None:
    """A new registration (the parts that need no stored state; the site is checked by the store)."""
    if not who.is_node:
        return
    assert who.node is not None
    run_id = spec.get("run_id")
    for f in ("team", "params"):
        if spec.get(f) is not None:
            raise RunAuthorityError(f"a node token may not set {f!r}; an admin can (PATCH /v1/runs/{run_id})")
    if spec.get("labels"):
        raise RunAuthorityError("a node token may not set 'labels'; an admin can")
    allocations = spec.get("allocations") or []
    if not allocations:
        raise RunAuthorityError(
            "a node token registers a run with GPUs of its own node: 'allocations' is empty"
        )
    _own_gpus_only(who.node, allocations)
    _near_now("start", spec.get("start") or now, now)
    _near_now("end", spec.get("end"), now)


def check_node_site(who: Actor, spec: Mapping[str, Any], node_site: str | None) -> None:
    if who.is_node and spec.get("site") is not None and node_site != spec["site"]:
        raise RunAuthorityError(
            f"a node token may register runs at its node's site only ({node_site!r}), not {spec['site']!r}"
        )


def check_adopt(who: Actor, run: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Registering an inferred run's own id: a node adopts only a run on its GPUs, as it was inferred."""
    if not who.is_node:
        return
    assert who.node is not None
    _touches_own_node(run, who.node)
    if spec.get("start") is not None and spec["start"] != run["start"]:
        raise RunAuthorityError(
            f"run {run['run_id']!r} was inferred from samples with start {run['start'].isoformat()}; "
            "a node token adopting it may not move its start"
        )
    if spec.get("end") is not None:
        raise RunAuthorityError(
            f"a node token may not end run {run['run_id']!r} while adopting it; its epilog ends it"
        )


def check_join(who: Actor, run: Mapping[str, Any], spec: Mapping[str, Any], now: datetime) -> None:
    """A node adds its GPUs to an existing run only for the same scheduler job (module docstring)."""
    if not who.is_node:
        return
    run_id = run["run_id"]
    if not hook_registered(run):
        raise RunAuthorityError(
            f"run {run_id!r} was not registered by a scheduler hook; a node token may add its GPUs "
            "only to runs another node's hook registered for the same job"
        )
    if spec.get("name") is not None and spec["name"] != run["name"]:
        from gpufleet.store.runs import Conflict

        raise Conflict(
            f"run {run_id!r} exists with name {run['name']!r}, not {spec['name']!r}: "
            "not the same scheduler job"
        )
    if run["end"] is not None and run["end"] <= now:
        raise RunAuthorityError(
            f"run {run_id!r} ended at {run['end'].isoformat()}; a node token cannot add GPUs to it"
        )
    if abs(run["start"] - now) > JOIN_WINDOW:
        raise RunAuthorityError(
            f"run {run_id!r} began at {run['start'].isoformat()}, more than "
            f"{int(JOIN_WINDOW.total_seconds() // 60)} minutes from now; a node token adds its GPUs "
            "only at the job's start (they would be billed from then)"
        )


def check_update(
    who: Actor, run: Mapping[str, Any], changes: dict[str, Any], now: datetime
) -> dict[str, Any]:
    """The changes a PATCH may make, as they will be made: for a node, an ``end`` earlier than an ended
    run's own is dropped (another node of the job finished later), anything outside its powers refused."""
    if not who.is_node:
        return changes
    assert who.node is not None
    for f in ("name", "team", "params", "labels"):
        if f in changes:
            raise RunAuthorityError(f"a node token may not change {f!r}; an admin can")
    if "start" in changes:
        raise RunAuthorityError("a node token may not move a run's start")
    _own_gpus_only(who.node, changes.get("allocations") or [])
    _touches_own_node(run, who.node)
    if changes.get("allocations"):
        check_join(who, run, {}, now)
    if "end" not in changes:
        return changes
    end = changes["end"]
    if end is None:
        raise RunAuthorityError("a node token may not reopen a run (end: null)")
    if not hook_registered(run):
        raise RunAuthorityError(
            f"run {run['run_id']!r} was registered by an admin, the CLI or the collector; a node "
            "token ends only runs a scheduler hook registered"
        )
    _near_now("end", end, now, ahead=END_SKEW)
    old = run["end"]
    if old is not None and old <= now:
        if end <= old:
            return {k: v for k, v in changes.items() if k != "end"}  # another node finished later
        if old < now - END_SKEW:
            raise RunAuthorityError(
                f"run {run['run_id']!r} ended at {old.isoformat()}; a node token may not reopen "
                "or extend an ended run"
            )
    return changes


def check_progress(who: Actor, run: Mapping[str, Any], t: datetime, now: datetime) -> None:
    """Progress of a run: a node's or a node-bound progress token's only for a run on that node."""
    if who.kind == "admin":
        return
    if who.node is not None:
        _touches_own_node(run, who.node)
    if t < now - NODE_TIME_BOUND or t > now + NODE_TIME_BOUND:
        raise RunAuthorityError(
            f"a {who.kind} token may report progress only within {NODE_TIME_BOUND.days} day of now "
            f"({now.isoformat()}), not {t.isoformat()}"
        )


def closed_before(who: Actor, now: datetime) -> datetime | None:
    """For a node's registration: inferred runs that ended before this are closed and never give way to it
    (their bill stands); None for an admin, whose registration always wins."""
    return now - END_SKEW if who.is_node else None


# -- what samples may make of inferred runs -------------------------------------------------------


def sighting_refusal(
    run_start: datetime, first_seen: datetime, run_end: datetime | None = None
) -> str | None:
    """Why a GPU a node's samples show on an existing inferred run may not become one of its allocations
    (None: it may).  Allocations hold from the run's start, so only a GPU shown from then is in it; and
    a run that has ended is closed: its bill stands, it gains no GPU."""
    if run_end is not None:
        return (
            f"the run ended at {run_end.isoformat()} before samples showed this GPU; a closed run gains "
            "no GPUs"
        )
    if first_seen < run_start - SIGHTING_JOIN_WINDOW:
        return (
            f"shown from {first_seen.isoformat()}, before the run began ({run_start.isoformat()}); "
            "samples never move an inferred run's start"
        )
    if first_seen > run_start + SIGHTING_JOIN_WINDOW:
        return (
            f"shown only from {first_seen.isoformat()}, more than "
            f"{int(SIGHTING_JOIN_WINDOW.total_seconds() // 60)} minutes after the run began "
            f"({run_start.isoformat()}); it would be billed for time it was not in the run"
        )
    return None


def densest_start(first_seen: list[datetime]) -> datetime:
    """The start of a new inferred run from its GPUs' first samples: the earliest first sample of the
    :data:`SIGHTING_JOIN_WINDOW` that holds the most of them, so one node's old samples cannot pull the
    start of a run every other GPU began later."""
    times = sorted(first_seen)
    best, best_n, j = times[0], 0, 0
    for i, t in enumerate(times):
        while times[j] < t - SIGHTING_JOIN_WINDOW:
            j += 1
        # window [times[j], t]; counted at its right end, started at its left
        if i - j + 1 > best_n:
            best, best_n = times[j], i - j + 1
    return best
