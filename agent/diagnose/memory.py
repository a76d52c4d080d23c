"""Memory pressure on the node: what the checklist's ``free -g``, ``vmstat`` and PSI readings show.

A data loader that runs out of page cache re-reads its data set from storage;
one that swaps stalls every step.  Three items judge it, from the kernel's
own accounting:

* ``memory_available``: ``MemAvailable`` against ``MemTotal``
  (``/proc/meminfo``); kernels before 3.14 lack ``MemAvailable``, and the
  figure is then estimated as ``procps`` did (free + buffers + page cache +
  reclaimable slab - shmem) and said to be an estimate.  Where PSI is there
  (``/proc/pressure/memory``), the share of the interval in which every task
  waited for memory ("full") and some did ("some") sharpen the verdict.
* ``hugepages``: explicitly reserved huge pages are taken out of the memory
  everything else may use; reserved and unused they are memory the loaders
  and the page cache cannot have.
* ``swap``: pages swapped in and out per second over the interval
  (``/proc/vmstat`` ``pswpin``/``pswpout``), and swap in use.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.agent.diagnose.result import Check

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

#: Available memory below these shares of the total: fail, warn.
AVAILABLE_FAIL_SHARE = 0.05
AVAILABLE_WARN_SHARE = 0.10
#: Share of the interval every task (full) / some task stalled on memory: fail, warn.
PSI_FULL_FAIL_SHARE = 0.10
PSI_SOME_WARN_SHARE = 0.20
#: Huge pages reserved and unused above this share of the memory: warn.
HUGEPAGES_IDLE_WARN_SHARE = 0.10
#: Pages swapped per second (in + out) at and above which the node thrashes: fail.
SWAP_FAIL_PAGES_S = 100.0
GIB = 1024**3


@dataclass(frozen=True)
class MemInfo:
    """``/proc/meminfo`` in bytes (huge pages as counts)."""

    total: int
    available: int
    #: True when ``MemAvailable`` was absent and ``available`` is the procps estimate.
    estimated: bool
    swap_total: int
    swap_free: int
    hugepages_total: int
    hugepages_free: int
    hugepages_rsvd: int
    hugepage_bytes: int


@dataclass(frozen=True)
class MemorySample:
    """One reading: meminfo, the cumulative swap counters and PSI stall totals."""

    info: MemInfo | None
    #: ``pswpin + pswpout`` (pages), None without /proc/vmstat.
    swapped_pages: int | None
    #: PSI ``some`` / ``full`` totals, µs.
    psi_some_us: int | None
    psi_full_us: int | None


@dataclass(frozen=True)
class MemoryView:
    info: MemInfo | None
    #: Pages swapped in + out per second over the interval.
    swap_pages_s: float | None
    #: Shares (0-1) of the interval some / every task stalled on memory.
    psi_some: float | None
    psi_full: float | None
    #: Why nothing could be read (no /proc/meminfo).
    error: str | None = None


def parse_meminfo(text: str) -> dict[str, int]:
    """``Key: value [kB]`` lines; kB values in bytes, unit-less ones (huge page counts) as they are."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        parts = rest.split()
        if not sep or not parts:
            continue
        try:
            value = int(parts[0])
        except ValueError:
            continue
        out[key.strip()] = value * 1024 if len(parts) > 1 and parts[1] == "kB" else value
    return out


def meminfo(fields: dict[str, int]) -> MemInfo | None:
    total = fields.get("MemTotal")
    if not total:
        return None
    available = fields.get("MemAvailable")
    estimated = available is None
    if available is None:
        available = max(
            0,
            fields.get("MemFree", 0)
            + fields.get("Buffers", 0)
            + fields.get("Cached", 0)
            + fields.get("SReclaimable", 0)
            - fields.get("Shmem", 0),
        )
    return MemInfo(
        total,
        min(available, total),
        estimated,
        fields.get("SwapTotal", 0),
        fields.get("SwapFree", 0),
        fields.get("HugePages_Total", 0),
        fields.get("HugePages_Free", 0),
        fields.get("HugePages_Rsvd", 0),
        fields.get("Hugepagesize", 0),
    )


