"""Refuse a node any of whose domains is `hot` (DESIGN.md §3, §5).

A domain with no fresh condition is `unknown` and is not refused: missing data never blocks.
"""

from __future__ import annotations

from decider.placement.view import DomainState

name = "hot"


def refuse(domain: DomainState) -> str | None:
    if domain.condition != "hot":
        return None
    age = "" if domain.reading_age is None else f" (reading {domain.reading_age:.0f}s old)"
    return f"{domain.ref.kind} {domain.ref.name} hot{age}"
