"""The lowest power limit a set of GPU cards takes: one rule for the capping ladder
(decider.capping.driver), admission's safe-cap bound (decider.placement.predicted_peak) and
the advisory recommendation (decider.power_capping), so the three never disagree on it.

One limit is set on every GPU of a class or domain, so it must suit each card: the minimum
of a set of nodes is the **largest** of theirs. A node's minimum is what its exporter
publishes (`llmgw_gpu_power_limit_min_watts`, NVML's constraints: the `min_limits` part,
each node's largest); for a node that publishes none (an older exporter, a card that does
not say), MIN_LIMIT_FRACTION of its limit, rounded up to a whole watt as limits are set.
The estimate is below the real minimum of some cards (a T4's is 86 % of its limit, an
A10G's 33 %): a node that publishes its range is never estimated.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: Below this share of a GPU's limit the card most likely refuses a new one: the project's
#: stand-in for the card's minimum limit where its node publishes none.
MIN_LIMIT_FRACTION = 0.30


def estimated_minimum(limit_watts: float) -> float:
    """The stand-in for the minimum of a card whose limit is `limit_watts`, in whole watts."""
    return float(math.ceil(MIN_LIMIT_FRACTION * limit_watts))


@dataclass(frozen=True)
class CardMinimum:
    """The minimum of a set of nodes' cards and where it comes from."""

    watts: float
    read: bool  # the figure is a published minimum, not an estimate
    read_nodes: int
    estimated_nodes: int
    #: The largest limit estimated from (None: every node published its minimum).
    estimated_from_watts: float | None

    def basis(self) -> str:
        """`read: ...` or `estimated: ...`, and on how many nodes each (the API's words)."""
        estimate = f"{MIN_LIMIT_FRACTION:.0%} of the GPU limit (no card minimum published)"
        if not self.read_nodes:
            return f"estimated: {estimate}"
        if not self.estimated_nodes:
            return "read: the cards' minimum limit (llmgw_gpu_power_limit_min_watts)"
        which = "read" if self.read else "estimated"
        nodes = self.read_nodes + self.estimated_nodes
        return (
            f"{which}: the cards' minimum read on {self.read_nodes} of {nodes} nodes, "
            f"{estimate} on the other {self.estimated_nodes}"
        )


def card_minimum(nodes: Iterable[tuple[float | None, float | None]]) -> CardMinimum | None:
    """The minimum of the cards of `nodes`, each node's (GPU limit, published minimum), either
    None where unknown; None where no node has either."""
    read: list[float] = []
    limits: list[float] = []
    for limit, minimum in nodes:
        if minimum is not None:
            read.append(minimum)
        elif limit is not None:
            limits.append(limit)
    if not read and not limits:
        return None
    watts = max([*read, *(estimated_minimum(limit) for limit in limits)])
    return CardMinimum(
        watts=watts,
        read=watts in read,
        read_nodes=len(read),
        estimated_nodes=len(limits),
        estimated_from_watts=max(limits, default=None),
    )
