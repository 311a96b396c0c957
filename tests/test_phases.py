"""Phases of three-phase PDUs (decider/placement/phases.py, docs/facility.md "Phases").

In-process over the helpers of tests/test_placement.py: refusals, headroom and the domain
figures per phase, worked out by hand; the facility file's phase keys refused with file and
line; a hypothesis property over generated phased sites; then one real `llmgw-decider`
(tests/decider_harness.py) for the API, /metrics and `llmgw-facility`'s tables.

The hand-worked site (PHASED), margin 10 %, derating 0.8, every node on rack r1 and pdu p1:

| phase | rating | cap   | limit | other_watts | nodes (file)          |
|-------|--------|-------|-------|-------------|-----------------------|
| L1    | 5 000  | 4 000 | 3 600 | 0           | n1, and n4 (no phase) |
| L2    | 5 750  | 4 600 | 4 140 | 0           | n2, n3, and n4        |
| L3    | 5 000  | 4 000 | 3 600 | 500         | n4                    |

pdu/p1: cap 16 000, limit 14 400. rack/r1: cap 30 000, limit 27 000. L3 sets its own
`other_watts`, so L1 and L2 count none (Domain.phase_other_watts).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

import decider.giving_way
import decider.state
from decider.config import Staleness
from decider.facility import PHASES, Domain, DomainRef, Facility
from decider.models import Replica, ReservationRequest
from decider.placement import decide, over_cap, power_cap
from decider.placement.capacity import fits, phase_fits
from decider.placement.states import PhaseState
from decider.placement.view import View
from decider.snapshot import PARTS, Part, Snapshot
from decider.state import State
from decider.store import Store
from llmgw_facility.cli import main
from tests.decider_harness import Decider, FakePrometheus, Readings, metric_value
from tests.facility_helpers import refusal
from tests.placement_helpers import (
    NO_GC,
    NOW,
    Site,
    make_facility,
    make_snapshot,
    ref,
    replica,
    stored,
)
from tests.placement_helpers import scratch as from_scratch

PHASED_DOMAINS: dict[str, Any] = {
    "rack/r1": {"cap_watts": 30_000},
    "pdu/p1": {
        "cap_watts": 16_000,
        "phases": {
            "L1": {"rating_watts": 5_000},
            "L2": {"rating_watts": 5_750},
            "L3": {"rating_watts": 5_000, "other_watts": 500},
        },
    },
}
PHASED_NODES: dict[str, Any] = {
    "n1": {"phases": {"p1": "L1"}},
    "n2": {"phases": {"p1": "L2"}},
    "n3": {"phases": {"p1": "L2"}},
}
MEMBERS = {node: ["rack/r1", "pdu/p1"] for node in ("n1", "n2", "n3", "n4")}
L2_FULL = "pdu p1 phase L2: 4.1 of 4.6 kW reserved, replica needs ~2.8, margin 10%"


def phased_site(make_site: Any, **more: Any) -> Site:
    facility = make_facility(
        PHASED_DOMAINS,
        defaults={"margin": 0.1, "derating": 0.8},
        nodes=PHASED_NODES,
        profiles={"tp1": {"gpus": 1, "power_watts": 1_500}},
    )
    gpus = dict.fromkeys(MEMBERS, 8)
    return make_site(facility, make_snapshot(MEMBERS, gpus=gpus), **more)


def phase_figures(view: View, pdu: str = "p1") -> dict[str, tuple[float, float, float]]:
    """(cap, reserved, room) per phase."""
    return {
        phase: (state.cap, state.reserved, state.room)
        for phase in PHASES
        if (state := view.phase(pdu, phase))
    }


# --- refusals ---------------------------------------------------------------------------------


def test_a_full_phase_refuses_with_its_figures_while_the_pdu_total_has_room(
    make_site: Any,
) -> None:
    site = phased_site(make_site)
    assert site.reserve("n2", replica(power_watts=2_000)).created
    assert site.reserve("n3", replica(power_watts=2_100)).created
    # L2: 2 000 + 2 100 = 4 100 reserved of a 4 140 limit: room 40. pdu p1: 4 100 of 14 400.
    view = site.view()
    assert phase_figures(view) == {
        "L1": (4_000, 0, 3_600),
        "L2": (4_600, 4_100, 40),
        "L3": (4_000, 0, 3_100),  # 3 600 − other 500
    }
    assert view.domain(ref("pdu/p1")).room == 10_300  # 14 400 − 4 100
    answer = site.answer(replica(power_watts=2_800), ["n1", "n2", "n3", "n4"])
    by_node = {entry["node"]: entry for entry in answer["nodes"]}
    assert by_node["n2"]["reasons"] == [L2_FULL]  # the phase alone: the total fits
    assert by_node["n3"]["reasons"] == [L2_FULL]
    assert by_node["n2"]["headroom_watts"] == -2_760  # 40 − 2 800
    # n4 has no phase in the file: it counts against every phase, L2 among them.
    assert by_node["n4"]["reasons"] == [L2_FULL]
    # n1 on L1: the least room of rack 22 900, pdu 10 300 and L1 3 600, less 2 800.
    assert by_node["n1"]["reasons"] == []
    assert by_node["n1"]["headroom_watts"] == 800
    assert answer["order"] == ["n1"]
    assert answer["summary"] == "1/4 nodes allowed (3 power_cap)"
    refused = site.reserve("n2", replica(power_watts=2_800))
    assert refused.reservation is None and refused.verdict is not None
    assert refused.verdict.refusals == [(power_cap.name, L2_FULL)]


def test_a_phase_refuses_past_its_limit_and_not_at_it(make_site: Any) -> None:
    site = phased_site(make_site)
    assert site.reserve("n2", replica(power_watts=4_100)).created  # L2 room 40
    assert site.node_json(replica(power_watts=40), "n2")["reasons"] == []
    assert site.node_json(replica(power_watts=41), "n2")["reasons"] == [
        "pdu p1 phase L2: 4.1 of 4.6 kW reserved, replica needs ~0.0, margin 10%"
    ]
    assert site.reserve("n2", replica(power_watts=40)).created
    assert site.view().phase("p1", "L2").room == 0


def test_a_phase_names_its_other_watts(make_site: Any) -> None:
    site = phased_site(make_site)
    # n4 on every phase: L3 has 3 100 of room (3 600 − other 500), the least of the three.
    assert site.node_json(replica(power_watts=3_200), "n4")["reasons"] == [
        "pdu p1 phase L3: 0.5 of 4.0 kW reserved (incl. 0.5 other), replica needs ~3.2, margin 10%"
    ]
    assert site.node_json(replica(power_watts=3_100), "n4")["reasons"] == []


def test_a_node_without_a_phase_counts_against_every_phase(make_site: Any) -> None:
    site = phased_site(make_site)
    assert site.reserve("n4", replica(power_watts=1_000)).created
    view = site.view()
    assert {phase: figures[1] for phase, figures in phase_figures(view).items()} == {
        "L1": 1_000,
        "L2": 1_000,
        "L3": 1_000,
    }
    assert view.domain(ref("pdu/p1")).reserved == 1_000  # the total counts it once
    assert [state.phase for state in view.node("n4").phases] == ["L1", "L2", "L3"]
    assert [state.phase for state in view.node("n1").phases] == ["L1"]
    answer = site.answer(replica(power_watts=1), ["n4"])
    assert (
        "no phase in the facility file for node n4 on p1: counted against every phase of "
        "the pdu" in answer["missing"]
    )


def test_a_phase_over_its_cap_refuses_any_replica_on_it(make_site: Any) -> None:
    # Reserved before the rating was lowered: L1 carries 5 000 of a 4 000 cap.
    site = phased_site(make_site, reservations=[stored("old", "n1", 5_000, MEMBERS["n1"])])
    answer = site.answer(replica(power_watts=1), ["n1", "n2", "n4"])
    by_node = {entry["node"]: entry for entry in answer["nodes"]}
    over = "pdu p1 phase L1: over its cap, 5.0 of 4.0 kW reserved"
    assert by_node["n1"]["reasons"] == [over]
    assert by_node["n4"]["reasons"] == [over]
    assert by_node["n2"]["reasons"] == []
    assert answer["summary"] == f"1/3 nodes allowed (2 {over_cap.name})"


def test_a_pdu_without_phases_has_none(make_site: Any) -> None:
    site = make_site(make_facility({"pdu/p1": {"cap_watts": 16_000}}), make_snapshot(MEMBERS))
    view = site.view()
    assert view.phased_pdus == {}
    assert view.node("n1").phases == ()
    assert view.phase_reserved == {}


def test_a_phase_given_on_a_pdu_the_node_is_not_on_is_said_unused(make_site: Any) -> None:
    facility = make_facility(PHASED_DOMAINS, nodes={"n9": {"phases": {"p1": "L3"}}})
    site = make_site(facility, make_snapshot({**MEMBERS, "n9": ["rack/r1"]}))
    missing = site.answer(replica(power_watts=1), ["n9"])["missing"]
    assert (
        "the facility file gives a phase to node n9 on p1, but the node is not among that "
        "pdu's members: unused"
    ) in missing
    assert site.view().node("n9").phases == ()


def test_released_and_settled_phase_figures_match_a_view_from_scratch(make_site: Any) -> None:
    site = phased_site(make_site)
    made = [site.reserve(node, replica(power_watts=900)) for node in ("n1", "n2", "n4", "n4")]
    assert all(outcome.created for outcome in made)
    site.view().node("n3")  # worked out now, so the release must redo it
    assert site.state.release(made[2].reservation.id)  # type: ignore[union-attr]
    settled = site.view()
    scratch = from_scratch(settled)
    for phase in PHASES:
        assert settled.phase("p1", phase) == scratch.phase("p1", phase)
    for node in MEMBERS:
        assert settled.node(node) == scratch.node(node)
    # L1: n1 900 + n4 900; L2: n2 900 + n4 900; L3: n4 900.
    assert {p: f[1] for p, f in phase_figures(settled).items()} == {
        "L1": 1_800,
        "L2": 1_800,
        "L3": 900,
    }


# --- measured phases (signals.phase_power_watts) ----------------------------------------------

PHASE_SIGNAL = {
    "phase_power_watts": {
        "query": "sum by (pdu, phase) (st4PhaseActivePower)",
        "domain_label": "pdu",
        "phase_label": "phase",
    }
}


def measured_site(
    make_site: Any,
    phase_watts: dict[tuple[str, str], float],
    *,
    domains: dict[str, Any] | None = None,
    signals: dict[str, Any] | None = None,
    read_at: dict[str, float | None] | None = None,
    reserved: dict[str, float] | None = None,
) -> Site:
    """PHASED, with the phase signal configured, `phase_watts` read for the phases and
    `reserved` watts reserved on nodes."""
    facility = make_facility(
        domains or PHASED_DOMAINS,
        defaults={"margin": 0.1, "derating": 0.8},
        nodes=PHASED_NODES,
        signals=PHASE_SIGNAL if signals is None else signals,
    )
    snapshot = dataclasses.replace(
        make_snapshot(MEMBERS, gpus=dict.fromkeys(MEMBERS, 8), read_at=read_at),
        phase_measured_watts=phase_watts,
    )
    reservations = [
        stored(f"r-{node}", node, watts, MEMBERS[node]) for node, watts in (reserved or {}).items()
    ]
    return make_site(facility, snapshot, reservations=reservations)


def test_a_measured_phase_loads_by_the_larger_of_reserved_and_measured(make_site: Any) -> None:
    # L1 measured 3 000 with 1 000 reserved; L2 measured 500 with 1 000 reserved (n2).
    site = measured_site(
        make_site,
        {("p1", "L1"): 3_000, ("p1", "L2"): 500, ("p1", "L3"): 200},
        reserved={"n1": 1_000, "n2": 1_000},
    )
    view = site.view()
    l1, l2, l3 = (view.phase("p1", phase) for phase in PHASES)
    assert (l1.reserved, l1.measured, l1.load, l1.load_basis) == (1_000, 3_000, 3_000, "measured")
    assert (l2.reserved, l2.measured, l2.load, l2.load_basis) == (1_000, 500, 1_000, "reserved")
    # L3: measured 200 against nothing reserved, plus its other_watts 500.
    assert (l3.load, l3.load_basis) == (700, "measured")
    assert l1.room == 600  # limit 3 600 − measured 3 000
    # 800 W fits L1 by its reservations (2 600 left) but not by what it draws (600 left).
    refused = "pdu p1 phase L1: 3.0 of 4.0 kW measured, replica needs ~0.8, margin 10%"
    assert site.node_json(replica(power_watts=800), "n1")["reasons"] == [refused]
    assert site.node_json(replica(power_watts=600), "n1")["reasons"] == []
    # The pdu's own total is its own reading (none here), its reservations otherwise.
    assert view.domain(ref("pdu/p1")).load_basis == "reserved"


def test_a_phase_measured_over_its_cap_refuses_any_replica(make_site: Any) -> None:
    site = measured_site(make_site, {("p1", "L1"): 4_200, ("p1", "L2"): 0, ("p1", "L3"): 0})
    over = "pdu p1 phase L1: over its cap, 4.2 of 4.0 kW measured"
    assert site.node_json(replica(power_watts=1), "n1")["reasons"] == [over]
    assert site.node_json(replica(power_watts=1), "n2")["reasons"] == []


def test_a_phase_without_a_fresh_reading_counts_its_reservations_and_says_so(
    make_site: Any,
) -> None:
    # L3 not read; then the whole measured part stale: reservations only, nothing refused
    # for the missing data, and `missing` names the phases.
    site = measured_site(make_site, {("p1", "L1"): 3_000, ("p1", "L2"): 100})
    view = site.view()
    assert view.phase("p1", "L3").measured is None
    assert view.phase("p1", "L3").load_basis == "reserved"
    missing = site.answer(replica(power_watts=1), ["n1"])["missing"]
    assert (
        "no fresh measured power for pdu phase p1 L3 (signals.phase_power_watts): their "
        "load counts what is reserved"
    ) in missing
    stale = measured_site(
        make_site,
        {("p1", "L1"): 3_000, ("p1", "L2"): 100, ("p1", "L3"): 0},
        read_at={"measured": NOW - 3_600},
    )
    assert [stale.view().phase("p1", phase).measured for phase in PHASES] == [None] * 3
    answer = stale.answer(replica(power_watts=800), ["n1"])
    assert answer["order"] == ["n1"]  # 800 fits L1's reservations: nothing refused for lack
    # The part itself is named stale, the phases' readings with it.
    assert any(
        line.startswith("domain measured power (llmgw_domain_measured_watts), and three-phase")
        and "older than its" in line
        for line in answer["missing"]
    ), answer["missing"]


def test_phase_readings_without_the_signal_are_still_used_and_none_missing_said(
    make_site: Any,
) -> None:
    # No signals.phase_power_watts in this file (the rules rendered from another): what
    # Prometheus has is used, and nothing is said missing for phases no signal measures.
    site = measured_site(make_site, {("p1", "L1"): 3_000}, signals={})
    assert site.view().phase("p1", "L1").load_basis == "measured"
    missing = site.answer(replica(power_watts=1), ["n1"])["missing"]
    assert not any("pdu phase" in line for line in missing)


def test_a_phase_meter_that_includes_other_watts_counts_them_once(make_site: Any) -> None:
    # L3 carries the switch (other_watts 500) and the PDU's meter reads it: 2 500 on the
    # meter is 2 000 of the nodes' and 500 of the switch's, a load of 2 500, not 3 000.
    domains = {
        **PHASED_DOMAINS,
        "pdu/p1": {**PHASED_DOMAINS["pdu/p1"], "measured_includes_other": True},
    }
    signals = {
        **PHASE_SIGNAL,
        "power_watts": {"query": "sum by (pdu) (st4InputCordActivePower)", "domain_label": "pdu"},
    }
    site = measured_site(
        make_site,
        {("p1", "L1"): 2_500, ("p1", "L3"): 2_500},
        domains=domains,
        signals=signals,
    )
    view = site.view()
    l1, l3 = view.phase("p1", "L1"), view.phase("p1", "L3")
    assert (l1.measured, l1.load) == (2_500, 2_500)  # L1 sets no other_watts: 0 there
    assert (l3.measured, l3.other_watts, l3.load) == (2_000, 500, 2_500)


def test_measured_phases_settle_like_a_view_from_scratch(make_site: Any) -> None:
    site = measured_site(make_site, {("p1", "L1"): 1_500, ("p1", "L2"): 2_000, ("p1", "L3"): 0})
    made = [site.reserve(node, replica(power_watts=900)) for node in ("n1", "n1", "n2", "n4")]
    assert all(outcome.created for outcome in made)
    assert site.state.release(made[0].reservation.id)  # type: ignore[union-attr]
    settled = site.view()
    scratch = from_scratch(settled)
    for phase in PHASES:
        assert settled.phase("p1", phase) == scratch.phase("p1", phase)
    # L1: n1 900 + n4 900 = 1 800 reserved over 1 500 measured; L2: 2 000 measured.
    assert [settled.phase("p1", p).load_basis for p in ("L1", "L2")] == ["reserved", "measured"]


# --- headroom ---------------------------------------------------------------------------------


def test_headroom_binds_on_a_phase(make_site: Any) -> None:
    site = phased_site(make_site)
    view = site.view()
    profile = view.facility.profiles["tp1"]
    by_domain = {fit.domain: fit for fit in fits(view, "tp1", profile)}
    # 1 500 W a replica. n1: L1 3 600 → 2 (600 left). n2: L2 4 140 → 2 (1 140 left).
    # n3: L2 1 140 → 0. n4: L1 600, L2 1 140, L3 3 100 → 0 on L1. 4 in all: 6 kW of the
    # pdu's 14.4, the phases bind first.
    l1 = "power: pdu p1 phase L1 has 0.6 kW left, a replica needs ~1.5"
    l2 = "power: pdu p1 phase L2 has 1.1 kW left, a replica needs ~1.5"
    pdu = by_domain[ref("pdu/p1")]
    assert (pdu.replicas, pdu.binds) == (4, [(l1, 2), (l2, 2)])
    assert by_domain[ref("rack/r1")].replicas == 4
    per_phase = {each.phase: each.fit for each in phase_fits(view, "tp1", profile)["p1"]}
    # L1: n1 and n4 (no phase, so in each phase's run): 2 + 0.
    assert (per_phase["L1"].replicas, per_phase["L1"].binds) == (2, [(l1, 2)])
    # L2: n2, n3 and n4: 2 + 0 + 0.
    assert (per_phase["L2"].replicas, per_phase["L2"].binds) == (2, [(l2, 3)])
    # L3: n4 alone: L3's 3 100 takes 2 (100 left), before L1 (600) or L2 (1 140) bind.
    assert (per_phase["L3"].replicas, per_phase["L3"].binds) == (
        2,
        [("power: pdu p1 phase L3 has 0.1 kW left, a replica needs ~1.5", 1)],
    )


def test_headroom_names_a_phase_over_its_cap(make_site: Any) -> None:
    site = phased_site(make_site, reservations=[stored("old", "n1", 5_000, MEMBERS["n1"])])
    view = site.view()
    per_phase = {
        each.phase: each.fit
        for each in phase_fits(view, "tp1", view.facility.profiles["tp1"])["p1"]
    }
    assert per_phase["L1"].binds == [("pdu p1 phase L1: over its cap, 5.0 of 4.0 kW reserved", 2)]


# --- the facility file ------------------------------------------------------------------------

THREE = "{L1: {rating_watts: 5000}, L2: {rating_watts: 5000}, L3: {rating_watts: 5000}}"
GOOD_PDU = f"  pdu/p1:\n    phases: {THREE}\n"


def phase_cap(facility: Facility, pdu: str, phase: str) -> float:
    """The phase's cap as placement works it out (decider.placement.phases.phase_state): its
    rating × the pdu's derating."""
    declared = facility.domain("pdu", pdu)
    assert declared is not None
    return PhaseState.build(
        pdu=DomainRef("pdu", pdu),
        phase=phase,
        rating=declared.phases[phase].rating_watts,
        derating=facility.derating("pdu", pdu),
        margin=facility.margin("pdu", pdu),
        other_watts=declared.phase_other_watts(phase),
        reserved=0.0,
    ).cap


