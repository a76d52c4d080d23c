"""nvidia-smi ``--query-gpu`` CSV logs as a trace bundle (contracts.md section 1).

Most fleets keep telemetry as ``nvidia-smi --query-gpu=... --format=csv -l 1``
logs, not as bundles.  :func:`import_nvidia_smi` turns one or more such logs
into a bundle that ``gpufleet replay`` reads, so the real detectors and the
real accounting run on them.  The forms accepted are the ones found in the
wild:

* ``--format=csv``: a header such as ``timestamp, index, utilization.gpu [%],
  power.draw [W]`` and values with units (``69.85 W``, ``0 %``,
  ``81559 MiB``), sentinels (``[N/A]``, ``[Not Supported]``,
  ``[Requested functionality has been deprecated]``, MIG's ``-``), hex
  bitmasks (``0x0000000000000001``) and ``Active`` / ``Not Active``;
* ``--format=csv,noheader,nounits`` behind a header line the logging script
  wrote itself (``timestamp,memory.used,memory.total,utilization.gpu``);
* hand-rolled column names (``gpu_index``, ``temperature_C``,
  ``utilization_gpu_percent``, ``power_W``; ``gpu_usage``, ``gpu_memory_used``,
  ``gpu_power_draw``, ``gpu_temperature`` over nvidia-smi's own values with
  units, as energy-measurement datasets rename them) and bundle names themselves;
* ``--format=csv,noheader`` logs with no header line at all, given the
  ``--query-gpu`` field list as ``columns`` (the logging script's own list);
* plain ``nvidia-smi`` screens logged in a loop (``nvidia-smi -l 60 >>
  gpu.log``), recognised by the time line each screen starts with and read
  by :mod:`gpufleet.collector.nvsmi_table`.

Columns are mapped through :data:`ALIASES`, an explicit table; where several
source columns feed one bundle column the first with a value in that row wins
(``power.draw``, then ``power.draw.average``, then ``power.draw.instant``).
Columns the table does not know are ignored and named in the summary.
Lines starting with ``#`` and blank lines are skipped, as is a repeat of the
header (a logging loop that was restarted).

Times: nvidia-smi's own ``2026/07/14 08:12:38.696`` is the host's local time
without a zone and is read in ``tz`` (default UTC); ISO 8601 with an offset
or ``Z`` is taken as written, without one in ``tz``; epoch seconds as such.
nvidia-smi stamps every GPU of one query with one time, so many rows share
a time; two rows of one GPU with one time are an error.

The GPU model (a ``name`` column, or ``gpu_name``) goes to the node facts
(``nodes.json``): the detectors take the model's board power from
:mod:`gpufleet.gpu_models` where the log has no power limit, which is what
lets a plain ``power.draw,utilization.gpu`` log tell a GPU that computes from
one that spins in a collective.

Every value is checked before anything is written, and a refusal is a
:class:`gpufleet.collector.bundle.BundleError` naming the file, the line and the
column.  The bundle is written into a temporary directory beside ``out``,
read back with :func:`gpufleet.collector.bundle.read_bundle`, and only then renamed
into place, so an error leaves nothing behind.
"""

from __future__ import annotations

import csv
import itertools
import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from gpufleet.catalog import GPU_BY_NAME, GPU_CSV_NAMES, GPU_FIELDS, GPU_KEY, INT_RANGES
from gpufleet.collector.bundle import BundleError, read_bundle
from gpufleet.collector.bundle_files import (
    ALLOCATIONS_CSV,
    GPU_CSV,
    NODES_JSON,
    RUNS_CSV,
    BundleWriter,
    line,
    number,
    occupied,
    rfc3339_us,
    text,
)
from gpufleet.collector.nvsmi_table import CELLS, is_table, read_table
from gpufleet.facts import FactsError, check_facts
from gpufleet.gpu_models import board_power_w
from gpufleet.wire import NODE_RE

