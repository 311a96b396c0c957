"""Shedding plans (DESIGN.md §5) and the loss of a feed: which replicas to move, to where.

The decider proposes; it never moves anything. `plan` is a pure function of a View, the
time and the pacing record (the last move proposed off each domain), so a test can drive
it over generated sites; `Shedder` keeps the pacing in the database and serves it.

- **Which domains.** A domain `hot` now (a fresh condition) and hot for at least
  `shedding.hot_for`, by the snapshot's `hot` part: Prometheus' own record of the
  condition, so a restart of the decider does not restart the delay. Without a fresh `hot`
  or `conditions` part no domain is shed, and `missing` says why: a move is disruptive, and
  missing data must not cause one.
- **Which replica.** The domain's replicas are the decider's reservations on its nodes.
  Ordered (`order_key`): lowest class first (`classes` in the facility file; a replica's
  own `class` overrides its model's; no class, or one not listed, ranks below every listed
  class); then replicas whose model has more replicas than its `minimum_replicas` before
  those at it; then the larger estimate (more heat off the domain per move); then the
  newest; then the id. A critical model's replica never moves while the model has no more
  than its minimum (counting the moves already in the plan: they run concurrently).
- **To where.** Through the placement rules themselves (`decider.placement.decide`), over
  every node the decider knows, in name order, outside the domain: the first allowed node
  in the rules' order that also has the GPUs free (where its GPU count is known). Enforce
  mode's verdicts are used whatever the mode: a plan is a recommendation, and a move into
  a refused node would be no move at all. A replica with no such node is skipped, with the
  reason; the next one in order is tried. Each move is applied to a copy of the view
  before the next is chosen, so two moves cannot both take the same last room.
- **How fast.** At most one move per domain per `shedding.interval`: after a move is
  proposed, no other replica of the domain is proposed until it has been seen gone and an
  interval has passed since (or an interval has passed with it still there: the plan may
  then choose again). A move counts against every shed domain it leaves (a rack's move is
  also its row's).

`failover` answers "what if this PDU fails": each rack it feeds then carries its whole load
on its other feeds, shared evenly; a rack whose share passes a surviving feed's rating ×
derating is listed with the figures and the replicas the same order would move (as many as
bring it back under), each with a destination outside the racks the PDU feeds.

**Capping instead of moving** (docs/power-capping.md): each hot entry carries
`power_capping`, the GPU power limit that would bring that domain back under its target
(`decider.power_capping.recommend` on the view before this plan's moves; null where no
reading asks for one), and the plan's top-level `power_capping` lists the same for every
warm or over-budget domain that is not hot. Both are recommendations, as the moves are, and
they are worked out whether shedding is enabled or not: capping needs no replica to move.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from decider import power_capping
from decider.facility import DomainRef
from decider.models import Replica
from decider.placement import Verdict, decide
from decider.placement import evidence as thermal_evidence
from decider.placement.view import View
from decider.store import Proposal, Reservation, Store

log = logging.getLogger(__name__)

#: Shed domains are planned finest first, so a rack's move is proposed by the rack.
KIND_ORDER = {"rack": 0, "pdu": 1, "row": 2, "room": 3, "site": 4}


def replica_of(reservation: Reservation) -> Replica:
    return Replica.model_validate(reservation.replica)


def class_of(view: View, reservation: Reservation) -> str | None:
    own = reservation.replica.get("class")
    if own:
        return str(own)
    settings = view.facility.models.get(reservation.model)
    return None if settings is None else settings.class_


@dataclass
class Counts:
    """Replicas per model (every reservation), and the moves of each already in this plan."""

    replicas: dict[str, int]
    moving: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, view: View) -> Counts:
        replicas: dict[str, int] = {}
        for reservation in view.reservations.values():
            replicas[reservation.model] = replicas.get(reservation.model, 0) + 1
        return cls(replicas)

    def running(self, model: str) -> int:
        """Replicas of the model that stay up while this plan's moves run."""
        return self.replicas.get(model, 0) - self.moving.get(model, 0)


def order_key(view: View, reservation: Reservation, counts: Counts) -> tuple[Any, ...]:
    """Lower first: class, at-minimum, larger estimate, newer, id (see the module doc)."""
    settings = view.facility.models.get(reservation.model)
    minimum = settings.minimum_replicas if settings is not None else 0
    at_minimum = counts.running(reservation.model) <= minimum
    return (
        view.facility.class_rank(class_of(view, reservation)),
        1 if at_minimum else 0,
        -reservation.estimate_watts,
        -reservation.created_at,
        reservation.id,
    )


