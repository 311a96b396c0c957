"""Prefer racks and PDUs with fewer reserved replicas of the same model (DESIGN.md §5,
rule 3): a preference only, after condition and rack room; it never refuses a node.

A node with unknown membership has no rack or PDU to count: 0. No concern of its own: it
orders whenever some concern is enforced.
"""

from __future__ import annotations

import math

from decider.placement.states import FINE_KINDS, Ask, NodeState

name = "spread"
concern = None
reads = frozenset({"domains"})
lowest, highest = 0, math.inf


def score(node: NodeState, ask: Ask) -> int:
    counts = ask.spread_counts
    if not counts:
        return 0
    total = 0
    for domain in node.domains:
        if domain.ref.kind in FINE_KINDS:
            total += counts.get(domain.ref, 0)
    return total
