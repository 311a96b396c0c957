"""Runs each source in the background at its own pace and keeps its last reading.

A scrape never waits on a sensor: `/metrics` serves the state kept here. Every
failure is contained per source, and logged once per change of state (down
with a new reason, or back up), never once per poll.

Every poll has a deadline (`sources.<name>.deadline`, else the source's
`default_deadline`). A poll past it is abandoned (deadline.HangGuard): the
source is down with the reason `hung`, the next poll is not held up, and while
the abandoned call is still stuck no new call into that source is started.
The last reading stays served until it is `stale_after` old (default 3 ×
the interval), then the source's series are absent, never frozen.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from exporter.deadline import HangGuard, Hung
from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import Source

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SourceState:
    """What one source last said. Replaced whole after each poll, never mutated."""

    samples: tuple[Sample, ...] = ()
    read_at: float | None = None  # monotonic time the samples were read
    up: bool | None = None  # None until the first poll ends
    reason: str = ""  # why it is down, or why it has no data
    failure: str = ""  # while down: "hung", "error" or "partial" (the metric's label)
    duration_seconds: float = 0.0
    last_success: float | None = None
    settled: bool = False  # has a reading that needs no further sample


class SourceRunner:
    def __init__(
        self,
        source: Source,
        interval: float,
        wall_clock: Callable[[], float] = time.time,
        *,
        deadline: float | None = None,
        stale_after: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.interval = interval
        self.deadline = deadline or source.config.deadline_or(source.default_deadline)
        self.stale_after = stale_after or source.config.stale_after or 3 * interval
        self.state = SourceState()
        self.guard = HangGuard(f"source {source.name}", self.deadline)
        self._wall_clock = wall_clock
        self._monotonic = monotonic
        self._thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.source.name

    def poll_once(self) -> SourceState:
        started = time.perf_counter()
        samples: list[Sample] = []
        reason = failure = ""
        up = True
        hung = False
        try:
            samples = self.guard.call(self.source.poll)
        except Hung as exc:
            up, reason, failure, hung = False, str(exc), "hung", True
        except NoData as exc:
            reason = f"no data: {exc}"
        except PartialReading as exc:
            samples, up, reason, failure = exc.samples, False, str(exc), "partial"
        except Exception as exc:  # contained: one source never fails the others
            up, reason, failure = False, f"{type(exc).__name__}: {exc}", "error"
        duration = time.perf_counter() - started
        previous = self.state
        if hung:
            # Nothing new was read: the last reading stays, ageing towards
            # stale_after; a hung source needs no further sample to be settled.
            self.state = SourceState(
                samples=previous.samples,
                read_at=previous.read_at,
                up=False,
                reason=reason,
                failure=failure,
                duration_seconds=duration
                if duration >= self.deadline
                else previous.duration_seconds,
                last_success=previous.last_success,
                settled=True,
            )
        else:
            self.state = SourceState(
                samples=tuple(samples),
                read_at=self._monotonic(),
                up=up,
                reason=reason,
                failure=failure,
                duration_seconds=duration,
                last_success=self._wall_clock() if up else previous.last_success,
                settled=previous.settled or not (up and not reason and self.source.warming_up),
            )
        self._log_change(previous, self.state)
        return self.state

    def fresh_samples(self) -> tuple[Sample, ...]:
        """The last reading, or nothing once it is older than `stale_after`."""
        state = self.state
        if state.read_at is None or self._monotonic() - state.read_at > self.stale_after:
            return ()
        return state.samples

    @property
    def in_flight(self) -> bool:
        """True while a poll is still running in the source (waited on, or abandoned)."""
        return self.guard.busy

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