def parse_vmstat_swapped(text: str) -> int | None:
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("pswpin", "pswpout"):
            try:
                values[parts[0]] = int(parts[1])
            except ValueError:
                return None
    return values["pswpin"] + values["pswpout"] if len(values) == 2 else None


def parse_psi(text: str) -> tuple[int | None, int | None]:
    """``some ... total=N`` and ``full ... total=N`` of a PSI file, µs."""
    some = full = None
    for line in text.splitlines():
        parts = line.split()
        total = next((p[6:] for p in parts if p.startswith("total=")), None)
        if not parts or total is None or not total.isdigit():
            continue
        if parts[0] == "some":
            some = int(total)
        elif parts[0] == "full":
            full = int(total)
    return some, full


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_memory(proc_root: Path) -> MemorySample:
    text = _read(proc_root / "meminfo")
    info = meminfo(parse_meminfo(text)) if text is not None else None
    vm = _read(proc_root / "vmstat")
    psi = _read(proc_root / "pressure" / "memory")
    some, full = parse_psi(psi) if psi is not None else (None, None)
    return MemorySample(info, parse_vmstat_swapped(vm) if vm is not None else None, some, full)


def memory_view(prev: MemorySample | None, curr: MemorySample, interval_s: float | None) -> MemoryView:
    if curr.info is None:
        return MemoryView(None, None, None, None, "no /proc/meminfo")
    swap = some = full = None
    if prev is not None and interval_s and interval_s > 0:
        if (
            prev.swapped_pages is not None
            and curr.swapped_pages is not None
            and curr.swapped_pages >= prev.swapped_pages
        ):
            swap = (curr.swapped_pages - prev.swapped_pages) / interval_s
        if (
            prev.psi_some_us is not None
            and curr.psi_some_us is not None
            and curr.psi_some_us >= prev.psi_some_us
        ):
            some = min(1.0, (curr.psi_some_us - prev.psi_some_us) / 1e6 / interval_s)
        if (
            prev.psi_full_us is not None
            and curr.psi_full_us is not None
            and curr.psi_full_us >= prev.psi_full_us
        ):
            full = min(1.0, (curr.psi_full_us - prev.psi_full_us) / 1e6 / interval_s)
    return MemoryView(curr.info, swap, some, full)


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# --------------------------------------------------------------------------- checks


def check_memory_available(view: NodeView) -> Check:
    m = view.memory
    if m is None or m.info is None:
        return Check(
            "memory_available",
            "node",
            "skipped",
            f"memory not readable: {m.error if m else 'not sampled'}",
            None,
            "%",
            "",
        )
    i = m.info
    share = i.available / i.total
    how = "estimated (no MemAvailable on this kernel)" if i.estimated else "MemAvailable"
    ev: dict[str, Any] = {
        "mem_total_bytes": i.total,
        "mem_available_bytes": i.available,
        "estimated": i.estimated,
        "psi_some_share": m.psi_some,
        "psi_full_share": m.psi_full,
        "interval_s": view.interval_s,
    }
    value = round(100 * share, 2)
    text = f"{_gib(i.available)} of {_gib(i.total)} available ({100 * share:.1f} %, {how})"
    oom = view.kernel.oom if view.kernel is not None and view.kernel.error is None else []
    if oom:
        ev["oom_killed"] = oom[-10:]
    if m.psi_full is not None and m.psi_full >= PSI_FULL_FAIL_SHARE:
        return Check(
            "memory_available",
            "node",
            "fail",
            f"every task stalled on memory {100 * m.psi_full:.0f} % of the time; {text}",
            value,
            "%",
            "the node is thrashing: lower the loaders' memory (fewer workers, smaller prefetch) or move "
            "the job to a node with more memory",
            ev,
        )
    if share < AVAILABLE_FAIL_SHARE:
        return Check(
            "memory_available",
            "node",
            "fail",
            text,
            value,
            "%",
            "memory nearly exhausted: the page cache cannot hold the data set and the OOM killer is "
            "near; reduce loader workers or prefetch, or release huge pages",
            ev,
        )
    if share < AVAILABLE_WARN_SHARE or oom or (m.psi_some is not None and m.psi_some >= PSI_SOME_WARN_SHARE):
        extra = (
            f"; some task stalled on memory {100 * m.psi_some:.0f} % of the time"
            if m.psi_some is not None and m.psi_some >= PSI_SOME_WARN_SHARE
            else ""
        )
        if oom:
            extra += f"; the OOM killer ended {len(oom)} process(es) ({', '.join(sorted(set(oom))[:3])})"
        return Check(
            "memory_available",
            "node",
            "warn",
            text + extra,
            value,
            "%",
            "little memory to spare: the data set falls out of the page cache and is re-read",
            ev,
        )
    return Check("memory_available", "node", "ok", text, value, "%", "", ev)


