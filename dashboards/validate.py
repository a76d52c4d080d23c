"""Structural checks of dashboard JSON, the mistakes Grafana accepts silently.

Each check returns readable problems instead of raising, so one run lists
them all.  What the queries *return* is checked separately, against a
database (:mod:`gpufleet.dashboards.dryrun`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from gpufleet.dashboards.dryrun import panels
from gpufleet.dashboards.model import DS_REF, DS_TYPE

#: Macros of the PostgreSQL data source and the global variables Grafana substitutes.
MACROS = frozenset(
    {
        "__time",
        "__timeEpoch",
        "__timeFilter",
        "__timeFrom",
        "__timeTo",
        "__timeGroup",
        "__timeGroupAlias",
        "__unixEpochFilter",
        "__unixEpochNanoFilter",
        "__unixEpochNanoFrom",
        "__unixEpochNanoTo",
        "__unixEpochGroup",
        "__unixEpochGroupAlias",
        "__unixEpochFrom",
        "__unixEpochTo",
    }
)
GLOBALS = frozenset({"__interval", "__interval_ms", "__from", "__to"})
PANEL_FORMATS = {
    "timeseries": "time_series",
    "heatmap": "time_series",
    "stat": "table",
    "table": "table",
    "barchart": "table",
    "bargauge": "table",
    "piechart": "table",
}
UID_RE = re.compile(r"^[A-Za-z0-9_-]{1,40}$")
#: Anything that ties a dashboard to one installation.
HOST_PATTERNS = (
    (re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://"), "a URL"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}\b"), "an IP address"),
    (re.compile(r"\blocalhost\b", re.I), "localhost"),
    (re.compile(r"\b[A-Za-z][\w.-]*:\d{2,5}\b"), "a host:port"),
)
_VAR_RE = re.compile(r"\$(\w+)|\[\[(\w+?)(?::(\w+))?\]\]|\$\{(\w+)(?:\.([^:^\}]+))?(?::([^\}]+))?\}")
_MACRO_CALL_RE = re.compile(r"\$(__\w+)\(")


def _strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, Mapping):
        for k, v in node.items():
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, f"{path}[{i}]")


def _queries(d: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(where, rawSql) of every query: targets, variables, annotations."""
    for p in panels(d):
        for t in p.get("targets", []):
            yield f"panel {p.get('id')} ({p.get('title')}) target {t.get('refId')}", t.get("rawSql", "")
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            yield f"variable {v.get('name')}", v.get("query", "")
    for a in d.get("annotations", {}).get("list", []):
        if "target" in a:
            yield f"annotation {a.get('name')}", a["target"].get("rawSql", "")


def _overlap(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def validate(d: Mapping[str, Any]) -> list[str]:
    """Problems of one dashboard."""
    name = d.get("uid") or d.get("title") or "?"
    out: list[str] = []

    def bad(msg: str) -> None:
        out.append(f"{name}: {msg}")

    if not isinstance(d.get("uid"), str) or not UID_RE.match(d["uid"]):
        bad("uid missing or not 1-40 characters of [A-Za-z0-9_-]")
    if not d.get("title"):
        bad("title missing")
    if not isinstance(d.get("schemaVersion"), int):
        bad("schemaVersion missing")
    if d.get("id") is not None:
        bad("id must be null (Grafana assigns it; a fixed id breaks imports into other instances)")

    variables = {v.get("name"): v for v in d.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if not ds_var or ds_var.get("type") != "datasource" or ds_var.get("query") != DS_TYPE:
        bad(f"needs a 'datasource' variable of type datasource over {DS_TYPE}")
    for v in variables.values():
        if v.get("type") == "query" and v.get("datasource") != DS_REF:
            bad(f"variable {v.get('name')}: datasource must be {DS_REF}")

    ids: dict[Any, str] = {}
    boxes: list[tuple[str, Mapping[str, int]]] = []
    for p in panels(d):
        title = p.get("title", "?")
        pid = p.get("id")
        if not isinstance(pid, int):
            bad(f"panel {title!r}: id missing")
        elif pid in ids:
            bad(f"panel id {pid} used by {ids[pid]!r} and {title!r}")
        else:
            ids[pid] = title
        gp = p.get("gridPos")
        if not isinstance(gp, Mapping) or not all(isinstance(gp.get(k), int) for k in "xywh"):
            bad(f"panel {title!r}: gridPos needs integer x, y, w, h")
        else:
            if gp["w"] <= 0 or gp["h"] <= 0 or gp["x"] < 0 or gp["x"] + gp["w"] > 24:
                bad(f"panel {title!r}: gridPos {dict(gp)} outside the 24-column grid")
            for other, ogp in boxes:
                if _overlap(gp, ogp):
                    bad(f"panels {other!r} and {title!r} overlap")
            boxes.append((title, gp))
        kind = p.get("type")
        if kind in ("row", "text"):
            if p.get("targets"):
                bad(f"{kind} panel {title!r} has queries")
            continue
        if p.get("datasource") != DS_REF:
            bad(f"panel {title!r}: datasource must be {DS_REF}, not {p.get('datasource')}")
        if not p.get("targets"):
            bad(f"panel {title!r}: no targets")
        for t in p.get("targets", []):
            if t.get("datasource") != DS_REF:
                bad(f"panel {title!r} target {t.get('refId')}: datasource must be {DS_REF}")
            if not str(t.get("rawSql", "")).strip() or not t.get("rawQuery"):
                bad(f"panel {title!r} target {t.get('refId')}: needs rawSql with rawQuery true")
            want = PANEL_FORMATS.get(str(kind))
            if want and t.get("format") != want:
                bad(f"panel {title!r}: a {kind} panel needs format {want!r}, has {t.get('format')!r}")

    for a in d.get("annotations", {}).get("list", []):
        if a.get("builtIn"):
            continue
        if a.get("datasource") != DS_REF or a.get("target", {}).get("datasource") != DS_REF:
            bad(f"annotation {a.get('name')}: datasource must be {DS_REF}")

    for where, sql in _queries(d):
        for m in _VAR_RE.finditer(sql):
            var = m.group(1) or m.group(2) or m.group(4)
            fmt = m.group(3) or m.group(6)
            if var.startswith("__"):
                if var not in GLOBALS and var not in MACROS:
                    bad(f"{where}: unknown macro or global ${var}")
                continue
            if var not in variables:
                bad(f"{where}: uses ${var}, which is not a dashboard variable")
            elif fmt != "sqlstring":
                bad(f"{where}: ${var} must be written ${{{var}:sqlstring}} (quoted and escaped)")
        for m in _MACRO_CALL_RE.finditer(sql):
            if m.group(1) not in MACROS:
                bad(f"{where}: unknown macro ${m.group(1)}()")

    for path, s in _strings(d):
        for pattern, what in HOST_PATTERNS:
            hit = pattern.search(s)
            if hit:
                bad(f"{path}: contains {what} ({hit.group(0)!r}); dashboards must not name an installation")
    return out


def validate_all(dashboards: Mapping[str, Mapping[str, Any]]) -> list[str]:
    out = [p for d in dashboards.values() for p in validate(d)]
    titles: dict[str, str] = {}
    for uid, d in dashboards.items():
        t = str(d.get("title"))
        if t in titles:
            out.append(f"{uid}: title {t!r} also used by {titles[t]}")
        titles[t] = uid
    return out


def main() -> int:
    from gpufleet.dashboards.loader import load_all

    problems = validate_all(load_all())
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
