"""CPU package and board inlet temperatures from `/sys/class/hwmon`.

Emits (values in °C, read from `tempN_input` in millidegrees):

    llmgw_node_cpu_temperature_celsius{chip="platform_coretemp_0",sensor="Package id 0"} 55.0
    llmgw_node_cpu_temperature_celsius{chip="pci0000:00_0000:00:18_3",sensor="Tdie"} 48.25
    llmgw_node_inlet_temperature_celsius{chip="platform_nct6775_656",sensor="SYSTIN"} 24.0

`chip` is node_exporter's `chip` label for the same hwmon entry, so the two can
be joined: `<device's parent dir>_<device dir>` from the resolved `device`
link, else the `name` file, else the `hwmonN` directory; cleaned as
node_exporter's `cleanMetricName` does; where entries share a label (several
hwmon nodes under one device), suffixed with the `name` file if that tells
them apart, else with `hwmonN`. `sensor` is the sensor's `tempN_label` text,
else (no label, or a label two inlet sensors of one chip share) `tempN`.

CPU chips are those whose `name` is in `CPU_DRIVERS`. Thermal-zone bridges
(`cpu_thermal`, `soc_thermal`, `acpitz`) are not: they are the thermal
framework's view of a trip sensor (an SoC on an ARM board, an ACPI zone on a
server), not a package sensor, and would duplicate or misname one. Per CPU chip
(one per package: a 2-socket box has two) one series: AMD `Tdie`, else `Tctl`
(it carries an offset on some Ryzen/Threadripper parts, where `Tdie` is also
published), else Intel `Package id N`/`Physical id N`, else the hottest other
sensor (cores, CCDs). Inlet: every non-CPU sensor whose label has the word
SYSTIN, Inlet or Ambient (any case), one series each.

Missing data:
- no `class/hwmon` directory → `NoData`; no CPU chip with a temperature
  sensor and no inlet sensor → `NoData` (or, when a chip failed to list, that
  chip's error);
- a sensor with `tempN_fault` set, `tempN_enable` = 0, an unreadable or
  non-integer input, or a value outside the bounds below → absent;
- one chip failing to list → the rest are served, and the source reported
  down naming that chip (`PartialReading`);
- one chip whose read blocks (a file whose read never returns: a hung
  Super-I/O or BMC-backed driver) → each chip is read on a thread of its own
  with half the poll's deadline (deadline.HangGuard, one per chip): the stuck
  chip is abandoned, the others are served (a CPU going to 90 °C on another
  chip is still seen), and the source is reported down naming the stuck chip.
  While that chip's abandoned read has not returned no new read of it is
  started; its series are absent (never its last value);
- a `PermissionError` anywhere propagates: the source is down, not absent.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from exporter.deadline import Call, HangGuard, Hung
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from exporter.sysfs import read_int, read_text

CPU_METRIC = "llmgw_node_cpu_temperature_celsius"
INLET_METRIC = "llmgw_node_inlet_temperature_celsius"

#: hwmon drivers that read a CPU's own die sensors.
CPU_DRIVERS = frozenset({"coretemp", "k10temp", "k8temp", "zenpower", "via_cputemp"})
INLET_WORDS = frozenset({"systin", "inlet", "ambient"})

# Physical bounds, inclusive. A running package is never colder than the air
# or water cooling it (ASHRAE's lowest allowable supply is 5 °C), and 0 is what
# some drivers return for a channel they do not implement. Nothing runs above
# 150 °C: tjmax is about 100-105 °C and k10temp's largest Tctl offset is 27 °C;
# 255 °C is an all-ones 8-bit register.
CPU_MIN_CELSIUS = 5.0
CPU_MAX_CELSIUS = 150.0
# Inlet air below -20 °C or above 80 °C is a wrong reading, not weather:
# disconnected Super-I/O thermistor inputs read -62 °C, 127 °C or 255 °C.
INLET_MIN_CELSIUS = -20.0
INLET_MAX_CELSIUS = 80.0

_INPUT_FILE = re.compile(r"temp(\d+)_input")
_PACKAGE_LABEL = re.compile(r"(package|physical) id \d+", re.IGNORECASE)
_INVALID_CHARS = re.compile(r"[^a-z0-9:_]")
_WORD_SEP = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True, slots=True)
class _Temp:
    attr: str
    label: str | None
    celsius: float | None  # None when disabled, faulted or unreadable

    @property
    def sensor(self) -> str:
        return self.label or self.attr


def clean_name(name: str) -> str:
    """node_exporter's `cleanMetricName`: lower case, invalid characters to `_`, trimmed."""
    return _INVALID_CHARS.sub("_", name.lower()).strip("_")


def _base_chip_name(entry: Path) -> str:
    try:
        device = (entry / "device").resolve(strict=True)
    except (OSError, RuntimeError):
        device = None
    if device is not None:
        dev_name, dev_type = clean_name(device.name), clean_name(device.parent.name)
        if dev_type and dev_name:
            return f"{dev_type}_{dev_name}"
        if dev_name:
            return dev_name
    name = clean_name(read_text(entry / "name") or "")
    return name or clean_name(os.path.basename(os.path.realpath(entry)))


def chip_names(entries: list[Path]) -> dict[Path, str]:
    """The `chip` label node_exporter gives each hwmon entry, collisions told apart."""
    base = {entry: _base_chip_name(entry) for entry in entries}
    names = {entry: clean_name(read_text(entry / "name") or "") for entry in entries}
    result: dict[Path, str] = {}
    for entry, label in base.items():
        group = [other for other in entries if base[other] == label]
        if len(group) > 1:
            own = names[entry]
            unique = own and [names[other] for other in group].count(own) == 1
            suffix = own if unique else clean_name(os.path.basename(os.path.realpath(entry)))
            label = f"{label}_{suffix}"
        result[entry] = label
    return result


