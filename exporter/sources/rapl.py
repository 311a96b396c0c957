"""CPU package and DRAM energy and power from RAPL, read through powercap sysfs.

Reads `<sysfs>/class/powercap/`. Top-level zones `intel-rapl:N` (and `amd-rapl:N`,
should a kernel name them so; mainline drives AMD's RAPL through `intel-rapl`)
whose `name` is `package-M` give package M; `package-M-die-D` (multi-die
parts) gives `package="M-die-D"`. Their sub-zone named `dram` (nested under the
zone, or beside it as `intel-rapl:N:K`) gives that package's DRAM. Not read:
`core`/`uncore` sub-zones (part of the package), `psys` (platform-wide, would
double-count), `intel-rapl-mmio:*` (the same package counter again).

Missing-data policy (STYLE.md §3):
- no powercap directory, or no package zone → `NoData`;
- a zone whose `energy_uj` is missing or not a number → skipped this poll, the
  rest are served and the source reported down with that zone named
  (`PartialReading`); an error when no zone at all could be read;
- `energy_uj` unreadable for lack of privilege (root-only since CVE-2020-8694)
  → `RaplPermissionError`: the source is down, no series;
- counter went backwards: wrap-corrected with `max_energy_range_uj`; without
  it (or with an impossible delta) that interval is dropped: no power, the
  counter holds still, the next interval starts from the new reading;
- a delta implying more power than the zone can draw is a counter reset, not
  a wrap (exporter/energy.py): the same as above, one log line, and
  `llmgw_exporter_energy_resets_total{source="rapl"}` counts it. The bound is
  twice the largest of the zone's own `constraint_*_max_power_uw` and
  `constraint_*_power_limit_uw` (limits are averages over a time window, and a
  package may burst above them for a few ms), at most (and where sysfs has no
  constraint) 1,000 W for a package and 250 W for a DRAM zone. Without the
  bound, `energy_uj` falling from 200,000,500,000 to 1,000,000 (range
  262,143,328,850) reads as a wrap of 62 kJ: 62 kW for a one-second interval.

The energy counters count from 0 when the exporter starts, wraps corrected; a
restart is a counter reset, which `rate()` and `increase()` handle. (Starting
from the raw `energy_uj` would not survive a restart: once the exporter has
corrected a wrap, the raw value after a restart is lower by whole ranges, and
Prometheus would count that whole raw value, up to 262 kJ, as new energy.)

Lines emitted (power from the second reading of a zone on):

    llmgw_node_cpu_energy_joules_total{package="0"} 22400.0
    llmgw_node_cpu_power_watts{package="0"} 350.0
    llmgw_node_dram_energy_joules_total{package="0"} 800.0
    llmgw_node_dram_power_watts{package="0"} 41.5
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
from exporter.sysfs import read_int, read_text

# A package counter spans max_energy_range_uj = 262,143,328,850 µJ (2^32 units of
# 61.035 µJ): it wraps in 262,143 J / 350 W ≈ 12.5 min, and in ≈ 4.4 min at
# 1,000 W. Two polls must fall inside one wrap or a whole wrap goes unseen, so
# the poll interval may not exceed 60 s, well inside the worst case.
MAX_INTERVAL_SECONDS = 60.0

CONTROL_TYPES = ("intel-rapl", "amd-rapl")
_ZONE = re.compile(r"(?P<type>[a-z-]+):[0-9a-f]+")
_PACKAGE = re.compile(r"package-(?P<package>\d+(?:-die-\d+)?)")
_UJ_PER_J = 1e6

#: A zone's bound when sysfs gives none of its constraints: more than any
#: server package draws (the largest TDPs are ~500 W; a package's short bursts
#: reach ~2 × that), and for DRAM more than 12 channels of DDR5 at full tilt.
DEFAULT_MAX_WATTS = {"cpu": 1000.0, "dram": 250.0}
#: Constraints are limits over time windows: a mean over a poll may be above
#: the largest of them for a while, never this many times above.
CONSTRAINT_HEADROOM = 2.0
_CONSTRAINT = re.compile(r"constraint_\d+_(max_power|power_limit)_uw")

_METRICS = {
    "cpu": ("llmgw_node_cpu_energy_joules_total", "llmgw_node_cpu_power_watts"),
    "dram": ("llmgw_node_dram_energy_joules_total", "llmgw_node_dram_power_watts"),
}


class RaplPermissionError(PermissionError):
    """`energy_uj` exists but this process may not read it."""


@dataclass(frozen=True, slots=True)
class _Zone:
    kind: str  # "cpu" or "dram"
    package: str
    path: Path


# The wrap arithmetic (energy.EnergyCounter with `wrap` = max_energy_range_uj):
# the kernel shows a 32-bit register times its energy unit, truncated to µJ, so
# `max_energy_range_uj` is the largest value `energy_uj` can show, and the step
# past it to 0 is one hardware unit (61 µJ for packages, 15.3 µJ for DRAM), not
# 1 µJ. That unit is not in sysfs, so a wrap counts `max - previous + current`
# (as Kepler does): short by one unit a wrap, a few parts per billion. No "+1":
# it would be the wrong correction too.


class RaplConfig(SourceConfig):
    max_interval: ClassVar[float | None] = MAX_INTERVAL_SECONDS


class RaplSource(Source):
    name: ClassVar[str] = "rapl"
    default_interval: ClassVar[float] = 5.0
    default_deadline: ClassVar[float] = 2.0  # a few small sysfs reads
    Config: ClassVar[type[SourceConfig]] = RaplConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config)
        self._clock = clock
        self._counters: dict[tuple[str, str], EnergyCounter] = {}
        self._warming = True

    @property
    def warming_up(self) -> bool:
        return self._warming

    def poll(self) -> list[Sample]:
        zones = self._discover()
        samples: list[Sample] = []
        counters: dict[tuple[str, str], EnergyCounter] = {}
        failing: set[Path] = set()
        warming = False
        for zone in zones:
            key = (zone.kind, zone.package)
            previous = self._counters.get(key)
            raw_uj = self._read_energy(zone.path)
            now = self._clock()
            if raw_uj is None:
                failing.add(zone.path)
                if previous is not None:
                    counters[key] = previous
                continue
            energy_metric, power_metric = _METRICS[zone.kind]
            counter = previous or self.energy_counter(
                energy_metric, str(zone.path), _max_watts(zone), units_per_joule=_UJ_PER_J
            )
            counter.wrap = _read_max_range(zone.path)
            watts = counter.advance(raw_uj, now)
            counters[key] = counter
            labels = {"package": zone.package}
            samples.append(Sample(energy_metric, counter.total, labels))
            if watts is None:
                warming = True
            else:
                samples.append(Sample(power_metric, watts, dict(labels)))
        if not samples:
            raise RuntimeError(f"no RAPL zone could be read: {sorted(map(str, failing))}")
        self._counters = counters
        self._warming = warming
        if failing:
            unread = ", ".join(f"{path}/energy_uj" for path in sorted(failing))
            raise PartialReading(samples, f"missing or not a number: {unread}")
        return samples

    def _discover(self) -> list[_Zone]:
        root = self.sysfs / "class" / "powercap"
        try:
            entries = sorted(os.listdir(root), key=_zone_order)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NoData(f"no powercap directory at {root}") from exc
        zones: list[_Zone] = []
        seen: set[tuple[str, str]] = set()
        for entry in entries:
            match = _ZONE.fullmatch(entry)
            if match is None or match["type"] not in CONTROL_TYPES:
                continue
            package = _PACKAGE.fullmatch(_read_name(root / entry) or "")
            if package is None or ("cpu", package["package"]) in seen:
                continue
            zones.append(_Zone("cpu", package["package"], root / entry))
            seen.add(("cpu", package["package"]))
            for sub in _subzones(root, entry):
                if _read_name(sub) == "dram" and ("dram", package["package"]) not in seen:
                    zones.append(_Zone("dram", package["package"], sub))
                    seen.add(("dram", package["package"]))
        if not zones:
            raise NoData(f"no RAPL package zone under {root}")
        return zones

    def _read_energy(self, path: Path) -> int | None:
        try:
            raw = read_int(path / "energy_uj")
        except PermissionError as exc:
            raise RaplPermissionError(
                f"cannot read {path / 'energy_uj'}: RAPL energy_uj is readable by root only "
                "(CVE-2020-8694); run the exporter as root or give it CAP_DAC_READ_SEARCH"
            ) from exc
        return raw if raw is not None and raw >= 0 else None


def _zone_order(entry: str) -> tuple[str, tuple[int, ...]]:
    """`intel-rapl:a` after `intel-rapl:9`: zone ids are hexadecimal."""
    kind, _, ids = entry.partition(":")
    try:
        return kind, tuple(int(part, 16) for part in ids.split(":"))
    except ValueError:
        return kind, ()


def _subzones(root: Path, zone: str) -> list[Path]:
    """`zone:K` sub-zones, nested (devices tree) or flat (class links); each once."""
    pattern = re.compile(re.escape(zone) + r":[0-9a-f]+")
    found: dict[str, Path] = {}
    for parent in (root / zone, root):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            if pattern.fullmatch(name) and name not in found:
                found[name] = parent / name
    return [found[name] for name in sorted(found, key=_zone_order)]


def _read_name(zone: Path) -> str | None:
    try:
        return read_text(zone / "name")
    except PermissionError:
        return None


def _read_max_range(zone: Path) -> int | None:
    try:
        value = read_int(zone / "max_energy_range_uj")
    except PermissionError:
        return None
    return value if value is not None and value > 0 else None


def _max_watts(zone: _Zone) -> float:
    """The most power a believable interval of the zone shows (see the docstring)."""
    limits: list[int] = []
    try:
        names = os.listdir(zone.path)
    except OSError:
        names = []
    for name in names:
        if _CONSTRAINT.fullmatch(name):
            try:
                value = read_int(zone.path / name)
            except PermissionError:
                value = None
            if value is not None and value > 0:
                limits.append(value)
    default = DEFAULT_MAX_WATTS[zone.kind]
    # Limits tighten the bound, never loosen it: some firmware reports 4,090 W.
    return min(default, CONSTRAINT_HEADROOM * max(limits) / _UJ_PER_J) if limits else default
