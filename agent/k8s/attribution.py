"""Kubernetes attribution: the kubelet's device assignments and the pods' runs, kept fresh off the tick.

A background thread (:meth:`KubernetesAttribution.start`) asks the kubelet
for the node's device assignments every ``refresh_s`` and the API server
for pod metadata when a pod is new (at most every ``refresh_s``) or every
``metadata_refresh_s``, and resolves each pod's run once (a pod keeps the
run it was first given for its whole life, so a metadata outage cannot
split a run in two).  The tick only reads the latest snapshot
(:meth:`runs_by_place`), so a slow kubelet or API server never delays
sampling.  A pod named elsewhere (dcgm-exporter's pod label) but missing
from the snapshot wakes the thread, which asks the kubelet for that one pod
(``Get``, cheaper than listing a busy node) where the kubelet serves it,
else lists again.

A pod the last metadata list predates is left out until the next list has
it (at most ``refresh_s``).  Without pod metadata (``pod_metadata: false``,
the API server cannot be read, or the pod is still missing from a list made
after it appeared) a pod is its own run (``<namespace>:<pod>``).  A snapshot older
than three refresh periods (the kubelet stopped answering) is not used:
rows stay unattributed rather than named after pods that may have ended.

Time-sliced or MPS-shared GPUs (``GPU-...::N`` replicas) held by pods of
several runs are attributed to the run holding the most replicas (then the
smallest run id): one GPU row carries one run.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.agent.k8s.devices import DeviceMap, Place
from gpufleet.agent.k8s.podresources import KubeletError, PodDevices, Unimplemented
from gpufleet.agent.k8s.pods import ApiError, ObjectInfo, OwnerRef
from gpufleet.agent.k8s.runs import K8sRun, RunResolver, run_id_for
from gpufleet.agent.ratelog import RateLimitedLog

log = logging.getLogger(__name__)

DEFAULT_GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")


class Lister(Protocol):
    def list(self) -> list[PodDevices]: ...
    def get(self, namespace: str, name: str) -> PodDevices | None: ...


class Metadata(Protocol):
    def pods_on_node(self, node: str) -> dict[tuple[str, str], ObjectInfo]: ...
    def owner(self, namespace: str, ref: OwnerRef) -> ObjectInfo | None: ...


@dataclass
class Snapshot:
    at: float
    #: (namespace, pod) -> (run, device ids of GPU resources)
    pods: dict[tuple[str, str], tuple[K8sRun, tuple[str, ...]]] = field(default_factory=dict)


class KubernetesAttribution:
    def __init__(
        self,
        node: str,
        lister: Lister,
        metadata: Metadata | None = None,
        resolver: RunResolver | None = None,
        gpu_resources: Sequence[str] = DEFAULT_GPU_RESOURCES,
        refresh_s: float = 5.0,
        metadata_refresh_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.lister = lister
        self.metadata = metadata
        self.resolver = resolver or RunResolver()
        self.gpu_resources = tuple(gpu_resources)
        self.refresh_s = refresh_s
        self.metadata_refresh_s = metadata_refresh_s
        self.clock = clock
        self.errors: Counter[str] = Counter()
        self._lock = threading.Lock()
        #: One refresh at a time (the thread's, a test's, a wanted pod's).
        self._refreshing = threading.Lock()
        self._snap: Snapshot | None = None
        self._meta: dict[tuple[str, str], ObjectInfo] = {}
        self._meta_at = -1e18
        self._meta_ok = False
        self._owners: dict[tuple[str, str], ObjectInfo | None] = {}
        self._runs: dict[tuple[str, str, str | None], K8sRun] = {}
        #: One K8sRun per run id: pods of one run may disagree on its team (a label wins).
        self._canon: dict[str, K8sRun] = {}
        self._by_uid: dict[str, K8sRun] = {}
        self._first_seen: dict[tuple[str, str], float] = {}
        self._get_supported = True
        self._ratelog = RateLimitedLog(log, 300.0)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._wanted: set[tuple[str, str]] = set()
        self._asked: dict[tuple[str, str], float] = {}
        self._thread: threading.Thread | None = None

    # -- the background refresh --------------------------------------------------------

    def start(self) -> KubernetesAttribution:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpufleet-k8s-attribution", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        next_list = 0.0
        while not self._stop.is_set():
            if self.clock() >= next_list or not self.refresh_wanted():
                self.refresh()
                next_list = self.clock() + self.refresh_s
            self._wake.wait(max(0.0, next_list - self.clock()))
            self._wake.clear()

    def refresh_wanted(self) -> bool:
        """Ask the kubelet for the pods named elsewhere and missing from the snapshot, one by one (``Get``).

        False when that cannot be done (no snapshot, ``Get`` not served, the
        kubelet failing): the caller lists instead.
        """
        with self._refreshing:
            return self._refresh_wanted()

    def _refresh_wanted(self) -> bool:
        with self._lock:
            wanted, self._wanted = self._wanted, set()
            snap = self._snap
        if not wanted:
            return True
        if snap is None or not self._get_supported:
            return False
        found: dict[tuple[str, str], tuple[K8sRun, tuple[str, ...]]] = {}
        for ns, name in sorted(wanted):
            try:
                pod = self.lister.get(ns, name)
            except Unimplemented:
                self._get_supported = False
                return False
            except KubeletError as e:
                self.errors["kubelet"] += 1
                self._ratelog.log(logging.WARNING, "get", "kubernetes attribution: %s", e)
                return False
            if pod is None:
                continue
            ids = tuple(d.device_id for d in pod.devices if self._gpu_resource(d.resource))
            if ids:
                self._first_seen.setdefault((ns, name), self.clock())
                self._metadata_for([(ns, name)])
                run = self._run_of(ns, name)
                if run is not None:
                    found[(ns, name)] = (run, ids)
        with self._lock:
            if self._snap is snap:
                self._snap = Snapshot(snap.at, {**snap.pods, **found})
        return True

    def _gpu_resource(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.gpu_resources)

    def refresh(self) -> bool:
        """Read the kubelet (and pod metadata when needed) once; False when the kubelet did not answer."""
        with self._refreshing:
            return self._refresh()

    def _refresh(self) -> bool:
        try:
            pods = self.lister.list()
        except KubeletError as e:
            self.errors["kubelet"] += 1
            self._ratelog.log(logging.WARNING, "kubelet", "kubernetes attribution: %s", e)
            return False
        gpu_pods = [
            (p, tuple(d.device_id for d in p.devices if self._gpu_resource(d.resource))) for p in pods
        ]
        gpu_pods = [(p, ids) for p, ids in gpu_pods if ids]
        self._forget_except({(p.namespace, p.name) for p, _ in gpu_pods})
        now = self.clock()
        for p, _ in gpu_pods:
            self._first_seen.setdefault((p.namespace, p.name), now)
        self._metadata_for([(p.namespace, p.name) for p, _ in gpu_pods])
        snap = Snapshot(self.clock())
        for p, ids in gpu_pods:
            run = self._run_of(p.namespace, p.name)
            if run is not None:
                snap.pods[(p.namespace, p.name)] = (run, ids)
        with self._lock:
            self._snap = snap
        return True

    def _forget_except(self, live: set[tuple[str, str]]) -> None:
        """Drop what is cached about pods that are gone (a node's pods come and go for months)."""
        self._first_seen = {k: v for k, v in self._first_seen.items() if k in live}
        self._runs = {k: v for k, v in self._runs.items() if (k[0], k[1]) in live}
        held = {r.run_id for r in self._runs.values()}
        self._canon = {k: v for k, v in self._canon.items() if k in held}
        uids = {k[2] for k in self._runs if k[2]}
        self._by_uid = {k: v for k, v in self._by_uid.items() if k in uids}
        if len(self._owners) > 10_000:
            self._owners.clear()
        self._asked = {k: v for k, v in self._asked.items() if self.clock() - v < 10 * self.refresh_s}

    def _metadata_for(self, keys: Iterable[tuple[str, str]]) -> None:
        if self.metadata is None:
            return
        now = self.clock()
        missing = [k for k in keys if k not in self._meta]
        stale = now - self._meta_at >= self.metadata_refresh_s
        if not stale and not (missing and now - self._meta_at >= self.refresh_s):
            return
        try:
            self._meta = self.metadata.pods_on_node(self.node)
            self._meta_ok = True
        except ApiError as e:
            self._meta_ok = False
            self.errors["api"] += 1
            self._ratelog.log(
                logging.WARNING,
                "api",
                "kubernetes attribution: pod metadata unavailable, pods are their own runs meanwhile: %s",
                e,
            )
        # When the answer (or the failure) came: pods first seen before it are in it, or missing.
        self._meta_at = self.clock()

    def _owner(self, namespace: str, ref: OwnerRef) -> ObjectInfo | None:
        key = (namespace, ref.uid or f"{ref.kind}/{ref.name}")
        if key in self._owners:
            return self._owners[key]
        got: ObjectInfo | None
        try:
            got = self.metadata.owner(namespace, ref) if self.metadata is not None else None
        except ApiError as e:
            self.errors["owner"] += 1
            self._ratelog.log(
                logging.WARNING,
                f"owner:{ref.kind}",
                "kubernetes attribution: cannot read %s %s/%s "
                "(its pods' run is named from what can be read): %s",
                ref.kind,
                namespace,
                ref.name,
                e,
            )
            if e.status not in (403, 404):
                return None  # transient: try again next time
            got = None
        self._owners[key] = got
        return got

    def _run_of(self, namespace: str, name: str) -> K8sRun | None:
        """The pod's run; None while the pod is newer than the last metadata list."""
        first = self._first_seen.setdefault((namespace, name), self.clock())
        # Missing from a list older than the pod: wait for the next list.  Missing from a newer
        # one (or no list can be had): the pod is its own run.
        info = self._meta.get((namespace, name))
        if info is None and self.metadata is not None and self._meta_ok and self._meta_at < first:
            return None
        uid = info.uid if info is not None else None
        key = (namespace, name, uid)
        run = self._runs.get(key) or self._runs.get((namespace, name, None))
        if run is not None:
            return self.canonical(run)
        if info is not None:
            run = self.resolver.resolve(info, self._owner)
        else:
            team, labelled = self.resolver._team([ObjectInfo("Pod", namespace, name, None)])
            run = K8sRun(
                run_id_for(namespace, name, None),
                name,
                "Pod",
                namespace,
                team,
                {"k8s.namespace": namespace, "k8s.kind": "Pod", "k8s.name": name},
                labelled,
            )
        self._runs[key] = run
        if uid:
            self._by_uid[uid] = run
        held = self._canon.get(run.run_id)
        if held is None or (run.team_labelled and not held.team_labelled):
            self._canon[run.run_id] = run
        return self.canonical(run)

    def canonical(self, run: K8sRun) -> K8sRun:
        return self._canon.get(run.run_id, run)

    # -- what the tick reads -----------------------------------------------------------

    def _fresh(self) -> Snapshot | None:
        with self._lock:
            snap = self._snap
        if snap is None or self.clock() - snap.at > 3 * self.refresh_s:
            return None
        return snap

    def runs_by_place(self, devices: DeviceMap) -> dict[Place, K8sRun]:
        """The run on each GPU (``(gpu, None)``) and MIG instance (``(gpu, gi)``) the kubelet assigned.

        A whole GPU with MIG instances of one run only takes that run; of several, none.
        """
        snap = self._fresh()
        if snap is None:
            return {}
        votes: dict[Place, Counter[str]] = {}
        runs: dict[str, K8sRun] = {}
        for run, ids in snap.pods.values():
            runs[run.run_id] = self.canonical(run)
            for dev in ids:
                place = devices.place(dev)
                if place is None:
                    continue
                votes.setdefault(place, Counter())[run.run_id] += 1
                if place[1] is not None:
                    votes.setdefault((place[0], -1), Counter())[run.run_id] += 1
        out: dict[Place, K8sRun] = {}
        for place, c in votes.items():
            if place[1] == -1:
                continue
            best = min(c, key=lambda r: (-c[r], r))
            out[place] = runs[best]
        for (gpu, gi), c in votes.items():
            if gi == -1 and (gpu, None) not in out and len(c) == 1:
                out[(gpu, None)] = runs[next(iter(c))]
        return out

    def run_for_pod(self, namespace: str, name: str) -> K8sRun | None:
        """The run of a pod named elsewhere (dcgm-exporter's labels), from the snapshot.

        A pod the snapshot lacks is asked for in the background (None meanwhile).
        """
        snap = self._fresh()
        if snap is not None and (namespace, name) in snap.pods:
            return self.canonical(snap.pods[(namespace, name)][0])
        now = self.clock()
        if now - self._asked.get((namespace, name), -1e18) >= self.refresh_s:
            self._asked[(namespace, name)] = now
            with self._lock:
                self._wanted.add((namespace, name))
            self._wake.set()
        return None

    def run_for_pod_uid(self, uid: str) -> K8sRun | None:
        """The run of the pod with this UID (a process's cgroup names it), when its metadata was read."""
        run = self._by_uid.get(uid)
        return self.canonical(run) if run is not None else None


def runs_facts(runs: Mapping[str, K8sRun]) -> dict[str, Any]:
    """``facts["runs"]``: what the collector needs to register these runs (name, team, labels)."""
    return {run_id: run.facts() for run_id, run in sorted(runs.items())}
