"""The ``dcgm_exporter`` source: scrape a running dcgm-exporter and map its series to catalog rows.

Clusters that already run NVIDIA's dcgm-exporter (the GPU Operator deploys it)
can feed gpufleet without a second DCGM client.  Series are recognised by every
name dcgm-exporter has printed for a field (canonical, legacy alias, 1.x
``dcgm_<tag>``), through the mapping shared with :mod:`gpufleet.agent.sources.dcgm`, so
units and blank sentinels are handled the same way.

Labels: ``gpu`` gives the GPU index, ``UUID`` the GPU UUID, ``GPU_I_ID`` the
MIG GPU instance.  dcgm-exporter repeats device-level fields (power, energy,
clocks...) on every MIG instance series; those go to the physical GPU's row
once and are NULL on instance rows, so energy is not counted per instance.
Kubernetes attribution labels (``pod``, ``namespace``, ``container``,
``pod_uid``) are kept under the row key ``"labels"`` when present; the
attribution step (:mod:`gpufleet.agent.attribution`) turns them into the
row's ``run_id`` and removes them before the row is spooled.

Beyond the fields the ``dcgm`` source watches, the exporter's own field list
(``deploy/dcgm-exporter/counters.csv``, the one gpufleet ships) carries
health and utilisation counters: graphics-engine activity, memory-copy
utilisation, NVLink throughput, ECC and row-remap counters and PCIe replays.
:data:`EXPORTER_FIELDS` maps them; the shared table of
:mod:`gpufleet.agent.sources.dcgm` wins where both name a series.

dcgm-exporter's stock ``default-counters.csv`` prints free, used and reserved
framebuffer memory but not the total, which the catalog keeps
(``mem_total_mib``, DCGM's ``FB_TOTAL``): where the total is missing it is
free + used + reserved, as DCGM and NVML account for a GPU's memory (free +
used where the exporter predates the reserved field).

``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the last XID ever seen, so an
XID is reported when that value changes between scrapes (0 otherwise); where
dcgm-exporter exports ``DCGM_EXP_XID_ERRORS_COUNT`` (XIDs in its last window,
labelled ``xid``), that count is used instead.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.sources.base import GpuRow, Reading, SourceError
from gpufleet.agent.sources.dcgm import (
    FIELD_BY_NAME,
    DcgmField,
    blank_kind,
    merge_field,
    null_whole_gpu_fields,
    to_catalog,
)
from gpufleet.catalog import WHOLE_GPU_FIELDS

log = logging.getLogger(__name__)

#: Labels that attribute a GPU to a workload; passed through under "labels".
ATTRIBUTION_LABELS = (
    "pod",
    "namespace",
    "container",
    "pod_uid",
    "exported_pod",
    "exported_namespace",
    "exported_container",
)
XID_COUNT_SERIES = "DCGM_EXP_XID_ERRORS_COUNT"

#: Fields the exporter can print that the ``dcgm`` source's table does not map
#: (id, canonical DCGM 4 name, older names, tag and type from dcgm_fields.h).
EXPORTER_FIELDS: tuple[DcgmField, ...] = (
    DcgmField(
        1001,
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE",),
        "gr_engine_active",
        "double",
        "gr_engine_active",
    ),
    DcgmField(204, "DCGM_FI_DEV_MEM_COPY_UTIL", (), "mem_copy_utilization", "int64", "mem_copy_util_pct"),
    DcgmField(
        449,
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL",
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",),
        "nvlink_throughput_total",
        "int64",
        "nvlink_bandwidth_mb_s",
    ),
)

#: Every series name the source recognises: the shared table first, then the
#: exporter's own fields, then the one 1.x name that is not ``dcgm_<tag>``.
SERIES: dict[str, DcgmField] = {
    **{n: f for f in EXPORTER_FIELDS for n in f.names()},
    "dcgm_nvlink_bandwidth_total": EXPORTER_FIELDS[2],
    **FIELD_BY_NAME,
}

Key = tuple[int, int | None]

#: The framebuffer series that add up to the total (``FB_TOTAL``) where the exporter does not print it.
FB_PARTS = {
    "DCGM_FI_DEV_FB_FREE": "free",
    "dcgm_fb_free": "free",
    "DCGM_FI_DEV_FB_RESERVED": "reserved",
    "dcgm_fb_resv": "reserved",
}


def _field_for(family_name: str, sample_name: str) -> DcgmField | None:
    for name in (family_name, sample_name, sample_name.removesuffix("_total")):
        f = SERIES.get(name)
        if f is not None:
            return f
    return None


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    value = labels.get(name, "")
    return int(value) if value.strip().isdigit() else None


class ExpositionParse:
    """What one scrape said, before XID interval logic: rows by (gpu, mig_instance), raw XIDs, facts."""

    def __init__(self) -> None:
        self.rows: dict[Key, GpuRow] = {}
        self.priority: dict[Key, dict[str, int]] = {}
        self.xid_gauge: dict[int, int | None] = {}
        self.xid_counts: dict[int, dict[int, float]] = {}
        self.gpus: dict[int, dict[str, Any]] = {}
        #: Free and reserved framebuffer MiB per row (:data:`FB_PARTS`).
        self.fb: dict[Key, dict[str, float]] = {}

    def row(self, key: Key, uuid: str | None) -> GpuRow:
        if key not in self.rows:
            self.rows[key] = {"gpu": key[0], "mig_instance": key[1], "uuid": uuid}
            self.priority[key] = {}
        return self.rows[key]


def parse_exposition(text: str) -> ExpositionParse:
    """Parse a dcgm-exporter ``/metrics`` body into per-GPU and per-MIG-instance catalog values."""
    out = ExpositionParse()
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SourceError(f"dcgm_exporter: malformed exposition: {e}") from e
    for family in families:
        for sample in family.samples:
            labels = sample.labels
            gpu = _int_label(labels, "gpu")
            if gpu is None:
                continue
            mig = _int_label(labels, "GPU_I_ID")
            uuid = labels.get("UUID") or labels.get("uuid") or None
            info = out.gpus.setdefault(gpu, {"gpu": gpu})
            for src, dst in (
                ("UUID", "uuid"),
                ("modelName", "name"),
                ("Hostname", "hostname"),
                ("pci_bus_id", "pci_bus_id"),
                ("DCGM_FI_DRIVER_VERSION", "driver_version"),
            ):
                if labels.get(src):
                    info.setdefault(dst, labels[src])
            if family.name == XID_COUNT_SERIES:
                out.row((gpu, None), uuid)
                xid = _int_label(labels, "xid")
                if xid is not None:
                    out.xid_counts.setdefault(gpu, {})[xid] = float(sample.value)
                continue
            part = FB_PARTS.get(family.name) or FB_PARTS.get(sample.name)
            if part is not None:
                if blank_kind(sample.value, "int64") == "value":
                    out.fb.setdefault((gpu, mig), {})[part] = float(sample.value)
                continue
            field = _field_for(family.name, sample.name)
            if field is None:
                continue
            if field.column == "xid":
                out.row((gpu, None), uuid)
                kind = blank_kind(sample.value, "int64")
                out.xid_gauge[gpu] = (
                    int(sample.value) if kind == "value" else (None if kind == "not_supported" else 0)
                )
                continue
            value = to_catalog(field, sample.value)
            key: Key = (gpu, mig)
            row = out.row(key, uuid)
            attribution = {k: labels[k] for k in ATTRIBUTION_LABELS if labels.get(k)}
            if attribution:
                row.setdefault("labels", {}).update(attribution)
            if mig is not None and field.column in WHOLE_GPU_FIELDS:
                # A device-level value repeated on an instance series: it belongs
                # to the physical GPU, once.
                parent = out.row((gpu, None), uuid)
                if parent.get(field.column) is None:
                    merge_field(parent, out.priority[(gpu, None)], field, value)
                continue
            merge_field(row, out.priority[key], field, value)
    for key, row in out.rows.items():
        fb = out.fb.get(key)
        if fb and "free" in fb and row.get("mem_total_mib") is None and row.get("mem_used_mib") is not None:
            row["mem_total_mib"] = fb["free"] + row["mem_used_mib"] + fb.get("reserved", 0.0)
        if key[1] is not None:
            null_whole_gpu_fields(row)
            for name in WHOLE_GPU_FIELDS:
                row.setdefault(name, None)
    return out


class DcgmExporterSource:
    """The ``dcgm_exporter`` source: one HTTP scrape per collect."""

    name = "dcgm_exporter"

    def __init__(
        self,
        url: str = "http://127.0.0.1:9400/metrics",
        timeout_s: float = 10.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url
        self._client = client if client is not None else httpx.Client(timeout=timeout_s)
        self._owns_client = client is None
        self._last_xid_gauge: dict[int, int | None] = {}
        self._last: ExpositionParse | None = None

    def scrape(self) -> str:
        try:
            resp = self._client.get(self.url, headers={"Accept": "text/plain"})
            resp.raise_for_status()
        except httpx.HTTPError as e:
            raise SourceError(f"dcgm_exporter: scraping {self.url} failed: {e}") from e
        return resp.text

    def collect(self) -> Reading:
        parsed = parse_exposition(self.scrape())
        for (gpu, mig), row in parsed.rows.items():
            if mig is None:
                row["xid"] = self._xid(parsed, gpu)
        self._last_xid_gauge = dict(parsed.xid_gauge)
        self._last = parsed
        return Reading(gpus=list(parsed.rows.values()))

    def _xid(self, parsed: ExpositionParse, gpu: int) -> int | None:
        counts = parsed.xid_counts.get(gpu)
        if counts is not None:
            seen = {x: n for x, n in counts.items() if n > 0}
            return max(seen, key=lambda x: seen[x]) if seen else 0
        if gpu not in parsed.xid_gauge:
            return None
        now = parsed.xid_gauge[gpu]
        if now is None or now == 0:
            return now
        # The gauge keeps the last XID forever: new only if it changed since the
        # previous scrape (the first scrape cannot tell, and reports it).
        return now if self._last_xid_gauge.get(gpu) != now else 0

    def facts(self) -> dict[str, Any]:
        """GPU models, UUIDs, host name and driver as dcgm-exporter labels them."""
        parsed = self._last if self._last is not None else parse_exposition(self.scrape())
        return {"dcgm_exporter_url": self.url, "gpus": [parsed.gpus[g] for g in sorted(parsed.gpus)]}

    def close(self) -> None:
        if self._owns_client:
            self._client.close()
