"""A small stand-in for Grafana's HTTP API on loopback, recording every request.

It implements the endpoints ``gpufleet dashboards push`` uses with Grafana's
own status codes and shapes: data sources by uid (404 when missing, 409 on a
duplicate name), folders, and ``POST /api/dashboards/db`` (412 when a uid
exists and ``overwrite`` is false), behind ``Authorization: Bearer``.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Recorded:
    method: str
    path: str
    authorization: str | None
    body: Any


@dataclass
class FakeGrafana:
    token: str
    requests: list[Recorded] = field(default_factory=list)
    datasources: dict[str, dict[str, Any]] = field(default_factory=dict)
    folders: dict[str, dict[str, Any]] = field(default_factory=dict)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    url: str = ""

    def __enter__(self) -> FakeGrafana:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                body = json.loads(raw) if raw else None
                auth = self.headers.get("Authorization")
                fake.requests.append(Recorded(self.command, self.path, auth, body))
                if auth != f"Bearer {fake.token}":
                    return self._send(401, {"message": "Unauthorized"})
                status, answer = fake.route(self.command, self.path, body)
                self._send(status, answer)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()

    def route(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        parts = path.split("?")[0].strip("/").split("/")
        if parts[:1] != ["api"]:
            return 404, {"message": "Not found"}
        parts = parts[1:]
        if parts == ["health"] and method == "GET":
            return 200, {"database": "ok", "version": "11.3.1"}
        if parts[:2] == ["datasources", "uid"] and len(parts) == 3:
            uid = parts[2]
            if method == "GET":
                ds = self.datasources.get(uid)
                return (200, ds) if ds else (404, {"message": "Data source not found"})
            if method == "PUT":
                if uid not in self.datasources:
                    return 404, {"message": "Data source not found"}
                self.datasources[uid] = {**body, "id": self.datasources[uid]["id"], "uid": uid}
                return 200, {"datasource": self.datasources[uid], "message": "Datasource updated"}
        if parts == ["datasources"] and method == "POST":
            if any(d["name"] == body["name"] for d in self.datasources.values()):
                return 409, {"message": "data source with the same name already exists"}
            ds = {**body, "id": len(self.datasources) + 1}
            self.datasources[body["uid"]] = ds
            return 200, {"datasource": ds, "id": ds["id"], "message": "Datasource added", "name": ds["name"]}
        if parts[:1] == ["folders"]:
            if method == "GET" and len(parts) == 2:
                f = self.folders.get(parts[1])
                return (200, f) if f else (404, {"message": "folder not found"})
            if method == "POST" and len(parts) == 1:
                uid = body.get("uid") or f"f{len(self.folders)}"
                if uid in self.folders:
                    return 409, {"message": "a folder with the same uid already exists"}
                self.folders[uid] = {"uid": uid, "title": body["title"], "id": len(self.folders) + 1}
                return 200, self.folders[uid]
        if parts == ["dashboards", "db"] and method == "POST":
            d = body.get("dashboard") or {}
            if not d.get("title"):
                return 400, {"message": "Dashboard title cannot be empty"}
            uid = str(d.get("uid"))
            old = self.dashboards.get(uid)
            if old is not None and not body.get("overwrite"):
                return 412, {
                    "status": "name-exists",
                    "message": "A dashboard with the same uid already exists",
                }
            folder = body.get("folderUid")
            if folder and folder not in self.folders:
                return 400, {"message": "folder not found"}
            version = (old["version"] + 1) if old else 1
            self.dashboards[uid] = {"dashboard": d, "folderUid": folder, "version": version}
            return 200, {
                "id": len(self.dashboards),
                "uid": uid,
                "url": f"/d/{uid}/x",
                "status": "success",
                "version": version,
            }
        return 404, {"message": "Not found"}
