"""Background work that gives way to the requests in flight.

The decider answers every request on one event-loop thread; its refresher works out each
new View (every node's state, the recent replica shapes' answer entries: about half a
second of Python at 10,000 nodes) on a thread of its own. CPython runs one thread at a time
and hands over only every switch interval, so a placement answered during a refresh took
about twice its time: the 10,000-candidate placements' p99 was the refresh's
(docs/benchmarks.md, "Where the time goes").

So the refresher's long loops call `pause()` every PAUSE_EVERY items: while any request is
in flight it waits, holding nothing, until none is. Each refresh may wait at most the limit
`giving_way` is given, so that a decider never idle between requests still refreshes: past
it, the rest of that refresh shares the interpreter as before. `pause()` does nothing on a
thread that is not inside `giving_way`: a request's own thread must never wait for itself.

The count is kept by an ASGI middleware (`CountInFlight`) on the event loop's thread, the
only thread that changes it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any

#: Items (nodes, answer entries) a background loop works out between two pauses: about half
#: a millisecond at 10,000 nodes, the most a request arriving meanwhile waits for it.
PAUSE_EVERY = 32

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class InFlight:
    """The HTTP requests being answered, and the pauses background work takes for them."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()
        self._local = threading.local()
        self.waited_s = 0.0  # in all, for the tests and the curious

    @property
    def count(self) -> int:
        return self._count

    def enter(self) -> None:
        self._count += 1
        if self._count == 1:
            self._idle.clear()

    def leave(self) -> None:
        self._count -= 1
        if not self._count:
            self._idle.set()

    @contextmanager
    def giving_way(self, limit_s: float) -> Iterator[None]:
        """On this thread, `pause()` waits for requests, at most `limit_s` in all."""
        self._local.left = limit_s
        try:
            yield
        finally:
            self._local.left = 0.0

    def pause(self) -> None:
        """Wait while requests are in flight (inside `giving_way` only, within its limit)."""
        if not self._count:
            return
        left = getattr(self._local, "left", 0.0)
        if left <= 0.0:
            return
        start = time.monotonic()
        self._idle.wait(left)
        waited = time.monotonic() - start
        self._local.left = left - waited
        self.waited_s += waited


def no_pause() -> None:
    """The pause of work that gives way to nothing (tests, tools)."""


class CountInFlight:
    """ASGI middleware: each HTTP request counts in `in_flight` while it is answered."""

    def __init__(self, app: ASGIApp, in_flight: InFlight) -> None:
        self.app = app
        self.in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight.leave()
