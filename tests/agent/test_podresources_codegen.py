"""The committed pod-resources modules are what grpcio-tools makes of the committed proto, and the
proto speaks the kubelet's wire protocol (package, service, methods, field numbers and types)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from gpufleet.agent.k8s import podresources_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_podresources", ROOT / "tools" / "gen_podresources.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_podresources"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_generated_modules_match_the_proto(tmp_path: Path) -> None:
    # needs grpcio-tools, a dev dependency: every environment that runs the tests has it
    gen = load_generator()
    for path in gen.generate(tmp_path):
        committed = ROOT / "agent" / "k8s" / path.name
        assert committed.read_bytes() == path.read_bytes(), (
            f"{committed.relative_to(ROOT)} differs from what the proto generates: run python tools/gen_podresources.py"
        )


def test_the_proto_is_the_kubelets_v1_api() -> None:
    svc = pb.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert svc.full_name == "v1.PodResourcesLister"
    assert {m.name: (m.input_type.full_name, m.output_type.full_name) for m in svc.methods} == {
        "List": ("v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse"),
        "GetAllocatableResources": ("v1.AllocatableResourcesRequest", "v1.AllocatableResourcesResponse"),
        "Get": ("v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse"),
    }

    def fields(msg: str) -> dict[str, tuple[int, int, bool]]:
        d = pb.DESCRIPTOR.message_types_by_name[msg]
        return {f.name: (f.number, f.type, f.is_repeated) for f in d.fields}

    F = pb.DESCRIPTOR.message_types_by_name["PodResources"].fields[0]
    STR, MSG, I64 = F.TYPE_STRING, F.TYPE_MESSAGE, F.TYPE_INT64
    assert fields("ListPodResourcesResponse") == {"pod_resources": (1, MSG, True)}
    assert fields("PodResources") == {
        "name": (1, STR, False),
        "namespace": (2, STR, False),
        "containers": (3, MSG, True),
        "cpu_ids": (4, I64, True),
        "memory": (5, MSG, True),
    }
    assert fields("ContainerResources")["devices"] == (2, MSG, True)
    assert fields("ContainerResources")["dynamic_resources"] == (5, MSG, True)
    assert fields("ContainerDevices") == {
        "resource_name": (1, STR, False),
        "device_ids": (2, STR, True),
        "topology": (3, MSG, False),
    }
    assert fields("GetPodResourcesRequest") == {"pod_name": (1, STR, False), "pod_namespace": (2, STR, False)}
    assert fields("GetPodResourcesResponse") == {"pod_resources": (1, MSG, False)}
    # Bytes as the kubelet writes them: field 1 (pod_resources) of a List answer, field 2 (namespace)...
    raw = pb.ListPodResourcesResponse(
        pod_resources=[pb.PodResources(name="p", namespace="n")]
    ).SerializeToString()
    assert raw == b"\x0a\x06\x0a\x01p\x12\x01n"