def untouchable(view: View, reservation: Reservation, counts: Counts) -> str | None:
    """Why the replica may not move at all (a critical model at its minimum), or None."""
    settings = view.facility.models.get(reservation.model)
    if settings is None or not settings.critical:
        return None
    running = counts.running(reservation.model)
    if running > settings.minimum_replicas:
        return None
    return (
        f"critical model {reservation.model} at its minimum: {running} replica(s) running, "
        f"minimum {settings.minimum_replicas}"
    )


def in_domain(view: View, ref: DomainRef) -> list[Reservation]:
    return [r for r in view.reservations.values() if ref in view.reservation_domains(r)]


def destination(
    view: View, reservation: Reservation, excluded: Iterable[DomainRef]
) -> tuple[Verdict | None, str]:
    """The node the placement rules would put this replica on, outside `excluded` (and off its
    own node), with the rules' summary; (None, why) when no node has room."""
    excluded = set(excluded)
    replica = replica_of(reservation)
    candidates = sorted(
        node
        for node, refs in (view.snapshot.membership.items() if "membership" in view.fresh else ())
        if node != reservation.node and not excluded.intersection(refs)
    )
    if not candidates:
        return None, "no node known outside " + ", ".join(str(ref) for ref in sorted(excluded))
    decision = decide(view, replica, candidates)
    # Enforce mode's verdicts whatever the mode: an observed concern's refusals count too,
    # and the scores order as enforced (Verdict.key holds them all).
    allowed = sorted((v for v in decision.verdicts if not _refused(v)), key=lambda v: v.key)
    without_gpus = 0
    for verdict in allowed:
        node = verdict.node
        if node.gpus is not None and node.gpus - node.reserved_gpus < replica.gpus:
            without_gpus += 1
            continue
        return verdict, _rules_summary(decision.verdicts, without_gpus)
    return None, "no destination: " + _rules_summary(decision.verdicts, without_gpus)


def _refused(verdict: Verdict) -> list[tuple[str, str]]:
    """What enforce mode refuses the node for: the refusals, and those observed."""
    return verdict.refusals + verdict.would_refuse


def _rules_summary(verdicts: list[Verdict], without_gpus: int) -> str:
    refused: dict[str, int] = {}
    for verdict in verdicts:
        for rule in dict.fromkeys(rule for rule, _ in _refused(verdict)):
            refused[rule] = refused.get(rule, 0) + 1
    allowed = sum(1 for verdict in verdicts if not _refused(verdict)) - without_gpus
    parts = [f"{count} {rule}" for rule, count in sorted(refused.items(), key=lambda i: -i[1])]
    if without_gpus:
        parts.append(f"{without_gpus} without the GPUs free")
    head = f"{max(allowed, 0)}/{len(verdicts)} nodes allowed"
    return f"{head} ({', '.join(parts)})" if parts else head


def moved(view: View, reservation: Reservation, verdict: Verdict) -> View:
    """A copy of the view with the reservation on the destination node instead (the plan's
    earlier moves, seen by its later ones)."""
    node = verdict.node.node
    copy = replace(
        reservation,
        id=f"{reservation.id}\x00moved",  # a new id: View.settle counts it as added
        node=node,
        estimate_watts=verdict.estimate.watts,
        domains=view.membership(node) or (),
    )
    reservations = {k: v for k, v in view.reservations.items() if k != reservation.id}
    reservations[copy.id] = copy
    after = View(
        facility=view.facility,
        snapshot=view.snapshot,
        now=view.now,
        fresh=view.fresh,
        missing=view.missing,
        reservations=reservations,
        holds=view.holds,
    )
    after.settle(view, changed=(reservation, copy))
    return after


def original_id(reservation_id: str) -> str:
    return reservation_id.split("\x00", 1)[0]


