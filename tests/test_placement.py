"""The placement rules (decider/placement), one group of tests per rule module, in-process.

Sites are built from a Facility, a Snapshot (parts read at NOW: fresh) and a State over a
Store in tmp_path; decisions come from `decider.placement.decide` and `State.reserve`, the
headroom dry run from `decider.placement.capacity.fits`. Every figure a test expects is
worked out by hand in a comment beside it. Mutation testing (docs/mutation.md) runs this
file and tests/test_placement_properties.py, so a rule's exact boundary and reason string are
asserted here, not only its gist.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from pydantic_core import to_json

from decider.facility import DomainRef, Facility, Profile
from decider.models import Replica
from decider.placement import (
    ORDER_KEYS,
    RULES,
    answers,
    condition,
    decide,
    held,
    hot,
    observed,
    over_cap,
    power_cap,
    rack_room,
    rules,
    spread,
)
from decider.placement.capacity import UNBOUNDED, Fit, fits, replica_of
from decider.placement.estimate import Estimate, estimate
from decider.placement.states import Ask, kw
from decider.placement.view import CONDITION_RANK, DomainState, NodeState, View
from decider.snapshot import PARTS, Snapshot
from decider.store import Hold
from tests.placement_helpers import (
    NOW,
    STALENESS,
    Site,
    make_facility,
    make_snapshot,
    ref,
    replica,
    stored,
)

# --- building sites ---------------------------------------------------------------------------


def notes(answer: dict[str, Any], start: str) -> list[str]:
    """The answer's `missing` notes that start so (others may come with them)."""
    return [note for note in answer["missing"] if note.startswith(start)]


def domain_state(
    key: str = "rack/r1",
    *,
    cap: float | None = 10_000.0,
    margin: float = 0.1,
    other: float = 0.0,
    reserved: float = 0.0,
    measured: float | None = None,
    cond: str = "ok",
    age: float | None = None,
    hold: str | None = None,
) -> DomainState:
    """One domain's state, built as the view builds it, for the rule modules' own functions."""
    return DomainState.build(
        ref=ref(key),
        cap=cap,
        margin=margin,
        other_watts=other,
        reserved=reserved,
        measured=measured,
        condition=cond,  # type: ignore[arg-type]
        reading_age=age,
        held=None if hold is None else Hold(ref(key), hold, NOW),
    )


def node_state(
    *domains: DomainState,
    name: str = "n1",
    gpus: int | None = 8,
    limit: float | None = 700.0,
    reserved_gpus: int = 0,
) -> NodeState:
    rooms = [d.room for d in domains if d.room is not None]
    return NodeState(
        node=name,
        domains=domains,
        condition="ok",
        room=min(rooms) if rooms else None,
        rack=next((d for d in domains if d.ref.kind == "rack"), None),
        gpus=gpus,
        gpu_limit_watts=limit,
        reserved_gpus=reserved_gpus,
    )


#: The DESIGN.md §5 example: a dual-fed rack whose feeds are rated 20 kW and 22.5 kW.
R12_07 = {
    "rack/r12-07": {
        "feeds": [
            {"pdu": "r12-07-a", "rating_watts": 20_000},
            {"pdu": "r12-07-b", "rating_watts": 22_500},
        ]
    }
}
R12_07_NODES = {"n1": ["rack/r12-07", "pdu/r12-07-a", "pdu/r12-07-b", "row/12"]}


# --- registry ---------------------------------------------------------------------------------


def test_rule_names_are_the_reason_codes() -> None:
    assert RULES == ("held", "hot", "over_cap", "power_cap")
    assert ORDER_KEYS == ("condition", "rack_room", "spread", "scheduler_order")


# --- held -------------------------------------------------------------------------------------


def test_held_refuses_every_node_of_a_held_domain_with_its_reason(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]}),
        holds={"rack/r1": "PDU swap"},
    )
    answer = site.answer(replica(), ["n1", "n2"])
    assert answer["order"] == ["n2"]
    assert answer["nodes"][0]["allowed"] is False
    assert answer["nodes"][0]["reasons"] == ["rack r1 held: PDU swap"]
    assert "scores" not in answer["nodes"][0]
    assert answer["nodes"][1]["reasons"] == []
    assert answer["summary"] == "1/2 nodes allowed (1 held)"

    # A hold on the row refuses both; releasing it gives the nodes back.
    site.state.hold(ref("row/1"), "cooling work")
    decision = site.decide(replica(), ["n1", "n2"])
    assert decision.order == []
    assert decision.verdicts[1].refusals == [("held", "row 1 held: cooling work")]
    assert decision.refusals_by_rule == {"held": 2}
    site.state.release_hold(ref("row/1"))
    site.state.release_hold(ref("rack/r1"))
    assert site.decide(replica(), ["n1", "n2"]).order == ["n1", "n2"]


def test_held_refuse_on_one_domain() -> None:
    assert held.refuse(domain_state()) is None
    assert held.refuse(domain_state("pdu/p-a", hold="breaker test")) == "pdu p-a held: breaker test"


def test_a_hold_refuses_whatever_the_condition_and_budget(make_site: Any) -> None:
    # No budget, condition unknown (no conditions read): the hold alone refuses.
    site = make_site(make_facility(), make_snapshot({"n1": ["rack/r9"]}), holds={"rack/r9": "x"})
    assert site.decide(replica(), ["n1"]).verdicts[0].refusals == [("held", "rack r9 held: x")]


# --- hot --------------------------------------------------------------------------------------


def test_hot_refuses_with_the_reading_age(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot(
            {"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"], "n3": ["rack/r3", "row/2"]},
            conditions={"rack/r1": "hot", "rack/r2": "warm", "row/1": "ok", "rack/r3": "ok"},
            ages={"rack/r1": 41.6},  # shown rounded: 42s
        ),
    )
    decision = site.decide(replica(), ["n1", "n2", "n3"])
    assert decision.verdicts[0].refusals == [("hot", "rack r1 hot (reading 42s old)")]
    assert decision.verdicts[1].refusals == []  # warm is ordered last, never refused
    assert decision.order == ["n3", "n2"]
    assert [v.node.condition for v in decision.verdicts] == ["hot", "warm", "ok"]


def test_hot_refuse_on_one_domain() -> None:
    assert hot.refuse(domain_state(cond="hot")) == "rack r1 hot"  # no age read
    assert hot.refuse(domain_state("row/12", cond="hot", age=0.4)) == "row 12 hot (reading 0s old)"
    for cond in ("ok", "warm", "unknown"):
        assert hot.refuse(domain_state(cond=cond, age=5.0)) is None


def test_node_condition_is_the_worst_of_its_domains(make_site: Any) -> None:
    assert CONDITION_RANK == {"hot": 3, "warm": 2, "ok": 1, "unknown": 0}
    site = make_site(
        make_facility(),
        make_snapshot(
            {
                "n1": ["rack/r1", "pdu/p1", "row/1"],  # ok, warm, unknown → warm
                "n2": ["rack/r2", "row/1"],  # ok, unknown → ok
                "n3": ["rack/r3"],  # nothing read → unknown
                "n4": ["rack/r4", "pdu/p4"],  # warm, hot → hot
            },
            conditions={"rack/r1": "ok", "pdu/p1": "warm", "rack/r2": "ok", "rack/r4": "warm"}
            | {"pdu/p4": "hot"},
        ),
    )
    view = site.view()
    assert [view.node(n).condition for n in ("n1", "n2", "n3", "n4")] == [
        "warm",
        "ok",
        "unknown",
        "hot",
    ]


# --- over_cap ---------------------------------------------------------------------------------


def over_cap_site(make_site: Any, measured: float | None, existing: float = 0.0) -> Site:
    """rack/r1: cap 10 kW (limit 9 kW), other_watts 500; n1 in it."""
    reservations = [stored("old", "n1", existing, ["rack/r1"])] if existing else []
    return make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000, "other_watts": 500}}),
        make_snapshot(
            {"n1": ["rack/r1"]}, measured={} if measured is None else {"rack/r1": measured}
        ),
        reservations=reservations,
    )


def test_over_cap_on_measured_load_refuses_whatever_the_size(make_site: Any) -> None:
    # load = max(reserved 0, measured 9 800) + other 500 = 10 300 > cap 10 000.
    site = over_cap_site(make_site, measured=9_800)
    for rep in (replica(power_watts=1), replica(gpus=0, profile="nothing")):
        verdict = site.decide(rep, ["n1"]).verdicts[0]
        assert verdict.refusals == [
            ("over_cap", "rack r1: over its cap, 10.3 of 10.0 kW measured (incl. 0.5 other)")
        ]  # and not power_cap as well


def test_over_cap_on_reserved_load(make_site: Any) -> None:
    # Reserved 11 000 (from before the cap was lowered) + 500 other = 11 500; measured 2 000 is
    # lower, so the reserved figure stands.
    site = over_cap_site(make_site, measured=2_000, existing=11_000)
    assert site.decide(replica(power_watts=1), ["n1"]).verdicts[0].refusals == [
        ("over_cap", "rack r1: over its cap, 11.5 of 10.0 kW reserved (incl. 0.5 other)")
    ]


def test_at_the_cap_is_not_over_it_but_has_no_room(make_site: Any) -> None:
    # measured 9 500 + other 500 = 10 000 = cap: not over it; the limit (9 000) is passed, so
    # power_cap refuses even 1 W.
    site = over_cap_site(make_site, measured=9_500)
    assert site.decide(replica(power_watts=1), ["n1"]).verdicts[0].refusals == [
        (
            "power_cap",
            "rack r1: 10.0 of 10.0 kW measured (incl. 0.5 other), replica needs ~0.0, margin 10%",
        )
    ]


