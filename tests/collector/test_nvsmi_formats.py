"""The other shapes nvidia-smi logs take in the wild: plain screens in a loop, and
``--format=csv,noheader`` logs with no header line.  Both are real recordings of
``tests/fixtures/realtraces/`` (provenance in its SOURCES.md)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from gpufleet.collector.bundle import BundleError
from gpufleet.collector.nvsmi_import import import_nvidia_smi

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "realtraces"
SCREENS = REAL / "aucurriculum_a40_60s" / "gpu_monitor.log"
NOHEADER = REAL / "plato_yolop_20gb_5s" / "gpu_log.csv"
PLATO_FIELDS = [
    "timestamp",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.free",
    "temperature.gpu",
    "power.draw",
]


def rows(bundle: Path) -> list[dict[str, str]]:
    with (bundle / "gpu.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def test_screen_log_is_read_screen_by_screen(tmp_path: Path) -> None:
    s = import_nvidia_smi([SCREENS], tmp_path / "b", node="alvis", tz=ZoneInfo("Europe/Stockholm"))
    r = rows(tmp_path / "b")
    assert s.rows == len(r) == 134 and s.median_interval_s == pytest.approx(60.0, abs=1.0)
    # Screen 1: "|  0%   27C    P0             24W /  300W |       0MiB /  46068MiB |      0%      Default |"
    assert r[0]["time"] == "2026-01-24T20:52:14.000Z"  # 21:52:14 in Stockholm (CET, +01:00)
    assert (r[0]["util_pct"], r[0]["power_w"], r[0]["power_limit_w"]) == ("0", "24", "300")
    assert (r[0]["mem_used_mib"], r[0]["mem_total_mib"], r[0]["temp_c"]) == ("0", "46068", "27")
    # Screen 2: "|  0%   38C    P0             97W /  300W |    1835MiB /  46068MiB |     29%      Default |"
    assert (r[1]["util_pct"], r[1]["power_w"], r[1]["mem_used_mib"], r[1]["temp_c"]) == (
        "29",
        "97",
        "1835",
        "38",
    )
    facts = json.loads((tmp_path / "b" / "nodes.json").read_text())["alvis"]
    assert facts["gpu_model"] == "NVIDIA A40" and facts["driver_version"] == "580.95.05"
    assert facts["gpus"] == [{"gpu": 0, "name": "NVIDIA A40", "pci_bus_id": "00000000:31:00.0"}]
    assert s.ignored_columns == [] and s.columns["util_pct"] == ["GPU-Util"]


#: Two GPUs of an 8-GPU screen in the 545 driver's layout (narrower cells, N/A fan); values made up.
SCREEN_8 = """Mon Mar 16 09:20:45 2026
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 545.23.08              Driver Version: 545.23.08    CUDA Version: 12.3     |
|-----------------------------------------+----------------------+----------------------+
|   0  NVIDIA A100-SXM4-80GB          Off | 00000000:1A:00.0 Off |                    0 |
| N/A   33C    P0              64W / 400W |   4012MiB / 81920MiB |      0%      Default |
|                                         |                      |             Disabled |
+-----------------------------------------+----------------------+----------------------+
|   1  NVIDIA A100-SXM4-80GB          Off | 00000000:1B:00.0 Off |                    0 |
| N/A   41C    P0             187W / 400W |  52210MiB / 81920MiB |     93%      Default |
|                                         |                      |             Disabled |
+-----------------------------------------+----------------------+----------------------+
|  GPU   GI   CI        PID   Type   Process name                            GPU Memory |
|    0   N/A  N/A     41207      C   python                                     4000MiB |
"""


def test_older_driver_screen_with_several_gpus(tmp_path: Path) -> None:
    """The 545 driver's layout with two GPUs per screen, two screens."""
    log = tmp_path / "smi.log"
    log.write_text(SCREEN_8 + SCREEN_8.replace("09:20:45", "09:20:59"))
    import_nvidia_smi([log], tmp_path / "b", node="a100")
    r = rows(tmp_path / "b")
    assert [(x["time"], x["gpu"], x["util_pct"], x["power_w"]) for x in r] == [
        ("2026-03-16T09:20:45.000Z", "0", "0", "64"),
        ("2026-03-16T09:20:45.000Z", "1", "93", "187"),
        ("2026-03-16T09:20:59.000Z", "0", "0", "64"),
        ("2026-03-16T09:20:59.000Z", "1", "93", "187"),
    ]


