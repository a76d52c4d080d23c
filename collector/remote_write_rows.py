"""Pieces of one (node, time) merged into the rows the agent would have sent, as one checked batch.

What is left of the agent's rules once a node's scrape is whole
(:mod:`gpufleet.collector.remote_write_pieces` applied the others):

* cells of one row from several pieces: the lower field priority wins, then
  the earlier piece;
* ``mem_total_mib`` is free + used + reserved framebuffer where the exporter
  prints no total; MIG instance rows carry no whole-board quantity;
* ``xid``: dcgm-exporter's XID count in its window where it exports one (the
  most frequent XID), else the XID gauge when it changed since this node's
  previous scrape (the gauge keeps the last XID for ever; the first scrape
  cannot tell, and reports it, as the agent does);
* host rows: node_exporter's counters between this scrape and the node's
  previous one, through the agent's own arithmetic
  (:func:`gpufleet.agent.sources.host.host_rates`: mpstat's CPU shares,
  iostat's busiest disk, physical interfaces summed); the first scrape of a
  node has no rates, and a changed boot time is a reboot.

The batch is then checked by :func:`gpufleet.wire.validate` and
:func:`gpufleet.collector.ingest_bounds.check`, as every batch an agent sends, and its id is ``rw:<time in ms>``: a (node, time) is stored
once, so a retried request whose rows are already in is not stored again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from gpufleet.agent.sources.host import (
    CpuTimes,
    DiskCounters,
    HostSnapshot,
    NetCounters,
    carry_offline_cpus,
    host_rates,
    is_physical_nic,
    is_stacked_disk,
    is_whole_disk,
)
from gpufleet.catalog import GPU_BY_NAME, HOST_BY_NAME, INT_RANGES, WHOLE_GPU_FIELDS
from gpufleet.collector import ingest_bounds
from gpufleet.collector.remote_write_pieces import ABSENT
from gpufleet.collector.remote_write_series import FB_FREE, FB_RESERVED, XID_GAUGE
from gpufleet.wire import Batch, WireError, validate

log = logging.getLogger(__name__)

_DISK_FIELDS = ("rd_ios", "rd_sectors", "rd_ticks_ms", "wr_ios", "wr_sectors", "wr_ticks_ms", "io_ticks_ms")
_NET_FIELDS = ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets")
_PSEUDO = (FB_FREE, FB_RESERVED, XID_GAUGE)


def batch_id(t_ms: int) -> str:
    return f"rw:{t_ms}"


@dataclass
class NodeState:
    """What assembling a node's next scrape needs from its previous one."""

    t_ms: int = -1
    host: HostSnapshot | None = None
    boot: float | None = None
    xid_gauge: dict[int, int | None] = field(default_factory=dict)
    facts: dict[str, Any] | None = None


@dataclass
class Merged:
    """A (node, time)'s pieces merged: GPU rows by (gpu, mig), their cells and priorities by column."""

    rows: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)
    xid_counts: dict[int, dict[int, float]] = field(default_factory=dict)
    host: dict[str, float] = field(default_factory=dict)
    gpus: dict[int, dict[str, str]] = field(default_factory=dict)
    runs: dict[str, Any] = field(default_factory=dict)


def merge(bodies: Iterable[bytes]) -> Merged:
    """The pieces of one (node, time), in the order they were stored."""
    out = Merged()
    for body in bodies:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
        rows = doc.get("rows") or []
        if rows:
            cols = doc["cols"]
            vals = np.frombuffer(doc["v"], dtype=np.float64).reshape(len(rows), len(cols))
            prio = np.frombuffer(doc["p"], dtype=np.int8).reshape(len(rows), len(cols))
            for i, (g, mig) in enumerate(rows):
                row = out.rows.get((g, mig))
                if row is None:
                    row = out.rows[(g, mig)] = {"uuid": doc["uuid"][i], "run_id": doc["run"][i], "cells": {}}
                else:
                    row["uuid"] = row["uuid"] or doc["uuid"][i]
                    row["run_id"] = row["run_id"] or doc["run"][i]
                cells = row["cells"]
                for c, name in enumerate(cols):
                    p = int(prio[i, c])
                    if p == ABSENT:
                        continue
                    held = cells.get(name)
                    if held is None or p < held[1]:
                        cells[name] = (float(vals[i, c]), p)
            for g, facts in (doc.get("gpus") or {}).items():
                known = out.gpus.setdefault(int(g), {})
                for k, v in facts.items():
                    known.setdefault(k, v)
            out.runs.update(doc.get("runs") or {})
        for g, xid, count in doc.get("xid") or ():
            out.xid_counts.setdefault(int(g), {})[int(xid)] = float(count)
        out.host.update(doc.get("host") or {})
    return out


