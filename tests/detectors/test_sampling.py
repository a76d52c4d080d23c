"""Any sampling from 100 ms to 30 s, as real exports send it.

An ``nvidia-smi --query-gpu=... -lms N`` loop stamps every GPU of one query
with one time, and its loop runs late by the time each query takes, so the
bursts are neither exactly ``N`` apart nor on a grid.  Traces also stop
early: an agent or an nvidia-smi loop dies while the job goes on, and
sweeps keep running over windows whose data ends before they do.  The same
findings must come out at every interval, and nothing from the silence.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gpufleet.collector.detectors import DetectorConfig
from gpufleet.collector.detectors.registry import run_detectors
from gpufleet.collector.detectors.window import Window
from tests.detectors.builders import T0, GpuSpec, Profile, averaged, noisy, pauses, run_window, square, steady

CFG = DetectorConfig()
RATES = [0.1, 1.0, 5.0, 10.0, 30.0]
#: What an nvidia-smi query of util, power and memory gives.
NVSMI = ("util_pct", "power_w", "mem_used_mib")


def burst_times(duration: float, dt: float, seed: int = 0) -> np.ndarray:
    """One stamp per query burst (shared by every GPU): the loop asks every
    ``dt`` and runs late by the query's own time, 0-40 % of ``dt``."""
    rng = np.random.default_rng(seed)
    steps = dt * rng.uniform(1.0, 1.4, int(duration / dt) + 2)
    t = T0 + 0.37 + np.concatenate([[0.0], np.cumsum(steps)])
    return t[t < T0 + duration]


def nvsmi_only(w: Window) -> Window:
    for s in w.gpus.values():
        s.cols = {k: v for k, v in s.cols.items() if k in NVSMI}
    return w


def found(w: Window) -> list[tuple]:
    return sorted((f.kind, f.cause, f.node, f.gpu) for f in run_detectors(w, CFG).findings)


def smoothed(p: Profile, dt: float) -> Profile:
    """Power and GPU-Util are averages over (up to) the sample interval:
    coarse samples blur the step-level waits of a synchronous job."""
    return averaged(p, min(dt, 2.0))


# --- the blocked-rank checkpoint signature ----------------------------------------

PERIOD_S = 600.0
PAUSE_S = 120.0


def blocked_rank(writer: int, n: int = 8) -> list[GpuSpec]:
    """A synchronous job writing a checkpoint from one rank every 10 min:
    the writer runs no kernel at idle power for 2 min, its peers spin in the
    collective at 100 % GPU-Util and idle-level power."""
    prof = pauses(PERIOD_S, PAUSE_S, start=T0 + 50)
    spin = {"util_pct": lambda t: np.where(prof(t) < 0.1, 100.0, 97.0)}
    return [GpuSpec(prof, dcgm=False, idle_w=150.0, extra={} if i == writer else spin) for i in range(n)]


@pytest.mark.parametrize("dt", RATES)
def test_blocked_rank_checkpoint_is_found_at_every_interval(dt: float) -> None:
    w = nvsmi_only(run_window(blocked_rank(writer=5), t=burst_times(2400, dt), no_host=True))
    (f,) = run_detectors(w, CFG).findings
    assert (f.kind, f.run_id) == ("checkpoint_stall", "r1")
    ev = f.evidence
    assert ev["basis"] == "gpu_only"
    assert ev["writer_gpu"] == "n0/5"
    assert ev["period_s"] == pytest.approx(PERIOD_S, abs=1.5 * dt + 1)
    assert ev["pause_s"] == pytest.approx(PAUSE_S, abs=1.5 * dt + 1)
    assert ev["run_time_lost_share"] == pytest.approx(PAUSE_S / PERIOD_S, abs=0.03)


@pytest.mark.parametrize("dt", RATES)
def test_blocked_rank_with_host_data_and_a_write_burst(dt: float) -> None:
    prof = pauses(PERIOD_S, PAUSE_S, start=T0 + 50)
    writes = lambda t: np.where(prof(t) < 0.1, 2e9, 1e6)  # noqa: E731
    w = run_window(
        blocked_rank(writer=0),
        t=burst_times(2400, dt),
        host={"disk_write_bytes_s": writes},
        host_dt=max(dt, 1.0),
    )
    (f,) = run_detectors(w, CFG).findings
    assert f.kind == "checkpoint_stall"
    assert f.evidence["basis"] == "gpu+host"
    assert f.evidence["writer_gpu"] == "n0/0"


