"""One explanation per lost GPU-second: when two kinds claim the same seconds, one rule decides.

Detectors judge independently, and some patterns fit more than one reading: a
checkpoint pause is also an oscillation to the starvation detector, a
checkpoint's writer rank is a GPU its peers wait on, a hung job's dead rank
idles.  A person paged twice for one pause, or for the wrong cause, stops
trusting both.  After every sweep the findings pass through :func:`arbitrate`,
which keeps, of the findings of one run that claim the same seconds, the one
:mod:`gpufleet.waste` ranks first (the same order the accounting ledger puts
each second in):

* a run-scoped finding claims every GPU of its run; ``idle_allocation`` of
  some GPUs claims those; a GPU-scoped finding claims its GPU, except that a
  straggler's lost seconds are its peers' waits, never a throttled GPU's own;
* ``checkpoint_stall`` claims, besides its run's time, its writer and blocking
  ranks as GPUs: a straggler found on them is the checkpoint's;
* two findings claim the same seconds when their spans (start to last active)
  overlap.

Findings of kinds that are causes rather than states of time (PCIe, NVLink,
GPU memory, host settings) are never dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufleet.collector.detectors.window import Finding, GpuKey
from gpufleet.waste import outranks, rank

_ALL = "*"


def _gpus(f: Finding) -> set[GpuKey] | str:
    """The GPUs a finding claims (``"*"``: every GPU of its run)."""
    ev: dict[str, Any] = dict(f.evidence) if isinstance(f.evidence, dict) else {}
    if f.kind == "idle_allocation" and ev.get("scope") == "some":
        return {(g["node"], int(g["gpu"])) for g in ev.get("gpus", []) if isinstance(g, dict)}
    if f.gpu is not None and f.node is not None:
        return {(f.node, int(f.gpu))}
    listed = ev.get("gpus")
    if f.kind == "throttling" and isinstance(listed, list):
        return {
            (g["node"], int(g["gpu"])) for g in listed if isinstance(g, dict) and g.get("gpu") is not None
        }
    return _ALL


def _named_ranks(f: Finding) -> set[GpuKey]:
    """Ranks a checkpoint finding names (its writer and blocking GPUs, ``node/gpu``)."""
    ev: dict[str, Any] = dict(f.evidence) if isinstance(f.evidence, dict) else {}
    names: list[object] = [ev.get("writer_gpu"), *(ev.get("blocking_gpus") or [])]
    out: set[GpuKey] = set()
    for n in names:
        if isinstance(n, str) and "/" in n:
            node, _, gpu = n.rpartition("/")
            if gpu.isdigit():
                out.add((node, int(gpu)))
    return out


def _span(f: Finding, now: float) -> tuple[float, float]:
    return f.start, f.last_active if f.last_active is not None else now


def _claims_same(hi: Finding, lo: Finding, now: float) -> bool:
    a0, a1 = _span(hi, now)
    b0, b1 = _span(lo, now)
    if a0 > b1 or b0 > a1:
        return False
    g_hi, g_lo = _gpus(hi), _gpus(lo)
    if hi.kind == "straggler" and lo.kind == "throttling":
        # A straggler's lost seconds are its peers' waits; a throttled GPU's are its own slow clocks.
        return False
    if hi.kind == "checkpoint_stall" and lo.kind == "straggler":
        # A checkpoint's run-wide claim is its pauses; of its GPUs, only its writer looks like a straggler.
        return isinstance(g_lo, set) and bool(g_lo & _named_ranks(hi))
    if g_hi == _ALL or g_lo == _ALL:
        return True
    assert isinstance(g_hi, set) and isinstance(g_lo, set)
    return bool(g_hi & g_lo)


def arbitrate(findings: Sequence[Finding], now: float) -> list[Finding]:
    """``findings`` without those another finding of the same run explains first (see the module doc)."""
    by_run: dict[str, list[Finding]] = {}
    for f in findings:
        if f.run_id is not None and rank(f.kind) is not None:
            by_run.setdefault(f.run_id, []).append(f)
    dropped: set[int] = set()
    for group in by_run.values():
        if len({f.kind for f in group}) < 2:
            continue
        for lo in group:
            if any(outranks(hi.kind, lo.kind) and _claims_same(hi, lo, now) for hi in group if hi is not lo):
                dropped.add(id(lo))
    return [f for f in findings if id(f) not in dropped]
