"""Runs in Prometheus: gpufleet's per-run figures beside dcgm-exporter's series, for fleets on Prometheus.

The other boards read gpufleet's database; this one reads a Prometheus that
scrapes the collector (``gpufleet_run_*``, ``gpufleet_gpu_*``: docs/contracts.md
section 4) and dcgm-exporter.  Energy, cost and CO2e of the runs picked, their
GPU time by ledger state and goodput, and -- where ``run_metrics.per_gpu`` is on
-- dcgm-exporter's utilisation, power and temperature of the GPUs those runs
hold, joined on the GPU's ``UUID`` through ``gpufleet_gpu_run_info``.  The
JSON is written to ``prometheus/`` beside the PostgreSQL boards (Grafana's
file provisioning loads it from there too); its data source is picked by its
own ``datasource`` variable, of type Prometheus.
"""

from __future__ import annotations

from typing import Any

from gpufleet.dashboards.model import BUILTIN_ANNOTATION, SCHEMA_VERSION, TAG

UID = "gpufleet-prom-runs"
DS_TYPE = "prometheus"
DS_REF: dict[str, str] = {"type": DS_TYPE, "uid": "${datasource}"}
#: The runs picked (team and run variables), as a label matcher.
SEL = 'team=~"$team", run=~"$run"'
#: dcgm-exporter's series of the GPUs the runs picked hold, with their run and team.
HELD = f"gpufleet_gpu_run_info{{{SEL}}}"


def dcgm_per_run(series: str, agg: str = "avg") -> str:
    return f"{agg} by (run) ({series} * on(UUID) group_left(run, team) {HELD})"


def _target(expr: str, legend: str = "", *, instant: bool = False, ref: str = "A") -> dict[str, Any]:
    t: dict[str, Any] = {
        "refId": ref,
        "datasource": DS_REF,
        "editorMode": "code",
        "expr": expr,
        "legendFormat": legend or "__auto",
        "range": not instant,
        "instant": instant,
    }
    if instant:
        t["format"] = "table"
    return t


def _variable(name: str, label: str, query: str, description: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DS_REF,
        "description": description,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "regex": "",
        "sort": 1,
        "hide": 0,
        "options": [],
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
    }


class _Layout:
    def __init__(self) -> None:
        self.panels: list[dict[str, Any]] = []
        self.x = self.y = self.row_h = 0

    def add(
        self,
        kind: str,
        title: str,
        targets: list[dict[str, Any]],
        description: str,
        *,
        unit: str | None = None,
        w: int = 12,
        h: int = 8,
        options: dict[str, Any] | None = None,
        custom: dict[str, Any] | None = None,
        decimals: int | None = None,
    ) -> None:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        defaults: dict[str, Any] = {}
        if unit:
            defaults["unit"] = unit
        if decimals is not None:
            defaults["decimals"] = decimals
        if custom:
            defaults["custom"] = custom
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": kind,
                "title": title,
                "description": description,
                "datasource": DS_REF,
                "gridPos": {"x": self.x, "y": self.y, "w": w, "h": h},
                "targets": targets,
                "options": options or {},
                "fieldConfig": {"defaults": defaults, "overrides": []},
            }
        )
        self.x += w
        self.row_h = max(self.row_h, h)

    def row(self, title: str) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        self.panels.append(
            {
                "id": len(self.panels) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1},
                "panels": [],
            }
        )
        self.y += 1


_STAT = {
    "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
    "colorMode": "value",
    "graphMode": "area",
    "justifyMode": "auto",
    "textMode": "value_and_name",
    "orientation": "auto",
}
_SERIES = {
    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
    "tooltip": {"mode": "multi", "sort": "desc"},
}
_LINE = {
    "drawStyle": "line",
    "lineWidth": 1,
    "fillOpacity": 10,
    "showPoints": "never",
    "spanNulls": True,
    "axisSoftMin": 0,
}


