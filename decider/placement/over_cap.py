"""Refuse a node any of whose domains is already over its cap: no new placements there,
whatever the replica's size (DESIGN.md §5).

A domain with no budget is never over it. Without a fresh measurement the load is what is
reserved, plus the domain's `other_watts`.
"""

from __future__ import annotations

from decider.placement.view import DomainState

name = "over_cap"


def refuse(domain: DomainState) -> str | None:
    if domain.cap is None or domain.load <= domain.cap:
        return None
    return (
        f"{domain.ref.kind} {domain.ref.name}: over its cap, {kw(domain.load)} of "
        f"{kw(domain.cap)} kW {domain.load_basis}{other(domain)}"
    )


def kw(watts: float) -> str:
    return f"{watts / 1000:.1f}"


def other(domain: DomainState) -> str:
    return f" (incl. {kw(domain.other_watts)} other)" if domain.other_watts else ""
