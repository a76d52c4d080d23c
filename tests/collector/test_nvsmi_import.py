"""nvidia-smi ``--query-gpu`` logs into trace bundles: the real forms, and refusals.

The captures under ``tests/fixtures/nvidia_smi/`` are what nvidia-smi printed
on an H100, an H100 in MIG mode, an H200 and an L40S (provenance in that
folder's SOURCES.md); the recordings under ``tests/fixtures/realtraces/`` are
logs written by people's own nvidia-smi loops.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpufleet.collector.bundle import BundleError, read_bundle
from gpufleet.collector.nvsmi_import import import_nvidia_smi, parse_timestamp, parse_zone
from gpufleet.gpu_models import board_power_w

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CAPTURES = FIXTURES / "nvidia_smi"
REAL = FIXTURES / "realtraces"
NANOGPT = sorted((REAL / "nanogpt_pr643_8xh100").glob("*.csv"))
RPF = REAL / "rpf_fork_1gpu_60s" / "gpu_usage.csv"


def gpu_rows(bundle: Path) -> list[dict[str, str]]:
    with (bundle / "gpu.csv").open(newline="") as f:
        return list(csv.DictReader(f))


# -- real nvidia-smi --format=csv output -------------------------------------------


def test_h100_capture_maps_every_field_the_bundle_has(tmp_path: Path) -> None:
    out = tmp_path / "b"
    s = import_nvidia_smi([CAPTURES / "h100_80gb_hbm3.csv"], out, node="h100-a")
    idle, load = gpu_rows(out)
    assert idle["time"] == "2026-07-14T08:12:38.696Z" and load["time"] == "2026-07-14T08:12:53.353Z"
    assert (idle["node"], idle["gpu"]) == ("h100-a", "0")
    assert float(idle["power_w"]) == 69.85 and float(load["power_w"]) == 631.95
    assert float(idle["power_limit_w"]) == 700.0
    assert idle["sm_clock_max_mhz"] == "1980" and (idle["sm_clock_mhz"], load["sm_clock_mhz"]) == (
        "345",
        "1980",
    )
    assert idle["mem_clock_mhz"] == "2619"
    assert (idle["pcie_gen"], idle["pcie_gen_max"], idle["pcie_width"], idle["pcie_width_max"]) == (
        "5",
        "5",
        "16",
        "16",
    )
    # clocks_event_reasons.active 0x0000000000000001 (GPU idle), then 0x0 under load
    assert (idle["throttle_reasons"], load["throttle_reasons"]) == ("1", "0")
    assert (idle["util_pct"], load["util_pct"]) == ("0", "100")
    assert (idle["mem_used_mib"], load["mem_used_mib"], idle["mem_total_mib"]) == ("0", "19818", "81559")
    assert (idle["temp_c"], idle["mem_temp_c"], load["temp_c"], load["mem_temp_c"]) == (
        "41",
        "48",
        "59",
        "54",
    )
    assert idle["uuid"] == "GPU-00000000-0000-0000-0000-000000000000"
    assert idle["ecc_dbe"] == "0"  # the contract's name for the catalog's ecc_dbe_vol
    # Memory health of the same query: ECC totals and the row remapper (Yes/No flags as 1/0).
    assert (idle["ecc_sbe_vol"], idle["ecc_sbe_agg"], idle["ecc_dbe_agg"]) == ("0", "0", "0")
    assert (idle["remapped_rows_correctable"], idle["remapped_rows_uncorrectable"]) == ("0", "0")
    assert (idle["remapped_rows_pending"], idle["remapped_rows_failed"]) == ("0", "0")
    # power.draw first, its average and instant forms only as fallbacks; the enforced limit before power.limit
    assert s.columns["power_w"] == ["power.draw [W]", "power.draw.average [W]", "power.draw.instant [W]"]
    assert s.columns["power_limit_w"] == ["enforced.power.limit [W]", "power.limit [W]"]
    assert "serial" in s.ignored_columns and "power.max_limit [W]" in s.ignored_columns
    assert "timestamp" not in s.ignored_columns and "name" not in s.ignored_columns
    assert (s.rows, s.gpus, s.median_interval_s) == (2, [("h100-a", 0)], pytest.approx(14.657))
    facts = json.loads((out / "nodes.json").read_text())["h100-a"]
    assert facts["gpu_model"] == "NVIDIA H100 80GB HBM3" and facts["driver_version"] == "590.48.01"
    assert facts["gpus"] == [
        {
            "gpu": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "pci_bus_id": "00000000:00:09.0",
            "uuid": "GPU-00000000-0000-0000-0000-000000000000",
        }
    ]
    b = read_bundle(out)
    assert b.gpu_rows == 2 and b.facts["h100-a"]["gpu_model"] == "NVIDIA H100 80GB HBM3"
    assert not (out / "runs.csv").exists()


@pytest.mark.parametrize(
    "capture,expect",
    [
        (
            "h100_mig.csv",
            {
                "util_pct": ("", ""),
                "power_w": ("71.15", "433.78"),
                "mem_used_mib": ("59", "11125"),
                "throttle_reasons": ("1", "0"),
            },
        ),
        (
            "h200.csv",
            {
                "mem_total_mib": ("143771", "143771"),
                "power_w": ("77.71", "627.4"),
                "util_pct": ("0", "100"),
                "power_limit_w": ("700", "700"),
                "mem_clock_mhz": ("3201", "3201"),
            },
        ),
        (
            "l40s.csv",
            {
                "power_limit_w": ("350", "350"),
                "pcie_gen": ("4", "4"),
                "sm_clock_max_mhz": ("2520", "2520"),
                "mem_temp_c": ("", ""),
                "power_w": ("144.97", "110.23"),
                "util_pct": ("100", "9"),
            },
        ),
    ],
)
def test_other_captures(tmp_path: Path, capture: str, expect: dict[str, tuple[str, str]]) -> None:
    """MIG reports no GPU-Util ([N/A]); the L40S has no memory temperature (bare N/A)."""
    import_nvidia_smi([CAPTURES / capture], tmp_path / "b", node="n1")
    idle, load = gpu_rows(tmp_path / "b")
    for col, (a, b) in expect.items():
        assert (idle[col], load[col]) == (a, b), col
    read_bundle(tmp_path / "b")


@pytest.mark.parametrize(
    "capture,model,watts",
    [
        ("h100_80gb_hbm3.csv", "NVIDIA H100 80GB HBM3", 700.0),
        ("h200.csv", "NVIDIA H200", 700.0),
        ("l40s.csv", "NVIDIA L40S", 350.0),
    ],
)
def test_name_column_gives_the_model_and_its_board_power(
    tmp_path: Path, capture: str, model: str, watts: float
) -> None:
    s = import_nvidia_smi([CAPTURES / capture], tmp_path / "b", node="n1")
    assert s.gpu_models == {"n1": [model]}
    assert board_power_w(json.loads((tmp_path / "b" / "nodes.json").read_text())["n1"]["gpu_model"]) == watts
    assert f"GPU model {model} (board power {watts:.0f} W)" in s.line()


def test_local_times_are_read_in_the_given_zone(tmp_path: Path) -> None:
    import_nvidia_smi([CAPTURES / "h100_80gb_hbm3.csv"], tmp_path / "b", node="n1", tz=parse_zone("+02:00"))
    assert gpu_rows(tmp_path / "b")[0]["time"] == "2026-07-14T06:12:38.696Z"
    import_nvidia_smi(
        [CAPTURES / "h100_80gb_hbm3.csv"], tmp_path / "c", node="n1", tz=parse_zone("America/New_York")
    )
    assert gpu_rows(tmp_path / "c")[0]["time"] == "2026-07-14T12:12:38.696Z"  # EDT, UTC-4 in July


def test_timestamp_forms() -> None:
    utc = datetime(2026, 7, 14, 8, 12, 38, 696000, tzinfo=UTC)
    for text in (
        "2026/07/14 08:12:38.696",
        "2026-07-14T08:12:38.696Z",
        "2026-07-14T10:12:38.696+02:00",
        "2026-07-14 08:12:38.696",
        "1784016758.696",
    ):
        assert parse_timestamp(text) == utc, text
    assert parse_timestamp("2026/07/14 08:12:38.696", timezone(timedelta(hours=-5))) == utc + timedelta(
        hours=5
    )
    with pytest.raises(ValueError, match="epoch seconds after 2000"):
        parse_timestamp("12.5")  # seconds since the start of a log
    with pytest.raises(ValueError, match="not UTC, an offset"):
        parse_zone("Mars/Olympus")


# -- hand-written headers and other logging scripts ---------------------------------


def test_nounits_log_with_its_own_header_and_epoch_times(tmp_path: Path) -> None:
    """rpf: ``--format=csv,noheader,nounits`` behind a header the script wrote, one GPU, no index column."""
    s = import_nvidia_smi([RPF], tmp_path / "b", node="rpf-gpu", run_id="rpf")
    rows = gpu_rows(tmp_path / "b")
    assert (s.rows, s.gpus, s.median_interval_s) == (90, [("rpf-gpu", 0)], 60.0)
    assert rows[0]["time"] == "2025-11-26T20:31:15.000Z" and rows[-1]["time"] == "2025-11-26T22:00:22.000Z"
    assert (rows[3]["mem_used_mib"], rows[3]["mem_total_mib"], rows[3]["util_pct"]) == (
        "10544",
        "24576",
        "93",
    )
    assert set(s.columns) == {"util_pct", "mem_used_mib", "mem_total_mib"} and s.ignored_columns == []
    assert not (tmp_path / "b" / "nodes.json").exists()  # no model name: no facts
    assert (
        tmp_path / "b" / "runs.csv"
    ).read_text() == "run_id,name,site,start,end\nrpf,,,2025-11-26T20:31:15.000Z,\n"
    assert (tmp_path / "b" / "allocations.csv").read_text() == "run_id,node,gpu\nrpf,rpf-gpu,0\n"


@pytest.mark.parametrize("path", NANOGPT, ids=lambda p: p.stem)
def test_nanogpt_recordings_import(tmp_path: Path, path: Path) -> None:
    """``timestamp,gpu_index,temperature_C,utilization_gpu_percent,power_W``: 8 GPUs stamped with one
    time per query, one query every ~0.28 s."""
    s = import_nvidia_smi([path], tmp_path / "b", node="g150", gpu_name="NVIDIA H100 80GB HBM3")
    lines = path.read_text().splitlines()
    assert s.rows == len(lines) - 1 and s.gpus == [("g150", g) for g in range(8)]
    by_gpu: dict[str, list[float]] = {}
    for ln in lines[1:]:
        stamp, gpu = ln.split(",")[:2]
        by_gpu.setdefault(gpu, []).append(datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp())
    gaps = [b - a for ts in by_gpu.values() for a, b in itertools.pairwise(ts)]
    assert s.median_interval_s == pytest.approx(statistics.median(gaps), abs=1e-6)
    assert 0.26 <= s.median_interval_s <= 0.32  # SOURCES.md: one query every ~0.26-0.30 s, 0.28 s overall
    assert s.columns == {
        "gpu": ["gpu_index"],
        "util_pct": ["utilization_gpu_percent"],
        "power_w": ["power_W"],
        "temp_c": ["temperature_C"],
    }
    assert s.ignored_columns == []
    first = lines[1].split(",")
    row = gpu_rows(tmp_path / "b")[0]
    assert (row["time"], row["gpu"]) == (first[0], first[1])
    assert (row["temp_c"], row["util_pct"], float(row["power_w"])) == (
        first[2].strip(),
        first[3].strip(),
        float(first[4]),
    )
    facts = json.loads((tmp_path / "b" / "nodes.json").read_text())["g150"]
    assert facts["gpu_model"] == "NVIDIA H100 80GB HBM3" and facts["gpu_count"] == 8
    assert read_bundle(tmp_path / "b").gpu_rows == s.rows


def test_run_start_before_the_first_sample(tmp_path: Path) -> None:
    start = datetime(2025, 9, 24, 3, 17, 4, tzinfo=UTC)
    s = import_nvidia_smi([NANOGPT[0]], tmp_path / "b", node="g150", run_id="nanogpt", run_start=start)
    b = read_bundle(tmp_path / "b")
    assert b.runs == [
        {"run_id": "nanogpt", "name": None, "site": None, "start": start.timestamp(), "end": None}
    ]
    assert sorted(b.allocations) == [("nanogpt", "g150", g) for g in range(8)]
    assert s.run_start == start and "run nanogpt from 2025-09-24T03:17:04.000Z" in s.line()


def test_reason_columns_make_the_bitmask_where_active_is_absent(tmp_path: Path) -> None:
    log = tmp_path / "r.csv"
    log.write_text(
        "timestamp, index, clocks_throttle_reasons.sw_power_cap, clocks_throttle_reasons.gpu_idle, "
        "clocks_throttle_reasons.hw_thermal_slowdown\n"
        "2026/01/05 10:00:00.000, 0, Active, Not Active, Active\n"
        "2026/01/05 10:00:01.000, 0, Not Active, Active, Not Active\n"
        "2026/01/05 10:00:02.000, 0, [N/A], [N/A], [N/A]\n"
    )
    import_nvidia_smi([log], tmp_path / "b", node="n1")
    assert [r["throttle_reasons"] for r in gpu_rows(tmp_path / "b")] == [str(0x4 | 0x40), "1", ""]


def test_older_throttle_spelling_and_hex(tmp_path: Path) -> None:
    log = tmp_path / "r.csv"
    log.write_text(
        "timestamp,index,clocks_throttle_reasons.active,clocks.sm [MHz]\n"
        "2026/01/05 10:00:00.000,0,0x0000000000000024,1410 MHz\n"
    )
    import_nvidia_smi([log], tmp_path / "b", node="n1")
    row = gpu_rows(tmp_path / "b")[0]
    assert (row["throttle_reasons"], row["sm_clock_mhz"]) == ("36", "1410")


def test_several_files_and_nodes(tmp_path: Path) -> None:
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("timestamp,index,power.draw\n2026-01-05T10:00:00Z,0,100\n2026-01-05T10:00:01Z,0,110\n")
    b.write_text("timestamp,index,power.draw\n2026-01-05T10:00:00Z,0,200\n")
    s = import_nvidia_smi([a, b], tmp_path / "out", node=["n1", "n2"], run_id="r")
    assert s.gpus == [("n1", 0), ("n2", 0)]
    assert [(r["node"], r["power_w"]) for r in gpu_rows(tmp_path / "out")] == [
        ("n1", "100"),
        ("n2", "200"),
        ("n1", "110"),
    ]


def test_gpu_name_option_must_agree_with_the_log(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="the logs name it 'NVIDIA H200', not 'NVIDIA H100 80GB HBM3'"):
        import_nvidia_smi(
            [CAPTURES / "h200.csv"], tmp_path / "b", node="n1", gpu_name="NVIDIA H100 80GB HBM3"
        )
    assert not (tmp_path / "b").exists()


# -- refusals: file, line and column named; nothing written ---------------------------


HEADER = "timestamp, index, utilization.gpu [%], power.draw [W]\n"


@pytest.mark.parametrize(
    "body,expect",
    [
        (
            HEADER
            + "2026/07/14 08:12:38.696, 0, 0 %, 69.85 W\n2026/07/14 08:12:39.696, 0, busy %, 70.10 W\n",
            "line 3, column 'utilization.gpu [%]': expected a number, got 'busy %'",
        ),
        (
            HEADER + "2026/07/14 08:12:38.696, 0, 0 %, 69.85 W\n2026/07/14 08:12:38.696, 1, 0 %, 70.10 W\n"
            "2026/07/14 08:12:38.696, 0, 3 %, 71.00 W\n",
            "line 4, column 'timestamp': GPU 0 of node n1 already has a sample at 2026-07-14T08:12:38.696Z",
        ),
        (
            HEADER + "14.07.2026 08:12:38, 0, 0 %, 69.85 W\n",
            "line 2, column 'timestamp': '14.07.2026 08:12:38': unknown time format",
        ),
        ("", "line 1, column 1: empty file"),
        ("\n\n", "line 1, column 1: empty file"),
        (
            HEADER + "2026/07/14 08:12:38.696, 0, 250 %, 69.85 W\n",
            "line 2, column 'utilization.gpu [%]': 250 is outside 0..100 for util_pct",
        ),
        (
            HEADER + "2026/07/14 08:12:38.696, 0, 5 %, 69.85 kW\n",
            "line 2, column 'power.draw [W]': '69.85 kW' is in 'kW', expected 'W'",
        ),
        (HEADER + "2026/07/14 08:12:38.696, 0, 5 %\n", "line 2: 3 values, the header has 4 columns"),
        (
            "timestamp, memory.used [GiB]\n2026/07/14 08:12:38.696, 3\n",
            "line 1, column 'memory.used [GiB]': unit 'GiB', expected 'MiB'",
        ),
        ("2026/07/14 08:12:38.696, 0, 0, 69.85\n", "line 1: no header row; the first line is data"),
        ("index, power.draw\n0, 60\n", "line 1: no 'timestamp' column"),
        ("# nvidia-smi log\n" + HEADER, "no samples, only a header"),
    ],
)
def test_malformed_log_names_file_line_and_column(tmp_path: Path, body: str, expect: str) -> None:
    log = tmp_path / "gpu.log"
    log.write_text(body)
    out = tmp_path / "out" / "bundle"
    with pytest.raises(BundleError) as e:
        import_nvidia_smi([log], out, node="n1", run_id="r1")
    assert str(e.value).startswith(f"{log}: "), str(e.value)
    assert expect in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpu.log"]  # no bundle, no temporary directory


def test_duplicate_without_index_column_says_why(tmp_path: Path) -> None:
    log = tmp_path / "g.csv"
    log.write_text("timestamp,utilization.gpu\n1767607200,10\n1767607200,20\n")
    with pytest.raises(BundleError, match=r"g\.csv: line 3, column 'timestamp': .*no index column"):
        import_nvidia_smi([log], tmp_path / "b", node="n1")


def test_existing_output_is_kept_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "b"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(BundleError, match="exists and is not an empty directory"):
        import_nvidia_smi([RPF], out, node="n1")
    assert (out / "keep.txt").read_text() == "mine"
    import_nvidia_smi([RPF], out, node="n1", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == ["gpu.csv"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]


# -- command line ---------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpufleet.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_cli_import_prints_one_summary_line(tmp_path: Path) -> None:
    proc = cli(
        "bundle",
        "import-nvidia-smi",
        str(NANOGPT[1]),
        "--out",
        str(tmp_path / "b"),
        "--node",
        "g150",
        "--run-id",
        "nanogpt",
        "--run-start",
        "2025/09/24 05:17:04",
        "--tz",
        "Europe/Berlin",
        "--gpu-name",
        "NVIDIA H100 80GB HBM3",
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    assert "\n" not in line
    assert (
        "2568 rows, 8 GPUs on 1 node(s), 2025-09-24T03:29:30.080Z to 2025-09-24T03:30:59.743Z (89.7 s)"
        in line
    )
    assert "median interval 0.279 s" in line and "no columns ignored" in line
    assert "run nanogpt from 2025-09-24T03:17:04.000Z" in line  # 05:17:04 CEST
    assert (
        read_bundle(tmp_path / "b").runs[0]["start"]
        == datetime(2025, 9, 24, 3, 17, 4, tzinfo=UTC).timestamp()
    )


def test_cli_import_error_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    log = tmp_path / "bad.csv"
    log.write_text(HEADER + "2026/07/14 08:12:38.696, 0, busy %, 69.85 W\n")
    proc = cli("bundle", "import-nvidia-smi", str(log), "--out", str(tmp_path / "b"), "--node", "n1")
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f"gpufleet: {log}: line 2, column 'utilization.gpu [%]': expected a number, got 'busy %'"
    )
    assert not (tmp_path / "b").exists()
    proc = cli(
        "bundle",
        "import-nvidia-smi",
        str(RPF),
        "--out",
        str(tmp_path / "b"),
        "--node",
        "n1",
        "--tz",
        "Nowhere",
    )
    assert proc.returncode != 0 and proc.stderr.startswith("gpufleet: --tz: ")


def test_replay_into_a_database_holding_the_run_is_one_line(tmp_path: Path, db: str) -> None:
    """Re-importing with a corrected run start and replaying into the same --db: a one-line refusal
    naming the run, not a traceback."""
    env = dict(os.environ, GPUFLEET_DATA_DIR=str(tmp_path / "data"))
    for k, start in enumerate(("1764189075", "1764189180")):
        out = tmp_path / f"b{k}"
        import_nvidia_smi([RPF], out, node="rpf-gpu", run_id="rpf", run_start=float(start))
        proc = cli(
            "replay",
            str(out),
            "--db",
            db,
            "--quiet",
            "--findings",
            str(tmp_path / f"f{k}.jsonl"),
            "--accounting",
            str(tmp_path / f"a{k}.json"),
            env=env,
        )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "run 'rpf' exists with start 2025-11-26T20:31:15" in proc.stderr
    assert "replay into a fresh database" in proc.stderr
    assert (tmp_path / "f0.jsonl").exists() and not (tmp_path / "f1.jsonl").exists()