def test_phases_as_the_facility_team_writes_them(tmp_path: Path) -> None:
    text = (
        "defaults: {derating: 0.8}\ndomains:\n"
        + GOOD_PDU
        + "  pdu/p2: {cap_watts: 9000, other_watts: 600, phases: {L1: {rating_watts: 4000}, "
        "L2: {rating_watts: 4000}, L3: {rating_watts: 4000}}}\n"
        "nodes:\n  gpu-01: {phases: {p1: L1, p2: L3}}\n"
        "mode: enforce\n"
    )
    facility = facility_file_load(tmp_path, text)
    assert sorted(facility.phased_pdus()) == ["p1", "p2"]
    assert facility.node_phase("gpu-01", "p2") == "L3"
    assert facility.node_phase("gpu-01", "p9") is None
    assert facility.node_phase("gpu-02", "p1") is None
    p2 = facility.domain("pdu", "p2")
    assert p2 is not None and phase_cap(facility, "p2", "L2") == 3_200
    # No phase sets other_watts: the pdu's 600 counts on each phase, the safe side.
    assert [p2.phase_other_watts(phase) for phase in PHASES] == [600, 600, 600]


def test_a_phase_of_its_own_other_watts_leaves_the_others_none() -> None:
    domain = Domain.model_validate(
        {
            "other_watts": 900,
            "phases": {
                "L1": {"rating_watts": 5_000, "other_watts": 300},
                "L2": {"rating_watts": 5_000},
                "L3": {"rating_watts": 5_000},
            },
        }
    )
    assert [domain.phase_other_watts(phase) for phase in PHASES] == [300, 0, 0]


