"""`POST /v1/placements`'s answer, encoded once per node per View and replica shape.

A node's verdict depends on the View and the replica alone; only its place in the
candidate list (the `scheduler_order` score) and which other nodes are asked about change
from one request to the next. So the first request that asks about a node on a View works
out its verdict with `decide`'s own rules (`judge` and the ordering keys) and encodes its
answer entry with `Decision.as_json` and pydantic-core's `to_json`, as an uncached answer
would; later requests on the same View with the same replica join the stored bytes. The
bytes are those of `to_json(decide(view, replica, candidates).as_json())`, byte for byte
(tests/test_placement_answers.py holds them to it across reservations, holds and
refreshes).

A View is rebuilt on every reservation, hold and refresh. A View made after a reservation
or a hold (`View.settle`) takes over the entries of an earlier View's shape for the nodes
whose verdict cannot have changed: the same node state (settle keeps those of the racks
and PDUs the change did not touch), and each of the node's row, room and site that was
replaced since has the same refusals and binds the node neither before nor after (its room
is above the node's least room; a node past its room also names it alike). When the shape
is made (`Shape.take_over`) this is done in bulk: the earlier shape's entries taken over
whole, less the nodes the change redid and, per row, room and site replaced (a change
replaces a few), the nodes it may bind or name otherwise. What that leaves out `fill`
carries over node by node from the View before (or up to CARRY_DEPTH shapes back) where it
can, or works out. After a refresh `warm` works out, on the refresher's thread and before
the View is swapped in, the entries of the replica shapes asked about lately.

Taken over whole, not copied: a shape's `entries` are a base dict shared with the shapes
before and after it and an overlay of its own (decider.placement.overlay); take_over copies
the earlier overlay (small) and marks what it drops there, and compacts both into a new
base past the overlay's bound; `warm` makes a refresh's entries one base. `place` reads the
overlay, then the base. Once shared, a base is never written: `fill` puts every entry it
sets into the shape's own overlay. Unlike a node's state, an entry worked out later on one
shape need not hold for another that shares the base: take_over checked for the next shape
only the entries the earlier one had (a row's new room binds the nodes whose least room is
above it, and an entry not yet worked out has none to compare), so an entry filled into the
base by the earlier shape would reach the later one unchecked, and one filled by the later
shape would reach the earlier. So only what take_over or compaction decided is shared.

`place` reads them in C (decider/placement/_entry_index.c, or its Python stand-in where the
package was built without a C compiler: decider.placement.entry_index): each base gets an
EntryIndex, a read-only table of its entries made once per base (`Shape.index`: by the
change or the refresh that made the base, else by the first placement that reads it), and
one call joins the candidates' entries, the overlay's first, into the answer's nodes and the
order. The loop in Python cost twice as much, most of it waiting on memory
(docs/benchmarks.md, "Where the time goes").

A shape holds its View weakly (the View holds its shapes), so a View's garbage has no
cycles and goes when the last reference does.

Only the site's nodes are kept: a candidate not in the snapshot's membership (the last one
read) is worked out for the answer that names it and dropped with it (`Shape.stranger`), so
that every cache here is bounded by the site's size, not by the names callers send
(issue 16: 25 placements of 100,000 made-up names held 590 MB until the next refresh).
"""

from __future__ import annotations

import math
import weakref
from collections import ChainMap, Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from pydantic_core import to_json

from decider.giving_way import PAUSE_EVERY, give_way_now, paced
from decider.models import Replica
from decider.placement import (
    Decision,
    Verdict,
    decide,
    judge,
    missing,
    observed,
    rules,
    tallies,
)
from decider.placement.entry_index import EntryIndex
from decider.placement.estimate import Estimate, estimate
from decider.placement.overlay import Layered
from decider.placement.states import Ask, DomainState, NodeState
from decider.placement.view import View

