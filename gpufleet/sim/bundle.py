"""Write a trace bundle (contracts.md section 1) from a simulated fleet, with its labels.

The bundle is what ``gpufleet replay`` and the detector scoring read:
``gpu.csv``, ``host.csv``, ``runs.csv``, ``allocations.csv``, ``sites.csv``,
``carbon.csv`` with exactly the contract's columns in its order, plus
``labels.json`` (ground truth) and ``progress.csv`` (tokens per run, an
extension).  File names, columns, cell forms and the write-then-rename are
:mod:`gpufleet.collector.bundle_files`, shared with the bundle's reader and
its other writers; the precision of each metric column is the simulator's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np

from gpufleet.catalog import GPU_CSV_COLUMNS, HOST_CSV_COLUMNS, canonical_gpu_name
from gpufleet.collector.bundle_files import (
    ALLOCATIONS_CSV,
    ALLOCATIONS_CSV_COLUMNS,
    CARBON_CSV,
    CARBON_CSV_COLUMNS,
    GPU_CSV,
    HOST_CSV,
    LABELS_JSON,
    NODES_JSON,
    PROGRESS_CSV,
    PROGRESS_CSV_COLUMNS,
    RUNS_CSV,
    RUNS_CSV_COLUMNS,
    SITES_CSV,
    SITES_CSV_COLUMNS,
    BundleWriter,
    cell,
    epoch_s,
    occupied,
    rfc3339_ms,
    text,
)
from gpufleet.sim.carbon import scenario_series
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.labels import Labels
from gpufleet.sim.scenario import Scenario

__all__ = [
    "ALLOCATIONS_CSV_COLUMNS",
    "CARBON_CSV_COLUMNS",
    "GPU_CSV_COLUMNS",
    "HOST_CSV_COLUMNS",
    "PROGRESS_CSV_COLUMNS",
    "RUNS_CSV_COLUMNS",
    "SITES_CSV_COLUMNS",
    "BundleInfo",
    "write_bundle",
]

#: printf formats of the metric columns (after time, node, gpu, uuid).
_GPU_FORMATS = {
    "util_pct": "%d",
    "sm_active": "%.4f",
    "tensor_active": "%.4f",
    "dram_active": "%.4f",
    "mem_used_mib": "%d",
    "mem_total_mib": "%d",
    "power_w": "%.2f",
    "energy_mj": "%d",
    "power_limit_w": "%.1f",
    "sm_clock_mhz": "%d",
    "sm_clock_max_mhz": "%d",
    "mem_clock_mhz": "%d",
    "temp_c": "%d",
    "mem_temp_c": "%d",
    "throttle_reasons": "%d",
    "pcie_tx_bytes_s": "%d",
    "pcie_rx_bytes_s": "%d",
    "pcie_gen": "%d",
    "pcie_gen_max": "%d",
    "pcie_width": "%d",
    "pcie_width_max": "%d",
    "nvlink_tx_bytes_s": "%d",
    "nvlink_rx_bytes_s": "%d",
    "ecc_dbe_vol": "%d",
    "xid": "%d",
    "ecc_sbe_vol": "%d",
    "ecc_sbe_agg": "%d",
    "ecc_dbe_agg": "%d",
    "remapped_rows_correctable": "%d",
    "remapped_rows_uncorrectable": "%d",
    "remapped_rows_pending": "%d",
    "remapped_rows_failed": "%d",
    "pcie_replay_count": "%d",
    "nvlink_crc_errors": "%d",
    "nvlink_replay_errors": "%d",
    "nvlink_recovery_errors": "%d",
    "nvlink_links_up": "%d",
    "nvlink_links_max": "%d",
    # NULL (empty) where no job's cgroup feeds the GPU.
    "job_cpu_cores": "%.3f",
    "job_cpu_quota_cores": "%.3f",
    "job_cpu_throttled_share": "%.4f",
    "job_cpu_pressure_pct": "%.2f",
    "job_io_pressure_pct": "%.2f",
}
_HOST_FORMATS = {
    "cpu_user_pct": "%.2f",
    "cpu_system_pct": "%.2f",
    "cpu_iowait_pct": "%.2f",
    "cpu_idle_pct": "%.2f",
    "cpu_count": "%d",
    "disk_read_bytes_s": "%d",
    "disk_write_bytes_s": "%d",
    "disk_util_pct": "%.2f",
    "disk_await_ms": "%.3f",
    "net_rx_bytes_s": "%d",
    "net_tx_bytes_s": "%d",
    "host_power_w": "%.1f",
}
#: Tokens per training sample, to turn token counts into samples.
SEQ_LEN_TOKENS = 4096
#: Cadence of progress.csv rows, s.
PROGRESS_EVERY_S = 60.0


@dataclass
class BundleInfo:
    path: Path
    start: float
    end: float
    gpu_rows: int
    host_rows: int
    labels: Labels


def write_bundle(
    fleet_or_scenario: Fleet | Scenario | str | Path,
    out_dir: str | Path,
    duration_s: float | None = None,
    *,
    seed: int | None = None,
    start_time: float | datetime | None = None,
    sample_interval_s: float | None = None,
    time_format: Literal["rfc3339", "epoch"] = "rfc3339",
    overwrite: bool = False,
) -> BundleInfo:
    """Simulate and write a complete bundle into ``out_dir``.

    ``fleet_or_scenario``: a :class:`Fleet` (written from its current time
    on), or what :meth:`Fleet.from_scenario` accepts (then ``seed``,
    ``start_time`` and ``sample_interval_s`` apply).  ``duration_s`` defaults to the rest of the
    scenario; samples are at the start, every interval, and at the end.
    """
    if isinstance(fleet_or_scenario, Fleet):
        fleet = fleet_or_scenario
    else:
        fleet = Fleet.from_scenario(
            fleet_or_scenario, seed=seed, start_time=start_time, sample_interval_s=sample_interval_s
        )
    out = Path(out_dir)
    if occupied(out) and not overwrite:
        raise FileExistsError(f"{out}: not empty (pass overwrite=True to replace it)")
    with BundleWriter(out) as bundle:
        info = _write(fleet, bundle, duration_s, time_format)
    info.path = out
    return info


def _cells(formats: list[str], row: list[float]) -> str:
    """One row's metric cells, a reading the board does not offer (NaN) left empty."""
    return ",".join("" if v != v else f % v for f, v in zip(formats, row, strict=True))


