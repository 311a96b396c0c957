"""The state every decision reads: facility file, snapshot, reservations and holds, frozen.

A View is immutable; decider.state builds a new one on every change (a reservation, a hold,
a refresh, a reload) and swaps it in one assignment, so a placement reads one consistent
state without taking a lock. Per-domain and per-node figures are worked out once per view,
on first use, and shared by every request that reads the same view. A view made after a
reservation or a hold (`settle`) starts from the previous view's figures and works out
again only the domains the change touched, and the nodes in those racks and PDUs. Each
figure says what settle does with it where it is declared, `@figure(carried)`, `@figure(anew)`
or `@figure(_NAME_after)` (its update for the change, written beside the others below); a
plain cached_property on View is refused when this module loads (`check_figures`), so a
figure added later is never carried over stale, nor forgotten, by omission.

The node states (`_nodes`) are not copied from view to view: they are a base dict shared by
the views of one basis and a small overlay per view (decider.placement.overlay), in which a
write marks the nodes it makes stale (the reserved node, the nodes of the racks and PDUs it
touched). Compacted past a bound, so a write costs what it changes, not the site's size.
A node state worked out on first use goes into the view's overlay if the overlay names the
node, else into the shared base, and that is right for every view that shares the base:
settle marks stale every node whose state may differ from the view before whether or not
that state was worked out yet (from the membership, not from what the cache holds), so a
node no overlay names has the same state in each view of the base as in the view that made
it (compared by value: each view that works it out computes an equal state), and a view
whose overlay names it never reads the base for it. Where that cannot be told (a hold with
no fresh membership: each node refused by its last known domains) the cache starts anew.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from decider import overrides as overrides_text
from decider.facility import Domain, DomainRef, Facility
from decider.giving_way import paced
from decider.placement import condition as condition_score
from decider.placement import evidence, phases, predicted_peak, refusal_memo, rules
from decider.placement.overlay import Layered
from decider.placement.phases import PhaseKey
from decider.placement.predicted_peak import Prediction, ReservedFigures
from decider.placement.states import (
    CONDITION_RANK,
    FINE_KINDS,
    Budgeted,
    DomainState,
    NodeState,
    PhaseState,
    Refusal,
)
from decider.snapshot import Condition, Snapshot
from decider.store import Hold, Override, Reservation

__all__ = ["CONDITION_RANK", "FINE_KINDS", "DomainState", "NodeState", "PhaseState", "View"]


# --- the figures a View works out once, and what settle does with each ------------------------

T = TypeVar("T")


@dataclass
class Change:
    """What a View that settles (`View.settle`) differs by from the View before: reservations
    added and removed, and the domains whose figures that and the holds changed. `redone`:
    the nodes whose state is worked out anew (None: unknown, every one), as `_nodes` found."""

    previous: View
    added: list[Reservation]
    removed: list[Reservation]
    held: tuple[DomainRef, ...]
    touched: set[DomainRef]
    redone: set[str] | None = None

    @property
    def signed(self) -> list[tuple[Reservation, int]]:
        """Each reservation with +1 (added) or −1 (removed)."""
        return [(r, 1) for r in self.added] + [(r, -1) for r in self.removed]


#: What settle makes of a figure the View before worked out: (the new View, the change, the
#: figure then) -> the figure now, or LEFT: left to be worked out on first use.
Settle = Callable[["View", Change, Any], Any]
#: A settle's answer where the figure is left to be worked out on first use (a figure may
#: be None: site_gpu_limit_watts).
LEFT: Any = object()


class Figure(cached_property[T]):
    """A figure a View works out on first use and keeps (a cached_property: read as fast as
    an attribute), declared with what `View.settle` does with it (`figure(settle)`): a
    figure cannot be added without saying so, and `check_figures` refuses a plain cached_property
    on View when the module is imported."""

    def __init__(
        self, work_out: Callable[[Any], T], settle: Settle, follows: Figure[Any] | None
    ) -> None:
        super().__init__(work_out)
        self.settle = settle
        self.follows = follows

    def settles_from(self, previous: View) -> bool:
        """Whether settle starts this figure from `previous`'s: where `previous` worked it
        out, or the figure it follows (worked out on `previous` then, as on first use)."""
        return self.worked_out(previous) or (
            self.follows is not None and self.follows.worked_out(previous)
        )

    def worked_out(self, view: View) -> bool:
        return self.attrname in view.__dict__

    def keep(self, view: View, value: T) -> None:
        """Set the figure of a View no one reads yet (settle, work_out_domains): where
        cached_property keeps it, the View being frozen to its users."""
        view.__dict__[self.attrname] = value


def figure(
    settle: Settle, follows: Figure[Any] | None = None
) -> Callable[[Callable[[Any], T]], Figure[T]]:
    """Declare a figure and what settle does with it; `follows`: a figure it is derived
    from, whose View before it is carried along with even where no one read it there (else
    each View would work it out again from scratch)."""

    def declare(work_out: Callable[[Any], T]) -> Figure[T]:
        return Figure(work_out, settle, follows)

    return declare


def carried(view: View, change: Change, before: T) -> T:
    """The basis decides it (snapshot, facility file, freshness), not a reservation or hold."""
    return before


def anew(view: View, change: Change, before: object) -> Any:
    """Worked out anew on first use: cheap, or read from what changed."""
    return LEFT


def _domain_refusals_after(
    view: View, change: Change, before: Callable[[Budgeted], tuple[Refusal, ...]]
) -> Any:
    """The memo carried over (keyed by state: the states the change replaced are new
    objects), unless the registry changed since it was made."""
    return before if view.memo_refusals and refusal_memo.still_current(before) else LEFT


def _reserved_watts_after(view: View, change: Change, before: dict[DomainRef, float]) -> Any:
    watts = dict(before)
    for reservation, sign in change.signed:
        for ref in change.previous.reservation_domains(reservation):
            total = watts.get(ref, 0.0) + sign * reservation.estimate_watts
            watts[ref] = max(0.0, total)  # no float dust below zero
    return watts


def _oversubscribed_reserved_after(
    view: View, change: Change, before: dict[DomainRef, ReservedFigures]
) -> Any:
    """Each reservation added or removed, in the oversubscribed domains it counts in. The
    same basis (snapshot, file), so a reservation's share is what it was when added."""
    totals = dict(before)
    opted = view.oversubscribed_refs
    for reservation, sign in change.signed:
        refs = [ref for ref in change.previous.reservation_domains(reservation) if ref in opted]
        if refs:
            share = view.reserved_figures(reservation)
            for ref in refs:
                totals[ref] = totals.get(ref, ReservedFigures()).plus(share, sign)
    return totals


