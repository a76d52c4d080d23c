"""Host misconfiguration: node settings that hold its GPUs back.

Node-scoped, one finding per node listing every issue; ``cause`` is the most
serious one (``xid`` > ``cpu_quota`` > ``cpu_governor``):

* ``cpu_governor``: a CPU frequency governor in ``bad_governors``
  (``powersave``) — the data pipeline runs at the lowest clocks;
* ``cpu_quota``: a CPU quota below ``min_cores_per_gpu`` cores per GPU;
* ``xid``: at least ``xid_min_events`` XID events on the node's GPUs in the
  window (the ``xid`` column holds the last XID of each interval, 0 if none;
  codes in ``xid_ignore`` are skipped).

Node facts (``Window.node_facts[node]``, as reported by the agent) read:

* governor: ``cpu_governor`` (or ``scaling_governor``, ``governor``) — a
  string, or a list / mapping of per-CPU strings;
* quota: ``cpu_quota_cores`` (cores; None or <= 0 unlimited), or
  ``cpu_quota_us`` with ``cpu_period_us`` (cgroup v1), or ``cpu_max``
  (cgroup v2 ``"max 100000"`` / ``"200000 100000"``);
* GPUs: ``gpu_count``, else the GPUs of the node seen in the window.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

import numpy as np

from collector.detectors.config import DetectorConfig
from collector.detectors.frame import Frame
from collector.detectors.window import Finding, Window

KIND = "host_misconfig"
GOVERNOR_KEYS = ("cpu_governor", "scaling_governor", "governor")


def governors(facts: dict[str, Any]) -> set[str]:
    for key in GOVERNOR_KEYS:
        val = facts.get(key)
        if val is None:
            continue
        if isinstance(val, str):
            return {val.strip().lower()}
        items = val.values() if isinstance(val, dict) else val
        return {str(x).strip().lower() for x in items if x is not None}
    return set()


def quota_cores(facts: dict[str, Any]) -> float | None:
    """CPU quota in cores, None when unlimited or not reported."""
    val = facts.get("cpu_quota_cores")
    if val is None and facts.get("cpu_quota_us") is not None and facts.get("cpu_period_us"):
        val = float(facts["cpu_quota_us"]) / float(facts["cpu_period_us"])
    if val is None and isinstance(facts.get("cpu_max"), str):
        parts = facts["cpu_max"].split()
        if parts and parts[0] != "max":
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
    t_first = fr.t[fr.starts]
    for (node, gpu), t0 in zip(fr.keys, t_first.tolist(), strict=True):
        gpus_of[node].add(int(gpu))
        if t0 < first_seen.get(node, math.inf):
            first_seen[node] = t0
    for node, h in window.hosts.items():
        if len(h):
            first_seen[node] = min(first_seen.get(node, math.inf), float(h.t[0]))
    xids = _xid_events(fr, cfg)
    nodes = sorted(set(window.node_facts) | set(gpus_of) | set(xids))
    out = []
    for node in nodes:
        facts = window.node_facts.get(node) or {}
        issues: list[str] = []
        evidence: dict[str, Any] = {}
        start = max(first_seen.get(node, window.t_start), window.t_start)
        last = window.t_end
        gov = governors(facts)
        if gov:
            evidence["cpu_governor"] = sorted(gov)
        if gov & set(cfg.bad_governors):
            issues.append("cpu_governor")
        ngpu = facts.get("gpu_count") or len(gpus_of.get(node, ()))
        quota = quota_cores(facts)
        evidence["cpu_quota_cores"] = quota
        evidence["gpu_count"] = int(ngpu) if ngpu else None
        if quota is not None and ngpu and quota < cfg.min_cores_per_gpu * float(ngpu):
            issues.append("cpu_quota")
        ev = xids.get(node)
        if ev is not None:
            times, codes, gpus = ev
            evidence["xid_events"] = len(times)
            evidence["xid_codes"] = sorted(set(codes))
            evidence["xid_gpus"] = sorted(set(gpus))
            if len(times) >= cfg.xid_min_events:
                if not issues:
                    start, last = min(times), max(times)
                issues.append("xid")
        if not issues:
            continue
        cause = next(c for c in ("xid", "cpu_quota", "cpu_governor") if c in issues)
        evidence["issues"] = issues
        severity = "critical" if "xid" in issues else "warning"
        out.append(Finding(KIND, cause, severity, start, evidence, node=node, last_active=last))
    return out


def _xid_events(fr: Frame, cfg: DetectorConfig) -> dict[str, tuple[list[float], list[int], list[int]]]:
    """Per node: times, codes and GPU indexes of the XID events in the window."""
    out: dict[str, tuple[list[float], list[int], list[int]]] = {}
    if fr.rows == 0 or not fr.has("xid"):
        return out
    x = fr.col("xid")
    hit = x > 0
    if cfg.xid_ignore:
        hit &= ~np.isin(x, np.asarray(cfg.xid_ignore, dtype=np.float64))
    idx = np.flatnonzero(hit)
    for i, r in zip(idx.tolist(), fr.row_of(idx).tolist(), strict=True):
        node, gpu = fr.keys[r]
        ev = out.setdefault(node, ([], [], []))
        ev[0].append(float(fr.t[i]))
        ev[1].append(int(x[i]))
        ev[2].append(int(gpu))
    return out
