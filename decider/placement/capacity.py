"""`GET /v1/headroom`: how many more replicas of a profile fit in each domain, and what binds.

The scheduler's dry run, on a copy: for each domain, its member nodes (by name) take
replicas one at a time while the node has free GPUs and every domain of the node has power
room (cap × (1 − margin), less what this dry run already placed) and none of them is hot,
held or over its cap. Nothing is reserved. The count is `None` (unbounded) when nothing
limits it: no budget on any of the nodes' domains and no GPU count to exhaust.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from decider.facility import DomainRef, Profile
from decider.models import Replica
from decider.placement.estimate import estimate
from decider.placement.view import View

#: Past this many replicas on one node the count is reported as unbounded.
UNBOUNDED = 10_000


@dataclass(frozen=True)
class Fit:
    domain: DomainRef
    replicas: int | None  # None: unbounded
    binds: list[tuple[str, int]]  # (what stopped a node, how many nodes it stopped)


def replica_of(name: str, profile: Profile) -> Replica:
    return Replica(
        model=name,
        profile=name,
        gpus=profile.gpus,
        cpu_cores=profile.cpu_cores,
        power_watts=profile.power_watts,
    )


def fits(view: View, profile_name: str, profile: Profile) -> list[Fit]:
    replica = replica_of(profile_name, profile)
    members: dict[DomainRef, list[str]] = {}
    if "membership" in view.fresh:
        for node, refs in view.snapshot.membership.items():
            for ref in refs:
                members.setdefault(ref, []).append(node)
    results = []
    for ref in sorted(view.domain_refs):
        results.append(_fit_domain(view, replica, ref, sorted(members.get(ref, []))))
    return results


def _fit_domain(view: View, replica: Replica, ref: DomainRef, nodes: list[str]) -> Fit:
    rooms: dict[DomainRef, float] = {}
    binds: Counter[str] = Counter()
    placed = 0
    unbounded = False
    site_limit = view.site_gpu_limit_watts
    if not nodes:
        binds["no member nodes known"] = 0
    for name in nodes:
        node = view.node(name)
        every = view.all_domains(node)
        refusals = [reason for domain in every for _, reason in domain.refusals]
        if refusals:
            binds[refusals[0]] += 1
            continue
        watts = estimate(replica, node, view.facility, site_limit).watts
        free_gpus = None if node.gpus is None else node.gpus - node.reserved_gpus
        budgeted = [domain for domain in every if domain.room is not None]
        for domain in budgeted:
            rooms.setdefault(domain.ref, domain.room or 0.0)
        count = 0
        while True:
            if free_gpus is not None and replica.gpus and free_gpus < replica.gpus:
                binds[f"GPUs: {name} has {max(free_gpus, 0)} free"] += 1
                break
            tight = min(budgeted, key=lambda domain: rooms[domain.ref], default=None)
            if tight is not None and rooms[tight.ref] < watts:
                binds[
                    f"power: {tight.ref.kind} {tight.ref.name} has "
                    f"{_kw_down(max(rooms[tight.ref], 0))} kW left, a replica needs "
                    f"~{_kw_up(watts)}"
                ] += 1
                break
            if count >= UNBOUNDED or (tight is None and (free_gpus is None or not replica.gpus)):
                unbounded = True
                break
            for domain in budgeted:
                rooms[domain.ref] -= watts
            if free_gpus is not None:
                free_gpus -= replica.gpus
            count += 1
        placed += count
    return Fit(ref, None if unbounded else placed, binds.most_common())


def _kw_down(watts: float) -> str:
    """kW to one decimal, rounded down: room is never shown larger than it is."""
    return f"{math.floor(watts / 100) / 10:.1f}"


def _kw_up(watts: float) -> str:
    """kW to one decimal, rounded up: a need is never shown smaller than it is."""
    return f"{math.ceil(watts / 100) / 10:.1f}"
