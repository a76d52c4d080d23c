"""Detector thresholds are settings: YAML and GPUFLEET_DETECT__*, checked at
start with the field named, and used by the live sweep as by replay."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.collector.sweep import Sweeper
from gpufleet.config import ConfigError, load_settings
from gpufleet.detectconfig import DetectorConfig


def _yaml(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpufleet.yaml"
    p.write_text(text)
    return p


def test_yaml_and_environment_set_thresholds_for_the_live_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_DETECT__CKPT_MIN_PAUSE_S", "8")
    monkeypatch.setenv("GPUFLEET_DETECT__XID_IGNORE", "[13, 31]")
    s = load_settings(
        _yaml(
            tmp_path, "detect:\n  starve_max_period_s: 120\n  cpu_saturated_pct: 60\n  sweep_interval_s: 2\n"
        )
    )
    d = s.detect
    assert isinstance(d, DetectorConfig)
    assert (d.starve_max_period_s, d.cpu_saturated_pct, d.ckpt_min_pause_s, d.xid_ignore) == (
        120,
        60,
        8,
        (13, 31),
    )
    assert d.sweep_interval_s == 2
    # Untouched thresholds keep their documented defaults.
    assert d.straggler_z == DetectorConfig().straggler_z
    sweeper = Sweeper(s)
    assert sweeper.config is d
    assert sweeper.config.starve_max_period_s == 120


def test_defaults_equal_the_detectors_own_defaults() -> None:
    d = load_settings().detect
    base = DetectorConfig()
    assert {k: getattr(d, k) for k in DetectorConfig.model_fields} == base.model_dump()


@pytest.mark.parametrize(
    "body,named",
    [
        ("detect:\n  starve_max_duty: 2\n", "detect.starve_max_duty"),
        ("detect:\n  ckpt_min_pause_s: -1\n", "detect.ckpt_min_pause_s"),
        ("detect:\n  starve_max_perid_s: 60\n", "detect.starve_max_perid_s"),
        ("detect:\n  starve_min_cycles: many\n", "detect.starve_min_cycles"),
        (
            "detect:\n  idle_activity: 0.5\n  busy_activity: 0.3\n",
            "idle_activity must be below busy_activity",
        ),
        ("detect:\n  gap_factor: 1\n", "gap_factor must exceed 1"),
    ],
)
def test_bad_thresholds_are_refused_naming_the_field(tmp_path: Path, body: str, named: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(_yaml(tmp_path, body))
    assert named in str(e.value)
    assert "gpufleet.yaml" in str(e.value)


def test_bad_threshold_from_the_environment_names_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_DETECT__STRAGGLER_Z", "-3")
    with pytest.raises(ConfigError, match=r"detect\.straggler_z"):
        load_settings()


def test_thresholds_cannot_change_under_a_running_sweep() -> None:
    d = load_settings().detect
    with pytest.raises(ValueError, match="frozen"):
        d.straggler_z = 1.0  # type: ignore[misc]
