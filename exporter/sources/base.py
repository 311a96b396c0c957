"""The shape every source has; see sources/__init__.py for the table of them."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator, model_validator

from exporter.energy import EnergyCounter
from exporter.samples import Sample
from llmgw_common.yamlfile import Duration

#: NVML refreshes power every 20-100 ms, hwmon chips every second or slower.
MIN_INTERVAL_SECONDS = 0.1


class SourceConfig(BaseModel):
    """A source's section of agent.yaml (`sources.<name>`); a source may add keys."""

    # defer_build: a model's validator is built when it first validates, not when its class
    # is defined; a source's section validates inside agent.yaml's model, so the standalone
    # validators of sections never used alone (a base, a BMC target's) are never built
    # (docs/benchmarks.md, "Where the memory goes").
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    #: Longest interval the config may set, where a longer one would lose data.
    max_interval: ClassVar[float | None] = None

    enabled: bool = True
    interval: Duration | None = None
    #: How long one poll may take before it is abandoned and the source is down
    #: (`hung`); default: the source's `default_deadline`.
    deadline: Duration | None = None
    #: How old the last reading may grow (through hung or slow polls) before its
    #: series are no longer served; default 3 × the interval.
    stale_after: Duration | None = None

    def deadline_or(self, default: float) -> float:
        """The poll deadline: agent.yaml's, else the source's default."""
        return self.deadline or default

    @model_validator(mode="after")
    def _stale_after_a_poll(self) -> SourceConfig:
        if self.stale_after is not None and self.interval and self.stale_after < self.interval:
            raise ValueError(
                f"stale_after {self.stale_after:g}s is shorter than the interval"
                f" {self.interval:g}s: every reading would be stale before the next poll"
            )
        return self

    @field_validator("interval")
    @classmethod
    def _not_too_long(cls, interval: float | None, info: ValidationInfo) -> float | None:
        if interval is not None and interval < MIN_INTERVAL_SECONDS:
            raise ValueError(
                f"{interval:g}s is shorter than {MIN_INTERVAL_SECONDS:g}s: sensors"
                " do not change that fast, and polling would only burn CPU"
            )
        if interval is not None and cls.max_interval is not None and interval > cls.max_interval:
            raise ValueError(
                f"{interval:g}s is longer than {cls.max_interval:g}s,"
                " past which readings would be lost"
            )
        return interval


class Source(ABC):
    """One family of sensors, polled in the background at its own pace.

    `poll()` returns the samples of one reading. It raises `NoData` when the
    hardware is absent, and any other exception when reading failed; the poller
    contains both, so one source never fails a scrape or another source.
    Constructors take every root and handle they read from (STYLE.md §4) and
    touch no hardware: the first contact is the first poll.
    """

    name: ClassVar[str]
    default_interval: ClassVar[float]
    #: A poll's deadline unless agent.yaml sets one: a little above the source's
    #: normal read time (sysfs reads take milliseconds; NVML tens of them).
    default_deadline: ClassVar[float] = 3.0
    Config: ClassVar[type[SourceConfig]] = SourceConfig
    #: metric → source name: this source's samples of that metric are served only
    #: while that other source serves none (a BMC's inlet sensor defers to hwmon's).
    defer: ClassVar[dict[str, str]] = {}
    #: Whether the source reads NVML: its constructor then takes `nvml`, the
    #: process's one `exporter.nvml.Nvml`, which main() shares among such sources.
    reads_nvml: ClassVar[bool] = False

    def __init__(self, sysfs: Path, config: SourceConfig) -> None:
        self.sysfs = sysfs
        self.config = config
        #: Energy-counter resets per published metric (exporter/energy.py).
        self.reset_tally: dict[str, int] = {}

    def energy_counter(
        self,
        metric: str,
        what: str,
        max_watts: float,
        wrap: float | None = None,
        units_per_joule: float = 1.0,
    ) -> EnergyCounter:
        """A new counter for one device's energy, its resets counted under `metric`."""
        return EnergyCounter(
            f"{self.name} {what}", max_watts, wrap, self.reset_tally, metric, units_per_joule
        )

    def counter_resets(self) -> list[Sample]:
        """`llmgw_exporter_energy_resets_total` per energy metric this source differentiates."""
        tally = dict(self.reset_tally)  # a copy: the poll thread may add a metric meanwhile
        return [
            Sample(
                "llmgw_exporter_energy_resets_total",
                count,
                {"source": self.name, "metric": metric},
            )
            for metric, count in sorted(tally.items())
        ]

    @abstractmethod
    def poll(self) -> list[Sample]:
        """Read the sensors once."""

    @property
    def warming_up(self) -> bool:
        """True while a successful poll still lacks series that need a second sample."""
        return False

    def close(self) -> None:  # noqa: B027 - an optional hook, empty by default
        """Release what the source holds (libraries, handles). Called once at exit."""
