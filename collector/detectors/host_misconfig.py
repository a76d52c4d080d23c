"""Host misconfiguration: node settings and GPU faults that hold a node back.

Node settings give one node-scoped finding per node listing every issue;
``cause`` is the more serious one (``cpu_quota`` > ``cpu_governor``):

* ``cpu_governor``: a CPU frequency governor in ``bad_governors``
  (``powersave``) — the data pipeline runs at the lowest clocks;
* ``cpu_quota``: a CPU quota below ``min_cores_per_gpu`` cores per GPU.

Repeated XID errors give a GPU-scoped finding (cause ``repeated_xid``) on each
GPU of the node with at least ``xid_min_events`` XIDs in the window, from the
first to the last of them: the ``xid`` column holds the last XID of each
interval, 0 if none; codes in ``xid_ignore`` are skipped.

Node facts (``Window.node_facts[node]``, as reported by the agent) read:

* governor: ``cpu_governors`` (``{"performance": 64}``), else
  ``cpu_governor`` (or ``scaling_governor``, ``governor``) — one name,
  ``"mixed: ondemand=2,performance=6"``, or a list / mapping of names;
* quota: ``cpu_quota_cores`` (cores; None or <= 0 unlimited), or
  ``cpu_quota_us`` with ``cpu_period_us`` (cgroup v1), or ``cpu_max``
  (cgroup v2 ``"max 100000"`` / ``"200000 100000"``);
* GPUs: ``gpu_count``, else the GPUs of the node seen in the window.

They are read through :class:`gpufleet.facts.NodeFacts`: a node whose facts
do not fit (``"cpu_quota_cores": "lots"`` stored before ingest checked them)
reads as not reporting that fact, so it fails at most its own finding, never
the sweep of the fleet.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpufleet.collector.detectors.config import DetectorConfig
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.facts import NodeFacts
from gpufleet.xid import meanings as xid_meanings

KIND = "host_misconfig"
GOVERNOR_KEYS = ("cpu_governor", "scaling_governor", "governor")


def governors(facts: NodeFacts | Mapping[str, Any]) -> set[str]:
    """The CPU frequency governors the node reports, lower case."""
    f = NodeFacts.read(facts)
    counts = f.cpu_governors
    if counts:
        return {str(k).strip().lower() for k, v in counts.items() if v}
    for key in GOVERNOR_KEYS:
        val = getattr(f, key)
        if val is None:
            continue
        if isinstance(val, str):
            text = val.strip().lower()
            if text.startswith("mixed:"):
                # "mixed: ondemand=2,performance=6"
                return {part.split("=")[0].strip() for part in text[6:].split(",") if part.strip()}
            return {text}
        items = val.values() if isinstance(val, dict) else val
        return {str(x).strip().lower() for x in items if x is not None}
    return set()


def quota_cores(facts: NodeFacts | Mapping[str, Any]) -> float | None:
    """CPU quota in cores, None when unlimited or not reported."""
    f = NodeFacts.read(facts)
    val = f.cpu_quota_cores
    if val is None and f.cpu_quota_us is not None and f.cpu_period_us:
        val = f.cpu_quota_us / f.cpu_period_us
    if val is None and f.cpu_max is not None:
        parts = f.cpu_max.split()
        if parts and parts[0] != "max" and (len(parts) == 1 or float(parts[1]) > 0):
            val = float(parts[0]) / float(parts[1] if len(parts) > 1 else 100000)
    if val is None:
        return None
    q = float(val)
    return q if q > 0 and math.isfinite(q) else None


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    cfg = config
    gpus_of: dict[str, set[int]] = defaultdict(set)
    first_seen: dict[str, float] = {}
    t_first = fr.time(fr.starts)
    for (node, gpu), t0 in zip(fr.keys, t_first.tolist(), strict=True):
        gpus_of[node].add(int(gpu))
        if t0 < first_seen.get(node, math.inf):
            first_seen[node] = t0
    for node, h in window.hosts.items():
        if len(h):
            first_seen[node] = min(first_seen.get(node, math.inf), float(h.t[0]))
    out = []
    for node in sorted(set(window.node_facts) | set(gpus_of)):
        facts = NodeFacts.read(window.node_facts.get(node))
        issues: list[str] = []
        evidence: dict[str, Any] = {}
        gov = governors(facts)
        if gov:
            evidence["cpu_governor"] = sorted(gov)
        if gov & set(cfg.bad_governors):
            issues.append("cpu_governor")
        ngpu = facts.gpu_count or len(gpus_of.get(node, ()))
        quota = quota_cores(facts)
        evidence["cpu_quota_cores"] = quota
        evidence["gpu_count"] = int(ngpu) if ngpu else None
        evidence["cpu_count"] = facts.cpu_count
        if quota is not None and ngpu and quota < cfg.min_cores_per_gpu * float(ngpu):
            issues.append("cpu_quota")
        if not issues:
            continue
        evidence["issues"] = issues
        cause = "cpu_quota" if "cpu_quota" in issues else "cpu_governor"
        start = max(first_seen.get(node, window.t_start), window.t_start)
        out.append(Finding(KIND, cause, "warning", start, evidence, node=node, last_active=window.t_end))
    out.extend(_xid_findings(fr, cfg))
    return out


def _xid_findings(fr: Frame, cfg: DetectorConfig) -> list[Finding]:
    """One finding per GPU with at least ``xid_min_events`` XIDs in the window."""
    if fr.rows == 0 or not fr.has("xid"):
        return []
    x = fr.transient("xid")
    hit = x > 0
    if cfg.xid_ignore:
        hit &= ~np.isin(x, np.asarray(cfg.xid_ignore, dtype=x.dtype))
    idx = np.flatnonzero(hit)
    x = x[idx]
    rows = fr.row_of(idx)
    out = []
    for r in np.unique(rows).tolist():
        sel = rows == r
        mine = idx[sel]
        if mine.size < cfg.xid_min_events:
            continue
        times = fr.time(mine)
        codes = sorted({int(c) for c in x[sel].tolist()})
        node, gpu = fr.keys[r]
        evidence = {"xid_events": int(mine.size), "xid_codes": codes, "last_xid": int(x[sel][-1]),
                    "xid_meanings": xid_meanings(codes)}
        last = float(times[-1])
        out.append(Finding(
            KIND, "repeated_xid", "critical", float(times[0]), evidence,
            run_id=fr.run_id_at(r, last), node=node, gpu=gpu, last_active=last,
            # XIDs come sparsely: the next may be a window away.
            hold_s=fr.window.t_end - fr.window.t_start,
        ))
    return out
