"""Shedding plans and the loss of a feed (decider/shedding/): worked examples in-process,
properties (hypothesis) over generated sites, and the calls on a real decider.

In-process sites are a State over a Store, reservations made through the real placement
path (`State.reserve`, enforce mode) while every rack is `ok`, then conditions and hot
durations set by a new snapshot, as the refresher would.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping
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
from decider.facility import DomainRef, Facility
from decider.models import Replica, ReservationRequest
from decider.placement import judge
from decider.placement.view import View
from decider.shedding.failover import failover
from decider.shedding.planner import Plan
from decider.shedding.shedder import Shedder
from decider.snapshot import PARTS, Part
from decider.state import State
from decider.store import Reservation, Store
from llmgw_common.yamlfile import ConfigError
from tests.decider_harness import Decider, FakePrometheus, Readings, metric_value
from tests.placement_helpers import NO_GC
from tests.shedding_helpers import CLASSES, MODELS, SHEDDING, Site, site

NOW = 1_700_000_000.0
STALENESS = Staleness(readings=120.0, inventory=3600.0)
SETTINGS = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=120,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def ref(key: str) -> DomainRef:
    return DomainRef.parse(key)


# --- a site in-process --------------------------------------------------------------------


#: Two racks of two nodes in row 1; r2 has room, r1 is the one that goes hot.
MEMBERSHIP = {
    "a1": ["rack/r1", "row/1"],
    "a2": ["rack/r1", "row/1"],
    "b1": ["rack/r2", "row/1"],
    "b2": ["rack/r2", "row/1"],
}
RACKS = {"rack/r1": {"cap_watts": 20_000}, "rack/r2": {"cap_watts": 20_000}}


def worked_site() -> Any:
    return site(
        {"shedding": SHEDDING, "classes": CLASSES, "models": MODELS, "domains": RACKS},
        MEMBERSHIP,
    )


# --- the facility file --------------------------------------------------------------------


def test_models_and_classes_are_validated_with_their_lines(tmp_path: Path):
    path = tmp_path / "facility.yaml"
    path.write_text(
        "classes: [batch, batch]\n"  # 1
        "models:\n"
        "  chat: {class: interactive, minimum_replicas: 2, critical: true}\n"
        "  embed:\n"
        "    minimum_replicas: -1\n"  # 5
        "  other: {critical: maybe}\n"  # 6
    )
    with pytest.raises(ConfigError) as caught:
        decider.facility.load(path)
    problems = str(caught.value)
    assert "facility.yaml:1: classes: Value error, class batch is listed more than once" in (
        problems
    )
    assert "facility.yaml:5: models.embed.minimum_replicas: Input should be greater" in problems
    assert "facility.yaml:6: models.other.critical: Input should be a valid boolean" in problems

    path.write_text("classes: [batch]\nmodels:\n  chat: {class: interactive}\n")
    with pytest.raises(ConfigError) as caught:
        decider.facility.load(path)
    assert "models.chat.class: class 'interactive' is not one of classes (batch)" in str(
        caught.value
    )


def test_class_rank_lowest_first_and_unlisted_below_all():
    facility = Facility.model_validate({"classes": CLASSES})
    assert [facility.class_rank(c) for c in CLASSES] == [0, 1, 2]
    assert facility.class_rank(None) == facility.class_rank("typo") == -1


# --- the plan: worked examples ------------------------------------------------------------


def test_disabled_says_so_and_plans_nothing():
    with site({"domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        s.heat("rack/r1", 3600)
        result = s.plan()
        assert not result.enabled and result.entries == [] and result.moves == 0
        assert result.as_json(600, 300)["summary"] == (
            "shedding is disabled (facility file shedding.enabled: false): no plan"
        )


def test_a_domain_hot_for_less_than_hot_for_waits_and_says_when():
    with site({"shedding": SHEDDING, "domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        s.heat("rack/r1", 240)
        (entry,) = s.plan().entries
        assert (entry["shed"], entry["moves"]) == (False, [])
        assert entry["reason"] == "rack r1 hot for 4m, shed after 10m"
        assert entry["next_move_at"] == pytest.approx(s.now + 360)


def test_the_order_class_then_minimum_one_per_interval_and_critical_never():
    """r1 holds, in the order they must go: embed (batch, above its minimum 0); a chat
    replica whose own class says batch (the replica's class wins over chat's interactive)
    but chat is critical with 2 of minimum 2: never, skipped with the reason; summarise
    (standard) ×2 with minimum 1: the larger first."""
    with worked_site() as s:
        s.reserve("b1", 1000, "chat")
        chat = s.reserve("a1", 1000, "chat", **{"class_": "batch"})
        summarise_big = s.reserve("a1", 3000, "summarise")
        summarise_small = s.reserve("a2", 2000, "summarise")
        embed = s.reserve("a2", 1500, "embed")
        s.heat("rack/r1", 601)

        first = s.plan()
        (entry,) = first.entries
        assert [m["reservation"] for m in entry["moves"]] == [embed]
        (move,) = entry["moves"]
        assert (move["from"], move["class"], move["above_minimum"]) == ("a2", "batch", True)
        assert move["to"] in ("b1", "b2")
        assert entry["skipped"] == []  # the first in order could move
        assert entry["next_move_at"] == pytest.approx(s.now + 300)

        # Not executed yet: the same move, and no other, for the rest of the interval.
        s.tick(120)
        assert [m["reservation"] for m in s.plan().entries[0]["moves"]] == [embed]

        assert s.execute(move)
        s.tick(30)  # seen gone now: the next move waits an interval from here
        waiting = s.plan().entries[0]
        assert waiting["moves"] == []
        assert waiting["next_move_at"] == pytest.approx(s.now + 300)
        s.tick(299)
        assert s.plan().entries[0]["moves"] == []
        s.tick(1)
        second_entry = s.plan().entries[0]
        second = second_entry["moves"]
        # chat's replica ranks first now (class batch), but chat is critical at its minimum.
        assert second_entry["skipped"] == [
            {
                "reservation": chat,
                "reason": "critical model chat at its minimum: 2 replica(s) running, minimum 2",
            }
        ]
        # Both summarise replicas: the larger goes first, above the minimum (2 of 1).
        assert [(m["reservation"], m["above_minimum"]) for m in second] == [(summarise_big, True)]
        assert s.execute(second[0])
        s.tick(1)
        s.plan()  # seen gone (a scrape of /metrics computes the plan too)
        s.tick(300)
        third = s.plan().entries[0]
        # Now summarise runs 2 again (one moved, running elsewhere): the other is above too.
        assert [m["reservation"] for m in third["moves"]] == [summarise_small]
        assert s.execute(third["moves"][0])
        s.tick(1)
        s.plan()  # seen gone (a scrape of /metrics computes the plan too)
        s.tick(300)
        last = s.plan().entries[0]
        assert last["moves"] == []
        assert last["reason"] == "rack r1: no replica can move"
        assert [skip["reservation"] for skip in last["skipped"]] == [chat]


def test_no_move_without_a_destination_and_two_moves_never_share_the_last_room():
    """r1 and r2 both hot; r3 has room for one 3 kW replica (limit 3.6 kW): r1's move takes
    it, r2's finds none."""
    racks = {"rack/r1": {"cap_watts": 20_000}, "rack/r2": {"cap_watts": 20_000}}
    racks["rack/r3"] = {"cap_watts": 4_000}
    membership = {"a1": ["rack/r1"], "b1": ["rack/r2"], "c1": ["rack/r3"]}
    with site({"shedding": SHEDDING, "domains": racks}, membership) as s:
        s.reserve("a1", 3000, "embed")
        s.reserve("b1", 3000, "embed")
        s.heat("rack/r1", 900)
        s.heat("rack/r2", 900)
        result = s.plan()
        first, second = result.entries
        assert [m["to"] for m in first["moves"]] == ["c1"]
        assert second["moves"] == []
        (skipped,) = second["skipped"]
        assert skipped["reason"].startswith("no destination: 0/2 nodes allowed (")
        assert "1 hot" in skipped["reason"] and "1 power_cap" in skipped["reason"]
        assert result.moves == 1