def move_json(
    view: View, reservation: Reservation, verdict: Verdict, counts: Counts, rules: str
) -> dict[str, Any]:
    settings = view.facility.models.get(reservation.model)
    minimum = settings.minimum_replicas if settings is not None else 0
    klass = class_of(view, reservation)
    running = counts.running(reservation.model)
    return {
        "reservation": original_id(reservation.id),
        "model": reservation.model,
        "class": klass,
        "from": reservation.node,
        "to": verdict.node.node,
        "estimate_watts": round(reservation.estimate_watts, 1),
        "destination_estimate_watts": round(verdict.estimate.watts, 1),
        "destination_headroom_watts": (
            None if verdict.headroom_watts is None else round(verdict.headroom_watts, 1)
        ),
        "replicas": running,
        "minimum_replicas": minimum,
        "above_minimum": running > minimum,
        "reason": (
            f"class {klass or 'none'} (rank {view.facility.class_rank(klass)}), "
            f"{reservation.model} {running} running of minimum {minimum}; "
            f"to {verdict.node.node}: {rules}"
        ),
    }


# --- the plan ------------------------------------------------------------------------------


@dataclass
class Plan:
    enabled: bool
    entries: list[dict[str, Any]]
    missing: list[str]
    #: The pacing record after this plan: changed domains only (None: forget it).
    pacing: dict[DomainRef, Proposal | None] = field(default_factory=dict)
    #: The View the plan was made on, for `capping`.
    view: View | None = field(default=None, repr=False, compare=False)

    @cached_property
    def capping(self) -> list[dict[str, Any]]:
        """Power caps for warm or over-budget domains that are not hot (a hot one's is in its
        entry), worked out when first read: about a second at 10,000 nodes, which /metrics
        (the plan's moves only, at every scrape) must not pay (docs/benchmarks.md)."""
        return [] if self.view is None else capping_elsewhere(self.view)

    @property
    def moves(self) -> int:
        return sum(len(entry["moves"]) for entry in self.entries)

    def summary(self) -> str:
        if not self.enabled:
            return "shedding is disabled (facility file shedding.enabled: false): no plan"
        shed = [e for e in self.entries if e["shed"]]
        if not self.entries:
            return "no domain is hot: nothing to shed"
        return (
            f"{len(self.entries)} domain(s) hot, {len(shed)} hot past shedding.hot_for; "
            f"{self.moves} move(s) proposed"
        )

    def as_json(self, hot_for: float, interval: float) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "hot_for_seconds": hot_for,
            "interval_seconds": interval,
            "plan": self.entries,
            "moves": self.moves,
            "power_capping": self.capping,
            "missing": self.missing,
            "summary": self.summary(),
        }


def _window(
    proposal: Proposal | None, still_there: bool, now: float, interval: float
) -> tuple[bool, float | None]:
    """(may a new replica be proposed now, when the next one may be)."""
    if proposal is None:
        return True, None
    if still_there:
        opens = proposal.proposed_at + interval
    else:
        opens = (proposal.left_at if proposal.left_at is not None else now) + interval
    return now >= opens, opens


def capping_elsewhere(view: View) -> list[dict[str, Any]]:
    """Power caps for the domains that need one and are not hot (hot ones: in their entry)."""
    return [
        recommendation.as_json()
        for recommendation in power_capping.recommendations(view)
        if view.domain(recommendation.domain).condition != "hot"
    ]


def capping_for(view: View, ref: DomainRef) -> dict[str, Any] | None:
    recommendation = power_capping.recommend(view, ref)
    return None if recommendation is None else recommendation.as_json()


def plan(view: View, now: float, pacing: Mapping[DomainRef, Proposal]) -> Plan:
    result = _plan(view, now, pacing)
    result.view = view
    return result


