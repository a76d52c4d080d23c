"""Small files on the checklist: how a data set's file sizes set the file rate its reader needs.

A loader reading one small file per sample from a network file system is
held back by opens and metadata round trips, not bandwidth.  ``gpufleet
diagnose --dataset PATH`` samples the data set without walking a whole file
system: a breadth-first listing stopped at ``max_entries`` entries or
``max_s`` seconds (the count is then a lower bound and says so), file sizes
from that listing, and a timed open-and-read of a random handful of the
files listed.  From these: the files per second a reader must open to
deliver ``target_bytes_s`` (files/s = target ÷ mean file size), the files
per second one reader manages (1 ÷ time per file), and so how many readers in
parallel the data set needs.  Files read again may come from the page cache
and look faster than the storage is; the evidence says how many were read.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.agent.diagnose.result import Check, skipped

if TYPE_CHECKING:
    from gpufleet.agent.diagnose.view import NodeView

#: Bounds of one sample: entries listed, seconds spent listing, files read, bytes read per file.
MAX_ENTRIES = 20_000
MAX_LIST_S = 5.0
READ_FILES = 32
READ_BYTES = 4 * 1024 * 1024
#: What the reader is asked to deliver by default, bytes/s (one node's loader of a typical training job).
TARGET_BYTES_S = 1e9
#: Median file size below which the data set is "small files", bytes.
SMALL_FILE_BYTES = 256 * 1024
#: Readers in parallel a loader can reasonably run: beyond the first, warn; beyond the second, fail.
READERS_WARN = 8
READERS_FAIL = 32


@dataclass
class DatasetSample:
    path: str
    files: int = 0
    dirs: int = 0
    #: The listing stopped at a bound: ``files`` is a lower bound.
    truncated: bool = False
    listing_s: float = 0.0
    median_bytes: float | None = None
    mean_bytes: float | None = None
    total_listed_bytes: int = 0
    #: Seconds to open and read each sampled file.
    read_s: list[float] = field(default_factory=list)
    read_bytes: int = 0
    fs_type: str | None = None
    error: str | None = None
    target_bytes_s: float = TARGET_BYTES_S


def fs_type_of(path: Path, mounts: Path = Path("/proc/self/mounts")) -> str | None:
    """File system type of the mount holding ``path`` (longest mount point that is a prefix)."""
    try:
        text = mounts.read_text()
    except OSError:
        return None
    best, kind = "", None
    target = str(path.resolve())
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mp = parts[1].replace("\\040", " ")
        if (target == mp or target.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best):
            best, kind = mp, parts[2]
    return kind


def sample_dataset(
    path: Path,
    max_entries: int = MAX_ENTRIES,
    max_s: float = MAX_LIST_S,
    read_files: int = READ_FILES,
    target_bytes_s: float = TARGET_BYTES_S,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    mounts: Path = Path("/proc/self/mounts"),
) -> DatasetSample:
    s = DatasetSample(str(path), target_bytes_s=target_bytes_s)
    if not path.exists():
        s.error = f"{path} does not exist"
        return s
    s.fs_type = fs_type_of(path, mounts)
    rng = rng or random.Random()
    sizes: list[int] = []
    picked: list[Path] = []
    t0 = clock()
    queue: deque[Path] = deque([path] if path.is_dir() else [])
    if path.is_file():
        sizes.append(path.stat().st_size)
        picked.append(path)
    seen = 0
    while queue:
        if seen >= max_entries or clock() - t0 >= max_s:
            s.truncated = True
            break
        d = queue.popleft()
        try:
            it = os.scandir(d)
        except OSError as e:
            if d == path:
                s.error = f"cannot list {path}: {e.strerror}"
                return s
            continue
        with it:
            for entry in it:
                seen += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        s.dirs += 1
                        queue.append(Path(entry.path))
                    elif entry.is_file(follow_symlinks=False):
                        size = entry.stat(follow_symlinks=False).st_size
                        sizes.append(size)
                        # Reservoir sampling: every file listed is equally likely to be read.
                        if len(picked) < read_files:
                            picked.append(Path(entry.path))
                        else:
                            j = rng.randrange(len(sizes))
                            if j < read_files:
                                picked[j] = Path(entry.path)
                except OSError:
                    continue
                if seen >= max_entries:
                    break
    s.listing_s = clock() - t0
    s.files = len(sizes)
    if not sizes:
        return s
    s.median_bytes = float(statistics.median(sizes))
    s.mean_bytes = sum(sizes) / len(sizes)
    s.total_listed_bytes = sum(sizes)
    for f in picked:
        start = clock()
        try:
            with open(f, "rb") as fh:
                n = len(fh.read(READ_BYTES))
        except OSError:
            continue
        s.read_s.append(clock() - start)
        s.read_bytes += n
    return s


def check_dataset(view: NodeView) -> Check:
    d = view.dataset
    if d is None:
        return skipped(
            "small_files", "dataset", "no data set given (gpufleet diagnose --dataset PATH)", "files/s"
        )
    if d.error is not None:
        return Check("small_files", d.path, "unknown", d.error, None, "files/s", "")
    ev: dict[str, Any] = {
        "files": d.files,
        "dirs": d.dirs,
        "truncated": d.truncated,
        "listing_s": d.listing_s,
        "median_bytes": d.median_bytes,
        "mean_bytes": d.mean_bytes,
        "fs_type": d.fs_type,
        "files_read": len(d.read_s),
        "read_bytes": d.read_bytes,
        "target_bytes_s": d.target_bytes_s,
    }
    if not d.files or d.mean_bytes is None or d.median_bytes is None:
        return Check("small_files", d.path, "unknown", f"no files under {d.path}", None, "files/s", "", ev)
    count = f"{'at least ' if d.truncated else ''}{d.files:,} files"
    needed = d.target_bytes_s / max(d.mean_bytes, 1.0)
    ev["files_s_needed"] = needed
    per_file = statistics.median(d.read_s) if d.read_s else None
    ev["read_s_median"] = per_file
    per_reader = 1.0 / per_file if per_file else None
    ev["files_s_per_reader"] = per_reader
    readers = needed / per_reader if per_reader else None
    ev["readers_needed"] = readers
    on = f" on {d.fs_type}" if d.fs_type else ""
    text = (
        f"{count}{on}, median {d.median_bytes / 1024:.0f} KiB: {needed:,.0f} files/s to read "
        f"{d.target_bytes_s / 1e6:.0f} MB/s"
    )
    if per_reader is not None and readers is not None:
        text += f"; one reader opens {per_reader:,.0f} files/s ({readers:.1f} readers needed)"
    value = round(needed, 1)
    small = d.median_bytes < SMALL_FILE_BYTES
    if readers is not None and readers > READERS_FAIL:
        return Check(
            "small_files",
            d.path,
            "fail",
            text,
            value,
            "files/s",
            "the per-file cost caps the loader: pack the data set into large shards (WebDataset tar, "
            "TFRecord, Parquet) or stage it on local NVMe",
            ev,
        )
    if (readers is not None and readers > READERS_WARN) or small:
        return Check(
            "small_files",
            d.path,
            "warn",
            text,
            value,
            "files/s",
            "small files: give the loader enough parallel readers (num_workers) or pack the data set "
            "into shards",
            ev,
        )
    return Check("small_files", d.path, "ok", text, value, "files/s", "", ev)
