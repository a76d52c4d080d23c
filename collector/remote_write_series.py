"""What a remote-written series is to gpufleet: a GPU field, a host counter, or nothing it uses.

Decided once per label set (:class:`SeriesPlans`, fed by the decoder's
cache), so that a request is processed as arrays indexed by plan id.

* **dcgm-exporter** series are recognised by every name the exporter has
  printed for a field, through the table the agent's ``dcgm_exporter``
  source reads (:data:`gpufleet.agent.sources.dcgm_exporter.SERIES`), with its
  units, blank sentinels and priorities.  ``gpu`` is the GPU index,
  ``GPU_I_ID`` the MIG instance, ``UUID`` the GPU's UUID; ``modelName``,
  ``DCGM_FI_DRIVER_VERSION``, ``pci_bus_id`` and ``Hostname`` go into the node
  facts.  The pod labels (``pod``, ``namespace``, ``pod_uid``, or their
  ``exported_`` forms after Prometheus's ``honor_labels: false``) name the
  run as the agent names it from the same labels without API access
  (:func:`gpufleet.agent.k8s.runs.run_id_for`): ``<namespace>:<pod>``.
* **node_exporter** series that the agent's host source reads the same
  counters of (``node_cpu_seconds_total``, ``node_cpu_guest_seconds_total``,
  ``node_disk_*``, ``node_network_*``, ``node_boot_time_seconds``) become host
  counters, turned into rates when their node's rows are assembled.
* **The node** is the first of ``remote_write.node_labels`` a series has
  (``instance`` without its port).
* Everything else is not used: counted by reason and dropped, as are the
  samples of a series whose node label is not a host name (an IPv6
  ``instance``, say: relabel it), said once in the log.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from gpufleet.agent.k8s.runs import K8sRun, run_id_for
from gpufleet.agent.sources.dcgm import DCGM_FP64_BLANK, DCGM_INT64_BLANK
from gpufleet.agent.sources.dcgm_exporter import FB_PARTS, SERIES, XID_COUNT_SERIES
from gpufleet.catalog import GPU_BY_NAME, INT_RANGES, WHOLE_GPU_FIELDS
from gpufleet.collector.remote_write_proto import RemoteWriteError, Series
from gpufleet.names import is_node_name

log = logging.getLogger(__name__)

# Plan kinds.
UNUSED: Final = 0
GPU: Final = 1
XID_COUNT: Final = 2
HOST: Final = 3
#: Why a sample is not used, by kind code (the ``reason`` label of the dropped-samples counter).
DROP_REASONS: Final = {UNUSED: "unused", 4: "no_node", 5: "no_gpu", 6: "bad_node"}
NO_NODE: Final = 4
NO_GPU: Final = 5
BAD_NODE: Final = 6

#: GPU columns a request fills, the catalog's numeric columns first, then three that are read when
#: a row is finished and not stored: free and reserved framebuffer (for the total where the exporter
#: prints none) and the XID gauge (an XID is reported when it changes).
NUMERIC_GPU = tuple(
    name
    for name, f in GPU_BY_NAME.items()
    if f.kind != "text" and name not in ("gpu", "mig_instance", "time")
)
FB_FREE: Final = "fb_free_mib"
FB_RESERVED: Final = "fb_reserved_mib"
XID_GAUGE: Final = "xid_gauge"
COLUMNS: Final = (*NUMERIC_GPU, FB_FREE, FB_RESERVED, XID_GAUGE)
COLUMN_INDEX: Final = {name: i for i, name in enumerate(COLUMNS)}
#: Where a device-level value printed on a MIG instance's series goes instead: its physical GPU's row,
#: below what that row's own series say.
MIG_PARENT_PRIORITY: Final = 100

#: node_exporter counters the host rows are computed from: series name -> (group, field, factor).  The
#: factor turns the exporter's unit into the kernel's (jiffies at USER_HZ = 100, 512-byte sectors, ms).
HOST_COUNTERS: Final[dict[str, tuple[str, str, float]]] = {
    "node_disk_reads_completed_total": ("disk", "rd_ios", 1.0),
    "node_disk_read_bytes_total": ("disk", "rd_sectors", 1 / 512),
    "node_disk_read_time_seconds_total": ("disk", "rd_ticks_ms", 1000.0),
    "node_disk_writes_completed_total": ("disk", "wr_ios", 1.0),
    "node_disk_written_bytes_total": ("disk", "wr_sectors", 1 / 512),
    "node_disk_write_time_seconds_total": ("disk", "wr_ticks_ms", 1000.0),
    "node_disk_io_time_seconds_total": ("disk", "io_ticks_ms", 1000.0),
    "node_disk_discards_completed_total": ("disk", "dc_ios", 1.0),
    "node_disk_discarded_sectors_total": ("disk", "dc_sectors", 1.0),
    "node_disk_discard_time_seconds_total": ("disk", "dc_ticks_ms", 1000.0),
    "node_network_receive_bytes_total": ("net", "rx_bytes", 1.0),
    "node_network_receive_packets_total": ("net", "rx_packets", 1.0),
    "node_network_transmit_bytes_total": ("net", "tx_bytes", 1.0),
    "node_network_transmit_packets_total": ("net", "tx_packets", 1.0),
    "node_network_receive_errs_total": ("net", "rx_errs", 1.0),
    "node_network_receive_drop_total": ("net", "rx_drop", 1.0),
    "node_network_transmit_errs_total": ("net", "tx_errs", 1.0),
    "node_network_transmit_drop_total": ("net", "tx_drop", 1.0),
    "node_network_speed_bytes": ("link", "speed", 1.0),
    "node_boot_time_seconds": ("boot", "boot", 1.0),
}
#: ``node_cpu_seconds_total`` modes -> CpuTimes fields; guest time comes from ``node_cpu_guest_seconds_total``.
CPU_MODES: Final = {
    "user": "user",
    "nice": "nice",
    "system": "system",
    "idle": "idle",
    "iowait": "iowait",
    "irq": "irq",
    "softirq": "softirq",
    "steal": "steal",
}
GUEST_MODES: Final = {"user": "guest", "nice": "guest_nice"}
USER_HZ: Final = 100.0

#: Facts a dcgm-exporter series carries about its GPU: label -> key of the node facts' ``gpus`` entries.
GPU_FACT_LABELS: Final = (
    ("UUID", "uuid"),
    ("modelName", "name"),
    ("Hostname", "hostname"),
    ("pci_bus_id", "pci_bus_id"),
    ("DCGM_FI_DRIVER_VERSION", "driver_version"),
)


def node_of(labels: dict[str, str], node_labels: tuple[str, ...]) -> str | None:
    """The node a series is of: the first of ``node_labels`` it has; ``instance`` loses its port."""
    for name in node_labels:
        value = labels.get(name)
        if not value:
            continue
        if name == "instance":
            value = _host_of(value)
        return value
    return None


def _host_of(instance: str) -> str:
    if instance.startswith("["):  # [v6::addr]:port
        return instance[1:].split("]", 1)[0]
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() and ":" not in host else instance


def _int_label(labels: dict[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.isdigit() and len(value) <= 5 else None


def _describe(s: Series) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in s.labels.items() if k != "__name__")
    return f"{s.labels['__name__']}{{{inner}}}"[:300]


@dataclass
class SeriesPlans:
    """Plan ids and their attributes as arrays, grown as new series arrive; strings kept beside them.

    Thread-safe for the one thing that writes it (:meth:`plan`, from the decoder's cache).
    """

    node_labels: tuple[str, ...] = ("node", "Hostname", "hostname", "instance")
    #: GPU indices above this refuse the request (``ingest.max_gpu_index``, as for an agent's batch).
    max_gpu_index: int = 32767
    capacity: int = 1024
    kind: np.ndarray = field(init=False)
    node: np.ndarray = field(init=False)
    row: np.ndarray = field(init=False)
    own_row: np.ndarray = field(init=False)
    col: np.ndarray = field(init=False)
    prio: np.ndarray = field(init=False)
    scale: np.ndarray = field(init=False)
    blank: np.ndarray = field(init=False)
    integral: np.ndarray = field(init=False)
    lo: np.ndarray = field(init=False)
    hi: np.ndarray = field(init=False)
    run: np.ndarray = field(init=False)
    xid: np.ndarray = field(init=False)
    host_key: np.ndarray = field(init=False)
    #: Per plan id: the series as text (for refusals), and its scrape target (job, instance).
    names: list[str] = field(default_factory=list)
    targets: list[int] = field(default_factory=list)
    #: Interned strings: node names, (node, gpu, mig) rows, run ids, host counter keys.
    nodes: list[str] = field(default_factory=list)
    rows: list[tuple[int, int, int]] = field(default_factory=list)
    runs: list[str | None] = field(default_factory=lambda: [None])
    host_keys: list[str] = field(default_factory=list)
    #: Per row id: what its series said about the GPU (UUID, model, driver ...).
    row_facts: list[dict[str, str]] = field(default_factory=list)
    #: Per run index: the run's facts as the agent reports them (``facts["runs"][run_id]``).
    run_facts: list[dict[str, Any] | None] = field(default_factory=lambda: [None])
    _node_ids: dict[str, int] = field(default_factory=dict)
    _row_ids: dict[tuple[int, int, int], int] = field(default_factory=dict)
    _run_ids: dict[str, int] = field(default_factory=dict)
    _host_key_ids: dict[str, int] = field(default_factory=dict)
    _target_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Bumped with every new plan (what a row's facts say may have grown): keys :attr:`packed`.
    version: int = 0
    #: Packed static parts of pieces (gpufleet.collector.remote_write_pieces), by version and row set.
    packed: dict[bytes, bytes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        n = self.capacity
        self.kind = np.zeros(n, dtype=np.int8)
        self.node = np.full(n, -1, dtype=np.int32)
        self.row = np.full(n, -1, dtype=np.int32)
        self.own_row = np.full(n, -1, dtype=np.int32)
        self.col = np.zeros(n, dtype=np.int16)
        self.prio = np.zeros(n, dtype=np.int16)
        self.scale = np.ones(n, dtype=np.float64)
        self.blank = np.full(n, np.inf, dtype=np.float64)
        self.integral = np.zeros(n, dtype=bool)
        self.lo = np.full(n, -np.inf, dtype=np.float64)
        self.hi = np.full(n, np.inf, dtype=np.float64)
        self.run = np.zeros(n, dtype=np.int32)
        self.xid = np.zeros(n, dtype=np.int32)
        self.host_key = np.full(n, -1, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.names)

    # -- interning ------------------------------------------------------------------

    def _intern(self, table: dict[Any, int], values: list[Any], value: Any) -> int:
        i = table.get(value)
        if i is None:
            i = table[value] = len(values)
            values.append(value)
        return i

    def node_id(self, name: str) -> int:
        return self._intern(self._node_ids, self.nodes, name)

    def row_id(self, node: int, gpu: int, mig: int) -> int:
        key = (node, gpu, mig)
        i = self._row_ids.get(key)
        if i is None:
            i = self._row_ids[key] = len(self.rows)
            self.rows.append(key)
            self.row_facts.append({})
        return i

    # -- plans ------------------------------------------------------------------------

    def plan(self, s: Series) -> int:
        """The plan id of a new label set (the decoder's cache calls this once per label set);
        :class:`RemoteWriteError` for a series no request may carry."""
        with self._lock:
            self.version += 1
            try:
                return self._plan(s)
            except RemoteWriteError:
                del self.names[len(self.names) - 1]
                del self.targets[len(self.targets) - 1]
                raise

    _ARRAYS = (
        "kind",
        "node",
        "row",
        "own_row",
        "col",
        "prio",
        "scale",
        "blank",
        "integral",
        "lo",
        "hi",
        "run",
        "xid",
        "host_key",
    )

    def _grow(self) -> None:
        """Twice the room; the arrays are replaced, not resized, so a request holding the old ones
        reads them unchanged (every id it has is below the old length)."""
        for name in self._ARRAYS:
            old = getattr(self, name)
            new = np.zeros(len(old) * 2, dtype=old.dtype)
            new[: len(old)] = old
            setattr(self, name, new)
        self.capacity *= 2

    def _plan(self, s: Series) -> int:
        pid = len(self.names)
        if pid >= self.capacity:
            self._grow()
        self.names.append(_describe(s))
        target = (s.labels.get("job", ""), s.labels.get("instance", ""))
        self.targets.append(self._target_ids.setdefault(target, len(self._target_ids)))
        for name, value in (
            ("kind", UNUSED),
            ("node", -1),
            ("row", -1),
            ("own_row", -1),
            ("col", 0),
            ("prio", 0),
            ("scale", 1.0),
            ("blank", np.inf),
            ("integral", False),
            ("lo", -np.inf),
            ("hi", np.inf),
            ("run", 0),
            ("xid", 0),
            ("host_key", -1),
        ):
            getattr(self, name)[pid] = value
        labels = s.labels
        name = labels["__name__"]
        gpu_series = _gpu_series(name)
        host = _host_series(name, labels)
        if gpu_series is None and host is None:
            return pid
        node = node_of(labels, self.node_labels)
        if node is None:
            self.kind[pid] = NO_NODE
            return pid
        if not is_node_name(node):
            # Not the request's fault (Prometheus would drop every request carrying the series if it
            # were refused): counted, and said once per series.
            log.warning(
                "remote write: %s names node %r, not a host name of [A-Za-z0-9._-] (the first of "
                "the labels %s); its samples are dropped: relabel it",
                self.names[pid],
                node,
                ", ".join(self.node_labels),
            )
            self.kind[pid] = BAD_NODE
            return pid
        nid = self.node_id(node)
        self.node[pid] = nid
        if host is not None:
            self.kind[pid] = HOST
            self.host_key[pid] = self._intern(self._host_key_ids, self.host_keys, host[0])
            self.scale[pid] = host[1]
            return pid
        assert gpu_series is not None
        column, dcgm_type, scale, priority, is_xid_count = gpu_series
        gpu = _int_label(labels, "gpu")
        xid = _int_label(labels, "xid") if is_xid_count else 0
        if gpu is None or xid is None:
            self.kind[pid] = NO_GPU if gpu is None else UNUSED
            return pid
        if gpu > self.max_gpu_index:
            raise RemoteWriteError(
                f"{self.names[pid]}: GPU index {gpu} is above the collector's bound of "
                f"{self.max_gpu_index} (ingest.max_gpu_index)"
            )
        mig_label = _int_label(labels, "GPU_I_ID")
        mig = -1 if mig_label is None or mig_label > 32767 else mig_label
        parent = self.row_id(nid, gpu, -1)
        facts = self.row_facts[parent]
        for label, key in GPU_FACT_LABELS:
            if labels.get(label):
                facts.setdefault(key, labels[label])
        # As the agent's exposition parser: XID series and the framebuffer parts make or name the
        # physical GPU's row and attribute nothing; a field series makes its own row (the MIG
        # instance's, on one) and attributes it; a device-level value on an instance's series goes to
        # its physical GPU, below that GPU's own series.
        plain = not is_xid_count and column not in (XID_GAUGE, FB_FREE, FB_RESERVED)
        own = self.row_id(nid, gpu, mig) if plain else parent
        if labels.get("UUID"):
            self.row_facts[own].setdefault("uuid", labels["UUID"])
        on_parent = plain and mig >= 0 and column in WHOLE_GPU_FIELDS
        self.own_row[pid] = own
        self.row[pid] = parent if on_parent else own
        if plain:
            self.run[pid] = self._run_of(labels)
        if is_xid_count:
            self.kind[pid] = XID_COUNT
            self.xid[pid] = xid
            self.lo[pid] = 0.0
            return pid
        self.kind[pid] = GPU
        self.col[pid] = COLUMN_INDEX[column]
        self.prio[pid] = priority + (MIG_PARENT_PRIORITY if on_parent else 0)
        self.scale[pid] = scale
        self.blank[pid] = DCGM_FP64_BLANK if dcgm_type == "double" else float(DCGM_INT64_BLANK)
        lo, hi = _bounds(column)
        self.integral[pid] = column == XID_GAUGE or (
            column in GPU_BY_NAME and GPU_BY_NAME[column].kind in INT_RANGES
        )
        self.lo[pid] = lo
        self.hi[pid] = hi
        return pid

    def _run_of(self, labels: dict[str, str]) -> int:
        """The run the pod labels name (0: none): ``<namespace>:<pod>``, as the agent's attribution
        names it from the same labels when it cannot ask the API server."""
        ns = labels.get("namespace") or labels.get("exported_namespace")
        pod = labels.get("pod") or labels.get("exported_pod")
        if not (ns and pod):
            return 0
        uid = labels.get("pod_uid") or None
        run = K8sRun(
            run_id_for(ns, pod, uid),
            pod,
            "Pod",
            ns,
            ns,
            {"k8s.namespace": ns, "k8s.kind": "Pod", "k8s.name": pod},
        )
        i = self._intern(self._run_ids, self.runs, run.run_id)
        if i == len(self.run_facts):
            self.run_facts.append(run.facts())
        return i


def _gpu_series(name: str) -> tuple[str, str, float, int, bool] | None:
    """(column, DCGM type, scale, priority, is the XID count) of a dcgm-exporter series; None for any
    other name."""
    if name == XID_COUNT_SERIES:
        return ("xid", "int64", 1.0, 0, True)
    part = FB_PARTS.get(name)
    if part is not None:
        return (FB_FREE if part == "free" else FB_RESERVED, "int64", 1.0, 0, False)
    f = SERIES.get(name) or SERIES.get(name.removesuffix("_total"))
    if f is None:
        return None
    if f.column == "xid":
        return (XID_GAUGE, "int64", 1.0, 0, False)
    if f.column not in COLUMN_INDEX:
        return None
    return (f.column, f.dcgm_type, f.scale, f.priority, False)


#: The largest finite float4 (a ``real`` column's values beyond it would be stored as infinity).
_FLOAT4_MAX = 3.4028234663852886e38


def _bounds(column: str) -> tuple[float, float]:
    """The values a column accepts, as the ingest validator bounds them."""
    f = GPU_BY_NAME.get(column)
    if f is None:  # the framebuffer parts and the XID gauge: non-negative counts
        return 0.0, float(2**31 - 1) if column == XID_GAUGE else np.inf
    lo, hi = f.lo, f.hi
    if f.kind in INT_RANGES:
        ilo, ihi = INT_RANGES[f.kind]
        lo = ilo if lo is None else max(lo, ilo)
        hi = ihi if hi is None else min(hi, ihi)
    elif f.kind == "real":
        lo = -_FLOAT4_MAX if lo is None else max(lo, -_FLOAT4_MAX)
        hi = _FLOAT4_MAX if hi is None else min(hi, _FLOAT4_MAX)
    return (-np.inf if lo is None else float(lo)), (np.inf if hi is None else float(hi))


_DEVICE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+\-]{0,127}")


def _host_series(name: str, labels: dict[str, str]) -> tuple[str, float] | None:
    """(counter key, factor into the kernel's unit) of a node_exporter counter the host rows read."""
    if name == "node_cpu_seconds_total" or name == "node_cpu_guest_seconds_total":
        cpu = labels.get("cpu", "")
        modes = CPU_MODES if name == "node_cpu_seconds_total" else GUEST_MODES
        mode = modes.get(labels.get("mode", ""))
        if not cpu.isdigit() or mode is None:
            return None
        return f"cpu/{int(cpu)}/{mode}", USER_HZ
    spec = HOST_COUNTERS.get(name)
    if spec is None:
        return None
    group, fld, factor = spec
    if group == "boot":
        return "boot", 1.0
    device = labels.get("device", "")
    if not _DEVICE.fullmatch(device):
        return None
    return f"{group}/{device}/{fld}", factor