def test_over_cap_refuse_on_one_domain() -> None:
    assert over_cap.refuse(domain_state(cap=None, measured=1e9)) is None  # no budget
    assert over_cap.refuse(domain_state(reserved=10_000)) is None  # at the cap
    assert (
        over_cap.refuse(domain_state("pdu/a", reserved=10_001))
        == "pdu a: over its cap, 10.0 of 10.0 kW reserved"
    )
    assert kw(123_456) == "123.5"
    assert kw(0) == "0.0"
    assert over_cap.other(domain_state(other=1_250)) == " (incl. 1.2 other)"
    assert over_cap.other(domain_state(other=0)) == ""


# --- power_cap --------------------------------------------------------------------------------


def test_power_cap_reason_as_in_the_design(make_site: Any) -> None:
    # Dual-fed rack: cap = smallest feed × derating = 20 000 × 0.8 = 16 000 W (not the sum,
    # 34 000, nor the larger feed's 18 000); limit = 16 000 × 0.9 = 14 400.
    site = make_site(make_facility(R12_07), make_snapshot(R12_07_NODES))
    assert site.view().domain(ref("rack/r12-07")).cap == 16_000
    # Two reservations of 7 100: 14 200 reserved, room 200.
    assert site.reserve("n1", replica(power_watts=7_100)).created
    assert site.reserve("n1", replica(power_watts=7_100)).created
    answer = site.node_json(replica(power_watts=2_800), "n1")
    assert answer["reasons"] == [
        "rack r12-07: 14.2 of 16.0 kW reserved, replica needs ~2.8, margin 10%"
    ]
    assert answer["headroom_watts"] == -2_600.0  # 200 − 2 800
    assert answer["estimate_watts"] == 2_800.0


def test_power_cap_boundary_is_cap_times_one_minus_margin(make_site: Any) -> None:
    site = make_site(make_facility(R12_07), make_snapshot(R12_07_NODES))
    assert site.reserve("n1", replica(power_watts=14_000)).created  # room 400 left
    fits_exactly = site.node_json(replica(power_watts=400), "n1")
    assert fits_exactly["allowed"] is True
    assert fits_exactly["headroom_watts"] == 0.0
    over = site.node_json(replica(power_watts=400.5), "n1")
    assert over["allowed"] is False
    assert over["headroom_watts"] == -0.5
    # The same through reserve: 400.5 refused with the reason, 400 accepted, then 0 room.
    refused = site.reserve("n1", replica(power_watts=400.5))
    assert refused.reservation is None
    assert refused.verdict is not None
    assert refused.verdict.refusals[0][0] == "power_cap"
    assert site.reserve("n1", replica(power_watts=400)).created
    assert site.view().domain(ref("rack/r12-07")).room == 0.0


def test_power_cap_refuse_on_one_domain() -> None:
    domain = domain_state(reserved=8_000)  # limit 9 000: room 1 000
    assert power_cap.refuse(domain, 1_000) is None
    assert (
        power_cap.refuse(domain, 1_000.5)
        == "rack r1: 8.0 of 10.0 kW reserved, replica needs ~1.0, margin 10%"
    )
    assert power_cap.refuse(domain_state(cap=None, reserved=1e9), 1e9) is None
    # Over the cap is over_cap's refusal, not this one's; at the cap it is this one's.
    assert power_cap.refuse(domain_state(reserved=10_001), 1) is None
    assert power_cap.refuse(domain_state(reserved=10_000), 1) is not None
    # The domain's own margin, as a percentage, not rounded to a whole one (7.5%, not 8%):
    # limit 9 250, 8 300 reserved: room 950.
    assert power_cap.refuse(domain_state(margin=0.075, reserved=8_300), 950) is None
    assert power_cap.refuse(domain_state(margin=0.075, reserved=8_300), 1_000.5) == (
        "rack r1: 8.3 of 10.0 kW reserved, replica needs ~1.0, margin 7.5%"
    )
    # The load basis and other_watts as they are.
    measured = domain_state(margin=0.25, reserved=1_000, measured=6_000, other=700)
    assert (
        power_cap.refuse(measured, 2_000)
        == "rack r1: 6.7 of 10.0 kW measured (incl. 0.7 other), replica needs ~2.0, margin 25%"
    )


def test_power_cap_names_every_domain_past_its_limit(make_site: Any) -> None:
    # n1 is dual-fed from pdu/a (cap 5 000, limit 4 500) and pdu/b (cap 4 000, limit 3 600),
    # in rack/r1 (cap 20 000). Reserved 3 000 on n2 (pdu/b, rack/r1) and 1 000 on n1.
    # pdu/a: 1 000 reserved, room 3 500; pdu/b: 4 000 reserved, room −400; rack/r1: 4 000,
    # room 14 000. A 4 000 W replica passes pdu/a (3 500 < 4 000) and pdu/b, not the rack.
    site = make_site(
        make_facility(
            {
                "pdu/a": {"cap_watts": 5_000},
                "pdu/b": {"cap_watts": 4_000, "other_watts": 0},
                "rack/r1": {"cap_watts": 20_000},
            }
        ),
        make_snapshot({"n1": ["pdu/a", "pdu/b", "rack/r1"], "n2": ["pdu/b", "rack/r1"]}),
        reservations=[
            stored("a", "n2", 3_000, ["pdu/b", "rack/r1"]),
            stored("b", "n1", 1_000, ["pdu/a", "pdu/b", "rack/r1"]),
        ],
    )
    verdict = site.decide(replica(power_watts=4_000), ["n1"]).verdicts[0]
    assert verdict.refusals == [
        ("power_cap", "pdu a: 1.0 of 5.0 kW reserved, replica needs ~4.0, margin 10%"),
        ("power_cap", "pdu b: 4.0 of 4.0 kW reserved, replica needs ~4.0, margin 10%"),
    ]
    assert verdict.headroom_watts == -4_400.0  # the tightest room, pdu/b's −400, less 4 000
    # A 500 W replica passes pdu/b alone (room −400), whose single reason is given.
    small = site.decide(replica(power_watts=500), ["n1"]).verdicts[0]
    assert [reason for _, reason in small.refusals] == [
        "pdu b: 4.0 of 4.0 kW reserved, replica needs ~0.5, margin 10%"
    ]


def test_load_is_the_larger_of_reserved_and_measured_plus_other(make_site: Any) -> None:
    facility = make_facility({"rack/r1": {"cap_watts": 10_000, "other_watts": 900}})
    snapshot = make_snapshot({"n1": ["rack/r1"]}, measured={"rack/r1": 3_000})
    site = make_site(facility, snapshot, reservations=[stored("a", "n1", 2_000, ["rack/r1"])])
    domain = site.view().domain(ref("rack/r1"))
    # measured 3 000 > reserved 2 000: load 3 000 + 900 = 3 900; limit 9 000: room 5 100.
    assert (domain.load, domain.load_basis, domain.room, domain.headroom) == (
        3_900,
        "measured",
        5_100,
        6_100,
    )
    answer = site.node_json(replica(power_watts=5_101), "n1")
    assert answer["reasons"] == [
        "rack r1: 3.9 of 10.0 kW measured (incl. 0.9 other), replica needs ~5.1, margin 10%"
    ]
    assert site.node_json(replica(power_watts=5_100), "n1")["allowed"] is True


def test_load_basis_when_reserved_and_measured_tie() -> None:
    tie = domain_state(reserved=5_000, measured=5_000)
    assert (tie.load, tie.load_basis) == (5_000, "reserved")
    assert domain_state(reserved=5_000, measured=4_000).load_basis == "reserved"
    assert domain_state(reserved=0, measured=None).load_basis == "reserved"
    no_budget = domain_state(cap=None, reserved=5)
    assert (no_budget.limit, no_budget.room, no_budget.headroom) == (None, None, None)


def test_a_domain_without_budget_never_refuses(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"other_watts": 100}}),  # declared, no cap
        make_snapshot({"n1": ["rack/r1", "row/7"]}, measured={"rack/r1": 1e6, "row/7": 1e6}),
    )
    answer = site.node_json(replica(power_watts=1e6), "n1")
    assert (answer["allowed"], answer["headroom_watts"]) == (True, None)


def test_margin_zero_refuses_only_past_the_cap(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 1_000}}, defaults={"margin": 0}),
        make_snapshot({"n1": ["rack/r1"]}),
    )
    assert site.reserve("n1", replica(power_watts=1_000)).created
    answer = site.node_json(replica(power_watts=0.5), "n1")
    assert answer["reasons"] == ["rack r1: 1.0 of 1.0 kW reserved, replica needs ~0.0, margin 0%"]


# --- estimate ---------------------------------------------------------------------------------

ESTIMATE_FACILITY = {
    "profiles": {
        "declared": {"gpus": 4, "power_watts": 2_900},
        "derived": {"gpus": 2},
        "cpu": {"gpus": 0, "cpu_cores": 16},
        "cpu-declared": {"gpus": 0, "power_watts": 150},
    },
    "node_share_watts": 400,
    "cpu_watts_per_core": 4.5,
}


@pytest.fixture
def estimate_site(make_site: Any) -> Site:
    """n1: 8 GPUs at 700 W; n2: 4 GPUs, limit unknown; n3: GPU count unknown, 500 W;
    n4: neither known; n5: reports no GPUs; the site's largest limit is 700 W."""
    return make_site(
        make_facility(**ESTIMATE_FACILITY),
        make_snapshot(
            {n: ["rack/r1"] for n in ("n1", "n2", "n3", "n4", "n5")},
            gpus={"n1": 8, "n2": 4, "n5": 0},
            limits={"n1": 700, "n3": 500, "n5": 300},
        ),
    )


