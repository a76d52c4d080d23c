"""Push the gpufleet data source and dashboards to a Grafana through its HTTP API.

For Grafanas that are not file-provisioned (``deploy/grafana`` is the file
route): the PostgreSQL data source is created or updated by uid, a folder is
made if missing, and every dashboard is imported with ``overwrite`` so a
second push replaces the first.  Uses the ``grafana-client`` package; errors
of the HTTP exchange are translated once here into :class:`ProvisionError`
(whose text never contains the token or the database password).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import niquests
from grafana_client import GrafanaApi
from grafana_client.client import GrafanaClientError, GrafanaException

from gpufleet.dashboards.model import DS_TYPE

DEFAULT_DS_NAME = "gpufleet"
DEFAULT_DS_UID = "gpufleet-pg"
DEFAULT_FOLDER_UID = "gpufleet"
DEFAULT_FOLDER_TITLE = "gpufleet"


class ProvisionError(RuntimeError):
    """Grafana refused or could not be reached; the message says which step."""


@dataclass(frozen=True)
class DataSource:
    """How Grafana reaches the gpufleet database (a read-only role is enough)."""

    host: str
    port: int
    database: str
    user: str
    password: str | None = field(default=None, repr=False)
    sslmode: str = "require"
    #: Grafana's TimescaleDB option ($__timeGroup as time_bucket); the dashboards work either way.
    timescaledb: bool = False
    name: str = DEFAULT_DS_NAME
    uid: str = DEFAULT_DS_UID

    @classmethod
    def from_url(cls, url: str, password: str | None = None, **kw: Any) -> DataSource:
        """From a ``postgresql://user[:password]@host[:port]/database`` URL."""
        parts = urlsplit(url)
        if parts.scheme not in ("postgresql", "postgres", "postgresql+psycopg") or not parts.hostname:
            raise ProvisionError("data source URL must be postgresql://user@host[:port]/database")
        database = parts.path.lstrip("/")
        if not database or not parts.username:
            raise ProvisionError("data source URL needs a user and a database name")
        pw = password if password is not None else (unquote(parts.password) if parts.password else None)
        return cls(parts.hostname, parts.port or 5432, database, unquote(parts.username), pw, **kw)

    def payload(self) -> dict[str, Any]:
        """The body of ``POST /api/datasources`` (and of the update by uid)."""
        body: dict[str, Any] = {
            "name": self.name,
            "uid": self.uid,
            "type": DS_TYPE,
            "access": "proxy",
            "url": f"{self.host}:{self.port}",
            "user": self.user,
            "database": self.database,
            "isDefault": False,
            "jsonData": {
                "database": self.database,
                "sslmode": self.sslmode,
                "postgresVersion": 1500,
                "timescaledb": self.timescaledb,
                "timeInterval": "1s",
                "maxOpenConns": 10,
                "maxIdleConns": 10,
                "connMaxLifetime": 14400,
            },
        }
        if self.password is not None:
            body["secureJsonData"] = {"password": self.password}
        return body


@dataclass
class PushResult:
    datasource: str  # "created" or "updated"
    folder: str  # "created" or "exists"
    dashboards: list[str] = field(default_factory=list)


def bind_datasource(dashboard: Mapping[str, Any], ds: DataSource) -> dict[str, Any]:
    """A copy whose ``datasource`` variable starts on the pushed data source."""
    d = copy.deepcopy(dict(dashboard))
    d["id"] = None
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "datasource" and v.get("name") == "datasource":
            v["current"] = {"selected": True, "text": ds.name, "value": ds.uid}
    return d


def _is_404(e: GrafanaException) -> bool:
    return isinstance(e, GrafanaClientError) and e.status_code == 404


def connect(grafana_url: str, token: str, timeout_s: float = 15.0) -> GrafanaApi:
    """A client authenticating with a service-account token (``Authorization: Bearer``)."""
    parts = urlsplit(grafana_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ProvisionError("--grafana-url must be http(s)://host[:port][/path]")
    if parts.username or parts.password:
        raise ProvisionError("give the token with --token, not in the Grafana URL")
    return GrafanaApi.from_url(grafana_url.rstrip("/"), credential=token, timeout=timeout_s)


def push(
    api: GrafanaApi,
    ds: DataSource,
    dashboards: Iterable[Mapping[str, Any]],
    *,
    folder_uid: str = DEFAULT_FOLDER_UID,
    folder_title: str = DEFAULT_FOLDER_TITLE,
    message: str = "gpufleet dashboards push",
) -> PushResult:
    step = "reading the data source"
    try:
        try:
            api.datasource.get_datasource_by_uid(ds.uid)
            exists = True
        except GrafanaException as e:
            if not _is_404(e):
                raise
            exists = False
        step = "updating the data source" if exists else "creating the data source"
        if exists:
            api.datasource.update_datasource_by_uid(ds.uid, ds.payload())
        else:
            api.datasource.create_datasource(ds.payload())
        result = PushResult("updated" if exists else "created", "exists")
        step = "reading the folder"
        try:
            api.folder.get_folder(folder_uid)
        except GrafanaException as e:
            if not _is_404(e):
                raise
            step = "creating the folder"
            api.folder.create_folder(folder_title, uid=folder_uid)
            result.folder = "created"
        for d in dashboards:
            step = f"importing dashboard {d.get('uid')}"
            api.dashboard.update_dashboard(
                {
                    "dashboard": bind_datasource(d, ds),
                    "folderUid": folder_uid,
                    "overwrite": True,
                    "message": message,
                }
            )
            result.dashboards.append(str(d.get("uid")))
        return result
    except GrafanaException as e:
        raise ProvisionError(f"Grafana refused {step}: {_describe(e)}") from None
    except niquests.exceptions.RequestException as e:
        raise ProvisionError(f"cannot reach Grafana while {step}: {type(e).__name__}") from None


def _describe(e: GrafanaException) -> str:
    if not e.status_code:
        return "no HTTP answer (" + type(e).__name__ + ")"
    body = e.response
    message = body.get("message") if isinstance(body, dict) else None
    return f"HTTP {e.status_code}" + (f": {message}" if message else "")
