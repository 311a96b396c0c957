"""hwmon_power source: Kepler's hwmon power/energy variants, and ACPI power meter trees.

Kepler's trees (tests/fixtures/kepler) hold GPU, k10temp and rail meters
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

from exporter.collector import served_samples
from exporter.poller import SourceRunner
from exporter.samples import NoData, Sample
from exporter.sources.hwmon_power import HwmonPowerConfig, HwmonPowerSource
from tests.node_power_helpers import acpi_meter
from tests.shared_fixtures import SHARED_FIXTURES

KEPLER = SHARED_FIXTURES / "kepler" / "sys"
POWER = "llmgw_node_power_watts"
ENERGY = "llmgw_node_energy_joules_total"
CPU = "llmgw_node_cpu_power_watts"
DRAM = "llmgw_node_dram_power_watts"


def rails(packages: dict[str, tuple[float, float]]) -> list[Sample]:
    """The Grace rails' samples: {package: (CPU package W, DRAM W)}, in the source's order."""
    cpu = [Sample(CPU, watts, {"package": p}) for p, (watts, _) in packages.items()]
    return cpu + [Sample(DRAM, watts, {"package": p}) for p, (_, watts) in packages.items()]


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


Module = int | str | None  # µW; a string is written as it is; None: no such meter


def grace(sysfs: Path, module_uw: tuple[Module, Module] = (612_500_000, 580_000_000)) -> None:
    """Two Grace sockets with a module meter each (two GH200s on one board), 2 × 4 meters."""
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
    assert source(tmp_path).poll() == [
        Sample(POWER, 1192.5, {"source": "hwmon_power"}),
        *rails({"0": (220.0, 30.0), "1": (220.0, 30.0)}),  # CPU 180 + SysIO 40; Grace 250
    ]


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
    assert state.up is False
    assert POWER not in {s.metric for s in state.samples}  # the rails are still served
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
    # Counted from 0 at the exporter's start (exporter/energy.py).
    assert list(first.samples) == [Sample(ENERGY, 0.0, {"source": "hwmon_power"})]
    assert not first.settled  # power needs a second reading
    (sysfs / "class" / "hwmon" / "hwmon_energy" / "energy1_input").write_text("502500000\n")
    clock.now += 5
    second = runner.poll_once()
    assert list(second.samples) == [
        Sample(POWER, 0.5, {"source": "hwmon_power"}),
        Sample(ENERGY, 2.5, {"source": "hwmon_power"}),
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
    assert meter.counter_resets()[0].value == 1


def test_an_energy_jump_no_node_draws_is_a_reset(tmp_path: Path) -> None:
    sysfs = kepler(tmp_path)
    energy = sysfs / "class" / "hwmon" / "hwmon_energy" / "energy1_input"
    clock = FakeClock()
    meter = source(sysfs, clock, sensors=["energy_meter:Total"])
    meter.poll()  # 500 J
    energy.write_text(f"{500_000_000 + 300_000_000_000}\n")  # +300 kJ in 5 s: 60 kW
    clock.now += 5
    assert {s.metric: s.value for s in meter.poll()} == {ENERGY: 0.0}
    energy.write_text(f"{500_000_000 + 300_000_000_000 + 5_000_000_000}\n")  # +5 kJ: 1 kW
    clock.now += 5
    assert {s.metric: s.value for s in meter.poll()} == {POWER: 1000.0, ENERGY: 5000.0}
    assert [(s.labels, s.value) for s in meter.counter_resets()] == [
        ({"source": "hwmon_power", "metric": ENERGY}, 1)
    ]


def test_no_hwmon_is_no_data(tmp_path: Path) -> None:
    with pytest.raises(NoData):
        source(tmp_path).poll()


# --- NVIDIA Grace's per-socket rails as CPU package and DRAM power -------------------------
# Trees written from the documented format, not copied from a machine: NVIDIA's
# firmware (edk2-nvidia, the TH500 SSDTs) declares four ACPI000D meters per
# socket, `Module`, `Grace`, `CPU` and `SysIO Power Socket N` in their OEM
# information; NVIDIA's Grace tuning guide ("Power Telemetry", as Alumet's
# grace-hopper plugin documents it) has no module meter on the Grace CPU
# Superchip. The kernel's acpi_power_meter driver serves each as
# power1_average (µW) and power1_oem_info.

Rail = tuple[str, int | str | None]  # (oem_info rail name, µW); None: no such meter


def grace_sockets(sysfs: Path, sockets: list[list[Rail]]) -> None:
    index = 0
    for socket, meters in enumerate(sockets):
        for rail, microwatts in meters:
            if microwatts is not None:
                acpi_meter(sysfs, index, microwatts, f"{rail} Power Socket {socket}")
                index += 1


def grace_grace(sysfs: Path, cpu1: int | str = 120_000_000) -> None:
    """A Grace CPU Superchip: 2 sockets × Grace, CPU, SysIO; no module meter."""
    grace_sockets(
        sysfs,
        [
            [("Grace", 185_000_000), ("CPU", 140_000_000), ("SysIO", 30_000_000)],
            [("Grace", 165_000_000), ("CPU", cpu1), ("SysIO", 30_000_000)],
        ],
    )


def gh200(sysfs: Path, grace_uw: int | str | None = 250_000_000) -> None:
    """A GH200 Grace Hopper Superchip: one socket × Module, Grace, CPU, SysIO."""
    meters: list[Rail] = [
        ("Module", 900_000_000),
        ("Grace", grace_uw),
        ("CPU", 180_000_000),
        ("SysIO", 40_000_000),
    ]
    grace_sockets(sysfs, [meters])


def test_grace_grace_publishes_packages_and_dram_and_no_node(tmp_path: Path) -> None:
    """No module meter: the node is the BMC's; CPU 140 + SysIO 30, Grace 185 − 170."""
    grace_grace(tmp_path)
    state = SourceRunner(source(tmp_path), 5).poll_once()
    assert state.up, state.reason
    assert list(state.samples) == rails({"0": (170.0, 15.0), "1": (150.0, 15.0)})


