"""Stragglers: the GPU of a synchronous run that holds the others back.

GPU-scoped, within runs of two GPUs or more.  Over the last
``straggler_eval_s`` of each run's span (after warm-up) every GPU gets a few
features, compared with its peers in the same run by robust z-scores: the
peers' median (leaving the GPU itself out, so a two-GPU run compares each GPU
with the other) and ``1.4826 * MAD`` of the run, floored so identical peers
do not make a tiny difference infinite.

A GPU is a straggler when it was busy at least ``straggler_min_busy_s``,
its peers show waiting — its activity or its power as a fraction of its
limit (or of the reference of :attr:`Frame.power_reference`) exceeds theirs by ``straggler_wait_gap`` (peers idle at a barrier:
activity and power down, GPU-Util kept up by collective kernels) — and it
has a reason to be slow, tried in this order:

* ``pcie_degraded``: link below its maximum for half its busy time, peers not;
* ``thermal``: thermal reason bits for ``straggler_thermal_share`` of busy time
  (peers hardly ever), or hotter than peers (z >= ``straggler_z``, at least
  ``straggler_hot_temp_c``) with a lower clock;
* ``power_cap``: enforced power limit an outlier below the peers (z <=
  -``straggler_z`` and ``straggler_min_rel`` lower); where no limit is
  exported, busy power at a plateau that low below the peers'; or power-cap
  reason bits the peers do not share, with a lower clock;
* ``clocks``: SM clock while busy an outlier below the peers;
* ``network``: none of these on the GPU, but its node's fabric shows link
  errors, a port down, lost packets or a saturated link that its peers'
  nodes do not (:mod:`.fabric`);
* ``unknown``: none of these, but busier than the peers by
  ``straggler_unknown_gap`` with z >= ``straggler_z``, or (no limit
  exported) at a busy power plateau that far above the peers'.

Without clocks, reasons or limits (an nvidia-smi loop of util, power and
memory), the power plateau alone tells: at the same GPU-Util as its peers,
a plateau ``straggler_plateau_min_rel`` below theirs is ``power_cap`` (the
same work under a lower cap), one as far above is ``unknown`` (it computes
while they wait); coarse samples average the peers' waits away, so these
need no visible waiting.  A plateau is a steady level: it must stand out in
each half of the span too (the GPUs of a thermally failing node throttle
one after another, and for a while one of them sits below the others).

Where the waits are shorter than a sample, the straggler's mean power is
only a little above its peers', within reach of the silicon spread.  The
timing tells then: the peers all wait on it, for as long as each step takes,
so their power moves together (median correlation of each peer's power with
the others' mean at least ``straggler_peer_corr``), while its own does not
move with theirs (at most ``straggler_max_corr``, and ``straggler_corr_gap``
below theirs).  With mean power ``straggler_decoupled_z`` above the peers'
that is an ``unknown`` straggler.  In a healthy run who waits changes from
step to step, so the peers share no rhythm; and a rank that swings with
the whole run at a higher power (extra work of its own) is not out of it.

The same power cap on every GPU of a run makes no GPU an outlier: no straggler.
A straggler whose slowness was last seen more than ``active_within_s`` ago
has recovered and is no longer reported.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

from gpufleet.catalog import THROTTLE_HW_THERMAL, THROTTLE_SW_POWER_CAP, THROTTLE_SW_THERMAL
from gpufleet.collector.detectors.fabric import straggler_network_cause
from gpufleet.collector.detectors.flat import segment_sums
from gpufleet.collector.detectors.frame import Frame
from gpufleet.collector.detectors.held import kernel_resident
from gpufleet.collector.detectors.stats import group_loo_median, num, robust_z, trailing_onset
from gpufleet.collector.detectors.window import Finding, Window
from gpufleet.detectconfig import DetectorConfig
from gpufleet.evidence import StragglerEvidence

KIND = "straggler"
THERMAL_BITS = THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL


def detect(window: Window, config: DetectorConfig, frame: Frame | None = None) -> list[Finding]:
    fr = frame if frame is not None else Frame(window, config)
    if fr.rows == 0 or not window.runs:
        return []
    cfg = config
    ror = fr.run_of_row
    per_run = np.bincount(ror[ror >= 0], minlength=len(window.runs))
    multi = (ror >= 0) & (per_run[np.maximum(ror, 0)] >= 2)
    if not multi.any():
        return []
    lo, hi = fr.region
    a = fr.index_at(np.fmax(lo, hi - cfg.straggler_eval_s), "left")
    # A region that warm-up leaves empty (lo past hi) is an empty span, not a negative one.
    b = np.maximum(np.where(multi, fr.index_at(hi, "right"), a), a)
    idx = fr.take(a, b)
    if idx.size == 0:
        return []
    # Per-row sums over the span: reduceat over each row's range of ``idx``.
    cnt = (b - a)[multi]
    rows = np.flatnonzero(multi)
    n = rows.size
    seg = np.cumsum(cnt) - cnt
    nonempty = cnt > 0

    def sums(x: np.ndarray) -> np.ndarray:
        out = np.zeros(n)
        out[nonempty] = segment_sums(x, seg[nonempty])
        return out

    w = fr.w[idx]
    wb = fr.w_busy[idx]
    dens = {id(w): sums(w), id(wb): sums(wb)}

    def mean(x: np.ndarray, wt: np.ndarray) -> np.ndarray:
        """Weighted mean per row of the finite values of ``x``."""
        den = dens[id(wt)]
        s = sums(x * wt)
        if not np.isfinite(s).all():
            ok = np.isfinite(x)
            wx = wt * ok
            den = sums(wx)
            s = sums(np.where(ok, x, 0.0) * wx)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(den > 0, s / np.where(den > 0, den, 1.0), np.nan)

    bits = np.maximum(fr.throttle_bits[idx], 0)
    resident = kernel_resident(fr)
    lim = fr.at_ranges("power_limit_w", a, b)
    power = fr.at_ranges("power_w", a, b)
    pf = fr.power_frac(idx, power=power, limit=lim)
    lim[~(lim > 0)] = np.nan
    f = {
        "span_s": dens[id(w)],
        "busy_s": dens[id(wb)],
        "act": mean(fr.activity[idx], w),
        "pf": mean(pf, w),
        "util": mean(fr.at_ranges("util_pct", a, b), w),
        "lim": mean(lim, w),
        "clk": mean(fr.at_ranges("sm_clock_mhz", a, b), wb),
        "temp": mean(fr.at_ranges("temp_c", a, b), wb),
        "therm": mean((bits & THERMAL_BITS) != 0, wb),
        "pcap": mean((bits & THROTTLE_SW_POWER_CAP) != 0, wb),
        "pcie": mean(fr.pcie_degraded[idx], wb),
        "pw": mean(power, w),
        # Waiting in a collective: a kernel resident at power well below the GPU's own busy level.
    }
    f["plat"] = _plateaus(fr, idx, power, seg, cnt, f["lim"])
    has = f["span_s"] > 0
    grp = np.where(has, ror[rows], -1)
    # Compact group labels over rows with data; rows without data are nobody's peers.
    ug, gl = np.unique(grp[has], return_inverse=True)
    g = np.full(n, -1, dtype=np.int64)
    g[has] = gl
    ng = ug.size
    sub = np.flatnonzero(has)
    gs = g[sub]

    def z(name: str, rel_floor: float, abs_floor: float) -> tuple[np.ndarray, np.ndarray]:
        zz, ref = robust_z(f[name][sub], gs, ng, rel_floor=rel_floor, abs_floor=abs_floor)
        return zz, ref

    def ref(name: str) -> np.ndarray:
        return group_loo_median(f[name][sub], gs, ng)

    z_lim, r_lim = z("lim", 0.02, 1.0)
    z_clk, r_clk = z("clk", 0.02, 10.0)
    z_temp, r_temp = z("temp", 0.0, 2.0)
    z_act, r_act = z("act", 0.0, 0.05)
    z_plat, r_plat = z("plat", 0.02, 5.0)
    # A plateau is a steady level: it must stand out in each half of the
    # span, not only where the GPUs of a node throttle one after another
    # (judged in the runs where some plateau stands out at all).
    odd = np.isin(gs, np.unique(gs[np.abs(z_plat) >= cfg.straggler_z]))
    only = np.zeros(n, dtype=bool)
    only[sub[odd]] = True
    f["plat_a"] = _plateaus(fr, idx, power, seg, cnt, f["lim"], half=0, only=only)
    f["plat_b"] = _plateaus(fr, idx, power, seg, cnt, f["lim"], half=1, only=only)
    z_plat_a, _ = z("plat_a", 0.02, 5.0)
    z_plat_b, _ = z("plat_b", 0.02, 5.0)
    z_plat_lo = np.fmax(z_plat, np.fmax(z_plat_a, z_plat_b))
    z_plat_hi = np.fmin(z_plat, np.fmin(z_plat_a, z_plat_b))
    z_pw, r_pw = z("pw", 0.01, 2.0)
    r_util = ref("util")
    r_pf, r_therm, r_pcap, r_pcie = ref("pf"), ref("therm"), ref("pcap"), ref("pcie")
    v = {k: a[sub] for k, a in f.items()}
    with np.errstate(invalid="ignore", divide="ignore"):
        rel_lim = v["lim"] / r_lim - 1.0
        rel_clk = v["clk"] / r_clk - 1.0
        rel_plat = v["plat"] / r_plat - 1.0
    act_gap = v["act"] - r_act
    pf_gap = v["pf"] - r_pf
    waiting = (act_gap >= cfg.straggler_wait_gap) | (pf_gap >= cfg.straggler_wait_gap)
    slow_clk = rel_clk <= -cfg.straggler_min_rel
    # A straggler is an outlier: where many of a run's GPUs sit at a lower
    # busy plateau (a node throttled as a whole, mixed silicon, the waits of
    # the faster GPUs behind a slow one), no one of them is the capped GPU.
    low_plat = ~np.isfinite(v["lim"]) & (z_plat_lo <= -cfg.straggler_z) & (rel_plat <= -cfg.straggler_min_rel)
    crowd = np.bincount(gs[low_plat], minlength=ng)
    size = np.bincount(gs, minlength=ng)
    lone = crowd <= np.maximum(1, np.floor(cfg.straggler_plateau_max_share * size + 1e-9))
    low_plat &= lone[gs]
    causes = {
        "pcie_degraded": (v["pcie"] >= cfg.majority_share) & ~(r_pcie >= cfg.majority_share),
        "thermal": ((v["therm"] >= cfg.straggler_thermal_share) & ~(r_therm >= cfg.straggler_peer_bits_share))
        | ((z_temp >= cfg.straggler_z) & (v["temp"] >= cfg.straggler_hot_temp_c) & slow_clk),
        "power_cap": ((z_lim <= -cfg.straggler_z) & (rel_lim <= -cfg.straggler_min_rel))
        | low_plat
        | (
            (v["pcap"] >= cfg.straggler_thermal_share) & ~(r_pcap >= cfg.straggler_peer_bits_share) & slow_clk
        ),
        "clocks": (z_clk <= -cfg.straggler_z) & slow_clk,
        "unknown": (z_act >= cfg.straggler_z) & (act_gap >= cfg.straggler_unknown_gap),
    }
    # No limit exported, the same GPU-Util as its peers but a power plateau
    # well below theirs: the same work at a lower cap (coarse samples average
    # the peers' waits away, so they need not show waiting).
    # A plateau well above theirs: it keeps computing while they wait.
    same_util = ~(np.abs(v["util"] - r_util) > cfg.straggler_same_util_pct) & ~np.isfinite(v["lim"])
    capped_plateau = same_util & low_plat & (rel_plat <= -cfg.straggler_plateau_min_rel)
    busier_plateau = same_util & (z_plat_hi >= cfg.straggler_z) & (rel_plat >= cfg.straggler_plateau_min_rel)
    # Power above the peers' but within the silicon spread's reach: it is
    # the straggler when the peers wait together and it does not (their
    # power moves as one, set by how long each step waits for it).
    corr = np.full(sub.size, np.nan)
    peer_corr = np.full(sub.size, np.nan)
    screen = (
        (z_pw >= cfg.straggler_decoupled_z) & (v["pw"] > r_pw) & (v["busy_s"] >= cfg.straggler_min_busy_s)
    )
    for gi in np.unique(gs[screen]).tolist():
        members = np.flatnonzero(gs == gi)
        if members.size >= 3:
            c = _peer_correlation(fr, rows[sub[members]], a[rows[sub[members]]], b[rows[sub[members]]])
            corr[members] = c
            peer_corr[members] = group_loo_median(c, np.zeros(members.size, dtype=np.int64), 1)
    # Who waits, where samples resolve it: each GPU's share of the span spinning (a kernel resident
    # at pause-level power) and dipping (below its own busy level), in the runs with a candidate.
    cand = (v["busy_s"] >= cfg.straggler_min_busy_s) & (waiting | capped_plateau | busier_plateau | screen)
    v["spin"], v["dip"] = np.full(sub.size, np.nan), np.full(sub.size, np.nan)
    for gi in np.unique(gs[cand]).tolist():
        for m in np.flatnonzero(gs == gi).tolist():
            j = int(sub[m])
            part = slice(int(seg[j]), int(seg[j] + cnt[j]))
            v["spin"][m], v["dip"][m] = _waits(fr, idx[part], power[part], resident)
    r_spin = group_loo_median(v["spin"], gs, ng)
    r_dip = group_loo_median(v["dip"], gs, ng)
    # ... and where samples resolve the waits (the peers dip below their own busy level with a
    # kernel resident), it dips clearly less than they do: who waits shows, not only a rhythm.
    resolved = r_dip >= cfg.straggler_peer_wait_excess
    peers_dip = ~resolved | (r_dip - v["dip"] >= cfg.straggler_peer_wait_excess)
    decoupled = (
        screen
        & (peer_corr >= cfg.straggler_peer_corr)
        & (corr <= peer_corr - cfg.straggler_corr_gap)
        & (corr <= cfg.straggler_max_corr)
        & peers_dip
    )
    # Which reading shows an unexplained straggler, strongest first.
    unknown_by = np.where(busier_plateau, "plat", np.where(causes["unknown"], "act", "pw"))
    causes["unknown"] = causes["unknown"] | busier_plateau | decoupled
    # A GPU that spins in the collective, or dips below its own busy power, more than its peers waits
    # on them (on a checkpoint's writer, on a capped peer): it is never the one they wait on.
    waits_itself = (v["spin"] - r_spin >= cfg.straggler_wait_gap) | (
        v["dip"] - r_dip >= cfg.straggler_wait_gap
    )
    eligible = (
        (v["busy_s"] >= cfg.straggler_min_busy_s)
        & (waiting | capped_plateau | busier_plateau | decoupled)
        & ~waits_itself
    )
    v["corr"] = corr
    refs = {
        "lim": r_lim,
        "clk": r_clk,
        "temp": r_temp,
        "act": r_act,
        "pf": r_pf,
        "plat": r_plat,
        "pw": r_pw,
        "corr": peer_corr,
        "spin": r_spin,
        "dip": r_dip,
    }
    zs = {"lim": z_lim, "clk": z_clk, "temp": z_temp, "act": z_act, "plat": z_plat, "pw": z_pw}
    # A GPU explained as slow (capped, hot, a degraded link, low clocks) is what its run waits for;
    # one that merely reads busier than its peers in the same run is the mirror of it (in a 2-GPU
    # job its only peer is the slow GPU), not a second straggler.
    explained = {
        int(gs[k])
        for k in np.flatnonzero(eligible)
        if next((c for c, m in causes.items() if m[k]), "unknown") != "unknown"
    }
    out = []
    for k in np.flatnonzero(eligible):
        if int(gs[k]) in explained and next((c for c, m in causes.items() if m[k]), None) == "unknown":
            continue
        cause = next((c for c, m in causes.items() if m[k]), None)
        if cause is None:
            continue
        r = int(rows[sub[k]])
        found = _finding(
            fr,
            r,
            cause,
            {n_: a[k] for n_, a in v.items()},
            {n_: a[k] for n_, a in refs.items()},
            {n_: a[k] for n_, a in zs.items()},
            int(np.count_nonzero(gs == gs[k])) - 1,
            str(unknown_by[k]),
        )
        if found is not None:
            if cause == "unknown":
                _network(fr, r, found)
            out.append(found)
    return out


def _waits(fr: Frame, idx: np.ndarray, power: np.ndarray, resident: np.ndarray) -> tuple[float, float]:
    """One GPU over its span (flat indexes ``idx``, its ``power`` there): the share of the span it spun
    in a collective (a kernel resident at pause-level activity, or at power at most
    ``ckpt_pause_power_share`` of its busy level) and the share it dipped (a kernel resident at power
    at most ``straggler_dip_power_share`` of it).  Its busy level is the median of its power while busy
    over the span: a GPU capped part-way through is judged against the level most of the span shows."""
    cfg = fr.config
    w = fr.w[idx].astype(np.float64)
    tot = float(w.sum())
    if tot <= 0:
        return math.nan, math.nan
    res = resident[idx]
    spin = res & fr.paused[idx]
    busy_p = power[fr.busy[idx] & np.isfinite(power)]
    dip = np.zeros(idx.size, dtype=bool)
    if busy_p.size:
        level = float(np.median(busy_p))
        with np.errstate(invalid="ignore"):
            spin |= res & (power <= cfg.ckpt_pause_power_share * level)
            dip = res & (power <= cfg.straggler_dip_power_share * level)
    return float(w[spin].sum()) / tot, float(w[dip].sum()) / tot


def _network(fr: Frame, r: int, f: Finding) -> None:
    """Name the network as the cause of a straggler nothing on the GPU explains, where its node's fabric
    shows a fault or saturation its peers' nodes do not."""
    run = fr.window.runs[int(fr.run_of_row[r])]
    node = fr.keys[r][0]
    nf = straggler_network_cause(
        node, {k[0] for k in run.allocations}, fr.window.hosts, fr.window.t_start, fr.window.t_end, fr.config
    )
    if nf is not None:
        f.cause = "network"
        ev = cast(StragglerEvidence, f.evidence)
        ev["network_reason"] = nf.reason
        ev["network_nodes"] = nf.nodes


