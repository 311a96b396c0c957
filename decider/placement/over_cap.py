"""Refuse a node any of whose domains, or phases of its three-phase pdus, is already over
its cap: no new placements there, whatever the replica's size (DESIGN.md §5).

A domain with no budget is never over it. Without a fresh measurement the load is what is
reserved, plus the domain's `other_watts`; a phase's load is always reserved
(decider.placement.phases). Concern `power`.
"""

from __future__ import annotations

from decider.placement.states import Budgeted, kw

name = "over_cap"
concern = "power"
reads = frozenset({"cap", "load", "load_basis", "other_watts"})


def refuse(domain: Budgeted) -> str | None:
    if domain.cap is None or domain.load <= domain.cap:
        return None
    return (
        f"{domain.label}: over its cap, {kw(domain.load)} of "
        f"{kw(domain.cap)} kW {domain.load_basis}{other(domain)}"
    )


def other(domain: Budgeted) -> str:
    return f" (incl. {kw(domain.other_watts)} other)" if domain.other_watts else ""
