"""A decoded remote-write request as pieces: what it says about each (node, time), checked and compact.

Prometheus splits the series of one scrape over several requests (its shards,
and each shard's batches of ``max_samples_per_send``), so one request rarely
holds a node's whole scrape.  What it holds of one node at one time is a
*piece*: every value already in the catalog's unit, checked against the
catalog's bounds (a value out of range refuses the request, before anything
is stored), placed into the GPU row it belongs to with the priority its field
has there.  Pieces are stored as they come (``remote_write_parts``) and
merged into rows once a (node, time) has had time to arrive whole
(:mod:`gpufleet.collector.remote_write_rows`).

Rules kept from the agent's exposition parser
(:func:`gpufleet.agent.sources.dcgm_exporter.parse_exposition`): a DCGM blank
sentinel is no value; of two fields feeding one column the lower priority
wins; a device-level value on a MIG instance's series goes to its physical
GPU only where that GPU's own series say nothing; a row's run comes from its
series' pod labels.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from gpufleet.collector.remote_write_proto import Decoded, RemoteWriteError, describe, is_stale
from gpufleet.collector.remote_write_series import (
    COLUMNS,
    DROP_REASONS,
    GPU,
    HOST,
    XID_COUNT,
    SeriesPlans,
)

#: Priority of a cell no series filled.
ABSENT = 127
_NC = len(COLUMNS)


@dataclass
class Piece:
    """What one request said of one node at one time (``t_ms``, milliseconds since the epoch)."""

    node: str
    t_ms: int
    body: bytes
    gpu_samples: int = 0
    host_samples: int = 0


@dataclass
class Mapped:
    pieces: list[Piece] = field(default_factory=list)
    #: Samples not used, by reason (``unused``, ``stale``, ``no_node``, ``no_gpu``, ``histogram``).
    dropped: Counter[str] = field(default_factory=Counter)
    #: Samples outside the clock-skew window, by node.
    skewed: Counter[str] = field(default_factory=Counter)
    gpu_samples: int = 0
    host_samples: int = 0


def _refuse(plans: SeriesPlans, pid: int, t_ms: int, msg: str) -> RemoteWriteError:
    return RemoteWriteError(f"{plans.names[pid]} at {t_ms} ms: {msg}")


def map_request(
    decoded: Decoded[int],
    plans: SeriesPlans,
    now_s: float,
    future_s: float,
    past_s: float,
    max_runs: int = 1 << 30,
) -> Mapped:
    """The pieces of a decoded request; :class:`RemoteWriteError` naming the first bad sample.

    ``max_runs``: most runs one (node, time) may name (``ingest.max_runs_per_batch``)."""
    out = Mapped()
    if decoded.histograms:
        out.dropped["histogram"] += decoded.histograms
    if not decoded.plans:
        return out
    ids = np.asarray(decoded.plans, dtype=np.int64)
    values = decoded.values
    times = decoded.times_ms
    kind = plans.kind[ids]
    stale = is_stale(values)
    if stale.any():
        out.dropped["stale"] += int(stale.sum())
    for code, reason in DROP_REASONS.items():
        n = int(((kind == code) & ~stale).sum())
        if n:
            out.dropped[reason] += n
    used = ((kind == GPU) | (kind == HOST) | (kind == XID_COUNT)) & ~stale
    bad = used & ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _refuse(
            plans,
            int(ids[i]),
            int(times[i]),
            f"{describe(float(values[i]))} is not a number (only Prometheus's staleness marker may be)",
        )
    lo_ms = (now_s - past_s) * 1000.0
    hi_ms = (now_s + future_s) * 1000.0
    skew = used & ((times < lo_ms) | (times > hi_ms))
    if skew.any():
        nodes = plans.node[ids[skew]]
        for nid, n in zip(*np.unique(nodes, return_counts=True), strict=True):
            out.skewed[plans.nodes[int(nid)]] += int(n)
        used &= ~skew
    if not used.any():
        return out
    idx = np.flatnonzero(used)
    ids, values, times, kind = ids[idx], values[idx], times[idx], kind[idx]
    node = plans.node[ids]
    groups, group_of = np.unique((node.astype(np.int64) << 44) | times, return_inverse=True)

    gpu = kind == GPU
    v = values.copy()
    if gpu.any():
        v = _catalog_values(plans, ids, values, times, gpu)
    xidc = kind == XID_COUNT
    if xidc.any():
        neg = xidc & (values < 0)
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise _refuse(plans, int(ids[i]), int(times[i]), f"XID count {values[i]!r} is negative")
    host = kind == HOST
    if host.any():
        v[host] = values[host] * plans.scale[ids[host]]
        neg = host & (v < 0)
        if neg.any():
            i = int(np.flatnonzero(neg)[0])
            raise _refuse(plans, int(ids[i]), int(times[i]), f"counter {values[i]!r} is negative")
    runs = plans.run[ids]
    if int(runs.max()) > 0:
        pairs = np.unique((group_of.astype(np.int64) << 32) | runs)
        pairs = pairs[(pairs & 0xFFFFFFFF) > 0]
        per_group = np.bincount((pairs >> 32).astype(np.int64), minlength=len(groups))
        if int(per_group.max()) > max_runs:
            g = int(np.argmax(per_group))
            raise RemoteWriteError(
                f"node {plans.nodes[int(groups[g] >> 44)]} at {int(groups[g] & ((1 << 44) - 1))} "
                f"ms names {int(per_group[g])} runs; a batch may name at most {max_runs} "
                "(ingest.max_runs_per_batch)"
            )
    out.gpu_samples = int((gpu | xidc).sum())
    out.host_samples = int(host.sum())
    out.pieces = _pieces(plans, ids, v, times, kind, groups, group_of)
    return out


def _catalog_values(
    plans: SeriesPlans, ids: np.ndarray, values: np.ndarray, times: np.ndarray, gpu: np.ndarray
) -> np.ndarray:
    """GPU samples in the catalog's units (NaN for DCGM's blanks), checked against the columns' bounds."""
    v = values.copy()
    g = np.flatnonzero(gpu)
    pid = ids[g]
    raw = values[g]
    blank = raw >= plans.blank[pid]
    x = raw * plans.scale[pid]
    integral = plans.integral[pid]
    x[integral] = np.round(x[integral])
    # A blank is no value.  (The agent tells the XID gauge's "no data yet", which it reads as no XID,
    # from "not supported", which it reads as unknown; as a float64 the sentinels are one number, so
    # here both are unknown.)
    x[blank] = np.nan
    with np.errstate(invalid="ignore"):
        out_of = ~np.isnan(x) & ((x < plans.lo[pid]) | (x > plans.hi[pid]))
    if out_of.any():
        j = int(np.flatnonzero(out_of)[0])
        p = int(pid[j])
        column = COLUMNS[int(plans.col[p])]
        raise _refuse(
            plans, p, int(times[g[j]]), f"{x[j]!r} in {column} is outside [{plans.lo[p]:g}, {plans.hi[p]:g}]"
        )
    v[g] = x
    return v


