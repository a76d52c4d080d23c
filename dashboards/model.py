"""Small builders for Grafana dashboard JSON (schema version 39, Grafana 10.4-11.x).

Every query goes to the PostgreSQL data source chosen by the ``datasource``
variable, so one set of files serves any Grafana: nothing names a host, a data
source id or a URL.  Panel ids and positions are assigned by :class:`Board`,
so they are unique and non-overlapping by construction (the validator checks
the written files again anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Plugin id of Grafana's PostgreSQL data source (10.3+; older versions used "postgres").
DS_TYPE = "grafana-postgresql-datasource"
DS_REF: dict[str, str] = {"type": DS_TYPE, "uid": "${datasource}"}
SCHEMA_VERSION = 39
TAG = "gpufleet"
#: The "All" value of multi-value variables: a quoted SQL literal, inserted as is
#: (Grafana does not format custom all values), so ``'__all' IN (${v:sqlstring})``
#: is true for All and the same list works for one or several picks.
ALL_VALUE = "'__all'"


def target(sql: str, fmt: str = "time_series", ref: str = "A") -> dict[str, Any]:
    if fmt not in ("time_series", "table"):
        raise ValueError(f"format {fmt!r}")
    return {
        "refId": ref,
        "datasource": DS_REF,
        "editorMode": "code",
        "format": fmt,
        "rawQuery": True,
        "rawSql": sql.strip(),
    }


def datasource_variable() -> dict[str, Any]:
    return {
        "type": "datasource",
        "name": "datasource",
        "label": "Data source",
        "query": DS_TYPE,
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
        "includeAll": False,
        "multi": False,
    }


def query_variable(
    name: str, label: str, sql: str, *, multi: bool = True, refresh: int = 2, description: str = ""
) -> dict[str, Any]:
    """A SQL-backed variable; multi-value ones offer "All" as :data:`ALL_VALUE`.

    ``refresh``: 1 on dashboard load, 2 on time-range change.
    """
    var: dict[str, Any] = {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS_REF,
        "description": description,
        "query": sql.strip(),
        "definition": sql.strip(),
        "refresh": refresh,
        "regex": "",
        "sort": 1,
        "hide": 0,
        "options": [],
        "multi": multi,
        "includeAll": multi,
    }
    if multi:
        var["allValue"] = ALL_VALUE
        var["current"] = {"selected": True, "text": ["All"], "value": ["$__all"]}
    else:
        var["current"] = {}
    return var


def sql_annotation(name: str, sql: str, color: str = "red") -> dict[str, Any]:
    """Incidents as annotations: the query returns ``time``, ``timeend``, ``text``, ``tags``."""
    return {
        "name": name,
        "datasource": DS_REF,
        "enable": True,
        "hide": False,
        "iconColor": color,
        "target": target(sql, "table", "Anno"),
    }


BUILTIN_ANNOTATION: dict[str, Any] = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


@dataclass
class Panel:
    """One panel before layout: ``kind`` is Grafana's panel type."""

    kind: str
    title: str
    targets: list[dict[str, Any]]
    description: str
    unit: str | None = None
    w: int = 12
    h: int = 8
    options: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self, pid: int, x: int, y: int) -> dict[str, Any]:
        defaults = dict(self.defaults)
        if self.unit:
            defaults["unit"] = self.unit
        if self.custom:
            defaults["custom"] = self.custom
        return {
            "id": pid,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DS_REF,
            "gridPos": {"x": x, "y": y, "w": self.w, "h": self.h},
            "targets": self.targets,
            "options": self.options,
            "fieldConfig": {"defaults": defaults, "overrides": self.overrides},
            **self.extra,
        }