def test_observe_mode_plans_with_enforce_modes_verdicts():
    """Observe mode refuses nothing, but a plan never proposes a node enforce mode would
    refuse: r2 hot and r3 full leave no destination for r1's replica."""
    racks = {"rack/r1": {"cap_watts": 20_000}, "rack/r2": {"cap_watts": 20_000}}
    racks["rack/r3"] = {"cap_watts": 2_000}
    membership = {"a1": ["rack/r1"], "b1": ["rack/r2"], "c1": ["rack/r3"]}
    facility = {"mode": "observe", "shedding": SHEDDING, "domains": racks}
    with site(facility, membership) as s:
        moved = s.reserve("a1", 3000, "embed")
        s.heat("rack/r1", 900)
        s.heat("rack/r2", 900)
        by_domain = {e["domain"]: e for e in s.plan().entries}
        assert by_domain["rack/r1"]["moves"] == []
        (skipped,) = by_domain["rack/r1"]["skipped"]
        assert skipped == {
            "reservation": moved,
            "reason": "no destination: 0/2 nodes allowed (1 hot, 1 power_cap)",
        }


def test_a_move_leaving_two_hot_domains_counts_for_both():
    """Racks r1 and r2 in row 1, all three hot: r1 moves one; r2's would also leave row 1,
    which has just moved one: r2 waits."""
    racks = {k: {"cap_watts": 20_000} for k in ("rack/r1", "rack/r2", "rack/r3")}
    membership = {"a1": ["rack/r1", "row/1"], "b1": ["rack/r2", "row/1"], "c1": ["rack/r3"]}
    with site({"shedding": SHEDDING, "domains": racks}, membership) as s:
        moved = s.reserve("a1", 1000, "embed")
        kept = s.reserve("b1", 1000, "embed")
        for key in ("rack/r1", "rack/r2", "row/1"):
            s.heat(key, 900)
        by_domain = {e["domain"]: e for e in s.plan().entries}
        assert [m["reservation"] for m in by_domain["rack/r1"]["moves"]] == [moved]
        assert by_domain["rack/r2"]["moves"] == by_domain["row/1"]["moves"] == []
        (skipped,) = by_domain["rack/r2"]["skipped"]
        assert skipped["reservation"] == kept
        assert skipped["reason"].startswith(f"it also leaves row/1, which moved {moved} last")


