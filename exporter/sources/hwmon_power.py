"""Whole-node power from hwmon, where the platform reports the node or its sockets there.

Reads `<sysfs>/class/hwmon/hwmon*/` (and each entry's `device/`, where the
ACPI power meter keeps its files): `powerN_input`, else `powerN_average`
(µW), and `energyN_input` (µJ). Chips are told apart by their `name` file, as
the `hwmon` source does, and named by the same `chip` label.

Which sensors are the node, when `sensors` is not configured:

- an ACPI power meter (`name` = `power_meter`, ACPI000D: the platform
  firmware's meter of the system's input power) whose label or
  `powerN_oem_info` names no socket is the node — when there is exactly one;
  several such meters are ambiguous and give no series;
- ACPI power meters whose description names a socket (NVIDIA Grace:
  `Module Power Socket 0`, `Grace Power Socket 0`, `CPU Power Socket 0`,
  `SysIO Power Socket 0`): the node is the sum of the `Module Power Socket N`
  meters (the whole superchip module of each socket; on GH200 it includes the
  GPU). A Grace CPU Superchip has no module meter: no node series here (its
  BMC measures the node). The Grace, CPU and SysIO rails are never the node:
  they give the CPU package and DRAM power (`grace_rails.py`), with or without
  a module meter and whatever `sensors` says;
- nothing else (GPU, NVMe, Super-I/O, PMBus rails, AMD's `amd_energy`, which
  is RAPL again) is ever taken for the node.

`sensors: ["CHIP:SENSOR", …]` replaces that guess: the named sensors (CHIP the
`name` file or the `chip` label, SENSOR the label, the `oem_info` text, or
`powerN`/`energyN`, split at the last colon) are summed; power sensors give the node's power, energy
sensors its energy counter, and the power is derived from the energy between
two polls when only energy sensors are named.

Emits:

    llmgw_node_power_watts{source="hwmon_power"} 612.5
    llmgw_node_energy_joules_total{source="hwmon_power"} 1234567.0
    llmgw_node_cpu_power_watts{package="0"} 220.0     # Grace: CPU + SysIO rails
    llmgw_node_dram_power_watts{package="0"} 30.0     # Grace: Grace − CPU − SysIO

Missing data:
- no `class/hwmon` directory, or no node meter → `NoData`;
- a sensor with `powerN_enable` = 0, or an unreadable or non-numeric value →
  absent; a node sum of 0 W or above 50 kW → absent;
- one of the module meters (or a configured sensor) unreadable or missing, or
  a socket with rail meters but no module meter →
  the source is down with no power series (a partial sum would understate the
  node);
- the energy counter (the sum of the named energy sensors) is published from 0
  at the exporter's start, by the rule of exporter/energy.py: one that went
  backwards (reboot, driver reload) or rose by more than a node draws (50 kW)
  is a reset: no power and nothing added for that interval, one log line,
  `llmgw_exporter_energy_resets_total{source="hwmon_power"}` counts it;
- Grace rails: as `grace_rails.py` says; a rail problem with the node read →
  the node is served and the source reads down; a node problem with the rails
  read → the rails are served and the source reads down.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from exporter.energy import EnergyCounter
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from exporter.sources.bmc import (
    NODE_ENERGY_METRIC,
    NODE_POWER_MAX_WATTS,
    NODE_POWER_METRIC,
    node_power,
)
from exporter.sources.grace_rails import CPU_POWER_METRIC, DRAM_POWER_METRIC, grace_rail_samples
from exporter.sources.hwmon import chip_names, clean_name
from exporter.sysfs import read_int, read_text

#: hwmon drivers whose meters may read the whole node (ACPI power meter, ACPI000D).
NODE_METER_DRIVERS = frozenset({"power_meter"})

_SENSOR_FILE = re.compile(r"(power|energy)(\d+)_(input|average)")
_SOCKET = re.compile(r"\bsocket\s*(\d+)\b", re.IGNORECASE)
_UNITS_PER_BASE = 1e6  # µW per W, µJ per J


class HwmonPowerConfig(SourceConfig):
    #: `CHIP:SENSOR` entries whose sum is the node; unset: the built-in classification.
    sensors: list[str] | None = None


@dataclass(frozen=True, slots=True)
class _Sensor:
    chip: str  # the `chip` label
    driver: str  # the `name` file, cleaned
    attr: str  # powerN or energyN
    label: str  # powerN_label, else powerN_oem_info, else ""
    value: float | None  # W or J; None when disabled or unreadable

    @property
    def kind(self) -> str:
        return "power" if self.attr.startswith("power") else "energy"


def _driver(entry: Path) -> str:
    return clean_name(read_text(entry / "name") or read_text(entry / "device" / "name") or "")


def _sensors(entry: Path, chip: str) -> list[_Sensor]:
    """The entry's power and energy sensors; its own files win over `device/`'s."""
    where: dict[str, dict[str, Path]] = {}
    for directory in (entry / "device", entry):
        try:
            files = os.listdir(directory)
        except OSError:
            continue
        for file in files:
            if match := _SENSOR_FILE.fullmatch(file):
                where.setdefault(f"{match[1]}{match[2]}", {})[match[3]] = directory
    driver = _driver(entry)
    sensors = []
    for attr in sorted(where):
        found = where[attr]
        directory = found.get("input") or found["average"]
        suffix = "input" if "input" in found else "average"

        label = next(
            (
                text
                for name in ("label", "oem_info")
                for place in (directory, entry, entry / "device")
                if (text := read_text(place / f"{attr}_{name}"))
            ),
            "",
        )
        raw = (
            None
            if read_int(directory / f"{attr}_enable") == 0
            else read_int(directory / f"{attr}_{suffix}")
        )
        value = None if raw is None or raw < 0 else raw / _UNITS_PER_BASE
        sensors.append(_Sensor(chip, driver, attr, label, value))
    return sensors


class HwmonPowerSource(Source):
    name: ClassVar[str] = "hwmon_power"
    default_interval: ClassVar[float] = 5.0
    Config: ClassVar[type[SourceConfig]] = HwmonPowerConfig
    # Never two figures for one package: RAPL, where a machine has it, wins.
    defer: ClassVar[dict[str, str]] = {CPU_POWER_METRIC: "rapl", DRAM_POWER_METRIC: "rapl"}
    config: HwmonPowerConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config)
        self._clock = clock
        self._energy: EnergyCounter | None = None  # the named energy sensors' sum
        self._warming = False

    @property
    def warming_up(self) -> bool:
        return self._warming

    def poll(self) -> list[Sample]:
        root = self.sysfs / "class" / "hwmon"
        if not root.is_dir():
            raise NoData(f"{root} does not exist")
        entries = sorted(p for p in root.glob("hwmon*") if p.is_dir())
        sensors = [s for entry, chip in chip_names(entries).items() for s in _sensors(entry, chip)]
        rails, rails_problem = grace_rail_samples(
            (s.label, s.value)
            for s in sensors
            if s.driver in NODE_METER_DRIVERS and s.kind == "power"
        )
        try:
            if self.config.sensors is not None:
                chosen = self._configured(sensors, self.config.sensors)
            else:
                chosen = self._classified(sensors)
            node = self._samples(chosen)
        except NoData:
            if not rails and rails_problem is None:
                raise
            node = []  # a Grace CPU Superchip: no module meter, the node is the BMC's
        except RuntimeError as exc:
            if not rails:
                raise
            raise PartialReading(rails, str(exc)) from exc
        samples = node + rails
        if rails_problem is not None:
            if not samples:
                raise RuntimeError(rails_problem)
            raise PartialReading(samples, rails_problem)
        return samples

    @staticmethod
    def _configured(sensors: list[_Sensor], wanted: list[str]) -> list[_Sensor]:
        chosen = []
        for entry in wanted:
            chip, _, name = entry.rpartition(":")
            matches = [
                s
                for s in sensors
                if chip in (s.chip, s.driver) and name in (s.label, s.attr) and s not in chosen
            ]
            if not matches:
                raise RuntimeError(f"no hwmon power or energy sensor {entry!r}")
            chosen.append(matches[0])
        return chosen

    @staticmethod
    def _classified(sensors: list[_Sensor]) -> list[_Sensor]:
        meters = [s for s in sensors if s.driver in NODE_METER_DRIVERS and s.kind == "power"]
        whole = [s for s in meters if not _SOCKET.search(s.label)]
        modules = [
            s for s in meters if _SOCKET.search(s.label) and s.label.lower().startswith("module")
        ]
        if len(whole) == 1 and not modules:
            return whole
        if modules and not whole:
            sockets = {m[1] for s in meters if (m := _SOCKET.search(s.label))}
            missing = sockets - {m[1] for s in modules if (m := _SOCKET.search(s.label))}
            if missing:
                raise RuntimeError(
                    f"no Module Power meter for socket {', '.join(sorted(missing))}:"
                    " the node's sum would be short"
                )
            return modules
        if whole:
            raise NoData(
                f"{len(whole) + len(modules)} ACPI power meters and no way to tell which is the"
                " node: name them in sources.hwmon_power.sensors"
            )
        raise NoData("no hwmon power meter of the whole node or its sockets")

    def _samples(self, chosen: list[_Sensor]) -> list[Sample]:
        unread = [f"{s.chip}:{s.label or s.attr}" for s in chosen if s.value is None]
        if unread:
            if self._energy is not None:
                self._energy.raw = None  # the next sum starts a new interval
            raise RuntimeError(f"cannot read {', '.join(unread)}: the node's sum would be short")
        labels = {"source": self.name}
        samples: list[Sample] = []
        power = [s.value or 0.0 for s in chosen if s.kind == "power"]
        energy = [s.value or 0.0 for s in chosen if s.kind == "energy"]
        watts: float | None = sum(power) if power else None
        if energy:
            if self._energy is None:
                self._energy = self.energy_counter(
                    NODE_ENERGY_METRIC, "node energy", NODE_POWER_MAX_WATTS
                )
            first = self._energy.raw is None
            derived = self._energy.advance(sum(energy), self._clock())
            samples.append(Sample(NODE_ENERGY_METRIC, self._energy.total, dict(labels)))
            if not power:
                self._warming = first
                watts = derived
        if (watts := node_power(watts)) is not None:
            samples.insert(0, Sample(NODE_POWER_METRIC, watts, labels))
        return samples
