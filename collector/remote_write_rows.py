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
from gpufleet.collector.remote_write_series import COLUMN_INDEX, COLUMNS, FB_FREE, FB_RESERVED, XID_GAUGE
from gpufleet.facts import FactsError, check_facts
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
class Group:
    """The pieces of one (node, time), in the order they were stored."""

    node: str
    t_ms: int
    bodies: list[bytes]


@dataclass
class Assembled:
    """What :func:`assemble_all` made of a cycle's groups."""

    batches: list[Batch] = field(default_factory=list)
    #: Groups with no row (nothing gpufleet stores), and groups whose rows did not validate (logged).
    empty: int = 0
    invalid: int = 0


@dataclass
class _Parts:
    """Every GPU row of every piece of a cycle, full width (:data:`COLUMNS`), in storage order."""

    group: list[np.ndarray] = field(default_factory=list)
    keys: list[np.ndarray] = field(default_factory=list)
    vals: list[np.ndarray] = field(default_factory=list)
    prio: list[np.ndarray] = field(default_factory=list)
    uuid: list[Any] = field(default_factory=list)
    run: list[Any] = field(default_factory=list)


_NC = len(COLUMNS)
_NUMERIC = [(COLUMN_INDEX[f.name], f.name, f.kind in INT_RANGES, f.name in WHOLE_GPU_FIELDS)
            for f in GPU_BY_NAME.values() if f.name in COLUMN_INDEX and f.name not in _PSEUDO]
_FB_FREE, _FB_RES, _XIDG = COLUMN_INDEX[FB_FREE], COLUMN_INDEX[FB_RESERVED], COLUMN_INDEX[XID_GAUGE]
_USED, _TOTAL = COLUMN_INDEX["mem_used_mib"], COLUMN_INDEX["mem_total_mib"]


def _read_piece(gi: int, body: bytes, parts: _Parts, extras: dict[str, Any]) -> None:
    doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    rows = doc.get("rows") or []
    if rows:
        n = len(rows)
        idx = [COLUMN_INDEX.get(c, -1) for c in doc["cols"]]
        keep = [i for i, c in enumerate(idx) if c >= 0]
        v = np.frombuffer(doc["v"], dtype=np.float64).reshape(n, len(idx))
        p = np.frombuffer(doc["p"], dtype=np.int8).reshape(n, len(idx))
        vals = np.full((n, _NC), np.nan)
        prio = np.full((n, _NC), ABSENT, dtype=np.int16)
        cols = [idx[i] for i in keep]
        vals[:, cols] = v[:, keep]
        prio[:, cols] = p[:, keep]
        keyed = np.asarray(rows, dtype=np.int64).reshape(n, 2)
        parts.group.append(np.full(n, gi, dtype=np.int64))
        # (gpu, mig) as one sortable key; a physical GPU's row (mig -1) before its instances.
        parts.keys.append((keyed[:, 0] << 16) | (keyed[:, 1] + 1))
        parts.vals.append(vals)
        parts.prio.append(prio)
        parts.uuid.extend(doc["uuid"])
        parts.run.extend(doc["run"])
        gpus = extras.setdefault("gpus", {})
        for g, facts in (doc.get("gpus") or {}).items():
            known = gpus.setdefault(int(g), {})
            for k, val in facts.items():
                known.setdefault(k, val)
        extras.setdefault("runs", {}).update(doc.get("runs") or {})
    for g, xid, count in doc.get("xid") or ():
        extras.setdefault("xid", {}).setdefault(int(g), {})[int(xid)] = float(count)
    if doc.get("host"):
        extras.setdefault("host", {}).update(doc["host"])


