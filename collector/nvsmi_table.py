"""Plain ``nvidia-smi`` screens logged in a loop, read as samples.

Many training scripts log GPU state with ``nvidia-smi -l 60 >> gpu.log`` or
``while true; do nvidia-smi; sleep 30; done``: the human table, not a CSV.
Each screen starts with the host's local time (``Sat Jan 24 21:52:14 2026``)
and has two rows per GPU::

    |   0  NVIDIA A40                     On  |   00000000:31:00.0 Off |                    0 |
    |  0%   27C    P0             24W /  300W |       0MiB /  46068MiB |      0%      Default |

The first gives the index, the model name and the PCI bus id; the second the
temperature, the power draw and cap, the memory used and total and GPU-Util.
The layout has kept these cells in this order across drivers (the column
widths change), so the rows are read by pattern, not by position.  The
process table under each screen is not read.

:func:`read_table` returns one :class:`TableSample` per GPU per screen;
:mod:`gpufleet.collector.nvsmi_import` turns them into a bundle.  A screen
whose rows do not parse is refused with the file and line, never skipped:
a log that changed shape half-way would otherwise lose samples silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path

from gpufleet.collector.bundle import BundleError

#: The time line nvidia-smi prints above each screen (C ``asctime`` form).
SCREEN_TIME = re.compile(
    r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
    r" +\d{1,2} \d{2}:\d{2}:\d{2} \d{4}"
)
_DRIVER = re.compile(r"\|\s*NVIDIA-SMI\s+\S+\s+Driver Version:\s*(\S+)")
_GPU_ROW = re.compile(
    r"\|\s+(\d+)\s+(.+?)\s+(?:On|Off)\s+\|\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s"
)
_STATE_ROW = re.compile(
    r"\|\s*(?:\d+%|N/A)\s+(\d+|N/A)C\s+(?:P\d+|N/A|\S+)\s+(\d+|N/A)W\s*/\s*(\d+|N/A)W\s*\|"
    r"\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+|N/A)%\s"
)

#: Bundle column -> the cell of the screen it comes from (for the import summary).
CELLS: dict[str, str] = {
    "util_pct": "GPU-Util",
    "power_w": "Pwr:Usage",
    "power_limit_w": "Pwr:Cap",
    "mem_used_mib": "Memory-Usage (used)",
    "mem_total_mib": "Memory-Usage (total)",
    "temp_c": "Temp",
}


@dataclass
class TableSample:
    """One GPU on one screen."""

    time: datetime
    gpu: int
    #: Bundle column -> value (None where the screen says N/A).
    values: dict[str, float | int | None]
    name: str
    pci_bus_id: str
    #: Line of the GPU's first row.
    line: int
    facts: dict[str, str] = field(default_factory=dict)


def is_table(first_line: str) -> bool:
    """Whether a log's first non-blank line is a screen's time line."""
    return SCREEN_TIME.fullmatch(first_line.strip()) is not None


def read_table(path: Path, lines: list[str], tz: tzinfo) -> list[TableSample]:
    """Every GPU row of every screen in ``lines`` (the file's lines, 1-based in errors).

    Times are the host's local time and are read in ``tz``.
    """
    out: list[TableSample] = []
    t: datetime | None = None
    driver: str | None = None
    pending: tuple[int, int, str, str] | None = None  # line, index, name, bus id of a first row
    for lineno, raw in enumerate(lines, start=1):
        s = raw.strip()
        if SCREEN_TIME.fullmatch(s):
            if pending is not None:
                raise BundleError(
                    f"{path}: line {pending[0]}: GPU {pending[1]} has no state row before the next screen"
                )
            t = datetime.strptime(s, "%a %b %d %H:%M:%S %Y").replace(tzinfo=tz)
            continue
        m = _DRIVER.match(s)
        if m:
            driver = m.group(1)
            continue
        if pending is not None:
            st = _STATE_ROW.match(s)
            if st is None:
                raise BundleError(
                    f"{path}: line {lineno}: expected the state row of GPU {pending[1]} "
                    "(fan, temperature, performance state, power usage / cap, memory usage, GPU-Util)"
                )
            if t is None:
                raise BundleError(f"{path}: line {pending[0]}: a GPU row before any screen time line")
            temp, pw, cap, used, total, util = st.groups()
            values: dict[str, float | int | None] = {
                "temp_c": _num(temp),
                "power_w": _num(pw),
                "power_limit_w": _num(cap),
                "mem_used_mib": int(used),
                "mem_total_mib": int(total),
                "util_pct": _num(util),
            }
            facts = {"name": pending[2], "pci_bus_id": pending[3]}
            if driver:
                facts["driver_version"] = driver
            out.append(TableSample(t, pending[1], values, pending[2], pending[3], pending[0], facts))
            pending = None
            continue
        g = _GPU_ROW.match(s)
        if g:
            pending = (lineno, int(g.group(1)), g.group(2).strip(), g.group(3))
    if pending is not None:
        raise BundleError(f"{path}: line {pending[0]}: GPU {pending[1]} has no state row (the file ends)")
    if not out:
        raise BundleError(f"{path}: line 1: an nvidia-smi screen log with no GPU rows")
    return out


def _num(cell: str) -> int | None:
    return None if cell == "N/A" else int(cell)
