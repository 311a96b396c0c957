"""Order by condition: `ok` and `unknown` before `warm` (DESIGN.md §5, rule 3).

`unknown` (no fresh reading) is placed like `ok`: missing data never blocks. `hot` nodes
are refused before ordering (decider.placement.hot). Concern `thermal`: observed, it
orders nothing.
"""

from __future__ import annotations

from decider.placement.states import Ask, NodeState

name = "condition"
concern = "thermal"
reads = frozenset({"condition"})
lowest, highest = 0, 1


def score(node: NodeState, ask: Ask) -> int:
    return 1 if node.condition == "warm" else 0