def facility_file_load(tmp_path: Path, text: str) -> Facility:
    from decider import facility as facility_file

    path = tmp_path / "facility.yaml"
    path.write_text(text)
    return facility_file.load(path)


def test_phase_mistakes_are_refused_with_their_lines(tmp_path: Path) -> None:
    text = (
        "defaults: {derating: 0.8}\n"  # 1
        "domains:\n"  # 2
        "  pdu/p1:\n"  # 3
        "    phases:\n"  # 4
        "      L1: {rating_watts: 5000}\n"  # 5
        "      L4: {rating_watts: 5000}\n"  # 6
        "      L2: {rating_watts: 0}\n"  # 7
        "nodes:\n"  # 8
        "  n1: {phases: {p1: L5}}\n"  # 9
        "  n2: {phase: {p1: L1}}\n"  # 10
    )
    problems = refusal(tmp_path, text)
    assert "6: domains.pdu/p1.phases.L4.[key]: Value error, 'L4' is not a phase: L1, L2 or L3" in (
        problems
    )
    assert "7: domains.pdu/p1.phases.L2.rating_watts: Input should be greater than 0" in problems
    assert "9: nodes.n1.phases.p1: Value error, 'L5' is not a phase: L1, L2 or L3" in problems
    assert "10: nodes.n2.phase: Extra inputs are not permitted" in problems