#: Replica shapes cached per View; past it the oldest shape is dropped.
SHAPES_KEPT = 16
#: Summaries kept per shape (by the counts they say).
SUMMARIES_KEPT = 256
#: Replica shapes a refresh works out again for the new View (the most recently asked), and
#: that a reservation, hold or release prepares on its View (`prepare`).
SHAPES_WARMED = 4
#: Changes since a replica shape was last asked about past which `prepare` leaves it to the
#: next placement that asks (each prepared shape costs the change about a millisecond).
PREPARED_IDLE = 4
#: Entries `prepare` works out per shape at most (those the bulk takeover left out): a
#: rack's and its PDUs' nodes, a row's; about 50 µs each.
PREPARED_NODES = 512
#: Per ordering score (decider.placement.rules.ORDER), its lowest packed value and bits: a
#: rank is the scores packed in one whole number below 2**53, so that it is a float exactly
#: (a list of floats sorts about 3 × faster than one of integers that large: CPython
#: compares floats directly).
_PACKING = rules.packing()
_PLACEHOLDER = b'"scheduler_order":0'
#: What follows an allowed node's `scheduler_order` value: the end of its `scores` and of
#: the node (Decision.as_json puts them last); EntryIndex.join writes it after the index.
_TAIL = b"}}"
#: Where a View keeps its shapes (its __dict__, as View.settle keeps its figures), and where
#: settle puts those of the View it started from.
CACHE = "_placement_answers"
LINEAGE = "_placement_answers_before"
#: Shapes of earlier Views an entry may be carried over from (the View before may have
#: been asked about fewer nodes, or not at all), and how many changes a shape nobody asks
#: about again is kept for.
CARRY_DEPTH = 8
LINEAGE_STEPS = 8


@dataclass(frozen=True, slots=True)
class Entry:
    """One node's part of the answer for one replica shape on one View."""

    name: str  # the node's
    verdict: Verdict
    #: The ordering scores that order (rules.ORDER, an observed concern's as 0) before the
    #: scheduler's order; None: refused.
    prefix: tuple[float, ...] | None
    #: The node's JSON object after a comma; for an allowed node up to its
    #: `scheduler_order` value, which the request fills in with the end of the object (_TAIL).
    head: bytes
    #: An allowed node's prefix as one float, ordered as the prefixes are (Shape.packed says
    #: whether every prefix fitted); None: refused.
    rank: float | None
    rules: tuple[str, ...]  # the rules that refuse it or would (observed), each once
    #: What the entry was worked out from, to tell whether a later View may take it over:
    #: the node's state and its least room, its row's, room's and site's included (their
    #: states: Shape.coarse).
    node: NodeState
    room: float | None
    past: bool  # past its least room: it names every domain past its limit
    #: It says something in `missing`: unknown membership or an estimate's gap.
    noted: bool


@dataclass(frozen=True, slots=True)
class _Moved:
    """A coarse tuple of the previous View's entries, in this View: `after`, the states
    now (None: some state's refusals changed, or it is gone: no entry carries over); `floor`,
    the least room among the states replaced, before and after (an entry carries over only
    if its own least room is below it: they bind it neither before nor after)."""

    before: tuple[DomainState, ...]
    after: tuple[DomainState, ...] | None
    floor: float | None
    changed: bool


@dataclass(frozen=True)
class Answer:
    """What the endpoint needs of a placement: the encoded body and figures to record."""

    mode: str
    order: list[str]
    body: bytes
    summary: str
    judged: int
    refused: int
    refusals_by_rule: Counter[str]  # applied and observed alike, as the summary counts
    #: (node, reason) of every refusal, for the status page's recent decisions.
    refusals: Sequence[tuple[str, str]]
    #: Per rule, the nodes refused, and those an observed concern would refuse (the metrics).
    applied_by_rule: Counter[str]
    observed_by_rule: Counter[str]


class Refusals(Sequence[tuple[str, str]]):
    """(node, reason) of every refusal of an answer, listed when first read: the status
    page's ring keeps them, and reads few of the answers it keeps."""

    def __init__(self, refused: list[Entry]) -> None:
        self._refused = refused
        self._listed: list[tuple[str, str]] | None = None

    def _all(self) -> list[tuple[str, str]]:
        if self._listed is None:
            self._listed = [
                (found.verdict.node.node, reason)
                for found in self._refused
                for _, reason in (*found.verdict.refusals, *found.verdict.would_refuse)
            ]
        return self._listed

    @overload
    def __getitem__(self, index: int) -> tuple[str, str]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, str]]: ...
    def __getitem__(self, index: int | slice) -> tuple[str, str] | list[tuple[str, str]]:
        return self._all()[index]

    def __len__(self) -> int:
        return len(self._all())

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        return list(self) == other if isinstance(other, Sequence) else NotImplemented


