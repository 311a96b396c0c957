"""Order by the rack's power room left after this replica, in whole replicas of this size:
more first (DESIGN.md §5, rule 3).

Counted in replicas rather than watts so that racks with room for as many more replicas tie,
and the spread preference decides between them. A node with no data never ranks best: a
rack with no budget, or a node whose rack is unknown, scores as a rack with room for no
more (0), after every budgeted rack that still has room. Concern `power`.
"""

from __future__ import annotations

import math

from decider.placement.states import Ask, NodeState

name = "rack_room"
concern = "power"
reads = frozenset({"rack"})
lowest, highest = -math.inf, 0


def replicas_left(node: NodeState, estimate_watts: float) -> int | None:
    """Replicas of this size the rack could still take after this one; None: not counted."""
    rack = node.rack
    if rack is None or rack.room is None or estimate_watts <= 0:
        return None
    left = (rack.room - estimate_watts) // estimate_watts
    return int(left) if left > 0 else 0


def score(node: NodeState, ask: Ask) -> int:
    left = replicas_left(node, ask.watts)
    return 0 if left is None else -left