@pytest.mark.parametrize(
    "broken,line,words",
    [
        # the state row of GPU 1 missing: its first row is followed by the MIG row
        (
            SCREEN_8.replace(
                "| N/A   41C    P0             187W / 400W |  52210MiB / 81920MiB |     93%      Default |\n",
                "",
            ),
            10,
            "expected the state row of GPU 1",
        ),
        # a state row whose power cell is not a number of watts
        (SCREEN_8.replace("64W / 400W", "64kW / 400W"), 6, "expected the state row of GPU 0"),
    ],
)
def test_broken_screens_are_refused_with_the_line(tmp_path: Path, broken: str, line: int, words: str) -> None:
    log = tmp_path / "smi.log"
    log.write_text(broken + SCREEN_8.replace("09:20:45", "09:20:59"))
    with pytest.raises(BundleError) as e:
        import_nvidia_smi([log], tmp_path / "b", node="a100")
    assert f"{log}: line {line}" in str(e.value) and words in str(e.value)
    assert not (tmp_path / "b").exists()


def test_screen_values_out_of_range_are_refused(tmp_path: Path) -> None:
    log = tmp_path / "smi.log"
    log.write_text(SCREEN_8.replace("|      0%      Default |", "|    140%      Default |"))
    with pytest.raises(BundleError, match=r"line 5, cell 'GPU-Util': 140 is outside"):
        import_nvidia_smi([log], tmp_path / "b", node="a100")


def test_noheader_log_with_the_query_field_list(tmp_path: Path) -> None:
    s = import_nvidia_smi([NOHEADER], tmp_path / "b", node="fl", columns=PLATO_FIELDS)
    r = rows(tmp_path / "b")
    assert s.rows == 1923 and s.median_interval_s == pytest.approx(5.0, abs=0.1)
    # line 1: "2026/04/25 16:06:06.780, 0 %, 0 %, 2 MiB, 20146 MiB, 27, 11.64 W"
    assert (r[0]["time"], r[0]["util_pct"], r[0]["mem_used_mib"], r[0]["temp_c"], r[0]["power_w"]) == (
        "2026-04-25T16:06:06.780Z",
        "0",
        "2",
        "27",
        "11.64",
    )
    assert s.ignored_columns == ["utilization.memory", "memory.free"]


def test_noheader_log_without_the_field_list_names_the_way_out(tmp_path: Path) -> None:
    with pytest.raises(
        BundleError, match=r"gpu_log.csv: line 1: no header row.*give the --query-gpu field list"
    ):
        import_nvidia_smi([NOHEADER], tmp_path / "b", node="fl")


def test_field_list_for_a_log_that_has_a_header_is_refused(tmp_path: Path) -> None:
    log = REAL / "qwen3asr_vllm_1gpu_100ms" / "gpu_log.csv"
    with pytest.raises(BundleError, match=r"line 1: the columns were given, but this line is not data"):
        import_nvidia_smi(
            [log],
            tmp_path / "b",
            node="x",
            columns=[
                "timestamp",
                "power.draw",
                "utilization.gpu",
                "utilization.memory",
                "memory.used",
                "pcie.link.gen.current",
                "pcie.link.width.current",
            ],
        )


def test_field_list_with_the_wrong_number_of_fields(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"gpu_log.csv: line 1: 7 values, the header has 6 columns"):
        import_nvidia_smi([NOHEADER], tmp_path / "b", node="fl", columns=PLATO_FIELDS[:-1])


