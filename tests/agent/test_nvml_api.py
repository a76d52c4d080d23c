"""NVML errors are translated once, at the seam: the real binding with its calls patched.

``pynvml`` is installed but this machine has no driver, so each test patches
the binding function it exercises (``autospec=True``) and checks what
:class:`PynvmlApi` makes of NVML's answer.
"""

from __future__ import annotations

import ctypes
from unittest import mock

import pynvml
import pytest

from gpufleet.agent.sources.base import SourceError, SourceUnavailable
from gpufleet.agent.sources.nvml_api import (
    Clock,
    GpuLost,
    NotPermitted,
    NotSupported,
    NvmlError,
    PynvmlApi,
)

HANDLE = ctypes.cast(ctypes.c_void_p(0x1000), pynvml.c_nvmlDevice_t)


def nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


@pytest.mark.parametrize(
    ("code", "expected"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, NotSupported),
        (pynvml.NVML_ERROR_NO_PERMISSION, NotPermitted),
        (pynvml.NVML_ERROR_GPU_IS_LOST, GpuLost),
        (pynvml.NVML_ERROR_UNKNOWN, NvmlError),
    ],
)
def test_errors_become_our_exceptions_raised_from_nvml(code: int, expected: type[Exception]) -> None:
    with (
        mock.patch.object(pynvml, "nvmlDeviceGetPowerUsage", autospec=True, side_effect=nvml_error(code)),
        pytest.raises(expected) as info,
    ):
        PynvmlApi().power_usage_mw(HANDLE)
    assert isinstance(info.value, SourceError)
    assert isinstance(info.value.__cause__, pynvml.NVMLError)
    assert "nvmlDeviceGetPowerUsage" in str(info.value)


def test_unknown_error_is_not_mistaken_for_not_supported() -> None:
    with (
        mock.patch.object(
            pynvml,
            "nvmlDeviceGetTemperature",
            autospec=True,
            side_effect=nvml_error(pynvml.NVML_ERROR_UNKNOWN),
        ),
        pytest.raises(NvmlError) as info,
    ):
        PynvmlApi().gpu_temperature_c(HANDLE)
    assert not isinstance(info.value, NotSupported | GpuLost)


def test_no_driver_means_source_unavailable() -> None:
    with (
        mock.patch.object(
            pynvml, "nvmlInit", autospec=True, side_effect=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        ),
        pytest.raises(SourceUnavailable),
    ):
        PynvmlApi().init()


def test_missing_binding_means_source_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    def no_module(name: str) -> object:
        raise ImportError(name)

    monkeypatch.setattr(importlib, "import_module", no_module)
    with pytest.raises(SourceUnavailable, match="nvidia-ml-py"):
        PynvmlApi().device_count()


def test_units_and_values_pass_through() -> None:
    api = PynvmlApi()
    with (
        mock.patch.object(pynvml, "nvmlDeviceGetPowerUsage", autospec=True, return_value=432210),
        mock.patch.object(pynvml, "nvmlDeviceGetClockInfo", autospec=True, return_value=1980) as clock,
        mock.patch.object(pynvml, "nvmlDeviceGetName", autospec=True, return_value=b"NVIDIA H200"),
    ):
        assert api.power_usage_mw(HANDLE) == 432210
        assert api.clock_mhz(HANDLE, Clock.SM) == 1980
        clock.assert_called_once_with(HANDLE, pynvml.NVML_CLOCK_SM)
        assert api.name(HANDLE) == "NVIDIA H200"


def test_memory_info_v2_falls_back_to_v1_on_old_drivers() -> None:
    v1 = pynvml.c_nvmlMemory_t()
    v1.total, v1.free, v1.used = 100 * 2**20, 60 * 2**20, 40 * 2**20

    def fake(handle: object, version: object = None) -> object:
        if version:
            raise nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return v1

    with mock.patch.object(pynvml, "nvmlDeviceGetMemoryInfo", autospec=True, side_effect=fake):
        info = PynvmlApi().memory_info(HANDLE)
    assert (info.total_bytes, info.used_bytes, info.reserved_bytes) == (100 * 2**20, 40 * 2**20, 0)


def test_clocks_event_reasons_falls_back_to_throttle_reasons() -> None:
    with (
        mock.patch.object(
            pynvml,
            "nvmlDeviceGetCurrentClocksEventReasons",
            autospec=True,
            side_effect=nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND),
        ),
        mock.patch.object(
            pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", autospec=True, return_value=0x4
        ),
    ):
        assert PynvmlApi().clocks_event_reasons(HANDLE) == 0x4


def test_memory_temperature_per_value_not_supported() -> None:
    values = (pynvml.c_nvmlFieldValue_t * 1)()
    values[0].fieldId = pynvml.NVML_FI_DEV_MEMORY_TEMP
    values[0].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    with (
        mock.patch.object(pynvml, "nvmlDeviceGetFieldValues", autospec=True, return_value=values),
        pytest.raises(NotSupported),
    ):
        PynvmlApi().memory_temperature_c(HANDLE)
    values[0].nvmlReturn = pynvml.NVML_SUCCESS
    values[0].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    values[0].value.uiVal = 48
    with mock.patch.object(pynvml, "nvmlDeviceGetFieldValues", autospec=True, return_value=values):
        assert PynvmlApi().memory_temperature_c(HANDLE) == 48