def test_estimate_declared_wins_over_the_profile(estimate_site: Site) -> None:
    node = estimate_site.view().node("n1")
    facility = estimate_site.view().facility
    rep = replica(4, power_watts=1_234, profile="declared")
    assert estimate(rep, node, facility, 700) == Estimate(1_234, "declared")
    assert estimate(replica(4, profile="declared"), node, facility, 700) == Estimate(
        2_900, "profile"
    )
    # A CPU profile with a declared figure uses it, whatever the cores.
    cpu = replica(0, profile="cpu-declared", cpu_cores=64)
    assert estimate(cpu, node, facility, 700) == Estimate(150, "profile")


def test_estimate_derived_from_the_node(estimate_site: Site) -> None:
    view = estimate_site.view()
    rep = replica(2, profile="derived")
    # n1: 2 × 700 + 400 × 2/8 = 1 400 + 100 = 1 500.
    assert estimate(rep, view.node("n1"), view.facility, 700) == Estimate(1_500, "derived")
    # More GPUs than the node has: the share is capped at the whole node share.
    # 16 × 700 + 400 = 11 600.
    assert estimate(replica(16), view.node("n1"), view.facility, 700).watts == 11_600
    # n2's limit is unknown: the site's largest stands in. 2 × 700 + 400 × 2/4 = 1 600.
    assert estimate(rep, view.node("n2"), view.facility, 700) == Estimate(
        1_600, "derived", ("limit",)
    )
    # No limit known anywhere: the node share alone, 400 × 2/4 = 200.
    assert estimate(rep, view.node("n2"), view.facility, None) == Estimate(
        200, "derived", ("no-limit",)
    )
    # n3's GPU count is unknown: the whole node share. 2 × 500 + 400 = 1 400.
    assert estimate(rep, view.node("n3"), view.facility, 700) == Estimate(
        1_400, "derived", ("gpus",)
    )
    # n4: neither. 2 × 700 + 400 = 1 800, and both gaps said.
    assert estimate(rep, view.node("n4"), view.facility, 700) == Estimate(
        1_800, "derived", ("limit", "gpus")
    )
    # n5 reports no GPUs: its count is known (no gap), the replica takes the whole share.
    assert estimate(rep, view.node("n5"), view.facility, 700) == Estimate(1_000, "derived")


def test_estimate_cpu_replica(estimate_site: Site) -> None:
    view = estimate_site.view()
    node = view.node("n1")
    # The request's cores first (10 × 4.5), else the profile's (16 × 4.5), else none: 0.
    assert estimate(replica(0, profile="cpu", cpu_cores=10), node, view.facility, 700) == Estimate(
        45, "derived"
    )
    assert estimate(replica(0, profile="cpu"), node, view.facility, 700) == Estimate(72, "derived")
    assert estimate(replica(0), node, view.facility, 700) == Estimate(0, "derived")
    # The default per-core figure is 6 W.
    assert estimate(replica(0, cpu_cores=10), node, make_facility(), None).watts == 60


def test_estimate_gaps_are_said_in_missing(estimate_site: Site) -> None:
    answer = estimate_site.answer(replica(2), ["n1", "n2", "n3", "n4", "n5"])
    assert [n["estimate_watts"] for n in answer["nodes"]] == [1_500, 1_600, 1_400, 1_800, 1_000]
    assert notes(answer, "GPU") == [
        "GPU power limit unknown for nodes n2, n4: estimated at the site's largest, 700 W",
        "GPU count unknown for nodes n3, n4: estimated with the whole node share",
    ]
    # A declared figure needs neither.
    assert notes(estimate_site.answer(replica(2, 100), ["n4"]), "GPU") == []


def test_estimate_without_any_limit(make_site: Any) -> None:
    # The limits part is stale: every node's limit is unknown, and so is the site's.
    site = make_site(
        make_facility(),
        make_snapshot(
            {"n1": ["rack/r1"]}, gpus={"n1": 8}, limits={"n1": 700}, read_at={"limits": NOW - 4_000}
        ),
    )
    answer = site.answer(replica(2), ["n1"])
    assert answer["nodes"][0]["estimate_watts"] == 87.5  # 2 × 0 + 350 × 2/8
    assert notes(answer, "each node's enforced") == [
        "each node's enforced GPU power limit (llmgw_gpu_power_limit_watts): last read 4000s "
        "ago, older than its 3600s limit",
    ]
    assert notes(answer, "GPU") == [
        "GPU power limit unknown for node n1, and for every node: estimated from the node "
        "share alone (too low; set fallback_gpu_watts in the facility file)",
    ]
    # With a fallback in the facility file: 2 × 600 + 87.5.
    site = make_site(
        make_facility(fallback_gpu_watts=600),
        make_snapshot({"n1": ["rack/r1"]}, gpus={"n1": 8}, read_at={"limits": None}),
    )
    answer = site.answer(replica(2), ["n1"])
    assert answer["nodes"][0]["estimate_watts"] == 1_287.5
    assert notes(answer, "GPU") == [
        "GPU power limit unknown for node n1, and for every node: estimated at the facility "
        "file's fallback_gpu_watts, 600 W per GPU"
    ]
    # A site limit known wins over the fallback; the node's own limit over both.
    site = make_site(
        make_facility(fallback_gpu_watts=600),
        make_snapshot(
            {"n1": ["rack/r1"], "n2": ["rack/r1"]}, gpus={"n1": 8, "n2": 8}, limits={"n2": 400}
        ),
    )
    assert [n["estimate_watts"] for n in site.answer(replica(2), ["n1", "n2"])["nodes"]] == [
        887.5,
        887.5,
    ]


def test_site_limit_is_the_largest_fresh_limit(make_site: Any) -> None:
    site = make_site(make_facility(), make_snapshot(limits={"a": 300, "b": 700.5, "c": 450}))
    assert site.view().site_gpu_limit_watts == 700.5
    assert make_site(make_facility(), make_snapshot()).view().site_gpu_limit_watts is None


def test_missing_lists_some_nodes_then_counts_them(make_site: Any) -> None:
    site = make_site(make_facility(), make_snapshot({"known": ["rack/r1"]}))
    names = [f"x{i}" for i in range(7)]
    assert notes(site.answer(replica(1, 10), names[:5]), "membership") == [
        "membership unknown for nodes x0, x1, x2, x3, x4 (no llmgw:node_domain:membership): "
        "no domain limits them"
    ]
    assert notes(site.answer(replica(1, 10), [*names, "known"]), "membership") == [
        "membership unknown for 7 nodes (x0, x1, x2, x3, x4, …) (no "
        "llmgw:node_domain:membership): no domain limits them"
    ]
    assert notes(site.answer(replica(1, 10), ["x0"]), "membership") == [
        "membership unknown for node x0 (no llmgw:node_domain:membership): no domain limits them"
    ]
    assert notes(site.answer(replica(1, 10), ["known"]), "membership") == []


# --- ordering: condition, rack_room, spread, the scheduler's order ----------------------------


def test_order_by_condition_then_rack_room_then_spread_then_scheduler(make_site: Any) -> None:
    # rack/r1 (a1, a2): cap 10 000, limit 9 000, 2 000 of llama reserved on a1 → room 7 000.
    # rack/r2 (b1): cap 20 000, limit 18 000, room 18 000. rack/r3 (c1): cap 10 000, warm.
    # rack/r4 (d1): no budget. e1: membership unknown. Replica: llama, 2 000 W.
    # Keys (condition, rack_room = −floor((room − 2 000) / 2 000), spread, index):
    #   e1 (0, 0, 0, 0)            unknown condition and rack: 0 each
    #   d1 (0, 0, 0, 1)            no budget: rack_room 0
    #   c1 (1, −3, 0, 2)           warm; floor(7 000 / 2 000) = 3
    #   a1 (0, −2, 2, 3)           floor(5 000 / 2 000) = 2; one llama in rack/r1 and pdu/p1
    #   a2 (0, −2, 1, 4)           one llama in rack/r1, none in pdu/p2
    #   b1 (0, −8, 0, 5)           floor(16 000 / 2 000) = 8
    # Sorted: b1, a2, a1, e1, d1, c1.
    site = make_site(
        make_facility(
            {
                "rack/r1": {"cap_watts": 10_000},
                "rack/r2": {"cap_watts": 20_000},
                "rack/r3": {"cap_watts": 10_000},
            }
        ),
        make_snapshot(
            {
                "a1": ["rack/r1", "pdu/p1"],
                "a2": ["rack/r1", "pdu/p2"],
                "b1": ["rack/r2", "pdu/p3"],
                "c1": ["rack/r3", "pdu/p4"],
                "d1": ["rack/r4", "pdu/p5"],
            },
            conditions={"rack/r1": "ok", "rack/r2": "ok", "rack/r3": "warm", "rack/r4": "ok"},
        ),
        reservations=[stored("a", "a1", 2_000, ["rack/r1", "pdu/p1"])],
    )
    answer = site.answer(replica(4, 2_000), ["e1", "d1", "c1", "a1", "a2", "b1"])
    assert answer["order"] == ["b1", "a2", "a1", "e1", "d1", "c1"]
    scores = {n["node"]: n["scores"] for n in answer["nodes"]}
    assert scores["b1"] == {"condition": 0, "rack_room": -8, "spread": 0, "scheduler_order": 5}
    assert scores["a1"] == {"condition": 0, "rack_room": -2, "spread": 2, "scheduler_order": 3}
    assert scores["a2"] == {"condition": 0, "rack_room": -2, "spread": 1, "scheduler_order": 4}
    assert scores["c1"] == {"condition": 1, "rack_room": -3, "spread": 0, "scheduler_order": 2}
    assert scores["e1"] == {"condition": 0, "rack_room": 0, "spread": 0, "scheduler_order": 0}
    assert answer["summary"] == "6/6 nodes allowed"
    assert notes(answer, "membership unknown for node e1 ") != []


