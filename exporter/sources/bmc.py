"""What the whole-node power sources share: their metric names, bounds, and the BMC source base.

A BMC (the `ipmi` and `redfish` sources) is a small, slow computer of its own:
it is polled no faster than every 30 s, each request has a timeout, and a BMC
that stops answering keeps its last reading only until `stale_after`, after
which its series are absent (never a frozen last value). `BmcSource` is that
behaviour, written once: the BMC sources derive from it and write only how
one reading is taken.
"""

from __future__ import annotations

import re
import time
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, NoReturn

from pydantic import field_validator, model_validator

from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from llmgw_common.yamlfile import Duration

NODE_POWER_METRIC = "llmgw_node_power_watts"
NODE_ENERGY_METRIC = "llmgw_node_energy_joules_total"
COMPONENT_POWER_METRIC = "llmgw_node_component_power_watts"
INCLUDES_GPUS_METRIC = "llmgw_node_power_includes_gpus"
INLET_METRIC = "llmgw_node_inlet_temperature_celsius"

# A running node never draws 0 W: a BMC without a power sensor often answers 0
# (with "activated"), so 0 is absent, not a reading. The largest GPU nodes draw
# ~15 kW (8-GPU HGX B300); past 50 kW a reading is a unit or parsing error.
NODE_POWER_MAX_WATTS = 50_000.0

# Inlet air: the same bounds as hwmon's inlet sensors (a disconnected sensor reads
# -62 °C, 127 °C or 255 °C).
INLET_MIN_CELSIUS = -20.0
INLET_MAX_CELSIUS = 80.0
INLET_WORDS = frozenset({"inlet", "ambient", "intake"})
_WORD_SEP = re.compile(r"[^a-z0-9]+")

#: DESIGN.md §2: BMCs no faster than every 30 s.
BMC_MIN_INTERVAL_SECONDS = 30.0


def node_power(watts: float | None) -> float | None:
    """The reading if it is a whole node's power, else None (absent)."""
    if watts is None or not 0 < watts <= NODE_POWER_MAX_WATTS:
        return None
    return float(watts)


def inlet(celsius: float | None) -> float | None:
    if celsius is None or not INLET_MIN_CELSIUS <= celsius <= INLET_MAX_CELSIUS:
        return None
    return float(celsius)


def is_inlet_name(name: str) -> bool:
    """A sensor whose name has the word Inlet, Ambient or Intake (any case)."""
    return bool(INLET_WORDS & set(_WORD_SEP.split(name.lower())))


class BmcConfig(SourceConfig):
    """`sources.ipmi` and `sources.redfish`: a BMC's pace, timeout and staleness."""

    default_interval: ClassVar[float] = BMC_MIN_INTERVAL_SECONDS

    #: How long one request (or one tool run) may take before it is given up.
    timeout: Duration = 10.0
    #: Read the BMC's inlet temperature sensor too.
    inlet: bool = True

    @field_validator("interval")
    @classmethod
    def _not_faster_than_a_bmc_allows(cls, interval: float | None) -> float | None:
        if interval is not None and interval < BMC_MIN_INTERVAL_SECONDS:
            raise ValueError(
                f"{interval:g}s is shorter than {BMC_MIN_INTERVAL_SECONDS:g}s: a BMC"
                " polled faster answers late or not at all"
            )
        return interval

    @model_validator(mode="after")
    def _timeout_and_staleness_fit_the_interval(self) -> BmcConfig:
        interval = self.effective_interval
        if self.timeout >= interval:
            raise ValueError(
                f"timeout {self.timeout:g}s must be shorter than the interval {interval:g}s"
            )
        if self.deadline is not None and self.deadline < self.timeout:
            raise ValueError(
                f"deadline {self.deadline:g}s is shorter than the timeout {self.timeout:g}s:"
                " a slow answer would be abandoned before the request gives it up"
            )
        if self.stale_after is not None and self.stale_after < interval:
            raise ValueError(
                f"stale_after {self.stale_after:g}s is shorter than the interval {interval:g}s:"
                " every reading would be stale before the next poll"
            )
        return self

    def deadline_or(self, default: float) -> float:
        """A poll makes a few requests (ipmi: two tool runs; redfish: the power
        and thermal documents, a login now and then, and at start and after a
        failed poll the chassis and its sensors looked for), each within `timeout`:
        the default deadline is two timeouts and 5 s more (25 s by default)."""
        return self.deadline or 2 * self.timeout + 5

    @property
    def effective_interval(self) -> float:
        return self.interval or self.default_interval

    @property
    def staleness_limit(self) -> float:
        return self.stale_after or 3 * self.effective_interval


class LastReading:
    """A BMC's last good reading, served through failed polls until it is too old.

    `fresh()` records a reading; `failed()` re-raises the poll's error, as a
    `PartialReading` carrying the last reading while it is younger than the
    limit (the source reads down, the series stay), and as itself once the
    reading is older (the series are gone). The reason text does not change from
    poll to poll, so the poller logs the failure once, and once more when the
    reading is dropped.
    """

    def __init__(self, limit: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self._clock = clock
        self._samples: list[Sample] = []
        self._at: float | None = None

    def fresh(self, samples: list[Sample]) -> list[Sample]:
        self._samples, self._at = list(samples), self._clock()
        return samples

    def clear(self) -> None:
        self._samples, self._at = [], None

    def failed(self, error: Exception) -> NoReturn:
        if self._at is not None and self._samples and self._clock() - self._at <= self.limit:
            raise PartialReading(
                list(self._samples),
                f"{error}; serving the last reading until it is {self.limit:g}s old",
            ) from error
        self.clear()
        raise error


class BmcSource(Source):
    """A source that reads a BMC: paced, its last reading kept, its failures reported.

    - pace: its `Config` is a `BmcConfig`, which refuses an interval under 30 s
      and a timeout, deadline or `stale_after` that does not fit the interval;
    - a reading (`_read()` returning, or raising `PartialReading` with what it
      did read) is kept as the last reading and served;
    - `NoData` (no BMC, nothing it measures) forgets the last reading: absent,
      quietly;
    - any other failure reads the source down and serves the last reading
      until it is `stale_after` old, then nothing (`LastReading.failed`);
      `_forget()` is called first, for a subclass to drop what it found out
      about the BMC (it may have been reconfigured).

    The inlet temperature a BMC reports defers to hwmon's (`defer`).
    """

    default_interval: ClassVar[float] = BmcConfig.default_interval
    Config: ClassVar[type[SourceConfig]] = BmcConfig
    defer: ClassVar[dict[str, str]] = {INLET_METRIC: "hwmon"}
    config: BmcConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config)
        self._last = LastReading(self.config.staleness_limit, clock)

    def poll(self) -> list[Sample]:
        try:
            samples = self._read()
        except NoData:
            self._last.clear()
            raise
        except PartialReading as exc:
            self._last.fresh(exc.samples)
            raise
        except Exception as exc:
            self._forget()
            self._last.failed(exc)
        return self._last.fresh(samples)

    @abstractmethod
    def _read(self) -> list[Sample]:
        """One reading from the BMC; raises `NoData`, `PartialReading` or the failure."""

    def _forget(self) -> None:
        """Drop what the source cached about the BMC, after a failed read."""