#: Source columns (lower case, unit suffix removed) of each bundle column, in
#: order of preference: per row, the first that has a value is used.
ALIASES: dict[str, tuple[str, ...]] = {
    "gpu": ("index", "gpu_index", "gpu.index", "gpu", "gpu_id"),
    "uuid": ("uuid", "gpu_uuid"),
    "util_pct": (
        "utilization.gpu",
        "utilization_gpu_percent",
        "utilization_gpu",
        "gpu_utilization",
        "gpu_util",
        "gpu_usage",
        "util_pct",
    ),
    "power_w": (
        "power.draw",
        "power.draw.average",
        "gpu.power.draw.average",
        "power.draw.instant",
        "gpu.power.draw.instant",
        "gpu_power_draw",
        "power_w",
        "power_draw_w",
    ),
    "power_limit_w": (
        "enforced.power.limit",
        "gpu.power.current_limit",
        "power.limit",
        "gpu.power.requested_limit",
        "power_limit_w",
    ),
    "mem_used_mib": ("memory.used", "gpu_memory_used", "memory_used_mib", "mem_used_mib"),
    "mem_total_mib": ("memory.total", "gpu_total_memory", "memory_total_mib", "mem_total_mib"),
    "temp_c": ("temperature.gpu", "gpu_temperature", "temperature_c", "temp_c"),
    "mem_temp_c": ("temperature.memory", "memory_temperature_c", "mem_temp_c"),
    "sm_clock_mhz": ("clocks.current.sm", "clocks.sm", "sm_clock_mhz"),
    "sm_clock_max_mhz": ("clocks.max.sm", "sm_clock_max_mhz"),
    "mem_clock_mhz": ("clocks.current.memory", "clocks.mem", "mem_clock_mhz"),
    "throttle_reasons": ("clocks_event_reasons.active", "clocks_throttle_reasons.active", "throttle_reasons"),
    "pcie_gen": ("pcie.link.gen.current", "pcie.link.gen.gpucurrent", "pcie_gen"),
    "pcie_gen_max": ("pcie.link.gen.max", "pcie_gen_max"),
    "pcie_width": ("pcie.link.width.current", "pcie_width"),
    "pcie_width_max": ("pcie.link.width.max", "pcie_width_max"),
    "ecc_dbe_vol": ("ecc.errors.uncorrected.volatile.total", "ecc_dbe", "ecc_dbe_vol"),
    "ecc_sbe_vol": ("ecc.errors.corrected.volatile.total", "ecc_sbe_vol"),
    "ecc_sbe_agg": ("ecc.errors.corrected.aggregate.total", "ecc_sbe_agg"),
    "ecc_dbe_agg": ("ecc.errors.uncorrected.aggregate.total", "ecc_dbe_agg"),
    "remapped_rows_correctable": ("remapped_rows.correctable", "remapped_rows_correctable"),
    "remapped_rows_uncorrectable": ("remapped_rows.uncorrectable", "remapped_rows_uncorrectable"),
    "remapped_rows_pending": ("remapped_rows.pending", "remapped_rows_pending"),
    "remapped_rows_failed": ("remapped_rows.failure", "remapped_rows_failed"),
}

#: The sample time.
TIME_COLUMNS = ("timestamp", "time")

#: Columns that describe the GPU rather than a sample: they go to the node facts.
FACT_COLUMNS: dict[str, tuple[str, ...]] = {
    "name": ("name", "gpu_name"),
    "driver_version": ("driver_version",),
    "pci_bus_id": ("pci.bus_id",),
}

#: One column per clocks-event reason (``Active`` / ``Not Active``), NVML bit
#: values (nvml.h); they make up ``throttle_reasons`` in rows without the
#: ``.active`` bitmask.
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}

#: The unit each bundle column's values are in; a value or header carrying
#: another unit is refused rather than silently mis-scaled.
UNITS: dict[str, str] = {
    "util_pct": "%",
    "power_w": "W",
    "power_limit_w": "W",
    "mem_used_mib": "MiB",
    "mem_total_mib": "MiB",
    "temp_c": "C",
    "mem_temp_c": "C",
    "sm_clock_mhz": "MHz",
    "sm_clock_max_mhz": "MHz",
    "mem_clock_mhz": "MHz",
}

