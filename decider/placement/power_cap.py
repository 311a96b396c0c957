"""Refuse a node if the replica would take any of its domains, or phases of its three-phase
pdus, past their limit, naming each and its figures (DESIGN.md §5, rule 1).

The limit is cap × (1 − margin), worked out with the domain's margin where the View builds
its figures (decider.placement.states.limit_watts); `room` is what is left under it. The
load is the larger of reserved and measured plus `other_watts`; a dual-fed rack's cap is its
smallest feed × derating (decider.facility). A domain with no budget never refuses, and a
missing measurement leaves the reserved figure alone. A domain already over its cap is
refused by over_cap instead, not twice. An oversubscribed domain on its predicted basis is
judged by predicted_peak instead, against the replica's peak. Concern `power`.
"""

from __future__ import annotations

from decider.placement.over_cap import other
from decider.placement.states import Budgeted, kw

name = "power_cap"
concern = "power"
reads = frozenset({"cap", "room", "load", "load_basis", "other_watts", "margin", "prediction"})


def refuse(domain: Budgeted, estimate_watts: float) -> str | None:
    if domain.cap is None or not exceeds(domain.room, estimate_watts) or domain.load > domain.cap:
        return None
    if domain.prediction is not None and domain.prediction.predicted:
        return None
    # An oversubscribed domain judged by today's rule says why (decider.placement.predicted_peak).
    fallback = "" if domain.prediction is None else f" ({domain.prediction.why})"
    return (
        f"{domain.label}: {kw(domain.load)} of {kw(domain.cap)} kW "
        f"{domain.load_basis}{other(domain)}, replica needs ~{kw(estimate_watts)}, "
        f"margin {domain.margin * 100:g}%{fallback}"
    )


def exceeds(room: float | None, estimate_watts: float) -> bool:
    """Whether a replica of `estimate_watts` takes a domain with `room` left under its limit
    past it (None: no budget, never): the test here and in the headroom dry run
    (decider.placement.capacity), which asks it of the room its own replicas left."""
    return room is not None and estimate_watts > room
