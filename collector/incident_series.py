"""One series per open incident, whose labels never change while it is open: what alerts are made of.

A pager lives with an alert per incident, not per GPU, and with an alert
that is not restarted when something about the incident moves.  Prometheus
keys an alert by its labels, so ``gpufleet_incident`` carries only what is
fixed for an incident's life -- its id, kind, run, the run's team, and the
node and GPU it is scoped to (empty for an incident that lists its GPUs, as
that list may grow) -- and its **value** is the severity (1 warning, 2
critical).  The rules (deploy/prometheus/rules) hold a severity with
hysteresis from that value and put it in an annotation, so a severity that
moves never ends one alert and starts another.  What else an alert says
(cause, the GPUs listed) comes from ``gpufleet_incident_info``, read by the
rules' annotation templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

#: Severity -> the value of ``gpufleet_incident``.
SEVERITY_LEVEL = {"info": 0.5, "warning": 1.0, "critical": 2.0}
#: Labels of ``gpufleet_incident``: fixed while the incident is open.
IDENTITY = ("incident_id", "kind", "run_id", "run_team", "node", "gpu")


def _label(v: Any) -> str:
    return "" if v is None else str(v)


def listed(evidence: Any) -> list[str]:
    """``node/gpu`` of each GPU an incident's ``evidence.gpus`` lists."""
    gpus = evidence.get("gpus") if isinstance(evidence, dict) else None
    out: list[str] = []
    for g in gpus if isinstance(gpus, list) else []:
        if isinstance(g, dict) and g.get("gpu") is not None:
            out.append(f"{_label(g.get('node'))}/{g['gpu']}")
        elif isinstance(g, str):
            out.append(g)
    return out


def identity(
    id_: Any, kind: str, run_id: Any, team: Any, node: Any, gpu: Any, evidence: Any, redact: bool = False
) -> tuple[str, ...]:
    """The label values of an incident's series (``IDENTITY`` order)."""
    grouped = gpu is None and bool(listed(evidence))
    return (
        str(id_),
        kind,
        "" if redact else _label(run_id),
        "" if redact else _label(team),
        "" if grouped else _label(node),
        "" if grouped else _label(gpu),
    )


def incident_families(rows: Iterable[tuple[Any, ...]], redact: bool = False) -> Iterator[Metric]:
    """``gpufleet_incident`` and ``gpufleet_incident_info`` from rows of
    (id, kind, run_id, node, gpu, cause, severity, start, evidence, team)."""
    series = GaugeMetricFamily(
        "gpufleet_incident",
        "Open incidents, one series per incident whose labels stay fixed while it is open; "
        "value: its severity now (1 warning, 2 critical)",
        labels=list(IDENTITY),
    )
    info = GaugeMetricFamily(
        "gpufleet_incident_info",
        "What may change about an open incident (value 1): cause, severity, the GPUs "
        "it lists (node/gpu, comma-separated)",
        labels=["incident_id", "cause", "severity", "gpus"],
    )
    for id_, kind, run_id, node, gpu, cause, severity, _start, evidence, team in rows:
        series.add_metric(
            list(identity(id_, kind, run_id, team, node, gpu, evidence, redact)),
            SEVERITY_LEVEL.get(str(severity), 1.0),
        )
        gpus = listed(evidence) or ([f"{node}/{gpu}"] if node is not None and gpu is not None else [])
        info.add_metric([str(id_), _label(cause), _label(severity), "" if redact else ",".join(gpus)], 1.0)
    yield series
    yield info