def test_scheduler_order_breaks_ties(make_site: Any) -> None:
    site = make_site(make_facility(), make_snapshot({n: ["rack/r1"] for n in "abc"}))
    assert site.decide(replica(1, 10), ["c", "a", "b"]).order == ["c", "a", "b"]
    assert site.decide(replica(1, 10), ["b", "c", "a"]).order == ["b", "c", "a"]


def test_condition_score() -> None:
    node = node_state(domain_state())
    assert condition.name == "condition"
    scores = {
        cond: condition.score(
            NodeState(node.node, (), cond, (), None, None, None, None, 0),  # type: ignore[arg-type]
            Ask(1_000, {}),
        )
        for cond in ("ok", "unknown", "warm", "hot")
    }
    assert scores == {"ok": 0, "unknown": 0, "warm": 1, "hot": 0}


def test_rack_room_counts_whole_replicas_left() -> None:
    assert rack_room.name == "rack_room"
    rack = domain_state(reserved=2_000)  # limit 9 000: room 7 000
    node = node_state(rack)
    # After a 2 000 W replica, 5 000 left: 2 more (2.5 rounded down).
    assert rack_room.replicas_left(node, 2_000) == 2
    assert rack_room.score(node, Ask(2_000, {})) == -2
    # 7 000 W: exactly none left after it; 7 001 W: past the room, still none (not −1).
    assert rack_room.replicas_left(node, 7_000) == 0
    assert rack_room.replicas_left(node, 7_001) == 0
    assert rack_room.replicas_left(node, 3_500) == 1  # exactly one more
    # Not counted: no rack, a rack with no budget, a replica of no draw.
    assert rack_room.replicas_left(node_state(domain_state("pdu/a")), 2_000) is None
    assert rack_room.replicas_left(node_state(domain_state(cap=None)), 2_000) is None
    assert rack_room.replicas_left(node, 0) is None
    assert rack_room.score(node_state(), Ask(2_000, {})) == 0
    # A budgeted rack with room ranks before one with no budget; one with none left ties it.
    assert rack_room.score(node, Ask(7_000, {})) == 0


def test_spread_counts_the_same_model_in_the_rack_and_pdus(make_site: Any) -> None:
    # n1 is dual-fed (pdu/a, pdu/b) in rack/r1 and row/1. Reserved: llama on n2 (rack/r1,
    # pdu/a, row/1), llama on n3 (rack/r2, pdu/b, row/1), mistral on n1.
    # For llama on n1: rack/r1 1 + pdu/a 1 + pdu/b 1 = 3 (the row is not counted).
    membership = {
        "n1": ["rack/r1", "pdu/a", "pdu/b", "row/1"],
        "n2": ["rack/r1", "pdu/a", "row/1"],
        "n3": ["rack/r2", "pdu/b", "row/1"],
        "n4": ["rack/r3", "pdu/c", "row/1"],
    }
    site = make_site(
        make_facility(),
        make_snapshot(membership),
        reservations=[
            stored("1", "n2", 100, membership["n2"]),
            stored("2", "n3", 100, membership["n3"]),
            stored("3", "n1", 100, membership["n1"], model="mistral"),
        ],
    )
    view = site.view()
    assert spread.name == "spread"
    assert [
        spread.score(view.node(n), Ask(0, view.spread_counts("llama")))
        for n in ("n1", "n2", "n3", "n4")
    ] == [
        3,
        2,  # rack/r1 (its own) + pdu/a
        2,  # rack/r2 + pdu/b
        0,
    ]
    assert (
        spread.score(view.node("n1"), Ask(0, view.spread_counts("mistral"))) == 3
    )  # its own rack and pdus
    assert spread.score(view.node("n4"), Ask(0, view.spread_counts("mistral"))) == 0
    assert spread.score(view.node("unknown"), Ask(0, view.spread_counts("llama"))) == 0
    # Everything else equal, fewer of the same model first.
    assert site.decide(replica(1, 10), ["n1", "n2", "n3", "n4"]).order == ["n4", "n2", "n3", "n1"]


def test_spread_counts_where_a_reservation_was_made_when_membership_is_gone(
    make_site: Any,
) -> None:
    # n9 left the membership; its reservation still counts where it was made (rack/r1).
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/r1"]}),
        reservations=[stored("1", "n9", 100, ["rack/r1"])],
    )
    view = site.view()
    assert view.replicas_by_model == {("llama", ref("rack/r1")): 1}
    assert spread.score(view.node("n1"), Ask(0, view.spread_counts("llama"))) == 1
    assert view.domain(ref("rack/r1")).reserved == 100


def test_spread_without_reservations() -> None:
    view = View(
        make_facility(), make_snapshot({"n1": ["rack/r1"]}), NOW, frozenset(PARTS), (), {}, {}
    )
    assert spread.score(view.node("n1"), Ask(0, view.spread_counts("llama"))) == 0


# --- observe mode -----------------------------------------------------------------------------


def observe_site(make_site: Any, mode: str) -> Site:
    """n1: rack/r1 hot; n2: rack/r2 held; n3: rack/r3 full; n4: fine."""
    return make_site(
        make_facility({"rack/r3": {"cap_watts": 1_000}}, mode=mode),
        make_snapshot(
            {"n1": ["rack/r1"], "n2": ["rack/r2"], "n3": ["rack/r3"], "n4": ["rack/r4"]},
            conditions={"rack/r1": "hot", "rack/r4": "warm"},
        ),
        holds={"rack/r2": "maintenance"},
    )


def test_observe_refuses_nothing_and_keeps_the_scheduler_order(make_site: Any) -> None:
    site = observe_site(make_site, "observe")
    answer = site.answer(replica(1, 950), ["n3", "n1", "n4", "n2"])
    assert answer["mode"] == "observe"
    # DESIGN.md §5: observe computes and reports everything, a hold too, and refuses nothing.
    assert answer["order"] == ["n3", "n1", "n4", "n2"]
    assert [n["allowed"] for n in answer["nodes"]] == [True] * 4
    assert [n["reasons"] for n in answer["nodes"]] == [[]] * 4
    assert [n["would_refuse"] for n in answer["nodes"]] == [
        ["rack r3: 0.0 of 1.0 kW reserved, replica needs ~0.9, margin 10%"],
        ["rack r1 hot"],
        [],
        ["rack r2 held: maintenance"],
    ]
    assert answer["summary"] == (
        "observe mode: 4/4 nodes allowed, 3 would be refused (1 power_cap, 1 hot, 1 held)"
    )
    assert answer["nodes"][2]["scores"]["condition"] == 1  # warm, scored as in enforce
    # Reserving is not refused either: the reservation is made, the verdict kept.
    outcome = site.reserve("n1", replica(1, 950))
    assert outcome.created
    assert outcome.verdict is not None
    assert outcome.verdict.refusals == []
    assert outcome.verdict.would_refuse == [("hot", "rack r1 hot")]
    held = site.reserve("n2", replica(1, 950))
    assert held.created
    assert held.verdict is not None
    assert held.verdict.would_refuse == [("held", "rack r2 held: maintenance")]


def test_observe_with_nothing_refused(make_site: Any) -> None:
    site = observe_site(make_site, "observe")
    answer = site.answer(replica(1, 10), ["n4"])
    assert answer["summary"] == "observe mode: 1/1 nodes allowed, 0 would be refused"
    assert answer["nodes"][0]["would_refuse"] == []


def test_enforce_refuses_the_same_nodes(make_site: Any) -> None:
    site = observe_site(make_site, "enforce")
    answer = site.answer(replica(1, 950), ["n3", "n1", "n4", "n2"])
    assert answer["mode"] == "enforce"
    assert answer["order"] == ["n4"]
    assert [n["allowed"] for n in answer["nodes"]] == [False, False, True, False]
    assert all("would_refuse" not in n for n in answer["nodes"])
    assert answer["nodes"][1]["reasons"] == ["rack r1 hot"]
    assert answer["summary"] == "1/4 nodes allowed (1 power_cap, 1 hot, 1 held)"
    refused = site.reserve("n1", replica(1, 950))
    assert refused.reservation is None
    assert not refused.created
    assert site.state.reservations() == []


def test_summary_counts_a_rule_once_per_node_most_common_first(make_site: Any) -> None:
    # n1 and n2 are both hot (rack and row) and held: 2 hot, 2 held; n3 power_cap only.
    site = make_site(
        make_facility({"rack/r3": {"cap_watts": 1_000}}),
        make_snapshot(
            {"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"], "n3": ["rack/r3"]},
            conditions={"rack/r1": "hot", "row/1": "hot"},
        ),
        holds={"row/1": "x"},
    )
    decision = site.decide(replica(1, 950), ["n3", "n1", "n2"])
    assert decision.refusals_by_rule == {"held": 2, "hot": 2, "power_cap": 1}
    assert len(decision.verdicts[1].refusals) == 3  # rack hot, row held, row hot
    assert decision.summary() == "0/3 nodes allowed (2 hot, 2 held, 1 power_cap)"


# --- stale and missing data -------------------------------------------------------------------

STALE_READINGS = {"measured": NOW - 200, "conditions": NOW - 200, "ages": NOW - 200}


def test_stale_readings_make_conditions_unknown_and_drop_measurements(make_site: Any) -> None:
    # Were they fresh, rack/r1 would be hot and over its cap (12 000 measured > 10 000).
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000, "other_watts": 500}}),
        make_snapshot(
            {"n1": ["rack/r1"]},
            measured={"rack/r1": 12_000},
            conditions={"rack/r1": "hot"},
            ages={"rack/r1": 3},
            read_at=STALE_READINGS,
            errors={"measured": "timed out after 2s"},
        ),
    )
    answer = site.answer(replica(1, 1_000), ["n1"])
    node = answer["nodes"][0]
    assert (node["allowed"], node["condition"]) == (True, "unknown")
    assert node["headroom_watts"] == 7_500.0  # limit 9 000 − other 500 − 1 000
    domain = site.view().domain(ref("rack/r1"))
    assert (domain.measured, domain.condition, domain.reading_age) == (None, "unknown", None)
    assert answer["missing"] == [
        f"{PARTS['measured']}: last read 200s ago, older than its 120s limit (timed out after 2s)",
        "domain conditions (llmgw_domain_condition): last read 200s ago, older than its 120s limit",
        "domain reading ages (llmgw_domain_reading_age_seconds): last read 200s ago, older "
        "than its 120s limit",
    ]


