"""Merge the readings of several sources into one row per GPU (and MIG instance) and one host row.

Sources are merged in the configured order: the first source to report a
field for a GPU wins, later sources only fill fields earlier ones left
``None`` or did not report.  So ``["nvml", "dcgm"]`` keeps NVML's readings and
adds DCGM's profiling ratios (``sm_active``, ``tensor_active``...) that NVML
cannot measure.  Rows are keyed by ``(gpu, mig_instance)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpufleet.agent.sources.base import GpuRow, HostRow, Reading

GpuKey = tuple[int, int | None]


def _fill(into: dict[str, Any], row: dict[str, Any]) -> None:
    for k, v in row.items():
        if v is not None and into.get(k) is None:
            into[k] = v


def valid_key(row: GpuRow) -> bool:
    """True when the row has an integer ``gpu`` and an integer-or-None ``mig_instance``."""
    gpu, mig = row.get("gpu"), row.get("mig_instance")
    return (
        isinstance(gpu, int)
        and not isinstance(gpu, bool)
        and (mig is None or (isinstance(mig, int) and not isinstance(mig, bool)))
    )


def merge_readings(readings: Iterable[Reading]) -> tuple[list[GpuRow], HostRow | None]:
    """GPU rows sorted by (gpu, mig_instance; the whole GPU first) and the merged host row.

    Rows failing :func:`valid_key` are left out (the runtime checks and reports them first).
    """
    rows: dict[GpuKey, GpuRow] = {}
    host: HostRow | None = None
    for reading in readings:
        for row in reading.gpus:
            if not valid_key(row):
                continue
            gpu = row["gpu"]
            key = (gpu, row.get("mig_instance"))
            have = rows.get(key)
            if have is None:
                rows[key] = dict(row)
            else:
                _fill(have, row)
        if reading.host is not None:
            if host is None:
                host = dict(reading.host)
            else:
                _fill(host, reading.host)
    ordered = [rows[k] for k in sorted(rows, key=lambda k: (k[0], -1 if k[1] is None else k[1]))]
    return ordered, host
