"""Node and component power from HPE Cray's power management counters, `/sys/cray/pm_counters`.

Each counter file reads `VALUE UNIT TIMESTAMP us` (`357 W 1573671385347629 us`);
`freshness` is a bare counter that the controller advances about ten times a
second. A set is read between two reads of `freshness` and read again when it
moved meanwhile, so all values come from one update.

Emits:

    llmgw_node_power_watts{source="cray"} 357
    llmgw_node_energy_joules_total{source="cray"} 2583427
    llmgw_node_component_power_watts{component="cpu"} 140
    llmgw_node_component_power_watts{component="memory"} 31
    llmgw_node_component_power_watts{component="accel0"} 95
    llmgw_node_power_includes_gpus{source="cray"} 1

`power` and `energy` include the accelerators (HPE: "when accelerators are
present, includes accel_power"), hence `includes_gpus` 1 whatever agent.yaml
says. `cpu` is `cpu_power`, else the sum of `cpuN_power`; `accelN` is
`accelN_power`; a node with only the older single `accel_power` gets
`component="accel"`.

Missing data:
- no `<sysfs>/cray/pm_counters` directory → `NoData`;
- a counter file missing, unreadable or not a number → that series is absent;
  a component reading 0 W (an accelerator that is not there) → absent; node
  power 0 W or above 50 kW → absent;
- `freshness` missing → the source is down (nothing tells a frozen reading
  from a live one);
- `freshness` the same as at the last poll → the counters are stale: the
  source is down with no series;
- the set still changing after three reads → the source is down this poll.
- `energy` is published from 0 at the exporter's start, by the rule of
  exporter/energy.py: a counter that went backwards (a controller restart) or
  rose by more than a node draws (50 kW) over the interval is a reset: nothing
  added, one log line, `llmgw_exporter_energy_resets_total{source="cray"}`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from pydantic import field_validator

from exporter.energy import EnergyCounter
from exporter.samples import NoData, Sample
from exporter.sources.base import Source, SourceConfig
from exporter.sources.bmc import (
    COMPONENT_POWER_METRIC,
    INCLUDES_GPUS_METRIC,
    NODE_ENERGY_METRIC,
    NODE_POWER_MAX_WATTS,
    NODE_POWER_METRIC,
    node_power,
)
from exporter.sysfs import read_text

#: `freshness` advances at about 10 Hz: a faster poll would call live counters stale.
MIN_INTERVAL_SECONDS = 1.0
READ_ATTEMPTS = 3

_ACCEL = re.compile(r"accel(\d+)_power")
_CPU = re.compile(r"cpu(\d+)_power")


class CrayConfig(SourceConfig):
    @field_validator("interval")
    @classmethod
    def _freshness_can_advance(cls, interval: float | None) -> float | None:
        if interval is not None and interval < MIN_INTERVAL_SECONDS:
            raise ValueError(
                f"{interval:g}s is shorter than {MIN_INTERVAL_SECONDS:g}s: the counters'"
                " freshness would not advance between polls"
            )
        return interval


class StaleCounters(RuntimeError):
    """`freshness` did not advance since the last poll."""


def read_counter(path: Path) -> float | None:
    """The value of a `VALUE UNIT TIMESTAMP us` file (or a bare number); None when unreadable."""
    text = read_text(path)
    if not text:
        return None
    try:
        return float(text.split()[0])
    except ValueError:
        return None


class CraySource(Source):
    name: ClassVar[str] = "cray"
    default_interval: ClassVar[float] = 5.0
    default_deadline: ClassVar[float] = 2.0  # a few small sysfs reads, at most three times
    Config: ClassVar[type[SourceConfig]] = CrayConfig

    def __init__(
        self, sysfs: Path, config: SourceConfig, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(sysfs, config)
        self._freshness: int | None = None
        self._clock = clock
        self._energy: EnergyCounter | None = None  # made at the first reading of `energy`

    def poll(self) -> list[Sample]:
        root = self.sysfs / "cray" / "pm_counters"
        try:
            files = sorted(os.listdir(root))
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise NoData(f"no {root} directory (not an HPE Cray EX node)") from exc
        values: dict[str, float | None] = {}
        freshness: float | None = None
        for _ in range(READ_ATTEMPTS):
            before = read_counter(root / "freshness")
            if before is None:
                raise RuntimeError(f"{root / 'freshness'} is missing or not a number")
            values = {
                name: read_counter(root / name)
                for name in files
                if name in ("power", "energy") or name.endswith("_power")
            }
            freshness = read_counter(root / "freshness")
            if freshness == before:
                break
        else:
            raise RuntimeError(f"the counters under {root} kept changing while read")
        assert freshness is not None
        if self._freshness is not None and int(freshness) == self._freshness:
            raise StaleCounters(
                f"the counters under {root} are stale: freshness still {int(freshness)}"
                " since the last poll"
            )
        self._freshness = int(freshness)
        return self._samples(values)

    def _samples(self, values: dict[str, float | None]) -> list[Sample]:
        labels = {"source": self.name}
        samples: list[Sample] = []
        if (watts := node_power(values.get("power"))) is not None:
            samples.append(Sample(NODE_POWER_METRIC, watts, labels))
            samples.append(Sample(INCLUDES_GPUS_METRIC, 1, dict(labels)))
        energy = values.get("energy")
        if energy is not None and energy >= 0:
            if self._energy is None:
                self._energy = self.energy_counter(
                    NODE_ENERGY_METRIC, "node energy", NODE_POWER_MAX_WATTS
                )
            self._energy.advance(energy, self._clock())
            samples.append(Sample(NODE_ENERGY_METRIC, self._energy.total, dict(labels)))
        components: dict[str, float | None] = {"memory": values.get("memory_power")}
        sockets = [v for name, v in values.items() if _CPU.fullmatch(name)]
        if "cpu_power" in values:
            components["cpu"] = values["cpu_power"]
        elif sockets:
            components["cpu"] = None if None in sockets else sum(v or 0.0 for v in sockets)
        accels = {
            f"accel{match[1]}": value
            for name, value in values.items()
            if (match := _ACCEL.fullmatch(name))
        }
        components.update(accels or {"accel": values.get("accel_power")})
        for component, value in sorted(components.items()):
            if value is not None and 0 < value <= NODE_POWER_MAX_WATTS:
                samples.append(Sample(COMPONENT_POWER_METRIC, value, {"component": component}))
        return samples
