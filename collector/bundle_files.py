"""The trace bundle's files (contracts.md section 1): their names, their columns, how a cell is written,
and the one way a bundle directory comes to exist.

:mod:`gpufleet.collector.bundle` reads bundles; the simulator, the nvidia-smi importer and the GPU trace
recorder write them.  The names and columns are declared here once, for the reader and every writer,
so a writer cannot drift from what the reader looks for.

The standard library alone is used (besides :mod:`gpufleet.catalog` and :mod:`gpufleet.timeparse`,
which use it alone too): ``tools/record_gpu_traces.py`` imports this module on a bare GPU machine that
has no pydantic, psycopg or numpy beyond what it brings itself.

Cells: a value with no reading is an empty cell; text is quoted as CSV quotes it; a time is RFC 3339
with a ``Z`` or epoch seconds.  How many digits a number keeps is each writer's own choice (the
simulator's fixed precisions, the importer's values as they were logged), so the helpers below offer
the forms and the writers pick.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from gpufleet.catalog import GPU_CSV_COLUMNS, HOST_CSV_COLUMNS
from gpufleet.timeparse import rfc3339_rounded

GPU_CSV = "gpu.csv"
HOST_CSV = "host.csv"
RUNS_CSV = "runs.csv"
ALLOCATIONS_CSV = "allocations.csv"
SITES_CSV = "sites.csv"
CARBON_CSV = "carbon.csv"
#: An extension: cumulative tokens and samples of each run.
PROGRESS_CSV = "progress.csv"
#: An extension: each node's facts as its agent reports them.
NODES_JSON = "nodes.json"
#: Ground truth beside a simulated or recorded bundle (``gpufleet/sim/labels.py``); no reader of the
#: bundle itself reads it.
LABELS_JSON = "labels.json"

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

#: Each CSV file's columns in the order writers write them.
COLUMNS: dict[str, tuple[str, ...]] = {
    GPU_CSV: GPU_CSV_COLUMNS,
    HOST_CSV: HOST_CSV_COLUMNS,
    RUNS_CSV: RUNS_CSV_COLUMNS,
    ALLOCATIONS_CSV: ALLOCATIONS_CSV_COLUMNS,
    SITES_CSV: SITES_CSV_COLUMNS,
    CARBON_CSV: CARBON_CSV_COLUMNS,
    PROGRESS_CSV: PROGRESS_CSV_COLUMNS,
}
#: The columns without which the reader refuses a file; the others may be left out (NULL).
REQUIRED: dict[str, tuple[str, ...]] = {
    GPU_CSV: ("time", "node", "gpu"),
    HOST_CSV: ("time", "node"),
    RUNS_CSV: ("run_id", "start"),
    ALLOCATIONS_CSV: ("run_id", "node", "gpu"),
    SITES_CSV: ("site",),
    CARBON_CSV: ("region", "time", "g_co2e_per_kwh"),
    PROGRESS_CSV: ("run_id", "time"),
}
#: The numeric columns of ``sites.csv``.
SITE_NUMERIC = ("pue", "price_per_kwh", "gpu_hour_price", "carbon_g_per_kwh")


# -- cells -------------------------------------------------------------------------------------


def rfc3339_ms(t: float, *, always_ms: bool = False) -> str:
    """Epoch seconds as RFC 3339 UTC rounded to the millisecond; the fraction only where the rounded time
    has one, unless ``always_ms``.  Rounding keeps a label written from the same float equal to the row."""
    return rfc3339_rounded(t, always_ms=always_ms)


def rfc3339_us(dt: datetime | None) -> str:
    """An aware time as RFC 3339 UTC with milliseconds, or microseconds where it has them, so a time
    read from a log to the microsecond is written as it was read; None is an empty cell."""
    if dt is None:
        return ""
    spec = "milliseconds" if dt.microsecond % 1000 == 0 else "microseconds"
    return dt.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def epoch_s(t: float) -> str:
    """Epoch seconds to the millisecond, without trailing zeros."""
    return f"{t:.3f}".rstrip("0").rstrip(".")


def number(v: float | int | None, digits: int | None = None) -> str:
    """A number as short as it is exact: an integral float without its ``.0``, other floats as Python
    prints them (after rounding to ``digits`` places, if given); True/False as 1/0.  None and a
    non-finite float (a reading the device did not give) are an empty cell, never a zero."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(int(v))
    if isinstance(v, int):
        return str(v)
    if not math.isfinite(v):
        return ""
    if digits is not None:
        v = round(v, digits)
    return str(int(v)) if v.is_integer() and abs(v) < 2**53 else repr(v)