def test_without_the_hot_part_nothing_is_shed_and_missing_says_why():
    with site({"shedding": SHEDDING, "domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        s.heat("rack/r1", 900)
        snapshot = dataclasses.replace(
            s.snapshot(), parts={name: Part(NOW if name != "hot" else None) for name in PARTS}
        )
        with mock.patch.object(decider.giving_way, "gc", NO_GC):
            s.state.set_snapshot(snapshot)
        result = s.plan()
        assert result.entries == []
        assert result.missing[0] == "how long domains are hot: no domain is shed without it"


def test_the_pacing_survives_a_restart(tmp_path: Path):
    facility = {"shedding": SHEDDING, "domains": RACKS}
    with site(facility, MEMBERSHIP) as s:
        s.store.close()
        s.store = Store(tmp_path / "decider.db")
        s.state = State(s.facility, s.store, 3600.0, STALENESS, clock=lambda: s.now)
        s.reserve("a1", 2000, "embed")
        s.reserve("a2", 2000, "embed")
        s.heat("rack/r1", 900)
        s.shedder = Shedder(s.store, s.state.view, lambda: s.now, s.state.record_proposals)
        (move,) = s.plan().entries[0]["moves"]
        assert s.execute(move)
        s.tick(10)
        assert s.plan().entries[0]["moves"] == []
        s.store.close()
        s.store = Store(tmp_path / "decider.db")  # a restart: state from the database
        s.state = State(s.facility, s.store, 3600.0, STALENESS, clock=lambda: s.now)
        s.refresh()
        s.shedder = Shedder(s.store, s.state.view, lambda: s.now, s.state.record_proposals)
        entry = s.plan().entries[0]
        assert entry["moves"] == []
        assert entry["next_move_at"] == pytest.approx(s.now - 10 + 300 + 10)


def test_a_plan_that_cannot_be_recorded_leaves_metrics_serving(caplog):
    from prometheus_client import CollectorRegistry, generate_latest

    from decider.shedding.collector import SheddingCollector
    from decider.store import StoreError

    with site({"shedding": SHEDDING, "domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        s.heat("rack/r1", 900)

        def full_disk(_: Any) -> None:
            raise StoreError("decider.db: cannot write: database or disk is full")

        registry = CollectorRegistry()
        registry.register(
            SheddingCollector(Shedder(s.store, s.state.view, lambda: s.now, full_disk))
        )
        assert b"llmgw_decider_shedding" not in generate_latest(registry)
        assert "the shedding plan failed" in caplog.text
        registry = CollectorRegistry()
        registry.register(SheddingCollector(s.shedder))
        text = generate_latest(registry).decode()
        assert 'llmgw_decider_shedding_moves{domain="r1",kind="rack"} 1.0' in text


# --- failover: a worked example -----------------------------------------------------------


def test_failover_names_the_racks_over_their_surviving_feed_with_figures():
    """Rack r1: feeds a and b of 10 kW, derating 0.8: 8 kW each, cap 8 kW. Reserved 6 kW,
    measured 9 kW (past the cap): without feed a, b carries 9.0 kW of 8.0: one replica
    (the lowest class, embed at 2 kW) moves to r2. Rack r3 is fed by a alone: unpowered."""
    racks = {
        "rack/r1": {
            "feeds": [{"pdu": "a", "rating_watts": 10_000}, {"pdu": "b", "rating_watts": 10_000}]
        },
        "rack/r2": {"cap_watts": 20_000},
        "rack/r3": {"feeds": [{"pdu": "a", "rating_watts": 10_000}]},
    }
    membership = {"a1": ["rack/r1"], "b1": ["rack/r2"], "c1": ["rack/r3"]}
    with site({"classes": CLASSES, "models": MODELS, "domains": racks}, membership) as s:
        s.reserve("a1", 4000, "summarise")
        embed = s.reserve("a1", 2000, "embed")
        s.measured[ref("rack/r1")] = 9000
        s.refresh()
        answer = failover(s.state.view(), "a")
        r1, r3 = answer["domains"]
        assert (r1["domain"], r1["over"], r1["load_watts"], r1["limit_watts"]) == (
            "rack/r1",
            True,
            9000.0,
            8000.0,
        )
        assert r1["excess_watts"] == 1000.0 and r1["short_watts"] == 0.0
        assert [(m["reservation"], m["to"]) for m in r1["moves"]] == [(embed, "b1")]
        assert r1["reason"] == (
            "rack r1 over its surviving feeds: 9.0 kW measured on b: 9.0 kW per feed of "
            "8.0 kW (rating × derating 0.8); moving 1 replica(s) frees 2.0 kW"
        )
        assert (r3["unpowered"], r3["over"]) == (True, True)
        assert answer["summary"] == "loss of pdu a: 2 domain(s) fed, 2 over what survives"
        within = failover(s.state.view(), "b")["domains"][0]
        assert within["over"] is True  # 9.0 kW measured on a alone, too
        assert failover(s.state.view(), "zz")["summary"].endswith(
            "no domain of the facility file is fed by it"
        )


# --- properties over generated sites -------------------------------------------------------


@dataclasses.dataclass
class Spec:
    facility: dict[str, Any]
    membership: dict[str, list[str]]
    placements: list[tuple[str, float, str, int, str | None]]  # node, watts, model, gpus, class
    hot: dict[str, float]  # domain → seconds hot already


@composite
def specs(draw: DrawFn) -> Spec:
    membership: dict[str, list[str]] = {}
    domains: dict[str, Any] = {}
    for r in range(draw(st.integers(2, 5))):
        row = draw(st.integers(0, 1))
        feeds = draw(st.integers(0, 2))
        rack: dict[str, Any] = {}
        if feeds:
            rack["feeds"] = [
                {"pdu": f"r{r}-{side}", "rating_watts": draw(st.integers(4_000, 30_000))}
                for side in "ab"[:feeds]
            ]
        if not feeds or draw(st.booleans()):
            rack["cap_watts"] = draw(st.integers(4_000, 30_000))
        domains[f"rack/r{r}"] = rack
        for k in range(draw(st.integers(1, 3))):
            membership[f"n{r}{k}"] = [f"rack/r{r}", f"row/{row}"] + [
                f"pdu/r{r}-{side}" for side in "ab"[:feeds]
            ]
    classes = ["batch", "standard", "interactive"][: draw(st.integers(0, 3))]
    models = {}
    for name in ("m0", "m1", "m2")[: draw(st.integers(1, 3))]:
        models[name] = {
            "class": draw(st.sampled_from([None, *classes])),
            "minimum_replicas": draw(st.integers(0, 3)),
            "critical": draw(st.booleans()),
        }
    nodes = sorted(membership)
    placements = [
        (
            draw(st.sampled_from(nodes)),
            float(draw(st.sampled_from([500, 1000, 1500, 2500, 4000]))),
            draw(st.sampled_from(sorted(models))),
            draw(st.integers(1, 3)),
            draw(st.sampled_from([None, None, *classes, "unlisted"])),
        )
        for _ in range(draw(st.integers(2, 20)))
    ]
    candidates = [*sorted(domains) * 3, "row/0", "row/1"]  # mostly racks: rows hide room
    hot = {
        key: float(draw(st.sampled_from([30, 59, 60, 400, 400])))
        for key in draw(st.lists(st.sampled_from(candidates), min_size=1, max_size=2, unique=True))
    }
    facility = {
        "shedding": {"enabled": True, "hot_for": "1m", "interval": "2m"},
        "classes": classes,
        "models": {k: {a: b for a, b in v.items() if b is not None} for k, v in models.items()},
        "domains": domains,
    }
    return Spec(facility, membership, placements, hot)


def build(spec: Spec) -> Site:
    s = Site(spec.facility, spec.membership)
    for node, watts, model, gpus, klass in spec.placements:
        s.ids += 1
        replica = Replica(model=model, profile="p", gpus=gpus, power_watts=watts, class_=klass)
        s.state.reserve(ReservationRequest(id=f"r{s.ids:02d}", replica=replica, node=node))
        s.now += 1
    for key, seconds in spec.hot.items():
        s.conditions[ref(key)] = "hot"
        s.hot_since[ref(key)] = s.now - seconds
    s.refresh()
    return s


def rank(view: View, reservation: Reservation, running: Mapping[str, int]) -> tuple[int, int]:
    """(class rank, at minimum), the plan's two documented primary keys, worked out here."""
    facility = view.facility
    settings_ = facility.models.get(reservation.model)
    klass = reservation.replica.get("class") or (settings_.class_ if settings_ else None)
    class_rank = facility.classes.index(klass) if klass in facility.classes else -1
    minimum = settings_.minimum_replicas if settings_ else 0
    return class_rank, int(running.get(reservation.model, 0) <= minimum)


def check_plan(view: View, result: Plan, hot_for: float) -> None:
    """Order, critical minimums, one move per domain and per replica, and every move to a
    node outside its domain that the placement rules accept, on the view with the earlier
    moves made (built here from scratch)."""
    reservations = dict(view.reservations)
    running: dict[str, int] = {}
    for reservation in reservations.values():
        running[reservation.model] = running.get(reservation.model, 0) + 1
    total = dict(running)
    moved: set[str] = set()
    for entry in result.entries:
        domain = ref(entry["domain"])
        assert len(entry["moves"]) <= 1
        if entry["moves"]:
            assert entry["shed"] and view.snapshot.hot_seconds[domain] >= hot_for
        for move in entry["moves"]:
            rid = move["reservation"]
            assert rid not in moved
            moved.add(rid)
            chosen = reservations[rid]
            assert domain in view.reservation_domains(chosen)
            # Nothing ranked before it in this domain was passed over without a reason.
            skipped = {skip["reservation"] for skip in entry["skipped"]}
            for other in reservations.values():
                if other.id == rid or other.id in moved or "+" in other.id:
                    continue
                if domain in view.reservation_domains(other) and rank(view, other, running) < (
                    rank(view, chosen, running)
                ):
                    assert other.id in skipped, (other.id, rid, entry)
            # The destination, judged by the placement rules on the state after the moves.
            now_view = View(
                view.facility, view.snapshot, view.now, view.fresh, view.missing,
                reservations, view.holds,
            )  # fmt: skip
            node = now_view.node(move["to"])
            assert domain not in (view.membership(move["to"]) or ())
            replica = Replica.model_validate(chosen.replica)
            verdict = judge(now_view, replica, node, now_view.site_gpu_limit_watts)
            assert not verdict.refusals, (move, verdict.refusals)
            assert node.gpus is None or node.gpus - node.reserved_gpus >= replica.gpus
            del reservations[rid]
            reservations[f"{rid}+"] = dataclasses.replace(
                chosen,
                id=f"{rid}+",
                node=move["to"],
                estimate_watts=verdict.estimate.watts,
                domains=view.membership(move["to"]) or (),
            )
            running[chosen.model] -= 1
    for model, settings_ in view.facility.models.items():
        if settings_.critical:
            moves = total.get(model, 0) - running.get(model, 0)
            assert moves <= max(0, total.get(model, 0) - settings_.minimum_replicas)


@SETTINGS
@given(specs())
def test_a_plan_keeps_the_order_the_critical_minimums_and_moves_only_where_there_is_room(
    spec: Spec,
):
    s = build(spec)
    try:
        view = s.state.view()
        result = s.plan()
        check_plan(view, result, 60.0)
        event(f"moves: {min(result.moves, 2)}")
        event(f"skipped: {min(sum(len(e['skipped']) for e in result.entries), 2)}")
    finally:
        s.store.close()


@SETTINGS
@given(
    specs(),
    st.lists(st.tuples(st.sampled_from([10, 45, 70, 130, 130]), st.booleans()), max_size=12),
)
def test_one_replica_per_domain_per_interval_however_the_scheduler_acts(
    spec: Spec, steps: list[tuple[int, bool]]
):
    """Plans over time, the scheduler carrying out each move or not: moves off any one domain
    are at least `interval` apart, and every move carried out is accepted where it goes."""
    s = build(spec)
    interval = 120.0
    departures: dict[DomainRef, list[float]] = {}
    try:
        for seconds, act in [(0, True), *steps]:
            s.tick(seconds)
            view = s.state.view()
            result = s.plan()
            check_plan(view, result, 60.0)
            if not act:
                continue
            for entry in result.entries:
                for move in entry["moves"]:
                    left = view.reservation_domains(view.reservations[move["reservation"]])
                    assert s.execute(move), move
                    for domain in left:
                        if domain in {ref(e["domain"]) for e in result.entries if e["shed"]}:
                            departures.setdefault(domain, []).append(s.now)
        event(f"domains with 2+ moves: {sum(len(t) > 1 for t in departures.values())}")
        for domain, times in departures.items():
            gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
            assert all(gap >= interval for gap in gaps), (domain, times)
    finally:
        s.store.close()


@SETTINGS
@given(specs())
def test_after_accepted_placements_either_feed_of_a_dual_fed_rack_carries_it_alone(spec: Spec):
    s = build(spec)
    try:
        view = s.state.view()
        derating = view.facility.defaults.derating
        for key, declared in view.facility.domains.items():
            if len(declared.feeds) != 2:
                continue
            load = view.domain(ref(key)).load
            for lost, kept in (declared.feeds, declared.feeds[::-1]):
                assert load <= kept.rating_watts * derating * (1 + 1e-9)
                entry = next(e for e in failover(view, lost.pdu)["domains"] if e["domain"] == key)
                assert entry["over"] is False and entry["moves"] == [], entry
                half = load > kept.rating_watts * derating / 2
                event(f"dual-fed rack loaded past half its feed: {half}")
    finally:
        s.store.close()


# --- on a real decider ---------------------------------------------------------------------


API_FACILITY = {
    "mode": "enforce",
    "shedding": {"enabled": True, "hot_for": "10m", "interval": "5m"},
    "classes": CLASSES,
    "models": MODELS,
    "domains": {
        "rack/r1": {
            "feeds": [{"pdu": "r1-a", "rating_watts": 5000}, {"pdu": "r1-b", "rating_watts": 5000}]
        },
        "rack/r2": {"cap_watts": 20_000},
    },
}


def test_the_calls_metric_and_cli_on_a_real_decider(tmp_path: Path, capsys):
    from llmgw_facility import cli

    readings = Readings(
        membership={node: list(keys) for node, keys in MEMBERSHIP.items()}
        | {"a1": ["rack/r1", "row/1", "pdu/r1-a", "pdu/r1-b"]},
        inventory=["rack/r1", "rack/r2", "row/1"],
        conditions={"rack/r1": "ok", "rack/r2": "ok", "row/1": "ok"},
        gpus=dict.fromkeys(MEMBERSHIP, 8),
        limits=dict.fromkeys(MEMBERSHIP, 700.0),
    )
    fake = FakePrometheus(readings)
    decider_ = Decider(tmp_path / "decider", fake.url, API_FACILITY)
    try:
        decider_.start(wait_ready=True)
        decider_.wait_fresh()
        replica = {"model": "embed", "profile": "p", "gpus": 1, "power_watts": 2000}
        assert decider_.reserve("e1", "a1", replica).status_code == 201

        quiet = decider_.get("/v1/shedding").json()
        assert (quiet["enabled"], quiet["plan"], quiet["summary"]) == (
            True,
            [],
            "no domain is hot: nothing to shed",
        )
        fake.readings.conditions["rack/r1"] = "hot"
        fake.readings.hot["rack/r1"] = 700.0
        answer = poll_plan(decider_)
        (entry,) = answer["plan"]
        (move,) = entry["moves"]
        assert (entry["domain"], move["reservation"], move["from"]) == ("rack/r1", "e1", "a1")
        assert move["to"] in ("b1", "b2")
        text = decider_.metrics()
        assert metric_value(text, "llmgw_decider_shedding_moves", kind="rack", domain="r1") == 1
        assert metric_value(text, "llmgw_decider_shedding_enabled") == 1

        failed = decider_.get("/v1/failover", params={"domain": "pdu/r1-a"}).json()
        (rack,) = failed["domains"]
        assert (rack["domain"], rack["over"], rack["load_watts"], rack["limit_watts"]) == (
            "rack/r1",
            False,
            2000.0,
            4000.0,
        )
        bad = decider_.get("/v1/failover", params={"domain": "rack/r1"})
        assert bad.status_code == 422 and "not a pdu" in bad.json()["detail"]
        unknown = decider_.get("/v1/failover", params={"domain": "pdu/nope"})
        assert unknown.status_code == 404 and "no pdu 'nope'" in unknown.json()["detail"]

        base = ["--decider", decider_.url]
        capsys.readouterr()
        assert cli.main(["shedding", *base]) == 0
        out = capsys.readouterr().out
        assert "rack/r1" in out and "e1" in out and f"a1 -> {move['to']}" in out
        # The alternative to the move: r1's reservation is all its load (no measurement).
        assert entry["power_capping"]["why"] == ["hot"]
        assert f"  or cap instead: {entry['power_capping']['reason']}\n" in out
        assert cli.main(["failover", "r1-a", *base]) == 0
        out = capsys.readouterr().out
        assert "loss of pdu r1-a: 1 domain(s) fed, 0 over what survives" in out
        assert cli.main(["failover", "pdu/r1-a", "--json", *base]) == 0
        assert json.loads(capsys.readouterr().out)["pdu"] == "r1-a"
    finally:
        decider_.close()
        fake.close()


def poll_plan(decider_: Decider) -> dict[str, Any]:
    from tests.decider_harness import poll

    return poll(
        lambda: (a := decider_.get("/v1/shedding").json())["moves"] and a,
        "a shedding plan with a move",
    )


# --- capping instead of moving ------------------------------------------------------------


def test_the_plan_offers_a_power_cap_beside_each_move_and_for_warm_domains():
    """r1 hot holds 2 + 3 kW reserved on 16 GPUs at 700 W: capping's target is 10 % below
    the load, 4.5 kW, so 500 W off 16 GPUs: 16 × (700 − L) ≥ 500 → L = 668 W (the highest
    whole watt). r2 warm holds 1 kW: 100 W off its 16 GPUs → 693 W, listed at the top level,
    because r2 has no entry (it is not hot). The hot rack's cap is judged on the site
    before the plan's moves."""
    with worked_site() as s:
        s.reserve("a1", 2000, "embed")
        s.reserve("a2", 3000, "summarise")
        s.reserve("b1", 1000, "summarise")
        s.conditions[ref("rack/r2")] = "warm"
        s.heat("rack/r1", 3600)
        result = s.plan()
        (entry,) = result.entries
        assert len(entry["moves"]) == 1  # capping is an alternative: the move is still there
        cap = entry["power_capping"]
        assert (cap["kind"], cap["domain"], cap["why"]) == ("rack", "r1", ["hot"])
        assert (cap["load_watts"], cap["target_watts"], cap["reduce_watts"]) == (
            5000.0,
            4500.0,
            500.0,
        )
        assert (cap["gpus"], cap["gpu_limit_watts"], cap["actuated"]) == (16, 668.0, False)
        (warm,) = result.as_json(600, 300)["power_capping"]
        assert (warm["domain"], warm["why"], warm["gpu_limit_watts"]) == ("r2", ["warm"], 693.0)


def test_a_metrics_scrape_leaves_the_power_caps_unworked(monkeypatch):
    """/metrics reads the plan's moves alone; the caps of the warm domains (about a second
    at 10,000 nodes, docs/benchmarks.md) are worked out only for an answer that shows them."""
    from prometheus_client import CollectorRegistry, generate_latest

    from decider.shedding import planner
    from decider.shedding.collector import SheddingCollector

    worked_out: list[int] = []
    capping_elsewhere = planner.capping_elsewhere

    def counted(view: Any) -> list[dict[str, Any]]:
        worked_out.append(1)
        return capping_elsewhere(view)

    monkeypatch.setattr(planner, "capping_elsewhere", counted)
    with site({"domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        s.conditions[ref("rack/r1")] = "warm"
        s.refresh()
        registry = CollectorRegistry()
        registry.register(SheddingCollector(s.shedder))
        assert b"llmgw_decider_shedding_enabled 0.0" in generate_latest(registry)
        assert worked_out == []
        (warm,) = s.plan().as_json(600, 300)["power_capping"]
        assert warm["domain"] == "r1" and worked_out == [1]


def test_capping_is_offered_with_shedding_disabled_and_nothing_for_a_cool_site():
    """r1 warm with 2 kW reserved: 200 W off its 16 GPUs → 700 − 12.5 → 687 W."""
    with site({"domains": RACKS}, MEMBERSHIP) as s:
        s.reserve("a1", 2000, "embed")
        assert s.plan().as_json(600, 300)["power_capping"] == []
        s.conditions[ref("rack/r1")] = "warm"
        s.refresh()
        (warm,) = s.plan().as_json(600, 300)["power_capping"]
        assert (warm["domain"], warm["reduce_watts"], warm["gpu_limit_watts"]) == (
            "r1",
            200.0,
            687.0,
        )


THREE_RACKS = {**MEMBERSHIP, "c1": ["rack/r3", "row/1"]}


def test_shedding_opted_in_per_domain_as_well_as_site_wide():
    """`shedding: true` on a domain sheds it with the site's switch off; `shedding: false`
    keeps a site-wide opt-in off one domain (issue 17 part 4). Rack r3 is the cool one."""
    racks = {"rack/r1": {"cap_watts": 20_000, "shedding": True}, "rack/r2": {"cap_watts": 20_000}}
    off = {"shedding": {**SHEDDING, "enabled": False}, "domains": racks}
    with site(off, THREE_RACKS) as s:
        s.reserve("a1", 2000, "embed")
        s.reserve("b1", 2000, "embed")
        s.heat("rack/r1", 3600)
        s.heat("rack/r2", 3600)
        result = s.plan()
        assert result.enabled
        by_domain = {e["domain"]: e for e in result.entries}
        assert by_domain["rack/r1"]["shed"] and len(by_domain["rack/r1"]["moves"]) == 1
        assert not by_domain["rack/r2"]["shed"] and by_domain["rack/r2"]["moves"] == []
        assert by_domain["rack/r2"]["reason"].endswith(
            "; not shed: shedding is off for rack r2 (facility file: not opted in)"
        )
    racks = {"rack/r1": {"cap_watts": 20_000, "shedding": False}, "rack/r2": {"cap_watts": 20_000}}
    with site({"shedding": SHEDDING, "domains": racks}, THREE_RACKS) as s:
        s.reserve("a1", 2000, "embed")
        s.reserve("b1", 2000, "embed")
        s.heat("rack/r1", 3600)
        s.heat("rack/r2", 3600)
        by_domain = {e["domain"]: e for e in s.plan().entries}
        assert by_domain["rack/r1"]["moves"] == []
        assert by_domain["rack/r1"]["reason"].endswith(
            "; not shed: shedding is off for rack r1 (facility file: its shedding: false)"
        )
        assert by_domain["rack/r2"]["shed"]


def test_failover_reads_a_racks_own_derating():
    """Rack r1 derates its feeds to 0.6 (the site's 0.8 elsewhere): feed b of 10 kW carries
    6 kW; 7 kW measured is over it (issue 17 part 6)."""
    feeds = [{"pdu": "a", "rating_watts": 10_000}, {"pdu": "b", "rating_watts": 10_000}]
    racks = {"rack/r1": {"feeds": feeds, "derating": 0.6}, "rack/r2": {"cap_watts": 20_000}}
    with site({"domains": racks}, {"a1": ["rack/r1"], "b1": ["rack/r2"]}) as s:
        s.measured[ref("rack/r1")] = 7000
        s.refresh()
        (r1,) = failover(s.state.view(), "a")["domains"]
        assert (r1["over"], r1["limit_watts"]) == (True, 6000.0)
        assert r1["reason"].startswith(
            "rack r1 over its surviving feeds: 7.0 kW measured on b: 7.0 kW per feed of "
            "6.0 kW (rating × derating 0.6)"
        )