#: Yes/No columns (``remapped_rows.pending``, ``remapped_rows.failure``) stored as 1/0.
FLAG_COLUMNS = frozenset({"remapped_rows_pending", "remapped_rows_failed"})
FLAG_WORDS = {"yes": 1, "no": 0, "true": 1, "false": 0, "1": 1, "0": 0}

#: Values that mean "no reading" (besides anything in square brackets).
MISSING = frozenset({"", "-", "n/a", "na", "nan", "none"})

#: Epoch seconds before this (2000-01-01) are refused: they are nearly always
#: seconds since the start of a log, which would land in 1970.
MIN_EPOCH = 946_684_800.0

#: Ignored columns named in the summary line (the summary object keeps them all).
IGNORED_SHOWN = 12

_NUMBER = re.compile(r"([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%°]*)")
_NVSMI_TIME = re.compile(r"(\d{4})/(\d{2})/(\d{2})[ T](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?")
_UNIT_SUFFIX = re.compile(r"\s*\[([^\]]*)\]\s*$")

_SOURCE_OF: dict[str, tuple[str, int]] = {
    src: (target, rank) for target, srcs in ALIASES.items() for rank, src in enumerate(srcs)
}
_FACT_OF: dict[str, str] = {src: key for key, srcs in FACT_COLUMNS.items() for src in srcs}
_INT_TARGETS = frozenset(n for n, f in GPU_BY_NAME.items() if f.kind in INT_RANGES) | {"gpu"}


@dataclass
class ImportSummary:
    """What :func:`import_nvidia_smi` wrote."""

    out: Path
    files: list[Path]
    rows: int
    gpus: list[tuple[str, int]]
    start: datetime
    end: datetime
    #: Median interval between consecutive samples of one GPU, seconds.
    median_interval_s: float | None
    #: Bundle column -> the source columns it was filled from, in preference order.
    columns: dict[str, list[str]]
    #: Source columns that map to nothing, as written in the headers.
    ignored_columns: list[str]
    #: Node -> GPU model names (from a ``name`` column or ``gpu_name``).
    gpu_models: dict[str, list[str]] = field(default_factory=dict)
    run_id: str | None = None
    run_start: datetime | None = None

    @property
    def nodes(self) -> list[str]:
        return sorted({n for n, _ in self.gpus})

    def line(self) -> str:
        """One line for a terminal."""
        span = (self.end - self.start).total_seconds()
        interval = "n/a" if self.median_interval_s is None else f"{self.median_interval_s:.3g} s"
        models = sorted({m for ms in self.gpu_models.values() for m in ms})
        model_txt = (
            "; ".join(
                f"{m} (board power {number(board_power_w(m)) + ' W' if board_power_w(m) else 'unknown'})"
                for m in models
            )
            or "unknown"
        )
        run = (
            f"run {self.run_id} from {rfc3339_us(self.run_start)}"
            if self.run_id and self.run_start
            else "no run"
        )
        n_ign = len(self.ignored_columns)
        ignored = (
            f"{n_ign} columns ignored: " + ", ".join(self.ignored_columns[:IGNORED_SHOWN])
            if n_ign
            else "no columns ignored"
        )
        if n_ign > IGNORED_SHOWN:
            ignored += f" and {n_ign - IGNORED_SHOWN} more"
        return (
            f"{self.out}: {self.rows} rows, {len(self.gpus)} GPUs on {len(self.nodes)} node(s), "
            f"{rfc3339_us(self.start)} to {rfc3339_us(self.end)} ({span:.1f} s), median interval {interval}, "
            f"GPU model {model_txt}, {run}; {ignored}"
        )


@dataclass
class _Sample:
    node: str
    t_us: int
    gpu: int
    values: dict[str, Any]
    #: ``<file>: line <n>``, and the header of its time column.
    line: str
    time_header: str


@dataclass
class _Column:
    """One source column of a file and what it feeds."""

    index: int
    header: str
    unit: str | None
    target: str | None = None
    rank: int = 0
    fact: str | None = None
    reason_bit: int | None = None
    is_time: bool = False


