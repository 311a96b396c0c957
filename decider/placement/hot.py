"""Refuse a node any of whose domains is `hot` (DESIGN.md §3, §5).

A domain with no fresh condition is `unknown` and is not refused: missing data never blocks.
The reason names what holds it hot, with its figures and for how long, where the evidence
part has them (decider.placement.evidence): `rack r12-07 hot: inlet 33.1 °C over its 32 °C
hot threshold for 6 min (reading 14s old)`; without, `rack r12-07 hot (reading 14s old)`.
Concern `thermal`: observed, it is reported as would_refuse and not applied.
"""

from __future__ import annotations

from decider.placement import evidence
from decider.placement.states import Budgeted

name = "hot"
concern = "thermal"
reads = frozenset({"condition", "reading_age", "evidence", "ref"})


def refuse(domain: Budgeted) -> str | None:
    if domain.condition != "hot":
        return None
    age = "" if domain.reading_age is None else f" (reading {domain.reading_age:.0f}s old)"
    words = evidence.words(domain.ref, "hot", domain.evidence)
    return f"{words or f'{domain.label} hot'}{age}"