def _read_temp(directory: Path, attr: str) -> _Temp:
    label = read_text(directory / f"{attr}_label") or None
    if read_int(directory / f"{attr}_enable") == 0 or read_int(directory / f"{attr}_fault"):
        return _Temp(attr, label, None)
    raw = read_int(directory / f"{attr}_input")
    return _Temp(attr, label, None if raw is None else raw / 1000)


def _temperatures(entry: Path) -> list[_Temp]:
    """The entry's temperature sensors; like node_exporter, `device/` fills in what is missing."""
    where: dict[int, Path] = {}
    for directory in (entry / "device", entry):  # the hwmon directory's own files win
        try:
            files = os.listdir(directory)
        except PermissionError:
            raise
        except OSError:
            if directory == entry:
                raise
            continue
        for file in files:
            if match := _INPUT_FILE.fullmatch(file):
                where[int(match[1])] = directory
    return [_read_temp(where[n], f"temp{n}") for n in sorted(where)]


def _bounded(temp: _Temp, low: float, high: float) -> float | None:
    celsius = temp.celsius
    return celsius if celsius is not None and low <= celsius <= high else None


def _cpu_reading(temps: list[_Temp]) -> tuple[_Temp, float] | None:
    """Tdie, else Tctl, else the package sensor, else the hottest: among readings in bounds."""
    valid = [
        (t, c) for t in temps if (c := _bounded(t, CPU_MIN_CELSIUS, CPU_MAX_CELSIUS)) is not None
    ]

    def rank(reading: tuple[_Temp, float]) -> tuple[int, float]:
        label = (reading[0].label or "").lower()
        if label in ("tdie", "tctl"):
            return (3 if label == "tdie" else 2, 0.0)
        return (1, 0.0) if _PACKAGE_LABEL.fullmatch(label) else (0, reading[1])

    return max(valid, key=rank, default=None)


def _is_inlet(temp: _Temp) -> bool:
    return bool(temp.label and INLET_WORDS & set(_WORD_SEP.split(temp.label.lower())))


def _read_chip(entry: Path) -> tuple[str, list[_Temp]]:
    """One chip's driver name and temperature sensors: what may block, on its own thread."""
    return clean_name(read_text(entry / "name") or ""), _temperatures(entry)


class HwmonSource(Source):
    name = "hwmon"
    default_interval = 5.0

    def __init__(self, sysfs: Path, config: SourceConfig) -> None:
        super().__init__(sysfs, config)
        #: Half the poll's deadline per chip, so that a stuck chip is given up
        #: (and the others served) before the poll itself would be.
        self.chip_deadline = config.deadline_or(self.default_deadline) / 2
        self._guards: dict[Path, HangGuard] = {}

    def _read_chips(
        self, chips: dict[Path, str]
    ) -> dict[Path, tuple[str, list[_Temp]] | Exception]:
        """Every chip read at once, each on its own thread, all within one chip deadline."""
        # A chip that vanished keeps its guard while its read is stuck: should it come
        # back meanwhile, no second read of it is started behind the first.
        self._guards = {
            **{entry: guard for entry, guard in self._guards.items() if guard.stuck},
            **{
                entry: self._guards.get(entry)
                or HangGuard(f"hwmon chip {chip}", self.chip_deadline)
                for entry, chip in chips.items()
            },
        }
        calls: dict[Path, Call[tuple[str, list[_Temp]]] | Exception] = {}
        for entry in chips:
            try:
                calls[entry] = self._guards[entry].begin(lambda entry=entry: _read_chip(entry))
            except Hung as exc:
                calls[entry] = exc
        until = time.monotonic() + self.chip_deadline
        results: dict[Path, tuple[str, list[_Temp]] | Exception] = {}
        for entry, call in calls.items():
            if isinstance(call, Exception):
                results[entry] = call
                continue
            try:
                results[entry] = self._guards[entry].finish(call, until)
            except PermissionError:
                raise
            except (OSError, Hung) as exc:
                results[entry] = exc
        return results

    def poll(self) -> list[Sample]:
        root = self.sysfs / "class" / "hwmon"
        if not root.is_dir():
            raise NoData(f"{root} does not exist")
        entries = sorted(p for p in root.glob("hwmon*") if p.is_dir())
        samples: list[Sample] = []
        found = False
        failures: list[str] = []
        failure: Exception | None = None
        chips = chip_names(entries)
        for entry, result in self._read_chips(chips).items():
            chip = chips[entry]
            if isinstance(result, Exception):
                failure = result
                failures.append(str(result) if isinstance(result, Hung) else f"{chip}: {result}")
                continue
            driver, temps = result
            if driver in CPU_DRIVERS:
                found = found or bool(temps)
                if (reading := _cpu_reading(temps)) is not None:
                    temp, celsius = reading
                    samples.append(
                        Sample(CPU_METRIC, celsius, {"chip": chip, "sensor": temp.sensor})
                    )
                continue
            labels = Counter(t.label for t in temps)
            for temp in filter(_is_inlet, temps):
                found = True
                if (celsius := _bounded(temp, INLET_MIN_CELSIUS, INLET_MAX_CELSIUS)) is not None:
                    # Two sensors with one label on a chip would be one series: use tempN.
                    sensor = temp.sensor if labels[temp.label] == 1 else temp.attr
                    samples.append(Sample(INLET_METRIC, celsius, {"chip": chip, "sensor": sensor}))
        if not found:
            if failure is not None:
                raise failure
            raise NoData(f"no CPU or inlet temperature sensor under {root}")
        if failures:
            raise PartialReading(samples, "; ".join(failures))
        return samples