class Shape:
    """The entries of one replica shape on one View, worked out on first use."""

    def __init__(self, view: View, replica: Replica) -> None:
        # Weakly: the View holds its shapes, and a cycle would leave every View to the
        # cyclic garbage collector. The shape after this one holds this View (previous_view).
        self._view = weakref.ref(view)
        self.replica = replica
        self.site_limit = view.site_gpu_limit_watts
        #: Every concern enforced: no entry has a would_refuse, `place` counts the refused.
        self.enforcing = view.enforced.issuperset(rules.CONCERNS)
        #: Per node (a base shared with the shapes before and after, and this shape's own
        #: overlay: decider.placement.overlay); the base is never written once shared.
        self.entries: Layered[Entry] = Layered()
        #: The EntryIndex of a base, with the base (`index`).
        self._index: tuple[dict[str, Entry], EntryIndex] | None = None
        #: Per node, the states of its row, room and site its entry holds for this View
        #: (shared by the nodes that have the same ones); None: never carried over.
        self.coarse: dict[str, tuple[DomainState, ...] | None] = {}
        self.noted = False  # some entry says something in `missing`
        self.packed = True  # every allowed entry's rank holds its prefix
        self._estimates: dict[tuple[float | None, int | None, tuple[str, ...]], Estimate] = {}
        #: One float object per rank: many nodes share one (the same condition, room and
        #: spread), and a placement reads every candidate's; a few objects stay in the CPU's
        #: caches where one per node would not.
        self._ranks: dict[float, float] = {}
        self._summaries: dict[tuple[Any, ...], str] = {}
        self._interned: dict[tuple[int, ...], tuple[DomainState, ...]] = {}
        #: Per earlier shape (by id): the rows, rooms and sites this View replaced, and
        #: what this View makes of each of its coarse tuples (by id).
        self._memo: dict[int, tuple[dict[int, DomainState | None], dict[int, _Moved]]] = {}
        #: The same shape on the View this one settled from (or an earlier one), whose
        #: `previous` is older still, at most CARRY_DEPTH of them.
        self.previous: Shape | None = None
        self.previous_view: View | None = None  # previous's View, kept alive for it
        #: Changes since a placement last asked about this replica shape (`prepare`).
        self.idle = 0
        #: The nodes `take_over` left out of the earlier shape's entries (`prepare` works
        #: them out).
        self.dropped: list[str] = []
        #: For the next View's take_over: the nodes whose entries were set since the last
        #: `tally` (in the order set), and what it counted: the largest least room among
        #: them (an upper bound; inf: some has none), the nodes past their least room by
        #: their estimate's watts (a superset; shared with the shapes taken over from), and
        #: the nodes whose row, room or site was not among the View's domains (their entries
        #: never carry over).
        self._untallied: list[str] = []
        self._top_room = -math.inf
        self._past: dict[float, set[str]] = {}
        self._unlisted: set[str] = set()
        #: Per (watts, id(state before), id(state after)): whether power_cap names both alike.
        self._refusal_memo: dict[tuple[float, int, int], bool] = {}

    @property
    def view(self) -> View:
        view = self._view()
        assert view is not None, "a shape is used only while its View is"
        return view

    def index(self) -> EntryIndex:
        """The EntryIndex of this shape's base, made when first asked for this base (a base
        is never written once made: decider.placement.overlay)."""
        base = self.entries.base
        made = self._index
        if made is None or made[0] is not base:
            made = self._index = (base, EntryIndex(base))
        return made[1]

    def entry(self, name: str) -> Entry:
        found = self.entries.get(name)
        if found is None:
            self.fill([name])
            found = self.entries[name]
        return found

    def fill(self, names: list[str]) -> None:
        """Entries for these nodes, those it has not yet: carried over from an earlier
        View's shape where nothing they were worked out from has changed, else worked out.

        Carried over when: the same node state, and each of its row, room and site that
        changes since replaced has the same refusals and binds neither before nor after
        (its room is above the node's least room). One loop for them all: this runs for
        every node after each reservation."""
        view = self.view
        coarse = self.coarse
        # Filled into the overlay: the base may be shared with other shapes (see the module
        # docstring for why a filled entry may not go there).
        over, base = self.entries.over, self.entries.base
        # Per earlier shape that has entries: its entries and coarse tuples, and (worked out
        # when first needed) the rows, rooms and sites changed since its View.
        # Each with its View, held here: a change on another thread (`prepare`) may cut the
        # chain meanwhile, and a shape holds its View weakly.
        levels: list[list[Any]] = []
        earlier = self.previous
        for _ in range(CARRY_DEPTH):
            if earlier is None:
                break
            kept = earlier._view()
            if kept is None:
                break
            if earlier.entries:
                levels.append([earlier, earlier.entries, earlier.coarse, None, kept])
            earlier = earlier.previous
        for name in names:
            if over.get(name, base.get(name)) is not None:
                continue
            found = None
            for level in levels:
                old = level[1].get(name)
                if old is None:
                    continue
                node = view.node(name)
                states = level[2].get(name)
                if node is not old.node or states is None:
                    break
                memo = level[3]
                if memo is None:
                    memo = level[3] = self._memo_for(level[0])
                moved = memo[1].get(id(states))
                if moved is None or moved.before is not states:
                    moved = memo[1][id(states)] = self._move(memo[0], states)
                floor, room = moved.floor, old.room
                if moved.after is None or (floor is not None and (room is None or floor <= room)):
                    break
                if old.past and moved.changed and not self._names_alike(old, states, moved.after):
                    break
                coarse[name] = moved.after
                found = old
                break
            if found is None:
                found = self._work_out(name)
            # Named for `tally` first, then set (atomic under the GIL: a race computes the
            # same): take_over copies the overlay, then tallies, and so counts every entry
            # its copy holds.
            self._untallied.append(name)
            over[name] = found
            if found.noted:
                self.noted = True

    def tally(self) -> None:
        """Count the entries set since the last call (see `_untallied`), those set by now:
        one named but not yet set (on another thread, meanwhile) is counted next time.
        Paced as the thread's runtime policy says (a refresh's: decider.giving_way)."""
        untallied = self._untallied[:]
        over, base = self.entries.over, self.entries.base
        coarse, past = self.coarse, self._past
        top = self._top_room
        counted = 0
        for name in paced(untallied):
            found = over.get(name, base.get(name))
            if found is None:
                break
            counted += 1
            room = math.inf if found.room is None else found.room
            if room > top:
                top = room
            if found.past:
                past.setdefault(found.verdict.estimate.watts, set()).add(name)
            if coarse.get(name) is None:
                self._unlisted.add(name)
        self._top_room = top
        del self._untallied[:counted]

    def take_over(self, earlier: Shape, redone: set[str]) -> None:
        """Start from every entry of `earlier` (a shape of an earlier View of the same basis;
        `redone`: the nodes whose state changed since), each of which holds for its View,
        and drop those `fill`'s rule would not carry over: a node whose state changed; per
        row, room and site whose state changed since, its nodes if its refusals changed,
        else those whose least room is not below its room before or after, and those past
        their least room that would name it otherwise. Done per changed domain, not per
        node: a change replaces a few (the node's row, room and site). What is dropped
        `fill` works out when asked."""
        before, view = earlier.view, self.view
        if "domains" not in before.__dict__:
            return
        # The earlier base shared, its overlay copied (before the tally: see fill), and the
        # dropped marked in the copy (decider.placement.overlay).
        entries = earlier.entries.settled(())
        earlier.tally()
        over, base = entries.over, entries.base
        dropped = self.dropped

        def drop(name: str) -> None:
            if over.get(name, base.get(name)) is not None:
                over[name] = None
                dropped.append(name)

        for name in redone | earlier._unlisted:
            drop(name)
        top = earlier._top_room
        # Shared, not copied (1,250 names at 10,000 nodes): a superset stays true for
        # both shapes, and tallies and take_overs run one at a time (the writers' lock;
        # `warm` tallies a shape no other shares yet).
        past = earlier._past
        then, now = before.domains, view.domains
        members = view.members
        refuse = view.domain_refusals
        for ref in before.coarse_refs:
            old, new = then[ref], now.get(ref)
            if new is old:
                continue
            nodes = members.get(ref, ())
            if new is None or refuse(new) != refuse(old):
                for name in nodes:
                    drop(name)
                continue
            rooms = [room for room in (old.room, new.room) if room is not None]
            if rooms and top >= (floor := min(rooms)):  # some node may be bound by it
                for name in nodes:
                    found = over.get(name, base.get(name))
                    if found is not None and (found.room is None or found.room >= floor):
                        drop(name)
            for watts, names in past.items():
                if not self._alike(watts, (old,), (new,)):
                    for name in [n for n in names if ref in (view.membership(n) or ())]:
                        drop(name)
        self.entries = entries.bounded()
        self._index = earlier._index  # the same base's, unless bounded() made a new one
        self._top_room, self._past = top, past
        self.noted = earlier.noted  # at most more than needed: `missing` then finds nothing
        self.packed = earlier.packed
        self._estimates = dict(earlier._estimates)
        self._ranks = earlier._ranks  # only ever added to, under the GIL: shared
        self._summaries = dict(earlier._summaries)  # they depend on the counts and the mode
        # `coarse` stays empty for these: their tuples are of earlier Views, so `fill` does
        # not carry them further; the next View's take_over does.

    def _alike(
        self, watts: float, before: tuple[DomainState, ...], after: tuple[DomainState, ...]
    ) -> bool:
        memo = self._refusal_memo
        for state, now in zip(before, after, strict=True):
            if state is now:
                continue
            key = (watts, id(state), id(now))  # both kept alive by the tuples' holders
            same = memo.get(key)
            if same is None:
                refused = rules.power_cap.refuse(state, watts)
                same = memo[key] = refused == rules.power_cap.refuse(now, watts)
            if not same:
                return False
        return True

    def _memo_for(self, earlier: Shape) -> tuple[dict[int, DomainState | None], dict[int, _Moved]]:
        """The rows, rooms and sites changed since `earlier`'s View, and what this View
        makes of its coarse tuples (filled in as they come)."""
        memo = self._memo.get(id(earlier))
        if memo is None:
            memo = self._memo[id(earlier)] = (_swapped(earlier.view, self.view), {})
        return memo

    def _names_alike(
        self, old: Entry, before: tuple[DomainState, ...], after: tuple[DomainState, ...]
    ) -> bool:
        """Whether a node past its room names its row, room and site alike before and after:
        it names every domain past its limit, with their figures."""
        return self._alike(old.verdict.estimate.watts, before, after)

    def _move(
        self, swapped: dict[int, DomainState | None], states: tuple[DomainState, ...]
    ) -> _Moved:
        """What this View makes of a coarse tuple of an earlier View's entries."""
        after = []
        floor: float | None = None
        changed = False
        refuse = self.view.domain_refusals
        for state in states:
            if id(state) not in swapped:
                after.append(state)
                continue
            now = swapped[id(state)]
            if now is None or refuse(now) != refuse(state):
                return _Moved(states, None, None, True)
            changed = True
            for room in (state.room, now.room):
                if room is not None and (floor is None or room < floor):
                    floor = room
            after.append(now)
        return _Moved(states, self._intern(tuple(after)), floor, changed)

    def summary(
        self,
        judged: int,
        refused: list[Entry],
        tally: Counter[str],
        order: list[str],
        notes: list[str],
        strangers: Iterable[Entry] = (),
    ) -> str:
        """Decision.summary, which depends on the counts alone: worked out once per counts.
        `refused`: every entry that refuses or would (observed)."""
        applied = sum(1 for e in refused if e.verdict.refusals)
        observed = sum(1 for e in refused if e.verdict.would_refuse)
        key = (judged, len(refused), applied, observed, tuple(tally.items()))
        found = self._summaries.get(key)
        if found is None:
            allowed = [] if len(refused) == judged else [self.allowed_one(refused, strangers)]
            verdicts = [e.verdict for e in refused] + allowed * (judged - len(refused))
            view = self.view
            found = Decision(
                view.mode, verdicts, order, notes, tally, enforced=view.enforced
            ).summary()
            if len(self._summaries) >= SUMMARIES_KEPT:
                self._summaries.clear()
            self._summaries[key] = found
        return found

    def allowed_one(self, refused: list[Entry], strangers: Iterable[Entry] = ()) -> Verdict:
        """Any verdict of a node not refused, to stand for them all in the summary's count."""
        return next(
            e.verdict
            for entries in (self.entries.values(), strangers)
            for e in entries
            if not e.verdict.refusals and not e.verdict.would_refuse
        )

    def _intern(self, states: tuple[DomainState, ...]) -> tuple[DomainState, ...]:
        return self._interned.setdefault(tuple(map(id, states)), states)

    def stranger(self, name: str) -> Entry:
        """The entry of a node the site does not know, kept by nothing: neither its node
        state (View.node would keep it) nor its coarse tuple nor the entry itself."""
        return self._work_out(name, self.view._node_state(name), keep=False)

    def _work_out(self, name: str, node: NodeState | None = None, keep: bool = True) -> Entry:
        view, replica = self.view, self.replica
        if node is None:
            node = view.node(name)
        kind = (node.gpu_limit_watts, node.gpus, node.cpu_models)
        guess = self._estimates.get(kind)
        if guess is None:
            guess = self._estimates[kind] = estimate(replica, node, view.facility, self.site_limit)
        verdict = judge(view, replica, node, self.site_limit, guess)
        prefix = None
        if not verdict.refusals:  # decide's ordering scores, the scheduler's order left open
            scored = rules.scores(node, Ask(guess.watts, view.spread_counts(replica.model)))
            prefix = rules.masked(scored, view.ordering_mask)
            verdict.key = (*scored, 0)
        alone = Decision(view.mode, [verdict], [], [], enforced=view.enforced).as_json()
        alone = alone["nodes"][0]
        head = b"," + to_json(alone)  # the comma before it; place drops the first one
        if prefix is not None:
            before, placeholder, tail = head.rpartition(_PLACEHOLDER)
            assert placeholder and tail == _TAIL, "an allowed node ends with scheduler_order"
            head = before + b'"scheduler_order":'
        verdict.key = ()
        rank = None if prefix is None else _rank(prefix)
        if rank is not None:
            rank = self._ranks.setdefault(rank, rank)
        if rank is None and prefix is not None:
            self.packed, rank = False, 0.0
        coarse: tuple[DomainState, ...] | None = ()
        room = node.room
        for ref in node.coarse:  # as judge reads them
            state = view.domains.get(ref)
            if state is None:
                coarse = None
                state = view.domain(ref)
            elif coarse is not None:
                coarse += (state,)
            if state.room is not None and (room is None or state.room < room):
                room = state.room
        if keep:
            self.coarse[name] = None if coarse is None else self._intern(coarse)
        return Entry(
            name=name,
            verdict=verdict,
            prefix=prefix,
            head=head,
            rank=rank,
            rules=tuple(
                dict.fromkeys(rule for rule, _ in (*verdict.refusals, *verdict.would_refuse))
            ),
            past=verdict.headroom_watts is not None and verdict.headroom_watts < 0,
            node=node,
            room=room,
            noted=bool(guess.gaps) or (not node.domains and not node.coarse),
        )


