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
from gpufleet.wire import Batch, Column, WireError, validate

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
class GroupRows:
    """One (node, time)'s rows in the cycle's checked columns: GPU rows [a, b), host rows [ha, hb)."""

    node: str
    t_ms: int
    a: int
    b: int
    ha: int
    hb: int
    facts: dict[str, Any] | None

    @property
    def batch_id(self) -> str:
        return batch_id(self.t_ms)


@dataclass
class Assembled:
    """What :func:`assemble_all` made of a cycle's groups: every row checked at once (``rows``), and
    where each group's are (``groups``, in order); or, when they did not validate together, each
    group's batch checked alone (``batches``)."""

    rows: Batch | None = None
    groups: list[GroupRows] = field(default_factory=list)
    batches: list[Batch] = field(default_factory=list)
    #: Groups with no row (nothing gpufleet stores), and groups whose rows did not validate (logged).
    empty: int = 0
    invalid: int = 0

    def group_batch(self, g: GroupRows) -> Batch:
        """One group's rows as a batch of its own (its id: :func:`batch_id`)."""
        assert self.rows is not None
        return node_batch(self.rows, g.node, g.batch_id, [g])


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
_NUMERIC = [
    (COLUMN_INDEX[f.name], f.name, f.kind in INT_RANGES, f.name in WHOLE_GPU_FIELDS)
    for f in GPU_BY_NAME.values()
    if f.name in COLUMN_INDEX and f.name not in _PSEUDO
]
_FB_FREE, _FB_RES, _XIDG = COLUMN_INDEX[FB_FREE], COLUMN_INDEX[FB_RESERVED], COLUMN_INDEX[XID_GAUGE]
_USED, _TOTAL = COLUMN_INDEX["mem_used_mib"], COLUMN_INDEX["mem_total_mib"]


@dataclass(frozen=True)
class _Static:
    """What a piece's static part says, read once per distinct part: its rows' keys, the columns its
    values fill (positions in the piece, and in :data:`COLUMNS`), UUIDs, runs and facts."""

    n: int
    keys: np.ndarray
    keep: list[int]
    cols: list[int]
    width: int
    uuid: list[Any]
    run: list[Any]
    gpus: dict[str, dict[str, str]]
    runs: dict[str, Any]


#: Static parts read so far, by their packed bytes (pieces of one row set share them, scrape after scrape).
_STATICS: dict[bytes, _Static] = {}


def _static(doc: dict[str, Any]) -> _Static:
    rows = doc.get("rows") or []
    n = len(rows)
    idx = [COLUMN_INDEX.get(c, -1) for c in doc.get("cols") or []]
    keep = [i for i, c in enumerate(idx) if c >= 0]
    keyed = np.asarray(rows, dtype=np.int64).reshape(n, 2)
    # (gpu, mig) as one sortable key; a physical GPU's row (mig -1) before its instances.
    return _Static(
        n,
        (keyed[:, 0] << 16) | (keyed[:, 1] + 1),
        keep,
        [idx[i] for i in keep],
        len(idx),
        list(doc.get("uuid") or []),
        list(doc.get("run") or []),
        doc.get("gpus") or {},
        doc.get("runs") or {},
    )


