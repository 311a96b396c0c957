"""Which replica moves off a domain, and to where: shared by the shedding plan and failover.

- **Which replica.** The domain's replicas are the decider's reservations on its nodes.
  Ordered (`order_key`): lowest class first (`classes` in the facility file; a replica's
  own `class` overrides its model's; no class, or one not listed, ranks below every listed
  class); then replicas whose model has more replicas than its `minimum_replicas` before
  those at it; then the larger estimate (more heat off the domain per move); then the
  newest; then the id. A critical model's replica never moves while the model has no more
  than its minimum (`untouchable`, counting the moves already in the plan: they run
  concurrently).
- **To where.** Through the placement rules themselves (`decider.placement.decide`), over
  every node the decider knows, in name order, outside the domain: the first allowed node
  in the rules' order that also has the GPUs free (where its GPU count is known). Enforce
  mode's verdicts are used whatever the mode: a plan is a recommendation, and a move into
  a refused node would be no move at all. Each move is applied to a copy of the view
  (`moved`) before the next is chosen, so two moves cannot both take the same last room.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from decider.facility import DomainRef
from decider.models import Replica
from decider.placement import Verdict, decide
from decider.placement.view import View
from decider.store import Reservation


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
