"""docs/contracts.md section 1: the trace bundle's files and columns, as a reader outside the project writes them.

Every column the document lists is read, under its documented name, into the column the detectors and the
accounting read, in its documented unit; times are RFC 3339 with an offset or epoch seconds; unknown columns are
ignored and a missing optional one is NULL; a malformed file is named with its line and column.
"""

from __future__ import annotations

import csv
from pathlib import Path

import psycopg
import pytest

from gpufleet.accounting import run_accounting
from gpufleet.catalog import GPU_ALIASES, GPU_BY_NAME, HOST_BY_NAME
from gpufleet.collector.bundle import BundleError, read_bundle
from gpufleet.collector.replay import load
from tests.contracts import docs

T0 = 1796119200.0  # 2026-12-01T10:00:00Z
KEYS = ("time", "node", "gpu")


def documented(file: str) -> list[str]:
    rows = docs.table(docs.section("1. Trace bundle"), f"`{file}`")
    return [n for row in rows for n in docs.names(row[0])]


def files_and_columns() -> dict[str, list[str]]:
    """The small files' columns as the section lists them (``runs.csv``: ``run_id, name, ...``)."""
    body = docs.section("1. Trace bundle")
    return {
        f: docs.backquoted_list(body, f"`{f}`")
        for f in ("runs.csv", "allocations.csv", "sites.csv", "carbon.csv")
    }


def _write(path: Path, header: list[str], rows: list[list[object]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def test_every_documented_gpu_and_host_column_is_read() -> None:
    gpu, host = documented("gpu.csv"), documented("host.csv")
    assert gpu[:3] == list(KEYS) and host[:2] == ["time", "node"]
    for col in gpu[3:]:
        assert col in GPU_BY_NAME or col in GPU_ALIASES, col
    for col in host[2:]:
        assert col in HOST_BY_NAME, col
    # the units the tables state are the catalog's
    for col, unit in (("power_w", "W"), ("energy_mj", "mJ"), ("mem_used_mib", "MiB"), ("temp_c", "°C")):
        assert GPU_BY_NAME[col].unit in (unit, "C", "degC"), (col, GPU_BY_NAME[col].unit)
    assert HOST_BY_NAME["host_power_w"].unit == "W"


def test_the_small_files_columns() -> None:
    assert files_and_columns() == {
        "runs.csv": ["run_id", "name", "site", "start", "end"],
        "allocations.csv": ["run_id", "node", "gpu"],
        "sites.csv": [
            "site",
            "pue",
            "price_per_kwh",
            "gpu_hour_price",
            "currency",
            "carbon_region",
            "carbon_g_per_kwh",
        ],
        "carbon.csv": ["region", "time", "g_co2e_per_kwh"],
    }


def bundle(d: Path, *, time_as: str = "rfc3339", extra: bool = False) -> Path:
    """One run of one GPU for an hour: 1000 W by power, and a counter that counts 1 kWh (3.6e9 mJ), on another."""
    d.mkdir()

    def t(s: float) -> object:
        return (
            f"2026-12-01T{10 + int(s) // 3600:02d}:{int(s) % 3600 // 60:02d}:{int(s) % 60:02d}+00:00"
            if time_as == "rfc3339"
            else T0 + s
        )

    gpu_cols = documented("gpu.csv")
    rows = []
    for k in range(361):
        s = 10.0 * k
        values = {"time": t(s), "node": "n1", "gpu": 0, "power_w": 1000.0, "util_pct": 50, "sm_active": 0.5}
        rows.append([values.get(c, "") for c in gpu_cols] + (["ignored"] if extra else []))
        counter = {"time": t(s), "node": "n1", "gpu": 1, "energy_mj": int(1e9 + 1e6 * s), "power_w": 1.0}
        rows.append([counter.get(c, "") for c in gpu_cols] + (["ignored"] if extra else []))
    _write(d / "gpu.csv", gpu_cols + (["made_up_column"] if extra else []), rows)
    host_cols = documented("host.csv")
    _write(
        d / "host.csv",
        host_cols,
        [
            [{"time": t(10.0 * k), "node": "n1", "host_power_w": 400.0}.get(c, "") for c in host_cols]
            for k in range(361)
        ],
    )
    _write(d / "sites.csv", files_and_columns()["sites.csv"], [["s1", 1.5, 0.2, 3.0, "EUR", "", 200.0]])
    _write(
        d / "runs.csv",
        files_and_columns()["runs.csv"],
        [["power", "", "s1", t(0), t(3600)], ["counter", "", "s1", t(0), t(3600)]],
    )
    _write(
        d / "allocations.csv",
        files_and_columns()["allocations.csv"],
        [["power", "n1", 0], ["counter", "n1", 1]],
    )
    return d


@pytest.mark.parametrize("time_as", ["rfc3339", "epoch"])
def test_units_reach_the_accounting_as_documented(
    tmp_path: Path, conn: psycopg.Connection, time_as: str
) -> None:
    b = read_bundle(bundle(tmp_path / "b", time_as=time_as, extra=True))  # an unknown column is ignored
    load(conn, b)
    now = b.t_max + 1
    from datetime import UTC, datetime

    power = run_accounting(conn, "power", now=datetime.fromtimestamp(now, UTC), source="raw")
    counter = run_accounting(conn, "counter", now=datetime.fromtimestamp(now, UTC), source="raw")
    assert power["gpu_kwh"] == pytest.approx(1.0, rel=1e-3)  # power_w, W, over an hour
    assert counter["gpu_kwh"] == pytest.approx(1.0, rel=1e-9)  # energy_mj, mJ: 3.6e9 of them
    # host_power_w (W) times the run's share of the node's GPUs (1 of 2), PUE and prices of sites.csv
    assert power["host_kwh"] == pytest.approx(0.4 / 2, rel=1e-6)
    assert power["pue"] == 1.5 and power["currency"] == "EUR"
    assert power["facility_kwh"] == pytest.approx((power["gpu_kwh"] + power["host_kwh"]) * 1.5, rel=1e-9)
    assert counter["compute_cost"] == pytest.approx(3.0) and counter["co2e_kg"] == pytest.approx(
        counter["facility_kwh"] * 0.2, rel=1e-9
    )
    # a missing optional column is NULL, not zero
    assert conn.execute("SELECT count(*) FROM gpu_samples WHERE temp_c IS NOT NULL").fetchone() == (0,)


@pytest.mark.parametrize(
    "file,cell,value,message",
    [
        ("gpu.csv", "time", "2026-12-01T10:00:00", "gpu.csv: line 2, column 'time'"),  # no offset
        ("gpu.csv", "util_pct", "250", "gpu.csv: line 2, column 'util_pct'"),
        ("gpu.csv", "sm_active", "1.5", "gpu.csv: line 2, column 'sm_active'"),
    ],
)
def test_a_malformed_cell_is_named_by_file_line_and_column(
    tmp_path: Path, file: str, cell: str, value: str, message: str
) -> None:
    d = bundle(tmp_path / "b")
    lines = (d / file).read_text().splitlines()
    header = lines[0].split(",")
    first = lines[1].split(",")
    first[header.index(cell)] = value
    lines[1] = ",".join(first)
    (d / file).write_text("\n".join(lines) + "\n")
    with pytest.raises(BundleError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_bundle(d)
