"""Pod metadata from the Kubernetes API server: labels, annotations and the chain of owners.

The pod-resources API names pods only (namespace and name).  Mapping a pod
to its job needs its owner references, labels and annotations, and the
owners' own owners (a JobSet's Jobs, a RayJob's RayCluster).  Two places
hold them on a node:

* the kubelet's own pod list (``/pods`` on its port): the read-only port
  10255 is off by default on current clusters (kubeadm, EKS, GKE, AKS), and
  the authenticated port needs the ``nodes/proxy`` permission, which also
  grants exec into every pod of the node -- far more than an agent should
  hold; and it has no owners beyond the pod;
* the API server, with the agent's own service account: ``list pods`` with
  ``fieldSelector=spec.nodeName=<node>`` (the node's pods only, one request)
  and ``get`` on the few owner kinds the walk follows (Jobs, JobSets,
  RayClusters).

gpufleet uses the API server (``deploy/agent/daemonset.yaml`` grants exactly
those read verbs).  Requests are rare: the node's pods are re-listed when
the kubelet shows a pod not seen yet and otherwise every
``metadata_refresh_s``; owners are fetched once per UID.

The service-account token is re-read for every request (projected tokens
rotate).  HTTP and JSON errors become :class:`ApiError` naming the URL.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

#: Where the walk finds an owner kind's objects: (API group path, resource).  Other kinds are not fetched.
OWNER_PATHS: dict[str, tuple[str, str]] = {
    "Job": ("apis/batch/v1", "jobs"),
    "JobSet": ("apis/jobset.x-k8s.io/v1alpha2", "jobsets"),
    "RayCluster": ("apis/ray.io/v1", "rayclusters"),
}


class ApiError(RuntimeError):
    """The API server could not answer (unreachable, refused, forbidden, unparseable)."""

    def __init__(self, msg: str, status: int | None = None) -> None:
        super().__init__(msg)
        self.status = status


@dataclass(frozen=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    api_version: str = ""


@dataclass(frozen=True)
class ObjectInfo:
    """What attribution reads of an object: kind, identity, labels, annotations, controller."""

    kind: str
    namespace: str
    name: str
    uid: str | None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    controller: OwnerRef | None = None

    @classmethod
    def from_json(cls, kind: str, obj: Mapping[str, Any]) -> ObjectInfo:
        meta = obj.get("metadata") or {}
        controller = None
        for ref in meta.get("ownerReferences") or ():
            if isinstance(ref, Mapping) and ref.get("controller") and ref.get("kind") and ref.get("name"):
                controller = OwnerRef(
                    str(ref["kind"]),
                    str(ref["name"]),
                    str(ref.get("uid") or ""),
                    str(ref.get("apiVersion") or ""),
                )
                break
        return cls(
            kind,
            str(meta.get("namespace") or ""),
            str(meta.get("name") or ""),
            str(meta["uid"]) if meta.get("uid") else None,
            _strs(meta.get("labels")),
            _strs(meta.get("annotations")),
            controller,
        )


def _strs(v: Any) -> dict[str, str]:
    return {str(k): x for k, x in v.items() if isinstance(x, str)} if isinstance(v, Mapping) else {}


class ApiServer:
    """A small read-only client of the API server (in-cluster: its env, token and CA by default)."""

    #: Pods per list request (``limit``; the rest follows with ``continue``).
    page_size = 500

    def __init__(
        self,
        url: str | None = None,
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 5.0,
        client: httpx.Client | None = None,
    ) -> None:
        if url is None:
            host, port = (
                os.environ.get("KUBERNETES_SERVICE_HOST"),
                os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
            )
            if not host:
                raise ApiError(
                    "no API server: KUBERNETES_SERVICE_HOST is not set (not in a pod?) and no "
                    "agent.kubernetes.api_server is configured"
                )
            url = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
        self.url = url.rstrip("/")
        self.token_file = token_file if token_file is not None else SA_DIR / "token"
        ca = ca_file if ca_file is not None else SA_DIR / "ca.crt"
        verify: Any = str(ca) if self.url.startswith("https://") and ca.exists() else True
        self._client = client if client is not None else httpx.Client(timeout=timeout_s, verify=verify)

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        try:
            token = self.token_file.read_text().strip()
        except OSError:
            token = ""
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = f"{self.url}/{path}"
        try:
            r = self._client.get(url, params=params, headers=headers)
        except httpx.HTTPError as e:
            raise ApiError(f"GET {url}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise ApiError(f"GET {url}: HTTP {r.status_code}: {r.text[:200]}", r.status_code)
        try:
            return r.json()
        except ValueError:
            raise ApiError(f"GET {url}: the answer is not JSON") from None

    def pods_on_node(self, node: str) -> dict[tuple[str, str], ObjectInfo]:
        """Every pod scheduled on ``node``, by (namespace, name); follows ``continue`` pages."""
        out: dict[tuple[str, str], ObjectInfo] = {}
        params = {"fieldSelector": f"spec.nodeName={node}", "limit": str(self.page_size)}
        for _ in range(100):
            doc = self._get("api/v1/pods", params)
            for item in doc.get("items") or ():
                if isinstance(item, Mapping):
                    info = ObjectInfo.from_json("Pod", item)
                    out[(info.namespace, info.name)] = info
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                break
            params = {**params, "continue": str(token)}
        return out

    def owner(self, namespace: str, ref: OwnerRef) -> ObjectInfo | None:
        """The owner object when its kind is one the walk follows (:data:`OWNER_PATHS`), else None."""
        where = OWNER_PATHS.get(ref.kind)
        if where is None:
            return None
        group = where[0]
        if ref.api_version and "/" in ref.api_version:
            group = f"apis/{ref.api_version}"
        elif ref.api_version:
            group = f"api/{ref.api_version}"
        doc = self._get(
            f"{group}/namespaces/{quote(namespace, safe='')}/{where[1]}/{quote(ref.name, safe='')}"
        )
        return ObjectInfo.from_json(ref.kind, doc)

    def close(self) -> None:
        self._client.close()
