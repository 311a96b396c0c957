"""Fixture trees and recordings of the node power sources (Cray PMC, ACPI power meter, IPMI),
shared by each source's tests and by test_node_power."""

from __future__ import annotations

import os
from pathlib import Path

from tests.shared_fixtures import SHARED_FIXTURES

# --- Cray PMC (tests/test_cray.py) ---------------------------------------------------------------
STAMP = 1573671385347629


#: An EX node with four GPUs: every file the controller writes, most not read.
EX_NODE = {
    "power": "1210 W",
    "energy": "2583427 J",
    "cpu_power": "140 W",
    "cpu_energy": "402211 J",
    "cpu_temp": "51 C",
    "memory_power": "31 W",
    "memory_energy": "98345 J",
    "accel0_power": "240 W",
    "accel1_power": "236 W",
    "accel2_power": "251 W",
    "accel3_power": "244 W",
    "accel0_energy": "412000 J",
    "power_cap": "0 W",
    "generation": "8",
    "startup": "1573650000001234",
    "version": "2",
    "raw_scan_hz": "10",
    "freshness": "16345",
}


def write_tree(sysfs: Path, counters: dict[str, str]) -> Path:
    root = sysfs / "cray" / "pm_counters"
    root.mkdir(parents=True, exist_ok=True)
    for name, value in counters.items():
        unit = len(value.split()) > 1
        (root / name).write_text(f"{value} {STAMP} us\n" if unit else f"{value}\n")
    return root


# --- ACPI power meter (tests/test_hwmon_power.py) -----------------------------------------------
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


# --- IPMI: CEEMS' recordings of the three DCMI tools (tests/test_ipmi.py) -----------------------
OUTPUTS = SHARED_FIXTURES / "ceems" / "bsd3" / "tool-outputs"