# --- stragglers -------------------------------------------------------------------

STEP_S = 2.0


def straggler_run(dt: float, slow: int, n: int = 8) -> list[GpuSpec]:
    """2 s steps: the peers compute 60 % of each step, then spin at the
    barrier (GPU-Util 100 %, power near idle) while GPU ``slow``, its clock
    held down, computes the whole step."""
    peer = square(STEP_S, 0.6, hi=0.9, lo=0.12)
    specs = [GpuSpec(smoothed(noisy(peer, sd=0.02, seed=i), dt), dcgm=False) for i in range(n)]
    specs[slow] = GpuSpec(noisy(steady(0.9), sd=0.02, seed=99), dcgm=False, clock_busy=0.75)
    for s in specs:
        s.extra = {"util_pct": lambda t: np.full(t.shape, 100.0)}
    return specs


@pytest.mark.parametrize("dt", RATES)
def test_straggler_from_util_and_power_alone_at_every_interval(dt: float) -> None:
    w = nvsmi_only(run_window(straggler_run(dt, slow=3), t=burst_times(1200, dt), no_host=True))
    assert found(w) == [("straggler", "unknown", "n0", 3)]


@pytest.mark.parametrize("dt", RATES)
def test_straggler_and_its_clocks_at_every_interval(dt: float) -> None:
    w = run_window(straggler_run(dt, slow=6), t=burst_times(1200, dt))
    assert found(w) == [("straggler", "clocks", "n0", 6)]


# --- traces that stop early ---------------------------------------------------------


def _cut(w: Window, keys: list, at: float) -> Window:
    w = copy.deepcopy(w)
    for k in keys:
        s = w.gpus[k]
        keep = s.t < at
        s.t = s.t[keep]
        s.cols = {c: v[keep] for c, v in s.cols.items()}
    return w


def _healthy(dt: float) -> Window:
    prof = noisy(square(STEP_S, 0.9, hi=0.9, lo=0.6), sd=0.03)
    return nvsmi_only(
        run_window(
            [GpuSpec(smoothed(prof, dt), dcgm=False) for _ in range(16)],
            t=burst_times(1800, dt),
            no_host=True,
        )
    )


@pytest.mark.parametrize("dt", RATES)
@pytest.mark.parametrize("who", ["every gpu", "one node", "one gpu"])
def test_a_trace_that_stops_mid_run_raises_nothing(dt: float, who: str) -> None:
    """The run stays open; sweeps go on a minute, five and fifteen after the
    data of some or all of its GPUs stopped."""
    full = _healthy(dt)
    keys = {
        "every gpu": list(full.gpus),
        "one node": [k for k in full.gpus if k[0] == "n1"],
        "one gpu": [("n0", 3)],
    }[who]
    stop = T0 + 900.0
    cut = _cut(full, keys, stop)
    for after in (60.0, 300.0, 900.0):
        w = _cut(cut, list(cut.gpus), stop + after)
        w.t_end = stop + after
        assert found(w) == [], (who, after)


@pytest.mark.parametrize("dt", RATES)
def test_a_checkpointing_trace_that_stops_raises_nothing_new(dt: float) -> None:
    """A trace that stops inside a checkpoint pause is not a job-wide input
    wait, nor a straggler: at most the checkpoint stall it already showed."""
    w = nvsmi_only(run_window(blocked_rank(writer=1), t=burst_times(2400, dt), no_host=True))
    stop = T0 + 50 + 3 * PERIOD_S - PAUSE_S / 2  # half-way through the third pause
    cut = _cut(w, list(w.gpus), stop)
    for after in (60.0, 300.0, 900.0):
        ww = copy.deepcopy(cut)
        ww.t_end = stop + after
        assert {k[0] for k in found(ww)} <= {"checkpoint_stall"}, after
