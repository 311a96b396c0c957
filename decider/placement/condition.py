"""Order by condition: `ok` and `unknown` before `warm` (DESIGN.md §5, rule 3).

`unknown` (no fresh reading) is placed like `ok`: missing data never blocks. `hot` nodes
are refused before ordering (decider.placement.hot).
"""

from __future__ import annotations

from decider.placement.view import NodeState

name = "condition"


def score(node: NodeState) -> int:
    return 1 if node.condition == "warm" else 0