def test_field_list_for_a_screen_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match=r"line 1: an nvidia-smi screen log has no CSV columns"):
        import_nvidia_smi([SCREENS], tmp_path / "b", node="x", columns=PLATO_FIELDS)


# -- an energy dataset's renamed header over nvidia-smi's own values ----------------------

RENAMED = REAL / "gaissa_ect_rtx3090_rtx3070_1s" / "cloud-mobilenet_v2-gpu-power-20221205T095541.csv"
RENAMED_HEADER = (
    "timestamp,gpu_name,gpu_usage,gpu_memory_usage,gpu_total_memory,gpu_memory_used,"
    "gpu_power_draw,gpu_max_power,gpu_temperature\n"
)


def test_renamed_header_maps_to_the_bundle_columns(tmp_path: Path) -> None:
    """The dataset renamed nvidia-smi's header (utilization.gpu -> gpu_usage, power.draw ->
    gpu_power_draw, ...) but kept its values with units and its name column."""
    s = import_nvidia_smi([RENAMED], tmp_path / "b", node="cloud")
    r = rows(tmp_path / "b")
    assert s.rows == len(r) == 2649 and s.median_interval_s == pytest.approx(1.0, abs=0.01)
    # line 2: "2022-12-05 09:55:42.535,NVIDIA GeForce RTX 3090,0 %,0 %,24268 MiB,23573 MiB,119.17 W,350.00 W,55"
    assert (
        r[0]["time"],
        r[0]["util_pct"],
        r[0]["mem_total_mib"],
        r[0]["mem_used_mib"],
        r[0]["power_w"],
        r[0]["temp_c"],
    ) == ("2022-12-05T09:55:42.535Z", "0", "24268", "23573", "119.17", "55")
    assert {k: s.columns[k] for k in ("util_pct", "mem_used_mib", "mem_total_mib", "power_w", "temp_c")} == {
        "util_pct": ["gpu_usage"],
        "mem_used_mib": ["gpu_memory_used"],
        "mem_total_mib": ["gpu_total_memory"],
        "power_w": ["gpu_power_draw"],
        "temp_c": ["gpu_temperature"],
    }
    # Memory-controller load and the settable maximum are not bundle columns, as under their own names.
    assert s.ignored_columns == ["gpu_memory_usage", "gpu_max_power"]
    facts = json.loads((tmp_path / "b" / "nodes.json").read_text())["cloud"]
    assert facts["gpu_model"] == "NVIDIA GeForce RTX 3090"


@pytest.mark.parametrize(
    "row,expect",
    [
        (
            "2022-12-05 09:55:42.535,NVIDIA GeForce RTX 3090,0 %,0 %,24268 MiB,23573 MiB,119.17 kW,350.00 W,55\n",
            "line 2, column 'gpu_power_draw': '119.17 kW' is in 'kW', expected 'W'",
        ),
        (
            "2022-12-05 09:55:42.535,NVIDIA GeForce RTX 3090,140 %,0 %,24268 MiB,23573 MiB,119.17 W,350.00 W,55\n",
            "line 2, column 'gpu_usage': 140 is outside 0..100 for util_pct",
        ),
        (
            "2022-12-05 09:55:42.535,NVIDIA GeForce RTX 3090,0 %,0 %,24268 MiB,lots,119.17 W,350.00 W,55\n",
            "line 2, column 'gpu_memory_used': expected a number, got 'lots'",
        ),
    ],
)
def test_renamed_header_values_are_checked_like_the_originals(tmp_path: Path, row: str, expect: str) -> None:
    log = tmp_path / "gpu-power.csv"
    log.write_text(RENAMED_HEADER + row)
    with pytest.raises(BundleError) as e:
        import_nvidia_smi([log], tmp_path / "b", node="cloud")
    assert str(e.value).startswith(f"{log}: ") and expect in str(e.value), str(e.value)
    assert not (tmp_path / "b").exists()