def test_readings_go_stale_as_time_passes(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot(
            {"n1": ["rack/r1"]}, measured={"rack/r1": 9_500}, conditions={"rack/r1": "hot"}
        ),
    )
    assert [r for r, _ in site.decide(replica(1, 1), ["n1"]).verdicts[0].refusals] == [
        "hot",
        "power_cap",
    ]
    site.now = NOW + 120  # at the limit: still fresh
    assert site.decide(replica(1, 1), ["n1"]).verdicts[0].refusals
    site.now = NOW + 121
    decision = site.decide(replica(1, 1), ["n1"])
    assert decision.verdicts[0].refusals == []
    assert decision.verdicts[0].node.condition == "unknown"
    # Reservations still count when the measurements are gone: 8 500 reserved, room 500.
    assert site.reserve("n1", replica(1, 8_500)).created
    assert not site.reserve("n1", replica(1, 501)).created


def test_no_snapshot_refuses_only_for_a_hold_and_says_what_is_missing(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 1_000}}),
        reservations=[stored("1", "n1", 5_000, ["rack/r1"])],
        holds={"rack/r1": "x"},
    )
    answer = site.answer(replica(2), ["n1", "n2"])
    # Only the hold refuses, through the domains n1's reservation was made in.
    assert answer["order"] == ["n2"]
    assert answer["nodes"][0]["reasons"] == ["rack r1 held: x (from the node's last known domains)"]
    assert [n["condition"] for n in answer["nodes"]] == ["unknown", "unknown"]
    assert [n["estimate_watts"] for n in answer["nodes"]] == [350, 350]  # node share alone
    assert answer["missing"][: len(PARTS)] == [
        f"{what}: never read from Prometheus" for what in PARTS.values()
    ]
    assert answer["missing"][len(PARTS) :] == [
        "GPU power limit unknown for nodes n1, n2, and for every node: estimated from the "
        "node share alone (too low; set fallback_gpu_watts in the facility file)",
        "GPU count unknown for nodes n1, n2: estimated with the whole node share",
    ]  # and no "membership unknown" note: the membership part's own sentence says it


def test_a_part_never_read_says_why(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/r1"]}, read_at={"gpus": None}, errors={"gpus": "HTTP 500"}),
    )
    assert site.view().missing == (
        "each node's GPU count (llmgw:node_gpus:count): never read from Prometheus: HTTP 500",
    )


# --- capacity.fits ----------------------------------------------------------------------------

CAPACITY_FACILITY = {
    "domains": {"rack/r1": {"cap_watts": 10_000}, "row/1": {"cap_watts": 100_000}},
    "profiles": {
        "tp4": {"gpus": 4, "power_watts": 2_000},
        "one": {"gpus": 1, "power_watts": 3_000},
        "derived": {"gpus": 1},
    },
}


def capacity_site(make_site: Any, **more: Any) -> Site:
    """rack/r1 (cap 10 000, limit 9 000): n1, n2 with 8 GPUs each, in row/1 (limit 90 000);
    rack/r2 and row/2 (no budget): n3, its GPU count unknown."""
    snapshot = more.pop("snapshot", None) or make_snapshot(
        {"n1": ["rack/r1", "row/1"], "n2": ["rack/r1", "row/1"], "n3": ["rack/r2", "row/2"]},
        gpus={"n1": 8, "n2": 8},
        limits={"n1": 700, "n2": 700, "n3": 700},
    )
    return make_site(make_facility(**CAPACITY_FACILITY), snapshot, **more)


def fit_of(site: Site, profile: str) -> dict[str, Fit]:
    view = site.view()
    return {str(f.domain): f for f in fits(view, profile, view.facility.profiles[profile])}


def test_fits_counts_until_gpus_bind(make_site: Any) -> None:
    # tp4, 2 000 W: n1 takes 2 (9 000 → 5 000, GPUs 8 → 0), n2 takes 2 (5 000 → 1 000).
    site = capacity_site(make_site)
    rack = fit_of(site, "tp4")["rack/r1"]
    assert rack == Fit(ref("rack/r1"), 4, [("GPUs: n1 has 0 free", 1), ("GPUs: n2 has 0 free", 1)])
    # rack/r2 has no budget and n3 no GPU count: nothing limits it.
    assert fit_of(site, "tp4")["rack/r2"] == Fit(ref("rack/r2"), None, [])
    # row/1 holds n1 and n2 alone: 4 again. row/2 holds n3: unbounded.
    assert fit_of(site, "tp4")["row/1"].replicas == 4
    assert fit_of(site, "tp4")["row/2"].replicas is None


def test_fits_counts_until_power_binds(make_site: Any) -> None:
    # one, 3 000 W, 1 GPU: n1 takes 3 (9 000 → 0), then 0 < 3 000; n2 none.
    site = capacity_site(make_site)
    assert fit_of(site, "one")["rack/r1"] == Fit(
        ref("rack/r1"), 3, [("power: rack r1 has 0.0 kW left, a replica needs ~3.0", 2)]
    )


def test_fits_counts_reserved_power_and_gpus(make_site: Any) -> None:
    # 5 000 W and 7 GPUs reserved on n1: room 4 000; n1 has 1 GPU free.
    # one (1 GPU, 3 000 W): n1 takes 1 (room 1 000, GPUs 0), n2 takes none (1 000 < 3 000).
    site = capacity_site(
        make_site, reservations=[stored("1", "n1", 5_000, ["rack/r1", "row/1"], gpus=7)]
    )
    assert fit_of(site, "one")["rack/r1"] == Fit(
        ref("rack/r1"),
        1,
        [
            ("GPUs: n1 has 0 free", 1),
            ("power: rack r1 has 1.0 kW left, a replica needs ~3.0", 1),
        ],
    )
    # tp4 needs 4 GPUs: n1 has 1 free, n2 takes 2 (4 000 → 0).
    assert fit_of(site, "tp4")["rack/r1"] == Fit(
        ref("rack/r1"), 2, [("GPUs: n1 has 1 free", 1), ("GPUs: n2 has 0 free", 1)]
    )


def test_fits_reports_overbooked_gpus_as_none_free(make_site: Any) -> None:
    site = capacity_site(
        make_site, reservations=[stored("1", "n1", 100, ["rack/r1", "row/1"], gpus=9)]
    )
    assert ("GPUs: n1 has 0 free", 1) in fit_of(site, "tp4")["rack/r1"].binds


def test_fits_binds_refused_nodes_on_their_first_reason(make_site: Any) -> None:
    site = capacity_site(make_site, holds={"rack/r1": "maintenance"})
    assert fit_of(site, "tp4")["rack/r1"] == Fit(
        ref("rack/r1"), 0, [("rack r1 held: maintenance", 2)]
    )


def test_fits_derived_estimate_and_the_tightest_domain(make_site: Any) -> None:
    # derived: 1 × 700 + 350 × 1/8 = 743.75 W. rack/r1 binds first (9 000 / 743.75 = 12.1):
    # n1 takes 8 (GPUs), 9 000 − 5 950 = 3 050 left; n2 takes 4 (3 050 → 75), then power.
    site = capacity_site(make_site)
    assert fit_of(site, "derived")["rack/r1"] == Fit(
        ref("rack/r1"),
        12,
        [
            ("GPUs: n1 has 0 free", 1),
            ("power: rack r1 has 0.0 kW left, a replica needs ~0.8", 1),  # 75 W down, 743.75 up
        ],
    )


def test_fits_without_membership(make_site: Any) -> None:
    snapshot = make_snapshot(read_at={"membership": None})
    site = make_site(make_facility(**CAPACITY_FACILITY), snapshot)
    result = fit_of(site, "tp4")
    assert sorted(result) == ["rack/r1", "row/1"]  # the declared domains
    assert result["rack/r1"] == Fit(ref("rack/r1"), 0, [("no member nodes known", 0)])


def test_fits_stops_counting_at_unbounded(make_site: Any) -> None:
    # A replica of no draw on a budgeted rack and no GPU count: it never binds; counted as
    # unbounded once past UNBOUNDED replicas.
    assert UNBOUNDED == 10_000
    site = make_site(
        make_facility(
            {"rack/r1": {"cap_watts": 1_000}},
            profiles={"free": {"gpus": 1}},
            node_share_watts=0,
        ),
        make_snapshot({"n1": ["rack/r1"]}, read_at={"limits": None}),
    )
    assert fit_of(site, "free")["rack/r1"] == Fit(ref("rack/r1"), None, [])


def test_fits_with_a_cpu_profile_and_no_gpus(make_site: Any) -> None:
    # gpus 0: free GPUs never bind. 16 cores × 6 = 96 W per replica; limit 900: 9 fit.
    site = make_site(
        make_facility(
            {"rack/r1": {"cap_watts": 1_000}}, profiles={"cpu": {"gpus": 0, "cpu_cores": 16}}
        ),
        make_snapshot({"n1": ["rack/r1"]}, gpus={"n1": 0}),
    )
    assert fit_of(site, "cpu")["rack/r1"] == Fit(
        ref("rack/r1"), 9, [("power: rack r1 has 0.0 kW left, a replica needs ~0.1", 1)]
    )
    # Without a budget, a CPU replica is unbounded even where the GPU count is known.
    site2 = make_site(
        make_facility(profiles={"cpu": {"gpus": 0, "cpu_cores": 16}}),
        make_snapshot({"n1": ["rack/r1"]}, gpus={"n1": 0}),
    )
    assert fit_of(site2, "cpu")["rack/r1"] == Fit(ref("rack/r1"), None, [])