def parse_zone(text: str) -> tzinfo:
    """``UTC``, an IANA zone name (``Europe/Berlin``) or a fixed offset (``+02:00``, ``-0500``)."""
    s = text.strip()
    if s.upper() in ("UTC", "Z", "GMT"):
        return UTC
    m = re.fullmatch(r"(?:UTC)?([+-])(\d{1,2}):?(\d{2})?", s, flags=re.IGNORECASE)
    if m:
        minutes = int(m.group(2)) * 60 + int(m.group(3) or 0)
        if minutes >= 24 * 60:
            raise ValueError(f"time zone {text!r}: offset out of range")
        return timezone((-1 if m.group(1) == "-" else 1) * timedelta(minutes=minutes))
    try:
        return ZoneInfo(s)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"time zone {text!r}: not UTC, an offset like +02:00 or a known zone name") from None


def parse_timestamp(value: str, tz: tzinfo = UTC) -> datetime:
    """An nvidia-smi, ISO 8601 or epoch-seconds time as an aware UTC datetime
    (times without a zone are read in ``tz``).  ValueError names the forms."""
    s = value.strip()
    if not s:
        raise ValueError("empty time")
    if re.fullmatch(r"[-+]?\d+(?:\.\d*)?", s):
        f = float(s)
        if not math.isfinite(f) or f < MIN_EPOCH:
            raise ValueError(
                f"{s!r} is not epoch seconds after 2000 (seconds since the start of a log "
                "cannot be placed in time)"
            )
        return datetime.fromtimestamp(f, UTC)
    m = _NVSMI_TIME.fullmatch(s)
    try:
        if m:
            y, mo, d, h, mi, sec = (int(m.group(i)) for i in range(1, 7))
            dt = datetime(y, mo, d, h, mi, sec, int((m.group(7) or "0").ljust(6, "0")), tzinfo=tz)
        else:
            dt = datetime.fromisoformat(s[:-1] + "+00:00" if s[-1:] in "Zz" else s)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=tz)
        return dt.astimezone(UTC)
    except (ValueError, OverflowError):
        raise ValueError(
            f"{s!r}: unknown time format (expected nvidia-smi's YYYY/MM/DD HH:MM:SS.mmm, "
            "ISO 8601 or epoch seconds)"
        ) from None