def build() -> dict[str, Any]:
    lay = _Layout()
    lay.add(
        "stat",
        "Energy",
        [_target(f"sum(gpufleet_run_energy_kwh_total{{{SEL}}})", "kWh")],
        "Facility energy of the runs picked (running, or ended within run_metrics.horizon_s).",
        unit="kwatth",
        w=6,
        h=4,
        options=_STAT,
    )
    lay.add(
        "stat",
        "Cost",
        [_target(f"sum by (currency) (gpufleet_run_cost_total{{{SEL}}})", "{{currency}}")],
        "Energy plus compute cost of the runs picked, per currency.",
        w=6,
        h=4,
        options=_STAT,
        decimals=2,
    )
    lay.add(
        "stat",
        "CO2e",
        [_target(f"sum(gpufleet_run_co2e_kg_total{{{SEL}}})", "kg")],
        "CO2e of the runs picked, kg (runs whose carbon intensity is unknown are not in it).",
        unit="masskg",
        w=6,
        h=4,
        options=_STAT,
    )
    lay.add(
        "stat",
        "Goodput",
        [
            _target(
                f'sum(gpufleet_run_gpu_seconds_total{{{SEL}, state="productive"}}) / sum(gpufleet_run_gpu_seconds_total{{{SEL}}})',
                "goodput",
            )
        ],
        "Productive share of the GPU time of the runs picked (the ledger, docs/contracts.md 3.3).",
        unit="percentunit",
        w=6,
        h=4,
        options=_STAT,
    )
    lay.row("Runs")
    lay.add(
        "timeseries",
        "Energy by team",
        [_target(f"sum by (team) (gpufleet_run_energy_kwh_total{{{SEL}}})", "{{team}}")],
        "Facility energy so far of each team's runs (a run leaves the sum run_metrics.horizon_s after it ends).",
        unit="kwatth",
        options=_SERIES,
        custom=_LINE,
    )
    lay.add(
        "timeseries",
        "Cost by team",
        [_target(f"sum by (team, currency) (gpufleet_run_cost_total{{{SEL}}})", "{{team}} {{currency}}")],
        "Cost so far of each team's runs, per currency.",
        options=_SERIES,
        custom=_LINE,
    )
    lay.add(
        "bargauge",
        "GPU-hours by state",
        [
            _target(
                f"sum by (state) (gpufleet_run_gpu_seconds_total{{{SEL}}}) / 3600", "{{state}}", instant=True
            )
        ],
        "Where the GPU time of the runs picked went: productive, or lost idle, hung, starved, in checkpoints, "
        "waiting on stragglers, throttled.",
        unit="h",
        w=12,
        h=8,
        options={
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    )
    lay.add(
        "bargauge",
        "Energy by run",
        [
            _target(
                f"topk(20, sum by (run) (gpufleet_run_energy_kwh_total{{{SEL}}}))", "{{run}}", instant=True
            )
        ],
        "The 20 runs picked that used the most facility energy.",
        unit="kwatth",
        w=12,
        h=8,
        options={
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        },
    )
    lay.add(
        "timeseries",
        "Goodput by run",
        [_target(f"gpufleet_run_goodput{{{SEL}}}", "{{run}}")],
        "Productive share of each run's GPU time as the ledger moves.",
        unit="percentunit",
        options=_SERIES,
        custom=_LINE,
        w=24,
    )
    lay.row("Their GPUs, from dcgm-exporter")
    lay.add(
        "timeseries",
        "GPU utilisation by run",
        [_target(dcgm_per_run("DCGM_FI_DEV_GPU_UTIL"), "{{run}}")],
        "dcgm-exporter's GPU-Util averaged over the GPUs each running run holds (needs run_metrics.per_gpu).",
        unit="percent",
        options=_SERIES,
        custom=_LINE,
        w=8,
    )
    lay.add(
        "timeseries",
        "GPU power by run",
        [_target(dcgm_per_run("DCGM_FI_DEV_POWER_USAGE", "sum"), "{{run}}")],
        "dcgm-exporter's board power summed over the GPUs each running run holds, W.",
        unit="watt",
        options=_SERIES,
        custom=_LINE,
        w=8,
    )
    lay.add(
        "timeseries",
        "Hottest GPU by run",
        [_target(dcgm_per_run("DCGM_FI_DEV_GPU_TEMP", "max"), "{{run}}")],
        "dcgm-exporter's hottest GPU temperature among each running run's GPUs, °C.",
        unit="celsius",
        options=_SERIES,
        custom=_LINE,
        w=8,
    )
    lay.add(
        "timeseries",
        "Open incidents on their GPUs",
        [
            _target(
                f"sum by (kind) (gpufleet_gpu_incident_open * on(UUID) group_left(run, team) {HELD})",
                "{{kind}}",
            )
        ],
        "gpufleet's open incidents on the GPUs the runs picked hold, by kind.",
        options=_SERIES,
        custom={**_LINE, "drawStyle": "bars", "fillOpacity": 60},
        w=24,
    )
    return {
        "id": None,
        "uid": UID,
        "title": "gpufleet: runs in Prometheus",
        "description": "Energy, cost, CO2e, GPU time by state and goodput per run from the collector's /metrics, "
        "beside dcgm-exporter's series of the GPUs the runs hold.",
        "tags": [TAG, "prometheus"],
        "timezone": "browser",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "1m",
        "liveNow": False,
        "time": {"from": "now-6h", "to": "now"},
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
        "templating": {
            "list": [
                {
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
                },
                _variable(
                    "team",
                    "Team",
                    "label_values(gpufleet_run_energy_kwh_total, team)",
                    "Teams of the runs the collector exports.",
                ),
                _variable(
                    "run",
                    "Run",
                    'label_values(gpufleet_run_energy_kwh_total{team=~"$team"}, run)',
                    "Runs of the teams picked.",
                ),
            ]
        },
        "annotations": {"list": [BUILTIN_ANNOTATION]},
        "panels": lay.panels,
    }
