"""The ``dcgm`` source, and the DCGM field -> catalog mapping it shares with ``dcgm_exporter``.

DCGM adds what NVML cannot give: profiling ratios (SM, tensor pipe and DRAM
activity) and PCIe/NVLink byte rates, per GPU and per MIG instance.  Its Python
bindings (``pydcgm``, ``dcgm_structs``, ``dcgm_fields``, ``dcgm_agent``) ship
with NVIDIA's datacenter-gpu-manager package, not PyPI; where they cannot be
imported the source raises :class:`SourceUnavailable` and the agent runs NVML
alone.

:data:`DCGM_FIELDS` is the mapping as data: field id, canonical name and legacy
aliases (dcgm-exporter prints either), DCGM value type, catalog column and the
factor into the catalog unit.  DCGM marks missing values with "blank"
sentinels (INT64 >= 0x7ffffffffffffff0, FP64 >= 2**47, strings ``<<<...>>>``);
:func:`to_catalog` turns every one of them into None.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from gpufleet.agent.sources.base import GpuRow, Reading, SourceError, SourceUnavailable
from gpufleet.catalog import GPU_BY_NAME, WHOLE_GPU_FIELDS

log = logging.getLogger(__name__)

DcgmType = Literal["int64", "double"]

#: DCGM blank sentinels (dcgmvalue.py): anything at or above is "no value".
DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0  # 2**47
#: Offsets above the blank base: NOT_FOUND = +1, NOT_SUPPORTED = +2, NOT_PERMISSIONED = +3.
_NOT_SUPPORTED_OFFSETS = (2, 3)

#: Where DCGM's Python bindings are installed by the datacenter-gpu-manager packages.
BINDINGS_DIRS = (
    "/usr/share/datacenter-gpu-manager-4/bindings/python3",
    "/usr/local/dcgm/bindings/python3",
    "/usr/src/dcgm/bindings/python3",
)


@dataclass(frozen=True)
class DcgmField:
    """One DCGM field feeding one catalog column."""

    field_id: int
    #: Canonical DCGM_FI_* name (DCGM 4 renamed several; see ``aliases``).
    name: str
    #: Older names of the same id, still printed by dcgm-exporter.
    aliases: tuple[str, ...]
    #: DCGM's short tag; dcgm-exporter 1.x printed ``dcgm_<tag>``.
    tag: str
    dcgm_type: DcgmType
    #: Catalog column (``gpufleet.catalog``).
    column: str
    #: Multiply the DCGM value by this to get the catalog unit.
    scale: float = 1.0
    #: When two fields feed one column, the lower priority wins.
    priority: int = 0

    def names(self) -> tuple[str, ...]:
        """Every series name dcgm-exporter may print for this field."""
        base = (self.name, *self.aliases)
        return (*base, *(n.lower() for n in base), f"dcgm_{self.tag}")


DCGM_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        203, "DCGM_FI_DEV_GPU_UTIL_RATIO", ("DCGM_FI_DEV_GPU_UTIL",), "gpu_utilization", "int64", "util_pct"
    ),
    DcgmField(
        1002, "DCGM_FI_PROF_SM_UTIL_RATIO", ("DCGM_FI_PROF_SM_ACTIVE",), "sm_active", "double", "sm_active"
    ),
    DcgmField(
        1004,
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",),
        "tensor_active",
        "double",
        "tensor_active",
    ),
    DcgmField(
        1005,
        "DCGM_FI_PROF_DRAM_UTIL_RATIO",
        ("DCGM_FI_PROF_DRAM_ACTIVE",),
        "dram_active",
        "double",
        "dram_active",
    ),
    DcgmField(252, "DCGM_FI_DEV_FB_USED", (), "fb_used", "int64", "mem_used_mib"),
    DcgmField(250, "DCGM_FI_DEV_FB_TOTAL", (), "fb_total", "int64", "mem_total_mib"),
    DcgmField(
        155, "DCGM_FI_DEV_BOARD_POWER_WATTS", ("DCGM_FI_DEV_POWER_USAGE",), "power_usage", "double", "power_w"
    ),
    DcgmField(
        156, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", (), "total_energy_consumption", "int64", "energy_mj"
    ),
    DcgmField(
        164,
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_ENFORCED_WATTS",
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT",),
        "enforced_power_limit",
        "double",
        "power_limit_w",
    ),
    # The management limit (what ``nvidia-smi -pl`` sets): many counters files carry it and not
    # the enforced one; it stands in where the enforced limit is missing or blank.
    DcgmField(
        160,
        "DCGM_FI_DEV_BOARD_POWER_LIMIT_REQUESTED_WATTS",
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT",),
        "power_management_limit",
        "double",
        "power_limit_w",
        priority=1,
    ),
    DcgmField(100, "DCGM_FI_DEV_SM_CLOCK", (), "sm_clock", "int64", "sm_clock_mhz"),
    DcgmField(113, "DCGM_FI_DEV_MAX_SM_CLOCK", (), "sm_max_clock", "int64", "sm_clock_max_mhz"),
    DcgmField(101, "DCGM_FI_DEV_MEM_CLOCK", (), "memory_clock", "int64", "mem_clock_mhz"),
    DcgmField(150, "DCGM_FI_DEV_GPU_TEMP_CELSIUS", ("DCGM_FI_DEV_GPU_TEMP",), "gpu_temp", "int64", "temp_c"),
    DcgmField(
        140,
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
        ("DCGM_FI_DEV_MEMORY_TEMP",),
        "memory_temp",
        "int64",
        "mem_temp_c",
    ),
    DcgmField(
        112,
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",),
        "current_clocks_event_reasons",
        "int64",
        "throttle_reasons",
    ),
    # DCGM_FI_PROF_PCIE_* are rates (bytes/s) despite the name; the DEV
    # throughput fields are the older KB/s fallback for GPUs without profiling.
    DcgmField(1009, "DCGM_FI_PROF_PCIE_TX_BYTES", (), "pcie_tx_bytes", "int64", "pcie_tx_bytes_s"),
    DcgmField(1010, "DCGM_FI_PROF_PCIE_RX_BYTES", (), "pcie_rx_bytes", "int64", "pcie_rx_bytes_s"),
    DcgmField(
        200, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", (), "pcie_tx_throughput", "int64", "pcie_tx_bytes_s", 1024.0, 1
    ),
    DcgmField(
        201, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", (), "pcie_rx_throughput", "int64", "pcie_rx_bytes_s", 1024.0, 1
    ),
    DcgmField(237, "DCGM_FI_DEV_PCIE_LINK_GEN", (), "pcie_link_gen", "int64", "pcie_gen"),
    DcgmField(235, "DCGM_FI_DEV_PCIE_MAX_LINK_GEN", (), "pcie_max_link_gen", "int64", "pcie_gen_max"),
    DcgmField(238, "DCGM_FI_DEV_PCIE_LINK_WIDTH", (), "pcie_link_width", "int64", "pcie_width"),
    DcgmField(236, "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", (), "pcie_max_link_width", "int64", "pcie_width_max"),
    DcgmField(1011, "DCGM_FI_PROF_NVLINK_TX_BYTES", (), "nvlink_tx_bytes", "int64", "nvlink_tx_bytes_s"),
    DcgmField(1012, "DCGM_FI_PROF_NVLINK_RX_BYTES", (), "nvlink_rx_bytes", "int64", "nvlink_rx_bytes_s"),
    DcgmField(311, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", (), "ecc_dbe_volatile_total", "int64", "ecc_dbe_vol"),
    DcgmField(230, "DCGM_FI_DEV_XID_ERROR", ("DCGM_FI_DEV_XID_ERRORS",), "xid_errors", "int64", "xid"),
    # Memory, bus and NVLink health.  DCGM 4 names first, the older names dcgm-exporter
    # configurations still use as aliases; where a newer GPU family reports a
    # counter under a newer id (497-499) that id fills the column only when the
    # classic one has no value.
    DcgmField(310, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", (), "ecc_sbe_volatile_total", "int64", "ecc_sbe_vol"),
    DcgmField(312, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", (), "ecc_sbe_aggregate_total", "int64", "ecc_sbe_agg"),
    DcgmField(313, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", (), "ecc_dbe_aggregate_total", "int64", "ecc_dbe_agg"),
    DcgmField(
        393,
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",),
        "uncorrectable_remapped_rows",
        "int64",
        "remapped_rows_uncorrectable",
    ),
    DcgmField(
        394,
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",),
        "correctable_remapped_rows",
        "int64",
        "remapped_rows_correctable",
    ),
    DcgmField(
        395,
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE",),
        "row_remap_failure",
        "int64",
        "remapped_rows_failed",
    ),
    DcgmField(
        396, "DCGM_FI_DEV_ROW_REMAP_PENDING", (), "row_remap_pending", "int64", "remapped_rows_pending"
    ),
    DcgmField(
        202,
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
        "pcie_replay_counter",
        "int64",
        "pcie_replay_count",
    ),
    DcgmField(
        409,
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL",
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",),
        "nvlink_flit_crc_error_count_total",
        "int64",
        "nvlink_crc_errors",
    ),
    DcgmField(
        497,
        "DCGM_FI_DEV_NVLINK_CRC_ERROR_TOTAL",
        ("DCGM_FI_DEV_NVLINK_ERROR_DL_CRC",),
        "nvlink_crc_err",
        "int64",
        "nvlink_crc_errors",
        priority=1,
    ),
    DcgmField(
        429,
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL",
        ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",),
        "nvlink_replay_error_count_total",
        "int64",
        "nvlink_replay_errors",
    ),
    DcgmField(
        499,
        "DCGM_FI_DEV_NVLINK_REPLAY_TOTAL",
        ("DCGM_FI_DEV_NVLINK_ERROR_DL_REPLAY",),
        "nvlink_replay_err",
        "int64",
        "nvlink_replay_errors",
        priority=1,
    ),
    DcgmField(
        439,
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL",
        ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",),
        "nvlink_recovery_error_count_total",
        "int64",
        "nvlink_recovery_errors",
    ),
    DcgmField(
        498,
        "DCGM_FI_DEV_NVLINK_RECOVERY_TOTAL",
        ("DCGM_FI_DEV_NVLINK_ERROR_DL_RECOVERY",),
        "nvlink_recovery_err",
        "int64",
        "nvlink_recovery_errors",
        priority=1,
    ),
)

#: NvLink link states of ``dcgmGetNvLinkLinkStatus`` (dcgm_structs: DcgmNvLinkLinkState*).
LINK_NOT_SUPPORTED = 0
LINK_UP = 3

FIELD_BY_ID: dict[int, DcgmField] = {f.field_id: f for f in DCGM_FIELDS}
#: Every series name (canonical, legacy, lower-case, 1.x) -> field.
FIELD_BY_NAME: dict[str, DcgmField] = {n: f for f in DCGM_FIELDS for n in f.names()}
#: Profiling fields need the DCGM profiling module; watched separately so a GPU
#: without it still gets the DEV fields.
PROF_FIELD_IDS = frozenset(f.field_id for f in DCGM_FIELDS if 1001 <= f.field_id <= 1040)


def blank_kind(value: Any, dcgm_type: DcgmType) -> Literal["value", "blank", "not_supported"]:
    """Classify a raw DCGM value: a real value, a blank (no data yet), or not supported/permitted."""
    if value is None:
        return "blank"
    if isinstance(value, str | bytes):
        text = value.decode() if isinstance(value, bytes) else value
        if text.startswith("<<<") and ">>>" in text:
            return "not_supported" if "NOT_SUPPORTED" in text or "NOT_PERM" in text else "blank"
        return "value"
    base = DCGM_FP64_BLANK if dcgm_type == "double" else DCGM_INT64_BLANK
    if value >= base:
        return "not_supported" if any(value == base + k for k in _NOT_SUPPORTED_OFFSETS) else "blank"
    return "value"


def to_catalog(field: DcgmField, value: Any) -> float | int | None:
    """A DCGM value in the catalog column's unit and type; None for every blank sentinel."""
    if blank_kind(value, field.dcgm_type) != "value":
        return None
    integral = GPU_BY_NAME[field.column].kind in ("smallint", "integer", "bigint")
    if integral and isinstance(value, int) and field.scale == 1.0:
        return value  # exact: counters such as energy_mj exceed float precision eventually
    number = float(value) * field.scale
    return round(number) if integral else number