def shape(view: View, replica: Replica) -> Shape:
    """The View's cache for this replica shape, made on first use."""
    shapes: dict[Replica, Shape] = view.__dict__.setdefault(CACHE, {})
    found = shapes.get(replica)
    if found is None:
        found = Shape(view, replica)
        earlier = view.__dict__.get(LINEAGE, {}).get(replica)
        if earlier is not None:
            found.previous, found.previous_view, steps, redone = earlier
            found.idle = found.previous.idle + steps + 1
            if redone is not None and found.previous.entries:
                found.take_over(found.previous, redone)
            last = found
            for _ in range(CARRY_DEPTH):  # no longer a chain of old Views than that
                if last.previous is None:
                    break
                last = last.previous
            last.previous = last.previous_view = None
        while len(shapes) >= SHAPES_KEPT:
            shapes.pop(next(iter(shapes)), None)
        shapes[replica] = found
    return found


def settled(view: View, before: View, redone: set[str] | None) -> None:
    """For a View that settled from `before` (View.settle, which returned `redone`): the
    shapes whose entries it may take over."""
    if view.same_basis(before):
        view.__dict__[LINEAGE] = lineage(before, redone)


def lineage(
    before: View, redone: set[str] | None = None
) -> dict[Replica, tuple[Shape, View, int, set[str] | None]]:
    """For View.settle: per replica shape, the latest Shape of it on the View before or an
    earlier one, its View, how many changes ago, and the nodes whose state changed since
    (`redone`: those of this change; None: unknown). Taken out of the View before, so that
    no chain of Views builds up."""
    storage = before.__dict__
    found = {
        replica: (earlier, view, steps + 1, _union(seen, redone))
        for replica, (earlier, view, steps, seen) in storage.pop(LINEAGE, {}).items()
        if steps < LINEAGE_STEPS
    }
    # A copy first (one C call, whole under the GIL): a placement on `before` may be adding
    # a shape on the event loop's thread while a reservation settles on another.
    for replica, mine in list(storage.get(CACHE, {}).items()):
        found[replica] = (mine, before, 0, None if redone is None else set(redone))
    return found