def test_phases_in_the_wrong_place_are_refused_with_their_lines(tmp_path: Path) -> None:
    text = (
        "defaults: {derating: 0.8}\n"  # 1
        "domains:\n"  # 2
        "  rack/r1:\n"  # 3
        f"    phases: {THREE}\n"  # 4
        "  pdu/p1:\n"  # 5
        "    phases:\n"  # 6
        "      L1: {rating_watts: 5000}\n"  # 7
        "      L3: {rating_watts: 5000, other_watts: 4000}\n"  # 8
        "  pdu/p2: {cap_watts: 9000}\n"  # 9
        "nodes:\n"  # 10
        "  n1:\n"  # 11
        "    phases: {p2: L1, p3: L2}\n"  # 12
    )
    problems = refusal(tmp_path, text)
    assert "7: domains.pdu/p1.phases: a three-phase PDU lists L1, L2 and L3; L2 is missing" in (
        problems
    )
    assert (
        "8: domains.pdu/p1.phases.L3.other_watts: other_watts 4000 leaves no room under phase "
        "L3's cap of 4000 W (rating_watts × derating)"
    ) in problems
    # Checked once every domain is valid: the two above are fixed first.
    fixed = text.replace(
        "      L3: {rating_watts: 5000, other_watts: 4000}\n",
        "      L2: {rating_watts: 5000}\n      L3: {rating_watts: 5000}\n",
    )
    problems = refusal(tmp_path, fixed)
    assert (
        "4: domains.rack/r1.phases: only a pdu has phases; rack/r1 is a rack (give them to its "
        "pdus)"
    ) in problems
    assert "13: nodes.n1.phases.p2: pdu/p2 declares no phases: give it L1, L2 and L3" in problems
    assert "13: nodes.n1.phases.p3: no domain pdu/p3 in domains: declare it, with its phases" in (
        problems
    )


