"""Sites for the placement tests: a facility, a snapshot, a store and a State built in a few
lines (test_placement), the small site of the answer cache's tests (test_placement_answers), and
what the property tests share (test_placement_properties); used by the tests of phases, shedding
and the refresh's pacing too. The `make_site` fixture is tests/conftest.py's."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, settings
from pydantic_core import to_json

import decider.giving_way
import decider.state
from decider.config import Staleness
from decider.facility import DomainRef, Facility
from decider.models import Replica, ReservationRequest
from decider.placement import Decision, answers, decide
from decider.placement.view import View
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import ReserveOutcome, State
from decider.store import Hold, Reservation, Store

# --- building sites (tests/test_placement.py) ---------------------------------------------------
NOW = 1_700_000_000.0
STALENESS = Staleness(readings=120.0, inventory=3600.0)


def ref(key: str) -> DomainRef:
    return DomainRef.parse(key)


def make_facility(
    domains: Mapping[str, Any] | None = None, *, mode: str = "enforce", **more: Any
) -> Facility:
    return Facility.model_validate({"mode": mode, "domains": dict(domains or {}), **more})


def make_snapshot(
    membership: Mapping[str, Iterable[str]] | None = None,
    *,
    measured: Mapping[str, float] | None = None,
    conditions: Mapping[str, str] | None = None,
    ages: Mapping[str, float] | None = None,
    gpus: Mapping[str, int] | None = None,
    limits: Mapping[str, float] | None = None,
    read_at: Mapping[str, float | None] | None = None,
    errors: Mapping[str, str] | None = None,
    inventory: Iterable[str] = (),
) -> Snapshot:
    """A snapshot whose parts were all read at NOW, unless `read_at` says otherwise; its
    known domains are the members' and `inventory`."""
    nodes = {
        node: tuple(sorted(ref(key) for key in keys)) for node, keys in (membership or {}).items()
    }
    times = {name: NOW for name in PARTS} | dict(read_at or {})
    return Snapshot(
        membership=nodes,
        domains=frozenset(r for refs in nodes.values() for r in refs)
        | {ref(key) for key in inventory},
        measured_watts={ref(k): v for k, v in (measured or {}).items()},
        conditions={ref(k): v for k, v in (conditions or {}).items()},  # type: ignore[misc]
        reading_ages={ref(k): v for k, v in (ages or {}).items()},
        node_gpus=dict(gpus or {}),
        gpu_limit_watts=dict(limits or {}),
        parts={name: Part(times[name], (errors or {}).get(name)) for name in PARTS},
        prometheus_up=True,
    )


def replica(
    gpus: int = 1,
    power_watts: float | None = None,
    *,
    model: str = "llama",
    profile: str = "unlisted",
    cpu_cores: float | None = None,
) -> Replica:
    return Replica(
        model=model, profile=profile, gpus=gpus, power_watts=power_watts, cpu_cores=cpu_cores
    )


def stored(
    rid: str,
    node: str,
    watts: float,
    domains: Iterable[str],
    *,
    model: str = "llama",
    gpus: int = 1,
) -> Reservation:
    """A reservation as the store keeps it (for a site that starts with reservations)."""
    return Reservation(
        id=rid,
        node=node,
        replica={"model": model, "profile": "unlisted", "gpus": gpus},
        estimate_watts=watts,
        gpus=gpus,
        domains=tuple(ref(key) for key in domains),
        created_at=NOW - 10,
        expires_at=None,
        confirmed_at=NOW - 5,
    )


