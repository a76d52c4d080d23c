"""The kubelet's pod-resources API: which container holds which device.

The kubelet serves ``v1.PodResourcesLister`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``); ``List`` returns every pod
on the node with, per container, the device-plugin devices it was given
(``resource_name`` such as ``nvidia.com/gpu`` and the plug-in's
``device_ids``), and ``Get`` one pod (Kubernetes 1.27+, a beta feature gate
since 1.34: older kubelets answer UNIMPLEMENTED, and :meth:`get` says so
with :class:`Unimplemented`).  The messages are generated from
``podresources.proto`` beside this module.

gRPC errors are translated here, once, into :class:`KubeletError` naming the
socket and the status, never passed on as ``grpc.RpcError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from gpufleet.agent.k8s import podresources_pb2 as pb
from gpufleet.agent.k8s.podresources_pb2_grpc import PodResourcesListerStub

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
#: A node with hundreds of pods answers well under this; the gRPC default is 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class KubeletError(RuntimeError):
    """The kubelet's pod-resources API could not answer; the message names the socket and the status."""


class Unimplemented(KubeletError):
    """This kubelet does not serve the method (``Get`` before its feature gate)."""


@dataclass(frozen=True)
class ContainerDevice:
    """One device of one container: ``resource`` (``nvidia.com/gpu``...) and the plug-in's ``device_id``."""

    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class PodDevices:
    namespace: str
    name: str
    devices: tuple[ContainerDevice, ...]


def _pod(p: pb.PodResources) -> PodDevices:
    return PodDevices(
        p.namespace,
        p.name,
        tuple(
            ContainerDevice(c.name, d.resource_name, i)
            for c in p.containers
            for d in c.devices
            for i in d.device_ids
        ),
    )


class PodResourcesClient:
    """A client of one kubelet socket; one channel, reused (close it with :meth:`close`)."""

    def __init__(self, socket_path: Path | str = DEFAULT_SOCKET, timeout_s: float = 2.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(
            f"unix://{self.socket_path}", options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        )
        self._stub = PodResourcesListerStub(self._channel)

    def _error(self, method: str, e: grpc.RpcError) -> KubeletError:
        code = e.code() if isinstance(e, grpc.Call) else None
        detail = e.details() if isinstance(e, grpc.Call) else str(e)
        cls = Unimplemented if code == grpc.StatusCode.UNIMPLEMENTED else KubeletError
        name = code.name if code is not None else "error"
        return cls(f"kubelet pod-resources {method} on {self.socket_path}: {name}: {detail}")

    def list(self) -> list[PodDevices]:
        """Every pod on the node with its devices."""
        try:
            resp = self._stub.List(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise self._error("List", e) from None
        return [_pod(p) for p in resp.pod_resources]

    def get(self, namespace: str, name: str) -> PodDevices | None:
        """One pod's devices; None when the kubelet does not know the pod."""
        try:
            resp = self._stub.Get(
                pb.GetPodResourcesRequest(pod_name=name, pod_namespace=namespace), timeout=self.timeout_s
            )
        except grpc.RpcError as e:
            if isinstance(e, grpc.Call) and e.code() == grpc.StatusCode.NOT_FOUND:
                return None
            raise self._error("Get", e) from None
        return _pod(resp.pod_resources) if resp.HasField("pod_resources") else None

    def close(self) -> None:
        self._channel.close()
