"""Which run a pod belongs to.

In order:

1. the pod's annotation, else label, ``run_id_key`` (default
   ``gpufleet.io/run-id``): its value is the run id, verbatim;
2. the job's controller: the owner chain is walked upward from the pod
   (through Jobs, JobSets and RayClusters, read from the API server) and the
   topmost object whose kind is in ``run_kinds`` is the run -- a
   PyTorchJob, TrainJob, JobSet, RayJob or plain Job, so every pod of one
   job, on every node, names one run.  Where an owner cannot be read
   (no permission, a kind the walk does not fetch), the labels the
   controllers put on their pods name it instead (JobSet:
   ``jobset.sigs.k8s.io/jobset-name``; RayJob:
   ``ray.io/originated-from-crd`` and ``...-cr-name``);
3. else the pod itself (a bare pod, a Deployment's replica).

A controller's run id is ``<namespace>:<name>:<first 8 characters of its
UID>``: readable, a valid API run id (one path segment), and different for
a job deleted and created again under the same name.  A pod's is
``<namespace>:<pod>`` with its UID's head when known.  Ids are cut to the
API's 128 characters.

The run's team is the first of ``team_labels`` found on the pod or its
owners, else (``team_from_namespace``) the namespace, through ``team_map``
where a label's value or a namespace is not the team's own name (a namespace
per project of one team); where the pods of one run disagree (a labelled
master, unlabelled workers), a label wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from gpufleet.agent.k8s.pods import ObjectInfo, OwnerRef

#: Run ids as the API accepts them (``gpufleet.store.runs.RUN_ID_RE``).
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@\-]{0,127}")
DEFAULT_RUN_KINDS = (
    "TrainJob",
    "PyTorchJob",
    "TFJob",
    "MPIJob",
    "XGBoostJob",
    "PaddleJob",
    "JAXJob",
    "JobSet",
    "RayJob",
    "Job",
)
#: Owner kinds whose own owner the walk reads (a Job of a JobSet or a RayJob, a JobSet of a TrainJob...).
FOLLOW = frozenset({"Job", "JobSet", "RayCluster"})
MAX_DEPTH = 4


@dataclass(frozen=True)
class K8sRun:
    """A run as attribution reports it in the node facts (``facts["runs"][run_id]``)."""

    run_id: str
    name: str
    kind: str
    namespace: str
    team: str | None
    labels: dict[str, str] = field(default_factory=dict)
    #: The team came from a team label (not the namespace): it wins over another pod's namespace team.
    team_labelled: bool = False

    def facts(self) -> dict[str, object]:
        return {"source": "kubernetes", "name": self.name, "team": self.team, "labels": dict(self.labels)}


def run_id_for(namespace: str, name: str, uid: str | None) -> str:
    tail = f":{uid[:8]}" if uid else ""
    room = 128 - len(namespace) - 1 - len(tail)
    return f"{namespace}:{name[: max(room, 1)]}{tail}"


@dataclass
class RunResolver:
    run_id_key: str = "gpufleet.io/run-id"
    run_kinds: Sequence[str] = DEFAULT_RUN_KINDS
    team_labels: Sequence[str] = ("gpufleet.io/team", "team")
    team_from_namespace: bool = True
    #: A team label's value or a namespace -> its team (settings ``k8s.team_map``).
    team_map: Mapping[str, str] = field(default_factory=dict)

    def resolve(
        self, pod: ObjectInfo, owner: Callable[[str, OwnerRef], ObjectInfo | None] | None = None
    ) -> K8sRun:
        """The run of ``pod``; ``owner`` reads an owner object (None: owners are not read)."""
        chain = [pod]
        explicit = pod.annotations.get(self.run_id_key) or pod.labels.get(self.run_id_key)
        cur = pod
        for _ in range(MAX_DEPTH):
            ref = cur.controller
            if ref is None:
                break
            fetched = owner(pod.namespace, ref) if owner is not None and ref.kind in FOLLOW else None
            nxt = fetched or ObjectInfo(ref.kind, pod.namespace, ref.name, ref.uid or None)
            chain.append(nxt)
            if fetched is None:
                break
            cur = nxt
        self._label_owners(pod, chain)
        team, labelled = self._team(chain)
        kinds = set(self.run_kinds)
        if explicit and RUN_ID_RE.fullmatch(explicit):
            top = next((o for o in reversed(chain) if o.kind in kinds), pod)
            return K8sRun(explicit, top.name, top.kind, pod.namespace, team, self._labels(pod, top), labelled)
        top = next((o for o in reversed(chain) if o.kind in kinds), pod)
        return K8sRun(
            run_id_for(pod.namespace, top.name, top.uid),
            top.name,
            top.kind,
            pod.namespace,
            team,
            self._labels(pod, top),
            labelled,
        )

    def _label_owners(self, pod: ObjectInfo, chain: list[ObjectInfo]) -> None:
        """Owners above the last one read, as their controllers label the pods."""
        kinds = {o.kind for o in chain}
        lab = pod.labels
        if "JobSet" not in kinds and lab.get("jobset.sigs.k8s.io/jobset-name"):
            chain.append(
                ObjectInfo(
                    "JobSet",
                    pod.namespace,
                    lab["jobset.sigs.k8s.io/jobset-name"],
                    lab.get("jobset.sigs.k8s.io/jobset-uid") or None,
                )
            )
        if (
            "RayJob" not in kinds
            and lab.get("ray.io/originated-from-crd") == "RayJob"
            and lab.get("ray.io/originated-from-cr-name")
        ):
            # No UID on the pods: the RayCluster's (one per RayJob submission) keeps re-runs apart.
            cluster = next((o for o in chain if o.kind == "RayCluster"), None)
            chain.append(
                ObjectInfo(
                    "RayJob",
                    pod.namespace,
                    lab["ray.io/originated-from-cr-name"],
                    cluster.uid if cluster is not None else None,
                )
            )

    def _team(self, chain: list[ObjectInfo]) -> tuple[str | None, bool]:
        """(team, whether a label named it)."""
        for obj in chain:
            for key in self.team_labels:
                v = obj.labels.get(key)
                if v:
                    return self.team_map.get(v, v), True
        ns = chain[0].namespace if self.team_from_namespace and chain[0].namespace else None
        return (self.team_map.get(ns, ns) if ns else None), False

    @staticmethod
    def _labels(pod: ObjectInfo, top: ObjectInfo) -> dict[str, str]:
        out = {"k8s.namespace": pod.namespace, "k8s.kind": top.kind, "k8s.name": top.name}
        if top.uid:
            out["k8s.uid"] = top.uid
        return out