def _read_piece(gi: int, body: bytes, parts: _Parts, extras: dict[str, Any]) -> None:
    doc = msgpack.unpackb(body, raw=False, strict_map_key=False)
    packed = doc.get("s")
    if packed is not None:
        st = _STATICS.get(packed)
        if st is None:
            st = _static(msgpack.unpackb(packed, raw=False, strict_map_key=False))
            if len(_STATICS) >= 100_000:
                _STATICS.clear()
            _STATICS[packed] = st
    else:
        st = _static(doc)
    if st.n:
        n = st.n
        v = np.frombuffer(doc["v"], dtype=np.float64).reshape(n, st.width)
        p = np.frombuffer(doc["p"], dtype=np.int8).reshape(n, st.width)
        vals = np.full((n, _NC), np.nan)
        prio = np.full((n, _NC), ABSENT, dtype=np.int16)
        vals[:, st.cols] = v[:, st.keep]
        prio[:, st.cols] = p[:, st.keep]
        parts.group.append(np.full(n, gi, dtype=np.int64))
        parts.keys.append(st.keys)
        parts.vals.append(vals)
        parts.prio.append(prio)
        parts.uuid.extend(st.uuid)
        parts.run.extend(st.run)
        gpus = extras.setdefault("gpus", {})
        for g, facts in st.gpus.items():
            known = gpus.setdefault(int(g), {})
            for k, val in facts.items():
                known.setdefault(k, val)
        extras.setdefault("runs", {}).update(st.runs)
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
    data = np.where(null, 0, values).astype(np.int64) if integral else np.where(null, 0.0, values)
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
    disk_counters = {
        n: DiskCounters(**d)
        for n, d in disks.items()
        if all(f in d for f in _DISK_FIELDS) and is_whole_disk(n, None)
    }
    nics = {
        n: NetCounters(**c)
        for n, c in nets.items()
        if all(f in c for f in _NET_FIELDS) and is_physical_nic(n, None)
    }
    snap = HostSnapshot(
        uptime_s=t_ms / 1000.0,
        cpus={n: CpuTimes(**c) for n, c in cpus.items()},
        disks=disk_counters,
        stacked_disks=frozenset(n for n in disk_counters if is_stacked_disk(n, None)),
        nets=nics,
        links={n: s for n, s in links.items() if n in nics},
        ib={} if fabric else None,
    )
    return snap, boot


def host_columns(
    counters: Mapping[str, float], t_ms: int, state: NodeState, in_order: bool
) -> dict[str, Any] | None:
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
        state.host = HostSnapshot(
            uptime_s=snap.uptime_s,
            cpus=carry_offline_cpus(prev_cpus, snap.cpus),
            disks=snap.disks,
            stacked_disks=snap.stacked_disks,
            nets=snap.nets,
            links=snap.links,
            ib=snap.ib,
        )
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


def assemble_all(
    groups: list[Group], states: dict[str, NodeState], max_gpu_index: int = 32767, max_runs: int = 1 << 30
) -> Assembled:
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
        merged[fill, _TOTAL] = (
            merged[fill, _FB_FREE] + merged[fill, _USED] + np.nan_to_num(merged[fill, _FB_RES])
        )
        t_s = np.asarray([groups[int(i)].t_ms for i in row_group.tolist()], dtype=np.float64) / 1000.0
        doc_gpu = {
            "time": {"dtype": "f8", "data": t_s.tobytes()},
            "gpu": {"dtype": "i2", "data": gpu.astype("<i2").tobytes()},
            "mig_instance": [None if m < 0 else m for m in mig.tolist()],
            "uuid": uuid,
            "run_id": run,
        }
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
        log.warning(
            "remote write: a cycle's rows do not validate (%s); checking group by group", e.detail()["msg"]
        )
        every = None
    # Rows come group by group (GPU rows sorted by group, host rows appended in group order): each
    # group's are one slice.
    bounds = np.arange(len(groups) + 1)
    gpu_cut = np.searchsorted(np.asarray(row_group, dtype=np.int64), bounds).tolist()
    host_cut = np.searchsorted(np.asarray(host_group, dtype=np.int64), bounds).tolist()
    runs_of = doc_gpu.get("run_id") or []
    for gi, g in enumerate(groups):
        a, b, ha, hb = gpu_cut[gi], gpu_cut[gi + 1], host_cut[gi], host_cut[gi + 1]
        if a == b and ha == hb:
            out.empty += 1
            continue
        state = states[g.node]
        facts = facts_of(extras[gi])
        send = facts if facts and facts != state.facts else None
        if send is not None:
            try:
                check_facts(send)
            except FactsError as e:
                log.error(
                    "remote write: the facts of node %s at %d ms are refused (%s)", g.node, g.t_ms, e.msg
                )
                send = None
        # The bounds an agent's batch is held to (collector.ingest_bounds), for this group's rows: GPU
        # indices were bounded when their series came; the runs named are counted here.
        named = {r for r in runs_of[a:b] if r} | set((send or {}).get("runs") or ())
        if len(named) > max_runs:
            log.error(
                "remote write: the rows of node %s at %d ms name %d runs, more than %d "
                "(ingest.max_runs_per_batch); not stored",
                g.node,
                g.t_ms,
                len(named),
                max_runs,
            )
            out.invalid += 1
            continue
        if every is None:
            batch = _validated_alone(g, np.arange(a, b), np.arange(ha, hb), doc, send)
            if batch is None:
                out.invalid += 1
                continue
            try:
                ingest_bounds.check(batch, max_gpu_index, max_runs)
            except WireError as e:
                log.error(
                    "remote write: the rows of node %s at %d ms are refused (%s); not stored",
                    g.node,
                    g.t_ms,
                    e.detail()["msg"],
                )
                out.invalid += 1
                continue
            out.batches.append(batch)
        else:
            out.groups.append(GroupRows(g.node, g.t_ms, a, b, ha, hb, send))
        if send is not None:
            state.facts = facts
    out.rows = every
    return out


