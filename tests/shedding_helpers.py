"""A shedding site in-process (tests/test_shedding.py): a facility, its store and State, the
Shedder, and the models and classes the plans order by; shared with the tests of conditions
per kind."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import decider.giving_way
import decider.state
from decider.facility import DomainRef, Facility
from decider.models import Replica, ReservationRequest
from decider.shedding.planner import Plan
from decider.shedding.shedder import Shedder
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import State
from decider.store import Store
from tests.placement_helpers import NO_GC, NOW, STALENESS, ref


class Site:
    """A State (enforce mode) over an in-memory Store, a clock, and the snapshot it reads."""

    def __init__(self, facility: Mapping[str, Any], membership: Mapping[str, list[str]]):
        self.now = NOW
        self.facility = Facility.model_validate({"mode": "enforce", **facility})
        self.membership = {n: tuple(sorted(ref(k) for k in keys)) for n, keys in membership.items()}
        self.store = Store(Path(":memory:"))
        self.state = State(self.facility, self.store, 3600.0, STALENESS, clock=lambda: self.now)
        self.conditions: dict[DomainRef, str] = {}
        self.hot_since: dict[DomainRef, float] = {}
        self.measured: dict[DomainRef, float] = {}
        self.ids = 0
        self.refresh()
        self.shedder = Shedder(
            self.store, self.state.view, lambda: self.now, self.state.record_proposals
        )

    def snapshot(self) -> Snapshot:
        return Snapshot(
            membership=self.membership,
            domains=frozenset(r for refs in self.membership.values() for r in refs),
            measured_watts=dict(self.measured),
            conditions=dict(self.conditions),  # type: ignore[arg-type]
            hot_seconds={r: self.now - t for r, t in self.hot_since.items()},
            node_gpus=dict.fromkeys(self.membership, 8),
            gpu_limit_watts=dict.fromkeys(self.membership, 700.0),
            parts={name: Part(self.now) for name in PARTS},
            prometheus_up=True,
        )

    def refresh(self) -> None:
        with mock.patch.object(decider.giving_way, "gc", NO_GC):
            self.state.set_snapshot(self.snapshot())

    def heat(self, key: str, seconds: float) -> None:
        """The domain hot now, and for `seconds` already."""
        self.conditions[ref(key)] = "hot"
        self.hot_since[ref(key)] = self.now - seconds
        self.refresh()

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.refresh()

    def reserve(self, node: str, watts: float, model: str, gpus: int = 1, **more: Any) -> str:
        self.ids += 1
        replica = Replica(model=model, profile="p", gpus=gpus, power_watts=watts, **more)
        outcome = self.state.reserve(
            ReservationRequest(id=f"r{self.ids:02d}", replica=replica, node=node)
        )
        assert outcome.created, outcome.verdict and outcome.verdict.refusals
        self.now += 1  # later reservations are newer
        return f"r{self.ids:02d}"

    def plan(self) -> Plan:
        return self.shedder.plan()

    def execute(self, move: Mapping[str, Any]) -> bool:
        """What the scheduler does with a move: the replica on its destination, through the
        real reservation path; whether the destination accepted it."""
        old = self.state.view().reservations[move["reservation"]]
        assert self.state.release(old.id)
        outcome = self.state.reserve(
            ReservationRequest(
                id=f"{old.id}-moved", replica=Replica.model_validate(old.replica), node=move["to"]
            )
        )
        return outcome.created


@contextmanager
def site(facility: Mapping[str, Any], membership: Mapping[str, list[str]]) -> Iterator[Site]:
    made = Site(facility, membership)
    try:
        yield made
    finally:
        made.store.close()


SHEDDING = {"enabled": True, "hot_for": "10m", "interval": "5m"}
CLASSES = ["batch", "standard", "interactive"]
MODELS = {
    "chat": {"class": "interactive", "minimum_replicas": 2, "critical": True},
    "summarise": {"class": "standard", "minimum_replicas": 1},
    "embed": {"class": "batch"},
}