def _fmt_time(t: float, time_format: str) -> str:
    return epoch_s(t) if time_format == "epoch" else rfc3339_ms(t)


def _write(fleet: Fleet, bundle: BundleWriter, duration_s: float | None, time_format: str) -> BundleInfo:
    plan = fleet.plan
    start = fleet.t
    metric_cols = [canonical_gpu_name(c) for c in GPU_CSV_COLUMNS[4:]]
    gpu_fmt = ",".join(_GPU_FORMATS[c] for c in metric_cols)
    formats = [_GPU_FORMATS[c] for c in metric_cols]
    host_fmt = ",".join(_HOST_FORMATS[c] for c in HOST_CSV_COLUMNS[2:])
    gpu_keys = [f"{text(g.node)},{g.gpu},{text(g.uuid)}," for g in plan.gpus]
    node_keys = [f"{text(n)}," for n in fleet.nodes]
    host_cols = HOST_CSV_COLUMNS[2:]
    n_gpu = n_host = 0
    runs = plan.runs
    next_progress = start
    with (
        bundle.open_csv(GPU_CSV) as gf,
        bundle.open_csv(HOST_CSV) as hf,
        bundle.open_csv(PROGRESS_CSV) as pf,
    ):
        for t in fleet.ticks(duration_s):
            ts = _fmt_time(t, time_format)
            eng = fleet.engine
            present = np.flatnonzero(eng.gpu_present)
            if present.size:
                arr = np.column_stack([eng.gpu[c][present] for c in metric_cols])
                gaps = np.isnan(arr).any(axis=1).tolist()
                block = arr.tolist()
                gf.write(
                    "".join(
                        f"{ts},{gpu_keys[i]}{_cells(formats, row) if gap else gpu_fmt % tuple(row)}\n"
                        for i, row, gap in zip(present.tolist(), block, gaps, strict=True)
                    )
                )
                n_gpu += present.size
            up = np.flatnonzero(eng.host_present)
            if up.size:
                block = np.column_stack([eng.host[c][up] for c in host_cols]).tolist()
                hf.write(
                    "".join(
                        f"{ts},{node_keys[k]}{host_fmt % tuple(row)}\n"
                        for k, row in zip(up.tolist(), block, strict=True)
                    )
                )
                n_host += up.size
            if t >= next_progress - 1e-9:
                progress = fleet.run_progress()
                for r in runs:
                    if r.start <= t and (r.end is None or t <= r.end + fleet.interval_s):
                        tok = progress[r.run_id]["tokens"]
                        pf.write(f"{text(r.run_id)},{ts},{tok:.0f},{tok / SEQ_LEN_TOKENS:.0f}\n")
                next_progress += PROGRESS_EVERY_S
    end = fleet.t
    _static_files(fleet, bundle, start, end, time_format)
    # Optional extension of the bundle: each node's facts as its agent reports
    # them (GPU models, CPU governor, CPU quota), for node-scoped detectors.
    bundle.write_json(NODES_JSON, {n: fleet.facts(n) for n in fleet.nodes})
    labels = fleet.labels().clip(start, end)
    labels.write(bundle.path(LABELS_JSON))
    return BundleInfo(bundle.out, start, end, n_gpu, n_host, labels)


def _static_files(fleet: Fleet, bundle: BundleWriter, start: float, end: float, time_format: str) -> None:
    """The run, allocation, site and carbon files; their numbers as the scenario gives them (``380.0``)."""
    plan = fleet.plan
    sc = plan.scenario
    runs = [r for r in plan.runs if r.start <= end]
    bundle.write_csv(
        RUNS_CSV,
        (
            [
                cell(r.run_id),
                cell(r.name),
                cell(r.site),
                _fmt_time(r.start, time_format),
                "" if r.end is None or r.end > end else _fmt_time(r.end or end, time_format),
            ]
            for r in runs
        ),
    )
    bundle.write_csv(
        ALLOCATIONS_CSV,
        (
            [cell(r.run_id), cell(plan.gpus[gi].node), cell(plan.gpus[gi].gpu)]
            for r in runs
            for gi in r.gpu_idx.tolist()
        ),
    )
    bundle.write_csv(
        SITES_CSV,
        (
            [
                cell(s.site),
                cell(s.pue),
                cell(s.price_per_kwh),
                cell(s.gpu_hour_price),
                cell(s.currency),
                cell(s.carbon_region),
                cell(s.carbon_g_per_kwh),
            ]
            for s in sc.sites
        ),
    )
    bundle.write_csv(
        CARBON_CSV,
        (
            [cell(region), _fmt_time(t, time_format), cell(v)]
            for region, series in scenario_series(sc, plan.seed, start, end).items()
            for t, v in series
        ),
    )