class Site:
    """A State over a Store, with a clock the test moves."""

    def __init__(
        self,
        path: Path,
        facility: Facility,
        snapshot: Snapshot | None,
        reservations: Iterable[Reservation],
        holds: Mapping[str, str],
    ) -> None:
        self.now = NOW
        self.store = Store(path)
        for reservation in reservations:
            assert self.store.add(reservation)
        for key, reason in holds.items():
            self.store.hold(Hold(ref(key), reason, NOW - 60))
        self.state = State(facility, self.store, 300.0, STALENESS, clock=lambda: self.now)
        if snapshot is not None:
            self.state.set_snapshot(snapshot)
        self.ids = 0

    def view(self) -> View:
        return self.state.view()

    def decide(self, rep: Replica, candidates: list[str]) -> Decision:
        return decide(self.view(), rep, candidates)

    def answer(self, rep: Replica, candidates: list[str]) -> dict[str, Any]:
        return self.decide(rep, candidates).as_json()

    def reserve(self, node: str, rep: Replica) -> ReserveOutcome:
        self.ids += 1
        return self.state.reserve(ReservationRequest(id=f"res-{self.ids}", replica=rep, node=node))

    def node_json(self, rep: Replica, node: str) -> dict[str, Any]:
        return self.answer(rep, [node])["nodes"][0]


# --- the answer cache's small site (tests/test_placement_answers.py) ---------------------------
RACKS = {"r1": "1", "r2": "1", "r3": "2", "r4": "2", "r5": "2"}
NODES = {f"{rack}-{n}": rack for rack in RACKS for n in range(1, 4)}
MEMBERSHIP = {
    node: [f"rack/{rack}", f"pdu/{rack}-a", f"row/{RACKS[rack]}", "room/a", "site/s"]
    for node, rack in NODES.items()
}
CANDIDATES = [*NODES, "ghost"]  # ghost: no membership
DOMAINS: dict[str, Any] = {
    "rack/r1": {"cap_watts": 20_000, "other_watts": 500},
    "rack/r2": {"cap_watts": 20_000},
    "rack/r3": {"cap_watts": 20_000},
    "rack/r4": {"cap_watts": 5_000},
    "rack/r5": {"cap_watts": 20_000},
    "pdu/r1-a": {
        "cap_watts": 18_000,
        "phases": {
            "L1": {"rating_watts": 6_000},
            "L2": {"rating_watts": 6_000},
            "L3": {"rating_watts": 6_000},
        },
    },
    "pdu/r3-a": {"cap_watts": 15_000},
    "row/1": {"cap_watts": 15_000},  # binds before racks r1 and r2 do
    "room/a": {"cap_watts": 60_000},
    "site/s": {"cap_watts": 70_000},
}
PHASE_NODES = {"r1-1": {"phases": {"r1-a": "L1"}}, "r1-2": {"phases": {"r1-a": "L2"}}}
SHAPES = [
    replica(2),
    replica(4, model="mistral"),
    replica(1, power_watts=2_500.0),
    replica(8, model="mistral", profile="big"),
]


def readings(scale: float = 1.0, **watts: float) -> Any:
    """The site's readings, measured power scaled; `watts`: domains' measured power instead
    (rack_r1=…)."""
    measured = {
        "rack/r1": 6_000.0 * scale,
        "rack/r2": 4_000.0 * scale,
        "rack/r3": 9_000.0 * scale,
        "rack/r4": 6_000.0,  # over its cap whatever the scale
        "rack/r5": 3_000.0 * scale,
        "pdu/r1-a": 5_000.0 * scale,
        "row/1": 10_000.0 * scale,
        "room/a": 25_000.0 * scale,
        "site/s": 25_000.0 * scale,
    } | {key.replace("_", "/", 1): value for key, value in watts.items()}
    conditions = {f"rack/{rack}": "ok" for rack in RACKS} | {"rack/r3": "hot", "rack/r5": "warm"}
    limits = {node: 700.0 for node in NODES if node != "r3-2"}  # r3-2: limit unknown
    gpus = {node: 8 for node in NODES if node != "r4-1"}  # r4-1: GPU count unknown
    return make_snapshot(
        MEMBERSHIP,
        measured=measured,
        conditions=conditions,
        ages=dict.fromkeys(conditions, 5.0),
        gpus=gpus,
        limits=limits,
    )


def facility(mode: str = "enforce", **more: Any) -> Any:
    return make_facility(
        DOMAINS,
        mode=mode,
        nodes=PHASE_NODES,
        node_share_watts=400,
        profiles={"big": {"gpus": 8, "power_watts": 6_000}},
        **more,
    )


