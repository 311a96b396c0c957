"""The fake NVML library (tests/fake_nvml), driven through the real pynvml bindings."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import threading
import time

import pynvml
import pytest

from tests.conftest import NVML_FIXTURES, FakeNvml
from tests.fake_nvml.build import LIBRARY, ensure_built

H100_UUID = "GPU-00000000-0000-0000-0000-000000000000"
GI_IDLE = pynvml.nvmlClocksEventReasonGpuIdle


@pytest.fixture(autouse=True)
def clean(fake_nvml: FakeNvml):
    fake_nvml.reset()
    yield
    fake_nvml.reset()


def address(handle) -> int:
    return ctypes.cast(handle, ctypes.c_void_p).value


def two_gpus(fake_nvml: FakeNvml) -> dict:
    """An H100 (device 0) and an L40S (device 1) in one node."""
    h100 = fake_nvml.load_fixture("h100")
    l40s = fake_nvml.load_fixture("l40s")
    l40s["devices"][0]["uuid"] = "GPU-11111111-1111-1111-1111-111111111111"
    h100["devices"].append(l40s["devices"][0])
    return h100


def init_with(fake_nvml: FakeNvml, config) -> None:
    fake_nvml.configure(config)
    pynvml.nvmlInit()


# --- build ---------------------------------------------------------------------------------------


def test_ensure_built_returns_the_library_and_does_not_rebuild():
    path = ensure_built()
    assert path == LIBRARY
    assert path.name == "libnvidia-ml.so.1"
    mtime = path.stat().st_mtime_ns
    assert ensure_built().stat().st_mtime_ns == mtime


def test_struct_layouts_match_pynvml(fake_nvml: FakeNvml):
    sizes = {
        "nvmlFieldValue_t": pynvml.c_nvmlFieldValue_t,
        "nvmlProcessInfo_t": pynvml.c_nvmlProcessInfo_v3_t,
        "nvmlDeviceAttributes_t": pynvml.c_nvmlDeviceAttributes,
        "nvmlValue_t": pynvml.c_nvmlValue_t,
    }
    for c_name, py_type in sizes.items():
        assert fake_nvml.lib.fakeNvmlSizeof(c_name.encode()) == ctypes.sizeof(py_type), c_name
    assert pynvml.c_nvmlFieldValue_t.value.offset == 32


# --- init, shutdown, errors of the library itself ------------------------------------------------


def test_every_call_before_init_is_uninitialized(fake_nvml: FakeNvml):
    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlSystemGetDriverVersion()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlShutdown()


def test_init_is_reference_counted(fake_nvml: FakeNvml):
    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    pynvml.nvmlInit()
    pynvml.nvmlInit()
    assert fake_nvml.refcount() == 2
    pynvml.nvmlShutdown()
    assert pynvml.nvmlDeviceGetCount() == 1
    pynvml.nvmlShutdown()
    assert fake_nvml.refcount() == 0
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()


def test_init_without_config_variable_fails_with_a_reason(fake_nvml, monkeypatch, capfd):
    monkeypatch.delenv("FAKE_NVML_CONFIG", raising=False)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert err.count("\n") == 1
    assert "FAKE_NVML_CONFIG is not set" in err
    assert fake_nvml.refcount() == 0


def test_init_with_missing_file_fails(fake_nvml, monkeypatch, capfd, tmp_path):
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(tmp_path / "nope.json"))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert "cannot open" in err and "nope.json" in err


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"devices": [', "invalid JSON"),
        ('{"devices": []} x', "trailing characters"),
        ('{"devices": [{"name": "x", "uuid": "y", "power_w": 3}]}', 'unknown key "power_w"'),
        ('{"devices": [{"name": "x"}]}', 'needs "uuid"'),
        ('{"devices": [{"name": "x", "uuid": "y", "power_mw": -1}]}', "out of range"),
        ('{"devices": [{"name": "x", "uuid": "y", "power_mw": 1.5}]}', "must be an integer"),
        ('{"errors": {"nvmlInit": "NVML_ERROR_NOPE"}}', "unknown NVML error name"),
        ('{"devices": [], "devices": []}', "duplicate key"),
        ("[]", "top level must be an object"),
    ],
)
def test_init_with_invalid_config_fails_with_a_reason(fake_nvml, capfd, text, reason):
    fake_nvml.configure_text(text)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    err = capfd.readouterr().err
    assert err.count("\n") == 1, err
    assert reason in err


def test_library_level_init_error(fake_nvml: FakeNvml):
    config = fake_nvml.load_fixture("h100")
    config["errors"] = {"nvmlInitWithFlags": 9}
    fake_nvml.configure(config)
    with pytest.raises(pynvml.NVMLError_DriverNotLoaded):
        pynvml.nvmlInit()
    assert fake_nvml.refcount() == 0
    config["errors"] = {"nvmlInit": "LIB_RM_VERSION_MISMATCH"}  # nvmlInit covers WithFlags too
    fake_nvml.configure(config)
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch):
        pynvml.nvmlInit()
    del config["errors"]
    fake_nvml.configure(config)
    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 1


def test_library_level_error_applies_to_every_device(fake_nvml: FakeNvml):
    config = two_gpus(fake_nvml)
    config["errors"] = {"nvmlDeviceGetTemperature": 4}
    init_with(fake_nvml, config)
    for index in range(2):
        with pytest.raises(pynvml.NVMLError_NoPermission):
            pynvml.nvmlDeviceGetTemperature(
                pynvml.nvmlDeviceGetHandleByIndex(index), pynvml.NVML_TEMPERATURE_GPU
            )


def test_error_strings(fake_nvml: FakeNvml):
    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert pynvml.nvmlErrorString(pynvml.NVML_ERROR_UNKNOWN) == "Unknown Error"
    assert pynvml.nvmlErrorString(12345) == "Unknown Error"


# --- readings ------------------------------------------------------------------------------------


def test_h100_idle_through_pynvml(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    assert pynvml.nvmlSystemGetDriverVersion() == "590.48.01"
    assert pynvml.nvmlSystemGetNVMLVersion() == "13.590.48.01"
    assert pynvml.nvmlDeviceGetCount() == 1
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert pynvml.nvmlDeviceGetUUID(handle) == H100_UUID
    assert pynvml.nvmlDeviceGetIndex(handle) == 0
    assert address(pynvml.nvmlDeviceGetHandleByUUID(H100_UUID)) == address(handle)
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-does-not-exist")
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetHandleByIndex(1)

    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 41
    slowdown = pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown = pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    assert pynvml.nvmlDeviceGetTemperatureThreshold(handle, slowdown) == 89
    assert pynvml.nvmlDeviceGetTemperatureThreshold(handle, shutdown) == 95
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetTemperatureThreshold(handle, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX)

    (hbm,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert hbm.fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert hbm.nvmlReturn == pynvml.NVML_SUCCESS
    assert hbm.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert hbm.value.uiVal == 48
    assert abs(hbm.timestamp / 1e6 - time.time()) < 60

    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 69850
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700000
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) == 1_000_000_000
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == GI_IDLE
    assert pynvml.nvmlDeviceGetSupportedClocksEventReasons(handle) == 0x1FF
    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == GI_IDLE
    assert pynvml.nvmlDeviceGetSupportedClocksThrottleReasons(handle) == 0x1FF

    assert pynvml.nvmlDeviceGetMigMode(handle) == [0, 0]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 7
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert not pynvml.nvmlDeviceIsMigDeviceHandle(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetGpuInstanceId(handle)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
    assert pynvml.nvmlDeviceGetAttributes(handle).multiprocessorCount == 132
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []


def test_h100_under_load(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100-load.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 59
    (hbm,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
    assert (hbm.nvmlReturn, hbm.value.uiVal) == (pynvml.NVML_SUCCESS, 54)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 631950
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == 0
    assert pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) > 1_000_000_000
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory) for p in procs] == [
        (11327, 2566 * 2**20),
        (11328, 1542 * 2**20),
        (11345, 15690 * 2**20),
    ]
    assert {p.gpuInstanceId for p in procs} == {0xFFFFFFFF}
    v2 = pynvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
    assert [p.pid for p in v2] == [11327, 11328, 11345]


def test_process_size_protocol(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100-load.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fn = fake_nvml.lib.nvmlDeviceGetComputeRunningProcesses_v3
    count = ctypes.c_uint(0)
    assert fn(handle, ctypes.byref(count), None) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count = ctypes.c_uint(2)
    procs = (pynvml.c_nvmlProcessInfo_v3_t * 2)()
    assert fn(handle, ctypes.byref(count), procs) == pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    assert count.value == 3
    count = ctypes.c_uint(3)
    procs = (pynvml.c_nvmlProcessInfo_v3_t * 3)()
    assert fn(handle, ctypes.byref(count), procs) == pynvml.NVML_SUCCESS
    assert [p.pid for p in procs] == [11327, 11328, 11345]


def test_null_process_memory_is_none(fake_nvml: FakeNvml):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["processes"] = [{"pid": 7, "used_memory_bytes": None}]
    init_with(fake_nvml, config)
    (proc,) = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
    assert (proc.pid, proc.usedGpuMemory) == (7, None)


def test_l40s_has_no_hbm_temperature_and_no_mig(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "l40s.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA L40S"
    values = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP, 1])
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED] * 2
    assert values[0].value.uiVal == 0
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 63
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 144970
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 350000
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMigMode(handle)
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(handle) == 0


def test_other_field_ids_are_not_supported_per_field(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    values = pynvml.nvmlDeviceGetFieldValues(
        handle, [pynvml.NVML_FI_DEV_POWER_INSTANT, pynvml.NVML_FI_DEV_MEMORY_TEMP]
    )
    assert [v.nvmlReturn for v in values] == [pynvml.NVML_ERROR_NOT_SUPPORTED, 0]
    assert values[1].value.uiVal == 48


def test_null_or_missing_readings_are_not_supported(fake_nvml: FakeNvml):
    config = {
        "devices": [{"name": "NVIDIA Test", "uuid": "GPU-t", "power_mw": None, "temperature_c": 30}]
    }
    init_with(fake_nvml, config)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 30
    for getter in (
        pynvml.nvmlDeviceGetPowerUsage,
        pynvml.nvmlDeviceGetEnforcedPowerLimit,
        pynvml.nvmlDeviceGetTotalEnergyConsumption,
        pynvml.nvmlDeviceGetCurrentClocksEventReasons,
        pynvml.nvmlDeviceGetSupportedClocksEventReasons,
        pynvml.nvmlDeviceGetAttributes,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            getter(handle)
    for threshold in (
        pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,
        pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,
    ):
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetTemperatureThreshold(handle, threshold)
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"  # the documented default


# --- MIG -----------------------------------------------------------------------------------------


def mig_handles(parent) -> list:
    handles = []
    for index in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent)):
        try:
            handles.append(pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, index))
        except pynvml.NVMLError_NotFound:
            continue
    return handles


def test_h100_mig_instances(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100-mig.json")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetMigMode(parent) == [
        pynvml.NVML_DEVICE_MIG_ENABLE,
        pynvml.NVML_DEVICE_MIG_ENABLE,
    ]
    assert pynvml.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
    migs = mig_handles(parent)
    assert len({address(h) for h in [parent, *migs]}) == 5
    assert [pynvml.nvmlDeviceGetGpuInstanceId(h) for h in migs] == [2, 3, 9, 10]
    assert [pynvml.nvmlDeviceGetComputeInstanceId(h) for h in migs] == [0, 0, 0, 0]
    assert [pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount for h in migs] == [60, 32, 16, 16]
    assert [pynvml.nvmlDeviceGetName(h) for h in migs] == [
        f"NVIDIA H100 80GB HBM3 MIG {profile}"
        for profile in ("3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb")
    ]
    assert [pynvml.nvmlDeviceGetUUID(h) for h in migs] == [
        f"MIG-0000000{i}-0000-0000-0000-00000000000{i}" for i in range(4)
    ]
    attrs = pynvml.nvmlDeviceGetAttributes(migs[0])
    assert (attrs.gpuInstanceSliceCount, attrs.memorySizeMB, attrs.sharedCopyEngineCount) == (
        3,
        40448,
        3,
    )
    for h in migs:
        assert pynvml.nvmlDeviceIsMigDeviceHandle(h)
        assert address(pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)) == address(parent)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetPowerUsage(h)  # whole-GPU readings only on the parent
    assert pynvml.nvmlDeviceGetAttributes(parent).multiprocessorCount == 132
    assert pynvml.nvmlDeviceGetPowerUsage(parent) == 71150
    by_uuid = pynvml.nvmlDeviceGetHandleByUUID("MIG-00000002-0000-0000-0000-000000000002")
    assert address(by_uuid) == address(migs[2])
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, 7)


def test_mig_processes(fake_nvml: FakeNvml):
    config = fake_nvml.load_fixture("h100-mig")
    instances = config["devices"][0]["mig_instances"]
    instances[0]["processes"] = [{"pid": 100, "used_memory_bytes": 1000}]
    instances[3]["processes"] = [{"pid": 103, "used_memory_bytes": 3000}]
    init_with(fake_nvml, config)
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    migs = mig_handles(parent)
    per_instance = [
        [
            (p.pid, p.usedGpuMemory, p.gpuInstanceId)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)
        ]
        for h in migs
    ]
    assert per_instance == [[(100, 1000, 2)], [], [], [(103, 3000, 10)]]
    on_parent = pynvml.nvmlDeviceGetComputeRunningProcesses(parent)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in on_parent] == [
        (100, 2, 0),
        (103, 10, 0),
    ]


def test_a100_mig_4x(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "a100-mig-4x.json")
    parent = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetName(parent) == "NVIDIA A100-SXM4-80GB"
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(parent) == 500000
    migs = mig_handles(parent)
    assert [pynvml.nvmlDeviceGetGpuInstanceId(h) for h in migs] == [3, 4, 5, 6]
    assert [pynvml.nvmlDeviceGetAttributes(h).multiprocessorCount for h in migs] == [14] * 4


# --- error injection and re-reading --------------------------------------------------------------


def test_per_device_error_injection(fake_nvml: FakeNvml):
    config = two_gpus(fake_nvml)
    config["devices"][1]["errors"] = {"nvmlDeviceGetPowerUsage": 15}
    init_with(fake_nvml, config)
    h100, l40s = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(2))
    assert pynvml.nvmlDeviceGetPowerUsage(h100) == 69850
    with pytest.raises(pynvml.NVMLError_GpuIsLost) as caught:
        pynvml.nvmlDeviceGetPowerUsage(l40s)
    assert str(caught.value) == "GPU is lost"
    # the rest of that device still answers, and errors win over values
    assert pynvml.nvmlDeviceGetTemperature(l40s, pynvml.NVML_TEMPERATURE_GPU) == 63


def test_error_names_and_version_suffixes(fake_nvml: FakeNvml):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["errors"] = {
        "nvmlDeviceGetComputeRunningProcesses": "NVML_ERROR_NO_PERMISSION",  # covers _v3
        "nvmlDeviceGetHandleByIndex": "GPU_IS_LOST",  # covers _v2
    }
    init_with(fake_nvml, config)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(0)
    handle = pynvml.nvmlDeviceGetHandleByUUID(H100_UUID)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceGetComputeRunningProcesses(handle)


def test_config_is_reread_when_the_file_changes(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 69850

    fake_nvml.configure(NVML_FIXTURES / "h100-load.json")
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 631950  # same handle, no re-init
    assert address(pynvml.nvmlDeviceGetHandleByIndex(0)) == address(handle)

    lost = fake_nvml.load_fixture("h100-load")
    lost["devices"][0]["errors"] = {"nvmlDeviceGetPowerUsage": 15}
    fake_nvml.configure(lost)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetPowerUsage(handle)

    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 69850


def test_rewrite_in_place_with_same_size_is_noticed(fake_nvml: FakeNvml):
    """Same size, same inode: the nanosecond mtime alone must trigger the re-read."""
    path = fake_nvml.configure(NVML_FIXTURES / "h100.json")
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    text = path.read_text()
    assert '"temperature_c": 41' in text
    before = path.stat()
    path.write_text(text.replace('"temperature_c": 41', '"temperature_c": 42'))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1))
    assert path.stat().st_size == before.st_size
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 42


def test_broken_rewrite_fails_calls_until_fixed(fake_nvml: FakeNvml, capfd):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    fake_nvml.configure_text("{not json")
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    err = capfd.readouterr().err
    assert err.count("re-reading the config failed") == 1  # once per broken version
    fake_nvml.configure(NVML_FIXTURES / "h100-load.json")
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 631950


def test_handles_of_devices_that_went_away_are_invalid(fake_nvml: FakeNvml):
    init_with(fake_nvml, two_gpus(fake_nvml))
    second = pynvml.nvmlDeviceGetHandleByIndex(1)
    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    assert pynvml.nvmlDeviceGetCount() == 1
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(second)


def test_invalid_handles_are_rejected(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    bogus = ctypes.cast(ctypes.c_void_p(16), pynvml.c_nvmlDevice_t)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        pynvml.nvmlDeviceGetPowerUsage(bogus)


def test_delay_releases_the_lock(fake_nvml: FakeNvml):
    config = fake_nvml.load_fixture("h100")
    config["devices"][0]["delays_ms"] = {"nvmlDeviceGetPowerUsage": 400}
    init_with(fake_nvml, config)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    done = {}

    def slow():
        start = time.monotonic()
        done["power"] = pynvml.nvmlDeviceGetPowerUsage(handle)
        done["elapsed"] = time.monotonic() - start

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.05)
    start = time.monotonic()
    assert pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU) == 41
    assert time.monotonic() - start < 0.2
    thread.join()
    assert done["power"] == 69850
    assert done["elapsed"] >= 0.39


def test_concurrent_calls_while_the_file_changes(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    errors: list[BaseException] = []
    seen: set[int] = set()

    def poll():
        try:
            for _ in range(200):
                seen.add(pynvml.nvmlDeviceGetPowerUsage(handle))
                pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_MEMORY_TEMP])
                pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=poll) for _ in range(4)]
    for thread in threads:
        thread.start()
    for i in range(20):
        fake_nvml.configure(NVML_FIXTURES / ("h100-load.json" if i % 2 else "h100.json"))
        time.sleep(0.002)
    for thread in threads:
        thread.join()
    assert errors == []
    assert seen <= {69850, 631950}


def test_call_counts(fake_nvml: FakeNvml):
    init_with(fake_nvml, NVML_FIXTURES / "h100.json")
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for _ in range(3):
        pynvml.nvmlDeviceGetPowerUsage(handle)
    assert fake_nvml.call_count("nvmlDeviceGetPowerUsage") == 3
    assert fake_nvml.call_count("nvmlInitWithFlags") == 1
    assert fake_nvml.call_count("nvmlDeviceGetHandleByIndex_v2") == 1
    assert fake_nvml.call_count() >= 5


# --- the fixture files ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(NVML_FIXTURES.glob("*.json")), ids=lambda p: p.name)
def test_every_fixture_loads(fake_nvml: FakeNvml, path: pathlib.Path):
    init_with(fake_nvml, path)
    config = json.loads(path.read_text())
    assert pynvml.nvmlDeviceGetCount() == len(config["devices"])
    for index, device in enumerate(config["devices"]):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        assert pynvml.nvmlDeviceGetUUID(handle) == device["uuid"]
        assert pynvml.nvmlDeviceGetPowerUsage(handle) == device["power_mw"]
    licences = {p.name for p in NVML_FIXTURES.glob("LICENSE.*")}
    assert licences == {"LICENSE.nvidia_gpu_exporter", "LICENSE.telegraf"}


# --- power limits: constraints, the setter, the power that follows (issue 20) --------------------


def cappable_h100(fake_nvml: FakeNvml, power_mw: int = 650_000) -> dict:
    """The H100 at `power_mw`, with its range (200-700 W) and default limit (700 W)."""
    config = fake_nvml.load_fixture("h100")
    config["devices"][0].update(
        power_mw=power_mw,
        default_power_limit_mw=700_000,
        power_limit_constraints_mw=[200_000, 700_000],
    )
    return config


def test_a_set_limit_is_enforced_and_the_power_follows_it(fake_nvml: FakeNvml):
    init_with(fake_nvml, cappable_h100(fake_nvml))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200_000, 700_000]
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 650_000

    pynvml.nvmlDeviceSetPowerManagementLimit(handle, 410_000)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle) == 410_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 410_000
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 410_000  # min(draw, limit)

    # The limit is the driver's, not the file's: a changed file keeps it.
    fake_nvml.configure(cappable_h100(fake_nvml, power_mw=300_000))
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 300_000
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 410_000


def test_a_limit_outside_the_range_is_invalid_and_changes_nothing(fake_nvml: FakeNvml):
    init_with(fake_nvml, cappable_h100(fake_nvml))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    for limit in (199_999, 700_001):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceSetPowerManagementLimit(handle, limit)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 650_000


def test_no_permission_and_no_range_are_refused(fake_nvml: FakeNvml):
    config = cappable_h100(fake_nvml)
    config["devices"][0]["errors"] = {"nvmlDeviceSetPowerManagementLimit": "NO_PERMISSION"}
    init_with(fake_nvml, config)
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(handle, 410_000)
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 700_000
    # The fixture as captured: no range, no default: the card's limit cannot be set.
    fake_nvml.configure(NVML_FIXTURES / "h100.json")
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceSetPowerManagementLimit(handle, 410_000)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)


@pytest.mark.parametrize(
    ("constraints", "reason"),
    [
        ([700_000, 200_000], "min 700000 is above max 200000"),
        ([200_000], "must be null or [min, max]"),
        ("200-700", "must be null or [min, max]"),
    ],
)
def test_a_bad_range_makes_the_file_invalid(fake_nvml: FakeNvml, capfd, constraints, reason):
    config = cappable_h100(fake_nvml)
    config["devices"][0]["power_limit_constraints_mw"] = constraints
    fake_nvml.configure(config)
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
    assert reason in capfd.readouterr().err


def test_the_state_file_carries_a_limit_past_the_process(
    fake_nvml: FakeNvml, monkeypatch, tmp_path
):
    state = tmp_path / "nvml-state.json"
    monkeypatch.setenv("FAKE_NVML_STATE", str(state))
    init_with(fake_nvml, cappable_h100(fake_nvml))
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    pynvml.nvmlDeviceSetPowerManagementLimit(handle, 450_000)
    assert json.loads(state.read_text()) == {"power_limits_mw": {H100_UUID: 450_000}}
    fake_nvml.reset()  # as a new process: nothing held in memory
    init_with(fake_nvml, cappable_h100(fake_nvml))
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 450_000
    assert pynvml.nvmlDeviceGetPowerUsage(handle) == 450_000
    fake_nvml.reset()
    state.write_text('{"power_limits_mw": {"GPU-x": "450 W"}}')
    fake_nvml.configure(cappable_h100(fake_nvml))
    with pytest.raises(pynvml.NVMLError_Unknown):
        pynvml.nvmlInit()