def test_the_example_file_has_phases() -> None:
    from decider import facility as facility_file
    from tests.facility_helpers import EXAMPLE

    facility = facility_file.load(EXAMPLE)
    pdu = facility.domain("pdu", "r12-07-a")
    assert pdu is not None
    assert {phase: declared.rating_watts for phase, declared in pdu.phases.items()} == {
        "L1": 8_500,
        "L2": 8_500,
        "L3": 8_500,
    }
    assert phase_cap(facility, "r12-07-a", "L1") == 6_800
    assert [pdu.phase_other_watts(phase) for phase in PHASES] == [0, 0, 300]
    assert facility.node_phase("gpu-r12-07-04", "r12-07-a") == "L1"
    assert facility.node_phase("gpu-r12-07-04", "r12-07-b") == "L2"


# --- property: no accepted reservation takes a phase past its limit ----------------------------

SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=120,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@dataclasses.dataclass
class PhasedSpec:
    facility: dict[str, Any]
    membership: dict[str, tuple[DomainRef, ...]]
    steps: list[tuple[str, int, str]]  # (action, node index, watts)


@composite
def phased_specs(draw: DrawFn) -> PhasedSpec:
    derating = draw(st.sampled_from([0.8, 1.0]))
    margin = draw(st.sampled_from([0.0, 0.1, 0.2]))
    domains: dict[str, Any] = {"rack/r1": {}}
    if draw(st.booleans()):
        domains["rack/r1"]["cap_watts"] = draw(st.integers(2_000, 40_000))
    pdus = ["a", "b"][: draw(st.integers(1, 2))]
    for pdu in pdus:
        entry: dict[str, Any] = {}
        if draw(st.booleans()):
            entry["cap_watts"] = draw(st.integers(2_000, 30_000))
        if pdu == "a" or draw(st.booleans()):  # pdu a always phased, b perhaps
            phases = {}
            for phase in PHASES:
                rating = draw(st.integers(1_000, 8_000))
                declared: dict[str, Any] = {"rating_watts": rating}
                if draw(st.integers(0, 3)) == 0:
                    declared["other_watts"] = draw(st.integers(0, int(rating * derating) - 1))
                phases[phase] = declared
            entry["phases"] = phases
        domains[f"pdu/{pdu}"] = entry
    nodes: dict[str, Any] = {}
    membership: dict[str, tuple[DomainRef, ...]] = {}
    for index in range(draw(st.integers(1, 5))):
        name = f"n{index}"
        fed = draw(st.sampled_from([pdus, pdus[:1], pdus[-1:]]))
        membership[name] = tuple(
            sorted([DomainRef("rack", "r1"), *(DomainRef("pdu", p) for p in fed)])
        )
        wiring = {
            pdu: phase
            for pdu in fed
            if "phases" in domains[f"pdu/{pdu}"]
            and (phase := draw(st.sampled_from([None, *PHASES]))) is not None
        }
        if wiring:
            nodes[name] = {"phases": wiring}
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["reserve", "reserve", "reserve", "release"]),
                st.integers(0, len(membership) - 1),
                st.integers(1, 4_000),
            ),
            min_size=1,
            max_size=12,
        )
    )
    facility = {
        "mode": "enforce",
        "defaults": {"margin": margin, "derating": derating},
        "domains": domains,
        "nodes": nodes,
    }
    return PhasedSpec(facility, membership, steps)


