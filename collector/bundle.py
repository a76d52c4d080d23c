"""Reading trace bundles (contracts.md section 1) into validated batches.

Everything is parsed and checked before anything is written, so a malformed
bundle fails with its file, line and column named and leaves nothing behind.
Samples go through :func:`gpufleet.wire.validate`, the collector's own
ingest validation, so a bundle is held to exactly what an agent would be.
File names and required columns come from :mod:`gpufleet.collector.bundle_files`,
which every writer of bundles writes them with.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.catalog import GPU_ALIASES, GPU_BY_NAME, HOST_BY_NAME, INT_RANGES
from gpufleet.collector.bundle_files import (
    ALLOCATIONS_CSV,
    CARBON_CSV,
    GPU_CSV,
    HOST_CSV,
    NODES_JSON,
    PROGRESS_CSV,
    REQUIRED,
    RUNS_CSV,
    SITE_NUMERIC,
    SITES_CSV,
)
from gpufleet.store.runs import RUN_ID_RE
from gpufleet.timeparse import TimeParseError, parse_time
from gpufleet.wire import Batch, WireError, validate

BATCH_ROWS = 20_000


class BundleError(ValueError):
    """The bundle is malformed; the message names the file, line and column."""


@dataclass
class Bundle:
    batches: list[Batch] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    allocations: list[tuple[str, str, int]] = field(default_factory=list)
    sites: list[dict[str, Any]] = field(default_factory=list)
    carbon: dict[str, list[tuple[Any, float]]] = field(default_factory=dict)
    #: Optional ``progress.csv``: (run_id, time, tokens, samples), cumulative.
    progress: list[tuple[str, Any, float | None, float | None]] = field(default_factory=list)
    #: Optional ``nodes.json``: node facts as agents report them.
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    t_min: float = math.inf
    t_max: float = -math.inf
    gpu_rows: int = 0
    host_rows: int = 0


def _rows(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise BundleError(f"{path.name}: not UTF-8 text ({e})") from None
    reader = csv.DictReader(text.splitlines())
    if reader.fieldnames is None:
        raise BundleError(f"{path.name}: line 1: empty file, a header row is required")
    header = [h.strip() for h in reader.fieldnames]
    rows = []
    for lineno, raw in enumerate(reader, start=2):
        if None in raw:
            raise BundleError(f"{path.name}: line {lineno}: more values than header columns")
        row = {(k or "").strip(): (v or "").strip() for k, v in raw.items()}
        rows.append((lineno, row))
    return header, rows


def _require(path: Path, header: list[str], cols: tuple[str, ...]) -> None:
    missing = [c for c in cols if c not in header]
    if missing:
        raise BundleError(f"{path.name}: line 1: missing required column(s) {', '.join(missing)}")


def _time(path: Path, lineno: int, col: str, value: str) -> float:
    try:
        return parse_time(value).timestamp()
    except TimeParseError as e:
        raise BundleError(f"{path.name}: line {lineno}, column '{col}': {e}") from None


def _number(path: Path, lineno: int, col: str, value: str, integer: bool) -> float | int | None:
    if value == "":
        return None
    try:
        if integer:
            f = float(value)
            if not math.isfinite(f) or f != int(f):
                raise ValueError
            return int(f) if abs(f) < 2**53 else int(value)
        f = float(value)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise BundleError(
            f"{path.name}: line {lineno}, column '{col}': expected {kind}, got {value!r}"
        ) from None
    if not math.isfinite(f):
        raise BundleError(
            f"{path.name}: line {lineno}, column '{col}': {value!r} is not allowed (leave it empty)"
        )
    return f


def _samples(path: Path, gpu: bool, bundle: Bundle) -> None:
    header, rows = _rows(path)
    _require(path, header, REQUIRED[GPU_CSV if gpu else HOST_CSV])
    catalog = GPU_BY_NAME if gpu else HOST_BY_NAME
    # contracts.md names the volatile DBE counter ``ecc_dbe``; the catalog calls it ecc_dbe_vol.
    rename = {old: new for old, new in GPU_ALIASES.items() if gpu and old in header}
    both = [old for old, new in rename.items() if new in header]
    if both:
        raise BundleError(
            f"{path.name}: line 1: columns {both[0]!r} and {rename[both[0]]!r} are one counter "
            "under its old and new name: keep one"
        )
    known = [c for c in header if c in catalog or c in rename]
    by_node: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for lineno, row in rows:
        node = row["node"]
        if not node:
            raise BundleError(f"{path.name}: line {lineno}, column 'node': empty")
        rec: dict[str, Any] = {"time": _time(path, lineno, "time", row["time"])}
        if gpu:
            g = _number(path, lineno, "gpu", row["gpu"], True)
            if g is None:
                raise BundleError(f"{path.name}: line {lineno}, column 'gpu': empty")
            rec["gpu"] = g
        for c in known:
            f = catalog[rename.get(c, c)]
            v = row[c]
            rec[f.name] = (
                (v or None) if f.kind == "text" else _number(path, lineno, c, v, f.kind in INT_RANGES)
            )
        by_node[node].append((lineno, rec))
    section = "gpu" if gpu else "host"
    for node, recs in sorted(by_node.items()):
        for k in range(0, len(recs), BATCH_ROWS):
            chunk = recs[k : k + BATCH_ROWS]
            cols: dict[str, list[Any]] = {c: [r[c] for _, r in chunk] for c in chunk[0][1]}
            doc = {"batch_id": f"bundle:{section}:{node}:{k}", "node": node, section: cols}
            try:
                batch = validate(doc)
            except WireError as e:
                where = ""
                if len(e.loc) >= 3 and isinstance(e.loc[1], int):
                    where = f"line {chunk[e.loc[1]][0]}, column '{e.loc[2]}': "
                elif len(e.loc) >= 2:
                    where = f"column '{e.loc[1]}': "
                raise BundleError(f"{path.name}: {where}{e.msg}") from None
            bundle.batches.append(batch)
            ts = [r["time"] for _, r in chunk]
            bundle.t_min = min(bundle.t_min, min(ts))
            bundle.t_max = max(bundle.t_max, max(ts))
            if gpu:
                bundle.gpu_rows += len(chunk)
            else:
                bundle.host_rows += len(chunk)


def read_bundle(directory: Path) -> Bundle:
    """Parse and validate a whole bundle directory."""
    d = Path(directory)
    if not d.is_dir():
        raise BundleError(f"{d}: not a directory")
    if not (d / GPU_CSV).is_file():
        raise BundleError(f"{d}: {GPU_CSV} is missing (it is the one required file)")
    b = Bundle()
    _samples(d / GPU_CSV, True, b)
    if (d / HOST_CSV).is_file():
        _samples(d / HOST_CSV, False, b)
    if (d / SITES_CSV).is_file():
        p = d / SITES_CSV
        header, rows = _rows(p)
        _require(p, header, REQUIRED[SITES_CSV])
        for lineno, row in rows:
            site: dict[str, Any] = {"site": row["site"]}
            for c in SITE_NUMERIC:
                site[c] = _number(p, lineno, c, row.get(c, ""), False)
            if site["pue"] is not None and site["pue"] < 1.0:
                raise BundleError(f"{p.name}: line {lineno}, column 'pue': {site['pue']} is below 1")
            site["currency"] = row.get("currency") or "USD"
            site["carbon_region"] = row.get("carbon_region") or None
            b.sites.append(site)
    known_sites = {s["site"] for s in b.sites}
    if (d / RUNS_CSV).is_file():
        p = d / RUNS_CSV
        header, rows = _rows(p)
        _require(p, header, REQUIRED[RUNS_CSV])
        for lineno, row in rows:
            if not row["run_id"]:
                raise BundleError(f"{p.name}: line {lineno}, column 'run_id': empty")
            if not RUN_ID_RE.fullmatch(row["run_id"]):
                raise BundleError(
                    f"{p.name}: line {lineno}, column 'run_id': {row['run_id']!r} must match "
                    f"{RUN_ID_RE.pattern} (one path segment of /v1/runs/{{run_id}}: no '/')"
                )
            site_name = row.get("site") or None
            if site_name and site_name not in known_sites:
                raise BundleError(
                    f"{p.name}: line {lineno}, column 'site': {site_name!r} is not in sites.csv"
                )
            start = _time(p, lineno, "start", row["start"])
            end = _time(p, lineno, "end", row["end"]) if row.get("end") else None
            if end is not None and end < start:
                raise BundleError(f"{p.name}: line {lineno}, column 'end': before start")
            b.runs.append(
                {
                    "run_id": row["run_id"],
                    "name": row.get("name") or None,
                    "site": site_name,
                    "start": start,
                    "end": end,
                }
            )
    run_ids = {r["run_id"] for r in b.runs}
    if (d / ALLOCATIONS_CSV).is_file():
        p = d / ALLOCATIONS_CSV
        header, rows = _rows(p)
        _require(p, header, REQUIRED[ALLOCATIONS_CSV])
        for lineno, row in rows:
            if row["run_id"] not in run_ids:
                raise BundleError(
                    f"{p.name}: line {lineno}, column 'run_id': {row['run_id']!r} is not in runs.csv"
                )
            g = _number(p, lineno, "gpu", row["gpu"], True)
            if g is None or not (0 <= g <= 32767):
                raise BundleError(f"{p.name}: line {lineno}, column 'gpu': expected a GPU index")
            b.allocations.append((row["run_id"], row["node"], int(g)))
    if (d / CARBON_CSV).is_file():
        p = d / CARBON_CSV
        header, rows = _rows(p)
        _require(p, header, REQUIRED[CARBON_CSV])
        for lineno, row in rows:
            t = parse_time(str(_time(p, lineno, "time", row["time"])))
            g = _number(p, lineno, "g_co2e_per_kwh", row["g_co2e_per_kwh"], False)
            if g is None or g < 0:
                raise BundleError(
                    f"{p.name}: line {lineno}, column 'g_co2e_per_kwh': expected a non-negative number"
                )
            b.carbon.setdefault(row["region"], []).append((t, float(g)))
    if (d / PROGRESS_CSV).is_file():
        p = d / PROGRESS_CSV
        header, rows = _rows(p)
        _require(p, header, REQUIRED[PROGRESS_CSV])
        for lineno, row in rows:
            if row["run_id"] not in run_ids:
                raise BundleError(
                    f"{p.name}: line {lineno}, column 'run_id': {row['run_id']!r} is not in runs.csv"
                )
            t = parse_time(str(_time(p, lineno, "time", row["time"])))
            tokens = _number(p, lineno, "tokens", row.get("tokens", ""), False)
            samples = _number(p, lineno, "samples", row.get("samples", ""), False)
            b.progress.append((row["run_id"], t, tokens, samples))
    if (d / NODES_JSON).is_file():
        try:
            facts = json.loads((d / NODES_JSON).read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as e:
            raise BundleError(f"{NODES_JSON}: not valid JSON: {e}") from None
        if not isinstance(facts, dict) or not all(isinstance(v, dict) for v in facts.values()):
            raise BundleError(f"{NODES_JSON}: must be an object mapping node names to fact objects")
        b.facts = facts
    if b.gpu_rows == 0:
        raise BundleError(f"{d / GPU_CSV}: no samples")
    return b
