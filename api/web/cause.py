"""An incident's cause as a person reads it: one sentence per kind, and the numbers behind it.

The evidence a detector stores is a bag of figures (``depth=0.835
cycles=8 period_s=9``); what an SRE needs first is *why*: "the job's CPU is
saturated, 220.6 cores busy and tasks waiting for a CPU 38 % of the time".
Each kind has a formatter here that turns its evidence into that sentence and
into a short list of labelled figures with their units.  A formatter uses
only the figures that are present, so an incident written before a key
existed (or by a newer detector) still reads as a sentence; a kind this
module does not know gets a plain sentence built from its name, cause and
numeric evidence.  The web pages, the CLI's ``incidents show`` and the
demo's terminal all read incidents through :func:`explain`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpufleet import xid

#: One labelled figure: (what it is, its value with the unit).
Figure = tuple[str, str]


@dataclass(frozen=True)
class Explanation:
    """Why an incident is open, in words: a headline, one sentence, and the figures it rests on."""

    #: Short title: what is wrong and with what (``Input starvation (CPU)``).
    title: str
    #: The cause as one sentence with its numbers.
    sentence: str
    figures: tuple[Figure, ...] = ()
    #: ``node/gpu`` of each GPU the incident names (for links and chart spans).
    gpus: tuple[tuple[str, int], ...] = field(default_factory=tuple)


# ---------------------------------------------------------------- reading numbers defensively


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    v = ev.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _int(ev: Mapping[str, Any], key: str) -> int | None:
    v = _num(ev, key)
    return None if v is None else round(v)


def _str(ev: Mapping[str, Any], key: str) -> str | None:
    v = ev.get(key)
    return v if isinstance(v, str) and v else None


def pct(share: float | None, digits: int = 0) -> str:
    """A 0-1 share as a percentage."""
    return "?" if share is None else f"{100.0 * share:.{digits}f} %"


def _pct100(v: float | None, digits: int = 1) -> str:
    """A 0-100 figure as a percentage."""
    return "?" if v is None else f"{v:.{digits}f} %"


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0.0, seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def rate(bytes_s: float | None) -> str:
    if bytes_s is None:
        return "?"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if abs(bytes_s) >= size:
            return f"{bytes_s / size:.1f} {unit}"
    return f"{bytes_s:.0f} B/s"


def _join(parts: Sequence[str]) -> str:
    parts = [p for p in parts if p]
    if len(parts) <= 1:
        return "".join(parts)
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    text = text[0].upper() + text[1:]
    return text if text.endswith(".") else text + "."


def listed_gpus(incident: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    """The GPUs an incident names: its ``evidence.gpus`` (dicts or ``node/gpu`` strings), else its node and
    GPU."""
    ev = incident.get("evidence") if isinstance(incident.get("evidence"), Mapping) else {}
    out: list[tuple[str, int]] = []
    for key in ("gpus", "idle_gpus", "spinning_gpus", "dead_gpus"):
        items = ev.get(key) if isinstance(ev, Mapping) else None
        if not isinstance(items, list):
            continue
        for g in items:
            ref = _gpu_ref(g, incident.get("node"))
            if ref is not None and ref not in out:
                out.append(ref)
    if not out and incident.get("node") is not None and isinstance(incident.get("gpu"), int):
        out.append((str(incident["node"]), int(incident["gpu"])))
    return tuple(out)


def _gpu_ref(g: object, node: object) -> tuple[str, int] | None:
    if isinstance(g, Mapping):
        n, i = g.get("node", node), g.get("gpu")
        if n is not None and isinstance(i, int) and not isinstance(i, bool):
            return str(n), i
        return None
    if isinstance(g, str) and "/" in g:
        n, _, i = g.rpartition("/")
        if i.isdigit():
            return n, int(i)
    return None


def _where(inc: Mapping[str, Any]) -> str:
    run, node, gpu = inc.get("run_id"), inc.get("node"), inc.get("gpu")
    if node is not None and gpu is not None:
        return f"GPU {node}/{gpu}" + (f" of run {run}" if run else "")
    if node is not None:
        return f"node {node}" + (f" (run {run})" if run else "")
    return f"run {run}" if run else "the fleet"


def _gpus_text(gpus: Sequence[tuple[str, int]]) -> str:
    by_node: dict[str, list[int]] = {}
    for n, g in gpus:
        by_node.setdefault(n, []).append(g)
    return "; ".join(f"{n}/{','.join(str(g) for g in sorted(gs))}" for n, gs in sorted(by_node.items()))


# ---------------------------------------------------------------- one formatter per kind

Formatter = Callable[[Mapping[str, Any], Mapping[str, Any]], Explanation]


def _starvation(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    cause = inc.get("cause") or "unknown"
    who = f"run {inc['run_id']}" if inc.get("run_id") else _where(inc)
    lost = _num(ev, "gpu_time_lost_share")
    duty = _num(ev, "duty_cycle")
    if lost is None and duty is not None:
        lost = 1.0 - duty
    n, total = _int(ev, "gpus_affected"), _int(ev, "gpu_count")
    gpus = (
        (f"all {total} GPUs" if n == total else f"{n} of {total} GPUs")
        if n is not None and total is not None
        else "the GPUs"
    )
    figures: list[Figure] = []
    if ev.get("pattern") == "steady_low":
        shape = f"their activity stays low at {pct(_num(ev, 'mean_activity'))}"
    else:
        period, cycles, depth = _num(ev, "period_s"), _int(ev, "cycles"), _num(ev, "depth")
        shape = (
            "they swing between busy and idle"
            + (f" every {period:.0f} s" if period else "")
            + (f" ({cycles} cycles in a row)" if cycles else "")
        )
        if period is not None:
            figures.append(("idle/busy period", f"{period:.0f} s"))
        if depth is not None:
            figures.append(("swing depth", pct(depth)))
    if lost is not None:
        figures.insert(0, ("GPU time waiting for input", pct(lost)))
    job_cores, quota = _num(ev, "job_cpu_cores"), _num(ev, "job_cpu_quota_cores")
    cpu_pressure, io_pressure = _num(ev, "job_cpu_pressure_pct"), _num(ev, "job_io_pressure_pct")
    throttled = _num(ev, "job_cpu_throttled_share")
    host_cpu, iowait = _num(ev, "cpu_user_pct"), _num(ev, "iowait_pct")
    disk, await_ms = _num(ev, "disk_util_pct"), _num(ev, "disk_await_ms")
    host = _str(ev, "host") or _str(ev, "job_node")
    why: list[str] = []
    if cause == "cpu":
        title = "Input starvation: CPU-bound"
        if quota is not None and job_cores is not None:
            why.append(f"the job uses {job_cores:.1f} of the {quota:.1f} cores its CPU quota allows")
        elif job_cores is not None:
            why.append(f"the job keeps {job_cores:.1f} cores busy")
        if throttled:
            why.append(f"its cgroup is throttled in {pct(throttled)} of CPU periods")
        if cpu_pressure is not None:
            why.append(f"its tasks wait for a CPU {_pct100(cpu_pressure)} of the time")
        if host_cpu is not None:
            why.append(f"the CPUs of {host or 'the host'} are {_pct100(host_cpu)} busy")
        lead = "the input pipeline is CPU-bound"
    elif cause == "io":
        title = "Input starvation: I/O-bound"
        if disk is not None:
            why.append(f"the busiest disk is {_pct100(disk)} busy" + (f" on {host}" if host else ""))
        if iowait is not None:
            why.append(f"iowait is {_pct100(iowait)}")
        if await_ms is not None:
            why.append(f"each request waits {await_ms:.0f} ms")
        if io_pressure is not None:
            why.append(f"the job's tasks wait for I/O {_pct100(io_pressure)} of the time")
        lead = "reading the input is I/O-bound"
    else:
        title = "Input starvation" if cause == "unknown" else f"Input starvation (cause {cause})"
        lead = "the GPUs wait for input, and neither the CPU nor the disk shows why"
        if host_cpu is not None:
            why.append(f"host CPU {_pct100(host_cpu)} busy")
        if disk is not None:
            why.append(f"disk {_pct100(disk)} busy")
    for label, value in (
        ("job CPU used", None if job_cores is None else f"{job_cores:.1f} cores"),
        ("job CPU quota", None if quota is None else f"{quota:.1f} cores"),
        ("job waiting for CPU", None if cpu_pressure is None else _pct100(cpu_pressure)),
        ("job waiting for I/O", None if io_pressure is None else _pct100(io_pressure)),
        ("host CPU busy", None if host_cpu is None else _pct100(host_cpu)),
        ("iowait", None if iowait is None else _pct100(iowait)),
        ("busiest disk busy", None if disk is None else _pct100(disk)),
        ("disk await", None if await_ms is None else f"{await_ms:.1f} ms"),
    ):
        if value is not None:
            figures.append((label, value))
    lost_text = f", idle {pct(lost)} of the time" if lost is not None else ""
    sentence = f"{gpus} of {who} wait for input{lost_text}: {shape}; {lead}"
    if why:
        sentence += f" ({_join(why)})"
    return Explanation(title, _sentence(sentence), tuple(figures))


def _checkpoint_stall(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    who = f"run {inc['run_id']}" if inc.get("run_id") else _where(inc)
    pause, period, pauses = _num(ev, "pause_s"), _num(ev, "period_s"), _int(ev, "pauses")
    lost = _num(ev, "run_time_lost_share")
    path, host, writer = _str(ev, "write_path"), _str(ev, "host"), _str(ev, "writer_gpu")
    wrate = _num(ev, "write_bytes_s")
    spinning = _num(ev, "spinning_gpus")
    s = f"{who} stops for checkpoints"
    if pause is not None:
        s += f": its GPUs pause {duration(pause)} at a time"
        if period is not None:
            s += f", every {duration(period)}"
        elif pauses is not None:
            s += f" ({pauses} pause{'s' if pauses != 1 else ''} in the last window)"
    if lost is not None:
        s += f"; that is {pct(lost, 1)} of the run's time"
    if writer:
        s += (
            f"; rank {writer} writes"
            + (f" to {path}" if path else "")
            + (f" at {rate(wrate)}" if wrate else "")
            + " while"
            + (f" {spinning:.0f} other GPUs" if spinning else " the others")
            + " wait"
        )
    elif path:
        s += (
            f"; the state goes to {path}"
            + (f" at {rate(wrate)}" if wrate else "")
            + (f" from {host}" if host else "")
        )
    figures = [
        (label, value)
        for label, value in (
            ("run time lost", None if lost is None else pct(lost, 1)),
            ("pause", None if pause is None else duration(pause)),
            ("interval", None if period is None else duration(period)),
            ("pauses seen", None if pauses is None else str(pauses)),
            ("writer", writer),
            ("written to", path),
            ("write rate while paused", None if wrate is None else rate(wrate)),
        )
        if value is not None
    ]
    return Explanation("Checkpoint stalls", _sentence(s), tuple(figures))


STRAGGLER_CAUSE = {
    "power_cap": "a lower power limit",
    "thermal": "heat",
    "pcie_degraded": "a degraded PCIe link",
    "clocks": "lower clocks",
    "unknown": "a cause the counters do not show",
}


def _straggler(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    cause = inc.get("cause") or "unknown"
    gpu = (
        f"GPU {inc['node']}/{inc['gpu']}"
        if inc.get("node") is not None and inc.get("gpu") is not None
        else "One GPU"
    )
    run = f"run {inc['run_id']}" if inc.get("run_id") else "its job"
    act, peer = _num(ev, "activity"), _num(ev, "peer_activity")
    s = f"{gpu} holds {run} back: every synchronous step waits for it"
    detail: list[str] = []
    if cause == "power_cap":
        lim, plim = _num(ev, "power_limit_w"), _num(ev, "peer_power_limit_w")
        if lim is not None and plim is not None:
            detail.append(f"its power limit is {lim:.0f} W against its peers' {plim:.0f} W")
    elif cause == "thermal":
        t, pt = _num(ev, "temp_c"), _num(ev, "peer_temp_c")
        if t is not None and pt is not None:
            detail.append(f"it runs at {t:.0f} °C against its peers' {pt:.0f} °C")
    elif cause == "pcie_degraded":
        share = _num(ev, "pcie_degraded_share")
        if share is not None:
            detail.append(f"its PCIe link ran degraded {pct(share)} of the time")
    clk, pclk = _num(ev, "sm_clock_mhz"), _num(ev, "peer_sm_clock_mhz")
    if clk is not None and pclk is not None and abs(clk - pclk) >= 1:
        detail.append(f"SM clock {clk:.0f} MHz against {pclk:.0f} MHz")
    if act is not None and peer is not None:
        detail.append(f"busy {pct(act)} against its peers' {pct(peer)}")
    s += f"; likely {STRAGGLER_CAUSE.get(cause, cause)}" + (f" ({_join(detail)})" if detail else "")
    figures = [
        (label, value)
        for label, value in (
            ("activity", None if act is None else pct(act)),
            ("peers' activity", None if peer is None else pct(peer)),
            ("power limit", _w(ev, "power_limit_w")),
            ("peers' power limit", _w(ev, "peer_power_limit_w")),
            ("power", _w(ev, "power_w")),
            ("peers' power", _w(ev, "peer_power_w")),
            ("SM clock", None if clk is None else f"{clk:.0f} MHz"),
            ("peers' SM clock", None if pclk is None else f"{pclk:.0f} MHz"),
            ("temperature", _c(ev, "temp_c")),
            ("peers' temperature", _c(ev, "peer_temp_c")),
            ("peers", None if _int(ev, "peers") is None else str(_int(ev, "peers"))),
        )
        if value is not None
    ]
    return Explanation(
        f"Straggler ({STRAGGLER_CAUSE.get(cause, cause)})", _sentence(s), tuple(figures), listed_gpus(inc)
    )


def _w(ev: Mapping[str, Any], key: str) -> str | None:
    v = _num(ev, key)
    return None if v is None else f"{v:.0f} W"


def _c(ev: Mapping[str, Any], key: str) -> str | None:
    v = _num(ev, key)
    return None if v is None else f"{v:.0f} °C"


THROTTLE_CAUSE = {
    "power_cap": "the power cap",
    "thermal": "heat (thermal slowdown)",
    "hw_slowdown": "a hardware slowdown signal",
    "power_brake": "the power brake (an external signal)",
}


def _throttling(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    cause = inc.get("cause") or "unknown"
    gpus = listed_gpus(inc)
    share, ratio = _num(ev, "throttled_share"), _num(ev, "clock_ratio")
    clk, clk_max, temp = _num(ev, "sm_clock_mhz"), _num(ev, "sm_clock_max_mhz"), _num(ev, "temp_c_max")
    pfrac = _num(ev, "power_frac")
    if len(gpus) > 1:
        subject = (
            f"{len(gpus)} GPUs"
            + (f" of run {inc['run_id']}" if inc.get("run_id") else "")
            + (f" on {inc['node']}" if inc.get("node") else "")
        )
    else:
        subject = (
            _where(inc)
            if not gpus
            else f"GPU {gpus[0][0]}/{gpus[0][1]}" + (f" of run {inc['run_id']}" if inc.get("run_id") else "")
        )
    s = f"{subject} {'are' if len(gpus) > 1 else 'is'} held down by {THROTTLE_CAUSE.get(cause, cause)}"
    if share is not None:
        s += f" {pct(share)} of {'their' if len(gpus) > 1 else 'its'} busy time"
    if ratio is not None:
        s += f", at {pct(ratio)} of the maximum clock" + (
            f" ({clk:.0f} of {clk_max:.0f} MHz)" if clk is not None and clk_max is not None else ""
        )
    if cause == "thermal" and temp is not None:
        s += f", up to {temp:.0f} °C"
    if cause == "power_cap" and pfrac is not None:
        s += f", drawing {pct(pfrac)} of the power limit"
    figures = [
        (label, value)
        for label, value in (
            ("throttled while busy", None if share is None else pct(share)),
            ("clock against maximum", None if ratio is None else pct(ratio)),
            ("SM clock", None if clk is None else f"{clk:.0f} MHz"),
            ("maximum SM clock", None if clk_max is None else f"{clk_max:.0f} MHz"),
            ("hottest", None if temp is None else f"{temp:.0f} °C"),
            ("power against limit", None if pfrac is None else pct(pfrac)),
            ("GPUs", _gpus_text(gpus) if len(gpus) > 1 else None),
        )
        if value is not None
    ]
    return Explanation(f"Throttling ({cause.replace('_', ' ')})", _sentence(s), tuple(figures), gpus)


#: Usable bandwidth per lane, GB/s, by PCIe generation (after line encoding).
PCIE_LANE_GBS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


def _pcie_degraded(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    gen, gmax = _int(ev, "pcie_gen"), _int(ev, "pcie_gen_max")
    width, wmax = _int(ev, "pcie_width"), _int(ev, "pcie_width_max")
    share = _num(ev, "degraded_share")
    s = f"The PCIe link of {_where(inc)} runs"
    now = f"Gen{gen if gen is not None else '?'} x{width if width is not None else '?'}"
    best = f"Gen{gmax if gmax is not None else '?'} x{wmax if wmax is not None else '?'}"
    known = None not in (gen, gmax, width, wmax)
    s += f" at {now} instead of {best}" if known else " below its maximum generation or width"
    bw = bw_max = None
    if gen in PCIE_LANE_GBS and gmax in PCIE_LANE_GBS and width and wmax:
        bw, bw_max = PCIE_LANE_GBS[gen] * width, PCIE_LANE_GBS[gmax] * wmax
        s += f", {bw:.0f} of {bw_max:.0f} GB/s each way"
    if share is not None:
        s += f" ({pct(share)} of the time)"
    figures = [
        (label, value)
        for label, value in (
            ("link now", now if known else None),
            ("link maximum", best if known else None),
            ("bandwidth", None if bw is None or bw_max is None else f"{bw:.0f} of {bw_max:.0f} GB/s"),
            ("degraded", None if share is None else pct(share)),
            (
                "host to GPU",
                None if _num(ev, "pcie_rx_bytes_s") is None else rate(_num(ev, "pcie_rx_bytes_s")),
            ),
            (
                "GPU to host",
                None if _num(ev, "pcie_tx_bytes_s") is None else rate(_num(ev, "pcie_tx_bytes_s")),
            ),
        )
        if value is not None
    ]
    return Explanation("PCIe link degraded", _sentence(s), tuple(figures), listed_gpus(inc))


def _xid_text(codes: Sequence[int]) -> str:
    return ", ".join(xid.label(c) for c in codes)


def _host_misconfig(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    cause = inc.get("cause") or ""
    if cause == "repeated_xid" or "xid_events" in ev:
        n = _int(ev, "xid_events")
        codes = [c for c in ev.get("xid_codes") or [] if isinstance(c, int) and not isinstance(c, bool)]
        last = _int(ev, "last_xid")
        info = xid.describe(last) if last else None
        s = f"{_where(inc)} logged {n if n is not None else 'several'} XID errors"
        if codes:
            s += f" ({_xid_text(codes)})"
        if info is not None:
            s += (
                f"; the last, {xid.label(last or 0)}, means {info.meaning.rstrip('.')}; first action: "
                f"{info.action.replace('_', ' ')}"
            )
        xid_figures: list[Figure] = [("XID events", str(n))] if n is not None else []
        xid_figures += [("codes", _xid_text(codes))] if codes else []
        return Explanation("Repeated XID errors", _sentence(s), tuple(xid_figures), listed_gpus(inc))
    issues = [i for i in ev.get("issues") or [] if isinstance(i, str)] or ([cause] if cause else [])
    parts: list[str] = []
    figures: list[Figure] = []
    for issue in issues:
        if issue == "cpu_quota":
            jobs = [j for j in ev.get("jobs") or [] if isinstance(j, Mapping)]
            for j in jobs[:4]:
                gpus = [g for g in j.get("gpus") or [] if isinstance(g, int)]
                q = _num(j, "cpu_quota_cores")
                parts.append(
                    f"{j.get('job') or 'a job'} may use {q:g} cores for {len(gpus)} GPUs"
                    if q is not None
                    else f"{j.get('job') or 'a job'} has a CPU quota"
                )
                if q is not None:
                    figures.append(
                        (f"CPU quota of {j.get('job') or 'a job'}", f"{q:g} cores for {len(gpus)} GPUs")
                    )
            if not jobs:
                q, g = _num(ev, "cpu_quota_cores"), _int(ev, "gpu_count")
                parts.append(
                    f"the CPU quota is {q:g} cores for {g} GPUs"
                    if q is not None and g
                    else "the CPU quota is below one core per GPU"
                )
        elif issue == "cpu_governor":
            gov = ", ".join(str(x) for x in ev.get("cpu_governor") or []) or "powersave"
            parts.append(
                f"the CPU frequency governor is {gov}, so the input pipeline runs at the lowest clocks"
            )
            figures.append(("CPU governor", gov))
        elif issue == "numa_affinity":
            for m in [m for m in ev.get("numa_misplaced") or [] if isinstance(m, Mapping)][:4]:
                parts.append(
                    f"the processes of GPU {m.get('gpu')} (NUMA node {m.get('gpu_numa_node')}) may run "
                    f"only on NUMA nodes {', '.join(str(x) for x in m.get('numa_nodes') or [])}"
                )
            if not ev.get("numa_misplaced"):
                parts.append("GPU processes run on CPUs of another NUMA node than their GPU")
        elif issue == "nfs_stall":
            for m in [m for m in ev.get("nfs_stalls") or [] if isinstance(m, Mapping)][:4]:
                parts.append(f"NFS mount {m.get('mountpoint')} stalls ({m.get('why')})")
                for label, key, unit in (
                    ("retransmissions", "retrans", ""),
                    ("timeouts", "timeouts", ""),
                    ("backlog wait", "queue_ms", " ms"),
                    ("round trip", "rtt_ms", " ms"),
                ):
                    v = _num(m, key)
                    if v is not None:
                        figures.append((f"{m.get('mountpoint')} {label}", f"{v:g}{unit}"))
        else:
            parts.append(issue.replace("_", " "))
    where = f"node {inc['node']}" if inc.get("node") else _where(inc)
    s = f"{where} is misconfigured: {'; '.join(parts) if parts else 'see the evidence'}"
    return Explanation(
        f"Host misconfiguration ({', '.join(i.replace('_', ' ') for i in issues) or cause})",
        _sentence(s),
        tuple(figures),
        listed_gpus(inc),
    )


def _nvlink_degraded(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    issues = [i for i in ev.get("issues") or [] if isinstance(i, str)] or [inc.get("cause") or "degraded"]
    parts: list[str] = []
    figures: list[Figure] = []
    for issue in issues:
        if issue == "links_down":
            down, exp = _int(ev, "links_down"), _int(ev, "links_expected")
            parts.append(
                f"{down if down is not None else 'some'} of {exp if exp is not None else 'its'} NVLink links "
                "are down" + (f" (for {duration(_num(ev, 'down_s'))})" if _num(ev, "down_s") else "")
            )
            if down is not None:
                figures.append(("links down", f"{down} of {exp}" if exp is not None else str(down)))
        elif issue == "pcie_fallback":
            nv, peers = _num(ev, "nvlink_bytes_s"), _num(ev, "peers_nvlink_bytes_s")
            pcie = sum(v for v in (_num(ev, "pcie_tx_bytes_s"), _num(ev, "pcie_rx_bytes_s")) if v is not None)
            parts.append(
                "collectives cross PCIe instead of NVLink"
                + (
                    f" (NVLink {rate(nv)} against its peers' {rate(peers)}, PCIe {rate(pcie)})"
                    if nv is not None and peers is not None
                    else ""
                )
            )
            figures += [
                ("NVLink traffic", rate(nv)),
                ("peers' NVLink traffic", rate(peers)),
                ("PCIe traffic", rate(pcie)),
            ]
        elif issue == "link_errors":
            per_min = _num(ev, "errors_per_min")
            crc, rep, rec = _int(ev, "crc_errors"), _int(ev, "replay_errors"), _int(ev, "recoveries")
            counts = _join(
                [
                    f"{crc} CRC errors" if crc is not None else "",
                    f"{rep} replays" if rep is not None else "",
                    f"{rec} link recover{'y' if rec == 1 else 'ies'}" if rec is not None else "",
                ]
            )
            parts.append(
                "NVLink errors keep rising"
                + (f" at {per_min:.0f} a minute" if per_min is not None else "")
                + (f" ({counts} in the window)" if counts else "")
            )
            figures += [
                (label, value)
                for label, value in (
                    ("errors per minute", None if per_min is None else f"{per_min:.0f}"),
                    ("CRC errors", None if crc is None else str(crc)),
                    ("replays", None if rep is None else str(rep)),
                    ("recoveries", None if rec is None else str(rec)),
                )
                if value is not None
            ]
        else:
            parts.append(issue.replace("_", " "))
    s = f"NVLink of {_where(inc)}: {'; '.join(parts)}"
    return Explanation(
        f"NVLink degraded ({', '.join(i.replace('_', ' ') for i in issues)})",
        _sentence(s),
        tuple(figures),
        listed_gpus(inc),
    )


def _gpu_health(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    issues = [i for i in ev.get("issues") or [] if isinstance(i, str)] or [inc.get("cause") or "unhealthy"]
    parts: list[str] = []
    figures: list[Figure] = []
    for issue in issues:
        if issue == "row_remap_failed":
            parts.append(
                "a memory row remap failed: no spare row is left and the memory is unprotected (RMA)"
            )
        elif issue == "uncorrectable_ecc":
            n = _int(ev, "dbe_errors")
            parts.append(
                f"{n if n is not None else 'some'} uncorrectable (double-bit) ECC errors killed the work "
                "using that memory"
            )
            if n is not None:
                figures.append(("uncorrectable ECC errors", str(n)))
        elif issue == "row_remap_pending":
            parts.append("a faulty memory row waits for a GPU reset to be remapped")
        elif issue == "correctable_ecc":
            per_h = _num(ev, "sbe_per_h")
            parts.append(
                "correctable ECC errors arrive"
                + (f" at {per_h:.0f} an hour" if per_h is not None else "")
                + ": the memory is degrading"
            )
            if per_h is not None:
                figures.append(("correctable ECC errors per hour", f"{per_h:.0f}"))
        elif issue == "pcie_replay":
            per_min, n = _num(ev, "pcie_replays_per_min"), _int(ev, "pcie_replays")
            parts.append(
                "the PCIe link keeps retransmitting"
                + (
                    f" ({per_min:.0f} replays a minute" + (f", {n} in the window)" if n is not None else ")")
                    if per_min is not None
                    else ""
                )
            )
            if per_min is not None:
                figures.append(("PCIe replays per minute", f"{per_min:.0f}"))
        else:
            parts.append(issue.replace("_", " "))
    codes = [c for c in ev.get("xid_codes") or [] if isinstance(c, int) and not isinstance(c, bool)]
    if codes:
        parts.append(f"the driver logged {_xid_text(codes)}")
    s = f"{_where(inc)}: {'; '.join(parts)}"
    return Explanation(
        f"GPU health ({', '.join(i.replace('_', ' ') for i in issues)})",
        _sentence(s),
        tuple(figures),
        listed_gpus(inc),
    )


def _since_text(ev: Mapping[str, Any], inc: Mapping[str, Any]) -> str:
    since = _str(ev, "idle_since") or _str(ev, "since")
    if since is None:  # the earliest of the GPUs' own onsets
        onsets = sorted(
            g["since"]
            for g in ev.get("gpus") or []
            if isinstance(g, Mapping) and isinstance(g.get("since"), str)
        )
        since = onsets[0] if onsets else None
    if since:
        return since.replace("T", " ").replace("Z", " UTC")
    start = inc.get("start")
    return start.strftime("%Y-%m-%d %H:%M UTC") if isinstance(start, datetime) else "the incident's start"


def _median(items: Sequence[Any], key: str) -> float | None:
    vals = sorted(v for v in (_num(g, key) for g in items if isinstance(g, Mapping)) if v is not None)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2.0


def _idle_allocation(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    gpus = listed_gpus(inc)
    per_gpu = [g for g in ev.get("gpus") or [] if isinstance(g, Mapping)]
    total = _int(ev, "gpu_count")
    idle_n = len(gpus) or _int(ev, "idle_gpus") or _int(ev, "idle_gpu_count")
    who = f"run {inc['run_id']}" if inc.get("run_id") else _where(inc)
    if idle_n and total:
        count = f"all {total}" if idle_n == total else f"{idle_n} of {total}"
    else:
        count = str(idle_n) if idle_n else "the"
    idle_s = _num(ev, "idle_s")
    s = f"{count} GPUs of {who} have done no work since {_since_text(ev, inc)}" + (
        f" ({duration(idle_s)})" if idle_s is not None else ""
    )
    if gpus:
        s += f": {_gpus_text(gpus)}"
    util = _num(ev, "util_pct") if _num(ev, "util_pct") is not None else _median(per_gpu, "util_pct")
    power = _num(ev, "power_w") if _num(ev, "power_w") is not None else _median(per_gpu, "power_w")
    detail = _join(
        [
            f"utilisation {_pct100(util, 0)}" if util is not None else "",
            f"{power:.0f} W each" if power is not None else "",
        ]
    )
    if detail:
        s += f" ({detail})"
    s += ", billed and kept from other jobs"
    figures = [
        (label, value)
        for label, value in (
            ("idle GPUs", _gpus_text(gpus) if gpus else None),
            ("idle for", None if idle_s is None else duration(idle_s)),
            ("utilisation", None if util is None else _pct100(util, 0)),
            ("power per GPU", None if power is None else f"{power:.0f} W"),
        )
        if value is not None
    ]
    return Explanation("Idle allocation", _sentence(s), tuple(figures), gpus)


def _hung_collective(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    who = f"run {inc['run_id']}" if inc.get("run_id") else _where(inc)
    dead: list[str] = []
    for key in ("dead_gpus", "dead_gpu", "dead_rank", "stalled_gpu"):
        v = ev.get(key)
        for item in v if isinstance(v, list) else [v]:
            ref = _gpu_ref(item, inc.get("node"))
            if ref is not None:
                dead.append(f"{ref[0]}/{ref[1]}")
            elif isinstance(item, str) and item:
                dead.append(item)
        if dead:
            break
    spin_items = [g for g in ev.get("spinning_gpus") or [] if isinstance(g, Mapping)]
    spinning = [ref for ref in (_gpu_ref(g, inc.get("node")) for g in spin_items) if ref is not None]
    n_spin = len(spinning) or _int(ev, "spinning_gpus")
    util = _num(ev, "util_pct") if _num(ev, "util_pct") is not None else _median(spin_items, "util_pct")
    power = _num(ev, "power_w") if _num(ev, "power_w") is not None else _median(spin_items, "power_w")
    frac = _median(spin_items, "power_frac")
    hung_s = _num(ev, "hung_s")
    s = f"{who} is hung in a collective since {_since_text(ev, inc)}" + (
        f" ({duration(hung_s)})" if hung_s is not None else ""
    )
    s += f": {n_spin} GPUs spin" if n_spin else ": its GPUs spin"
    if util is not None:
        s += f" at {_pct100(util, 0)} utilisation"
    if power is not None:
        s += f" while drawing only {power:.0f} W" + (
            f" ({pct(frac)} of their power limit, idle power)" if frac is not None else " (idle power)"
        )
    else:
        s += " at idle power"
    s += ", waiting on " + (f"GPU {', '.join(dead)}, which stopped" if dead else "a rank that stopped")
    figures = [
        (label, value)
        for label, value in (
            ("dead rank", ", ".join(dead) or None),
            ("spinning GPUs", _gpus_text(spinning) if spinning else None),
            ("hung for", None if hung_s is None else duration(hung_s)),
            ("utilisation while spinning", None if util is None else _pct100(util, 0)),
            ("power while spinning", None if power is None else f"{power:.0f} W"),
            ("power against limit", None if frac is None else pct(frac)),
        )
        if value is not None
    ]
    return Explanation("Hung collective", _sentence(s), tuple(figures), tuple(spinning) or listed_gpus(inc))


def _generic(inc: Mapping[str, Any], ev: Mapping[str, Any]) -> Explanation:
    kind = str(inc.get("kind") or "incident").replace("_", " ")
    cause = inc.get("cause")
    numbers = [
        (k.replace("_", " "), f"{v:.3g}" if isinstance(v, float) else str(v))
        for k, v in ev.items()
        if isinstance(v, int | float | str)
        and not isinstance(v, bool)
        and (not isinstance(v, float) or math.isfinite(v))
    ][:8]
    s = f"{kind} on {_where(inc)}" + (f", cause {str(cause).replace('_', ' ')}" if cause else "")
    if numbers:
        s += f" ({', '.join(f'{k} {v}' for k, v in numbers[:3])})"
    return Explanation(
        kind.capitalize() + (f" ({cause})" if cause else ""), _sentence(s), tuple(numbers), listed_gpus(inc)
    )


FORMATTERS: dict[str, Formatter] = {
    "starvation": _starvation,
    "checkpoint_stall": _checkpoint_stall,
    "straggler": _straggler,
    "throttling": _throttling,
    "pcie_degraded": _pcie_degraded,
    "host_misconfig": _host_misconfig,
    "nvlink_degraded": _nvlink_degraded,
    "gpu_health": _gpu_health,
    "idle_allocation": _idle_allocation,
    "hung_collective": _hung_collective,
}


def explain(incident: Mapping[str, Any]) -> Explanation:
    """The explanation of one incident (a row of ``incidents`` or the API's body); never raises on
    stored evidence: a formatter that cannot read it falls back to the plain sentence."""
    ev = incident.get("evidence")
    ev = ev if isinstance(ev, Mapping) else {}
    fmt = FORMATTERS.get(str(incident.get("kind")), _generic)
    try:
        got = fmt(incident, ev)
    except (TypeError, ValueError, KeyError, AttributeError, ZeroDivisionError):
        got = _generic(incident, ev)
    if not got.gpus:
        got = Explanation(got.title, got.sentence, got.figures, listed_gpus(incident))
    return got