def _finding(
    fr: Frame,
    r: int,
    cause: str,
    v: dict[str, float],
    ref: dict[str, float],
    z: dict[str, float],
    peers: int,
    unknown_by: str = "act",
) -> Finding | None:
    cfg = fr.config
    sl = fr.row_slice(r)
    t = fr.row_times(r)
    w = np.where(t >= fr.region[0][r], fr.w[sl], 0.0)
    busy = fr.busy[sl]
    bits = np.maximum(fr.throttle_bits[sl], 0)
    clk = fr.series_col(r, "sm_clock_mhz")
    slow = clk < ref["clk"] * (1.0 - cfg.straggler_min_rel)
    wb = np.where(busy, w, 0.0)
    if cause == "pcie_degraded":
        ind, wt, feat = busy & fr.pcie_degraded[sl], wb, None
    elif cause == "thermal":
        ind, wt, feat = busy & (((bits & THERMAL_BITS) != 0) | slow), wb, "temp"
    elif cause == "power_cap":
        lim = fr.series_col(r, "power_limit_w")
        by_limit = math.isfinite(z["lim"]) and z["lim"] <= -cfg.straggler_z
        by_plateau = (
            not math.isfinite(v["lim"]) and math.isfinite(z["plat"]) and z["plat"] <= -cfg.straggler_z
        )
        feat = "lim"
        if by_limit:
            ind, wt = lim < ref["lim"] * (1.0 - cfg.straggler_min_rel), w
        elif by_plateau:
            # No limit reported: busy at a power plateau below the peers'.
            power = fr.series_col(r, "power_w")
            ind, wt, feat = busy & (power < ref["plat"] * (1.0 - cfg.straggler_min_rel)), wb, "plat"
        else:
            ind, wt = busy & ((bits & THROTTLE_SW_POWER_CAP) != 0) & slow, wb
    elif cause == "clocks":
        ind, wt, feat = busy & slow, wb, "clk"
    elif unknown_by == "plat":
        power = fr.series_col(r, "power_w")
        ind, wt, feat = busy & (power > ref["plat"] * (1.0 + cfg.straggler_plateau_min_rel)), wb, "plat"
    elif unknown_by == "act":
        ind, wt, feat = fr.activity[sl] >= ref["act"] + cfg.straggler_unknown_gap, w, "act"
    else:
        # Out of the peers' wait rhythm: busy above the peers' mean power.
        power = fr.series_col(r, "power_w")
        ind, wt, feat = busy & (power > ref["pw"]), wb, "pw"
    onset = trailing_onset(t, wt, ind, cfg.majority_share)
    hits = np.flatnonzero(ind & (wt > 0))
    if hits.size == 0 or t[hits[-1]] < fr.window.t_end - max(
        cfg.active_within_s, cfg.active_within_samples * float(fr.dt[r])
    ):
        # Recovered: the slowness is no longer seen, only averaged in.
        return None
    last = float(t[hits[-1]])
    if not math.isfinite(onset):
        onset = float(max(fr.region[0][r], t[0]))
    act_gap = v["act"] - ref["act"]
    pf_gap = v["pf"] - ref["pf"]
    evidence: StragglerEvidence = {
        "z": num(z[feat]) if feat in z else None,
        "feature": {
            "lim": "power_limit_w",
            "clk": "sm_clock_mhz",
            "temp": "temp_c",
            "act": "activity",
            "plat": "power_plateau_w",
            "pw": "power_w",
        }.get(feat or "", "pcie_degraded_share"),
        "peers": peers,
        "activity": num(v["act"]),
        "peer_activity": num(ref["act"]),
        "power_frac": num(v["pf"]),
        "peer_power_frac": num(ref["pf"]),
        "power_limit_w": num(v["lim"]),
        "peer_power_limit_w": num(ref["lim"]),
        "sm_clock_mhz": num(v["clk"]),
        "peer_sm_clock_mhz": num(ref["clk"]),
        "temp_c": num(v["temp"]),
        "peer_temp_c": num(ref["temp"]),
        "thermal_share": num(v["therm"]),
        "power_cap_share": num(v["pcap"]),
        "pcie_degraded_share": num(v["pcie"]),
        "z_power_limit": num(z["lim"]),
        "z_sm_clock": num(z["clk"]),
        "z_temp": num(z["temp"]),
        "z_activity": num(z["act"]),
        "power_plateau_w": num(v["plat"]),
        "peer_power_plateau_w": num(ref["plat"]),
        "z_power_plateau": num(z["plat"]),
        "power_w": num(v["pw"]),
        "peer_power_w": num(ref["pw"]),
        "z_power": num(z["pw"]),
        "power_correlation": num(v["corr"]),
        "peer_power_correlation": num(ref["corr"]),
        "wait_share": num(v["spin"]),
        "peer_wait_share": num(ref["spin"]),
        "dip_share": num(v["dip"]),
        "peer_dip_share": num(ref["dip"]),
        "activity_basis": fr.activity_basis([r]),
    }
    gaps = [x for x in (act_gap, pf_gap) if math.isfinite(x)]
    severity = "critical" if gaps and max(gaps) >= cfg.straggler_critical_gap else "warning"
    key = fr.keys[r]
    run_id = fr.window.runs[int(fr.run_of_row[r])].run_id
    return Finding(
        KIND, cause, severity, onset, evidence, run_id=run_id, node=key[0], gpu=key[1], last_active=last
    )