def test_gh200_publishes_its_module_as_the_node_and_its_rails(tmp_path: Path) -> None:
    gh200(tmp_path)
    assert source(tmp_path).poll() == [
        Sample(POWER, 900.0, {"source": "hwmon_power"}),
        *rails({"0": (220.0, 30.0)}),
    ]


def test_a_grace_meter_below_its_rails_reads_no_dram(tmp_path: Path) -> None:
    """Each meter averages over its own window: 210 < 180 + 40 gives 0 W, never negative."""
    gh200(tmp_path, grace_uw=210_000_000)
    assert [s.value for s in source(tmp_path).poll() if s.metric == DRAM] == [0.0]


def test_without_grace_meters_the_packages_are_served_alone(tmp_path: Path) -> None:
    gh200(tmp_path, grace_uw=None)
    samples = source(tmp_path).poll()
    assert [(s.metric, s.value) for s in samples] == [(POWER, 900.0), (CPU, 220.0)]


def test_an_unreadable_grace_meter_reads_down_with_the_packages_served(tmp_path: Path) -> None:
    gh200(tmp_path, grace_uw="garbage")
    state = SourceRunner(source(tmp_path), 5).poll_once()
    assert state.up is False
    assert "cannot read Grace Power Socket 0: no Grace DRAM power" in state.reason
    assert [(s.metric, s.value) for s in state.samples] == [(POWER, 900.0), (CPU, 220.0)]


def test_an_unreadable_cpu_rail_gives_no_package_of_any_socket(tmp_path: Path) -> None:
    grace_grace(tmp_path, cpu1="garbage")
    state = SourceRunner(source(tmp_path), 5).poll_once()
    assert (state.up, state.samples) == (False, ())
    assert "cannot read CPU Power Socket 1: no Grace CPU package power" in state.reason


def test_configured_node_sensors_keep_the_rails(tmp_path: Path) -> None:
    gh200(tmp_path)
    acpi_meter(tmp_path, 9, 950_000_000, None)  # a platform meter the operator names
    samples = source(tmp_path, sensors=["lnxsybus:00_acpi000d:09:power1"]).poll()
    assert samples == [
        Sample(POWER, 950.0, {"source": "hwmon_power"}),
        *rails({"0": (220.0, 30.0)}),
    ]


@pytest.mark.parametrize("rapl_serves", [True, False])
def test_rapl_wins_over_the_grace_rails(tmp_path: Path, rapl_serves: bool) -> None:
    """Never two figures for one package, should a machine have both."""
    gh200(tmp_path)
    runner = SourceRunner(source(tmp_path), 5)
    runner.poll_once()
    served = {"rapl": {CPU, DRAM} if rapl_serves else set(), "hwmon_power": set()}
    metrics = [s.metric for s in served_samples(runner, served)]
    assert metrics == ([POWER] if rapl_serves else [POWER, CPU, DRAM])
