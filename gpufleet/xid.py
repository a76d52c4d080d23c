"""What an XID code means, and what an operator does about it.

The NVIDIA driver logs an XID (``NVRM: Xid (PCI:...): <code>, ...``) for every
error it handles; NVML and DCGM deliver the code, not its meaning, so an
incident that says "XID 63" leaves the reader to look it up.  This table
holds the codes a datacenter fleet (Ampere, Hopper, Blackwell) actually sees,
summarised from NVIDIA's XID catalog in gpufleet's own words, with the kind
of cause and the first action.  A code not listed is reported as unknown,
never guessed.

``action`` is the first thing to do: ``restart_app`` (the job's own fault; the
GPU is fine), ``reset_gpu`` (clear the GPU's state: a pending row remap, a
firmware hang), ``drain_node`` (hardware to inspect or replace: keep jobs off
the node).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from gpufleet.evidence import XidMeaning

Cause = Literal["application", "driver", "firmware", "memory", "interconnect", "hardware"]
Action = Literal["restart_app", "reset_gpu", "drain_node"]


@dataclass(frozen=True)
class XidInfo:
    code: int
    name: str
    meaning: str
    cause: Cause
    action: Action

    def short(self) -> str:
        return f"XID {self.code}: {self.name}"


_TABLE: tuple[XidInfo, ...] = (
    XidInfo(
        8,
        "GPU stopped processing",
        "a channel made no progress before the driver's timeout; usually a hung or looping kernel",
        "application",
        "restart_app",
    ),
    XidInfo(
        13,
        "graphics engine exception",
        "a kernel faulted (illegal instruction, out-of-range access); nearly always the application, "
        "rarely the driver or the board",
        "application",
        "restart_app",
    ),
    XidInfo(
        31,
        "GPU memory page fault",
        "a kernel touched an address its context had not mapped; an application bug in almost every case",
        "application",
        "restart_app",
    ),
    XidInfo(
        32,
        "invalid or corrupted push buffer stream",
        "the command stream the GPU read was damaged; points at the PCIe path or host memory as much as "
        "at the driver",
        "hardware",
        "drain_node",
    ),
    XidInfo(
        38,
        "driver firmware error",
        "the driver found its firmware in an unexpected state",
        "firmware",
        "reset_gpu",
    ),
    XidInfo(
        43,
        "GPU stopped processing (reset channel)",
        "the driver reset a channel after a fault of the application's own; the GPU itself stays healthy",
        "application",
        "restart_app",
    ),
    XidInfo(
        45,
        "preemptive cleanup after earlier errors",
        "the driver tore down a channel because its process died or another XID came first; look at the "
        "XID before it",
        "driver",
        "restart_app",
    ),
    XidInfo(
        48,
        "double-bit ECC error",
        "an uncorrectable memory error; work using that memory is killed, the row is remapped at the next "
        "GPU reset",
        "memory",
        "reset_gpu",
    ),
    XidInfo(
        61,
        "internal micro-controller warning",
        "the GPU's power-management controller hit a breakpoint or warning; harmless once, a reset if it "
        "repeats",
        "firmware",
        "reset_gpu",
    ),
    XidInfo(
        62,
        "internal micro-controller halt",
        "the GPU's power-management controller stopped; the GPU needs a reset",
        "firmware",
        "reset_gpu",
    ),
    XidInfo(
        63,
        "row remap or page retirement recorded",
        "a faulty memory row was marked for replacement; it takes effect at the next GPU reset (pending "
        "until then)",
        "memory",
        "reset_gpu",
    ),
    XidInfo(
        64,
        "row remap or page retirement failed",
        "a faulty row could not be replaced (no spare left, or the record could not be written); the memory "
        "is no longer protected",
        "memory",
        "drain_node",
    ),
    XidInfo(
        68,
        "video decoder exception",
        "the NVDEC engine faulted; the stream or the application, rarely the board",
        "application",
        "restart_app",
    ),
    XidInfo(
        69,
        "graphics engine class error",
        "the GPU rejected a command it did not accept; application or driver",
        "application",
        "restart_app",
    ),
    XidInfo(
        74,
        "NVLink error",
        "an NVLink link took a fatal error (training, CRC or replay limit); collectives "
        "over it fail or fall back to PCIe",
        "interconnect",
        "drain_node",
    ),
    XidInfo(
        79,
        "GPU has fallen off the bus",
        "the GPU stopped answering on PCIe (power, riser, board); nothing on it runs until the node is "
        "power-cycled and inspected",
        "hardware",
        "drain_node",
    ),
    XidInfo(
        92,
        "high single-bit ECC error rate",
        "correctable memory errors above the driver's threshold: the memory is degrading",
        "memory",
        "drain_node",
    ),
    XidInfo(
        94,
        "contained ECC error",
        "an uncorrectable memory error that only the affected applications saw; the others go on, a GPU "
        "reset remaps the row",
        "memory",
        "reset_gpu",
    ),
    XidInfo(
        95,
        "uncontained ECC error",
        "an uncorrectable memory error that may have reached every application on the GPU; the GPU must be "
        "reset",
        "memory",
        "reset_gpu",
    ),
    XidInfo(
        109,
        "context switch timeout",
        "the GPU did not switch between contexts in time; a hung kernel, or a driver problem if it repeats",
        "driver",
        "restart_app",
    ),
    XidInfo(
        119,
        "GSP RPC timeout",
        "the GPU System Processor firmware did not answer the driver; reset the "
        "GPU, reboot if it does not come back",
        "firmware",
        "reset_gpu",
    ),
    XidInfo(
        120,
        "GSP error",
        "the GPU System Processor firmware reported an error of its own",
        "firmware",
        "reset_gpu",
    ),
    XidInfo(
        154,
        "GPU recovery action changed",
        "the driver now requires a recovery step (GPU reset, node reboot or drain) before the GPU is used "
        "again",
        "driver",
        "drain_node",
    ),
)

XIDS: dict[int, XidInfo] = {x.code: x for x in _TABLE}


def describe(code: int) -> XidInfo | None:
    """The table entry of ``code``, or None for a code gpufleet does not know."""
    return XIDS.get(int(code))


def label(code: int) -> str:
    """``"XID 48: double-bit ECC error"``, or ``"XID 200: not in gpufleet's table"``."""
    info = describe(code)
    return info.short() if info else f"XID {int(code)}: not in gpufleet's table (see NVIDIA's XID catalog)"


def meanings(codes: Iterable[int]) -> dict[str, XidMeaning]:
    """Evidence entries for ``codes``: name, meaning, cause and first action per code."""
    out: dict[str, XidMeaning] = {}
    for c in sorted({int(x) for x in codes}):
        info = describe(c)
        out[str(c)] = (
            {"name": info.name, "meaning": info.meaning, "cause": info.cause, "action": info.action}
            if info
            else {"name": "unknown", "meaning": "not in gpufleet's table (see NVIDIA's XID catalog)"}
        )
    return out


def hardware(code: int) -> bool:
    """True when the code points at the board, its memory or its links (not the job)."""
    info = describe(code)
    return info is not None and info.cause in ("memory", "interconnect", "hardware")
