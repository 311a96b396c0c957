"""The decider's state: facility file, latest snapshot, reservations, holds and overrides.

Writers (reservations, holds, refreshes, reloads) take one lock, write SQLite first, then
swap in a new View; readers take `view()` without a lock. Check-and-reserve happens under
the lock, so two concurrent reservations never both take the last room (DESIGN.md §5).

An override (docs/decider.md, "Overrides") is in a View only while it has not expired: a View
is valid until the first override in it expires, and the sweep (`expire`) deletes expired
overrides from the database.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from decider.config import Staleness
from decider.facility import DomainRef, Facility
from decider.giving_way import Collector, Pause, giving_way, no_pause, paced
from decider.models import ReservationRequest
from decider.placement import Verdict, answers, judge, missing, observed, predicted_peak
from decider.placement.view import View
from decider.snapshot import INVENTORY_PARTS, Snapshot
from decider.store import Hold, Override, Proposal, Reservation, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReserveOutcome:
    reservation: Reservation | None  # None: refused
    verdict: Verdict | None  # None: an existing reservation was returned
    created: bool
    conflict: str | None = None  # the id exists with another node or replica
    missing: tuple[str, ...] = ()


class State:
    def __init__(
        self,
        facility: Facility,
        store: Store,
        reservation_ttl: float,
        staleness: Staleness,
        clock: Callable[[], float] = time.time,
        collector: Collector | None = None,
    ) -> None:
        """`collector`: the runtime policy's handling of the garbage collector around Views
        (decider.giving_way.Collector; the service's, else a default one)."""
        self._lock = threading.Lock()
        self.collector = collector if collector is not None else Collector()
        self._clock = clock
        self.store = store
        self._facility = facility
        self._ttl = reservation_ttl
        self._staleness = staleness
        self._snapshot = Snapshot()
        self._reservations = {r.id: r for r in store.reservations()}
        self._holds = store.holds()
        self._overrides = store.overrides()
        self._view = self._build()

    # --- reading ------------------------------------------------------------------------------

    def view(self) -> View:
        """The current view; rebuilt when a snapshot part has gone stale since it was built."""
        view = self._view
        if self._clock() >= self._valid_until:
            with self._lock:
                if self._clock() >= self._valid_until:
                    self._view = self._build()
                view = self._view
        return view

    @property
    def facility(self) -> Facility:
        return self._facility

    def record_proposals(self, changed: dict[DomainRef, Proposal | None]) -> None:
        """Write the shedding pacing (decider.shedding) under the writers' lock: one SQLite
        connection serves every writer."""
        with self._lock:
            self.store.set_proposals(changed)

    def _build(
        self,
        changed: tuple[Reservation, ...] = (),
        held: tuple[DomainRef, ...] = (),
        start: View | None = None,
    ) -> View:
        """A new view of the current state; after a write (`changed` reservations, `held`
        domains) it starts from the current view's figures (View.settle), or `start`'s."""
        view, self._valid_until = self._new_view(self._snapshot)
        previous = start or getattr(self, "_view", None)
        if previous is not None and (changed or held):
            redone = view.settle(previous, changed, held)
            # The answer cache's entries that still hold carry over (decider.placement.
            # answers): the cache sits beside the View, which knows nothing of it.
            answers.settled(view, previous, redone)
            # The placement answers' shapes asked about lately, made before the View is
            # swapped in: the change pays for them, not the next placement.
            answers.prepare(view)
            # And the View's new dicts out of the collector's sight (the runtime policy's:
            # decider.giving_way.Collector).
            self.collector.changed()
        return view

    def _new_view(self, snapshot: Snapshot) -> tuple[View, float]:
        """A View of `snapshot` and the current file, reservations and holds, its figures
        worked out on first use; and the time its first fresh part goes stale."""
        now = self._clock()
        fresh, missing = snapshot.fresh_parts(
            now, self._staleness.readings, self._staleness.inventory
        )
        ends = [
            part.read_at
            + (self._staleness.inventory if name in INVENTORY_PARTS else self._staleness.readings)
            for name, part in snapshot.parts.items()
            if name in fresh and part.read_at is not None
        ]
        view = View(
            facility=self._facility,
            snapshot=snapshot,
            now=now,
            fresh=fresh,
            missing=missing,
            reservations=self._reservations,
            holds=self._holds,
            overrides=self._active_overrides(now),
        )
        # The View reads an override only while it is active: it is rebuilt when one ends.
        ends += [override.expires_at for override in view.overrides.values()]
        return view, min(ends, default=math.inf)

    def _since(self, view: View) -> tuple[tuple[Reservation, ...], tuple[DomainRef, ...]]:
        """The reservations and holds that changed since `view` was built (under the lock)."""
        now, then = self._reservations, view.reservations
        changed = tuple(r for key, r in now.items() if then.get(key) is not r)
        changed += tuple(r for key, r in then.items() if key not in now)
        held = tuple(
            ref
            for ref in {*self._holds, *view.holds}
            if self._holds.get(ref) is not view.holds.get(ref)
        )
        return changed, held

    # --- changes from outside -----------------------------------------------------------------

    def set_snapshot(self, snapshot: Snapshot, pause: Pause = no_pause) -> None:
        """Swap in a View of `snapshot`, worked out first; `pause` is called every
        PAUSE_EVERY nodes meanwhile (the refresher's, decider.giving_way)."""
        # The snapshot becomes the current one only with its View, once worked out: until
        # then writes settle from the current View, whose figures they keep, rather than
        # make Views of the new snapshot that every placement would work out from scratch
        # (10,000 candidates: 0.7 s on the event loop's thread).
        with self._lock:
            view, valid_until = self._new_view(snapshot)
        # Work out every domain's and node's state here, on the refresher's thread, not in
        # the first placement after it, giving way to requests in flight (nobody reads this
        # View yet), the collector as the runtime policy says (decider.giving_way).
        with self.collector.off(), giving_way(pause):
            view.work_out_domains()
            for node in paced(snapshot.membership):
                view.node(node)
            # And the placement answers' entries for the replica shapes asked about lately.
            answers.warm(view, self._view)
        with self._lock:
            self._snapshot = snapshot
            current = self._view  # freed below, once no request is in flight
            if (
                current.reservations is view.reservations
                and current.holds is view.holds
                and self._active_overrides() == view.overrides
                and current.facility is view.facility
            ):
                self._view, self._valid_until = view, valid_until  # the warmed view
            elif self._active_overrides() != view.overrides:
                # An override set, ended or expired meanwhile: a View made anew (see
                # `override`).
                self._view = self._build()
            else:
                # Writes (or a reload) came in meanwhile: a view with them that starts from
                # the warmed view's figures. A refresh of a 10,000-node site takes about a
                # second, more while it gives way; a busy scheduler reserves in it.
                self._view = self._build(*self._since(view), start=view)
        pause()
        del current  # the View before: 10,000 nodes' states and entries, 10 to 20 ms to free
        self.collector.refreshed()

    def set_facility(
        self, facility: Facility, reservation_ttl: float, staleness: Staleness
    ) -> None:
        with self._lock:
            self._facility = facility
            self._ttl = reservation_ttl
            self._staleness = staleness
            self._view = self._build()

    # --- reservations -------------------------------------------------------------------------

    def reserve(self, request: ReservationRequest) -> ReserveOutcome:
        """Check the node and reserve in one step; StoreError if the database fails."""
        replica = request.replica.model_dump(by_alias=True, exclude_none=True)
        with self._lock:
            view = self._view if self._clock() < self._valid_until else self._build()
            existing = self._reservations.get(request.id)
            if existing is not None:
                if existing.node == request.node and existing.replica == replica:
                    self.store.check_files()  # acknowledged again only if a restart keeps it
                    return ReserveOutcome(existing, None, created=False)
                return ReserveOutcome(
                    None,
                    None,
                    created=False,
                    conflict=f"reservation {request.id!r} exists for node {existing.node} "
                    "with another replica or node; DELETE it first",
                )
            node = view.node(request.node)
            verdict = judge(view, request.replica, node, view.site_gpu_limit_watts)
            notes = tuple(missing(view, [verdict]))
            observed.WOULD_REFUSE.decision(
                "reservation",
                f"{request.id} on {request.node}",
                1,
                ((request.node, rule, reason) for rule, reason in verdict.would_refuse),
            )
            if verdict.refusals:  # those of enforced concerns (would_refuse: observed)
                return ReserveOutcome(None, verdict, created=False, missing=notes)
            now = self._clock()
            reservation = Reservation(
                id=request.id,
                node=request.node,
                replica=replica,
                estimate_watts=verdict.estimate.watts,
                gpus=request.replica.gpus,
                domains=view.membership(request.node) or (),
                created_at=now,
                expires_at=now + self._ttl,
                host_watts=predicted_peak.host_rest_watts(
                    request.replica.gpus,
                    node.gpus,
                    node.reserved_gpus,
                    view.facility.node_share_watts,
                ),
            )
            if not self.store.add(reservation):  # cannot happen under the lock; be loud
                raise RuntimeError(f"reservation {request.id!r} appeared in the database")
            self._reservations = {**self._reservations, reservation.id: reservation}
            self._view = self._build(changed=(reservation,))
            return ReserveOutcome(reservation, verdict, created=True, missing=notes)

    def confirm(self, reservation_id: str) -> Reservation | None:
        with self._lock:
            existing = self._reservations.get(reservation_id)
            if existing is None:
                return None
            if existing.confirmed_at is not None:
                self.store.check_files()  # acknowledged again only if a restart keeps it
                return existing
            now = self._clock()
            self.store.confirm(reservation_id, now)
            confirmed = Reservation(
                **{
                    **{f: getattr(existing, f) for f in Reservation.__slots__},
                    "expires_at": None,
                    "confirmed_at": now,
                }
            )
            self._reservations = {**self._reservations, reservation_id: confirmed}
            self._view = self._build(changed=(confirmed,))
            return confirmed

    def release(self, reservation_id: str) -> bool:
        with self._lock:
            if reservation_id not in self._reservations:
                return False
            self.store.delete([reservation_id])
            released = self._reservations[reservation_id]
            remaining = dict(self._reservations)  # a copy in one C call: 2,500 of them
            del remaining[reservation_id]
            self._reservations = remaining
            self._view = self._build(changed=(released,))
            return True

    def expire(self) -> list[str]:
        """Drop unconfirmed reservations past their TTL, and overrides past their expiry;
        the reservation ids dropped."""
        now = self._clock()
        self._end_expired_overrides(now)
        with self._lock:
            expired = [
                r.id
                for r in self._reservations.values()
                if r.expires_at is not None and r.expires_at <= now
            ]
            if not expired:
                return []
            self.store.delete(expired)
            gone = set(expired)
            dropped = tuple(self._reservations[key] for key in expired)
            self._reservations = {k: v for k, v in self._reservations.items() if k not in gone}
            self._view = self._build(changed=dropped)
        log.info("expired %d unconfirmed reservations: %s", len(expired), ", ".join(expired))
        return expired

    def reservations(self) -> list[Reservation]:
        return sorted(self._reservations.values(), key=lambda r: (r.created_at, r.id))

    # --- holds --------------------------------------------------------------------------------

    def hold(self, domain: DomainRef, reason: str) -> Hold:
        with self._lock:
            hold = Hold(domain, reason, self._clock())
            self.store.hold(hold)
            self._holds = {**self._holds, domain: hold}
            self._view = self._build(held=(domain,))
            return hold

    def release_hold(self, domain: DomainRef) -> bool:
        with self._lock:
            if domain not in self._holds:
                return False
            self.store.release(domain)
            self._holds = {key: value for key, value in self._holds.items() if key != domain}
            self._view = self._build(held=(domain,))
            return True

    # --- overrides ----------------------------------------------------------------------------

    def overrides(self) -> dict[DomainRef, Override]:
        """The overrides in force now (an expired one reads as gone before the sweep drops
        it)."""
        return self._active_overrides()

    def override(self, domain: DomainRef, reason: str, seconds: float, by: str) -> Override:
        """Clear the domain's condition for `seconds` (bounds checked by the caller: the
        API's model, decider.models.OverrideRequest); a second override replaces the first."""
        with self._lock:
            now = self._clock()
            override = Override(domain, reason, by, now, now + seconds)
            self.store.override(override)
            self._overrides = {**self._overrides, domain: override}
            # A View made anew, not settled from the current one: a node's condition is
            # that of its row, room and site too, which settling a domain does not redo
            # (overrides are rare; the next placement pays for the node states).
            self._view = self._build()
            return override

    def end_override(self, domain: DomainRef) -> bool:
        """End the domain's override now; False if it had none in force."""
        with self._lock:
            override = self._overrides.get(domain)
            if override is None:
                return False
            self.store.end_overrides([domain])
            self._overrides = {k: v for k, v in self._overrides.items() if k != domain}
            self._view = self._build()  # anew, as in `override`
            return override.active(self._clock())

    def _active_overrides(self, now: float | None = None) -> dict[DomainRef, Override]:
        at = self._clock() if now is None else now
        return {ref: o for ref, o in self._overrides.items() if o.active(at)}

    def _end_expired_overrides(self, now: float) -> None:
        """Delete the overrides past their expiry (the Views stopped reading them then)."""
        if not any(not o.active(now) for o in self._overrides.values()):
            return
        with self._lock:
            expired = [ref for ref, o in self._overrides.items() if not o.active(now)]
            if not expired:
                return
            self.store.end_overrides(expired)
            self._overrides = {k: v for k, v in self._overrides.items() if k not in expired}
        for ref in expired:
            log.info("the override of %s expired", ref)
