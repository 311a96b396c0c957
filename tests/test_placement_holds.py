"""A hold refuses whatever the data (decider/placement/held.py): also when the node's
membership is stale or was never read, through the node's last known domains."""

from __future__ import annotations

from types import MappingProxyType

from decider import placement
from decider.config import Staleness
from decider.facility import DomainRef, Facility
from decider.models import Replica, ReservationRequest
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import State
from decider.store import Store

REPLICA = Replica(model="m", profile="p", gpus=1, power_watts=10)


def reasons(state: State, node: str = "n1") -> list[str]:
    return placement.decide(state.view(), REPLICA, [node]).as_json()["nodes"][0]["reasons"]


def test_a_hold_still_refuses_once_membership_is_stale(tmp_path):
    clock = [1000.0]
    state = State(
        Facility.model_validate({"mode": "enforce"}),
        Store(tmp_path / "decider.db"),
        300,
        Staleness(readings=120, inventory=3600),
        clock=lambda: clock[0],
    )
    membership = {"n1": (DomainRef("rack", "r1"), DomainRef("row", "1"))}
    state.set_snapshot(
        Snapshot(
            membership=MappingProxyType(membership),
            parts={part: Part(1000.0) for part in PARTS},
            prometheus_up=True,
        )
    )
    assert reasons(state) == []
    state.hold(DomainRef("row", "1"), "cooling work")
    assert reasons(state) == ["row 1 held: cooling work"]
    clock[0] += 4000  # membership older than staleness.inventory: not used for budgets
    assert reasons(state) == ["row 1 held: cooling work (from the node's last known domains)"]
    state.release_hold(DomainRef("row", "1"))
    assert reasons(state) == []
    state.hold(DomainRef("rack", "r1"), "PDU swap")
    assert reasons(state) == ["rack r1 held: PDU swap (from the node's last known domains)"]


def test_a_hold_refuses_by_a_reservations_domains_when_prometheus_was_never_read(tmp_path):
    state = State(
        Facility.model_validate({"mode": "enforce"}),
        Store(tmp_path / "decider.db"),
        300,
        Staleness(),
    )
    state.hold(DomainRef("rack", "r7"), "maintenance")
    assert reasons(state, "n7") == []  # nothing ties n7 to rack r7 yet: missing data
    outcome = state.reserve(ReservationRequest(id="a", replica=REPLICA, node="n7"))
    assert outcome.created
    # Reserved while nothing was known: the reservation names no domains, so still nothing.
    assert reasons(state, "n7") == []