def merge_field(row: GpuRow, sources: dict[str, int], field: DcgmField, value: float | int | None) -> None:
    """Put a value into ``row`` unless a higher-priority field already filled the column."""
    if value is None:
        row.setdefault(field.column, None)
        return
    held = sources.get(field.column)
    if held is None or field.priority < held:
        row[field.column] = value
        sources[field.column] = field.priority


def null_whole_gpu_fields(row: GpuRow) -> None:
    """MIG instance rows never carry whole-board quantities (they belong to the physical GPU's row)."""
    for name in WHOLE_GPU_FIELDS:
        if name in row:
            row[name] = None


# --------------------------------------------------------------------------- the source


@dataclass(frozen=True)
class DcgmBindings:
    """The four DCGM Python modules the source uses."""

    pydcgm: ModuleType
    dcgm_structs: ModuleType
    dcgm_fields: ModuleType
    dcgm_agent: ModuleType


def load_bindings(extra_dirs: Iterable[str] = BINDINGS_DIRS) -> DcgmBindings:
    """Import DCGM's Python bindings, looking in the package install directories too."""
    names = ("pydcgm", "dcgm_structs", "dcgm_fields", "dcgm_agent")
    try:
        return DcgmBindings(*(importlib.import_module(n) for n in names))
    except ImportError:
        pass
    for d in extra_dirs:
        if os.path.isdir(d) and d not in sys.path:
            sys.path.append(d)
    try:
        return DcgmBindings(*(importlib.import_module(n) for n in names))
    except ImportError as e:
        raise SourceUnavailable(
            "dcgm: DCGM Python bindings (datacenter-gpu-manager) are not installed"
        ) from e