def import_nvidia_smi(
    paths: Sequence[Path | str],
    out: Path | str,
    *,
    node: str | Sequence[str],
    run_id: str | None = None,
    run_start: datetime | float | None = None,
    tz: tzinfo = UTC,
    gpu_name: str | None = None,
    overwrite: bool = False,
    columns: Sequence[str] | None = None,
) -> ImportSummary:
    """Read nvidia-smi CSV logs and write them as the trace bundle ``out``.

    ``node``: one host name for every file, or one per file.  ``run_id``:
    also write ``runs.csv`` and ``allocations.csv`` for one run holding every
    GPU seen, from ``run_start`` (default: the first sample) with no end.
    ``tz``: zone of times written without one.  ``gpu_name``: the GPU model
    where the logs have no ``name`` column.  ``columns``: the ``--query-gpu``
    field list of logs written with ``--format=csv,noheader`` (no header
    line): it names the columns of every file, whose first line must then be
    data.  ``out`` must not exist or be empty unless ``overwrite``.  Raises
    :class:`BundleError`.
    """
    files = [Path(p) for p in paths]
    if not files:
        raise BundleError("no input files")
    nodes = [node] * len(files) if isinstance(node, str) else list(node)
    if len(nodes) == 1 and len(files) > 1:
        nodes = nodes * len(files)
    if len(nodes) != len(files):
        raise BundleError(
            f"{len(nodes)} node names for {len(files)} files: give one for all, or one per file"
        )
    for n in nodes:
        if not NODE_RE.fullmatch(n):
            raise BundleError(f"node {n!r}: a host name of [A-Za-z0-9._-] is required")
    if run_id is not None:
        from gpufleet.store.runs import Invalid, check_run_id

        try:
            check_run_id(run_id)
        except Invalid as e:
            raise BundleError(str(e)) from None
    elif run_start is not None:
        raise BundleError("a run start needs a run id")
    out = Path(out)
    if not overwrite and occupied(out):
        raise BundleError(f"{out}: exists and is not an empty directory")

    samples: list[_Sample] = []
    mapped: dict[str, list[str]] = {}
    ignored: list[str] = []
    facts_seen: dict[tuple[str, int], dict[str, str]] = defaultdict(dict)
    has_index = True
    for path, n in zip(files, nodes, strict=True):
        cols, has_idx = _read_file(path, n, tz, samples, facts_seen, columns)
        has_index = has_index and has_idx
        for c in sorted(cols, key=lambda c: (c.reason_bit is not None, c.rank)):
            target = "throttle_reasons" if c.reason_bit is not None else c.target
            if target is not None:
                srcs = mapped.setdefault(target, [])
                if c.header not in srcs:
                    srcs.append(c.header)
            elif c.fact is None and c.reason_bit is None and not c.is_time and c.header not in ignored:
                ignored.append(c.header)
    if not samples:
        raise BundleError(f"{', '.join(str(f) for f in files)}: no samples, only a header")

    samples.sort(key=lambda s: (s.t_us, s.node, s.gpu))
    seen: dict[tuple[str, int, int], str] = {}
    for s in samples:
        key = (s.node, s.t_us, s.gpu)
        first = seen.get(key)
        if first is not None:
            hint = (
                ""
                if has_index
                else " (no index column: add 'index' to --query-gpu when logging several GPUs)"
            )
            raise BundleError(
                f"{s.line}, column '{s.time_header}': GPU {s.gpu} of node {s.node} already has a "
                f"sample at {rfc3339_us(_dt(s.t_us))} ({first}){hint}"
            )
        seen[key] = s.line

    facts = _facts(facts_seen, samples, gpu_name)
    gpus = sorted({(s.node, s.gpu) for s in samples})
    start_us = samples[0].t_us
    rs: datetime | None = None
    if run_id is not None:
        if run_start is None:
            rs = _dt(start_us)
        elif isinstance(run_start, datetime):
            if run_start.tzinfo is None:
                run_start = run_start.replace(tzinfo=tz)
            rs = run_start.astimezone(UTC)
        else:
            rs = datetime.fromtimestamp(float(run_start), UTC)
    targets = [f.name for f in GPU_FIELDS if f.name in mapped]
    # Read back before it is renamed into place: a bundle the reader refuses is never left behind.
    with BundleWriter(out, check=read_bundle) as bundle:
        with bundle.open_csv(GPU_CSV, [*GPU_KEY, *(GPU_CSV_NAMES.get(t, t) for t in targets)]) as f:
            f.writelines(_gpu_rows(samples, targets))
        if run_id is not None and rs is not None:
            bundle.write_csv(RUNS_CSV, [[text(run_id), "", "", rfc3339_us(rs), ""]])
            bundle.write_csv(ALLOCATIONS_CSV, ([text(run_id), text(n), str(g)] for n, g in gpus))
        if facts:
            bundle.write_json(NODES_JSON, facts, sort_keys=True)

    per_gpu: dict[tuple[str, int], list[int]] = defaultdict(list)
    for s in samples:
        per_gpu[(s.node, s.gpu)].append(s.t_us)
    gaps = [(b - a) / 1e6 for ts in per_gpu.values() for a, b in itertools.pairwise(ts) if b > a]
    models = {n: sorted({g["name"] for g in f.get("gpus", []) if g.get("name")}) for n, f in facts.items()}
    return ImportSummary(
        out=out,
        files=files,
        rows=len(samples),
        gpus=gpus,
        start=_dt(start_us),
        end=_dt(samples[-1].t_us),
        median_interval_s=statistics.median(gaps) if gaps else None,
        columns={t: mapped[t] for t in ["gpu", *targets] if t in mapped},
        ignored_columns=ignored,
        gpu_models={n: m for n, m in models.items() if m},
        run_id=run_id,
        run_start=rs,
    )


# -- reading ---------------------------------------------------------------------