def _reserved_gpus_after(view: View, change: Change, before: dict[str, int]) -> Any:
    gpus = dict(before)
    for reservation, sign in change.signed:
        gpus[reservation.node] = gpus.get(reservation.node, 0) + sign * reservation.gpus
    return gpus


def _replicas_by_model_after(
    view: View, change: Change, before: dict[tuple[str, DomainRef], int]
) -> Any:
    counts = dict(before)
    for reservation, sign in change.signed:
        for ref in change.previous.reservation_domains(reservation):
            if ref.kind in FINE_KINDS:
                key = (reservation.model, ref)
                counts[key] = counts.get(key, 0) + sign
                if not counts[key]:
                    del counts[key]
    return counts


def _spread_after(view: View, change: Change, before: dict[str, dict[DomainRef, int]]) -> Any:
    """Per model, as replicas_by_model."""
    # list(): a placement may be adding a model to it on another thread meanwhile.
    spread = {model: dict(counts) for model, counts in list(before.items())}
    for reservation, sign in change.signed:
        counts = spread.get(reservation.model)
        if counts is None:
            continue
        for ref in change.previous.reservation_domains(reservation):
            if ref.kind in FINE_KINDS:
                counts[ref] = counts.get(ref, 0) + sign
                if not counts[ref]:
                    del counts[ref]
    return spread


