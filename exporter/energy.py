"""Energy counters the exporter differentiates, with resets told apart from wraps.

A device's energy counter can wrap (RAPL's 32-bit register), go backwards (a
driver reload, a reboot of the controller) or jump (a counter reset that
lands on a new, unrelated value). Read naively, a reset after which the
counter reads *lower* looks like a wrap, and a wrap's arithmetic then adds
most of the counter's range: RAPL from 200,000,500,000 to 1,000,000 µJ with a
range of 262,143,328,850 µJ reads as 62 kJ in one second, 62 kW.

The rule, the same for every counter: the energy between two readings must
be one the device could draw in that time, at most `max_watts` (from the
device's own limits where it has them, else a documented bound per kind of
device). A delta that is larger, or a counter that went backwards with no
wrap to explain it, is a *reset*: no power for that interval, nothing added
to the published counter, counting goes on from the new reading; one log
line, and `llmgw_exporter_energy_resets_total{source,metric}` counts it.

The published counter counts from 0 when the exporter starts: a restart is a
counter reset, which `rate()` and `increase()` handle. (Republishing the
device's raw value would count, after an exporter restart, every jump the
exporter had left out.)
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class EnergyCounter:
    """One device's energy counter: raw readings in, power and a published total out.

    `what` names the device in the log line (`rapl /sys/.../intel-rapl:0`).
    `max_watts` bounds a believable interval; `wrap` is the counter's range
    where it wraps (RAPL's `max_energy_range_uj`), else None. Readings and
    `wrap` are in the device's own units (µJ, mJ), `units_per_joule` of them to
    a joule: integer units subtract exactly, and joules are worked out last.
    Resets are counted in `tally[metric]`, the source's count per published
    metric, which outlives the counters of devices that come and go.
    """

    def __init__(
        self,
        what: str,
        max_watts: float,
        wrap: float | None = None,
        tally: dict[str, int] | None = None,
        metric: str = "",
        units_per_joule: float = 1.0,
    ) -> None:
        self.what = what
        self.metric = metric
        self._tally = {} if tally is None else tally
        self._tally.setdefault(metric, 0)
        self.max_watts = max_watts
        self.wrap = wrap
        self.units_per_joule = units_per_joule
        self.raw: float | None = None  # the last raw reading, in the device's units
        self.time: float | None = None  # its monotonic time
        self.total_units: float = 0  # the published counter since the exporter started
        self.resets = 0

    @property
    def total(self) -> float:
        """The published counter, in joules."""
        return self.total_units / self.units_per_joule

    def advance(self, raw: float, now: float) -> float | None:
        """Take a raw reading; the mean power since the last one in watts, or None.

        None for the first reading, a clock that did not move, and a reset.
        """
        previous, then = self.raw, self.time
        if previous is None or then is None:
            self.raw, self.time = raw, now
            return None
        seconds = now - then
        if seconds <= 0:
            return None
        self.raw, self.time = raw, now
        if raw >= previous:
            delta = raw - previous
        elif self.wrap is not None:
            delta = self.wrap - previous + raw
        else:
            return self._reset(previous, raw, seconds, "went backwards")
        if self.wrap is not None and delta > self.wrap:
            return self._reset(previous, raw, seconds, "more than the counter's whole range")
        watts = delta / self.units_per_joule / seconds
        if watts > self.max_watts:
            return self._reset(
                previous,
                raw,
                seconds,
                f"{'a wrap' if raw < previous else 'a rise'} of"
                f" {delta / self.units_per_joule:,.0f} J, {watts:,.0f} W"
                f" (above the {self.max_watts:,.0f} W bound)",
            )
        self.total_units += delta
        return watts

    def _reset(self, previous: float, raw: float, seconds: float, how: str) -> None:
        # One line per reset: a reset is rare, and each one is a fact an operator wants.
        self.resets += 1
        self._tally[self.metric] = self._tally.get(self.metric, 0) + 1
        log.warning(
            "%s: energy counter went from %s to %s J in %.1fs, %s: a counter reset;"
            " no power for that interval, counting on from the new reading",
            self.what,
            _joules(previous / self.units_per_joule),
            _joules(raw / self.units_per_joule),
            seconds,
            how,
        )


def _joules(value: float) -> str:
    return f"{value:,.6f}".rstrip("0").rstrip(".")