def warm(view: View, before: View) -> None:
    """Work out on `view` (a refresh's, before it is swapped in) the entries of every node
    for the replica shapes `before` was last asked about, at most SHAPES_WARMED of them,
    so that the first placement after a refresh costs what any other does; giving way
    every PAUSE_EVERY nodes as the thread's runtime policy says (decider.giving_way)."""
    recent = list(reversed(before.__dict__.get(CACHE, {})))
    earlier = sorted(before.__dict__.get(LINEAGE, {}).items(), key=lambda item: item[1][2])
    recent += [replica for replica, _ in earlier if replica not in recent]
    nodes = view.snapshot.membership if "membership" in view.fresh else {}
    for replica in recent[:SHAPES_WARMED]:
        warmed = shape(view, replica)
        names = list(nodes)
        for start in range(0, len(names), PAUSE_EVERY):
            warmed.fill(names[start : start + PAUSE_EVERY])
            give_way_now()
        warmed.tally()  # for the next View's take_over, here rather than in a placement
        # One base of them all, before anything reads them: the changes after it share it.
        warmed.entries = warmed.entries.compacted()
        give_way_now()
        warmed.index()


def prepare(view: View) -> None:
    """Make on `view` (one a reservation, hold or release settled, before it is swapped in)
    the shapes of the replica shapes asked about in the last PREPARED_IDLE changes, at most
    SHAPES_WARMED of them: each takes the View before's entries over in bulk and cuts its
    chain of earlier Views (freeing the oldest) here, in the change, rather than in the
    next placement, which then finds the shape made and its entries too."""
    recent = sorted(
        (earlier.idle + steps + 1, order, replica)
        for order, (replica, (earlier, _, steps, _)) in enumerate(
            view.__dict__.get(LINEAGE, {}).items()
        )
    )
    for idle, _, replica in recent[:SHAPES_WARMED]:
        if idle <= PREPARED_IDLE:
            made = shape(view, replica)
            # And the entries the bulk takeover left out (the changed rack's and PDUs'
            # nodes, those a row binds): the next placement finds every entry made. Not
            # every node of a room or site whose refusals changed (a hold on the site):
            # that would hold the writers' lock for a refresh's work; placements work
            # out their own candidates' then.
            if len(made.dropped) <= PREPARED_NODES:
                made.fill(made.dropped)
            made.dropped = []
            made.index()  # a new one only when the takeover compacted a new base


