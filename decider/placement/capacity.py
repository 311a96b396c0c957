"""`GET /v1/headroom`: how many more replicas of a profile fit in each domain, and what binds.

The scheduler's dry run, on a copy: for each domain, its member nodes (by name) take
replicas one at a time while the node has free GPUs and the placement rules allow it: no
domain or phase of the node refused by the filters that need no estimate (held, hot,
over_cap: rules.domain_refusals, as `judge` runs them), and none taken past its limit by
one more replica (power_cap.exceeds, on the room the View works out, cap × (1 − margin) less
the load, less what this dry run already placed). Nothing is reserved. The count is `None`
(unbounded) when nothing limits it: no budget on any of the nodes' domains and no GPU count
to exhaust.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass

from decider.facility import PHASES, DomainRef, Profile
from decider.models import Replica
from decider.placement import power_cap
from decider.placement.estimate import estimate
from decider.placement.view import View

#: Past this many replicas on one node the count is reported as unbounded.
UNBOUNDED = 10_000


@dataclass(frozen=True)
class Fit:
    domain: DomainRef
    replicas: int | None  # None: unbounded
    binds: list[tuple[str, int]]  # (what stopped a node, how many nodes it stopped)


@dataclass(frozen=True)
class PhaseFit:
    phase: str
    fit: Fit  # over the pdu's nodes on this phase


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


def phase_fits(view: View, profile_name: str, profile: Profile) -> dict[str, list[PhaseFit]]:
    """Per phased pdu, per phase: the dry run over the pdu's nodes on that phase, and those
    the file gives no phase (they count against every phase, so they are in each)."""
    from decider.placement import phases

    if not view.phased_pdus:
        return {}
    replica = replica_of(profile_name, profile)
    found: dict[str, list[PhaseFit]] = {}
    for pdu in sorted(view.phased_pdus):
        ref = DomainRef("pdu", pdu)
        members = phases.phase_members(view, pdu)
        found[pdu] = [
            PhaseFit(
                phase,
                _fit_domain(view, replica, ref, members.get(phase, []) + members.get(None, [])),
            )
            for phase in PHASES
        ]
    return found


def _fit_domain(view: View, replica: Replica, ref: DomainRef, nodes: list[str]) -> Fit:
    rooms: dict[Hashable, float] = {}  # by DomainRef, and (pdu, phase) for phases
    binds: Counter[str] = Counter()
    placed = 0
    unbounded = False
    site_limit = view.site_gpu_limit_watts
    refuse = view.domain_refusals
    if not nodes:
        binds["no member nodes known"] = 0
    for name in nodes:
        node = view.node(name)
        every = view.all_domains(node)
        # The placement filters that need no estimate (held, hot, over_cap, any registered:
        # rules.domain_refusals, as judge runs them); the first stops the node.
        refusals = [reason for each in (*every, *node.phases) for _, reason in refuse(each)]
        if refusals:
            binds[refusals[0]] += 1
            continue
        watts = estimate(replica, node, view.facility, site_limit).watts
        free_gpus = None if node.gpus is None else node.gpus - node.reserved_gpus
        # (key, how a reason names it, room): budgeted domains, then the node's phases
        budgeted: list[tuple[Hashable, str, float]] = [
            (domain.ref, f"{domain.ref.kind} {domain.ref.name}", domain.room)
            for domain in every
            if domain.room is not None
        ]
        budgeted += [((p.pdu.name, p.phase), p.label, p.room) for p in node.phases]
        for key, _, room in budgeted:
            rooms.setdefault(key, room)
        count = 0
        while True:
            if free_gpus is not None and replica.gpus and free_gpus < replica.gpus:
                binds[f"GPUs: {name} has {max(free_gpus, 0)} free"] += 1
                break
            tight = min(budgeted, key=lambda entry: rooms[entry[0]], default=None)
            if tight is not None and power_cap.exceeds(rooms[tight[0]], watts):
                binds[
                    f"power: {tight[1]} has {_kw_down(max(rooms[tight[0]], 0))} kW left, "
                    f"a replica needs ~{_kw_up(watts)}"
                ] += 1
                break
            if count >= UNBOUNDED or (tight is None and (free_gpus is None or not replica.gpus)):
                unbounded = True
                break
            for key, _, _ in budgeted:
                rooms[key] -= watts
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