def _read_file(
    path: Path,
    node: str,
    tz: tzinfo,
    samples: list[_Sample],
    facts_seen: dict[tuple[str, int], dict[str, str]],
    columns: Sequence[str] | None = None,
) -> tuple[list[_Column], bool]:
    """Append the file's samples; return its columns and whether it has a GPU index."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise BundleError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise BundleError(f"{path}: is a directory, not a CSV file") from None
    except UnicodeDecodeError as e:
        raise BundleError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = [
        (i, ln)
        for i, ln in enumerate(text.splitlines(), start=1)
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    if not lines:
        raise BundleError(
            f"{path}: line 1, column 1: empty file; a header row naming the --query-gpu fields "
            "(timestamp, index, ...) is required"
        )
    if is_table(lines[0][1]):
        if columns is not None:
            raise BundleError(
                f"{path}: line {lines[0][0]}: an nvidia-smi screen log has no CSV columns to name"
            )
        return _read_table_file(path, text.splitlines(), node, tz, samples, facts_seen), True
    if columns is not None:
        head_no, header = 0, [c.strip() for c in columns]
        first, ti = _cells(lines[0][1]), _time_index(header)
        if ti >= 0 and len(first) == len(header) and not _looks_like_time(first[ti], tz):
            raise BundleError(
                f"{path}: line {lines[0][0]}: the columns were given, but this line is not data "
                "(a header line?); give columns only for --format=csv,noheader logs"
            )
        data = lines
    else:
        head_no, head_line = lines[0]
        header = _cells(head_line)
        if _looks_like_time(header[0] if header else "", tz):
            raise BundleError(
                f"{path}: line {head_no}: no header row; the first line is data (with "
                "--format=csv,noheader give the --query-gpu field list as the columns, or write it "
                "as the first line)"
            )
        data = lines[1:]
    where_head = f"line {head_no}" if head_no else "the columns given"
    cols = _columns(path, head_no, header, where_head)
    time_col = next((c for c in cols if c.is_time), None)
    if time_col is None:
        raise BundleError(
            f"{path}: {where_head}: no 'timestamp' column in the header (add timestamp to --query-gpu)"
        )
    index_col = _best(cols, "gpu")
    by_target: dict[str, list[_Column]] = defaultdict(list)
    for c in cols:
        if c.target is not None and c.target != "gpu":
            by_target[c.target].append(c)
    for lst in by_target.values():
        lst.sort(key=lambda c: c.rank)
    bits = [c for c in cols if c.reason_bit is not None]
    fact_cols = [c for c in cols if c.fact is not None]
    norm_head = [h.strip() for h in header]
    for lineno, raw in data:
        cells = _cells(raw)
        if [c.strip() for c in cells] == norm_head:
            continue  # the header again: the logging loop was restarted
        if len(cells) != len(header):
            raise BundleError(
                f"{path}: line {lineno}: {len(cells)} values, the header has {len(header)} columns"
            )

        def where(c: _Column, lineno: int = lineno) -> str:
            return f"{path}: line {lineno}, column '{c.header}'"

        tcell = cells[time_col.index].strip()
        try:
            t = parse_timestamp(tcell, tz)
        except ValueError as e:
            raise BundleError(f"{where(time_col)}: {e}") from None
        gpu = 0
        if index_col is not None:
            g = _value(where(index_col), "gpu", cells[index_col.index], index_col.unit)
            if g is None:
                raise BundleError(f"{where(index_col)}: no GPU index")
            gpu = int(g)
        values: dict[str, Any] = {}
        for target, lst in by_target.items():
            for c in lst:
                v = _value(where(c), target, cells[c.index], c.unit)
                if v is not None:
                    values[target] = v
                    break
        if bits and values.get("throttle_reasons") is None:
            mask, known = 0, False
            for c in bits:
                word = cells[c.index].strip().lower()
                if word in ("active", "not active"):
                    known = True
                    mask |= c.reason_bit if word == "active" else 0  # type: ignore[operator]
                elif not _missing(word):
                    raise BundleError(
                        f"{where(c)}: expected Active or Not Active, got {cells[c.index].strip()!r}"
                    )
            if known:
                values["throttle_reasons"] = mask
        for c in fact_cols:
            v = cells[c.index].strip()
            if not _missing(v.lower()) and c.fact is not None:
                facts_seen[(node, gpu)][c.fact] = v
        us = (t - _EPOCH) // timedelta(microseconds=1)
        samples.append(_Sample(node, us, gpu, values, f"{path}: line {lineno}", time_col.header))
    return cols, index_col is not None


def _read_table_file(
    path: Path,
    raw_lines: list[str],
    node: str,
    tz: tzinfo,
    samples: list[_Sample],
    facts_seen: dict[tuple[str, int], dict[str, str]],
) -> list[_Column]:
    """Append the samples of a log of plain nvidia-smi screens (:mod:`nvsmi_table`)."""
    for ts in read_table(path, raw_lines, tz):
        where = f"{path}: line {ts.line}"
        values: dict[str, Any] = {}
        for target, v in ts.values.items():
            if v is not None:
                values[target] = _checked(f"{where}, cell '{CELLS[target]}'", target, v)
        facts_seen[(node, ts.gpu)].update(ts.facts)
        us = (ts.time.astimezone(UTC) - _EPOCH) // timedelta(microseconds=1)
        samples.append(_Sample(node, us, ts.gpu, values, where, "time line"))
    return [_Column(i, cell, None, target=target) for i, (target, cell) in enumerate(CELLS.items())]


def _looks_like_time(cell: str, tz: tzinfo) -> bool:
    try:
        parse_timestamp(cell, tz)
    except ValueError:
        return False
    return True


def _cells(line: str) -> list[str]:
    return next(csv.reader([line], skipinitialspace=True), [])


def _base(header: str) -> str:
    return _UNIT_SUFFIX.sub("", header.strip()).strip().lower()


def _time_index(header: list[str]) -> int:
    return next((i for i, h in enumerate(header) if _base(h) in TIME_COLUMNS), -1)


def _columns(path: Path, lineno: int, header: list[str], where: str | None = None) -> list[_Column]:
    """The header's columns; ``where`` names the header in errors (default ``line <lineno>``)."""
    at = where or f"line {lineno}"
    cols = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(header):
        h = raw.strip()
        m = _UNIT_SUFFIX.search(h)
        base = _base(h)
        if not base:
            raise BundleError(f"{path}: {at}: column {i + 1} has no name")
        if base in seen:
            raise BundleError(f"{path}: {at}, column '{h}': appears twice (also '{seen[base]}')")
        seen[base] = h
        c = _Column(i, h, m.group(1).strip() if m else None)
        if base in TIME_COLUMNS:
            c.is_time = True
        elif base in _SOURCE_OF:
            c.target, c.rank = _SOURCE_OF[base]
            want = UNITS.get(c.target)
            if c.unit and want and c.unit.lower() != want.lower():
                raise BundleError(f"{path}: {at}, column '{h}': unit {c.unit!r}, expected {want!r}")
        elif base in _FACT_OF:
            c.fact = _FACT_OF[base]
        else:
            for prefix in ("clocks_event_reasons.", "clocks_throttle_reasons."):
                if base.startswith(prefix) and base[len(prefix) :] in REASON_BITS:
                    c.reason_bit = REASON_BITS[base[len(prefix) :]]
        cols.append(c)
    return cols