def _plan(view: View, now: float, pacing: Mapping[DomainRef, Proposal]) -> Plan:
    facility = view.facility
    shedding = facility.shedding
    # Opt-in site-wide (`shedding.enabled`) or per domain (a domain's `shedding: true`; its
    # `shedding: false` keeps a site-wide opt-in off it): Facility.sheds.
    if not shedding.enabled and not any(domain.shedding for domain in facility.domains.values()):
        return Plan(False, [], [])
    missing = [
        f"{what}: no domain is shed without it"
        for part, what in (("conditions", "domain conditions"), ("hot", "how long domains are hot"))
        if part not in view.fresh
    ]
    if missing:
        return Plan(True, [], missing + list(view.missing))
    hot = sorted(
        (
            ref
            for ref, condition in view.snapshot.conditions.items()
            # An overridden domain (docs/decider.md, "Overrides") reads ok: nothing to shed.
            if condition == "hot" and view.domain(ref).condition == "hot"
        ),
        key=lambda ref: (KIND_ORDER.get(ref.kind, 9), ref.name),
    )
    seconds = view.snapshot.hot_seconds
    shed = {
        ref
        for ref in hot
        if seconds.get(ref, 0.0) >= shedding.hot_for and facility.sheds(ref.kind, ref.name)
    }
    changes: dict[DomainRef, Proposal | None] = {}
    current: dict[DomainRef, Proposal] = dict(pacing)
    counts = Counts.of(view)
    base = view  # before this plan's moves: what is really where
    taken: set[str] = set()  # reservations this plan moves
    taken_from: dict[str, DomainRef] = {}  # and the domain whose entry moves each
    entries: list[dict[str, Any]] = []
    for ref in hot:
        hot_seconds = seconds.get(ref)
        # What holds it hot, in words, where the evidence part has it (else today's words).
        found = view.snapshot.evidence.get(ref) if "evidence" in view.fresh else None
        words = None if found is None else thermal_evidence.describe(ref, "hot", found, hot_seconds)
        heat = words or f"{ref.kind} {ref.name} hot for {_duration(hot_seconds)}"
        entry: dict[str, Any] = {
            "domain": str(ref),
            "kind": ref.kind,
            "name": ref.name,
            "condition": "hot",
            "hot_seconds": hot_seconds,
            "hot_since": None if hot_seconds is None else round(now - hot_seconds, 1),
            "evidence": words,
            "shed": ref in shed,
            "moves": [],
            "skipped": [],
            "next_move_at": None,
            "power_capping": capping_for(base, ref),
        }
        entries.append(entry)
        if not facility.sheds(ref.kind, ref.name):
            entry["reason"] = (
                f"{heat}; not shed: shedding is off for {ref.kind} {ref.name} "
                f"(facility file: {'its shedding: false' if shedding.enabled else 'not opted in'})"
            )
            continue
        if ref not in shed:
            entry["reason"] = f"{heat}, shed after {_duration(shedding.hot_for)}"
            if hot_seconds is not None:
                entry["next_move_at"] = round(now - hot_seconds + shedding.hot_for, 1)
            continue
        members = in_domain(view, ref)
        ids = {r.id for r in in_domain(base, ref)}
        last = current.get(ref)
        if last is not None and last.reservation not in ids and last.left_at is None:
            last = current[ref] = changes[ref] = replace(last, left_at=now)
        still_there = last is not None and last.reservation in ids
        open_now, opens = _window(last, still_there, now, shedding.interval)
        if not open_now and opens is not None:
            entry["next_move_at"] = round(opens, 1)
        choices = sorted(
            (r for r in members if original_id(r.id) not in taken),
            key=lambda r: order_key(view, r, counts),
        )
        if not open_now:  # only the move already proposed may still be made
            choices = [r for r in choices if last is not None and r.id == last.reservation]
        chosen = None
        # A replica of the same shape as one that found no room finds none either (the
        # rules' refusals depend on the estimate alone): one placement run per shape.
        no_room: dict[tuple[Any, ...], str] = {}
        for reservation in choices:
            why = untouchable(view, reservation, counts)
            if why is None:
                why = _blocked_elsewhere(base, view, reservation, ref, shed, current, now)
            if why is None:
                shape = _shape(reservation)
                why = no_room.get(shape)
            if why is None:
                verdict, rules = destination(view, reservation, [ref])
                if verdict is not None:
                    chosen = (reservation, verdict, rules)
                    break
                why = no_room[shape] = rules
            entry["skipped"].append({"reservation": original_id(reservation.id), "reason": why})
        if chosen is None:
            if not members:
                entry["reason"] = f"{ref.kind} {ref.name}: no reservation of the decider's on it"
            elif not open_now and opens is not None and last is not None:
                moving = taken_from.get(last.reservation)
                what = (
                    f"{last.reservation} moves off {moving} in this plan and leaves it too"
                    if moving is not None
                    else f"the last proposed was {last.reservation}"
                )
                entry["reason"] = (
                    f"one replica per {_duration(shedding.interval)}: {what}; next move not "
                    f"before {opens:.0f} (in {opens - now:.0f}s)"
                )
            else:
                entry["reason"] = f"{ref.kind} {ref.name}: no replica can move"
            continue
        reservation, verdict, rules = chosen
        entry["moves"].append(move_json(view, reservation, verdict, counts, rules))
        entry["reason"] = (
            f"{heat} (shed after {_duration(shedding.hot_for)}): "
            f"move {original_id(reservation.id)} "
            f"from {reservation.node} to {verdict.node.node}"
        )
        rid = original_id(reservation.id)
        taken.add(rid)
        taken_from[rid] = ref
        counts.moving[reservation.model] = counts.moving.get(reservation.model, 0) + 1
        for other in view.reservation_domains(reservation):
            if other in shed:
                previous = current.get(other)
                if previous is None or previous.reservation != rid or previous.left_at is not None:
                    current[other] = changes[other] = Proposal(rid, now)
        entry["next_move_at"] = round(current[ref].proposed_at + shedding.interval, 1)
        view = moved(view, reservation, verdict)
    for ref, proposal in current.items():  # forget what no longer paces anything
        if ref not in shed and now >= _last_time(proposal) + shedding.interval:
            changes[ref] = None
    return Plan(True, entries, list(view.all_missing()), changes)