def _pieces(
    plans: SeriesPlans,
    ids: np.ndarray,
    v: np.ndarray,
    times: np.ndarray,
    kind: np.ndarray,
    groups: np.ndarray,
    group_of: np.ndarray,
) -> list[Piece]:
    """One piece per (node, time) group: its GPU rows' cells, XID counts and host counters."""
    n_groups = len(groups)
    gpu_like = (kind == GPU) | (kind == XID_COUNT)
    # GPU rows of each group: every row a sample names (the row its value goes to and its own).
    g_idx = np.flatnonzero(gpu_like)
    # A row key is (group, row id), group first, so that the sorted rows come group by group.
    row_keys = np.concatenate(
        [
            (group_of[g_idx].astype(np.int64) << 32) | plans.row[ids[g_idx]],
            (group_of[g_idx].astype(np.int64) << 32) | plans.own_row[ids[g_idx]],
        ]
    )
    rowts, rowt_of = np.unique(row_keys, return_inverse=True)
    target = rowt_of[: len(g_idx)]
    own = rowt_of[len(g_idx) :]
    n_rows = len(rowts)
    vals = np.full((n_rows, _NC), np.nan)
    prio = np.full((n_rows, _NC), ABSENT, dtype=np.int16)
    cells = (kind[g_idx] == GPU) & ~np.isnan(v[g_idx])
    if cells.any():
        c_idx = np.flatnonzero(cells)
        pid = ids[g_idx[c_idx]]
        cell = target[c_idx] * _NC + plans.col[pid].astype(np.int64)
        p = plans.prio[pid]
        order = np.lexsort((c_idx, p, cell))
        cell_s = cell[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = cell_s[1:] != cell_s[:-1]
        pick = order[first]
        vals.flat[cell[pick]] = v[g_idx[c_idx[pick]]]
        prio.flat[cell[pick]] = p[pick]
    run = np.zeros(n_rows, dtype=np.int64)
    with_run = plans.run[ids[g_idx]] > 0
    if with_run.any():
        np.maximum.at(run, own[with_run], plans.run[ids[g_idx[with_run]]])
    row_ids = rowts & 0xFFFFFFFF
    row_group = rowts >> 32
    gpu_count = np.bincount(group_of[g_idx], minlength=n_groups)
    host_count = np.bincount(group_of[kind == HOST], minlength=n_groups)
    xid_rows = np.flatnonzero(kind[g_idx] == XID_COUNT)
    host_idx = np.flatnonzero(kind == HOST)

    # Rows, XID counts and host samples, each sorted by group, cut at group boundaries.
    row_cut = np.searchsorted(row_group, np.arange(n_groups + 1))
    xid_groups = group_of[g_idx[xid_rows]]
    xid_order = xid_rows[np.argsort(xid_groups, kind="stable")]
    xid_cut = np.searchsorted(np.sort(xid_groups), np.arange(n_groups + 1))
    host_groups = group_of[host_idx]
    host_order = host_idx[np.argsort(host_groups, kind="stable")]
    host_cut = np.searchsorted(np.sort(host_groups), np.arange(n_groups + 1))

    pieces: list[Piece] = []
    for gi in range(n_groups):
        key = int(groups[gi])
        nid, t_ms = key >> 44, key & ((1 << 44) - 1)
        doc: dict[str, Any] = {}
        r0, r1 = int(row_cut[gi]), int(row_cut[gi + 1])
        static = b""
        if r1 > r0:
            static, dynamic = _gpu_part(plans, row_ids[r0:r1], vals[r0:r1], prio[r0:r1], run[r0:r1])
            doc.update(dynamic)
        x0, x1 = int(xid_cut[gi]), int(xid_cut[gi + 1])
        if x1 > x0:
            sel = g_idx[xid_order[x0:x1]]
            doc["xid"] = [
                [plans.rows[int(plans.row[i])][1], int(plans.xid[i]), float(v[j])]
                for i, j in zip(ids[sel].tolist(), sel.tolist(), strict=True)
            ]
        h0, h1 = int(host_cut[gi]), int(host_cut[gi + 1])
        if h1 > h0:
            sel = host_order[h0:h1]
            keys = plans.host_keys
            doc["host"] = {
                keys[int(k)]: x
                for k, x in zip(plans.host_key[ids[sel]].tolist(), v[sel].tolist(), strict=True)
            }
        # The static part (packed once per row set) as one field, so that the assembler reads it once too.
        if static:
            doc["s"] = static
        pieces.append(
            Piece(
                plans.nodes[nid],
                t_ms,
                msgpack.packb(doc, use_bin_type=True),
                int(gpu_count[gi]),
                int(host_count[gi]),
            )
        )
    return pieces


def _gpu_part(
    plans: SeriesPlans, row_ids: np.ndarray, vals: np.ndarray, prio: np.ndarray, run: np.ndarray
) -> tuple[bytes, dict[str, Any]]:
    """A group's GPU rows: what is the same scrape after scrape -- (gpu, mig) keys, UUIDs, runs, the
    columns filled, what the series said about each GPU and run (for the node facts) -- packed (once per
    row set), and the values and priorities."""
    keep = (prio != ABSENT).any(axis=0)
    key = b"".join((plans.version.to_bytes(8, "little"), row_ids.tobytes(), run.tobytes(), keep.tobytes()))
    static = plans.packed.get(key)
    if static is None:
        cols = [COLUMNS[i] for i in np.flatnonzero(keep).tolist()]
        rows = [plans.rows[i] for i in row_ids.tolist()]
        facts = plans.row_facts
        gpus: dict[str, dict[str, str]] = {}
        for rid, (_, g, mig) in zip(row_ids.tolist(), rows, strict=True):
            if mig < 0 and facts[rid]:
                gpus[str(g)] = facts[rid]
        static = msgpack.packb(
            {
                "rows": [[g, mig] for _, g, mig in rows],
                "uuid": [facts[i].get("uuid") for i in row_ids.tolist()],
                "run": [plans.runs[i] for i in run.tolist()],
                "cols": cols,
                "gpus": gpus,
                "runs": {plans.runs[i]: plans.run_facts[i] for i in set(run.tolist()) if i},
            },
            use_bin_type=True,
        )
        if len(plans.packed) >= 100_000:
            plans.packed.clear()
        plans.packed[key] = static
    return static, {
        "v": np.ascontiguousarray(vals[:, keep]).tobytes(),
        "p": np.ascontiguousarray(prio[:, keep].astype(np.int8)).tobytes(),
    }
