"""A stand-in kubelet for tests: the real pod-resources gRPC service on a unix socket, and a
loopback API server answering the pod and owner reads the agent makes.

:class:`FakeKubelet` serves ``v1.PodResourcesLister`` with the generated
servicer of ``agent/k8s/podresources.proto``, so the bytes on the socket
are the kubelet's protocol; the pods it reports are set by the test.
``get_enabled=False`` answers ``Get`` with UNIMPLEMENTED, as kubelets
without the feature gate do.  :class:`FakeApiServer` answers
``GET /api/v1/pods?fieldSelector=spec.nodeName=...`` and owner objects by
path, with 403 for the kinds a test forbids.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import grpc

from gpufleet.agent.k8s import podresources_pb2 as pb
from gpufleet.agent.k8s import podresources_pb2_grpc as pb_grpc

#: One pod as the kubelet reports it: (namespace, name, {container: [(resource, [device ids])]}).
PodSpec = tuple[str, str, Mapping[str, Sequence[tuple[str, Sequence[str]]]]]


def pod_resources(
    ns: str, name: str, containers: Mapping[str, Sequence[tuple[str, Sequence[str]]]]
) -> pb.PodResources:
    return pb.PodResources(
        name=name,
        namespace=ns,
        containers=[
            pb.ContainerResources(
                name=c,
                devices=[pb.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in devs],
            )
            for c, devs in containers.items()
        ],
    )


class _Servicer(pb_grpc.PodResourcesListerServicer):
    def __init__(self, owner: FakeKubelet) -> None:
        self.owner = owner

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.owner.calls["List"] += 1
        return pb.ListPodResourcesResponse(pod_resources=[pod_resources(*p) for p in self.owner.pods])

    def Get(
        self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.GetPodResourcesResponse:
        self.owner.calls["Get"] += 1
        if not self.owner.get_enabled:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "method Get not implemented")
        for p in self.owner.pods:
            if p[0] == request.pod_namespace and p[1] == request.pod_name:
                return pb.GetPodResourcesResponse(pod_resources=pod_resources(*p))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("unreachable")

    def GetAllocatableResources(
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> pb.AllocatableResourcesResponse:
        return pb.AllocatableResourcesResponse()


class FakeKubelet:
    def __init__(self, socket_path: Path, pods: Sequence[PodSpec] = (), get_enabled: bool = True) -> None:
        self.socket_path = Path(socket_path)
        self.pods = list(pods)
        self.get_enabled = get_enabled
        self.calls = {"List": 0, "Get": 0}
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), self.server)
        self.server.add_insecure_port(f"unix://{self.socket_path}")

    def __enter__(self) -> FakeKubelet:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(grace=None).wait(5)


def pod_json(
    ns: str,
    name: str,
    uid: str,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    owner: tuple[str, str, str, str] | None = None,
    node: str = "node-a",
) -> dict[str, Any]:
    """A pod as the API server returns it; ``owner``: (apiVersion, kind, name, uid) of its controller."""
    meta: dict[str, Any] = {
        "namespace": ns,
        "name": name,
        "uid": uid,
        "labels": dict(labels or {}),
        "annotations": dict(annotations or {}),
    }
    if owner is not None:
        meta["ownerReferences"] = [
            {
                "apiVersion": owner[0],
                "kind": owner[1],
                "name": owner[2],
                "uid": owner[3],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"nodeName": node}}


class FakeApiServer:
    """``/api/v1/pods`` (filtered by ``spec.nodeName``, paged by ``limit``) and objects by path."""

    def __init__(
        self,
        pods: Sequence[dict[str, Any]] = (),
        objects: Mapping[str, dict[str, Any]] | None = None,
        forbidden: Sequence[str] = (),
        token: str = "sa-token",
    ) -> None:
        self.pods = list(pods)
        self.objects = dict(objects or {})
        self.forbidden = set(forbidden)
        self.token = token
        self.requests: list[str] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlsplit(self.path)
                me.requests.append(self.path)
                if self.headers.get("Authorization") != f"Bearer {me.token}":
                    return self._send(401, {"kind": "Status", "code": 401})
                if url.path == "/api/v1/pods":
                    return self._send(200, me._list(parse_qs(url.query)))
                if any(f"/{k}/" in url.path for k in me.forbidden):
                    return self._send(403, {"kind": "Status", "code": 403, "reason": "Forbidden"})
                if url.path in me.objects:
                    return self._send(200, me.objects[url.path])
                return self._send(404, {"kind": "Status", "code": 404})

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def _list(self, q: Mapping[str, list[str]]) -> dict[str, Any]:
        sel = (q.get("fieldSelector") or [""])[0]
        node = sel.removeprefix("spec.nodeName=") if sel.startswith("spec.nodeName=") else None
        items = [p for p in self.pods if node is None or p["spec"]["nodeName"] == node]
        start = int((q.get("continue") or ["0"])[0])
        limit = int((q.get("limit") or ["500"])[0])
        page = items[start : start + limit]
        meta = {"continue": str(start + limit)} if start + limit < len(items) else {}
        return {"kind": "PodList", "apiVersion": "v1", "metadata": meta, "items": page}

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
