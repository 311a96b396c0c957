"""The decider under per-kind conditions (issue 17, DESIGN.md §3 "Each kind from its own
evidence"): a node is refused for its own rack's heat, or for a parent hot on its own
evidence, never because a sibling rack is hot; the shedding plan and the failover plan follow
the same conditions.

The rules (rules/conditions.yml, tested in tests/rules/conditions_kinds_test.yml and
conditions_site_test.yml) give a row, room or site a condition of its own: from a site signal
about it or more than a share of its racks hot, at most warm for a minority of hot racks, and
a pdu none without a site signal. Here the decider reads such conditions, as the refresher
would put them in its snapshot, and the sites are built the way
tests/test_placement_properties.py builds them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.strategies import DrawFn, composite

from decider.facility import DomainRef, Facility, limit_watts
from decider.models import Replica
from decider.placement import decide
from decider.shedding.failover import failover
from decider.snapshot import PARTS, Part, Snapshot
from tests.placement_helpers import NOW, SETTINGS, SiteSpec, ref, state_of
from tests.shedding_helpers import CLASSES, MODELS, SHEDDING, site

WATTS = 1_000.0
REPLICA = Replica(model="a", profile="declared", gpus=0, power_watts=WATTS)


@dataclasses.dataclass
class KindSite:
    spec: SiteSpec
    racks: dict[str, list[str]]  # rack name -> its nodes

    def rack_of(self, node: str) -> DomainRef:
        return next(r for r in self.spec.membership[node] if r.kind == "rack")


@composite
def kind_sites(draw: DrawFn) -> KindSite:
    """Racks in one or two rows of one room and site, each rack on a pdu of its own; racks
    hot, warm, ok or without a condition, at least one of them not hot; the row, room and
    site ok, warm or without a condition (none hot on its own evidence), the pdus without
    one (no site signal about them). Racks may have budgets, measured power and other_watts;
    the parents have none, so a node's room is its rack's."""
    rows = draw(st.integers(1, 2))
    membership: dict[str, tuple[DomainRef, ...]] = {}
    racks: dict[str, list[str]] = {}
    for r in range(draw(st.integers(2, 6))):
        row = str(draw(st.integers(0, rows - 1)))
        racks[f"r{r}"] = []
        for k in range(draw(st.integers(1, 3))):
            node = f"n{r}-{k}"
            racks[f"r{r}"].append(node)
            membership[node] = (
                DomainRef("pdu", f"p{r}"),
                DomainRef("rack", f"r{r}"),
                DomainRef("room", "m1"),
                DomainRef("row", row),
                DomainRef("site", "s1"),
            )
    rack_refs = [DomainRef("rack", name) for name in racks]
    conditions: dict[DomainRef, str] = {}
    for rack in rack_refs:
        state = draw(st.sampled_from(["hot", "hot", "hot", "warm", "ok", None]))
        if state is not None:
            conditions[rack] = state
    if all(conditions.get(rack) == "hot" for rack in rack_refs):
        spared = draw(st.sampled_from(rack_refs))
        conditions[spared] = draw(st.sampled_from(["ok", "warm"]))
    parents = {ref for refs in membership.values() for ref in refs if ref.kind != "rack"}
    for parent in sorted(parents):
        if parent.kind == "pdu":
            continue
        state = draw(st.sampled_from(["ok", "warm", None]))
        if state is not None:
            conditions[parent] = state
    domains: dict[str, Any] = {}
    measured: dict[DomainRef, float] = {}
    for rack in rack_refs:
        cap = draw(st.sampled_from([None, 2_000.0, 8_000.0, 30_000.0]))
        if cap is None:
            continue
        domains[str(rack)] = {"cap_watts": cap}
        if draw(st.booleans()):
            domains[str(rack)]["other_watts"] = round(cap * 0.2, 1)
        if draw(st.booleans()):
            measured[rack] = draw(st.floats(0, cap, allow_nan=False, allow_infinity=False))
    facility = {
        "mode": "enforce",
        "defaults": {"margin": draw(st.sampled_from([0.0, 0.1]))},
        "domains": domains,
    }
    ages = dict.fromkeys(conditions, 10.0)
    spec = SiteSpec(facility, membership, measured, conditions, ages, {}, {}, [], {})
    return KindSite(spec, racks)


def has_room(facility: Facility, spec: SiteSpec, rack: DomainRef) -> bool:
    """From the raw figures: the rack's load plus the replica under its limit (no budget: yes)."""
    limit = limit_watts(
        facility.cap_watts(rack.kind, rack.name), facility.margin(rack.kind, rack.name)
    )
    if limit is None:
        return True
    declared = facility.domain(rack.kind, rack.name)
    other = declared.other_watts if declared is not None else 0.0
    return spec.measured.get(rack, 0.0) + other + WATTS <= limit