def _xid(merged: Merged, gpu: int, state: NodeState, in_order: bool) -> int | None:
    counts = merged.xid_counts.get(gpu)
    if counts is not None:
        seen = {x: n for x, n in counts.items() if n > 0}
        return max(seen, key=lambda x: seen[x]) if seen else 0
    row = merged.rows.get((gpu, -1))
    cell = row["cells"].get(XID_GAUGE) if row is not None else None
    if cell is None:
        return None
    now = int(cell[0])
    if now == 0 or not in_order:
        return now if in_order else 0
    return now if state.xid_gauge.get(gpu) != now else 0


def gpu_columns(merged: Merged, t_ms: int, state: NodeState, in_order: bool) -> dict[str, list[Any]]:
    """The GPU section of the batch, as columns of plain values (None for NULL)."""
    keys = sorted(merged.rows)
    cols: dict[str, list[Any]] = {"time": [t_ms / 1000.0] * len(keys), "gpu": [g for g, _ in keys],
                                  "mig_instance": [None if m < 0 else m for _, m in keys],
                                  "uuid": [merged.rows[k]["uuid"] for k in keys],
                                  "run_id": [merged.rows[k]["run_id"] for k in keys]}
    names = sorted({name for k in keys for name in merged.rows[k]["cells"]} - set(_PSEUDO))
    for name in names:
        f = GPU_BY_NAME[name]
        integral = f.kind in INT_RANGES
        column: list[Any] = []
        for k in keys:
            if k[1] >= 0 and name in WHOLE_GPU_FIELDS:
                column.append(None)
                continue
            cell = merged.rows[k]["cells"].get(name)
            column.append(None if cell is None else (int(cell[0]) if integral else cell[0]))
        cols[name] = column
    # Framebuffer total where the exporter prints none: free + used + reserved, as DCGM and NVML count it.
    total = cols.setdefault("mem_total_mib", [None] * len(keys))
    for i, k in enumerate(keys):
        cells = merged.rows[k]["cells"]
        if total[i] is None and FB_FREE in cells and "mem_used_mib" in cells:
            total[i] = cells[FB_FREE][0] + cells["mem_used_mib"][0] + cells.get(FB_RESERVED, (0.0, 0))[0]
    if all(v is None for v in total):
        del cols["mem_total_mib"]
    xids = [_xid(merged, g, state, in_order) if m < 0 else None for g, m in keys]
    if any(x is not None for x in xids):
        cols["xid"] = xids
    return cols


def host_snapshot(counters: Mapping[str, float], t_ms: int) -> tuple[HostSnapshot | None, float | None]:
    """node_exporter's counters as the agent's host snapshot (None when they name no CPU), and the
    boot time; the snapshot's clock is the scrape's time."""
    cpus: dict[int, dict[str, int]] = {}
    disks: dict[str, dict[str, int]] = {}
    nets: dict[str, dict[str, int]] = {}
    links: dict[str, float] = {}
    boot: float | None = None
    fabric = False
    for key, value in counters.items():
        if key == "boot":
            boot = value
            continue
        group, name, fld = key.split("/", 2)
        if group == "cpu":
            cpus.setdefault(int(name), {})[fld] = round(value)
        elif group == "disk":
            disks.setdefault(name, {})[fld] = round(value)
        elif group == "net":
            nets.setdefault(name, {})[fld] = round(value)
            fabric = fabric or fld in ("rx_errs", "rx_drop", "tx_errs", "tx_drop")
        elif group == "link" and value > 0:
            links[name] = value
            fabric = True
    if not cpus:
        return None, boot
    disk_counters = {n: DiskCounters(**d) for n, d in disks.items()
                     if all(f in d for f in _DISK_FIELDS) and is_whole_disk(n, None)}
    nics = {n: NetCounters(**c) for n, c in nets.items() if all(f in c for f in _NET_FIELDS) and is_physical_nic(n, None)}
    snap = HostSnapshot(
        uptime_s=t_ms / 1000.0, cpus={n: CpuTimes(**c) for n, c in cpus.items()}, disks=disk_counters,
        stacked_disks=frozenset(n for n in disk_counters if is_stacked_disk(n, None)), nets=nics,
        links={n: s for n, s in links.items() if n in nics}, ib={} if fabric else None)
    return snap, boot