def place(view: View, replica: Replica, candidates: list[str]) -> Answer:
    """`decide(view, replica, candidates)`, answered from and into the View's cache.

    Where the facility file oversubscribes a domain, from the rules alone (`uncached`): a
    verdict there reads the replica's peak and the domain's safe cap, which the least rooms
    the cache carries entries over by do not show."""
    if view.oversubscribed_refs:
        return uncached(view, replica, candidates)
    cached = shape(view, replica)
    cached.idle = 0
    joined = cached.index().join(cached.entries.over, candidates)
    strangers: dict[str, Entry] = {}
    while isinstance(joined, int):  # that candidate and the later ones the shape has not yet
        # The site's nodes filled into the cache; the others worked out for this answer
        # alone, in a copy of the overlay (module docstring).
        known = view.snapshot.membership
        rest = candidates[joined:]
        unfilled = [name for name in rest if name in known and name not in cached.entries]
        if unfilled:
            cached.fill(unfilled)
        # A new shape's entries all go into its overlay, which EntryIndex does not hold:
        # compacted once past its bound, the next placements read them from the index.
        cached.entries = cached.entries.bounded()
        strangers.update(
            (name, cached.stranger(name))
            for name in rest
            if name not in known and name not in strangers
        )
        over = cached.entries.over
        again = cached.index().join(over | strangers if strangers else over, candidates)
        assert not isinstance(again, int) or again > joined, "fill made the entry"
        joined = again
    nodes, order, refused = joined
    # Every candidate's entry is in it now.
    entries: Mapping[str, Entry] = (
        ChainMap(strangers, cached.entries) if strangers else cached.entries
    )
    noted = cached.noted or any(entry.noted for entry in strangers.values())
    # The entries that refuse, and (some concern observed) those that would: a walk of the
    # candidates only where a concern is observed.
    flagged = refused
    observed_tally: Counter[str] = Counter()
    if not cached.enforcing:
        flagged = [found for name in candidates if (found := entries[name]).rules]
        _log_observed(replica, len(candidates), [found.verdict for found in flagged])
    if not cached.packed:  # some key too large to pack: decide's tuples, the scheduler's last
        keyed = [
            (prefix, index)
            for index, name in enumerate(candidates)
            if (prefix := entries[name].prefix) is not None
        ]
        keyed.sort()
        order = [candidates[index] for _, index in keyed]
    tally = Counter(rule for found in flagged for rule in found.rules)
    applied_tally = tally  # every concern enforced: every refusal applied
    if not cached.enforcing:
        applied_tally, observed_tally = tallies(found.verdict for found in flagged)
    notes = missing(view, [entries[name].verdict for name in candidates] if noted else [])
    summary = cached.summary(len(candidates), flagged, tally, order, notes, strangers.values())
    frame = to_json(
        {"mode": view.mode, "order": order, "nodes": [], "missing": notes, "summary": summary}
    )
    before, placeholder, after = frame.partition(b'"nodes":[]')
    assert placeholder, "the answer has its nodes"
    return Answer(
        mode=view.mode,
        order=order,
        body=b"".join((before, b'"nodes":[', nodes, b"]", after)),
        summary=summary,
        judged=len(candidates),
        refused=len(refused),
        refusals_by_rule=tally,
        refusals=Refusals(flagged),
        applied_by_rule=applied_tally,
        observed_by_rule=observed_tally,
    )