def _phase_reserved_after(view: View, change: Change, before: dict[PhaseKey, float]) -> Any:
    by_phase = dict(before)
    for reservation, sign in change.signed:
        for key in phases.reservation_phases(change.previous, reservation):
            by_phase[key] = max(0.0, by_phase.get(key, 0.0) + sign * reservation.estimate_watts)
    return by_phase


def _phase_states_after(view: View, change: Change, before: dict[PhaseKey, PhaseState]) -> Any:
    """Those of the pdus the change did not touch."""
    pdus = {ref.name for ref in change.touched if ref.kind == "pdu"}
    return {key: state for key, state in before.items() if key[0] not in pdus}


def _domain_refs_after(view: View, change: Change, before: frozenset[DomainRef]) -> Any:
    return before | change.touched


def _domains_after(view: View, change: Change, before: dict[DomainRef, DomainState]) -> Any:
    """The touched domains' states worked out anew (from the reservations settled above)."""
    domains = dict(before)
    for ref in change.touched:
        domains[ref] = view._domain_state(ref)
    return domains


def _coarse_refs_after(view: View, change: Change, before: tuple[DomainRef, ...]) -> Any:
    """The same order, a touched row, room or site not yet among them last."""
    added = tuple(r for r in change.touched if r.kind not in FINE_KINDS and r not in before)
    return before + added


def _node_states_after(view: View, change: Change, before: Layered[NodeState]) -> Any:
    """The shared base, the nodes the change touched marked stale in a copy of the small
    overlay (decider.placement.overlay): the change costs the names it touched, not the
    site's 10,000. Worked out anew, every node, where a hold came with no fresh membership
    (each node is refused by its last known domains: any may have changed)."""
    if not View.domains.worked_out(view) or (change.held and "membership" not in view.fresh):
        return LEFT
    members = view.members
    redone = {reservation.node for reservation in change.added + change.removed}
    for ref in change.touched:
        if ref.kind in FINE_KINDS:
            redone.update(members.get(ref, ()))
    change.redone = redone
    return before.settled(redone)


def check_figures(cls: type) -> None:
    """Every figure a View caches says what settle does with it (a Figure, not a plain
    cached_property): raises at import, not at the first settle."""
    plain = [
        name
        for name, attr in vars(cls).items()
        if isinstance(attr, cached_property) and not isinstance(attr, Figure)
    ]
    if plain:
        raise TypeError(
            f"{cls.__name__}: {', '.join(plain)}: a cached figure must say what settle does "
            "with it (@figure(carried | anew | an update), decider.placement.view)"
        )