def check_hugepages(view: NodeView) -> Check:
    m = view.memory
    if m is None or m.info is None:
        return Check("hugepages", "node", "skipped", "memory not readable", None, "GiB", "")
    i = m.info
    if i.hugepages_total <= 0 or i.hugepage_bytes <= 0:
        return Check(
            "hugepages",
            "node",
            "ok",
            "no huge pages reserved",
            0,
            "GiB",
            "",
            {"hugepages_total": i.hugepages_total},
        )
    reserved = i.hugepages_total * i.hugepage_bytes
    idle = max(0, i.hugepages_free - i.hugepages_rsvd) * i.hugepage_bytes
    ev = {
        "hugepages_total": i.hugepages_total,
        "hugepages_free": i.hugepages_free,
        "hugepages_rsvd": i.hugepages_rsvd,
        "hugepage_bytes": i.hugepage_bytes,
        "reserved_bytes": reserved,
        "unused_bytes": idle,
    }
    text = f"{_gib(reserved)} reserved as {i.hugepages_total} huge pages, {_gib(idle)} of it unused"
    if idle >= HUGEPAGES_IDLE_WARN_SHARE * i.total:
        return Check(
            "hugepages",
            "node",
            "warn",
            text,
            round(idle / GIB, 2),
            "GiB",
            "unused huge pages are memory the loaders and the page cache cannot use: lower "
            "vm.nr_hugepages unless a job on this node needs them",
            ev,
        )
    return Check("hugepages", "node", "ok", text, round(idle / GIB, 2), "GiB", "", ev)


def check_swap(view: NodeView) -> Check:
    m = view.memory
    if m is None or m.info is None:
        return Check("swap", "node", "skipped", "memory not readable", None, "pages/s", "")
    i = m.info
    used = max(0, i.swap_total - i.swap_free)
    ev = {
        "swap_total_bytes": i.swap_total,
        "swap_used_bytes": used,
        "swap_pages_s": m.swap_pages_s,
        "interval_s": view.interval_s,
    }
    if i.swap_total == 0:
        return Check("swap", "node", "ok", "no swap configured", 0, "pages/s", "", ev)
    if m.swap_pages_s is None:
        return Check(
            "swap",
            "node",
            "unknown",
            f"{_gib(used)} of {_gib(i.swap_total)} swap in use; swap activity "
            "needs two readings of /proc/vmstat",
            None,
            "pages/s",
            "",
            ev,
        )
    rate = round(m.swap_pages_s, 2)
    text = (
        f"{m.swap_pages_s:.0f} pages/s swapped in and out, {_gib(used)} of {_gib(i.swap_total)} swap in use"
    )
    if m.swap_pages_s >= SWAP_FAIL_PAGES_S:
        return Check(
            "swap",
            "node",
            "fail",
            text,
            rate,
            "pages/s",
            "the node is swapping: every step waits on disk; free memory (fewer loader workers) or "
            "disable swap on training nodes",
            ev,
        )
    if m.swap_pages_s > 0:
        return Check(
            "swap",
            "node",
            "warn",
            text,
            rate,
            "pages/s",
            "pages are moving to and from swap: memory is short",
            ev,
        )
    return Check("swap", "node", "ok", text, rate, "pages/s", "", ev)
