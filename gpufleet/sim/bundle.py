"""Write a trace bundle (contracts.md section 1) from a simulated fleet, with its labels.

The bundle is what ``gpufleet replay`` and the detector scoring read:
``gpu.csv``, ``host.csv``, ``runs.csv``, ``allocations.csv``, ``sites.csv``,
``carbon.csv`` with exactly the contract's columns in its order, plus
``labels.json`` (ground truth) and ``progress.csv`` (tokens per run, an
extension).  Files are written to a temporary directory and moved into place
at the end, so a failure leaves nothing partial behind.
"""

from __future__ import annotations

import csv
import json
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

import numpy as np

from gpufleet.catalog import GPU_CSV_COLUMNS, HOST_CSV_COLUMNS, canonical_gpu_name
from gpufleet.sim.carbon import scenario_series
from gpufleet.sim.fleet import Fleet
from gpufleet.sim.labels import Labels, rfc3339
from gpufleet.sim.scenario import Scenario

RUNS_CSV_COLUMNS = ("run_id", "name", "site", "start", "end")
ALLOCATIONS_CSV_COLUMNS = ("run_id", "node", "gpu")
SITES_CSV_COLUMNS = (
    "site",
    "pue",
    "price_per_kwh",
    "gpu_hour_price",
    "currency",
    "carbon_region",
    "carbon_g_per_kwh",
)
CARBON_CSV_COLUMNS = ("region", "time", "g_co2e_per_kwh")
PROGRESS_CSV_COLUMNS = ("run_id", "time", "tokens", "samples")

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
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(f"{out}: not empty (pass overwrite=True to replace it)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".bundle-", dir=out.parent))
    try:
        info = _write(fleet, tmp, duration_s, time_format)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    info.path = out
    return info


def _cells(formats: list[str], row: list[float]) -> str:
    """One row's metric cells, a reading the board does not offer (NaN) left empty."""
    return ",".join("" if v != v else f % v for f, v in zip(formats, row, strict=True))


def _fmt_time(t: float, time_format: str) -> str:
    if time_format == "epoch":
        return f"{t:.3f}".rstrip("0").rstrip(".")
    s = rfc3339(t)
    assert s is not None
    return s


def _write(fleet: Fleet, out: Path, duration_s: float | None, time_format: str) -> BundleInfo:
    plan = fleet.plan
    start = fleet.t
    metric_cols = [canonical_gpu_name(c) for c in GPU_CSV_COLUMNS[4:]]
    gpu_fmt = ",".join(_GPU_FORMATS[c] for c in metric_cols)
    formats = [_GPU_FORMATS[c] for c in metric_cols]
    host_fmt = ",".join(_HOST_FORMATS[c] for c in HOST_CSV_COLUMNS[2:])
    gpu_keys = [f"{g.node},{g.gpu},{g.uuid}," for g in plan.gpus]
    node_keys = [f"{n}," for n in fleet.nodes]
    host_cols = HOST_CSV_COLUMNS[2:]
    n_gpu = n_host = 0
    runs = plan.runs
    next_progress = start
    with (
        (out / "gpu.csv").open("w", newline="") as gf,
        (out / "host.csv").open("w", newline="") as hf,
        (out / "progress.csv").open("w", newline="") as pf,
    ):
        gf.write(",".join(GPU_CSV_COLUMNS) + "\n")
        hf.write(",".join(HOST_CSV_COLUMNS) + "\n")
        pf.write(",".join(PROGRESS_CSV_COLUMNS) + "\n")
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
                        pf.write(f"{r.run_id},{ts},{tok:.0f},{tok / SEQ_LEN_TOKENS:.0f}\n")
                next_progress += PROGRESS_EVERY_S
    end = fleet.t
    _static_files(fleet, out, start, end, time_format)
    # Optional extension of the bundle: each node's facts as its agent reports
    # them (GPU models, CPU governor, CPU quota), for node-scoped detectors.
    (out / "nodes.json").write_text(
        json.dumps({n: fleet.facts(n) for n in fleet.nodes}, indent=1, default=str) + "\n"
    )
    labels = fleet.labels().clip(start, end)
    labels.write(out / "labels.json")
    return BundleInfo(out, start, end, n_gpu, n_host, labels)


def _static_files(fleet: Fleet, out: Path, start: float, end: float, time_format: str) -> None:
    plan = fleet.plan
    sc = plan.scenario
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(RUNS_CSV_COLUMNS)
        for r in plan.runs:
            if r.start > end:
                continue
            open_ = r.end is None or r.end > end
            w.writerow(
                [
                    r.run_id,
                    r.name,
                    r.site,
                    _fmt_time(r.start, time_format),
                    "" if open_ else _fmt_time(r.end or end, time_format),
                ]
            )
    with (out / "allocations.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(ALLOCATIONS_CSV_COLUMNS)
        for r in plan.runs:
            if r.start > end:
                continue
            for gi in r.gpu_idx.tolist():
                w.writerow([r.run_id, plan.gpus[gi].node, plan.gpus[gi].gpu])
    with (out / "sites.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(SITES_CSV_COLUMNS)
        for s in sc.sites:
            w.writerow(
                [
                    s.site,
                    s.pue,
                    s.price_per_kwh,
                    s.gpu_hour_price,
                    s.currency,
                    s.carbon_region or "",
                    s.carbon_g_per_kwh,
                ]
            )
    with (out / "carbon.csv").open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(CARBON_CSV_COLUMNS)
        for region, series in scenario_series(sc, plan.seed, start, end).items():
            for t, v in series:
                w.writerow([region, _fmt_time(t, time_format), v])
