"""Calls into hardware that may never return, each bounded by a deadline.

A sensor read can block for good: an NVML call stuck in the driver, a sysfs
file whose read never completes, a BMC tool that hangs. Python cannot cancel a
thread, so a call that passes its deadline is *abandoned*: the caller goes on
without it, and the thread is left to finish (or not) on its own. To keep
threads from piling up, a `HangGuard` abandons at most one call at a time:
while its abandoned call is still stuck it starts no new one and answers
`Hung` at once; when that call finally returns, its result is discarded and
the next call is started as usual.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class Hung(Exception):
    """A call did not return within its deadline, or an earlier one is still stuck.

    The text stays the same from the call's abandonment until it returns, so a
    caller that logs once per change of reason logs a hang once.
    """


class Call(Generic[T]):
    """One call running on a daemon thread of its own (a stuck one never blocks exit)."""

    def __init__(self, function: Callable[[], T], thread_name: str) -> None:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.ended: float | None = None
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None
        self._function = function
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = self._function()
        except BaseException as exc:  # handed to the waiting caller, which decides
            self._error = exc
        finally:
            self.ended = time.monotonic()
            self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(max(0.0, timeout))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def outcome(self) -> T:
        """The call's result, or its exception raised again. Only once `done`."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class HangGuard:
    """Runs the calls into one device (a source, a hwmon chip) with a deadline.

    `what` names the device in messages and thread names. `abandoned` counts
    the calls given up since the guard was made.
    """

    def __init__(self, what: str, deadline: float) -> None:
        self.what = what
        self.deadline = deadline
        self.abandoned = 0
        self._stuck: Call[object] | None = None
        self._stuck_reason = ""
        self._latest: Call[object] | None = None  # the last call started

    @property
    def stuck(self) -> bool:
        """True while an abandoned call has not returned."""
        return self._stuck is not None and not self._stuck.done

    @property
    def busy(self) -> bool:
        """True while any call this guard started is still running (waited on or abandoned)."""
        return self.stuck or (self._latest is not None and not self._latest.done)

    def begin(self, function: Callable[[], T]) -> Call[T]:
        """Start a call, or raise `Hung` while the last abandoned one is still stuck."""
        if self._stuck is not None:
            if not self._stuck.done:
                raise Hung(self._stuck_reason)
            took = (self._stuck.ended or time.monotonic()) - self._stuck.started
            log.info(
                "%s: the call abandoned after its %gs deadline returned after %.1fs;"
                " its result is discarded and calls resume",
                self.what,
                self.deadline,
                took,
            )
            self._stuck = None
        call = Call(function, f"call-{self.what}")
        self._latest = call  # type: ignore[assignment]
        return call

    def finish(self, call: Call[T], until: float | None = None) -> T:
        """The call's result, or `Hung` once the deadline (or monotonic `until`) passes."""
        end = call.started + self.deadline if until is None else until
        if call.wait(end - time.monotonic()):
            return call.outcome()
        self.abandoned += 1
        self._stuck = call  # type: ignore[assignment]
        started = time.strftime("%H:%M:%S", time.localtime(call.started_wall))
        self._stuck_reason = (
            f"{self.what}: a call started at {started} did not return within its"
            f" {self.deadline:g}s deadline; abandoned, and no new call until it returns"
        )
        raise Hung(self._stuck_reason)

    def call(self, function: Callable[[], T]) -> T:
        """`begin` then `finish`: the result, or `Hung`."""
        return self.finish(self.begin(function))
