"""The cached placement answer (decider/placement/answers.py) against a fresh `decide`.

Whatever the View went through (reservations made, confirmed, released and expired, holds
put on and taken off racks, rows and the site, refreshes with other readings, a reload of
the facility file), `answers.place` must give the bytes of
`to_json(decide(view, replica, candidates).as_json())`, and the same order, summary and
refusal counts, for any candidates in any order, whether its entries were worked out on
this View, carried over from the View before, or both; through the C loop and through its
Python stand-in alike (decider.placement.entry_index: every test runs with each).

The site: row/1 of racks r1 and r2, budgeted tight enough to bind before its racks do,
row/2 of r3, r4 and r5 with no budget, a room and a site with caps; rack r3 hot, r4 over its
cap, r5 warm;
one three-phase pdu (r1-a); a node without a GPU limit, one without a GPU count, one whose
membership is unknown.
"""

from __future__ import annotations

import gc
import tempfile
import weakref
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from decider.facility import DomainRef
from decider.models import Replica
from decider.placement import answers, decide, tallies
from decider.placement import view as view_module
from decider.placement.entry_index import EntryIndexInPython
from decider.placement.view import View
from tests import placement_helpers
from tests.decider_harness import Decider, FakePrometheus, Readings
from tests.placement_helpers import (
    CANDIDATES,
    DOMAINS,
    NODES,
    NOW,
    PHASE_NODES,
    SHAPES,
    Site,
    facility,
    make_facility,
    readings,
    replica,
)