def test_event_wait_timeout_is_no_event_and_data_is_decoded() -> None:
    api = PynvmlApi()
    with mock.patch.object(
        pynvml, "nvmlEventSetWait", autospec=True, side_effect=nvml_error(pynvml.NVML_ERROR_TIMEOUT)
    ):
        assert api.wait_xid(object(), 0) is None
    data = pynvml.c_nvmlEventData_t()
    data.device = HANDLE
    data.eventType = pynvml.nvmlEventTypeXidCriticalError
    data.eventData = 79
    data.gpuInstanceId = 0xFFFFFFFF
    with mock.patch.object(pynvml, "nvmlEventSetWait", autospec=True, return_value=data):
        event = api.wait_xid(object(), 0)
    assert event is not None and (event.device_key, event.xid, event.gpu_instance_id) == (0x1000, 79, None)


def test_mig_device_enumeration_skips_empty_slots() -> None:
    def by_index(handle: object, i: int) -> object:
        if i in (1, 3):
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)
        return f"mig{i}"

    with (
        mock.patch.object(pynvml, "nvmlDeviceGetMaxMigDeviceCount", autospec=True, return_value=4),
        mock.patch.object(pynvml, "nvmlDeviceGetMigDeviceHandleByIndex", autospec=True, side_effect=by_index),
    ):
        assert PynvmlApi().mig_devices(HANDLE) == ["mig0", "mig2"]


def test_cpu_affinity_masks_become_cpu_numbers() -> None:
    masks = (ctypes.c_ulonglong * 2)(0b1011, 1)
    with mock.patch.object(pynvml, "nvmlDeviceGetCpuAffinity", autospec=True, return_value=masks):
        assert PynvmlApi().cpu_affinity(HANDLE)[:4] == [0, 1, 3, 64]


# -- memory, bus and NVLink health -------------------------------------------------------


def test_ecc_totals_ask_nvml_for_the_right_type_and_counter() -> None:
    seen: list[tuple[int, int]] = []

    def totals(handle: object, kind: int, counter: int) -> int:
        seen.append((kind, counter))
        return {(0, 0): 11, (0, 1): 40, (1, 0): 1, (1, 1): 2}[(kind, counter)]

    api = PynvmlApi()
    with mock.patch.object(pynvml, "nvmlDeviceGetTotalEccErrors", autospec=True, side_effect=totals):
        assert api.ecc_error_total(HANDLE, uncorrected=False, aggregate=False) == 11
        assert api.ecc_error_total(HANDLE, uncorrected=False, aggregate=True) == 40
        assert api.ecc_error_total(HANDLE, uncorrected=True, aggregate=True) == 2
        assert api.ecc_dbe_volatile_total(HANDLE) == 1
    assert seen == [
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
        (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
        (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    ]


def test_remapped_rows_and_pcie_replays() -> None:
    api = PynvmlApi()
    with (
        mock.patch.object(pynvml, "nvmlDeviceGetRemappedRows", autospec=True, return_value=(3, 1, 1, 0)),
        mock.patch.object(pynvml, "nvmlDeviceGetPcieReplayCounter", autospec=True, return_value=9),
    ):
        rows = api.remapped_rows(HANDLE)
        assert (rows.correctable, rows.uncorrectable, rows.pending, rows.failed) == (3, 1, True, False)
        assert api.pcie_replay_count(HANDLE) == 9
    with (
        mock.patch.object(
            pynvml,
            "nvmlDeviceGetRemappedRows",
            autospec=True,
            side_effect=nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED),
        ),
        pytest.raises(NotSupported, match="nvmlDeviceGetRemappedRows"),
    ):
        api.remapped_rows(HANDLE)


def test_nvlink_states_walk_the_links_until_nvml_says_there_are_no_more() -> None:
    def state(handle: object, link: int) -> int:
        if link >= 18:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_DISABLED if link in (4, 11) else pynvml.NVML_FEATURE_ENABLED

    with mock.patch.object(pynvml, "nvmlDeviceGetNvLinkState", autospec=True, side_effect=state):
        states = PynvmlApi().nvlink_states(HANDLE)
    assert len(states) == 18 and sum(states) == 16 and not states[4] and not states[11]
    # A GPU without NVLink: NotSupported on the first link, never an empty list of links.
    with (
        mock.patch.object(
            pynvml,
            "nvmlDeviceGetNvLinkState",
            autospec=True,
            side_effect=nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED),
        ),
        pytest.raises(NotSupported),
    ):
        PynvmlApi().nvlink_states(HANDLE)


def test_nvlink_error_counters_per_link() -> None:
    values = {
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: 70,
        pynvml.NVML_NVLINK_ERROR_DL_REPLAY: 5,
        pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: 1,
    }
    calls: list[tuple[int, int]] = []

    def counter(handle: object, link: int, which: int) -> int:
        calls.append((link, which))
        return values[which]

    with mock.patch.object(pynvml, "nvmlDeviceGetNvLinkErrorCounter", autospec=True, side_effect=counter):
        e = PynvmlApi().nvlink_errors(HANDLE, 3)
    assert (e.crc_flit, e.replay, e.recovery) == (70, 5, 1)
    assert {link for link, _ in calls} == {3} and len(calls) == 3


def test_nvlink_throughput_reads_all_links_from_field_values() -> None:
    values = (pynvml.c_nvmlFieldValue_t * 2)()
    for i, v in enumerate((123456, 654321)):
        values[i].nvmlReturn = pynvml.NVML_SUCCESS
        values[i].valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
        values[i].value.ullVal = v
    with mock.patch.object(pynvml, "nvmlDeviceGetFieldValues", autospec=True, return_value=values) as fv:
        assert PynvmlApi().nvlink_throughput_kib(HANDLE) == (123456, 654321)
    asked = fv.call_args.args[1]
    assert asked == [
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF),
        (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0xFFFFFFFF),
    ]
    values[1].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
    with (
        mock.patch.object(pynvml, "nvmlDeviceGetFieldValues", autospec=True, return_value=values),
        pytest.raises(NotSupported),
    ):
        PynvmlApi().nvlink_throughput_kib(HANDLE)