@dataclass(frozen=True)
class _Instance:
    entity_id: int
    gpu: int
    gpu_instance_id: int


class DcgmSource:
    """The ``dcgm`` source: latest watched values per GPU and MIG GPU instance from nv-hostengine."""

    name = "dcgm"

    def __init__(
        self,
        host: str = "localhost",
        update_interval_s: float = 1.0,
        bindings: DcgmBindings | None = None,
        field_ids: Iterable[int] | None = None,
    ) -> None:
        self.host = host
        self.update_interval_s = update_interval_s
        self._bindings = bindings
        self.field_ids = sorted(set(field_ids) if field_ids is not None else FIELD_BY_ID)
        self._handle: Any = None
        self._group: Any = None
        self._field_groups: list[Any] = []
        self._gpus: list[int] = []
        self._uuids: dict[int, str] = {}
        self._instances: list[_Instance] = []
        self._xid_ts: dict[tuple[int, int], int] = {}
        #: False once dcgmGetNvLinkLinkStatus proved unavailable (links up/max stay NULL).
        self._link_status_ok = True

    @property
    def b(self) -> DcgmBindings:
        if self._bindings is None:
            self._bindings = load_bindings()
        return self._bindings

    def _dcgm_error(self, what: str, e: Exception) -> SourceError:
        return SourceError(f"dcgm: {what}: {e}")

    def _start(self) -> None:
        if self._group is not None:
            return
        b = self.b
        try:
            handle = b.pydcgm.DcgmHandle(ipAddress=self.host, opMode=b.dcgm_structs.DCGM_OPERATION_MODE_AUTO)
        except b.dcgm_structs.DCGMError as e:
            raise SourceUnavailable(f"dcgm: cannot connect to nv-hostengine at {self.host}: {e}") from e
        try:
            system = handle.GetSystem()
            gpus = list(system.discovery.GetAllSupportedGpuIds())
            uuids = {g: _text(system.discovery.GetGpuAttributes(g).identifiers.uuid) for g in gpus}
            instances = self._mig_instances(handle)
            group = system.GetEmptyGroup(f"gpufleet_{os.getpid()}")
            for g in gpus:
                group.AddEntity(b.dcgm_fields.DCGM_FE_GPU, g)
            for inst in instances:
                group.AddEntity(b.dcgm_fields.DCGM_FE_GPU_I, inst.entity_id)
            interval_us = int(self.update_interval_s * 1_000_000)
            keep_age_s = max(30.0, self.update_interval_s * 10)
            dev_ids = [f for f in self.field_ids if f not in PROF_FIELD_IDS]
            prof_ids = [f for f in self.field_ids if f in PROF_FIELD_IDS]
            field_groups = []
            for label, ids in (("dev", dev_ids), ("prof", prof_ids)):
                if not ids:
                    continue
                fg = b.pydcgm.DcgmFieldGroup(handle, f"gpufleet_{label}_{os.getpid()}", ids)
                try:
                    group.samples.WatchFields(fg, interval_us, keep_age_s, 0)
                except b.dcgm_structs.DCGMError as e:
                    if label == "dev":
                        raise
                    # No profiling module (consumer GPU, or another profiler holds
                    # the counters): the profiling columns stay NULL.
                    log.warning("dcgm: cannot watch profiling fields: %s", e)
                    fg.Delete()
                    continue
                field_groups.append(fg)
            system.UpdateAllFields(1)
        except b.dcgm_structs.DCGMError as e:
            raise self._dcgm_error("setting up watches", e) from e
        self._handle, self._group, self._field_groups = handle, group, field_groups
        self._gpus, self._uuids, self._instances = gpus, uuids, instances

    def _mig_instances(self, handle: Any) -> list[_Instance]:
        b = self.b
        hierarchy = b.dcgm_agent.dcgmGetGpuInstanceHierarchy(handle.handle)
        out = []
        for i in range(hierarchy.count):
            e = hierarchy.entityList[i]
            if e.entity.entityGroupId == b.dcgm_fields.DCGM_FE_GPU_I:
                out.append(_Instance(e.entity.entityId, e.parent.entityId, e.info.nvmlInstanceId))
        return out

    def collect(self) -> Reading:
        self._start()
        b = self.b
        try:
            latest = [self._group.samples.GetLatest_v2(fg).values for fg in self._field_groups]
        except b.dcgm_structs.DCGMError as e:
            # A lost connection (hostengine restarted) is rebuilt on the next collect.
            self._reset()
            raise self._dcgm_error("reading latest values", e) from e
        rows: list[GpuRow] = []
        gpu_group, inst_group = b.dcgm_fields.DCGM_FE_GPU, b.dcgm_fields.DCGM_FE_GPU_I
        links = self._links()
        for g in self._gpus:
            row: GpuRow = {"gpu": g, "mig_instance": None, "uuid": self._uuids.get(g)}
            self._fill(row, (values.get(gpu_group, {}).get(g, {}) for values in latest), (gpu_group, g))
            if g in links:
                row["nvlink_links_up"], row["nvlink_links_max"] = links[g]
            rows.append(row)
        for inst in self._instances:
            row = {"gpu": inst.gpu, "mig_instance": inst.gpu_instance_id, "uuid": self._uuids.get(inst.gpu)}
            self._fill(
                row,
                (values.get(inst_group, {}).get(inst.entity_id, {}) for values in latest),
                (inst_group, inst.entity_id),
            )
            null_whole_gpu_fields(row)
            rows.append(row)
        return Reading(gpus=rows)

    def _links(self) -> dict[int, tuple[int, int]]:
        """Per GPU id: (NVLink links up, links present), from dcgmGetNvLinkLinkStatus.

        Link state is no watched field in DCGM, hence the separate call.  A GPU
        whose every link is "not supported" has no NVLink and is left out (NULL)."""
        fn = getattr(self.b.dcgm_agent, "dcgmGetNvLinkLinkStatus", None)
        if fn is None or not self._link_status_ok:
            return {}
        try:
            status = fn(self._handle.handle)
        except self.b.dcgm_structs.DCGMError as e:
            log.warning("dcgm: NVLink link status unavailable (%s); links up stay NULL", e)
            self._link_status_ok = False
            return {}
        out: dict[int, tuple[int, int]] = {}
        for i in range(int(status.numGpus)):
            entry = status.gpus[i]
            present = [int(st) for st in entry.linkState if int(st) != LINK_NOT_SUPPORTED]
            if present:
                out[int(entry.entityId)] = (sum(1 for st in present if st == LINK_UP), len(present))
        return out

    def _fill(self, row: GpuRow, per_group: Iterable[Mapping[int, Any]], entity: tuple[int, int]) -> None:
        sources: dict[str, int] = {}
        for fields in per_group:
            for field_id, samples in fields.items():
                field = FIELD_BY_ID.get(field_id)
                if field is None or not samples:
                    continue
                sample = samples[-1]
                raw = getattr(sample, "value", None)
                if field.column == "xid":
                    row["xid"] = self._xid(entity, sample, raw)
                    continue
                merge_field(row, sources, field, to_catalog(field, raw))

    def _xid(self, entity: tuple[int, int], sample: Any, raw: Any) -> int | None:
        """The XID reported since the previous collect, 0 if none; None if DCGM cannot report XIDs."""
        kind = blank_kind(raw, "int64")
        if kind == "not_supported":
            return None
        if kind == "blank":
            return 0
        # DCGM keeps the last XID until another arrives: only a sample newer
        # than the one reported before belongs to this interval.  DCGM records
        # XIDs only once watched, so the first one seen is recent too.
        ts = int(getattr(sample, "ts", 0) or 0)
        if ts <= self._xid_ts.get(entity, -1):
            return 0
        self._xid_ts[entity] = ts
        return int(raw)

    def _reset(self) -> None:
        self._group = None
        self._field_groups = []
        self._handle = None

    def close(self) -> None:
        """Drop watches, groups and the hostengine connection."""
        b = self._bindings
        if b is None:
            return
        try:
            for fg in self._field_groups:
                fg.Delete()
            if self._group is not None:
                self._group.Delete()
        except b.dcgm_structs.DCGMError as e:
            log.warning("dcgm: cleanup failed: %s", e)
        finally:
            self._reset()

    def facts(self) -> dict[str, Any]:
        """GPU UUIDs and MIG instances as DCGM sees them."""
        self._start()
        return {
            "dcgm_gpus": [{"gpu": g, "uuid": self._uuids.get(g)} for g in self._gpus],
            "dcgm_mig_instances": [
                {"gpu": i.gpu, "gpu_instance_id": i.gpu_instance_id} for i in self._instances
            ],
        }


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