def test_replica_of_a_profile() -> None:
    facility = make_facility(profiles={"p": {"gpus": 2, "power_watts": 900, "cpu_cores": 3}})
    assert replica_of("p", facility.profiles["p"]) == Replica(
        model="p", profile="p", gpus=2, cpu_cores=3, power_watts=900
    )


def test_fits_does_not_reserve(make_site: Any) -> None:
    site = capacity_site(make_site)
    before = site.view()
    fit_of(site, "one")
    assert site.view() is before
    assert site.view().domain(ref("rack/r1")).reserved == 0


def test_fits_uses_the_site_limit_for_a_node_without_one(make_site: Any) -> None:
    # n1's limit is unknown, n2's is 4 000 W, the site's largest; 2 GPUs each. derived:
    # 4 000 + 350 × 1/2 = 4 175 W on either node. rack/r1 (limit 9 000): n1 takes 2 (GPUs;
    # 650 W left, shown rounded down: 0.6), n2 none. (Estimated at 0 W per GPU, n1 would
    # take 2 at 175 W and n2 2 more.)
    site = capacity_site(
        make_site,
        snapshot=make_snapshot(
            {"n1": ["rack/r1"], "n2": ["rack/r1"]}, gpus={"n1": 2, "n2": 2}, limits={"n2": 4_000}
        ),
    )
    assert fit_of(site, "derived")["rack/r1"] == Fit(
        ref("rack/r1"),
        2,
        [
            ("GPUs: n1 has 0 free", 1),
            ("power: rack r1 has 0.6 kW left, a replica needs ~4.2", 1),
        ],
    )


def test_fits_without_a_budget_counts_free_gpus(make_site: Any) -> None:
    # rack/r9 has no budget; n9 has 8 GPUs, 3 reserved: tp4 fits once, one replica.
    site = make_site(
        make_facility(**CAPACITY_FACILITY),
        make_snapshot({"n9": ["rack/r9"]}, gpus={"n9": 8}),
        reservations=[stored("1", "n9", 100, ["rack/r9"], gpus=3)],
    )
    assert fit_of(site, "tp4")["rack/r9"] == Fit(ref("rack/r9"), 1, [("GPUs: n9 has 1 free", 1)])


# --- the view ---------------------------------------------------------------------------------


def test_view_keeps_the_figures_it_was_built_from(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000, "other_watts": 900}}),
        make_snapshot(
            {"n1": ["rack/r1", "pdu/p1"]},
            measured={"rack/r1": 3_000.5},
            conditions={"rack/r1": "warm"},
            ages={"rack/r1": 12.5},
        ),
        holds={"pdu/p1": "fuse"},
    )
    view = site.view()
    rack = view.domain(ref("rack/r1"))
    assert (rack.cap, rack.limit, rack.other_watts) == (10_000, 9_000, 900)
    assert (rack.measured, rack.condition, rack.reading_age, rack.held) == (
        3_000.5,
        "warm",
        12.5,
        None,
    )
    pdu = view.domain(ref("pdu/p1"))
    assert pdu.held is not None and pdu.held.reason == "fuse"
    assert (pdu.cap, pdu.other_watts, pdu.condition) == (None, 0.0, "unknown")
    # A domain nothing names: no budget, nothing reserved, nothing read.
    nowhere = view.domain(ref("rack/nowhere"))
    assert nowhere == DomainState.build(
        ref("rack/nowhere"), None, 0.1, 0.0, 0.0, None, "unknown", None, None
    )
    assert ref("rack/nowhere") not in view.domain_refs
    # Worked out once per view: the same objects every time.
    assert view.node("n1") is view.node("n1")
    assert view.domain(ref("rack/r1")) is view.domains[ref("rack/r1")]


def test_a_node_without_a_rack_has_no_rack_room(make_site: Any) -> None:
    site = make_site(
        make_facility({"pdu/p1": {"cap_watts": 10_000}, "rack/r2": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["pdu/p1", "row/1"], "n2": ["pdu/p2", "rack/r2"]}),
    )
    view = site.view()
    assert view.node("n1").rack is None
    assert view.node("n1").room == 9_000  # the pdu still limits it
    rack = view.node("n2").rack
    assert rack is not None and rack.ref == ref("rack/r2")
    assert site.answer(replica(1, 1_000), ["n1", "n2"])["order"] == ["n2", "n1"]


def test_a_reservation_counts_where_its_node_is_now(make_site: Any) -> None:
    # Made in rack/old; the node is now in rack/new: it counts there, and not in rack/old.
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/new"]}),
        reservations=[stored("1", "n1", 700, ["rack/old"])],
    )
    view = site.view()
    assert view.reserved_watts == {ref("rack/new"): 700}
    assert view.replicas_by_model == {("llama", ref("rack/new")): 1}
    # With the membership stale, where it was made.
    stale = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/new"]}, read_at={"membership": NOW - 4_000}),
        reservations=[stored("1", "n1", 700, ["rack/old"])],
    )
    assert stale.view().reserved_watts == {ref("rack/old"): 700}


def test_stale_gpu_counts_and_limits_are_not_used(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot(
            {"n1": ["rack/r1"]},
            gpus={"n1": 8},
            limits={"n1": 700},
            read_at={"gpus": NOW - 4_000, "limits": NOW - 4_000},
        ),
    )
    node = site.view().node("n1")
    assert (node.gpus, node.gpu_limit_watts) == (None, None)
    fresh = make_site(
        make_facility(), make_snapshot({"n1": ["rack/r1"]}, gpus={"n1": 8}, limits={"n1": 700})
    )
    node = fresh.view().node("n1")
    assert (node.gpus, node.gpu_limit_watts) == (8, 700)


def test_rack_room_counts_replicas_of_less_than_a_watt() -> None:
    # room 9 000 (limit, nothing reserved), 0.5 W each: (9 000 − 0.5) / 0.5 = 17 999.
    assert rack_room.replicas_left(node_state(domain_state()), 0.5) == 17_999


def test_gaps_name_the_domains_without_fresh_readings(make_site: Any) -> None:
    # rack/r1 and rack/r2 have budgets, row/1 none; only rack/r1 is measured (row/1 has no
    # budget, so its missing measurement changes nothing), only rack/r1 has a condition.
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}, "rack/r2": {"cap_watts": 10_000}}),
        make_snapshot(
            {"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]},
            measured={"rack/r1": 100},
            conditions={"rack/r1": "ok"},
        ),
    )
    gaps = (
        "no fresh measured power for rack/r2: load counts what is reserved",
        "no fresh condition for 2 domains (rack/r2, row/1): unknown, placed as ok",
    )
    assert site.view().gaps == gaps
    assert site.answer(replica(1, 10), ["n1"])["missing"] == list(gaps)
    # More than five: counted, five named.
    many = make_site(make_facility(), make_snapshot({f"n{i}": [f"rack/r{i}"] for i in range(7)}))
    assert many.view().gaps == (
        "no fresh condition for 7 domains (rack/r0, rack/r1, rack/r2, rack/r3, rack/r4, …): "
        "unknown, placed as ok",
    )
    # Parts missing whole are said once, by their own sentence, not per domain.
    stale = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1"]}, read_at=STALE_READINGS),
    )
    assert stale.view().gaps == ()
    assert stale.view().all_missing() == list(stale.view().missing)


def test_fits_shows_the_figures_in_kilowatts(make_site: Any) -> None:
    # 1 002.5 W, 1 GPU: n1 takes 8 (GPUs), 8 020 W; n2 none: 980 W left, shown rounded down
    # (0.9, never more room than there is), the need rounded up (1.1, never less).
    facility = make_facility(
        {"rack/r1": {"cap_watts": 10_000}}, profiles={"odd": {"gpus": 1, "power_watts": 1_002.5}}
    )
    site = make_site(
        facility, make_snapshot({"n1": ["rack/r1"], "n2": ["rack/r1"]}, gpus={"n1": 8, "n2": 8})
    )
    assert fit_of(site, "odd")["rack/r1"] == Fit(
        ref("rack/r1"),
        8,
        [
            ("GPUs: n1 has 0 free", 1),
            ("power: rack r1 has 0.9 kW left, a replica needs ~1.1", 1),
        ],
    )


def test_fits_nothing_in_a_rack_with_no_room_left(make_site: Any) -> None:
    # Reserved 9 000 of a 9 000 W limit: room exactly 0; not even a 0.5 W replica fits.
    facility = make_facility(
        {"rack/r1": {"cap_watts": 10_000}}, profiles={"tiny": {"gpus": 0, "power_watts": 0.5}}
    )
    site = make_site(
        facility,
        make_snapshot({"n1": ["rack/r1"]}),
        reservations=[stored("1", "n1", 9_000, ["rack/r1"])],
    )
    assert site.view().domain(ref("rack/r1")).room == 0
    assert fit_of(site, "tiny")["rack/r1"] == Fit(
        ref("rack/r1"), 0, [("power: rack r1 has 0.0 kW left, a replica needs ~0.1", 1)]
    )


def test_gaps_name_up_to_five_domains(make_site: Any) -> None:
    site = make_site(make_facility(), make_snapshot({f"n{i}": [f"rack/r{i}"] for i in range(5)}))
    assert site.view().gaps == (
        "no fresh condition for 5 domains (rack/r0, rack/r1, rack/r2, rack/r3, rack/r4): "
        "unknown, placed as ok",
    )