def _merge_cells(parts: _Parts) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any], list[Any]]:
    """One row per (group, gpu, mig): each cell the value of the lowest priority, then the earliest
    piece; (row group, row key, values, UUIDs, runs)."""
    group = np.concatenate(parts.group)
    keys = np.concatenate(parts.keys)
    vals = np.concatenate(parts.vals)
    prio = np.concatenate(parts.prio)
    rowkey = (group << 40) | keys
    uniq, inv = np.unique(rowkey, return_inverse=True)
    merged = np.full((len(uniq), _NC), np.nan)
    filled = prio != ABSENT
    if filled.any():
        r, c = np.nonzero(filled)
        cell = inv[r] * _NC + c
        order = np.lexsort((r, prio[r, c], cell))
        cell_s = cell[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = cell_s[1:] != cell_s[:-1]
        pick = order[first]
        merged.flat[cell[pick]] = vals[r[pick], c[pick]]
    uuid: list[Any] = [None] * len(uniq)
    run: list[Any] = [None] * len(uniq)
    for i, j in enumerate(inv.tolist()):  # the first piece that names them
        if uuid[j] is None:
            uuid[j] = parts.uuid[i]
        if run[j] is None:
            run[j] = parts.run[i]
    return uniq >> 40, uniq & ((1 << 40) - 1), merged, uuid, run


def _typed(values: np.ndarray, integral: bool) -> dict[str, Any]:
    """A column as the wire's typed array (NULL where NaN)."""
    null = np.isnan(values)
    data = (np.where(null, 0, values).astype(np.int64) if integral else np.where(null, 0.0, values))
    col: dict[str, Any] = {"dtype": "i8" if integral else "f8", "data": data.tobytes()}
    if null.any():
        col["nulls"] = np.packbits(null).tobytes()
    return col


def _xid(extras: dict[str, Any], gpu: int, gauge: float, state: NodeState, in_order: bool) -> int | None:
    counts = extras.get("xid", {}).get(gpu)
    if counts is not None:
        seen = {x: n for x, n in counts.items() if n > 0}
        return max(seen, key=lambda x: seen[x]) if seen else 0
    if math.isnan(gauge):
        return None
    now = int(gauge)
    if now == 0 or not in_order:
        return now if in_order else 0
    return now if state.xid_gauge.get(gpu) != now else 0


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
                 in_order: bool) -> dict[str, Any] | None:
    """The host row, rates over the node's previous scrape; None without CPU counters."""
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
    out: dict[str, Any] = {"time": t_ms / 1000.0}
    for name, value in row.items():
        if name in HOST_BY_NAME and not (isinstance(value, float) and not math.isfinite(value)):
            out[name] = value
    return out


def facts_of(extras: dict[str, Any]) -> dict[str, Any]:
    """Node facts as the agent's dcgm_exporter source and attribution report them."""
    facts: dict[str, Any] = {}
    gpus = extras.get("gpus")
    if gpus:
        facts["gpus"] = [{"gpu": g, **gpus[g]} for g in sorted(gpus)]
        facts["gpu_count"] = len(gpus)
        drivers = {v["driver_version"] for v in gpus.values() if v.get("driver_version")}
        if len(drivers) == 1:
            facts["driver_version"] = drivers.pop()
    if extras.get("runs"):
        facts["runs"] = extras["runs"]
    return facts


def assemble_all(groups: list[Group], states: dict[str, NodeState], max_gpu_index: int = 32767,
                 max_runs: int = 1 << 30) -> Assembled:
    """The batches of a cycle's groups, one per (node, time), every value checked by one
    :func:`gpufleet.wire.validate` of all their rows; a node's state moves on with each of its groups
    newer than the last it saw (a late or retried one gets no rates and no XID change, and usually
    is a duplicate anyway).  ``groups`` in time order per node."""
    out = Assembled()
    parts = _Parts()
    extras: list[dict[str, Any]] = []
    for gi, g in enumerate(groups):
        ex: dict[str, Any] = {}
        for body in g.bodies:
            _read_piece(gi, body, parts, ex)
        extras.append(ex)
    in_order = []
    for g in groups:
        state = states.setdefault(g.node, NodeState())
        in_order.append(g.t_ms > state.t_ms)
        state.t_ms = max(state.t_ms, g.t_ms)
    doc_gpu: dict[str, Any] = {}
    row_group = np.empty(0, dtype=np.int64)
    if parts.group:
        row_group, keys, merged, uuid, run = _merge_cells(parts)
        gpu = keys >> 16
        mig = (keys & 0xFFFF) - 1
        is_mig = mig >= 0
        # Framebuffer total where the exporter prints none: free + used + reserved, as DCGM and NVML count it.
        fill = np.isnan(merged[:, _TOTAL]) & ~np.isnan(merged[:, _FB_FREE]) & ~np.isnan(merged[:, _USED])
        merged[fill, _TOTAL] = (merged[fill, _FB_FREE] + merged[fill, _USED]
                                + np.nan_to_num(merged[fill, _FB_RES]))
        t_s = np.asarray([groups[int(i)].t_ms for i in row_group.tolist()], dtype=np.float64) / 1000.0
        doc_gpu = {"time": {"dtype": "f8", "data": t_s.tobytes()}, "gpu": {"dtype": "i2", "data": gpu.astype("<i2").tobytes()},
                   "mig_instance": [None if m < 0 else m for m in mig.tolist()], "uuid": uuid, "run_id": run}
        for c, name, integral, whole in _NUMERIC:
            values = merged[:, c]
            if whole and is_mig.any():
                values = np.where(is_mig, np.nan, values)
            if not np.isnan(values).all():
                doc_gpu[name] = _typed(values, integral)
        # Row by row in storage order (groups in time order per node), so that a node's second scrape
        # in one cycle compares its XID gauge with its first.
        xids: list[int | None] = []
        gauges = merged[:, _XIDG].tolist()
        for i, (gi, g_, m) in enumerate(zip(row_group.tolist(), gpu.tolist(), mig.tolist(), strict=True)):
            if m >= 0:
                xids.append(None)
                continue
            state = states[groups[gi].node]
            xids.append(_xid(extras[gi], g_, gauges[i], state, in_order[gi]))
            if in_order[gi] and not math.isnan(gauges[i]):
                state.xid_gauge[g_] = int(gauges[i])
        if any(x is not None for x in xids):
            doc_gpu["xid"] = xids
    host_rows: list[dict[str, Any]] = []
    host_group: list[int] = []
    for gi, g in enumerate(groups):
        if extras[gi].get("host"):
            row = host_columns(extras[gi]["host"], g.t_ms, states[g.node], in_order[gi])
            if row is not None:
                host_rows.append(row)
                host_group.append(gi)
    doc: dict[str, Any] = {"batch_id": "rw:cycle", "node": groups[0].node if groups else "none"}
    if doc_gpu:
        doc["gpu"] = doc_gpu
    if host_rows:
        doc["host"] = host_rows
    if not doc_gpu and not host_rows:
        out.empty = len(groups)
        return out
    try:
        every = validate(doc)
    except WireError as e:
        # One group's rows refused: find which, by checking each alone.
        log.warning("remote write: a cycle's rows do not validate (%s); checking group by group", e.detail()["msg"])
        every = None
    gpu_rows = np.asarray(row_group, dtype=np.int64)
    host_idx = np.asarray(host_group, dtype=np.int64)
    for gi, g in enumerate(groups):
        rows = np.flatnonzero(gpu_rows == gi)
        hrows = np.flatnonzero(host_idx == gi)
        if not len(rows) and not len(hrows):
            out.empty += 1
            continue
        state = states[g.node]
        facts = facts_of(extras[gi])
        batch = _group_batch(g, rows, hrows, every, doc, facts if facts and facts != state.facts else None)
        if batch is None:
            out.invalid += 1
            continue
        try:
            ingest_bounds.check(batch, max_gpu_index, max_runs)
        except WireError as e:
            log.error("remote write: the rows of node %s at %d ms are refused (%s); not stored", g.node, g.t_ms,
                      e.detail()["msg"])
            out.invalid += 1
            continue
        if batch.facts is not None:
            state.facts = facts
        out.batches.append(batch)
    return out


