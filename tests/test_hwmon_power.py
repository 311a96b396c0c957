"""hwmon_power source: Kepler's hwmon power/energy variants, and ACPI power meter trees.

Kepler's trees (../shared/fixtures/kepler) hold GPU, k10temp and rail meters
but no meter of a whole node, so they are read with `sensors` named. The
ACPI power meter trees (an x86 server, an NVIDIA Grace superchip) are
**synthetic**, laid out as the kernel's acpi_power_meter driver does: the
files on the ACPI000D device, `hwmonN/device` linking to it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.samples import NoData, Sample
from exporter.sources.hwmon_power import HwmonPowerConfig, HwmonPowerSource
from tests.shared_fixtures import SHARED_FIXTURES

KEPLER = SHARED_FIXTURES / "kepler" / "sys"
POWER = "llmgw_node_power_watts"
ENERGY = "llmgw_node_energy_joules_total"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source(sysfs: Path, clock: FakeClock | None = None, **keys: object) -> HwmonPowerSource:
    return HwmonPowerSource(sysfs, HwmonPowerConfig.model_validate(keys), clock or FakeClock())


def kepler(tmp_path: Path) -> Path:
    shutil.copytree(KEPLER, tmp_path / "sys", symlinks=True)
    for root, dirs, files in os.walk(tmp_path / "sys"):  # the shared copy is read-only
        for name in dirs + files:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(0o755 if path.is_dir() else 0o644)
    return tmp_path / "sys"


def acpi_meter(sysfs: Path, index: int, microwatts: int | str | None, oem_info: str | None) -> Path:
    """One ACPI power meter: /sys/devices/LNXSYSTM:00/LNXSYBUS:00/ACPI000D:0N + its hwmon."""
    device = sysfs / "devices" / "LNXSYSTM:00" / "LNXSYBUS:00" / f"ACPI000D:0{index}"
    hwmon = device / "hwmon" / f"hwmon{index}"
    hwmon.mkdir(parents=True)
    (hwmon / "device").symlink_to(Path("../../../") / device.name)
    (device / "name").write_text("power_meter\n")
    if microwatts is not None:
        (device / "power1_average").write_text(f"{microwatts}\n")
    (device / "power1_average_interval").write_text("1000\n")
    (device / "power1_is_battery").write_text("0\n")
    if oem_info is not None:
        (device / "power1_oem_info").write_text(f"{oem_info}\n")
    link = sysfs / "class" / "hwmon" / f"hwmon{index}"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(hwmon, link.parent))
    return device


Module = int | str | None  # µW; a string is written as it is; None: no such meter


def grace(sysfs: Path, module_uw: tuple[Module, Module] = (612_500_000, 580_000_000)) -> None:
    """A Grace superchip's 2 × 4 meters, as NVIDIA's tuning guide lists them."""
    index = 0
    for socket, module in enumerate(module_uw):
        for rail, uw in (
            ("Module", module),
            ("Grace", 250_000_000),
            ("CPU", 180_000_000),
            ("SysIO", 40_000_000),
        ):
            if rail == "Module" and module is None:
                continue
            acpi_meter(sysfs, index, uw, f"{rail} Power Socket {socket}")
            index += 1


def test_grace_node_is_the_sum_of_its_modules(tmp_path: Path) -> None:
    grace(tmp_path)
    assert source(tmp_path).poll() == [Sample(POWER, 1192.5, {"source": "hwmon_power"})]


@pytest.mark.parametrize(
    ("module", "reason"),
    [
        ("garbage", "cannot read lnxsybus:00_acpi000d:04:Module Power Socket 1"),
        (None, "no Module Power meter for socket 1"),
    ],
)
def test_grace_with_a_module_missing_publishes_no_short_sum(
    tmp_path: Path, module: Module, reason: str
) -> None:
    grace(tmp_path, (612_500_000, module))
    state = SourceRunner(source(tmp_path), 5).poll_once()
    assert (state.up, state.samples) == (False, ())
    assert reason in state.reason
    assert "the node's sum would be short" in state.reason


def test_one_server_meter_is_the_node(tmp_path: Path) -> None:
    acpi_meter(tmp_path, 0, 431_000_000, None)
    assert source(tmp_path).poll() == [Sample(POWER, 431.0, {"source": "hwmon_power"})]


def test_two_server_meters_are_not_guessed(tmp_path: Path) -> None:
    acpi_meter(tmp_path, 0, 431_000_000, None)
    acpi_meter(tmp_path, 1, 15_000_000, None)
    with pytest.raises(NoData, match="no way to tell which is the node"):
        source(tmp_path).poll()


def test_a_meter_named_in_sensors_settles_it(tmp_path: Path) -> None:
    acpi_meter(tmp_path, 0, 431_000_000, None)
    acpi_meter(tmp_path, 1, 15_000_000, None)
    samples = source(tmp_path, sensors=["lnxsybus:00_acpi000d:00:power1"]).poll()
    assert samples == [Sample(POWER, 431.0, {"source": "hwmon_power"})]


def test_kepler_tree_has_no_node_meter(tmp_path: Path) -> None:
    """GPU (amdgpu), CPU (k10temp) and rail meters are never the node."""
    with pytest.raises(NoData, match="no hwmon power meter"):
        source(kepler(tmp_path)).poll()


def test_named_rails_are_summed(tmp_path: Path) -> None:
    sysfs = kepler(tmp_path)
    samples = source(sysfs, sensors=["test_power_chip:PSU_Rail_A", "test_power_chip:PSU_Rail_B"])
    assert samples.poll() == [Sample(POWER, 60.0, {"source": "hwmon_power"})]


def test_a_disabled_named_sensor_is_a_failure(tmp_path: Path) -> None:
    sysfs = kepler(tmp_path)
    with pytest.raises(RuntimeError, match="cannot read test_power_chip:PSU_Rail_C"):
        source(sysfs, sensors=["test_power_chip:PSU_Rail_C"]).poll()


def test_a_missing_named_sensor_is_a_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no hwmon power or energy sensor 'psu:PIN'"):
        source(kepler(tmp_path), sensors=["psu:PIN"]).poll()


def test_an_energy_meter_gives_the_counter_and_then_power(tmp_path: Path) -> None:
    sysfs = kepler(tmp_path)
    clock = FakeClock()
    runner = SourceRunner(source(sysfs, clock, sensors=["energy_meter:Total"]), 5)
    first = runner.poll_once()
    assert list(first.samples) == [Sample(ENERGY, 500.0, {"source": "hwmon_power"})]
    assert not first.settled  # power needs a second reading
    (sysfs / "class" / "hwmon" / "hwmon_energy" / "energy1_input").write_text("502500000\n")
    clock.now += 5
    second = runner.poll_once()
    assert list(second.samples) == [
        Sample(POWER, 0.5, {"source": "hwmon_power"}),
        Sample(ENERGY, 502.5, {"source": "hwmon_power"}),
    ]
    assert second.settled


def test_an_energy_counter_that_went_back_gives_no_power(tmp_path: Path) -> None:
    sysfs = kepler(tmp_path)
    clock = FakeClock()
    meter = source(sysfs, clock, sensors=["energy_meter:Total"])
    meter.poll()
    (sysfs / "class" / "hwmon" / "hwmon_energy" / "energy1_input").write_text("1000\n")
    clock.now += 5
    assert [s.metric for s in meter.poll()] == [ENERGY]


def test_no_hwmon_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        source(tmp_path).poll()
