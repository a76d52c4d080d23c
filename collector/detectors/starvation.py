"""Input starvation: a run's GPUs wait for their input instead of computing.

Run-scoped.  Two patterns, each judged per GPU over the run's span in the
window after warm-up (see :attr:`Frame.region`), then across the run:

* **oscillating** — busy and idle phases alternate (zero crossings of the
  activity signal with hysteresis): at least ``starve_min_cycles`` complete
  idle phases in a row, spaced regularly (MAD / median of the spacing at most
  ``starve_max_period_cv``) with a period up to ``starve_max_period_s``, a busy
  share (duty cycle) between ``starve_min_duty`` and ``starve_max_duty``, and a
  depth (busy-phase minus idle-phase activity) of ``starve_min_depth``.
  Reported whatever the hosts show (cause ``unknown`` without host data or an
  idle host), unless the idle phases coincide with write bursts: that is a
  checkpoint stall, left to its own detector.
* **steady low** — mean activity at most ``starve_low_activity`` over the
  last ``starve_min_duration_s`` and since the episode began (dated from when
  activity went below that level for ``starve_low_share`` of the time).  Reported only when a host of the run is saturated
  (cause ``cpu`` or ``io``): a steady low-activity job on idle hosts is a small
  job, not a starving one; nor when another run's GPUs on that host are
  working or swinging (node-wide counters cannot tell whose load saturates a
  shared host: the neighbour may be the cause).

The cause comes first from the job's own cgroup on its hosts (the GPU rows'
``job_*`` columns, :func:`~gpufleet.collector.detectors.hosts.job_pressure`):
``cpu`` when the job's CPU sits at its quota, is throttled or waits for CPU,
``io`` when it waits for I/O -- a loader starving eight GPUs on a 192-core host
saturates its own quota, never 80 % of the host.  Where the job's cgroup is
not reported or shows no shortage, the host-wide figures decide
(``evidence.cause_basis`` says which: ``job_cgroup`` or ``host``).  A cause
read from the job's own cgroup is the job's, so the neighbour rule above does
not apply to it.

A run whose pauses the checkpoint detector explains (a write burst, or one
rank blocking while its peers spin) is left to it: one pattern, one
diagnosis.  Either needs ``starve_min_gpu_share`` of the run's GPUs, and no GPU of the run
busy ``starve_busy_gpu_share`` of the time at a normal activity level (one
GPU working while the others wait is a straggler).  Warm-up, short evaluation pauses (duty cycle above the
maximum, too few cycles) and slow periodic pauses (checkpoints) are excluded.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gpufleet.collector.detectors import checkpoint_stall
from gpufleet.collector.detectors.activity import Phases
from gpufleet.collector.detectors.flat import segment_sums
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.hosts import (
    HostPressure,
    JobPressure,
    host_pressure,
    job_pressure,
    write_burst,
)
from gpufleet.collector.detectors.stats import group_median, num
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import HostEvidence, StarvationEvidence

KIND = "starvation"


@dataclass
class Oscillation:
    onset: float
    last_onset: float
    period_s: float
    duty: float
    depth: float
    lost: float
    cycles: int
    idle: list[tuple[float, float]]


def oscillations(fr: Frame, rows: np.ndarray) -> list[Oscillation | None]:
    """The regular busy/idle alternation at the end of each of ``rows``' regions, if any.

    Busy and idle are relative to each GPU's own range (5th to 95th percentile
    of activity): coarse samples average a short idle phase with busy time,
    so an idle sample at 10 s may read 0.2, not 0.  The samples of every row
    are worked on at once, and then the phases of the rows with enough
    complete idle phases (:func:`_alternations`).
    """
    cfg = fr.config
    out: list[Oscillation | None] = [None] * rows.size
    p5, p95 = _activity_range(fr, rows)
    deep = np.flatnonzero(p95 - p5 >= cfg.starve_min_depth)
    if deep.size == 0:
        return out
    span = p95[deep] - p5[deep]
    ph = fr.rows_phases(
        rows[deep], p5[deep] + cfg.starve_phase_lo * span, p5[deep] + cfg.starve_phase_hi * span
    )
    closed = (ph.state == 0) & ~ph.open_start & ~ph.open_end
    owner = np.repeat(np.arange(deep.size), np.diff(ph.offsets))
    enough = np.bincount(owner[closed], minlength=deep.size) >= cfg.starve_min_cycles
    sel = np.flatnonzero(enough)
    for j, osc in zip(sel.tolist(), _alternations(fr, ph, closed & enough[owner], owner, sel), strict=True):
        out[int(deep[j])] = osc
    return out


def _alternations(
    fr: Frame, ph: Phases, closed: np.ndarray, owner: np.ndarray, sel: np.ndarray
) -> list[Oscillation | None]:
    """The alternation of each row ``sel`` of ``ph`` (its owner index), from its complete idle
    phases (``closed``: those of the rows ``sel``, at least ``starve_min_cycles`` each), every
    row at once.

    A row's idle phases start ``d`` seconds apart.  Its last ``starve_min_cycles - 1`` starts
    must follow one another (one busy phase between), and their median gap is the period.  The
    chain of cycles reaches back while the starts follow one another at half to twice that
    period; over the chain, the median gap is the period and the median deviation from it, over
    the period, its irregularity.  Busy and idle time count from the chain's first idle phase."""
    cfg = fr.config
    nr = sel.size
    if nr == 0:
        return []
    k = np.flatnonzero(closed)  # the rows' complete idle phases, row by row
    rk = np.searchsorted(sel, owner[k])
    cnt = np.bincount(rk, minlength=nr)
    first = np.cumsum(cnt) - cnt
    pos = np.arange(k.size) - first[rk]
    n_gaps = cnt - 1
    on = ph.t0[k]
    # The gap ending at each idle phase (none at a row's first), and its index among the row's gaps.
    has_gap = pos >= 1
    gap = np.full(k.size, np.nan)
    gap[1:] = on[1:] - on[:-1]
    gap[~has_gap] = np.nan
    gi = pos - 1
    follows = np.zeros(k.size, dtype=bool)
    follows[1:] = k[1:] - k[:-1] == 2
    follows &= has_gap
    m = cfg.starve_min_cycles - 1
    # (With a single cycle asked for, "the last m gaps" are all of them, as a slice [-0:] reads.)
    recent_from = np.where(m == 0, 0, n_gaps - m)
    recent = has_gap & (gi >= recent_from[rk])
    regular = np.bincount(rk[recent & ~follows], minlength=nr) == 0
    p0 = group_median(gap[recent], rk[recent], nr)
    with np.errstate(invalid="ignore"):
        steady = follows & (p0[rk] / cfg.starve_chain_ratio <= gap) & (gap <= cfg.starve_chain_ratio * p0[rk])
    breaks = has_gap & (gi < recent_from[rk]) & ~steady
    j = np.full(nr, -1, dtype=np.int64)
    np.maximum.at(j, rk[breaks], gi[breaks])
    j += 1  # the chain's first gap (and its first idle phase)
    chain = has_gap & (gi >= j[rk])
    period = group_median(gap[chain], rk[chain], nr)
    with np.errstate(invalid="ignore", divide="ignore"):
        cv = group_median(np.abs(gap - period[rk])[chain], rk[chain], nr) / period
    onset = on[first + j]
    last_onset = on[first + n_gaps]
    with np.errstate(invalid="ignore"):
        ok = regular & (p0 > 0) & ~(period > cfg.starve_max_period_s) & ~(cv > cfg.starve_max_period_cv)
        ok &= ~(
            fr.window.t_end - last_onset > np.maximum(cfg.starve_recent_periods * period, cfg.active_within_s)
        )
    # Busy and idle time of every phase from the chain's first idle phase on.
    pa, pb = ph.offsets[sel], ph.offsets[sel + 1]
    pidx = fr.take(pa, pb)
    prow = np.repeat(np.arange(nr), pb - pa)
    after = ph.t1[pidx] > onset[prow]
    dur = ph.dur[pidx] * after
    busy = ph.state[pidx] == 1
    act = ph.act[pidx]
    busy_s = np.bincount(prow, weights=dur * busy, minlength=nr)
    idle_s = np.bincount(prow, weights=dur * ~busy, minlength=nr)
    total = busy_s + idle_s
    with np.errstate(invalid="ignore", divide="ignore"):
        busy_act = np.where(
            busy_s > 0, np.bincount(prow, weights=dur * busy * act, minlength=nr) / busy_s, 0.0
        )
        idle_act = np.where(
            idle_s > 0, np.bincount(prow, weights=dur * ~busy * act, minlength=nr) / idle_s, 0.0
        )
        duty = busy_s / total
        depth = busy_act - idle_act
        mean_act = (busy_act * busy_s + idle_act * idle_s) / total
        lost = np.clip(1.0 - mean_act / np.maximum(busy_act, cfg.nominal_activity), 0.0, 1.0)
        ok &= (total > 0) & (cfg.starve_min_duty <= duty) & (duty <= cfg.starve_max_duty)
        ok &= ~(depth < cfg.starve_min_depth) & ~(lost < cfg.starve_min_lost_share)
    idle_at = np.flatnonzero(~busy & after)
    idle_row = prow[idle_at]
    t0s, t1s = ph.t0[pidx[idle_at]].tolist(), ph.t1[pidx[idle_at]].tolist()
    cut = np.searchsorted(idle_row, np.arange(nr + 1)).tolist()
    out: list[Oscillation | None] = [None] * nr
    for r in np.flatnonzero(ok).tolist():
        a, b = cut[r], cut[r + 1]
        out[r] = Oscillation(
            float(onset[r]),
            float(last_onset[r]),
            float(period[r]),
            float(duty[r]),
            float(depth[r]),
            float(lost[r]),
            int(n_gaps[r] - j[r]) + 1,
            list(zip(t0s[a:b], t1s[a:b], strict=True)),
        )
    return out