def text(v: str | None) -> str:
    """Text quoted where CSV needs it: a comma, a quote or a line break inside.  A bare carriage return
    would end the row for the reader (it splits lines before parsing), so it is quoted too."""
    if v is None:
        return ""
    if any(ch in v for ch in ',"\n\r'):
        return '"' + v.replace('"', '""') + '"'
    return v


def cell(v: str | float | int | None) -> str:
    """A value as the ``csv`` module writes it (floats as Python prints them: ``380.0``), None and
    non-finite floats empty, text quoted by :func:`text`."""
    if v is None or isinstance(v, str):
        return text(v)
    if isinstance(v, float) and not math.isfinite(v):
        return ""
    return str(v)


def line(cells: Iterable[str]) -> str:
    """One row of already written cells."""
    return ",".join(cells) + "\n"


# -- the directory -----------------------------------------------------------------------------


def occupied(out: Path) -> bool:
    """Whether writing ``out`` would replace something: a file, or a directory with anything in it."""
    return out.exists() and (not out.is_dir() or any(out.iterdir()))


class BundleWriter:
    """Writes one bundle into a fresh directory beside ``out`` and renames it into place only when every
    file is written (and ``check`` accepted it), so a failure leaves neither a half-written bundle nor
    the temporary directory, nor any parent directory it had to create.

    What ``out`` holds already is replaced on success and kept on failure; refusing to replace it is
    the caller's decision (:func:`occupied`), made before the work that leads to writing.  Used as a
    context manager: leaving the block without an error commits, an error discards.
    """

    def __init__(self, out: Path | str, *, check: Callable[[Path], object] | None = None) -> None:
        self.out = Path(out)
        self.check = check
        self._made: list[Path] = []
        self.dir: Path | None = None

    def __enter__(self) -> BundleWriter:
        parent = self.out.parent
        while not parent.exists():
            self._made.append(parent)
            parent = parent.parent
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.dir = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", dir=self.out.parent))
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is None:
            self._commit()
        else:
            self._discard()

    def path(self, name: str) -> Path:
        """Where the file ``name`` is written, for a writer that writes it itself (labels)."""
        if self.dir is None:
            raise RuntimeError("BundleWriter used outside its with block")
        return self.dir / name

    @contextmanager
    def open_csv(self, name: str, columns: Sequence[str] | None = None) -> Iterator[IO[str]]:
        """The open file ``name`` with its header row written (the file's declared columns unless
        ``columns`` names others); rows go in as :func:`line` writes them."""
        with self.path(name).open("w", encoding="utf-8", newline="") as f:
            f.write(line(COLUMNS[name] if columns is None else columns))
            yield f

    def write_csv(
        self, name: str, rows: Iterable[Sequence[str]], columns: Sequence[str] | None = None
    ) -> None:
        """A whole CSV file of already written cells."""
        with self.open_csv(name, columns) as f:
            f.writelines(line(r) for r in rows)

    def write_json(self, name: str, doc: Any, *, sort_keys: bool = False) -> None:
        """A JSON file, one item a line (``indent=1``), values JSON has no form for written as text."""
        self.write_text(name, json.dumps(doc, indent=1, sort_keys=sort_keys, default=str) + "\n")

    def write_text(self, name: str, body: str) -> None:
        with self.path(name).open("w", encoding="utf-8", newline="") as f:
            f.write(body)

    def _commit(self) -> None:
        assert self.dir is not None
        tmp, out = self.dir, self.out
        old: Path | None = None
        try:
            if self.check is not None:
                self.check(tmp)
            if occupied(out):
                old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
                os.replace(out, old / "b")
            elif out.exists():
                out.rmdir()
            os.replace(tmp, out)
        except BaseException:
            if old is not None and not out.exists():
                os.replace(old / "b", out)
            self._discard()
            raise
        finally:
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)

    def _discard(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
        for d in self._made:
            shutil.rmtree(d, ignore_errors=True)