def oracle_phases(facility: Facility, node: str, refs: tuple[DomainRef, ...]) -> list[str]:
    """The phases a node's load counts against, worked out from the file alone."""
    found = []
    for domain_ref in refs:
        declared = facility.domain(domain_ref.kind, domain_ref.name)
        if domain_ref.kind != "pdu" or declared is None or not declared.phases:
            continue
        phase = facility.node_phase(node, domain_ref.name)
        found += [f"{domain_ref.name}/{each}" for each in ([phase] if phase else PHASES)]
    return found


@SETTINGS
@given(phased_specs())
def test_no_accepted_reservation_takes_a_phase_past_its_limit(spec: PhasedSpec) -> None:
    facility = Facility.model_validate(spec.facility)
    snapshot = Snapshot(
        membership=spec.membership,
        domains=frozenset(r for refs in spec.membership.values() for r in refs),
        node_gpus=dict.fromkeys(spec.membership, 8),
        gpu_limit_watts=dict.fromkeys(spec.membership, 700.0),
        parts={name: Part(NOW) for name in PARTS},
        prometheus_up=True,
    )
    store = Store(Path(":memory:"))
    staleness = Staleness(readings=120.0, inventory=3600.0)
    state = State(facility, store, 300.0, staleness, clock=lambda: NOW)
    with mock.patch.object(decider.giving_way, "gc", NO_GC):  # no part of the rules, and slow
        state.set_snapshot(snapshot)
    derating, margin = facility.defaults.derating, facility.defaults.margin
    limits: dict[str, float] = {}
    others: dict[str, float] = {}
    for pdu, domain in facility.phased_pdus().items():
        for phase in PHASES:
            limits[f"{pdu}/{phase}"] = domain.phases[phase].rating_watts * derating * (1 - margin)
            others[f"{pdu}/{phase}"] = domain.phase_other_watts(phase)
    reserved: dict[str, float] = dict.fromkeys(limits, 0.0)
    nodes = sorted(spec.membership)
    made: list[tuple[str, float, list[str]]] = []  # (id, watts, phases)
    try:
        for number, (action, index, watts) in enumerate(spec.steps):
            if action == "release":
                if made:
                    rid, was, counted = made.pop(index % len(made))
                    assert state.release(rid)
                    for key in counted:
                        reserved[key] -= was
                continue
            node = nodes[index]
            counted = oracle_phases(facility, node, spec.membership[node])
            rep = Replica(model="m", profile="p", gpus=1, power_watts=float(watts))
            view = state.view()
            placed = decide(view, rep, [node]).as_json()["nodes"][0]
            phase_reasons = [r for r in placed["reasons"] if " phase L" in r]
            fits_phases = all(reserved[k] + others[k] + watts <= limits[k] for k in counted)
            close = any(
                abs(reserved[k] + others[k] + watts - limits[k]) < 1e-6 * limits[k] for k in counted
            )
            if not close:  # exactly at a limit, float rounding may go either way
                assert bool(phase_reasons) == (not fits_phases), (placed, reserved, counted)
            outcome = state.reserve(ReservationRequest(id=f"r{number}", replica=rep, node=node))
            assert (outcome.reservation is not None) == placed["allowed"]
            if outcome.reservation is None:
                event("refused")
                continue
            event("accepted")
            made.append((f"r{number}", float(watts), counted))
            for key in counted:
                reserved[key] += watts
            after = state.view()
            for key, limit in limits.items():
                pdu, _, phase = key.partition("/")
                figures = after.phase(pdu, phase)
                assert figures.reserved == pytest.approx(reserved[key], abs=1e-6)
                # The property: a phase that carries accepted reservations stays within
                # rating × derating × (1 − margin), its other_watts included. (A phase whose
                # other_watts alone passes that takes none: see the refusal check above.)
                if reserved[key] > 0:
                    assert figures.load <= limit + 1e-6 * limit, (key, figures)
        # The settled view holds what a view from scratch holds.
        settled = state.view()
        scratch = from_scratch(settled)
        for pdu in facility.phased_pdus():
            for phase in PHASES:
                ours, theirs = settled.phase(pdu, phase), scratch.phase(pdu, phase)
                assert ours.reserved == pytest.approx(theirs.reserved, abs=1e-6)
                assert settled.domain_refusals(ours) == scratch.domain_refusals(theirs)
    finally:
        store.close()