def timeseries(
    title: str,
    sql: str,
    description: str,
    unit: str | None = None,
    *,
    w: int = 12,
    h: int = 8,
    stack: bool = False,
    max_points: int | None = None,
    min_interval: str | None = None,
    legend: str = "list",
    draw: str = "line",
    fill: int = 10,
) -> Panel:
    custom: dict[str, Any] = {
        "drawStyle": draw,
        "lineWidth": 1,
        "fillOpacity": fill,
        "showPoints": "never",
        "spanNulls": False,
        "axisSoftMin": 0,
    }
    if stack:
        custom["stacking"] = {"mode": "normal", "group": "A"}
    extra: dict[str, Any] = {}
    if max_points:
        extra["maxDataPoints"] = max_points
    if min_interval:
        extra["interval"] = min_interval
    return Panel(
        "timeseries",
        title,
        [target(sql)],
        description,
        unit,
        w,
        h,
        options={
            "legend": {"displayMode": legend, "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        custom=custom,
        extra=extra,
    )


def heatmap(
    title: str,
    sql: str,
    description: str,
    unit: str | None = None,
    *,
    w: int = 12,
    h: int = 9,
    max_points: int | None = 300,
    min_interval: str | None = None,
    scheme: str = "Oranges",
) -> Panel:
    """One row per series (a GPU), coloured by value: Grafana's "time series buckets" layout."""
    extra: dict[str, Any] = {"maxDataPoints": max_points} if max_points else {}
    if min_interval:
        extra["interval"] = min_interval
    return Panel(
        "heatmap",
        title,
        [target(sql)],
        description,
        unit,
        w,
        h,
        options={
            "calculate": False,
            "yAxis": {"axisPlacement": "left", "unit": "none"},
            "rowsFrame": {"layout": "auto"},
            "color": {
                "mode": "scheme",
                "scheme": scheme,
                "steps": 64,
                "fill": "dark-orange",
                "exponent": 0.5,
                "reverse": False,
            },
            "cellGap": 0,
            "tooltip": {"mode": "single", "yHistogram": False},
            "legend": {"show": True},
        },
        extra=extra,
    )


def stat(
    title: str,
    sql: str,
    description: str,
    unit: str | None = None,
    *,
    w: int = 6,
    h: int = 4,
    decimals: int | None = None,
    thresholds: list[tuple[float | None, str]] | None = None,
    color_mode: str = "value",
) -> Panel:
    defaults: dict[str, Any] = {}
    if decimals is not None:
        defaults["decimals"] = decimals
    steps = thresholds or [(None, "green")]
    defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}
    defaults["color"] = {"mode": "thresholds"}
    return Panel(
        "stat",
        title,
        [target(sql, "table")],
        description,
        unit,
        w,
        h,
        options={
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": color_mode,
            "graphMode": "none",
            "justifyMode": "auto",
            "textMode": "value_and_name",
            "orientation": "auto",
        },
        defaults=defaults,
    )


def bars(
    title: str,
    sql: str,
    description: str,
    unit: str | None = None,
    *,
    w: int = 12,
    h: int = 8,
    horizontal: bool = True,
    x_field: str | None = None,
) -> Panel:
    """A bar chart of a table: one string column (categories) and numeric columns."""
    options: dict[str, Any] = {
        "orientation": "horizontal" if horizontal else "vertical",
        "showValue": "auto",
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
        "tooltip": {"mode": "multi"},
        "xTickLabelRotation": 0,
        "stacking": "none",
    }
    if x_field:
        options["xField"] = x_field
    return Panel(
        "barchart",
        title,
        [target(sql, "table")],
        description,
        unit,
        w,
        h,
        options=options,
        custom={"fillOpacity": 80, "lineWidth": 1},
    )


def table(
    title: str,
    sql: str,
    description: str,
    *,
    w: int = 24,
    h: int = 9,
    units: dict[str, str] | None = None,
    sort_by: str | None = None,
    desc: bool = True,
) -> Panel:
    overrides = [
        {"matcher": {"id": "byName", "options": col}, "properties": [{"id": "unit", "value": unit}]}
        for col, unit in (units or {}).items()
    ]
    options: dict[str, Any] = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
    if sort_by:
        options["sortBy"] = [{"displayName": sort_by, "desc": desc}]
    return Panel(
        "table",
        title,
        [target(sql, "table")],
        description,
        None,
        w,
        h,
        options=options,
        custom={"align": "auto", "filterable": True},
        overrides=overrides,
    )


def text(title: str, markdown: str, *, w: int = 24, h: int = 3) -> dict[str, Any]:
    """A note (no query); returned as a layout-ready dict without datasource."""
    return {"kind": "text", "title": title, "markdown": markdown, "w": w, "h": h}


class Board:
    """Lays panels out left to right in rows of 24 columns; ids count from 1."""

    def __init__(
        self, uid: str, title: str, description: str, *, time_from: str = "now-6h", refresh: str = "1m"
    ) -> None:
        self.uid = uid
        self.title = title
        self.description = description
        self.time_from = time_from
        self.refresh = refresh
        self.variables: list[dict[str, Any]] = [datasource_variable()]
        self.annotations: list[dict[str, Any]] = [BUILTIN_ANNOTATION]
        self.panels: list[dict[str, Any]] = []
        self._x = 0
        self._y = 0
        self._row_h = 0

    def _place(self, w: int, h: int) -> tuple[int, int]:
        if self._x + w > 24:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        x, y = self._x, self._y
        self._x += w
        self._row_h = max(self._row_h, h)
        return x, y

    def _next_id(self) -> int:
        return len(self.panels) + 1

    def row(self, title: str) -> None:
        """A collapsible section header starting a new line."""
        if self._x:
            self._x, self._y, self._row_h = 0, self._y + self._row_h, 0
        self.panels.append(
            {
                "id": self._next_id(),
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self._y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self._y += 1

    def add(self, *panels: Panel | dict[str, Any]) -> None:
        for p in panels:
            if isinstance(p, dict):  # a text note
                x, y = self._place(p["w"], p["h"])
                self.panels.append(
                    {
                        "id": self._next_id(),
                        "type": "text",
                        "title": p["title"],
                        "gridPos": {"x": x, "y": y, "w": p["w"], "h": p["h"]},
                        "options": {"mode": "markdown", "content": p["markdown"]},
                    }
                )
                continue
            x, y = self._place(p.w, p.h)
            self.panels.append(p.to_json(self._next_id(), x, y))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": None,
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": [TAG],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": self.refresh,
            "liveNow": False,
            "time": {"from": self.time_from, "to": "now"},
            "fiscalYearStartMonth": 0,
            "timepicker": {},
            "weekStart": "",
            "links": [
                {
                    "title": "gpufleet",
                    "type": "dashboards",
                    "tags": [TAG],
                    "asDropdown": True,
                    "includeVars": False,
                    "keepTime": True,
                    "icon": "external link",
                    "targetBlank": False,
                }
            ],
            "templating": {"list": self.variables},
            "annotations": {"list": self.annotations},
            "panels": self.panels,
        }
