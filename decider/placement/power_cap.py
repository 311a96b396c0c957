"""Refuse a node if the replica would take any of its domains past cap × (1 − margin),
naming each such domain and its figures (DESIGN.md §5, rule 1).

The load is the larger of reserved and measured plus `other_watts` (decider.placement.view);
a dual-fed rack's cap is its smallest feed × derating (decider.facility). A domain with no
budget never refuses, and a missing measurement leaves the reserved figure alone. A domain
already over its cap is refused by over_cap instead, not twice.
"""

from __future__ import annotations

from decider.placement.over_cap import kw, other
from decider.placement.view import DomainState

name = "power_cap"


def refuse(domain: DomainState, estimate_watts: float, margin: float) -> str | None:
    room = domain.room
    if room is None or domain.cap is None or estimate_watts <= room or domain.load > domain.cap:
        return None
    return (
        f"{domain.ref.kind} {domain.ref.name}: {kw(domain.load)} of {kw(domain.cap)} kW "
        f"{domain.load_basis}{other(domain)}, replica needs ~{kw(estimate_watts)}, "
        f"margin {margin * 100:g}%"
    )