@pytest.fixture(autouse=True, params=["c", "python"])
def joined_through(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test through the C EntryIndex, and again through the Python one, which a
    package built without a C compiler runs."""
    if request.param == "python":
        monkeypatch.setattr(answers, "EntryIndex", EntryIndexInPython)
    return str(request.param)


#: Power budgets enforced, thermal observed (issue 17 part 4's staged rollout).
STAGED: Any = {"power": "enforce", "thermal": "observe"}


def assert_as_decide(view: View, rep: Replica, candidates: list[str]) -> answers.Answer:
    """The cached answer is `decide`'s (placement_helpers.assert_as_decide), and so is the
    uncached one that decider.yaml's `placement_cache: false` serves, in every part."""
    got = placement_helpers.assert_as_decide(view, rep, candidates)
    direct = answers.uncached(view, rep, candidates)
    assert (direct.body, direct.order, direct.summary, direct.mode) == (
        got.body,
        got.order,
        got.summary,
        got.mode,
    )
    assert (direct.judged, direct.refused, direct.refusals_by_rule) == (
        got.judged,
        got.refused,
        got.refusals_by_rule,
    )
    assert list(direct.refusals) == list(got.refusals)
    # The metrics' split: refusals applied, and those an observed concern would make.
    expected = tallies(decide(view, rep, candidates).verdicts)
    assert (got.applied_by_rule, got.observed_by_rule) == expected
    assert (direct.applied_by_rule, direct.observed_by_rule) == expected
    return got


def new_site(path: Path, mode: str = "enforce") -> Site:
    return Site(path / "decider.db", facility(mode), readings(), (), {})


# --- the answers themselves ------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["enforce", "observe", STAGED])
def test_the_cached_answer_is_decides_on_a_first_and_a_second_request(
    tmp_path: Path, mode: str
) -> None:
    site = new_site(tmp_path, mode)
    view = site.view()
    for rep in SHAPES:
        first = assert_as_decide(view, rep, CANDIDATES)
        again = assert_as_decide(view, rep, list(reversed(CANDIDATES)))
        assert again.body != first.body  # the scheduler's order is the request's
        assert_as_decide(view, rep, CANDIDATES[3:9])
        assert_as_decide(view, rep, [])
    # The site gives every part of the answer work: refusals, gaps, unknown membership.
    answer = answers.place(view, SHAPES[0], CANDIDATES)
    assert {"hot", "over_cap"} <= set(answer.refusals_by_rule)
    assert any(
        "membership unknown for node ghost" in note
        for note in decide(view, SHAPES[0], CANDIDATES).missing
    )


def test_entries_carry_over_a_reservation_only_where_nothing_they_read_changed(
    tmp_path: Path,
) -> None:
    site = new_site(tmp_path)
    rep = SHAPES[0]
    before = site.view()
    assert_as_decide(before, rep, CANDIDATES)
    old = answers.shape(before, rep).entries
    outcome = site.reserve("r5-1", rep)  # rack r5, row 2 (no budget), room, site
    assert outcome.reservation is not None
    after = site.view()
    assert after is not before
    assert_as_decide(after, rep, CANDIDATES)
    new = answers.shape(after, rep).entries
    # Rack r5's nodes are worked out again (their rack's load changed); racks r1's and r2's
    # nodes sit in row/1, whose room binds them and did not change, and keep their entries.
    assert all(new[node] is not old[node] for node in ("r5-1", "r5-2", "r5-3"))
    assert all(new[node] is old[node] for node in ("r1-1", "r1-2", "r1-3", "r2-1"))


def test_a_view_after_a_reservation_takes_the_entries_over_in_bulk(tmp_path: Path) -> None:
    # Made by the change (answers.prepare), before any placement asks: the earlier shape's
    # entries, less the reserved rack's nodes, which are worked out again.
    site = new_site(tmp_path)
    rep = SHAPES[0]
    before = site.view()
    assert_as_decide(before, rep, CANDIDATES)
    old = answers.shape(before, rep).entries
    assert site.reserve("r5-1", rep).reservation is not None
    after = site.view()
    taken = answers.shape(after, rep).entries
    redone = {"r5-1", "r5-2", "r5-3"}
    assert set(taken) == set(old)
    assert all((taken[node] is old[node]) == (node not in redone) for node in taken)
    assert_as_decide(after, rep, [])
    assert_as_decide(after, rep, CANDIDATES)
    # A hold on the row of racks r1 and r2 changes its refusals: its nodes are dropped.
    site.state.hold(DomainRef("row", "1"), "test")
    held = site.view()
    row = {"r1-1", "r1-2", "r1-3", "r2-1"}
    now = answers.shape(held, rep).entries
    assert all((now[node] is taken[node]) == (node not in row) for node in row | {"r3-1"})
    assert_as_decide(held, rep, [])
    assert_as_decide(held, rep, CANDIDATES)


def test_a_row_that_binds_after_a_reservation_is_seen_by_every_node_of_it(
    tmp_path: Path,
) -> None:
    site = new_site(tmp_path)
    rep = replica(4)  # 4 × 700 + 200 = 3,000 W
    first = assert_as_decide(site.view(), rep, CANDIDATES)
    assert "r2-1" in first.order
    # row/1: limit 13,500 W, measured 10,000, so 3,500 of room binds its nodes (rack r2 has
    # 14,000). Its load is the larger of reserved and measured: three reservations in r2
    # leave it at 10,000, the fourth makes it 12,000 and its nodes are refused for the row.
    for node in ("r2-1", "r2-2", "r2-3", "r2-1"):
        assert site.reserve(node, rep).reservation is not None
        assert_as_decide(site.view(), rep, CANDIDATES)
    answer = assert_as_decide(site.view(), rep, CANDIDATES)
    assert "r2-1" not in answer.order
    assert any(node == "r1-3" and "row 1" in reason for node, reason in answer.refusals)


def test_a_node_past_its_room_names_a_row_that_passed_its_limit_since(tmp_path: Path) -> None:
    # Rack r1: limit 18,000 W, load 17,000 + 500 other: 500 W of room, below row/1's 3,500
    # (limit 13,500, measured 10,000). A 3,000 W replica is refused on r1's nodes for the
    # rack alone, until the fourth reservation in r2 takes row/1's load to 12,000 W
    # (reserved, above measured): the row is past its limit too and named, with its figures,
    # though its room (1,500) still does not bind r1's nodes.
    site = Site(tmp_path / "decider.db", facility(), readings(rack_r1=17_000.0), (), {})
    rep = replica(4)
    assert_as_decide(site.view(), rep, CANDIDATES)
    for node in ("r2-1", "r2-2", "r2-3", "r2-1"):
        assert site.reserve(node, rep).reservation is not None
        assert_as_decide(site.view(), rep, CANDIDATES)
    refusals = assert_as_decide(site.view(), rep, CANDIDATES).refusals
    assert any(node == "r1-3" and reason.startswith("row 1: 12") for node, reason in refusals)


def test_holds_releases_refreshes_and_reloads(tmp_path: Path) -> None:
    site = new_site(tmp_path)
    state = site.state
    from decider.facility import DomainRef

    steps = [
        lambda: state.hold(DomainRef("rack", "r1"), "maintenance"),
        lambda: state.hold(DomainRef("row", "2"), "cooling work"),
        lambda: state.release_hold(DomainRef("rack", "r1")),
        lambda: state.hold(DomainRef("site", "s"), "drill"),
        lambda: state.release_hold(DomainRef("site", "s")),
        lambda: state.set_snapshot(readings(1.3)),
        lambda: state.release_hold(DomainRef("row", "2")),
        lambda: state.set_facility(facility("observe"), 300.0, state._staleness),
        lambda: state.set_facility(facility(), 300.0, state._staleness),
    ]
    for step in steps:
        for rep in SHAPES[:2]:
            assert_as_decide(site.view(), rep, CANDIDATES)
        step()
        for rep in SHAPES[:2]:
            assert_as_decide(site.view(), rep, CANDIDATES)


def test_a_rack_room_too_large_to_pack_orders_as_decide_does(tmp_path: Path) -> None:
    huge = {**DOMAINS, "rack/r5": {"cap_watts": 1e10}}  # the most a facility file takes
    big = make_facility(huge, nodes=PHASE_NODES, node_share_watts=400)
    site = Site(tmp_path / "decider.db", big, readings(), (), {})
    rep = replica(1, power_watts=1.0)  # rack r5: room for ~9e9 more of them
    view = site.view()
    assert_as_decide(view, rep, CANDIDATES)
    assert not answers.shape(view, rep).packed


# --- whatever happens to the View ------------------------------------------------------------

NODE = st.sampled_from(list(NODES))
DOMAIN = st.sampled_from(["rack/r1", "rack/r3", "pdu/r1-a", "row/1", "row/2", "site/s"])
STEP = st.one_of(
    st.tuples(st.just("reserve"), NODE, st.integers(0, len(SHAPES) - 1)),
    st.tuples(st.just("release"), st.integers(0, 20)),
    st.tuples(st.just("confirm"), st.integers(0, 20)),
    st.tuples(st.just("hold"), DOMAIN),
    st.tuples(st.just("release_hold"), DOMAIN),
    st.tuples(st.just("refresh"), st.floats(0.2, 1.6)),
    st.tuples(st.just("expire")),
    st.tuples(st.just("ask"), st.integers(0, len(SHAPES) - 1), st.permutations(CANDIDATES)),
)


def apply(site: Site, step: tuple[Any, ...]) -> None:
    from decider.facility import DomainRef

    state = site.state
    kind = step[0]
    ids = [r.id for r in state.reservations()]
    if kind == "reserve":
        site.reserve(step[1], SHAPES[step[2]])
    elif kind == "release" and ids:
        state.release(ids[step[1] % len(ids)])
    elif kind == "confirm" and ids:
        state.confirm(ids[step[1] % len(ids)])
    elif kind in ("hold", "release_hold"):
        domain = DomainRef.parse(step[1])
        state.hold(domain, "test") if kind == "hold" else state.release_hold(domain)
    elif kind == "refresh":
        state.set_snapshot(readings(step[1]))
    elif kind == "expire":
        site.now = NOW + 301  # past the TTL: the unconfirmed go
        state.expire()
        site.now = NOW
    elif kind == "ask":
        assert_as_decide(site.view(), SHAPES[step[1]], step[2][: len(step[2]) // 2 + 1])


ASKED = st.sampled_from(["nothing", "no candidates", "a few", "every node"])


@given(
    steps=st.lists(st.tuples(STEP, ASKED), min_size=1, max_size=30),
    mode=st.sampled_from(["enforce", "observe", STAGED]),
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_whatever_the_view_went_through_the_answer_is_decides(
    steps: list[tuple[tuple[Any, ...], str]], mode: str
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        site = new_site(Path(directory), mode)
        try:
            assert_as_decide(site.view(), SHAPES[0], CANDIDATES)
            for step, asked in steps:
                apply(site, step)
                # Asked about every node, a few or none after a change: entries come from
                # the View before, or one further back.
                if asked == "every node":
                    assert_as_decide(site.view(), SHAPES[0], CANDIDATES)
                elif asked == "a few":
                    assert_as_decide(site.view(), SHAPES[0], CANDIDATES[-4:])
                elif asked == "no candidates":  # the shape is made: it takes entries over
                    assert_as_decide(site.view(), SHAPES[0], [])
            assert_as_decide(site.view(), SHAPES[0], list(reversed(CANDIDATES)))
            assert_as_decide(site.view(), SHAPES[1], CANDIDATES)
        finally:
            site.store.close()


def test_a_refresh_works_out_the_shapes_asked_about_before_it(tmp_path: Path) -> None:
    site = new_site(tmp_path)
    assert_as_decide(site.view(), SHAPES[1], CANDIDATES[:2])
    before = site.view()
    site.state.set_snapshot(readings(0.8))
    after = site.view()
    assert after is not before
    warmed = answers.shape(after, SHAPES[1]).entries
    assert set(warmed) == set(NODES)  # every member; "ghost" has no membership to warm
    assert SHAPES[0] not in after.__dict__[answers.CACHE]  # never asked about
    assert_as_decide(after, SHAPES[1], CANDIDATES)
    assert answers.shape(after, SHAPES[1]).entries["r1-1"] is warmed["r1-1"]


def test_a_view_is_freed_without_the_garbage_collector_once_no_later_one_needs_it(
    tmp_path: Path,
) -> None:
    site = new_site(tmp_path)
    rep = SHAPES[0]
    assert_as_decide(site.view(), rep, CANDIDATES)
    first = weakref.ref(site.view())
    gc.disable()
    try:
        for number in range(answers.CARRY_DEPTH + 2):
            site.reserve(f"r1-{1 + number % 3}", rep)
            site.state.release(f"res-{site.ids}")
            answers.place(site.view(), rep, CANDIDATES)
        assert first() is None
    finally:
        gc.enable()


def test_writes_during_a_refresh_are_in_the_view_swapped_in_which_keeps_its_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from decider.facility import DomainRef

    site = new_site(tmp_path)
    assert_as_decide(site.view(), SHAPES[0], CANDIDATES)
    warm = answers.warm
    warmed: list[View] = []

    def warm_then_write(view: View, before: View) -> None:
        warm(view, before)  # then writes, as a scheduler would meanwhile
        warmed.append(view)
        assert site.reserve("r5-1", SHAPES[0]).reservation is not None
        site.state.hold(DomainRef("rack", "r2"), "cooling")

    monkeypatch.setattr(answers, "warm", warm_then_write)
    snapshot = readings(0.9)
    site.state.set_snapshot(snapshot)
    view = site.view()
    assert view.snapshot is snapshot and view is not warmed[0]
    assert f"res-{site.ids}" in view.reservations
    assert DomainRef("rack", "r2") in view.holds
    assert_as_decide(view, SHAPES[0], CANDIDATES)
    # Rack r1's nodes keep what the refresh worked out (row/1 binds them, and neither
    # write changed it); those of the held rack and the reserved one are worked out again.
    kept = answers.shape(warmed[0], SHAPES[0]).entries
    now = answers.shape(view, SHAPES[0]).entries
    assert all(now[node] is kept[node] for node in ("r1-1", "r1-2", "r1-3"))
    assert all(now[node] is not kept[node] for node in ("r2-1", "r2-2", "r5-1"))


# --- a change prepares the next placement's shapes (answers.prepare) -------------------------


def test_a_change_prepares_the_shapes_asked_about_lately(tmp_path: Path) -> None:
    site = new_site(tmp_path)
    asked, other = SHAPES[0], SHAPES[1]
    assert_as_decide(site.view(), asked, CANDIDATES)
    assert_as_decide(site.view(), other, CANDIDATES)
    old = answers.shape(site.view(), asked).entries
    assert site.reserve("r5-1", asked).reservation is not None
    after = site.view()
    made = after.__dict__[answers.CACHE]  # before any placement on the new View
    assert set(made) == {asked, other}
    taken = made[asked].entries  # in bulk, the reserved rack's nodes worked out again
    assert set(taken) == set(old)
    redone = {"r5-1", "r5-2", "r5-3"}
    assert all((taken[node] is old[node]) == (node not in redone) for node in taken)
    assert_as_decide(after, asked, CANDIDATES)
    # Only `asked` is asked from now on: `other` is prepared for PREPARED_IDLE changes more.
    rack = DomainRef("rack", "r3")
    for number in range(answers.PREPARED_IDLE + 1):
        if number % 2 == 0:
            site.state.hold(rack, "test")
        else:
            site.state.release_hold(rack)
        assert (other in site.view().__dict__[answers.CACHE]) == (
            number + 2 <= answers.PREPARED_IDLE
        )
        assert_as_decide(site.view(), asked, CANDIDATES[:2])
    cache = site.view().__dict__[answers.CACHE]
    assert asked in cache and other not in cache
    assert_as_decide(site.view(), other, CANDIDATES)  # made when asked, from its lineage


def test_fill_keeps_the_views_it_reads_while_a_change_cuts_the_chain(tmp_path: Path) -> None:
    # `prepare` runs in the mutating request's thread and cuts a shape's chain of earlier
    # Views while a placement on the event loop's thread may be filling a shape from it.
    site = new_site(tmp_path)
    rep = SHAPES[0]
    assert_as_decide(site.view(), rep, CANDIDATES)
    assert site.reserve("r5-1", rep).reservation is not None
    view = site.view()
    made = answers.shape(view, rep)
    assert made.previous is not None and made.previous_view is not None
    earlier = weakref.ref(made.previous_view)
    name = "r1-1"  # its state did not change: carried over from the View before
    carried = made.entries.pop(name)

    class CutMeanwhile(list[str]):
        def __iter__(self) -> Any:
            # What a change on another thread does: the chain cut, the View before gone.
            made.previous_view = None
            view.__dict__[answers.LINEAGE].pop(rep)
            gc.collect()
            assert earlier() is not None  # fill holds it while it reads it
            return super().__iter__()

    made.fill(CutMeanwhile([name]))
    assert made.entries[name] is carried
    assert earlier() is None  # freed once fill is done
    assert_as_decide(view, rep, CANDIDATES)


def test_a_change_leaves_its_view_out_of_the_collectors_young_generations(
    tmp_path: Path,
) -> None:
    # A collection would otherwise walk the new View's dicts again and again (State._build).
    site = new_site(tmp_path)
    rep = SHAPES[0]
    assert_as_decide(site.view(), rep, CANDIDATES)
    assert site.reserve("r5-1", rep).reservation is not None
    view = site.view()
    made = (view.__dict__["_nodes"], answers.shape(view, rep).entries)
    young = {id(found) for generation in range(3) for found in gc.get_objects(generation)}
    assert not any(id(mine) in young for mine in made)
    assert gc.get_freeze_count() > 0


def test_a_change_that_redoes_many_nodes_leaves_them_to_the_placements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A hold on the site changes every node's refusals: past PREPARED_NODES, the change
    # leaves them to the placements that ask (monkeypatched down to this small site).
    monkeypatch.setattr(answers, "PREPARED_NODES", 4)
    site = new_site(tmp_path)
    rep = SHAPES[0]
    assert_as_decide(site.view(), rep, CANDIDATES)
    site.state.hold(DomainRef("rack", "r1"), "test")  # 3 nodes: worked out by the change
    assert {"r1-1", "r1-2", "r1-3"} <= set(answers.shape(site.view(), rep).entries)
    site.state.hold(DomainRef("site", "s"), "test")  # every node
    assert not set(NODES) & set(answers.shape(site.view(), rep).entries)
    assert_as_decide(site.view(), rep, CANDIDATES)


# --- shared bases and overlays (decider.placement.overlay) -----------------------------------


@pytest.mark.parametrize("bound", [0, 4])
def test_answers_hold_across_many_writes_past_the_overlays_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bound: int
) -> None:
    # 0: every write that marks a node compacts its Views' caches into new bases; 4: some
    # share a base, some compact (a write marks a rack's 3 nodes).
    from decider.placement import overlay

    monkeypatch.setattr(overlay, "limit", lambda base_size: bound)
    site = new_site(tmp_path)
    state = site.state
    for rep in SHAPES[:2]:
        assert_as_decide(site.view(), rep, CANDIDATES)
    bases: list[dict[str, Any]] = []  # kept, so that no two are told apart by a reused id
    shared = 0
    placed = ["r5-1", "r1-2", "r5-3", "r2-1", "r1-3", "r5-2"]  # a reservation fits on each
    held = [DomainRef("rack", "r2"), DomainRef("row", "2"), DomainRef("pdu", "r1-a")]
    for number in range(18):
        before = site.view()
        step = number % 6
        if step in (0, 2):
            assert site.reserve(placed[number % 6 + number // 6], SHAPES[0]).reservation
        elif step in (1, 3):
            assert state.release(f"res-{site.ids}")
        elif step == 4:
            state.hold(held[number // 6], "test")
        else:
            state.release_hold(held[number // 6])
        view = site.view()
        assert view is not before
        assert len(view._nodes.over) <= bound
        if not any(base is view._nodes.base for base in bases):
            bases.append(view._nodes.base)
        shared += view._nodes.base is before._nodes.base
        assert_as_decide(view, SHAPES[number % 2], CANDIDATES[number % 5 :: 2])
        assert_as_decide(view, SHAPES[0], CANDIDATES)
        assert_as_decide(before, SHAPES[1], CANDIDATES)  # the View before, read after
    # Compacted again and again, and shared between writes (those that mark no node, the
    # row's hold, at either bound).
    assert len(bases) > 4 and shared > 0, (len(bases), shared)


def test_a_new_shapes_entries_go_into_its_index_once_placements_filled_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new shape fills its overlay, which EntryIndex.join looks up entry by entry in a dict;
    # past the overlay's bound a placement compacts it, so that later ones read the index.
    from decider.placement import overlay

    monkeypatch.setattr(overlay, "limit", lambda base_size: 2)
    view = new_site(tmp_path).view()
    assert_as_decide(view, SHAPES[0], CANDIDATES[:3])
    made = answers.shape(view, SHAPES[0])
    assert not made.entries.over and len(made.index()) == 3
    assert_as_decide(view, SHAPES[0], CANDIDATES[2:4])  # one more: within the bound
    assert len(made.entries.over) == 1 and len(made.index()) == 3
    assert_as_decide(view, SHAPES[0], CANDIDATES)
    # ghost, a name the site does not know, is answered but never kept (answers.py)
    assert not made.entries.over and len(made.index()) == len(CANDIDATES) - 1

    def no_fill(self: answers.Shape, names: list[str]) -> None:
        raise AssertionError(f"worked out again: {names}")

    monkeypatch.setattr(answers.Shape, "fill", no_fill)
    assert_as_decide(view, SHAPES[0], list(reversed(CANDIDATES)))


def test_a_node_state_goes_into_the_shared_base_only_where_every_view_agrees(
    tmp_path: Path,
) -> None:
    # A View whose node states were not all worked out (a reload's), then a write: the two
    # Views share one base; rack r5's nodes are marked stale in the later one's overlay.
    site = new_site(tmp_path)
    state = site.state
    state.set_facility(facility(), 300.0, state._staleness)
    rep = SHAPES[0]
    first = site.view()
    assert_as_decide(first, rep, ["r1-1"])
    assert site.reserve("r5-1", rep).reservation is not None
    second = site.view()
    assert second._nodes.base is first._nodes.base
    # Worked out on the later View first: into its overlay, which the earlier one does not
    # read; the earlier View then works out its own.
    assert_as_decide(second, rep, ["r5-2"])
    assert_as_decide(first, rep, ["r5-2"])
    assert first._nodes["r5-2"] is not second._nodes["r5-2"]
    # Worked out on the earlier View first: into the base, which the later View does not
    # read for a node its overlay marks stale.
    assert_as_decide(first, rep, ["r5-3"])
    assert_as_decide(second, rep, ["r5-3"])
    assert first._nodes["r5-3"] is not second._nodes["r5-3"]
    # A node the write did not touch: worked out once, for both.
    assert_as_decide(second, rep, ["r2-1"])
    assert first._nodes["r2-1"] is second._nodes["r2-1"]
    assert_as_decide(first, rep, CANDIDATES)
    assert_as_decide(second, rep, CANDIDATES)


def test_an_entry_filled_after_a_shape_is_shared_goes_into_its_own_overlay(
    tmp_path: Path,
) -> None:
    # row/1 (limit 13,500 W, measured 10,000): three 3,000 W reservations in rack r2 leave
    # its load at 10,000, a fourth takes it to 12,000, and r1-3 is refused for the row. The
    # View before the fourth never asked about r1-3; its shape's entries are shared by the
    # shape after it, which the fourth reservation's take_over made without r1-3.
    site = new_site(tmp_path)
    state = site.state
    rep = replica(4)
    for node in ("r2-1", "r2-2", "r2-3"):
        assert site.reserve(node, rep).reservation is not None
    state.set_facility(facility(), 300.0, state._staleness)
    first = site.view()
    assert_as_decide(first, rep, ["r5-1"])
    assert site.reserve("r2-1", rep).reservation is not None
    second = site.view()
    assert answers.shape(second, rep).entries.base is answers.shape(first, rep).entries.base
    allowed = assert_as_decide(first, rep, ["r1-3"])
    assert allowed.order == ["r1-3"]
    refused = assert_as_decide(second, rep, ["r1-3"])
    assert refused.order == [] and "row 1" in refused.refusals[0][1]


# --- decider.yaml's placement_cache: false, on a real decider -----------------------------------


@pytest.mark.servers
def test_a_decider_without_the_answer_cache_answers_as_one_with_it(tmp_path: Path) -> None:
    """The switch that rules the cache out: two deciders on one Prometheus, one with
    `placement_cache: false`, answer every placement alike: rack r2 hot (thermal observed), r3
    past its room, then r4 held."""
    membership = {f"n{i}": [f"rack/r{i}", "row/1"] for i in range(1, 5)}
    readings = Readings(
        membership=membership,
        inventory=["row/1"],
        measured={"rack/r3": 9_000},
        conditions={"rack/r2": "hot", "rack/r1": "warm"},
        gpus=dict.fromkeys(membership, 8),
        limits=dict.fromkeys(membership, 700.0),
    )
    site = {
        "mode": STAGED,
        "domains": {f"rack/r{i}": {"cap_watts": 10_000} for i in range(1, 5)},
    }
    fake = FakePrometheus(readings)
    cached = Decider(tmp_path / "cached", fake.url, site)
    direct = Decider(tmp_path / "direct", fake.url, site, placement_cache=False)
    try:
        for decider in (cached, direct):
            decider.start(wait_ready=True)
            decider.wait_fresh()
        rep = {"model": "llama", "profile": "p", "gpus": 1, "power_watts": 1_500}
        candidates = ["n4", "n3", "n2", "n1"]
        answer = cached.place(rep, candidates)
        assert answer["order"] == ["n4", "n2", "n1"]  # thermal observed: r2 allowed
        assert direct.place(rep, candidates) == answer
        for decider in (cached, direct):
            held = decider.post("/v1/domains/rack/r4/hold", json={"reason": "PDU swap"})
            assert held.status_code == 200, held.text
        answer = cached.place(rep, candidates)
        assert answer["order"] == ["n2", "n1"]
        assert direct.place(rep, candidates) == answer
    finally:
        for decider in (cached, direct):
            decider.close()
        fake.close()


def test_every_figure_a_view_caches_says_what_settle_does_with_it() -> None:
    """View.settle hands each figure the View before worked out to what the figure declares
    (decider.placement.view.figure), so that a figure added later cannot be carried over
    stale by omission: a plain cached_property on View is refused when the module loads."""
    cached = {name for name, attr in vars(View).items() if isinstance(attr, cached_property)}
    assert {each.attrname for each in view_module.FIGURES} == cached

    class Careless:
        @cached_property
        def new_figure(self) -> int:
            return 1

    with pytest.raises(TypeError, match="new_figure: a cached figure must say what settle"):
        view_module.check_figures(Careless)