def _shape(reservation: Reservation) -> tuple[Any, ...]:
    replica = reservation.replica
    return tuple(replica.get(key) for key in ("profile", "gpus", "power_watts", "cpu_cores"))


def _last_time(proposal: Proposal) -> float:
    return proposal.left_at if proposal.left_at is not None else proposal.proposed_at


def _blocked_elsewhere(
    base: View,
    view: View,
    reservation: Reservation,
    ref: DomainRef,
    shed: set[DomainRef],
    current: Mapping[DomainRef, Proposal],
    now: float,
) -> str | None:
    """Why moving this replica would break another shed domain's pace, or None."""
    rid = original_id(reservation.id)
    interval = view.facility.shedding.interval
    for other in view.reservation_domains(reservation):
        if other == ref or other not in shed:
            continue
        last = current.get(other)
        if last is None or (last.reservation == rid and last.left_at is None):
            continue
        still_there = last.reservation in {r.id for r in in_domain(base, other)}
        open_now, opens = _window(last, still_there, now, interval)
        if not open_now:
            return (
                f"it also leaves {other}, which moved {last.reservation} last: one replica "
                f"per {_duration(interval)}, next not before {opens:.0f}"
            )
    return None


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "an unknown time"
    if seconds < 120:
        return f"{seconds:.0f}s"
    return f"{seconds / 60:.0f}m"


class Shedder:
    """The pacing record, kept in the database, and the plan on the current view."""

    def __init__(
        self,
        store: Store,
        view: Callable[[], View],
        clock: Callable[[], float],
        record: Callable[[dict[DomainRef, Proposal | None]], None] | None = None,
    ) -> None:
        self._view = view
        self._clock = clock
        self._record = record or store.set_proposals  # State.record_proposals in the service
        self._lock = threading.Lock()
        self._pacing = store.proposals()

    def plan(self) -> Plan:
        with self._lock:  # two plans at once must not both open the same domain's window
            result = plan(self._view(), self._clock(), self._pacing)
            if result.pacing:
                self._record(result.pacing)
                pacing = dict(self._pacing)
                for ref, proposal in result.pacing.items():
                    if proposal is None:
                        pacing.pop(ref, None)
                    else:
                        pacing[ref] = proposal
                self._pacing = pacing
            return result


# --- the loss of a feed --------------------------------------------------------------------