@dataclass(frozen=True)
class View:
    facility: Facility
    snapshot: Snapshot
    now: float
    fresh: frozenset[str]  # the snapshot parts usable now
    missing: tuple[str, ...]  # a sentence for each part that is not
    reservations: Mapping[str, Reservation]
    holds: Mapping[DomainRef, Hold]
    #: The overrides in force when the view was made (decider.state): each clears its
    #: domain's condition, read as `ok` (docs/decider.md, "Overrides").
    overrides: Mapping[DomainRef, Override] = field(default_factory=dict)
    #: Whether `domain_refusals` remembers each state's refusals (a speed layer: the
    #: answers are the same without, tests/test_placement_answers.py).
    memo_refusals: bool = True

    @property
    def mode(self) -> str:
        """`enforce` where any concern is enforced, else `observe` (the answers' `mode`)."""
        return self.facility.overall_mode()

    @figure(anew)
    def enforced(self) -> frozenset[str]:
        """The concerns enforced (decider.placement.rules): refusals of the others are
        reported, not applied."""
        return self.facility.enforced()

    @figure(anew)
    def ordering_mask(self) -> tuple[bool, ...]:
        """Which ordering scores order (rules.ordering_mask)."""
        return rules.ordering_mask(self.enforced)

    @figure(_domain_refusals_after)
    def domain_refusals(self) -> Callable[[Budgeted], tuple[Refusal, ...]]:
        """What `judge` runs the registry's domain filters through (rules.domain_refusals),
        remembered per domain and phase state for this View (decider.placement.refusal_memo)
        unless `memo_refusals` is off."""
        return refusal_memo.remembered() if self.memo_refusals else rules.domain_refusals

    def membership(self, node: str) -> tuple[DomainRef, ...] | None:
        """The node's domains; None when the membership part is missing or the node unknown."""
        if "membership" not in self.fresh:
            return None
        return self.snapshot.membership.get(node)

    def reservation_domains(self, reservation: Reservation) -> tuple[DomainRef, ...]:
        """Where a reservation counts: its node's domains now, else those it was made in."""
        current = self.membership(reservation.node)
        return current if current is not None else reservation.domains

    @figure(_reserved_watts_after)
    def reserved_watts(self) -> dict[DomainRef, float]:
        totals: dict[DomainRef, float] = {}
        for reservation in self.reservations.values():
            for ref in self.reservation_domains(reservation):
                totals[ref] = totals.get(ref, 0.0) + reservation.estimate_watts
        return totals

    @figure(carried)
    def oversubscribed_refs(self) -> frozenset[DomainRef]:
        """The domains the facility file oversubscribes (`oversubscribe: true`)."""
        return frozenset(ref for ref, domain in self.facility.declared() if domain.oversubscribe)

    @figure(_oversubscribed_reserved_after)
    def oversubscribed_reserved(self) -> dict[DomainRef, ReservedFigures]:
        """Per oversubscribed domain, what its predicted basis counts of its reservations
        (decider.placement.predicted_peak.ReservedFigures)."""
        opted = self.oversubscribed_refs
        totals: dict[DomainRef, ReservedFigures] = {}
        if not opted:
            return totals
        for reservation in self.reservations.values():
            refs = [ref for ref in self.reservation_domains(reservation) if ref in opted]
            if refs:
                share = self.reserved_figures(reservation)
                for ref in refs:
                    totals[ref] = totals.get(ref, ReservedFigures()).plus(share)
        return totals

    def reserved_figures(self, reservation: Reservation) -> ReservedFigures:
        """One reservation's share of its oversubscribed domains' figures, on this basis."""
        peaks = "peaks" in self.fresh
        read_at = self.snapshot.parts["peaks"].read_at if peaks else None
        settings = self.facility.oversubscription
        return predicted_peak.reservation_figures(
            reservation,
            self.gpu_limit_of(reservation.node),
            predicted_peak.seen_before(read_at, settings),
            self.snapshot.unit_peak_watts if peaks else {},
            settings,
        )

    def gpu_limit_of(self, node: str) -> float | None:
        """A node's enforced GPU limit, else the site's largest, else the file's fallback:
        as the estimate takes it (decider.placement.estimate)."""
        known = self.snapshot.gpu_limit_watts.get(node) if "limits" in self.fresh else None
        if known is None:
            known = self.site_gpu_limit_watts
        return known if known is not None else self.facility.fallback_gpu_watts

    def prediction(self, ref: DomainRef, measured: float | None) -> Prediction:
        """An oversubscribed domain's admission basis and figures (predicted_peak)."""
        settings = self.facility.oversubscription
        peaks = "peaks" in self.fresh
        limits = self.snapshot.gpu_limit_watts if "limits" in self.fresh else {}
        minimums = self.snapshot.gpu_min_limit_watts if "min_limits" in self.fresh else {}
        nodes = [(limits.get(node), minimums.get(node)) for node in self.members.get(ref, ())]
        return predicted_peak.prediction(
            settings,
            self.snapshot.domain_peaks.get(ref) if peaks else None,
            peaks,
            measured,
            self.oversubscribed_reserved.get(ref, ReservedFigures()),
            predicted_peak.min_gpu_limit(nodes, settings.ladder.floor_gpu_watts),
        )

    @figure(_reserved_gpus_after)
    def reserved_gpus(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for reservation in self.reservations.values():
            totals[reservation.node] = totals.get(reservation.node, 0) + reservation.gpus
        return totals

    @figure(_replicas_by_model_after)
    def replicas_by_model(self) -> dict[tuple[str, DomainRef], int]:
        """Reserved replicas of each model per rack and pdu, for the spread preference."""
        counts: dict[tuple[str, DomainRef], int] = {}
        for reservation in paced(self.reservations.values()):
            for ref in self.reservation_domains(reservation):
                if ref.kind in ("rack", "pdu"):
                    key = (reservation.model, ref)
                    counts[key] = counts.get(key, 0) + 1
        return counts

    @figure(carried)
    def members(self) -> dict[DomainRef, list[str]]:
        """The nodes of each domain (current membership)."""
        found: dict[DomainRef, list[str]] = {}
        if "membership" in self.fresh:
            for node, refs in self.snapshot.membership.items():
                for ref in refs:
                    found.setdefault(ref, []).append(node)
        return found

    @figure(_domain_refs_after)
    def domain_refs(self) -> frozenset[DomainRef]:
        """Every domain this view knows: Prometheus' inventory, the file's, the holds'."""
        declared = {ref for ref, _ in self.facility.declared()}
        known = self.snapshot.domains if "inventory" in self.fresh else frozenset()
        members: set[DomainRef] = set()
        if "membership" in self.fresh:
            for refs in paced(self.snapshot.membership.values()):
                members.update(refs)
        return frozenset(known | declared | members | set(self.holds) | set(self.reserved_watts))

    @figure(_domains_after)
    def domains(self) -> dict[DomainRef, DomainState]:
        return {ref: self._domain_state(ref) for ref in self.domain_refs}

    def work_out_domains(self) -> None:
        """`domains` (and what they and the spread preference read first), worked out now,
        giving way as this thread's runtime policy says (decider.giving_way.giving_way): a
        refresh's View, before anyone reads it (State.set_snapshot)."""
        self.replicas_by_model  # noqa: B018 -- worked out here, paced, not on first read
        if View.domains.worked_out(self):
            return
        domains: dict[DomainRef, DomainState] = {}
        for ref in paced(self.domain_refs):
            domains[ref] = self._domain_state(ref)
        View.domains.keep(self, domains)

    @figure(_coarse_refs_after, follows=domains)
    def coarse_refs(self) -> tuple[DomainRef, ...]:
        """The rows, rooms and sites among `domains` (decider.placement.answers compares
        them between Views)."""
        return tuple(ref for ref in self.domains if ref.kind not in FINE_KINDS)

    def domain(self, ref: DomainRef) -> DomainState:
        state = self.domains.get(ref)
        return state if state is not None else self._domain_state(ref)

    def _domain_state(self, ref: DomainRef) -> DomainState:
        facility = self.facility
        declared = facility.domain(ref.kind, ref.name)
        cap = facility.cap_watts(ref.kind, ref.name)
        measured = self.snapshot.measured_watts.get(ref) if "measured" in self.fresh else None
        condition: Condition = "unknown"
        if "conditions" in self.fresh:
            condition = self.snapshot.conditions.get(ref, "unknown")
            override = self.overrides.get(ref)
            if override is not None and override.active(self.now) and condition != "unknown":
                condition = "ok"
        age = self.snapshot.reading_ages.get(ref) if "ages" in self.fresh else None
        return DomainState.build(
            ref=ref,
            cap=cap,
            margin=facility.margin(ref.kind, ref.name),
            other_watts=declared.other_watts if declared is not None else 0.0,
            reserved=self.reserved_watts.get(ref, 0.0),
            measured=measured,
            condition=condition,
            reading_age=age,
            held=self.holds.get(ref),
            evidence=evidence.of(
                condition,
                self.snapshot.evidence.get(ref) if "evidence" in self.fresh else None,
                self.snapshot.hot_seconds.get(ref) if "hot" in self.fresh else None,
            ),
            prediction=(
                self.prediction(ref, measured)
                if declared is not None and declared.oversubscribe
                else None
            ),
        )

    @figure(_node_states_after)
    def _nodes(self) -> Layered[NodeState]:
        return Layered()

    # --- phases of three-phase pdus (decider.placement.phases) --------------------------------

    @figure(carried)
    def phased_pdus(self) -> dict[str, Domain]:
        return self.facility.phased_pdus()

    @figure(_phase_reserved_after)
    def phase_reserved(self) -> dict[PhaseKey, float]:
        return phases.reserved_by_phase(self)

    @figure(_phase_states_after)
    def _phases(self) -> dict[PhaseKey, PhaseState]:
        return {}

    def phase(self, pdu: str, phase: str) -> PhaseState:
        """One phase of a phased pdu, worked out once per view (as `node`)."""
        state = self._phases.get((pdu, phase))
        if state is None:
            state = self._phases[(pdu, phase)] = phases.phase_state(self, pdu, phase)
        return state

    def same_basis(self, other: View) -> bool:
        """Whether `other` read the same snapshot, file and freshness: its figures carry over."""
        return (
            other.snapshot is self.snapshot
            and other.facility is self.facility
            and other.fresh == self.fresh
        )

    def settle(
        self,
        previous: View,
        changed: tuple[Reservation, ...] = (),
        held: tuple[DomainRef, ...] = (),
    ) -> set[str] | None:
        """Start from `previous`'s figures (same basis) after reservations `changed` (added,
        removed or confirmed) and holds on `held` changed; only what they touch is redone.
        The nodes whose state was worked out anew (None: unknown, every one; the answer
        cache takes over the rest, decider.placement.answers.lineage).

        Figures `previous` never worked out are left to be worked out on first use; each
        one it did, settle hands to what the figure declares (`figure(...)` above), in the
        order the class declares them: an update may read the figures declared above it."""
        if not self.same_basis(previous):
            return None
        added = [r for r in changed if r.id not in previous.reservations]
        removed = [r for r in changed if r.id not in self.reservations]
        touched: set[DomainRef] = set(held)
        for reservation in added + removed:  # a confirmation changes no figure
            touched.update(previous.reservation_domains(reservation))
        change = Change(previous, added, removed, held, touched)
        for each in FIGURES:
            if each.settles_from(previous):
                now = each.settle(self, change, each.__get__(previous, View))
                if now is not LEFT:
                    each.keep(self, now)
        return change.redone

    def node(self, name: str) -> NodeState:
        """The node's state, worked out once per view (a dict write is atomic under the GIL:
        two threads racing here compute the same value). Written into the shared base when
        the node is not in this View's overlay (the module docstring says why that holds),
        else into the overlay."""
        nodes = self._nodes
        over, base = nodes.over, nodes.base
        state = over.get(name, base.get(name))
        if state is None:
            state = self._node_state(name)
            if name in over:
                over[name] = state
            else:
                base[name] = state
        return state

    def _node_state(self, name: str) -> NodeState:
        refs = self.membership(name) or ()
        fine: list[DomainState] = []
        coarse: list[DomainRef] = []
        condition: Condition = "unknown"
        room: float | None = None
        rack: DomainState | None = None
        warm: list[DomainState] = []
        for ref in refs:
            domain = self.domain(ref)
            if CONDITION_RANK[domain.condition] > CONDITION_RANK[condition]:
                condition = domain.condition
            if domain.condition == "warm":
                warm.append(domain)
            if ref.kind not in FINE_KINDS:
                coarse.append(ref)
                continue
            fine.append(domain)
            if domain.room is not None and (room is None or domain.room < room):
                room = domain.room
            if rack is None and ref.kind == "rack":
                rack = domain
        node_phases: tuple[PhaseState, ...] = ()
        if refs and self.phased_pdus:
            node_phases = tuple(self.phase(*key) for key in phases.phases_of(self, name, refs))
            for phase in node_phases:
                if room is None or phase.room < room:
                    room = phase.room
        return NodeState(
            phases=node_phases,
            node=name,
            coarse=tuple(coarse),
            domains=tuple(fine),
            condition=condition,
            room=room,
            rack=rack,
            gpus=self.snapshot.node_gpus.get(name) if "gpus" in self.fresh else None,
            gpu_limit_watts=(
                self.snapshot.gpu_limit_watts.get(name) if "limits" in self.fresh else None
            ),
            reserved_gpus=self.reserved_gpus.get(name, 0),
            cpu_models=self.snapshot.cpu_models.get(name, ()) if "cpus" in self.fresh else (),
            warm_evidence=condition_score.explain(warm) if condition == "warm" else (),
            last_known_holds=self._last_known_holds(name) if not refs and self.holds else (),
        )

    def _last_known_holds(self, name: str) -> tuple[tuple[DomainRef, Hold], ...]:
        """A hold refuses whatever the data (held.py): with no fresh membership, the holds on
        the node's last known domains (the snapshot's, else those its reservations were made
        in), which `judge` has `held` refuse it by."""
        known = set(self.snapshot.membership.get(name, ()))
        for reservation in self.reservations.values():
            if reservation.node == name:
                known.update(reservation.domains)
        return tuple((ref, self.holds[ref]) for ref in sorted(known) if ref in self.holds)

    def all_domains(self, node: NodeState) -> tuple[DomainState, ...]:
        """Every domain of the node, its row, room and site included, as of this view."""
        if not node.coarse:
            return node.domains
        return node.domains + tuple(self.domain(ref) for ref in node.coarse)

    def spread_counts(self, model: str) -> dict[DomainRef, int]:
        """Reserved replicas of `model` per rack and pdu (cached per model and view)."""
        by_model = self._spread
        counts = by_model.get(model)
        if counts is None:
            counts = {ref: n for (name, ref), n in self.replicas_by_model.items() if name == model}
            by_model[model] = counts
        return counts

    @figure(_spread_after)
    def _spread(self) -> dict[str, dict[DomainRef, int]]:
        return {}

    @figure(carried)
    def gaps(self) -> tuple[str, ...]:
        """Readings Prometheus answered for but does not have, per domain: a budgeted domain
        with no fresh measured power (its load is then what is reserved), a domain with no
        fresh condition (unknown, placed as ok). Parts that failed whole are in `missing`."""
        notes = []
        if "measured" in self.fresh:
            unmeasured = [ref for ref, d in self.domains.items() if d.cap and d.measured is None]
            if unmeasured:
                notes.append(
                    f"no fresh measured power for {_some(unmeasured)}: load counts what is reserved"
                )
        if "conditions" in self.fresh:
            unknown = [ref for ref, d in self.domains.items() if d.condition == "unknown"]
            if unknown:
                notes.append(f"no fresh condition for {_some(unknown)}: unknown, placed as ok")
        if self.phased_pdus:
            notes += phases.notes(self)
        return tuple(notes)

    def all_missing(self) -> list[str]:
        """`missing` and `gaps`: everything an answer from this view should say it lacked."""
        conditions = self.snapshot.conditions if "conditions" in self.fresh else {}
        cleared = overrides_text.notes(self.overrides, conditions, self.now)
        return [*self.missing, *self.gaps, *cleared]

    @figure(carried)
    def site_gpu_limit_watts(self) -> float | None:
        """The largest enforced GPU limit in the site: the estimate for a node without one."""
        if "limits" not in self.fresh or not self.snapshot.gpu_limit_watts:
            return None
        return max(self.snapshot.gpu_limit_watts.values())


check_figures(View)
#: The figures of a View, in the order the class declares them (settle's order).
FIGURES: tuple[Figure[Any], ...] = tuple(
    attr for attr in vars(View).values() if isinstance(attr, Figure)
)


def _some(refs: list[DomainRef], shown: int = 5) -> str:
    names = [str(ref) for ref in sorted(refs)]
    if len(names) == 1:
        return names[0]
    if len(names) <= shown:
        return f"{len(names)} domains ({', '.join(names)})"
    return f"{len(names)} domains ({', '.join(names[:shown])}, …)"