# --- the service: the API, /metrics and the CLI ------------------------------------------------

SERVICE_FACILITY: dict[str, Any] = {
    "defaults": {"margin": 0.1, "derating": 0.8},
    "domains": PHASED_DOMAINS,
    "nodes": PHASED_NODES,
    "profiles": {"tp1": {"gpus": 1, "power_watts": 1_500}},
    "mode": "enforce",
}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Decider]:
    """A decider on PHASED with 2 000 W reserved on n2 and 2 100 W on n3: L2 has 40 W left."""
    fake = FakePrometheus(
        Readings(
            membership={node: list(keys) for node, keys in MEMBERS.items()},
            gpus=dict.fromkeys(MEMBERS, 8),
            limits=dict.fromkeys(MEMBERS, 700.0),
        )
    )
    decider = Decider(tmp_path_factory.mktemp("phases"), fake.url, SERVICE_FACILITY)
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        for rid, node, watts in (("a", "n2", 2_000), ("b", "n3", 2_100)):
            made = decider.reserve(
                rid, node, {"model": "m", "profile": "x", "gpus": 1, "power_watts": watts}
            )
            assert made.status_code == 201, made.text
        yield decider
    finally:
        decider.close()
        fake.close()


def test_the_api_refuses_a_reservation_on_a_full_phase(service: Decider) -> None:
    replica_body = {"model": "m", "profile": "x", "gpus": 1, "power_watts": 2_800}
    refused = service.reserve("c", "n2", replica_body)
    assert refused.status_code == 409
    assert refused.json()["reasons"] == [L2_FULL]
    placed = service.place(replica_body, ["n1", "n2"])
    assert placed["order"] == ["n1"]