def _plateaus(
    fr: Frame,
    idx: np.ndarray,
    power: np.ndarray,
    seg: np.ndarray,
    cnt: np.ndarray,
    lim: np.ndarray,
    half: int | None = None,
    only: np.ndarray | None = None,
) -> np.ndarray:
    """Per row, the ``straggler_plateau_percentile`` of power while busy over
    the span, for rows that report no enforced limit (NaN otherwise): a GPU
    capped below its peers computes at a lower plateau, which is what shows
    the cap when the limit itself is not exported.  ``half`` 0 or 1: over
    that half of the span's samples only; ``only``: for those rows alone."""
    out = np.full(cnt.size, np.nan)
    ok = ~np.isfinite(lim) & (cnt > 0)
    need = np.flatnonzero(ok if only is None else ok & only)
    if need.size == 0:
        return out
    busy = fr.busy[idx]
    q = fr.config.straggler_plateau_percentile
    for k in need.tolist():
        a, n = int(seg[k]), int(cnt[k])
        sl = (
            slice(a, a + n)
            if half is None
            else slice(a + half * (n // 2), a + (n // 2) + half * (n - n // 2))
        )
        p = power[sl][busy[sl]]
        p = p[np.isfinite(p)]
        if p.size >= 5:
            out[k] = float(np.percentile(p, q))
    return out


def _peer_correlation(fr: Frame, rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per row of one run, the correlation of its power over ``[a, b)``
    with the mean power of the others, on a common grid at the run's
    coarsest interval (GPUs of different nodes are sampled on different
    clocks).  NaN where a row has too little power data or no variation."""
    out = np.full(rows.size, np.nan)
    t0 = max(float(fr.time(int(x))) for x in a)
    t1 = min(float(fr.time(int(y) - 1)) for y in b) if (b > a).all() else t0
    step = float(np.max(fr.dt[rows]))
    if not t1 - t0 >= 10.0 * step:
        return out
    grid = np.arange(t0, t1, step)
    series = np.full((rows.size, grid.size), np.nan)
    for k, (r, i, j) in enumerate(zip(rows.tolist(), a.tolist(), b.tolist(), strict=True)):
        t = fr.time(slice(i, j))
        col = fr.series[r].cols.get("power_w")
        if col is None:
            continue
        p = col[i - int(fr.offsets[r]) : j - int(fr.offsets[r])]
        ok = np.isfinite(p)
        if ok.sum() >= 10:
            series[k] = np.interp(grid, t[ok], p[ok])
    good = np.isfinite(series).all(axis=1)
    if good.sum() < 3:
        return out
    x = series[good] - series[good].mean(axis=1, keepdims=True)
    total = x.sum(axis=0)
    n = x.shape[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        others = (total[None, :] - x) / (n - 1)
        num_ = (x * others).sum(axis=1)
        den = np.sqrt((x * x).sum(axis=1) * (others * others).sum(axis=1))
        out[good] = np.where(den > 0, num_ / den, np.nan)
    return out