def uncached(view: View, replica: Replica, candidates: list[str]) -> Answer:
    """`decide`'s answer as `place` gives it, from the rules alone: what decider.yaml's
    `placement_cache: false` serves (tests/test_placement_answers.py holds the two equal)."""
    decision = decide(view, replica, candidates)
    if not view.enforced.issuperset(rules.CONCERNS):
        _log_observed(replica, len(candidates), decision.verdicts)
    applied_tally, observed_tally = tallies(decision.verdicts)
    return Answer(
        mode=decision.mode,
        order=decision.order,
        body=to_json(decision.as_json()),
        summary=decision.summary(),
        judged=len(decision.verdicts),
        refused=sum(1 for verdict in decision.verdicts if verdict.refusals),
        refusals_by_rule=decision.refusals_by_rule,
        refusals=[
            (verdict.node.node, reason)
            for verdict in decision.verdicts
            for _, reason in (*verdict.refusals, *verdict.would_refuse)
        ],
        applied_by_rule=applied_tally,
        observed_by_rule=observed_tally,
    )


def _log_observed(replica: Replica, judged: int, verdicts: Iterable[Verdict]) -> None:
    """One rate-limited line for the decision, if an observed concern would have refused."""
    observed.WOULD_REFUSE.decision(
        "placement",
        f"{replica.model} ({replica.profile}, {replica.gpus} GPUs)",
        judged,
        (
            (verdict.node.node, rule, reason)
            for verdict in verdicts
            for rule, reason in verdict.would_refuse
        ),
    )


def _union(seen: set[str] | None, redone: set[str] | None) -> set[str] | None:
    return None if seen is None or redone is None else seen | redone


def _swapped(before: View, after: View) -> dict[int, DomainState | None]:
    """The rows, rooms and sites whose state `after` replaced (few: a change touches the
    changed node's), by the id of `before`'s state (kept alive by `before`)."""
    if "domains" not in before.__dict__:
        return {}
    then, now = before.domains, after.domains
    found = {}
    for ref in before.coarse_refs:
        state, current = then[ref], now.get(ref)
        if current is not state:
            found[id(state)] = current
    return found


def _rank(prefix: tuple[float, ...]) -> float | None:
    """The ordering scores as one float ordered as the tuples are (a whole number below
    2**53: exact; the first score the most significant); None where a score is not an
    integer within its packed range."""
    packed = 0
    for score, (lowest, bits) in zip(prefix, _PACKING, strict=True):
        if type(score) is not int:
            return None
        offset = score - lowest
        if not 0 <= offset < 1 << bits:
            return None
        packed = packed << bits | int(offset)
    return float(packed)
