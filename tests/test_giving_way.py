"""Background work gives way to requests in flight (decider/giving_way.py), and a refresh
that does keeps writes meanwhile on the current View's figures (State.set_snapshot)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from decider import giving_way
from decider.giving_way import PAUSE_EVERY, CountInFlight, InFlight
from decider.models import ReservationRequest
from decider.placement import answers
from decider.state import State
from decider.store import Store
from tests.placement_helpers import (
    CANDIDATES,
    NOW,
    SHAPES,
    STALENESS,
    assert_as_decide,
    facility,
    readings,
)


def pausing(pause: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=pause, daemon=True)
    thread.start()
    return thread


def test_a_pause_waits_until_no_request_is_in_flight() -> None:
    in_flight = InFlight()
    in_flight.enter()
    in_flight.enter()
    thread = pausing(in_flight.budget(30.0))
    thread.join(0.2)
    assert thread.is_alive()
    in_flight.leave()  # one still in flight
    thread.join(0.2)
    assert thread.is_alive()
    in_flight.leave()
    thread.join(10.0)
    assert not thread.is_alive()
    assert in_flight.count == 0


def test_a_budget_waits_no_longer_than_its_limit_in_all() -> None:
    in_flight = InFlight()
    in_flight.enter()  # and never leaves
    pause = in_flight.budget(0.2)
    waits: list[float] = []
    for _ in range(3):
        before = in_flight.waited_s
        pause()
        waits.append(in_flight.waited_s - before)
    assert waits[0] >= 0.2 and waits[1:] == [0.0, 0.0]
    before = in_flight.waited_s
    in_flight.budget(0.05)()  # the next refresh's budget is its own
    assert in_flight.waited_s - before >= 0.05


def test_a_pause_with_nothing_in_flight_does_not_wait() -> None:
    in_flight = InFlight()
    pause = in_flight.budget(30.0)
    for _ in range(100):
        pause()
    assert in_flight.waited_s == 0.0


def test_the_middleware_counts_each_request_while_it_is_answered() -> None:
    in_flight = InFlight()
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(in_flight.count)
        if scope["path"] == "/fails":
            raise RuntimeError("the endpoint failed")

    counted = CountInFlight(app, in_flight)

    async def calls() -> None:
        await counted({"type": "http", "path": "/"}, None, None)
        with pytest.raises(RuntimeError):
            await counted({"type": "http", "path": "/fails"}, None, None)
        await counted({"type": "lifespan", "path": ""}, None, None)

    asyncio.run(calls())
    assert seen == [1, 1, 0]
    assert in_flight.count == 0


def test_a_refresh_gives_way_and_writes_meanwhile_keep_the_current_views_figures(
    tmp_path: Path,
) -> None:
    """While a refresh works out its View, the current View stays current: a reservation
    made meanwhile settles from it (its node states carry over) instead of reading the new
    snapshot from scratch; the View swapped in then has the reservation and the new
    readings, and answers as `decide` does."""
    in_flight = InFlight()
    calls: list[Any] = []
    store = Store(tmp_path / "decider.db")

    def pause() -> None:
        if not calls and not armed:
            return
        calls.append(state.view())
        if len(calls) == 1:  # a request in flight: the scheduler reserves meanwhile
            before = state.view()
            outcome = state.reserve(
                ReservationRequest(id="meanwhile", replica=SHAPES[0], node="r5-1")
            )
            assert outcome.reservation is not None
            after = state.view()
            assert after.snapshot is before.snapshot is first
            kept = after.__dict__.get("_nodes", {})
            assert kept and all(
                kept[node] is before.node(node) for node in ("r1-1", "r2-1") if node in kept
            )
        giving_way()

    armed = False
    state = State(facility(), store, 300.0, STALENESS, clock=lambda: NOW)
    first = readings()
    state.set_snapshot(first)
    for rep in SHAPES[:2]:
        assert_as_decide(state.view(), rep, CANDIDATES)
    armed = True
    second = readings(1.2)
    giving_way = in_flight.budget(30.0)
    state.set_snapshot(second, pause)
    view = state.view()
    assert view.snapshot is second
    assert "meanwhile" in view.reservations
    assert len(calls) >= len(first.membership) // PAUSE_EVERY
    # The old snapshot until the swap; then one pause more, before the old View is freed.
    assert [seen.snapshot is first for seen in calls] == [True] * (len(calls) - 1) + [False]
    for rep in SHAPES[:2]:
        assert_as_decide(view, rep, CANDIDATES)
    assert answers.shape(view, SHAPES[0]).entries  # worked out before the swap


def test_the_collector_policy_collects_every_full_every_refreshes_and_freezes_each_view(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """decider.giving_way.Collector, the runtime policy the service hands its State: off
    while a View is worked out, each View frozen after, a full collection at the first
    refresh and every `full_every` after."""
    calls: list[str] = []
    enabled = [True]
    recorder = SimpleNamespace(
        isenabled=lambda: enabled[0],
        disable=lambda: (calls.append("disable"), enabled.__setitem__(0, False)),
        enable=lambda: (calls.append("enable"), enabled.__setitem__(0, True)),
        freeze=lambda: calls.append("freeze"),
        unfreeze=lambda: calls.append("unfreeze"),
        collect=lambda: calls.append("collect"),
    )
    monkeypatch.setattr(giving_way, "gc", recorder)
    collector = giving_way.Collector(full_every=3)
    with collector.off():
        assert calls == ["disable"]
    assert calls == ["disable", "freeze", "enable"]
    calls.clear()
    for _ in range(4):
        collector.refreshed()
    first, second, third = ["unfreeze", "collect", "freeze"], ["freeze"], ["freeze"]
    fourth = ["unfreeze", "collect", "freeze"]  # the 4th: 3 after the first
    assert calls == [*first, *second, *third, *fourth]
    calls.clear()
    collector.changed()
    assert calls == ["freeze"]
