"""The shedding plan: which hot domains are shed, which replica moves off each, how fast.

`plan` is a pure function of a View, the time and the pacing record (the last move
proposed off each domain); which replica and to where: `decider.shedding.moves`.

- **Which domains.** A domain `hot` now (a fresh condition) and hot for at least
  `shedding.hot_for`, by the snapshot's `hot` part: Prometheus' own record of the
  condition, so a restart of the decider does not restart the delay. Without a fresh `hot`
  or `conditions` part no domain is shed, and `missing` says why: a move is disruptive, and
  missing data must not cause one.
- **Which replica.** The first in `moves.order_key` that may move and has a destination; a
  replica with no such node is skipped, with the reason, and the next one in order is
  tried.
- **How fast.** At most one move per domain per `shedding.interval`: after a move is
  proposed, no other replica of the domain is proposed until it has been seen gone and an
  interval has passed since (or an interval has passed with it still there: the plan may
  then choose again). A move counts against every shed domain it leaves (a rack's move is
  also its row's).

**Capping instead of moving** (docs/power-capping.md): each hot entry carries
`power_capping`, the GPU power limit that would bring that domain back under its target
(`decider.power_capping.recommend` on the view before this plan's moves; null where no
reading asks for one), and the plan's top-level `power_capping` lists the same for every
warm or over-budget domain that is not hot. Both are recommendations, as the moves are, and
they are worked out whether shedding is enabled or not: capping needs no replica to move.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from decider import power_capping
from decider.facility import DomainRef
from decider.placement import evidence as thermal_evidence
from decider.placement.view import View
from decider.shedding.moves import (
    Counts,
    destination,
    in_domain,
    move_json,
    moved,
    order_key,
    original_id,
    untouchable,
)
from decider.store import Proposal, Reservation

#: Shed domains are planned finest first, so a rack's move is proposed by the rack.
KIND_ORDER = {"rack": 0, "pdu": 1, "row": 2, "room": 3, "site": 4}


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