def _best(cols: list[_Column], target: str) -> _Column | None:
    cands = [c for c in cols if c.target == target]
    return min(cands, key=lambda c: c.rank) if cands else None


def _missing(word: str) -> bool:
    return word in MISSING or (word.startswith("[") and word.endswith("]"))


def _value(where: str, target: str, cell: str, header_unit: str | None) -> Any:
    """The cell as the bundle column's value (None: no reading)."""
    raw = cell.strip()
    if _missing(raw.lower()):
        return None
    if target == "uuid":
        return raw
    if target in FLAG_COLUMNS:
        flag = FLAG_WORDS.get(raw.lower())
        if flag is not None:
            return flag
    if target == "throttle_reasons" and raw.lower().startswith("0x"):
        try:
            v: float | int = int(raw, 16)
        except ValueError:
            raise BundleError(f"{where}: expected a hex bitmask, got {raw!r}") from None
        return _checked(where, target, v)
    m = _NUMBER.fullmatch(raw)
    if not m:
        raise BundleError(f"{where}: expected a number, got {raw!r}")
    unit = m.group(2)
    want = UNITS.get(target)
    if unit:
        allowed = {u.lower() for u in (want, header_unit) if u}
        if want == "C":
            allowed |= {"c", "°c"}
        if unit.lower() not in allowed:
            raise BundleError(f"{where}: {raw!r} is in {unit!r}, expected {want or 'no unit'!r}")
    f = float(m.group(1))
    if not math.isfinite(f):
        raise BundleError(f"{where}: {raw!r} is not a finite number")
    if target in _INT_TARGETS:
        if target == "gpu":
            if f != int(f) or not 0 <= f <= 32767:
                raise BundleError(f"{where}: expected a GPU index 0-32767, got {raw!r}")
            return int(f)
        v = round(f)
    else:
        v = f
    return _checked(where, target, v)