def _activity_range(fr: Frame, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the 5th and 95th percentile of its readable activity in its region (NaN for a
    row with fewer than ``2 * starve_min_cycles`` readable samples).  Rows of one length with
    every sample readable (most of a fleet) are partitioned together, as one 2-D array."""
    least = 2 * fr.config.starve_min_cycles
    a0, b0 = fr.region_index
    a, b = a0[rows], b0[rows]
    n = np.maximum(b - a, 0)
    p5 = np.full(rows.size, np.nan)
    p95 = np.full(rows.size, np.nan)
    whole = (
        np.ones(rows.size, dtype=bool)
        if fr.all_valid
        else np.array(
            [bool(fr.valid[x:y].all()) for x, y in zip(a.tolist(), b.tolist(), strict=True)], dtype=bool
        )
    )
    for length in np.unique(n[whole]).tolist():
        if length >= least:
            sel = np.flatnonzero(whole & (n == length))
            part = np.partition(fr.activity[a[sel, None] + np.arange(length)], _ranks(length), axis=1)
            p5[sel], p95[sel] = part[:, _ranks(length)].T
    for i in np.flatnonzero(~whole).tolist():
        act = fr.activity[int(a[i]) : int(b[i])]
        act = act[~np.isnan(act)]
        if act.size >= least:
            p5[i], p95[i] = np.partition(act, _ranks(act.size))[list(_ranks(act.size))]
    return p5, p95


def _ranks(m: int) -> tuple[int, int]:
    """Ranks of the 5th and 95th percentile among ``m`` sorted values."""
    return int(0.05 * (m - 1)), int(np.ceil(0.95 * (m - 1)))


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not window.runs:
        return []
    cfg = config
    # Screen every GPU at once; only runs with a candidate are examined further.
    wreg = fr.region_weights()
    act = fr.activity if fr.all_valid else np.nan_to_num(fr.activity)
    reg_s = fr.row_sum(wreg)
    wa = wreg * act
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = fr.row_sum(wa) / reg_s
        var = fr.row_sum(wa * act) / reg_s - mean * mean
    # A square wave between idle and busy of depth d has a standard deviation
    # near d/2 for any duty cycle worth reporting.
    swinging = var >= (cfg.starve_phase_lo * cfg.starve_min_depth) ** 2
    # Steady low: mean activity over the last starve_min_duration_s of the
    # region below the low level (a mean, so that coarse samples averaging
    # short busy bursts with idle time still count) ...
    lo, hi = fr.region
    a = fr.index_at(hi - cfg.starve_min_duration_s, "left")
    b = fr.region_index[1]
    full = (hi - lo >= cfg.starve_min_duration_s) & (b > a)
    recent = fr.take(np.where(full, a, b), b)
    cnt = np.where(full, b - a, 0)
    seg = np.cumsum(cnt) - cnt
    rs = np.zeros(fr.rows)
    rw = np.zeros(fr.rows)
    if recent.size:
        w_recent = wreg[recent]
        rs[cnt > 0] = segment_sums(w_recent * act[recent], seg[cnt > 0])
        rw[cnt > 0] = segment_sums(w_recent, seg[cnt > 0])
    with np.errstate(invalid="ignore", divide="ignore"):
        low = (
            full
            & (rw >= cfg.majority_share * cfg.starve_min_duration_s)
            & (rs / rw <= cfg.starve_low_activity)
        )
    # ... dated from when activity went low for most of the time.
    below = fr.activity < cfg.starve_low_activity
    below &= fr.per_sample(low)
    ep = fr.trailing_episode(wreg, below, cfg.starve_low_share)
    cand = (swinging | low) & (fr.run_of_row >= 0)
    if not cand.any():
        return []
    with np.errstate(invalid="ignore", divide="ignore"):
        busy_share = fr.row_sum(wreg * fr.busy) / reg_s
    # Long job-wide pauses that a checkpoint explains are claimed there.
    claimed = {ri for ri, f in checkpoint_stall.run_findings(fr).items() if f is not None}
    out = []
    for ri in sorted(set(fr.run_of_row[cand].tolist()) - claimed):
        rows = fr.run_rows[ri]
        rows = rows[reg_s[rows] > 0]
        # A GPU that keeps working at a normal level holds the others back.
        holding = (busy_share[rows] >= cfg.starve_busy_gpu_share) & ~low[rows]
        if rows.size == 0 or holding.any():
            continue
        f = _judge_run(fr, ri, rows, low, ep.onset, ep.last)
        if f is not None and not (
            f.evidence.get("pattern") == "steady_low"
            and f.evidence.get("cause_basis") != "job_cgroup"
            and _neighbour_at_work(fr, ri, f.evidence.get("host"), swinging)
        ):
            out.append(f)
    return out


def _neighbour_at_work(fr: Frame, ri: int, host: object, swinging: np.ndarray) -> bool:
    """Whether another run's GPU on ``host`` is working or swinging in this window.

    Node-wide CPU and I/O counters cannot say whose loader saturates a
    shared host: a lightly loaded serving job beside an I/O-bound trainer
    sees the trainer's iowait.  A steady low-activity run is blamed on the
    host only when no neighbour there could be the source.  Decided from the
    window's data alone, never from what else one sweep happened to report,
    so that every sweep over the same data, live or replayed, decides alike.
    """
    rows = fr.rows_by_node.get(str(host), np.zeros(0, dtype=np.int64))
    rows = rows[(fr.run_of_row[rows] >= 0) & (fr.run_of_row[rows] != ri)]
    if rows.size == 0:
        return False
    low = fr.config.starve_low_activity
    for r in rows.tolist():
        sl = fr.row_slice(r)
        w, act = fr.w[sl], np.nan_to_num(fr.activity[sl])
        tot = float(w.sum())
        if swinging[r] or (tot > 0 and float(w @ act) / tot >= low):
            return True
    return False


def _judge_run(
    fr: Frame, ri: int, rows: np.ndarray, low: np.ndarray, low_onset: np.ndarray, low_last: np.ndarray
) -> Finding | None:
    cfg = fr.config
    window = fr.window
    run = window.runs[ri]
    need = cfg.starve_min_gpu_share * rows.size
    nodes = sorted({fr.keys[r][0] for r in rows})
    sources = sorted({fr.activity_source[r] for r in rows})
    oscs = [o for o in oscillations(fr, rows) if o is not None]
    if oscs and len(oscs) >= need:
        onset = float(np.median([o.onset for o in oscs]))
        pressure = host_pressure(window, nodes, onset, window.t_end, cfg)
        job = job_pressure(fr, rows.tolist(), onset, window.t_end, cfg)
        cause, basis = _cause(job, pressure)
        idle = _merge(sorted(iv for o in oscs for iv in o.idle))
        wb = write_burst(window, nodes, idle, onset, window.t_end)
        if wb is not None and wb.is_burst(cfg):
            return None
        # The same rank blocking in the idle phases while its peers spin: they wait on a writer
        # (a checkpoint every few steps), not on their input.
        blk = checkpoint_stall.blocking(fr, rows, idle)
        if blk.writer is not None and blk.same_share >= cfg.ckpt_min_same_writer:
            return None
        lost = float(np.mean([o.lost for o in oscs]))
        evidence: StarvationEvidence = {
            "pattern": "oscillating",
            "period_s": num(np.median([o.period_s for o in oscs])),
            "duty_cycle": num(np.median([o.duty for o in oscs])),
            "depth": num(np.median([o.depth for o in oscs])),
            "cycles": int(np.median([o.cycles for o in oscs])),
            **_host_evidence(pressure),
            **job.evidence(),
            "cause_basis": basis,
            "job_cause_basis": job.basis,
            "gpu_time_lost_share": num(lost),
            "gpus_affected": len(oscs),
            "gpu_count": int(rows.size),
            "activity_source": ",".join(sources),
            "activity_basis": fr.activity_basis(rows),
        }
        last = max(o.last_onset for o in oscs)
        return _finding(run.run_id, cause, lost, onset, last, evidence, cfg)
    lows = rows[low[rows]]
    if lows.size == 0 or lows.size < need:
        return None
    onsets = low_onset[lows]
    fallback = fr.window.t_end - cfg.starve_min_duration_s
    onset = float(np.median(np.where(np.isnan(onsets), fallback, np.minimum(onsets, fallback))))
    pressure = host_pressure(window, nodes, onset, window.t_end, cfg)
    job = job_pressure(fr, lows.tolist(), onset, window.t_end, cfg)
    cause, basis = _cause(job, pressure)
    if cause not in ("cpu", "io"):
        return None
    # GPUs held low while the hosts write in a burst are a checkpoint being written (its pause may
    # still be under way, so the checkpoint detector has not claimed it yet), not a starving loader.
    wb = write_burst(window, nodes, [(onset, window.t_end)], window.t_start, window.t_end)
    if wb is not None and wb.is_burst(cfg):
        return None
    # Ranks that spin while one or a few run nothing wait on those ranks (a writer, a dead rank),
    # not on their input.
    blk = checkpoint_stall.blocking(fr, rows, [(onset, window.t_end)])
    if blk.writer is not None and blk.spinning >= 1:
        return None
    # Ranks idle together while each copies its memory out to the host: a sharded checkpoint.
    pauses = checkpoint_stall.job_wide_pauses(fr, rows, max(1, math.ceil(cfg.ckpt_min_gpu_share * rows.size)))
    recent = [(a, b) for a, b in pauses if b > onset]
    if recent and (checkpoint_stall.copy_out(fr, rows, recent) or 0.0) > 0:
        return None
    since = [(fr.row_slice(int(r)), fr.row_times(int(r)) >= onset) for r in lows]
    acts = np.concatenate([fr.activity[s][m] for s, m in since])
    wts = np.concatenate([fr.w[s][m] for s, m in since])
    fin = np.isfinite(acts) & (wts > 0)
    mean_act = float(np.average(acts[fin], weights=wts[fin])) if fin.any() else math.nan
    lost = (
        float(np.clip(1.0 - mean_act / cfg.nominal_activity, 0.0, 1.0))
        if math.isfinite(mean_act)
        else math.nan
    )
    evidence = {
        "pattern": "steady_low",
        "period_s": None,
        "duty_cycle": None,
        "depth": None,
        "mean_activity": num(mean_act),
        **_host_evidence(pressure),
        **job.evidence(),
        "cause_basis": basis,
        "job_cause_basis": job.basis,
        "gpu_time_lost_share": num(lost),
        "gpus_affected": int(lows.size),
        "gpu_count": int(rows.size),
        "activity_source": ",".join(sources),
        "activity_basis": fr.activity_basis(rows),
    }
    last = low_last[lows]
    return _finding(
        run.run_id,
        cause,
        lost,
        onset,
        float(np.nanmax(last)) if np.isfinite(last).any() else fr.window.t_end,
        evidence,
        cfg,
    )


def _cause(job: JobPressure, host: HostPressure) -> tuple[str, str | None]:
    """The job's own cgroup first, the host-wide figures as the fallback; and which one decided."""
    if job.cause in ("cpu", "io"):
        return job.cause, "job_cgroup"
    if host.cause in ("cpu", "io"):
        return host.cause, "host"
    return "unknown", None


def _finding(
    run_id: str,
    cause: str,
    lost: float,
    start: float,
    last: float,
    evidence: StarvationEvidence,
    cfg: DetectorConfig,
) -> Finding:
    severity = "critical" if lost >= cfg.starve_critical_lost_share else "warning"
    return Finding(KIND, cause, severity, start, evidence, run_id=run_id, last_active=last)


def _host_evidence(p: HostPressure) -> HostEvidence:
    return {
        "cpu_user_pct": num(p.cpu_user_pct),
        "iowait_pct": num(p.iowait_pct),
        "disk_util_pct": num(p.disk_util_pct),
        "disk_await_ms": num(p.disk_await_ms),
        "host": p.node,
    }


def _merge(iv: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in iv:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
