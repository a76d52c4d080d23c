"""The checks as a table for a person, as JSON for tools, and as the node facts the agent sends.

The facts (``gpufleet.facts.NodeFacts``: ``checks``, ``job_cgroups``,
``gpu_processes``, ``nfs_mounts``) carry figures rounded to three significant
digits: they are sent again only when they change, and a counter's last digit
is no reason to resend a node's facts.
"""

from __future__ import annotations

import math
import shutil
import textwrap
from collections import Counter
from typing import Any

from gpufleet.agent.diagnose.result import RANK, Check, worst
from gpufleet.agent.diagnose.view import NodeView
from gpufleet.agent.sources.nvml import format_cpu_list
from gpufleet.agent.sources.placement import nodes_of


def _round(v: Any) -> Any:
    if isinstance(v, float):
        if not math.isfinite(v):
            return None
        return float(f"{v:.3g}")
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_round(x) for x in v]
    return v


def summary_line(checks: list[Check], host: str, interval_s: float | None) -> str:
    counts = Counter(c.status for c in checks)
    parts = [f"{counts[s]} {s}" for s in ("fail", "warn", "unknown", "skipped") if counts[s]]
    span = f", sampled over {interval_s:.1f} s" if interval_s else ""
    return f"gpufleet diagnose on {host}: {len(checks)} checks, {', '.join(parts) or 'all ok'}{span}"


def table(checks: list[Check], width: int | None = None) -> str:
    """One line per check (worst first, checklist order kept within a status), the decision beneath."""
    width = width or max(100, shutil.get_terminal_size((120, 24)).columns)
    rows = sorted(enumerate(checks), key=lambda ic: (RANK[ic[1].status], ic[0]))
    heads = ("STATUS", "CHECK", "SUBJECT", "VALUE")
    cells = [(c.status, c.check, c.subject, _value(c)) for _, c in rows]
    w = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(heads)]
    w[2] = min(w[2], 40)
    lead = sum(w) + 2 * len(w)
    out = ["  ".join(h.ljust(w[i]) for i, h in enumerate(heads)) + "  FINDING"]
    for (_, c), r in zip(rows, cells, strict=True):
        subject = r[2] if len(r[2]) <= w[2] else "…" + r[2][-(w[2] - 1) :]
        first = "  ".join(x.ljust(w[i]) for i, x in enumerate((r[0], r[1], subject, r[3])))
        text = textwrap.wrap(c.finding, max(30, width - lead)) or [""]
        out.append(first + "  " + text[0])
        out.extend(" " * lead + t for t in text[1:])
        if c.decision:
            out.extend(
                textwrap.wrap(
                    c.decision,
                    max(40, width - 8),
                    initial_indent="        -> ",
                    subsequent_indent="           ",
                )
            )
    return "\n".join(out)


def _value(c: Check) -> str:
    if c.value is None:
        return "-"
    text = f"{c.value:.3g}" if isinstance(c.value, float) else str(c.value)
    return f"{text} {c.unit}".strip() if c.unit else text


def document(checks: list[Check], view: NodeView, host: str, time: str) -> dict[str, Any]:
    """The ``--json`` document."""
    return {
        "host": host,
        "time": time,
        "interval_s": view.interval_s,
        "gpu_source": view.gpu_source,
        "status": worst(checks),
        "counts": dict(Counter(c.status for c in checks)),
        "checks": [c.to_dict() for c in checks],
    }


def node_facts(checks: list[Check], view: NodeView) -> dict[str, Any]:
    """The checks and the placement they judged, as node facts (``gpufleet.facts.NodeFacts``)."""
    facts: dict[str, Any] = {
        "checks_status": worst(checks),
        "checks": [
            _round(
                {
                    "check": c.check,
                    "subject": c.subject,
                    "status": c.status,
                    "value": c.value,
                    "unit": c.unit or None,
                    "finding": c.finding,
                    "decision": c.decision or None,
                }
            )
            for c in checks
        ],
    }
    jobs = []
    for j in view.jobs:
        jobs.append(
            _round(
                {
                    "cgroup": j.place.name,
                    "cgroup_version": j.place.version,
                    "gpus": j.gpus,
                    "pids": len(j.pids),
                    "cpu_quota_cores": j.quota.cores,
                    "quota_kind": j.quota.kind,
                    "cpu_cores": j.rates.cpu_cores,
                    "cpu_throttled_share": j.rates.cpu_throttled_share,
                    "cpu_pressure_pct": j.rates.cpu_pressure_pct,
                    "io_pressure_pct": j.rates.io_pressure_pct,
                }
            )
        )
    facts["job_cgroups"] = jobs
    procs = []
    for g in view.gpus:
        if not g.pids:
            continue
        allowed: set[int] = set()
        readable = False
        for pid in g.pids:
            p = view.procs.get(pid)
            if p is not None and p.cpus_allowed is not None:
                allowed |= set(p.cpus_allowed)
                readable = True
        procs.append(
            {
                "gpu": g.index,
                "pids": len(g.pids),
                "gpu_numa_node": g.numa_node,
                "cpus_allowed": format_cpu_list(sorted(allowed)) if readable else None,
                "numa_nodes": nodes_of(sorted(allowed), view.numa) if readable and view.numa else None,
            }
        )
    facts["gpu_processes"] = procs
    facts["nfs_mounts"] = [
        _round(
            {
                "mountpoint": m.mountpoint,
                "device": m.device,
                "interval_s": m.interval_s,
                "since_mount": m.since_mount,
                "ops": m.ops,
                "retrans": m.retrans,
                "timeouts": m.timeouts,
                "queue_ms": m.queue_ms,
                "rtt_ms": m.rtt_ms,
                "execute_ms": m.execute_ms,
                "backlog": m.backlog,
            }
        )
        for m in view.nfs
    ]
    return facts