def node_batch(rows: Batch, node: str, batch_id: str, groups: list[GroupRows]) -> Batch:
    """The rows of some groups of one node (in order) as one batch: slices of the cycle's columns when
    they are adjacent, else the rows taken; the facts the last of them carries."""
    gpu, n_gpu = _part(rows.gpu, [(g.a, g.b) for g in groups])
    host, n_host = _part(rows.host, [(g.ha, g.hb) for g in groups])
    facts = next((g.facts for g in reversed(groups) if g.facts is not None), None)
    return Batch(batch_id=batch_id, node=node, gpu=gpu, host=host, facts=facts, n_gpu=n_gpu, n_host=n_host)


def _part(section: dict[str, Column], spans: list[tuple[int, int]]) -> tuple[dict[str, Column], int]:
    spans = [(a, b) for a, b in spans if b > a]
    if not spans:
        return {}, 0
    if all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1)):
        a, b = spans[0][0], spans[-1][1]
        return {k: _slice(c, a, b) for k, c in section.items()}, b - a
    idx = np.concatenate([np.arange(a, b) for a, b in spans])
    return {k: c.take(idx) for k, c in section.items()}, len(idx)


def _validated_alone(
    g: Group, rows: np.ndarray, hrows: np.ndarray, doc: dict[str, Any], facts: dict[str, Any] | None
) -> Batch | None:
    """One group's batch checked alone (the cycle's rows did not validate together), to name the one at
    fault."""
    alone: dict[str, Any] = {"batch_id": batch_id(g.t_ms), "node": g.node}
    if len(rows):
        alone["gpu"] = {k: _rows_of(v, rows) for k, v in doc["gpu"].items()}
    if len(hrows):
        alone["host"] = [doc["host"][i] for i in hrows.tolist()]
    if facts is not None:
        alone["facts"] = facts
    try:
        return validate(alone)
    except WireError as e:
        log.error(
            "remote write: the rows of node %s at %d ms do not validate (%s); not stored",
            g.node,
            g.t_ms,
            e.detail()["msg"],
        )
        return None


def _slice(col: Column, a: int, b: int) -> Column:
    """Rows [a, b) of a validated column, as views where the column is an array."""
    values = col.values[a:b]
    return Column(
        values, None if col.null is None else col.null[a:b], None if col.lengths is None else col.lengths[a:b]
    )


def _rows_of(col: Any, rows: np.ndarray) -> Any:
    if isinstance(col, list):
        return [col[i] for i in rows.tolist()]
    width = {"f8": 8, "i8": 8, "i2": 2}[col["dtype"]]
    data = np.frombuffer(col["data"], dtype=f"<{col['dtype'][0]}{width}")[rows]
    out = {"dtype": col["dtype"], "data": data.tobytes()}
    if "nulls" in col:
        null = np.unpackbits(
            np.frombuffer(col["nulls"], dtype=np.uint8),
            count=len(np.frombuffer(col["data"], dtype=f"<{col['dtype'][0]}{width}")),
        ).astype(bool)[rows]
        if null.any():
            out["nulls"] = np.packbits(null).tobytes()
    return out


def assemble(
    node: str,
    t_ms: int,
    bodies: Iterable[bytes],
    state: NodeState,
    max_gpu_index: int = 32767,
    max_runs: int = 1 << 30,
) -> Batch | None:
    """The batch of one (node, time) (:func:`assemble_all` of that group alone); None when it holds no row."""
    done = assemble_all([Group(node, t_ms, list(bodies))], {node: state}, max_gpu_index, max_runs)
    if done.groups:
        return done.group_batch(done.groups[0])
    return done.batches[0] if done.batches else None