def assert_as_decide(view: View, rep: Replica, candidates: list[str]) -> answers.Answer:
    """The cached answer is the fresh one, in every part the endpoint uses: `decide`'s on
    this View, on a View of the same state that works out every figure anew (this View
    may have taken its figures over from the View before, View.settle), and on one that
    runs the filters at each call (no refusal memo: View.memo_refusals)."""
    decision = decide(view, rep, candidates)
    got = answers.place(view, rep, candidates)
    assert got.body == to_json(decision.as_json())
    anew = dataclasses.replace(view)
    assert got.body == to_json(decide(anew, rep, candidates).as_json())
    unremembered = dataclasses.replace(view, memo_refusals=False)
    assert got.body == to_json(decide(unremembered, rep, candidates).as_json())
    assert got.order == decision.order
    assert got.summary == decision.summary()
    assert got.refusals_by_rule == decision.refusals_by_rule
    assert got.judged == len(decision.verdicts)
    assert got.refused == sum(1 for verdict in decision.verdicts if verdict.refusals)
    assert got.refusals == [
        (verdict.node.node, reason)
        for verdict in decision.verdicts
        for _, reason in (*verdict.refusals, *verdict.would_refuse)
    ]
    return got


# --- the property tests (tests/test_placement_properties.py) ------------------------------------
#: State.set_snapshot's garbage-collector housekeeping (a full collection, for the
#: refresher's thread) costs tens of milliseconds in a test process, every example; it is no
#: part of the rules, so the examples skip it.
NO_GC = SimpleNamespace(
    collect=lambda: 0,
    freeze=lambda: None,
    unfreeze=lambda: None,
    isenabled=lambda: False,
    disable=lambda: None,
    enable=lambda: None,
)


def scratch(view: View) -> View:
    """The same state, every figure worked out anew."""
    return View(
        facility=view.facility,
        snapshot=view.snapshot,
        now=view.now,
        fresh=view.fresh,
        missing=view.missing,
        reservations=view.reservations,
        holds=view.holds,
    )


#: read_at for each freshness: fresh, stale (past both limits), never read.
READ_AT: dict[str, float | None] = {"fresh": NOW, "stale": NOW - 10_000, "never": None}
#: The property tests' Hypothesis settings: the same examples every run.
SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=150,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclasses.dataclass
class SiteSpec:
    facility: dict[str, Any]
    membership: dict[str, tuple[DomainRef, ...]]
    measured: dict[DomainRef, float]
    conditions: dict[DomainRef, str]
    ages: dict[DomainRef, float]
    gpus: dict[str, int]
    limits: dict[str, float]
    reservations: list[Reservation]
    holds: dict[DomainRef, str]

    @property
    def nodes(self) -> list[str]:
        return sorted(self.membership)

    def snapshot(self, freshness: Mapping[str, str] | None = None) -> Snapshot:
        fresh = freshness or {}
        return Snapshot(
            membership=self.membership,
            domains=frozenset(r for refs in self.membership.values() for r in refs),
            measured_watts=self.measured,
            conditions=self.conditions,  # type: ignore[arg-type]
            reading_ages=self.ages,
            node_gpus=self.gpus,
            gpu_limit_watts=self.limits,
            parts={name: Part(READ_AT[fresh.get(name, "fresh")]) for name in PARTS},
            prometheus_up=True,
        )


@contextmanager
def state_of(spec: SiteSpec, snapshot: Snapshot | None) -> Iterator[State]:
    store = Store(Path(":memory:"))
    try:
        for reservation in spec.reservations:
            assert store.add(reservation)
        for ref, reason in spec.holds.items():
            store.hold(Hold(ref, reason, NOW - 60))
        facility = Facility.model_validate(spec.facility)
        state = State(facility, store, 300.0, STALENESS, clock=lambda: NOW)
        if snapshot is not None:
            with mock.patch.object(decider.giving_way, "gc", NO_GC):
                state.set_snapshot(snapshot)
        yield state
    finally:
        store.close()
