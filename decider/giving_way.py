"""The decider's runtime policy: background work that gives way to the requests in flight
(pacing), and the garbage collector's handling of Views (`Collector`). The domain code
(decider.state, decider.placement) takes a pause and a collector and knows neither policy.

The decider answers every request on one event-loop thread; its refresher works out each
new View (every node's state, the recent replica shapes' answer entries: about half a
second of Python at 10,000 nodes) on a thread of its own. CPython runs one thread at a time
and hands over only every switch interval, so a placement answered during a refresh took
about twice its time: the 10,000-candidate placements' p99 was the refresh's
(docs/benchmarks.md, "Where the time goes").

So the refresher's long loops (parsing the answers, working out the View) call a pause every
PAUSE_EVERY items: while any request is in flight it waits, holding nothing, until none is.
A pause comes from `InFlight.budget`, one per piece of a refresh, and waits at most the
budget's limit in all, so that a decider never idle between requests still refreshes: past
it, the rest of that refresh shares the interpreter as before. Only background threads get
one; a request's own thread must never wait for itself (it is in flight).

The count is kept by an ASGI middleware (`CountInFlight`) on the event loop's thread, the
only thread that changes it.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

#: Items (nodes, answer entries) a background loop works out between two pauses: about half
#: a millisecond at 10,000 nodes, the most a request arriving meanwhile waits for it.
PAUSE_EVERY = 32
#: The share of the refresh interval each of a refresh's two pieces (parsing Prometheus'
#: answers, working out the View) may wait for requests: at most half an interval in all.
GIVE_WAY_SHARE = 0.25

#: Refreshes between two full garbage collections (Collector.refreshed).
FULL_COLLECTION_EVERY = 20

Pause = Callable[[], None]
T = TypeVar("T")


class InFlight:
    """The HTTP requests being answered, and the pauses background work takes for them."""

    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()
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

    def budget(self, limit_s: float) -> Pause:
        """A pause for one piece of background work (one refresh): each call waits while
        requests are in flight, all of them together at most `limit_s`."""
        left = limit_s

        def pause() -> None:
            nonlocal left
            if not self._count or left <= 0.0:
                return
            start = time.monotonic()
            self._idle.wait(left)
            waited = time.monotonic() - start
            left -= waited
            self.waited_s += waited

        return pause


def no_pause() -> None:
    """The pause of work that gives way to nothing (tests, tools)."""


#: The pause of the work on this thread (`giving_way`); none set: `no_pause`.
_this_thread = threading.local()


@contextmanager
def giving_way(pause: Pause) -> Iterator[None]:
    """Work on this thread meanwhile gives way with `pause` (a refresh's): the domain code
    paces its long loops (`paced`, `give_way_now`) without passing a pause along. A
    request's thread never sets one: its loops run unpaced, at no cost."""
    before = getattr(_this_thread, "pause", no_pause)
    _this_thread.pause = pause
    try:
        yield
    finally:
        _this_thread.pause = before


def give_way_now() -> None:
    """Call this thread's pause once (between two long stretches of work)."""
    getattr(_this_thread, "pause", no_pause)()


def paced(items: Iterable[T], pause: Pause | None = None) -> Iterator[T]:
    """`items`, with `pause` (this thread's where not given: `giving_way`) called after every
    PAUSE_EVERY of them; as they are for `no_pause` (placements, writes), at no cost."""
    if pause is None:
        pause = getattr(_this_thread, "pause", no_pause)
    if pause is no_pause:
        return iter(items)
    return _paced(items, pause)


def _paced(items: Iterable[T], pause: Pause) -> Iterator[T]:
    for count, item in enumerate(items, 1):
        yield item
        if not count % PAUSE_EVERY:
            pause()


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


class Collector:
    """What the garbage collector does around Views (docs/benchmarks.md, "Where the time
    goes"). A View holds 10,000 nodes' states and answer entries: long-lived objects that
    every collection would walk again (a young one every request or two: 0.3 ms at 10,000
    nodes; a full one triples a 10,000-candidate placement's latency), and whose garbage
    needs no collector (decider.placement.answers keeps it acyclic). So:

    - `off()` while a refresh works out its View: each young collection would walk what is
      made so far again, holding the interpreter 10 to 40 ms where no pause can give way;
      the View is frozen out of the collector's sight after;
    - `changed()` after a write made its View: frozen likewise;
    - `refreshed()` after each refresh: what was frozen is looked at again (unfreeze,
      collect) every `full_every` refreshes, so garbage in cycles cannot pile up in the
      permanent generation. Not at every refresh: a full collection holds the GIL for a
      10,000-node site's 0.1 s.
    """

    def __init__(self, full_every: int = FULL_COLLECTION_EVERY) -> None:
        self._full_every = full_every
        self._refreshes = 0

    @contextmanager
    def off(self) -> Iterator[None]:
        collecting = gc.isenabled()
        gc.disable()
        try:
            yield
        finally:
            gc.freeze()
            if collecting:
                gc.enable()

    def changed(self) -> None:
        gc.freeze()

    def refreshed(self) -> None:
        self._refreshes += 1
        if (self._refreshes - 1) % self._full_every == 0:  # the first, and so on
            gc.unfreeze()
            gc.collect()
        gc.freeze()
