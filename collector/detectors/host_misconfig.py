"""Host misconfiguration: node settings and GPU faults that hold a node back.

Node settings give one node-scoped finding per node listing every issue;
``cause`` is the most serious one (``cpu_quota`` > ``numa_affinity`` >
``nfs_stall`` > ``cpu_governor``):

* ``cpu_quota``: a job's cgroup (the processes on its GPUs) may use fewer
  than ``min_cores_per_gpu`` cores per GPU it feeds;
* ``numa_affinity``: the processes on a GPU may run only on CPUs of other
  NUMA nodes than the GPU's: every batch crosses the inter-socket link;
* ``nfs_stall``: an NFS mount retransmitted or timed out RPCs, or its RPCs
  wait ``nfs_stall_queue_ms`` in the backlog (or round trips take
  ``nfs_stall_rtt_ms``), over the agent's last interval;
* ``cpu_governor``: a CPU frequency governor in ``bad_governors``
  (``powersave``) — the data pipeline runs at the lowest clocks.

Repeated XID errors give a GPU-scoped finding (cause ``repeated_xid``) on each
GPU of the node with at least ``xid_min_events`` XIDs in the window, from the
first to the last of them: the ``xid`` column holds the last XID of each
interval, 0 if none; codes in ``xid_ignore`` are skipped.

Where each comes from (``Window.node_facts[node]``, as the agent reports
them, and the window's GPU rows):

* quota, first choice: the job cgroups the agent's node checks list
  (``job_cgroups``: cgroup, GPUs fed, ``cpu_quota_cores``); else the GPU
  rows' ``job_cpu_quota_cores`` (the job's cgroup read each tick), the GPUs of
  one run on the node counted together; only where no job's cgroup is
  reported at all, the node-level facts ``cpu_quota_cores`` (cores; None or
  <= 0 unlimited), ``cpu_quota_us`` with ``cpu_period_us`` (cgroup v1) or
  ``cpu_max`` (v2 ``"max 100000"`` / ``"200000 100000"``) against the node's
  GPUs (``gpu_count``, else those seen in the window).  The agent's own cgroup
  says nothing about a job's (on cgroup v2 its root has no ``cpu.max`` at
  all), so it is never the basis;
* NUMA: ``gpu_processes`` (``gpu_numa_node`` against ``numa_nodes`` of the
  CPUs the processes may run on);
* NFS: ``nfs_mounts`` over an interval (figures counted since the mount say
  nothing about now and are left out);
* governor: ``cpu_governors`` (``{"performance": 64}``), else
  ``cpu_governor`` (or ``scaling_governor``, ``governor``) — one name,
  ``"mixed: ondemand=2,performance=6"``, or a list / mapping of names.

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

from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.stats import last_per_group
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import HostSettingsEvidence, JobQuota, NfsStall, NumaMisplaced, RepeatedXidEvidence
from gpufleet.facts import NodeFacts
from gpufleet.nfs import nfs_verdict
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
        gov = governors(facts)
        if gov & set(cfg.bad_governors):
            issues.append("cpu_governor")
        ngpu = facts.gpu_count or len(gpus_of.get(node, ()))
        jobs, basis = job_quotas(fr, node, facts)
        short: list[JobQuota] = []
        quota: float | None
        if basis is not None:
            short = [
                j
                for j in jobs
                if j["cpu_quota_cores"] is not None
                and j["gpus"]
                and j["cpu_quota_cores"] < cfg.min_cores_per_gpu * len(j["gpus"])
            ]
            limited = [q for j in (short or jobs) if (q := j["cpu_quota_cores"]) is not None]
            quota = min(limited) if limited else None
            if short:
                issues.append("cpu_quota")
        else:
            quota = quota_cores(facts)
            if quota is not None and ngpu and quota < cfg.min_cores_per_gpu * float(ngpu):
                issues.append("cpu_quota")
        misplaced = numa_misplaced(facts)
        if misplaced:
            issues.append("numa_affinity")
        stalls = nfs_stalls(facts, cfg)
        if stalls:
            issues.append("nfs_stall")
        if not issues:
            continue
        evidence: HostSettingsEvidence = {
            "gpu_count": int(ngpu) if ngpu else None,
            "cpu_count": facts.cpu_count,
            "quota_basis": basis,
            "cpu_quota_cores": quota,
            "issues": issues,
        }
        if gov:
            evidence["cpu_governor"] = sorted(gov)
        if basis is not None:
            evidence["jobs"] = jobs
        if short:
            evidence["jobs_short"] = [j["job"] for j in short]
        if misplaced:
            evidence["numa_misplaced"] = misplaced
        if stalls:
            evidence["nfs_stalls"] = stalls
        cause = next(c for c in CAUSE_ORDER if c in issues)
        start = max(first_seen.get(node, window.t_start), window.t_start)
        out.append(Finding(KIND, cause, "warning", start, evidence, node=node, last_active=window.t_end))
    out.extend(_xid_findings(fr, cfg))
    return out


#: The node-setting causes, most serious first.
CAUSE_ORDER = ("cpu_quota", "numa_affinity", "nfs_stall", "cpu_governor")


def job_quotas(fr: Frame, node: str, facts: NodeFacts) -> tuple[list[JobQuota], str | None]:
    """The CPU quota of each job's cgroup on ``node`` and the GPUs it feeds, and where that was read:
    ``job_cgroup`` (the agent's node checks), ``job_columns`` (the GPU rows), or None (no job reported)."""
    listed = [j for j in facts.job_cgroups or () if j.gpus]
    if listed:
        return [
            {"job": j.cgroup, "gpus": sorted(j.gpus or []), "cpu_quota_cores": j.cpu_quota_cores}
            for j in listed
        ], "job_cgroup"
    has_job, quota = _job_columns(fr)
    rows = fr.rows_by_node.get(node)
    if rows is None:
        return [], None
    rows = rows[has_job[rows]]
    if rows.size == 0:
        return [], None
    by_run: dict[str, JobQuota] = {}
    for r in rows.tolist():
        ri = int(fr.run_of_row[r])
        name = f"run {fr.window.runs[ri].run_id}" if ri >= 0 else "no run"
        job = by_run.setdefault(name, {"job": name, "gpus": [], "cpu_quota_cores": None})
        job["gpus"].append(fr.keys[r][1])
        q = float(quota[r])
        if q > 0:
            have = job["cpu_quota_cores"]
            job["cpu_quota_cores"] = q if have is None else min(have, q)
    return [{**j, "gpus": sorted(j["gpus"])} for _, j in sorted(by_run.items())], "job_columns"


def _job_columns(fr: Frame) -> tuple[np.ndarray, np.ndarray]:
    """Per row: whether any sample carries the job's cgroup (a process used the GPU), and the
    row's last reported quota (NaN: none, unlimited).  Once per frame, vectorised."""
    hit = fr.shared.job_columns
    if hit is not None:
        return hit
    has = np.zeros(fr.rows, dtype=bool)
    quota = np.full(fr.rows, np.nan)
    if fr.rows and fr.has("job_cpu_cores"):
        seen = np.isfinite(fr.transient("job_cpu_cores"))
        if seen.any():
            has = fr.row_sum(seen) > 0
            q = fr.col("job_cpu_quota_cores")
            fin = np.flatnonzero(np.isfinite(q))
            quota = last_per_group(fr.row_of(fin), q[fin].astype(np.float64), fr.rows)
    fr.shared.job_columns = (has, quota)
    return has, quota


def numa_misplaced(facts: NodeFacts) -> list[NumaMisplaced]:
    """GPUs whose processes may run only on CPUs of NUMA nodes other than the GPU's."""
    out: list[NumaMisplaced] = []
    for p in facts.gpu_processes or ():
        if p.gpu_numa_node is None or p.numa_nodes is None or not p.numa_nodes:
            continue
        if p.gpu_numa_node not in p.numa_nodes:
            out.append(
                {
                    "gpu": p.gpu,
                    "gpu_numa_node": p.gpu_numa_node,
                    "numa_nodes": list(p.numa_nodes),
                    "cpus_allowed": p.cpus_allowed,
                }
            )
    return out


def nfs_stalls(facts: NodeFacts, cfg: DetectorConfig) -> list[NfsStall]:
    """NFS mounts that stalled over the agent's last interval (``fail`` or ``warn``)."""
    out: list[NfsStall] = []
    for m in facts.nfs_mounts or ():
        if m.since_mount:
            continue
        status, why = nfs_verdict(m.ops, m.retrans, m.timeouts, m.queue_ms, m.rtt_ms, cfg)
        if status != "ok":
            out.append(
                {
                    "mountpoint": m.mountpoint,
                    "device": m.device,
                    "why": why,
                    "ops": m.ops,
                    "retrans": m.retrans,
                    "timeouts": m.timeouts,
                    "queue_ms": m.queue_ms,
                    "rtt_ms": m.rtt_ms,
                }
            )
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
        evidence: RepeatedXidEvidence = {
            "xid_events": int(mine.size),
            "xid_codes": codes,
            "last_xid": int(x[sel][-1]),
            "xid_meanings": xid_meanings(codes),
        }
        last = float(times[-1])
        out.append(
            Finding(
                KIND,
                "repeated_xid",
                "critical",
                float(times[0]),
                evidence,
                run_id=fr.run_id_at(r, last),
                node=node,
                gpu=gpu,
                last_active=last,
                # XIDs come sparsely: the next may be a window away.
                hold_s=fr.window.t_end - fr.window.t_start,
            )
        )
    return out
