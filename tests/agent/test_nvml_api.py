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
        mock.patch.object(pynvml, "nvmlDeviceGetTemperature", autospec=True,
                           side_effect=nvml_error(pynvml.NVML_ERROR_UNKNOWN)),
        pytest.raises(NvmlError) as info,
    ):
        PynvmlApi().gpu_temperature_c(HANDLE)
    assert not isinstance(info.value, NotSupported | GpuLost)


def test_no_driver_means_source_unavailable() -> None:
    with (
        mock.patch.object(pynvml, "nvmlInit", autospec=True,
                           side_effect=nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)),
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
        mock.patch.object(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", autospec=True,
                          side_effect=nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)),
        mock.patch.object(pynvml, "nvmlDeviceGetCurrentClocksThrottleReasons", autospec=True, return_value=0x4),
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
    with mock.patch.object(pynvml, "nvmlEventSetWait", autospec=True,
                           side_effect=nvml_error(pynvml.NVML_ERROR_TIMEOUT)):
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
