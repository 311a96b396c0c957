"""Order by condition: `ok` and `unknown` before `warm` (DESIGN.md §5, rule 3).

`unknown` (no fresh reading) is placed like `ok`: missing data never blocks. `hot` nodes
are refused before ordering (decider.placement.hot). Concern `thermal`: observed, it
orders nothing. A warm node's answer says why (`explain`, decider.placement.evidence):
`rack r12-08 warm: 3 of 32 GPUs thermally throttled for 1 min`.
"""

from __future__ import annotations

from collections.abc import Iterable

from decider.placement import evidence
from decider.placement.states import Ask, DomainState, NodeState

name = "condition"
concern = "thermal"
reads = frozenset({"condition"})
lowest, highest = 0, 1


def score(node: NodeState, ask: Ask) -> int:
    return 1 if node.condition == "warm" else 0


def explain(domains: Iterable[DomainState]) -> tuple[str, ...]:
    """Why a node scores 1: the evidence of each of its warm domains, in words; nothing of a
    domain without evidence (its condition says warm, and `missing` why no more)."""
    said = (evidence.words(domain.ref, "warm", domain.evidence) for domain in domains)
    return tuple(words for words in said if words is not None)
