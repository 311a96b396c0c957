"""Runs each source in the background at its own pace and keeps its last reading.

A scrape never waits on a sensor: `/metrics` serves the state kept here. Every
failure is contained per source, and logged once per change of state (down
with a new reason, or back up), never once per poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceState:
    """What one source last said. Replaced whole after each poll, never mutated."""

    samples: tuple[Sample, ...] = ()
    up: bool | None = None  # None until the first poll ends
    reason: str = ""  # why it is down, or why it has no data
    duration_seconds: float = 0.0
    last_success: float | None = None
    settled: bool = False  # has a reading that needs no further sample


class SourceRunner:
    def __init__(
        self, source: Source, interval: float, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.source = source
        self.interval = interval
        self.state = SourceState()
        self._wall_clock = wall_clock
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.source.name

    def poll_once(self) -> SourceState:
        started = time.perf_counter()
        samples: list[Sample] = []
        reason = ""
        up = True
        try:
            samples = self.source.poll()
        except NoData as exc:
            reason = f"no data: {exc}"
        except PartialReading as exc:
            samples, up, reason = exc.samples, False, str(exc)
        except Exception as exc:  # contained: one source never fails the others
            up, reason = False, f"{type(exc).__name__}: {exc}"
        duration = time.perf_counter() - started
        previous = self.state
        self.state = SourceState(
            samples=tuple(samples),
            up=up,
            reason=reason,
            duration_seconds=duration,
            last_success=self._wall_clock() if up else previous.last_success,
            settled=previous.settled or not (up and not reason and self.source.warming_up),
        )
        self._log_change(previous, self.state)
        return self.state

    def _log_change(self, before: SourceState, after: SourceState) -> None:
        if (before.up, before.reason) == (after.up, after.reason):
            return
        if not after.up:
            log.warning("source %s failing: %s", self.name, after.reason)
        elif after.reason:
            log.info("source %s: %s", self.name, after.reason)
        elif before.up is not None:
            log.info("source %s recovered", self.name)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            began = time.monotonic()
            self.poll_once()
            stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(
            target=self.run, args=(stop,), name=f"source-{self.name}", daemon=True
        )
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