def _checked(where: str, target: str, v: float | int) -> float | int:
    f = GPU_BY_NAME[target]
    lo, hi = f.lo, f.hi
    if f.kind in INT_RANGES:
        ilo, ihi = INT_RANGES[f.kind]
        lo = ilo if lo is None else max(lo, ilo)
        hi = ihi if hi is None else min(hi, ihi)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"{number(lo) if lo is not None else ''}..{number(hi) if hi is not None else ''}"
        raise BundleError(f"{where}: {number(v)} is outside {rng} for {target}")
    return v


# -- facts -----------------------------------------------------------------------


def _facts(
    seen: dict[tuple[str, int], dict[str, str]], samples: list[_Sample], gpu_name: str | None
) -> dict[str, dict[str, Any]]:
    """Node facts (gpufleet.facts schema) where a GPU model is known."""
    gpus_of: dict[str, set[int]] = defaultdict(set)
    uuids: dict[tuple[str, int], str] = {}
    for s in samples:
        gpus_of[s.node].add(s.gpu)
        if s.values.get("uuid"):
            uuids[(s.node, s.gpu)] = s.values["uuid"]
    out: dict[str, dict[str, Any]] = {}
    for node, gpus in sorted(gpus_of.items()):
        entries = []
        for g in sorted(gpus):
            f = seen.get((node, g), {})
            name = f.get("name")
            if gpu_name and name and name != gpu_name:
                raise BundleError(f"GPU {g} of node {node}: the logs name it {name!r}, not {gpu_name!r}")
            entry: dict[str, Any] = {"gpu": g, "name": name or gpu_name}
            if f.get("pci_bus_id"):
                entry["pci_bus_id"] = f["pci_bus_id"]
            uuid = uuids.get((node, g))
            if uuid:
                entry["uuid"] = uuid
            entries.append(entry)
        names = {e["name"] for e in entries if e["name"]}
        if not names:
            continue
        facts: dict[str, Any] = {
            "gpu_count": len(gpus),
            "gpus": [{k: v for k, v in e.items() if v is not None} for e in entries],
        }
        if len(names) == 1:
            facts["gpu_model"] = names.pop()
        drivers = {seen.get((node, g), {}).get("driver_version") for g in gpus} - {None}
        if len(drivers) == 1:
            facts["driver_version"] = drivers.pop()
        try:
            check_facts(facts)
        except FactsError as e:
            raise BundleError(
                f"node {node}: facts field {'.'.join(str(x) for x in e.loc)}: {e.msg}"
            ) from None
        out[node] = facts
    return out


# -- writing ---------------------------------------------------------------------


def _gpu_rows(samples: list[_Sample], targets: list[str]) -> Iterator[str]:
    """The samples as gpu.csv rows: values as they were logged, the time to the microsecond it has."""
    for s in samples:
        cells = [rfc3339_us(_dt(s.t_us)), text(s.node), str(s.gpu)]
        for t in targets:
            v = s.values.get(t)
            cells.append(text(v) if isinstance(v, str) else number(v))
        yield line(cells)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _dt(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)