def failover(view: View, pdu: str) -> dict[str, Any]:
    """What the loss of `pdu` does to the racks it feeds (see the module doc)."""
    facility = view.facility
    fed = [
        (ref, declared)
        for ref, declared in facility.declared()
        if any(feed.pdu == pdu for feed in declared.feeds)
    ]
    affected = {ref for ref, _ in fed} | {DomainRef("pdu", pdu)}
    counts = Counts.of(view)
    domains: list[dict[str, Any]] = []
    over = 0
    for ref, declared in fed:
        derating = facility.derating(ref.kind, ref.name)  # its own, else the site's
        domain = view.domain(ref)
        survivors = [feed for feed in declared.feeds if feed.pdu != pdu]
        load = domain.load
        entry: dict[str, Any] = {
            "domain": str(ref),
            "kind": ref.kind,
            "name": ref.name,
            "load_watts": round(load, 1),
            "load_basis": domain.load_basis,
            "reserved_watts": round(domain.reserved, 1),
            "measured_watts": domain.measured,
            "other_watts": domain.other_watts,
            "surviving_feeds": [
                {
                    "pdu": feed.pdu,
                    "rating_watts": feed.rating_watts,
                    "limit_watts": round(feed.rating_watts * derating, 1),
                }
                for feed in survivors
            ],
            "moves": [],
        }
        domains.append(entry)
        if not survivors:
            entry["over"] = True
            entry["unpowered"] = True
            entry["reason"] = f"{ref.kind} {ref.name}: fed by {pdu} alone, loses power"
            over += 1
            continue
        share = load / len(survivors)
        tightest = min(feed.rating_watts * derating for feed in survivors)
        entry["share_watts"] = round(share, 1)
        entry["limit_watts"] = round(tightest, 1)
        entry["unpowered"] = False
        entry["over"] = share > tightest
        names = ", ".join(feed.pdu for feed in survivors)
        figures = (
            f"{load / 1000:.1f} kW {domain.load_basis} on {names}: "
            f"{share / 1000:.1f} kW per feed of {tightest / 1000:.1f} kW "
            f"(rating × derating {derating:g})"
        )
        if not entry["over"]:
            entry["reason"] = f"{ref.kind} {ref.name} within its surviving feeds: {figures}"
            continue
        over += 1
        excess = (share - tightest) * len(survivors)  # watts off the rack to bring it under
        entry["excess_watts"] = round(excess, 1)
        freed = 0.0
        members = in_domain(view, ref)
        while freed < excess:
            choices = sorted(members, key=lambda r: order_key(view, r, counts))
            chosen = None
            for reservation in choices:
                if untouchable(view, reservation, counts) is not None:
                    continue
                verdict, rules = destination(view, reservation, affected)
                if verdict is not None:
                    chosen = (reservation, verdict, rules)
                    break
            if chosen is None:
                break
            reservation, verdict, rules = chosen
            entry["moves"].append(move_json(view, reservation, verdict, counts, rules))
            counts.moving[reservation.model] = counts.moving.get(reservation.model, 0) + 1
            freed += reservation.estimate_watts
            members = [r for r in members if r.id != reservation.id]
            view = moved(view, reservation, verdict)
        short = max(0.0, excess - freed)
        entry["short_watts"] = round(short, 1)
        tail = f"; moving {len(entry['moves'])} replica(s) frees {freed / 1000:.1f} kW" + (
            f", still {short / 1000:.1f} kW over: no more can move" if short > 0 else ""
        )
        entry["reason"] = f"{ref.kind} {ref.name} over its surviving feeds: {figures}{tail}"
    return {
        "pdu": pdu,
        "domains": domains,
        "over": over,
        "missing": list(view.all_missing()),
        "summary": (
            f"loss of pdu {pdu}: {len(fed)} domain(s) fed, {over} over what survives"
            if fed
            else f"loss of pdu {pdu}: no domain of the facility file is fed by it"
        ),
    }


class SheddingCollector(Collector):
    """`llmgw_decider_shedding_moves{kind,domain}`: the moves proposed now off each domain
    (present only while a plan proposes some), and `llmgw_decider_shedding_enabled`."""

    def __init__(self, shedder: Shedder) -> None:
        self._shedder = shedder

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            result = self._shedder.plan()
        except Exception:  # a plan that fails (a full disk) must not fail the whole scrape
            log.exception("the shedding plan failed; /metrics goes on without its series")
            return
        enabled = GaugeMetricFamily(
            "llmgw_decider_shedding_enabled",
            "1 while the facility file enables shedding plans (shedding.enabled).",
        )
        enabled.add_metric([], 1.0 if result.enabled else 0.0)
        yield enabled
        moves = GaugeMetricFamily(
            "llmgw_decider_shedding_moves",
            "Replicas the shedding plan (GET /v1/shedding) proposes to move off the domain now.",
            labels=["kind", "domain"],
        )
        for entry in result.entries:
            if entry["moves"]:
                moves.add_metric([entry["kind"], entry["name"]], len(entry["moves"]))
        yield moves
