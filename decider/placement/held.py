"""Refuse a node any of whose domains the facility team holds (`POST …/hold`).

No data needed: a hold is the decider's own record. It refuses in every condition.
"""

from __future__ import annotations

from decider.placement.view import DomainState

name = "held"


def refuse(domain: DomainState) -> str | None:
    if domain.held is None:
        return None
    return f"{domain.ref.kind} {domain.ref.name} held: {domain.held.reason}"