def test_the_domains_a_view_knows(make_site: Any) -> None:
    # Prometheus' inventory (while fresh), the facility file, the members, holds and
    # reservations: each may name a domain the others do not.
    def known(**snapshot: Any) -> frozenset[DomainRef]:
        site = make_site(
            make_facility({"row/declared": {"cap_watts": 1_000}}),
            make_snapshot({"n1": ["rack/member"]}, inventory=["pdu/inventoried"], **snapshot),
            reservations=[stored("1", "n9", 10, ["rack/reserved"])],
            holds={"site/held": "contract"},
        )
        return site.view().domain_refs

    everything = {"row/declared", "rack/member", "pdu/inventoried", "rack/reserved", "site/held"}
    assert known() == {ref(key) for key in everything}
    stale = known(read_at={"inventory": NOW - 4_000, "membership": NOW - 4_000})
    assert stale == {ref(key) for key in ("row/declared", "rack/reserved", "site/held")}


def test_fits_past_unbounded_replicas_on_a_node_is_unbounded(make_site: Any) -> None:
    # Room 9 000 W, 0.8999 W each: 10 001 would fit (8 999.9 W), one more than UNBOUNDED, so
    # the count stops at UNBOUNDED and says unbounded rather than 10 001.
    facility = make_facility(
        {"rack/r1": {"cap_watts": 10_000}}, profiles={"speck": {"gpus": 0, "power_watts": 0.8999}}
    )
    site = make_site(facility, make_snapshot({"n1": ["rack/r1"]}))
    assert fit_of(site, "speck")["rack/r1"] == Fit(ref("rack/r1"), None, [])


def test_a_node_gathers_the_refusals_of_all_its_racks_and_pdus(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/r1", "pdu/p1", "pdu/p2"]}, conditions={"pdu/p2": "hot"}),
        holds={"rack/r1": "move", "pdu/p1": "fuse"},
    )
    assert site.decide(replica(), ["n1"]).verdicts[0].refusals == [
        ("held", "pdu p1 held: fuse"),
        ("hot", "pdu p2 hot"),
        ("held", "rack r1 held: move"),
    ]


# --- a view after a write: View.settle --------------------------------------------------------


def test_a_view_settles_only_on_the_same_basis(make_site: Any) -> None:
    facility = make_facility({"rack/r1": {"cap_watts": 10_000}})
    snapshot = make_snapshot({"n1": ["rack/r1"]}, measured={"rack/r1": 9_500})
    other = make_snapshot({"n1": ["rack/r1"]}, measured={"rack/r1": 100})

    def view(snap: Snapshot = snapshot, fac: Facility = facility, now: float = NOW) -> View:
        usable, gone = snap.fresh_parts(now, STALENESS.readings, STALENESS.inventory)
        return View(fac, snap, now, usable, gone, {}, {})

    before = view()
    assert before.node("n1").room == -500  # 9 000 − 9 500, worked out
    assert view().same_basis(before)
    for changed in (view(snap=other), view(fac=make_facility()), view(now=NOW + 121)):
        assert not changed.same_basis(before)
        changed.settle(before)
        # Nothing carried over: its own figures.
        assert changed.node("n1").room != -500
    same = view()
    same.settle(before)
    assert same.node("n1") is before.node("n1")  # carried over: nothing changed


def test_a_write_after_the_readings_went_stale_uses_fresh_figures(make_site: Any) -> None:
    # The view was worked out at NOW with rack/r1 measured past its limit; the readings go
    # stale, and a write comes in before anything reads the view again.
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1"], "n2": ["rack/r1"]}, measured={"rack/r1": 9_500}),
    )
    assert site.decide(replica(1, 100), ["n1"]).verdicts[0].refusals  # 9 500 > 9 000
    site.now = NOW + 121
    assert site.reserve("n2", replica(1, 100)).created  # measured stale: 100 reserved
    answer = site.answer(replica(1, 100), ["n1"])
    assert answer["nodes"][0]["allowed"] is True
    assert answer["nodes"][0]["headroom_watts"] == 8_800  # 9 000 − 100 − 100


def test_a_write_after_only_the_domains_were_read(make_site: Any) -> None:
    # No node worked out yet, only the domains (as GET /v1/domains does): a hold settles.
    site = make_site(make_facility({"rack/r1": {"cap_watts": 10_000}}))
    assert site.view().domain(ref("rack/r1")).held is None
    site.state.hold(ref("rack/r1"), "x")
    assert site.view().domain(ref("rack/r1")).held is not None
    assert site.reserve("n1", replica(1, 100)).created  # n1's membership is unknown
    assert site.view().domain(ref("rack/r1")).reserved == 0


#: What a view works out once and a view after a write carries over (View.settle): the
#: write path of the 10,000-node benchmark depends on it (docs/benchmarks.md).
CARRIED = (
    "reserved_watts",
    "reserved_gpus",
    "replicas_by_model",
    "members",
    "gaps",
    "site_gpu_limit_watts",
    "domain_refs",
    "domains",
    "coarse_refs",  # follows domains: carried even where the View before never read it
    "domain_refusals",
    "_nodes",
)


def test_a_view_after_a_write_carries_the_figures_over(make_site: Any) -> None:
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]}),
        reservations=[stored("1", "n1", 100, ["rack/r1", "row/1"])],
    )
    before = site.view()
    site.decide(replica(1, 10), ["n1", "n2"])
    before.members  # noqa: B018 - worked out as capacity.fits and the benchmark do
    before.gaps  # noqa: B018
    assert set(CARRIED) - {"coarse_refs"} <= set(vars(before))
    assert site.reserve("n2", replica(1, 100)).created
    after = site.view()
    assert after is not before
    assert set(CARRIED) <= set(vars(after))  # carried, not yet read
    # n2's rack was touched: n2 is worked out again; n1's rack was not: n1 is carried.
    assert "n2" not in after._nodes
    assert after._nodes["n1"] is before._nodes["n1"]
    assert after.domain(ref("rack/r2")).reserved == 100
    assert after.domain(ref("row/1")).reserved == 200


def test_spread_counts_are_worked_out_once_per_model(make_site: Any) -> None:
    site = make_site(
        make_facility(),
        make_snapshot({"n1": ["rack/r1"]}),
        reservations=[stored("1", "n1", 100, ["rack/r1"], model="b")],
    )
    view = site.view()
    assert view.spread_counts("b") == {ref("rack/r1"): 1}
    assert view.spread_counts("b") is view.spread_counts("b")
    assert view.spread_counts("a") == {}


# --- a new rule: one module and one registry line -----------------------------------------------


def maintenance_window(racks: set[str]) -> ModuleType:
    """A rule as a module of its own would be: a maintenance window refuses its racks."""
    rule = ModuleType("maintenance")
    rule.name = "maintenance"  # type: ignore[attr-defined]
    rule.concern = "always"  # type: ignore[attr-defined]
    rule.reads = frozenset({"ref"})  # type: ignore[attr-defined]

    def refuse(domain: Any) -> str | None:
        if domain.ref.kind != "rack" or domain.ref.name not in racks:
            return None
        return f"{domain.label} in its maintenance window"

    rule.refuse = refuse  # type: ignore[attr-defined]
    return rule


@pytest.fixture
def registered() -> Iterator[Callable[[ModuleType], None]]:
    names: list[str] = []

    def register(rule: ModuleType) -> None:
        rules.register(rule)  # type: ignore[arg-type]
        names.append(rule.name)

    yield register
    for name in names:
        rules.unregister(name)


def test_a_new_rule_is_seen_by_decide_the_cached_answers_and_the_reasons(
    make_site: Any, registered: Callable[[ModuleType], None]
) -> None:
    registered(maintenance_window({"r2"}))
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]}),
    )
    reason = "rack r2 in its maintenance window"
    decision = site.decide(replica(1, 100), ["n2", "n1"])
    assert decision.order == ["n1"]
    assert decision.verdicts[0].refusals == [("maintenance", reason)]
    assert decision.summary() == "1/2 nodes allowed (1 maintenance)"
    # The answer cache serves it, on the first request and after a change (a reservation
    # settles a new View: entries carried over), without knowing of the rule.
    for _ in range(2):
        view = site.view()
        cached = answers.place(view, replica(1, 100), ["n2", "n1"])
        assert cached.body == to_json(decide(view, replica(1, 100), ["n2", "n1"]).as_json())
        assert cached.refusals_by_rule == {"maintenance": 1}
        assert list(cached.refusals) == [("n2", reason)]
        assert site.reserve("n1", replica(1, 100)).created
    refused = site.reserve("n2", replica(1, 100))
    assert refused.verdict is not None and refused.verdict.refusals == [("maintenance", reason)]


def test_judge_runs_the_domain_filters_once_per_state_and_view_and_at_each_call_unremembered(
    make_site: Any, registered: Callable[[ModuleType], None]
) -> None:
    # judge runs every registered filter on each domain of the node it judges; the View's
    # memo (View.domain_refusals) runs it once per domain state, and the answer is the same.
    seen: list[str] = []
    rule = maintenance_window({"r2"})
    window = rule.refuse  # type: ignore[attr-defined]

    def counted(domain: Any) -> str | None:
        seen.append(domain.label)
        return window(domain)

    rule.refuse = counted  # type: ignore[attr-defined]
    registered(rule)
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]}),
    )
    view = site.view()
    remembered = [site.decide(replica(gpus), ["n1", "n2"]).as_json() for gpus in (1, 2)]
    assert sorted(seen) == ["rack r1", "rack r2", "row 1"]
    seen.clear()
    plain = dataclasses.replace(view, memo_refusals=False)
    assert [decide(plain, replica(gpus), ["n1", "n2"]).as_json() for gpus in (1, 2)] == remembered
    assert sorted(seen) == sorted(["rack r1", "rack r2", "row 1", "row 1"] * 2)