def host_columns(counters: Mapping[str, float], t_ms: int, state: NodeState,
                 in_order: bool) -> dict[str, list[Any]] | None:
    """The host section (one row), rates over the node's previous scrape; None without CPU counters."""
    snap, boot = host_snapshot(counters, t_ms)
    if snap is None:
        return None
    prev = state.host if in_order else None
    if prev is not None and boot is not None and state.boot is not None and abs(boot - state.boot) > 1.0:
        prev = None  # rebooted since: nothing to compare with
    row = host_rates(prev, snap)
    if in_order:
        prev_cpus = state.host.cpus if state.host is not None and prev is not None else {}
        state.host = HostSnapshot(uptime_s=snap.uptime_s, cpus=carry_offline_cpus(prev_cpus, snap.cpus),
                                  disks=snap.disks, stacked_disks=snap.stacked_disks, nets=snap.nets,
                                  links=snap.links, ib=snap.ib)
        state.boot = boot
    cols: dict[str, list[Any]] = {"time": [t_ms / 1000.0]}
    for name, value in row.items():
        if name in HOST_BY_NAME and not (isinstance(value, float) and not math.isfinite(value)):
            cols[name] = [value]
    return cols


def facts_of(merged: Merged) -> dict[str, Any]:
    """Node facts as the agent's dcgm_exporter source and attribution report them."""
    facts: dict[str, Any] = {}
    if merged.gpus:
        facts["gpus"] = [{"gpu": g, **merged.gpus[g]} for g in sorted(merged.gpus)]
        facts["gpu_count"] = len(merged.gpus)
        drivers = {v["driver_version"] for v in merged.gpus.values() if v.get("driver_version")}
        if len(drivers) == 1:
            facts["driver_version"] = drivers.pop()
    if merged.runs:
        facts["runs"] = merged.runs
    return facts


def assemble(node: str, t_ms: int, bodies: Iterable[bytes], state: NodeState, max_gpu_index: int = 32767,
             max_runs: int = 1 << 30) -> Batch | None:
    """The batch of one (node, time), checked as an agent's batch is; None when it holds no row.

    ``state`` is the node's, and moves on only when this time is newer than the last it saw (a late
    or retried scrape gets no rates and no XID change, and usually is a duplicate anyway)."""
    merged = merge(bodies)
    in_order = t_ms > state.t_ms
    doc: dict[str, Any] = {"batch_id": batch_id(t_ms), "node": node}
    if merged.rows:
        doc["gpu"] = gpu_columns(merged, t_ms, state, in_order)
    if merged.host:
        host = host_columns(merged.host, t_ms, state, in_order)
        if host is not None:
            doc["host"] = host
    facts = facts_of(merged)
    if facts and facts != state.facts:
        doc["facts"] = facts
    if in_order:
        state.t_ms = t_ms
        for (g, m), row in merged.rows.items():
            if m < 0 and XID_GAUGE in row["cells"]:
                state.xid_gauge[g] = int(row["cells"][XID_GAUGE][0])
    if "gpu" not in doc and "host" not in doc:
        return None
    try:
        batch = validate(doc)
        ingest_bounds.check(batch, max_gpu_index, max_runs)
    except WireError as e:
        # Every value was checked when its request came; what is left is a rule across pieces.
        log.error("remote write: the rows of node %s at %d ms do not validate (%s); not stored", node, t_ms,
                  e.detail()["msg"])
        return None
    if "facts" in doc:
        state.facts = facts
    return batch
