"""Kubernetes attribution: the kubelet's real pod-resources gRPC protocol on a unix socket, pod
metadata from a loopback API server, and the runs the attribution step puts on GPU rows."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.attribution import Attributor
from gpufleet.agent.k8s.attribution import KubernetesAttribution
from gpufleet.agent.k8s.devices import DeviceMap
from gpufleet.agent.k8s.podresources import KubeletError, PodResourcesClient, Unimplemented
from gpufleet.agent.k8s.pods import ApiServer, ObjectInfo, OwnerRef
from gpufleet.agent.k8s.runs import RunResolver, run_id_for
from gpufleet.store.runs import RUN_ID_RE
from testsupport.kubelet import FakeApiServer, FakeKubelet, pod_json

U = [
    "GPU-00000000-0000-4000-8000-0000aaaa0000",
    "GPU-00000001-0000-4000-8000-0000aaaa0001",
    "GPU-00000002-0000-4000-8000-0000aaaa0002",
    "GPU-00000003-0000-4000-8000-0000aaaa0003",
]
MIG = {"MIG-5f1c0d2e-aaaa-5000-9000-000000000001": 1, "MIG-5f1c0d2e-aaaa-5000-9000-000000000002": 2}
PTJ = ("kubeflow.org/v1", "PyTorchJob", "llm-pretrain", "7d1e5a90-1111-4222-8333-944455556666")


def rows(n: int = 4, mig_on: int | None = None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"gpu": g, "uuid": U[g], "mig_instance": None} for g in range(n)]
    if mig_on is not None:
        out += [{"gpu": mig_on, "uuid": U[mig_on], "mig_instance": gi} for gi in sorted(MIG.values())]
    return out


def mig_facts(gpu: int) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "gpu": gpu,
                "uuid": U[gpu],
                "mig_enabled": True,
                "mig_instances": [{"gpu_instance_id": gi, "uuid": u} for u, gi in MIG.items()],
            }
        ]
    }


@pytest.fixture
def sock(tmp_path: Path) -> Path:
    return tmp_path / "kubelet.sock"


# ---------------------------------------------------------------- the gRPC protocol


def test_list_and_get_over_the_kubelet_socket(sock: Path) -> None:
    pods = [
        (
            "ml",
            "trainer-0",
            {"pytorch": [("nvidia.com/gpu", [U[0], U[1]]), ("example.com/nic", ["eth1"])], "sidecar": []},
        )
    ]
    with FakeKubelet(sock, pods) as kubelet:
        client = PodResourcesClient(sock, timeout_s=5)
        try:
            (got,) = client.list()
            assert (got.namespace, got.name) == ("ml", "trainer-0")
            assert [(d.container, d.resource, d.device_id) for d in got.devices] == [
                ("pytorch", "nvidia.com/gpu", U[0]),
                ("pytorch", "nvidia.com/gpu", U[1]),
                ("pytorch", "example.com/nic", "eth1"),
            ]
            one = client.get("ml", "trainer-0")
            assert one is not None and one.devices == got.devices
            assert client.get("ml", "nope") is None
            kubelet.get_enabled = False
            with pytest.raises(Unimplemented, match="UNIMPLEMENTED"):
                client.get("ml", "trainer-0")
        finally:
            client.close()
        assert kubelet.calls == {"List": 1, "Get": 3}


def test_a_missing_socket_is_a_kubelet_error_naming_it(tmp_path: Path) -> None:
    client = PodResourcesClient(tmp_path / "absent.sock", timeout_s=0.5)
    try:
        with pytest.raises(KubeletError, match=r"absent\.sock: UNAVAILABLE"):
            client.list()
    finally:
        client.close()


# ---------------------------------------------------------------- device ids


def test_device_ids_of_every_plugin_strategy_map_to_gpus_and_mig_instances() -> None:
    dm = DeviceMap.build(rows(3), mig_facts(3))
    assert dm.place(U[1]) == (1, None)
    assert dm.place(U[1].lower()) == (1, None)
    assert dm.place("2") == (2, None)  # DEVICE_ID_STRATEGY=index
    assert dm.place(U[0] + "::3") == (0, None)  # time-slicing / MPS replica
    assert dm.place("MIG-5f1c0d2e-aaaa-5000-9000-000000000002") == (3, 2)
    assert dm.place(f"MIG-{U[3]}/1/0") == (3, 1)  # the older MIG id format
    for unknown in ("GPU-ffffffff-0000-4000-8000-000000000000", "9", "MIG-unknown", "", "nvidia0"):
        assert dm.place(unknown) is None, unknown


# ---------------------------------------------------------------- pod -> run


def test_pods_of_one_job_controller_name_one_run() -> None:
    r = RunResolver()
    a = ObjectInfo.from_json(
        "Pod", pod_json("ml", "llm-pretrain-master-0", "p-1", {"team": "research"}, owner=PTJ)
    )
    b = ObjectInfo.from_json("Pod", pod_json("ml", "llm-pretrain-worker-0", "p-2", owner=PTJ))
    ra, rb = r.resolve(a), r.resolve(b)
    assert ra.run_id == rb.run_id == "ml:llm-pretrain:7d1e5a90"
    assert (ra.kind, ra.name, ra.team, rb.team) == ("PyTorchJob", "llm-pretrain", "research", "ml")
    assert ra.labels == {
        "k8s.namespace": "ml",
        "k8s.kind": "PyTorchJob",
        "k8s.name": "llm-pretrain",
        "k8s.uid": PTJ[3],
    }
    # The annotation names the run verbatim; a bare pod is its own run.
    c = ObjectInfo.from_json(
        "Pod", pod_json("ml", "x", "9a8b7c6d-0000", annotations={"gpufleet.io/run-id": "exp-17"}, owner=PTJ)
    )
    assert r.resolve(c).run_id == "exp-17" and r.resolve(c).name == "llm-pretrain"
    bare = ObjectInfo.from_json("Pod", pod_json("dev", "notebook", "0f1e2d3c-4444"))
    assert r.resolve(bare).run_id == "dev:notebook:0f1e2d3c" and r.resolve(bare).kind == "Pod"
    # Not a run kind (a Deployment's ReplicaSet): the pod is the run.
    rs = ObjectInfo.from_json(
        "Pod", pod_json("web", "srv-abc", "1234abcd-5", owner=("apps/v1", "ReplicaSet", "srv", "rs-uid"))
    )
    assert r.resolve(rs).run_id == "web:srv-abc:1234abcd"


def test_owner_chain_walks_to_the_topmost_run_kind_and_falls_back_on_labels() -> None:
    js = ("jobset.x-k8s.io/v1alpha2", "JobSet", "sweep", "5e5e5e5e-0000")
    job = {
        "metadata": {
            "namespace": "ml",
            "name": "sweep-workers-0",
            "uid": "j-uid",
            "ownerReferences": [
                {"apiVersion": js[0], "kind": js[1], "name": js[2], "uid": js[3], "controller": True}
            ],
        }
    }
    pod = ObjectInfo.from_json(
        "Pod",
        pod_json(
            "ml",
            "sweep-workers-0-0-abcde",
            "p",
            owner=("batch/v1", "Job", "sweep-workers-0", "j-uid"),
            labels={"jobset.sigs.k8s.io/jobset-name": "sweep"},
        ),
    )
    fetched: list[str] = []

    def owner(ns: str, ref: OwnerRef) -> ObjectInfo | None:
        fetched.append(ref.kind)
        return ObjectInfo.from_json(ref.kind, job) if ref.kind == "Job" else None

    r = RunResolver()
    assert r.resolve(pod, owner).run_id == "ml:sweep:5e5e5e5e" and fetched == ["Job", "JobSet"]
    # Without permission to read the Job, the JobSet's pod label still names it (no UID known then).
    assert r.resolve(pod, lambda ns, ref: None).run_id == "ml:sweep"
    # A RayJob's worker pods: owned by a RayCluster, labelled with the RayJob.
    ray = ObjectInfo.from_json(
        "Pod",
        pod_json(
            "rl",
            "rayjob-x-raycluster-worker-1",
            "p",
            owner=("ray.io/v1", "RayCluster", "rayjob-x-raycluster", "c0ffee00-aaaa"),
            labels={"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": "rayjob-x"},
        ),
    )
    got = r.resolve(ray, lambda ns, ref: None)
    assert got.run_id == "rl:rayjob-x:c0ffee00" and got.kind == "RayJob"
    # A plain Job is a run; run_kinds decides what counts.
    plain = ObjectInfo.from_json(
        "Pod", pod_json("b", "etl-xyz", "p", owner=("batch/v1", "Job", "etl", "e71e71e7-9"))
    )
    assert r.resolve(plain, lambda ns, ref: None).run_id == "b:etl:e71e71e7"
    assert RunResolver(run_kinds=("PyTorchJob",)).resolve(plain).run_id == "b:etl-xyz:p"  # the pod (uid "p")


def test_run_ids_are_ones_the_api_accepts() -> None:
    long = run_id_for("a" * 63, "b" * 253, "0123456789abcdef")
    assert len(long) == 128 and RUN_ID_RE.fullmatch(long) and long.endswith(":01234567")
    assert RUN_ID_RE.fullmatch(run_id_for("ml", "llm.v2-run", None))


# ---------------------------------------------------------------- the attribution step


@pytest.fixture
def cluster(sock: Path) -> Iterator[tuple[FakeKubelet, FakeApiServer, Path]]:
    pods = [
        ("ml", "llm-pretrain-master-0", {"pytorch": [("nvidia.com/gpu", [U[0], U[1]])]}),
        ("ml", "llm-pretrain-worker-0", {"pytorch": [("nvidia.com/gpu", [U[2]])]}),
        (
            "ml",
            "infer-a",
            {"srv": [("nvidia.com/mig-3g.40gb", ["MIG-5f1c0d2e-aaaa-5000-9000-000000000001"])]},
        ),
        (
            "ml",
            "infer-b",
            {"srv": [("nvidia.com/mig-3g.40gb", ["MIG-5f1c0d2e-aaaa-5000-9000-000000000002"])]},
        ),
        ("dev", "no-gpu", {"c": [("example.com/nic", ["eth1"])]}),
    ]
    meta = [
        pod_json("ml", "llm-pretrain-master-0", "pod-m", {"team": "research"}, owner=PTJ),
        pod_json("ml", "llm-pretrain-worker-0", "pod-w", owner=PTJ),
        pod_json("ml", "infer-a", "1a000000-0000"),
        pod_json("ml", "infer-b", "1b000000-0000"),
        pod_json("other", "elsewhere", "x", node="node-b"),
    ]
    with FakeKubelet(sock, pods) as kubelet, FakeApiServer(meta) as api:
        token = sock.parent / "token"
        token.write_text("sa-token\n")
        yield kubelet, api, token


def attribution(
    sock: Path, api: FakeApiServer | None, token: Path | None, **kw: Any
) -> KubernetesAttribution:
    meta = ApiServer(api.url, token_file=token) if api is not None else None
    return KubernetesAttribution("node-a", PodResourcesClient(sock, timeout_s=5), meta, **kw)


def test_rows_get_the_run_of_the_pod_holding_their_gpu_or_mig_instance(
    cluster: tuple[FakeKubelet, FakeApiServer, Path], sock: Path
) -> None:
    _, api, token = cluster
    k8s = attribution(sock, api, token)
    assert k8s.refresh()
    att = Attributor(use_processes=False, kubernetes=k8s)
    got = att.label(rows(4, mig_on=3), None, mig_facts(3))
    by = {(r["gpu"], r["mig_instance"]): r["run_id"] for r in got}
    assert by == {
        (0, None): "ml:llm-pretrain:7d1e5a90",
        (1, None): "ml:llm-pretrain:7d1e5a90",
        (2, None): "ml:llm-pretrain:7d1e5a90",
        # Two runs on the MIG instances of GPU 3: the whole GPU's row carries neither.
        (3, None): None,
        (3, 1): "ml:infer-a:1a000000",
        (3, 2): "ml:infer-b:1b000000",
    }
    assert att.runs["ml:llm-pretrain:7d1e5a90"].team == "research"
    assert att.runs["ml:infer-a:1a000000"].facts() == {
        "source": "kubernetes",
        "name": "infer-a",
        "team": "ml",
        "labels": {
            "k8s.namespace": "ml",
            "k8s.kind": "Pod",
            "k8s.name": "infer-a",
            "k8s.uid": "1a000000-0000",
        },
    }
    # One pod list for the node, no owner fetch for a PyTorchJob.
    assert [p for p in api.requests if "pods" in p] and all(
        "nodeName%3Dnode-a" in p or "nodeName=node-a" in p for p in api.requests
    )


def test_shared_replicas_go_to_the_run_holding_most_of_them(sock: Path) -> None:
    pods = [
        ("a", "p1", {"c": [("nvidia.com/gpu.shared", [U[0] + "::0"])]}),
        ("b", "p2", {"c": [("nvidia.com/gpu.shared", [U[0] + "::1", U[0] + "::2"])]}),
    ]
    with FakeKubelet(sock, pods):
        k8s = attribution(sock, None, None)
        assert k8s.refresh()
        got = Attributor(use_processes=False, kubernetes=k8s).label(rows(1), None)
    assert got[0]["run_id"] == "b:p2"  # no metadata: the pod is the run


def test_a_kubelet_that_stops_answering_leaves_rows_unattributed(sock: Path) -> None:
    clock = [0.0]
    with FakeKubelet(sock, [("ml", "p", {"c": [("nvidia.com/gpu", [U[0]])]})]) as kubelet:
        k8s = attribution(sock, None, None, refresh_s=5.0, clock=lambda: clock[0])
        assert k8s.refresh()
        att = Attributor(use_processes=False, kubernetes=k8s)
        assert att.label(rows(1), None)[0]["run_id"] == "ml:p"
    kubelet.server.stop(None).wait(5)
    clock[0] = 10.0
    assert not k8s.refresh() and k8s.errors["kubelet"] == 1
    assert att.label(rows(1), None)[0]["run_id"] == "ml:p"  # within three refresh periods
    clock[0] = 16.0
    assert att.label(rows(1), None)[0]["run_id"] is None and att.runs == {}


def test_metadata_outage_makes_pods_their_own_runs_and_a_pod_keeps_its_run(sock: Path) -> None:
    pods = [("ml", "m-0", {"c": [("nvidia.com/gpu", [U[0]])]})]
    with FakeKubelet(sock, pods), FakeApiServer([pod_json("ml", "m-0", "abcdef01-2", owner=PTJ)]) as api:
        bad = sock.parent / "wrong-token"
        bad.write_text("nope")
        k8s = attribution(sock, api, bad, metadata_refresh_s=0.0)
        assert k8s.refresh() and k8s.errors["api"] == 1
        att = Attributor(use_processes=False, kubernetes=k8s)
        assert att.label(rows(1), None)[0]["run_id"] == "ml:m-0"
        bad.write_text("sa-token")
        assert k8s.refresh()
        assert att.label(rows(1), None)[0]["run_id"] == "ml:m-0"  # not split in two mid-life


def test_dcgm_exporter_pod_labels_and_process_pod_uids_name_runs(
    cluster: tuple[FakeKubelet, FakeApiServer, Path], sock: Path
) -> None:
    kubelet, api, token = cluster
    k8s = attribution(sock, api, token, refresh_s=0.5)
    assert k8s.refresh()
    # A pod the snapshot lacks is asked for with Get, in the background.
    kubelet.pods.append(("ml", "late", {"c": [("nvidia.com/gpu", [U[1]])]}))
    api.pods.append(pod_json("ml", "late", "1a7e0000-0000", owner=PTJ))
    att = Attributor(use_processes=False, kubernetes=k8s)
    row = {
        "gpu": 7,
        "uuid": "GPU-not-known-here",
        "mig_instance": None,
        "labels": {"pod": "late", "namespace": "ml", "container": "c"},
    }
    assert att.label([row], None)[0]["run_id"] is None and "labels" not in row
    k8s.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            row = {"gpu": 7, "mig_instance": None, "labels": {"pod": "late", "namespace": "ml"}}
            if att.label([row], None)[0]["run_id"] is not None:
                break
            time.sleep(0.05)
    finally:
        k8s.stop()
    assert row["run_id"] == "ml:llm-pretrain:7d1e5a90" and kubelet.calls["Get"] >= 1
    # A process's cgroup names a pod UID: the run of that pod.
    assert k8s.run_for_pod_uid("1a000000-0000") is not None
    # Without Kubernetes attribution, dcgm-exporter's labels still name the pod as the run.
    plain = Attributor(use_processes=False)
    got = plain.label([{"gpu": 0, "labels": {"pod": "p", "namespace": "ns", "pod_uid": ""}}], None)
    assert got[0]["run_id"] == "ns:p" and plain.runs["ns:p"].kind == "Pod"


def test_api_server_lists_the_nodes_pods_page_by_page_and_reads_owners(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("sa-token")
    pods = [pod_json("ns", f"p{i}", f"u{i}", node="node-a" if i % 2 == 0 else "node-b") for i in range(7)]
    job = {"metadata": {"namespace": "ns", "name": "j", "uid": "ju"}}
    with FakeApiServer(pods, {"/apis/batch/v1/namespaces/ns/jobs/j": job}, forbidden=["rayclusters"]) as api:
        client = ApiServer(api.url, token_file=token)
        client.page_size = 2
        got = client.pods_on_node("node-a")
        assert sorted(got) == [("ns", "p0"), ("ns", "p2"), ("ns", "p4"), ("ns", "p6")]
        assert sum("/api/v1/pods" in r for r in api.requests) == 2
        owner = client.owner("ns", OwnerRef("Job", "j", "ju", "batch/v1"))
        assert owner is not None and owner.uid == "ju"
        assert client.owner("ns", OwnerRef("PyTorchJob", "x", "u", "kubeflow.org/v1")) is None  # not followed
        from gpufleet.agent.k8s.pods import ApiError

        with pytest.raises(ApiError, match="HTTP 403") as e:
            client.owner("ns", OwnerRef("RayCluster", "rc", "u", "ray.io/v1"))
        assert e.value.status == 403
        client.close()


def test_the_agent_builds_kubernetes_attribution_from_its_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpufleet.agent.main import kubernetes_attribution
    from gpufleet.config import AgentSettings, KubernetesSettings

    assert kubernetes_attribution(AgentSettings(), "n") is None
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    k = kubernetes_attribution(
        AgentSettings(
            kubernetes=KubernetesSettings(
                enabled=True,
                pod_resources_socket=tmp_path / "none.sock",
                timeout_s=0.5,
                team_labels=["owner"],
            )
        ),
        "n",
    )
    # Outside a pod there is no API server: attribution runs on the kubelet alone (pods are runs).
    assert k is not None and k.metadata is None and list(k.resolver.team_labels) == ["owner"]
    assert k.refresh() is False and k.errors["kubelet"] == 1