def test_a_view_after_a_write_runs_a_rule_registered_since(
    make_site: Any, registered: Callable[[ModuleType], None]
) -> None:
    # The refusal memo is carried from View to View of one basis (View.settle), but not
    # past a change of the registry: decide on the next View runs the new rule.
    site = make_site(
        make_facility({"rack/r1": {"cap_watts": 10_000}}),
        make_snapshot({"n1": ["rack/r1", "row/1"], "n2": ["rack/r2", "row/1"]}),
    )
    before = site.view()
    assert site.decide(replica(1, 100), ["n2", "n1"]).order == ["n1", "n2"]  # both allowed
    assert site.reserve("n1", replica(1, 100)).created
    assert site.view().domain_refusals is before.domain_refusals  # carried over
    registered(maintenance_window({"r2"}))
    assert site.reserve("n1", replica(1, 100)).created
    after = site.view()
    assert after.domain_refusals is not before.domain_refusals
    assert decide(after, replica(1, 100), ["n2", "n1"]).verdicts[0].refusals == [
        ("maintenance", "rack r2 in its maintenance window")
    ]


def test_a_rule_that_reads_what_the_states_do_not_hold_is_refused_at_registration() -> None:
    rule = maintenance_window({"r1"})
    rule.reads = frozenset({"ref", "calendar"})  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"rule maintenance reads \['calendar'\]"):
        rules.register(rule)  # type: ignore[arg-type]
    rule.reads = frozenset({"ref"})  # type: ignore[attr-defined]
    rule.concern = "cooling"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="unknown concern 'cooling'"):
        rules.register(rule)  # type: ignore[arg-type]
    assert "maintenance" not in [each.name for each in rules.DOMAIN_FILTERS]


# --- mode per concern (issue 17 part 4) ---------------------------------------------------------

STAGED = {"power": "enforce", "thermal": "observe"}


def test_power_enforced_while_thermal_is_observed(make_site: Any) -> None:
    # n1 hot, n2 full (rack r2 cap 1 000: limit 900), n3 warm, n4 ok, n5 held.
    site = make_site(
        make_facility({"rack/r2": {"cap_watts": 1_000}}, mode=STAGED),  # type: ignore[arg-type]
        make_snapshot(
            {n: [f"rack/r{n[1]}"] for n in ("n1", "n2", "n3", "n4", "n5")},
            conditions={"rack/r1": "hot", "rack/r3": "warm"},
        ),
        holds={"rack/r5": "PDU swap"},
    )
    answer = site.answer(replica(1, 950), ["n3", "n1", "n2", "n4", "n5"])
    assert answer["mode"] == "enforce"
    # Thermal observed: the hot node allowed, the warm one not put last; power and the hold
    # refuse.
    assert answer["order"] == ["n3", "n1", "n4"]
    by_node = {n["node"]: n for n in answer["nodes"]}
    assert by_node["n1"]["allowed"] and by_node["n1"]["reasons"] == []
    assert by_node["n1"]["would_refuse"] == ["rack r1 hot"]
    assert by_node["n2"]["reasons"] == [
        "rack r2: 0.0 of 1.0 kW reserved, replica needs ~0.9, margin 10%"
    ]
    assert by_node["n5"]["reasons"] == ["rack r5 held: PDU swap"]
    assert by_node["n3"]["scores"]["condition"] == 1  # shown, not ordering
    assert answer["summary"] == (
        "3/5 nodes allowed, 1 would be refused (thermal observed) (1 hot, 1 power_cap, 1 held)"
    )
    # Reserving follows the same split.
    assert site.reserve("n1", replica(1, 950)).created
    assert not site.reserve("n2", replica(1, 950)).created


def test_thermal_enforced_while_power_is_observed(make_site: Any) -> None:
    mode = {"power": "observe", "thermal": "enforce"}
    site = make_site(
        make_facility({"rack/r2": {"cap_watts": 1_000}}, mode=mode),  # type: ignore[arg-type]
        make_snapshot(
            {"n1": ["rack/r1"], "n2": ["rack/r2"], "n3": ["rack/r3"]},
            conditions={"rack/r1": "hot", "rack/r3": "warm"},
        ),
    )
    answer = site.answer(replica(1, 950), ["n3", "n2", "n1"])
    assert answer["order"] == ["n2", "n3"]  # the warm node after, the full one allowed
    assert answer["nodes"][1]["would_refuse"] == [
        "rack r2: 0.0 of 1.0 kW reserved, replica needs ~0.9, margin 10%"
    ]
    assert answer["nodes"][2]["reasons"] == ["rack r1 hot"]


def test_one_mode_for_both_concerns_or_one_each(make_site: Any) -> None:
    assert make_facility(mode="enforce").enforced() == {"always", "power", "thermal"}
    assert make_facility(mode="observe").enforced() == set()  # nothing refused, a hold neither
    assert make_facility(mode=STAGED).enforced() == {"always", "power"}  # type: ignore[arg-type]
    assert str(make_facility(mode=STAGED).mode) == "power enforce, thermal observe"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thermal"):
        make_facility(mode={"power": "enforce"})  # type: ignore[arg-type]


# --- margin and derating per domain (issue 17 part 6) -------------------------------------------


def test_a_domains_own_margin_sets_its_limit_and_its_reason(make_site: Any) -> None:
    # rack r1: cap 10 000, its own margin 25%: limit 7 500; rack r2: the site's 10%: 9 000.
    site = make_site(
        make_facility(
            {"rack/r1": {"cap_watts": 10_000, "margin": 0.25}, "rack/r2": {"cap_watts": 10_000}}
        ),
        make_snapshot({"n1": ["rack/r1"], "n2": ["rack/r2"]}),
    )
    view = site.view()
    assert view.domain(ref("rack/r1")).limit == 7_500
    assert view.domain(ref("rack/r2")).limit == 9_000
    assert site.node_json(replica(1, 7_500), "n1")["allowed"] is True
    assert site.node_json(replica(1, 7_501), "n1")["reasons"] == [
        "rack r1: 0.0 of 10.0 kW reserved, replica needs ~7.5, margin 25%"
    ]
    assert site.node_json(replica(1, 9_000), "n2")["allowed"] is True
    # The headroom dry run reads the same limit.
    profile = Profile(gpus=0, power_watts=2_500)
    counts = {fit.domain: fit.replicas for fit in fits(view, "p", profile)}
    assert counts[ref("rack/r1")] == 3  # 7 500 / 2 500
    assert counts[ref("rack/r2")] == 3  # 9 000 / 2 500: 3.6, three whole replicas


def test_a_domains_own_derating_sets_its_feeds_and_phases_caps(make_site: Any) -> None:
    # Feeds of 20 000: the site's 0.8 gives 16 000; rack r1's own 0.5 gives 10 000. Its pdu's
    # own derating 0.6 makes each phase of 10 000 a cap of 6 000.
    facility = make_facility(
        {
            "rack/r1": {"feeds": [{"pdu": "a", "rating_watts": 20_000}], "derating": 0.5},
            "rack/r2": {"feeds": [{"pdu": "b", "rating_watts": 20_000}]},
            "pdu/a": {
                "derating": 0.6,
                "phases": {p: {"rating_watts": 10_000} for p in ("L1", "L2", "L3")},
            },
        }
    )
    assert facility.cap_watts("rack", "r1") == 10_000
    assert facility.cap_watts("rack", "r2") == 16_000
    site = make_site(facility, make_snapshot({"n1": ["rack/r1", "pdu/a"]}))
    assert [phase.cap for phase in site.view().node("n1").phases] == [6_000.0] * 3


def test_a_domains_margin_and_derating_are_checked_as_the_sites() -> None:
    with pytest.raises(ValueError, match="margin"):
        make_facility({"rack/r1": {"cap_watts": 1_000, "margin": 1.0}})
    with pytest.raises(ValueError, match="derating"):
        make_facility({"rack/r1": {"cap_watts": 1_000, "derating": 0}})
    # other_watts against the cap its own derating gives: 20 000 × 0.5 = 10 000.
    with pytest.raises(ValueError, match="leaves no room under the cap of 10000 W"):
        make_facility(
            {
                "rack/r1": {
                    "feeds": [{"pdu": "a", "rating_watts": 20_000}],
                    "derating": 0.5,
                    "other_watts": 10_000,
                }
            }
        )


def test_observe_logs_one_line_per_decision_at_most_one_per_interval(
    make_site: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [0.0]
    monkeypatch.setattr(observed, "WOULD_REFUSE", observed.WouldRefuseLog(10.0, lambda: now[0]))
    site = observe_site(make_site, STAGED)
    caplog.set_level("INFO", logger=observed.__name__)
    view = site.view()
    for _ in range(3):  # the first logged, two suppressed
        answers.place(view, replica(1, 950), ["n1", "n4"])
    now[0] = 10.0
    answers.uncached(view, replica(1, 950), ["n3", "n1"])
    answers.place(view, replica(1, 10), ["n4"])  # nothing would be refused: no line
    lines = [r.getMessage() for r in caplog.records if r.name == observed.__name__]
    assert [json.loads(line.removeprefix("would_refuse ")) for line in lines] == [
        {
            "call": "placement",
            "subject": "llama (unlisted, 1 GPUs)",
            "judged": 2,
            "would_refuse": 1,
            "rules": {"hot": 1},
            "reasons": ["rack r1 hot"],
            "suppressed": 0,
        },
        {
            "call": "placement",
            "subject": "llama (unlisted, 1 GPUs)",
            "judged": 2,
            "would_refuse": 1,
            "rules": {"hot": 1},
            "reasons": ["rack r1 hot"],
            "suppressed": 2,
        },
    ]
    # Power enforced: n3's power_cap is a reason, not a would_refuse, and no line says it.
    now[0] = 20.0
    answers.place(view, replica(1, 950), ["n3"])
    assert len([r for r in caplog.records if r.name == observed.__name__]) == 2
