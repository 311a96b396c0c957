"""Prefer racks and PDUs with fewer reserved replicas of the same model (DESIGN.md §5,
rule 3): a preference only, after condition and rack room; it never refuses a node.

A node with unknown membership has no rack or PDU to count: 0.
"""

from __future__ import annotations

from decider.placement.view import FINE_KINDS, NodeState, View

name = "spread"


def score(node: NodeState, model: str, view: View) -> int:
    counts = view.spread_counts(model)
    if not counts:
        return 0
    total = 0
    for domain in node.domains:
        if domain.ref.kind in FINE_KINDS:
            total += counts.get(domain.ref, 0)
    return total