def _group_batch(g: Group, rows: np.ndarray, hrows: np.ndarray, every: Batch | None, doc: dict[str, Any],
                 facts: dict[str, Any] | None) -> Batch | None:
    """One group's batch: its rows taken from the cycle's validated columns (or validated alone when
    the cycle's did not validate, to name the group at fault)."""
    if facts is not None:
        try:
            check_facts(facts)
        except FactsError as e:
            log.error("remote write: the facts of node %s at %d ms are refused (%s)", g.node, g.t_ms, e.msg)
            facts = None
    if every is not None:
        gpu = {k: c.take(rows) for k, c in every.gpu.items()} if len(rows) else {}
        host = {k: c.take(hrows) for k, c in every.host.items()} if len(hrows) else {}
        return Batch(batch_id=batch_id(g.t_ms), node=g.node, gpu=gpu, host=host, facts=facts, n_gpu=len(rows),
                     n_host=len(hrows))
    alone: dict[str, Any] = {"batch_id": batch_id(g.t_ms), "node": g.node}
    if len(rows):
        alone["gpu"] = {k: _rows_of(v, rows) for k, v in doc["gpu"].items()}
    if len(hrows):
        alone["host"] = [doc["host"][i] for i in hrows.tolist()]
    try:
        return validate(alone)
    except WireError as e:
        log.error("remote write: the rows of node %s at %d ms do not validate (%s); not stored", g.node, g.t_ms,
                  e.detail()["msg"])
        return None


def _rows_of(col: Any, rows: np.ndarray) -> Any:
    if isinstance(col, list):
        return [col[i] for i in rows.tolist()]
    width = {"f8": 8, "i8": 8, "i2": 2}[col["dtype"]]
    data = np.frombuffer(col["data"], dtype=f"<{col['dtype'][0]}{width}")[rows]
    out = {"dtype": col["dtype"], "data": data.tobytes()}
    if "nulls" in col:
        null = np.unpackbits(np.frombuffer(col["nulls"], dtype=np.uint8), count=len(np.frombuffer(
            col["data"], dtype=f"<{col['dtype'][0]}{width}"))).astype(bool)[rows]
        if null.any():
            out["nulls"] = np.packbits(null).tobytes()
    return out


def assemble(node: str, t_ms: int, bodies: Iterable[bytes], state: NodeState, max_gpu_index: int = 32767,
             max_runs: int = 1 << 30) -> Batch | None:
    """The batch of one (node, time) (:func:`assemble_all` of that group alone); None when it holds no row."""
    done = assemble_all([Group(node, t_ms, list(bodies))], {node: state}, max_gpu_index, max_runs)
    return done.batches[0] if done.batches else None