@SETTINGS
@given(kind_sites())
def test_any_set_of_hot_racks_leaving_one_with_room_allows_a_placement(site_: KindSite):
    """Exactly the nodes of racks that are not hot and have room are allowed: some placement
    is, whenever such a rack exists, whatever the other racks' heat; a refused node's reasons
    never name another rack, nor a row, room or site as hot."""
    spec = site_.spec
    nodes = spec.nodes
    with state_of(spec, spec.snapshot()) as state:
        view = state.view()
        decision = decide(view, REPLICA, nodes)
        facility = view.facility
        expected = {
            node
            for node in nodes
            if spec.conditions.get(site_.rack_of(node)) != "hot"
            and has_room(facility, spec, site_.rack_of(node))
        }
        assert set(decision.order) == expected, decision.summary()
        hot = sum(1 for r in site_.racks if spec.conditions.get(DomainRef("rack", r)) == "hot")
        event(f"{hot} of {len(site_.racks)} racks hot; {len(expected)} nodes allowed")
        for verdict in decision.verdicts:
            own = site_.rack_of(verdict.node.node)
            for _, reason in verdict.refusals:
                assert reason.startswith((f"rack {own.name} ", f"rack {own.name}:")), reason
                assert "hot" not in reason or spec.conditions.get(own) == "hot", reason


# --- the two-rack site of the issue ------------------------------------------------------


#: Two racks of two nodes in row 12, room hall-b, site sto1, each rack dual-fed.
ISSUE_MEMBERSHIP = {
    f"{rack}-{k}": [f"rack/{rack}", "row/12", "room/hall-b", "site/sto1", *feeds]
    for rack, feeds in (("r1", ["pdu/r1-a", "pdu/r1-b"]), ("r2", ["pdu/r2-a", "pdu/r2-b"]))
    for k in (1, 2)
}
ISSUE_DOMAINS = {
    f"rack/{rack}": {
        "feeds": [
            {"pdu": f"{rack}-a", "rating_watts": 17_300},
            {"pdu": f"{rack}-b", "rating_watts": 17_300},
        ]
    }
    for rack in ("r1", "r2")
}
#: What the rules now give that site with rack r1's inlet at 40 °C
#: (tests/rules/conditions_site_test.yml): r1 hot, its row warm, the room and site ok, the
#: pdus no condition. The rules before gave the row, room and site hot as well.
PER_KIND = {"rack/r1": "hot", "rack/r2": "ok", "row/12": "warm", "room/hall-b": "ok"}
PER_KIND |= {"site/sto1": "ok"}


def issue_site() -> Any:
    facility = {"shedding": SHEDDING, "classes": CLASSES, "models": MODELS}
    return site({**facility, "domains": ISSUE_DOMAINS}, ISSUE_MEMBERSHIP)


def test_the_issues_site_places_sheds_and_fails_over_into_the_other_rack():
    with issue_site() as s:
        embed = s.reserve("r1-1", 3_000, "embed")
        s.reserve("r1-2", 3_000, "summarise")
        for key, condition in PER_KIND.items():
            s.conditions[ref(key)] = condition
        s.hot_since[ref("rack/r1")] = s.now - 900  # hot for 15 min, past hot_for
        s.refresh()
        view = s.state.view()

        decision = decide(view, REPLICA, sorted(ISSUE_MEMBERSHIP))
        assert decision.order == ["r2-1", "r2-2"]
        assert decision.summary() == "2/4 nodes allowed (2 hot)"

        plan = s.plan().as_json(600.0, 300.0)
        [entry] = plan["plan"]
        assert entry["domain"] == "rack/r1"
        assert [move["reservation"] for move in entry["moves"]] == [embed]
        assert entry["moves"][0]["to"] in ("r2-1", "r2-2")
        assert plan["moves"] == 1

        lost = failover(view, "r1-a")
        [rack] = lost["domains"]
        assert rack["domain"] == "rack/r1" and rack["over"] is False  # 6 kW of 13.84 kW


def test_a_row_hot_on_its_own_evidence_still_refuses_its_nodes():
    """The demo's story: row 12 hot through its cooling unit refuses every node in it, and
    the plan says why it moves nothing; the decider reads a parent's own condition."""
    with issue_site() as s:
        s.reserve("r1-1", 3_000, "embed")
        s.conditions[ref("row/12")] = "hot"
        s.hot_since[ref("row/12")] = s.now - 900
        s.refresh()
        decision = decide(s.state.view(), REPLICA, sorted(ISSUE_MEMBERSHIP))
        assert decision.order == []
        for verdict in decision.verdicts:
            assert [reason for _, reason in verdict.refusals] == ["row 12 hot"]
        [entry] = s.plan().as_json(600.0, 300.0)["plan"]
        assert entry["moves"] == []
        assert entry["skipped"] == [
            {"reservation": "r01", "reason": "no node known outside row/12"}
        ]


def test_a_snapshot_without_parent_conditions_refuses_nobody_for_a_sibling():
    """A snapshot that names only racks (a Prometheus whose rules give parents no condition
    yet): a rack's heat stays its own."""
    membership = {
        n: tuple(DomainRef.parse(k) for k in keys) for n, keys in ISSUE_MEMBERSHIP.items()
    }
    spec = SiteSpec(
        {"mode": "enforce", "domains": ISSUE_DOMAINS},
        membership,
        {},
        {DomainRef("rack", "r1"): "hot"},
        {DomainRef("rack", "r1"): 5.0},
        {},
        {},
        [],
        {},
    )
    snapshot = Snapshot(
        membership=membership,
        domains=frozenset(r for refs in membership.values() for r in refs),
        conditions={DomainRef("rack", "r1"): "hot"},
        parts={name: Part(NOW) for name in PARTS},
        prometheus_up=True,
    )
    with state_of(spec, snapshot) as state:
        assert decide(state.view(), REPLICA, sorted(membership)).order == ["r2-1", "r2-2"]