def test_the_api_shows_each_phase(service: Decider) -> None:
    entry = service.domain("pdu/p1")
    assert entry["reserved_watts"] == 4_100
    assert entry["phases"] == [
        {
            "phase": "L1",
            "rating_watts": 5_000,
            "cap_watts": 4_000,
            "limit_watts": 3_600,
            "other_watts": 0,
            "reserved_watts": 0,
            "measured_watts": None,
            "load_watts": 0,
            "load_basis": "reserved",
            "room_watts": 3_600,
            "headroom_watts": 4_000,
        },
        {
            "phase": "L2",
            "rating_watts": 5_750,
            "cap_watts": 4_600,
            "limit_watts": 4_140,
            "other_watts": 0,
            "reserved_watts": 4_100,
            "measured_watts": None,
            "load_watts": 4_100,
            "load_basis": "reserved",
            "room_watts": 40,
            "headroom_watts": 500,
        },
        {
            "phase": "L3",
            "rating_watts": 5_000,
            "cap_watts": 4_000,
            "limit_watts": 3_600,
            "other_watts": 500,
            "reserved_watts": 0,
            "measured_watts": None,
            "load_watts": 500,
            "load_basis": "reserved",
            "room_watts": 3_100,
            "headroom_watts": 3_500,
        },
    ]
    assert "phases" not in service.domain("rack/r1")
    one = service.get("/v1/domains/pdu/p1").json()
    assert [(p["phase"], p["nodes"]) for p in one["phases"]] == [
        ("L1", ["n1"]),
        ("L2", ["n2", "n3"]),
        ("L3", []),
    ]
    assert one["nodes_without_phase"] == ["n4"]


def test_the_api_headroom_per_phase(service: Decider) -> None:
    answer = service.get("/v1/headroom", params={"profile": "tp1"}).json()
    pdu = next(d for d in answer["domains"] if (d["kind"], d["domain"]) == ("pdu", "p1"))
    # L2 has 40 W left: n2, n3 and n4 take nothing. n1 takes 2 on L1's 3 600.
    l1 = "power: pdu p1 phase L1 has 0.6 kW left, a replica needs ~1.5"
    l2 = "power: pdu p1 phase L2 has 0.0 kW left, a replica needs ~1.5"
    assert pdu["fits"] == 2
    assert pdu["binds"] == [{"reason": l2, "nodes": 3}, {"reason": l1, "nodes": 1}]
    assert [(p["phase"], p["fits"]) for p in pdu["phases"]] == [("L1", 2), ("L2", 0), ("L3", 0)]
    rack = next(d for d in answer["domains"] if (d["kind"], d["domain"]) == ("rack", "r1"))
    assert "phases" not in rack


def test_metrics_per_phase(service: Decider) -> None:
    text = service.get("/metrics").text
    labels = {"kind": "pdu", "domain": "p1", "phase": "L2"}
    assert metric_value(text, "llmgw_domain_phase_power_budget_watts", **labels) == 4_600
    assert metric_value(text, "llmgw_domain_phase_reserved_watts", **labels) == 4_100
    assert metric_value(text, "llmgw_domain_phase_headroom_watts", **labels) == 500
    assert metric_value(text, "llmgw_domain_phase_headroom_watts", **labels | {"phase": "L3"}) == (
        3_500
    )


def test_the_status_page_lists_each_phase(service: Decider) -> None:
    page = service.get("/").text
    assert 'id="phase-p1-L2"' in page


def test_the_cli_tables_show_each_phase(
    service: Decider, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["facility", "--decider", service.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pdu/p1 "))
    # cap, reserved, measured, headroom (limit − load), cap − load: L2 4.14 − 4.1 = 0.04 and
    # 4.6 − 4.1 = 0.5; L3 3.6 − other 0.5 = 3.1 and 4.0 − 0.5 = 3.5
    assert lines[start : start + 4] == [
        "pdu/p1      unknown      16.0          4.1            -         10.3         11.9  -",
        "  phase L1                4.0          0.0            -          3.6          4.0",
        "  phase L2                4.6          4.1            -          0.0          0.5",
        "  phase L3                4.0          0.0            -          3.1          3.5",
    ]
    assert main(["headroom", "--profile", "tp1", "--decider", service.url]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("pdu/p1 "))
    # FITS per phase: L1 n1's 2; L2 none (40 W left); L3 none (n4 is on L2 too)
    assert [line[:16] for line in lines[start : start + 4]] == [
        "pdu/p1         2",
        "  phase L1     2",
        "  phase L2     0",
        "  phase L3     0",
    ]
    assert "power: pdu p1 phase L2 has 0.0 kW left, a replica needs ~1.5 (3 nodes)" in lines[start]
