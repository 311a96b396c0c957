"""Placement decisions (DESIGN.md §5): filters that refuse a node, then keys that order the rest.

Each rule is one module with a `name` (its reason code in metrics) and says what it does
with a node that has no data:

- filters on one domain, no estimate needed: `held`, `hot`, `over_cap` (STATIC_FILTERS);
- the filter that needs the replica's estimate: `power_cap`;
- ordering keys, lower first: `condition`, `rack_room`, `spread`, then the scheduler's order.

`observe` mode runs every rule, refuses nothing, keeps the scheduler's order and reports
what it would have refused (`would_refuse`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from decider.models import Replica
from decider.placement import condition, held, hot, over_cap, power_cap, rack_room, spread
from decider.placement.estimate import Estimate, estimate
from decider.placement.view import NodeState, View

STATIC_FILTERS = (held, hot, over_cap)
RULES = (*(rule.name for rule in STATIC_FILTERS), power_cap.name)

_GAPS = {
    "limit": "GPU power limit unknown for {nodes}: estimated at the site's largest, {limit:g} W",
    "no-limit": "GPU power limit unknown for {nodes}, and for every node: estimated from the "
    "node share alone",
    "gpus": "GPU count unknown for {nodes}: estimated with the whole node share",
}


@dataclass
class Verdict:
    """One node's verdict; `refusals` are (rule, reason) whatever the mode."""

    node: NodeState
    estimate: Estimate
    refusals: list[tuple[str, str]]
    headroom_watts: float | None
    key: tuple[float, ...] = ()


@dataclass
class Decision:
    mode: str
    verdicts: list[Verdict]
    order: list[str]
    missing: list[str]
    refusals_by_rule: Counter[str] = field(default_factory=Counter)

    def summary(self) -> str:
        """kube-scheduler's FitError shape: "6/8 nodes allowed: 1 rack r1 hot, …"."""
        refused = sum(1 for verdict in self.verdicts if verdict.refusals)
        total = len(self.verdicts)
        if self.mode == "observe":
            head = f"observe mode: {total}/{total} nodes allowed, {refused} would be refused"
        else:
            head = f"{total - refused}/{total} nodes allowed"
        if not refused:
            return head
        rules = ", ".join(f"{count} {rule}" for rule, count in self.refusals_by_rule.most_common())
        return f"{head} ({rules})"

    def as_json(self) -> dict[str, Any]:
        observe = self.mode == "observe"
        nodes = []
        for verdict in self.verdicts:
            reasons = [reason for _, reason in verdict.refusals]
            entry: dict[str, Any] = {
                "node": verdict.node.node,
                "allowed": observe or not reasons,
                "estimate_watts": round(verdict.estimate.watts, 1),
                "reasons": [] if observe else reasons,
                "condition": verdict.node.condition,
                "headroom_watts": None
                if verdict.headroom_watts is None
                else round(verdict.headroom_watts, 1),
            }
            if observe:
                entry["would_refuse"] = reasons
            if verdict.key:
                entry["scores"] = dict(zip(ORDER_KEYS, verdict.key, strict=True))
            nodes.append(entry)
        return {
            "mode": self.mode,
            "order": self.order,
            "nodes": nodes,
            "missing": self.missing,
            "summary": self.summary(),
        }


ORDER_KEYS = (condition.name, rack_room.name, spread.name, "scheduler_order")


def judge(view: View, replica: Replica, node: NodeState, site_limit: float | None) -> Verdict:
    """Every filter on one node; the ordering key only if it is allowed."""
    guess = estimate(replica, node, view.facility, site_limit)
    refusals = list(node.refusals)
    headroom = None if node.room is None else node.room - guess.watts
    if headroom is not None and headroom < 0:
        margin = view.facility.defaults.margin
        for domain in node.domains:
            reason = power_cap.refuse(domain, guess.watts, margin)
            if reason is not None:
                refusals.append((power_cap.name, reason))
    return Verdict(node, guess, refusals, headroom)


def decide(view: View, replica: Replica, candidates: list[str]) -> Decision:
    site_limit = view.site_gpu_limit_watts
    verdicts = [judge(view, replica, view.node(name), site_limit) for name in candidates]
    tally: Counter[str] = Counter()
    for verdict in verdicts:
        tally.update({rule for rule, _ in verdict.refusals})
    allowed = [(index, v) for index, v in enumerate(verdicts) if not v.refusals]
    for index, verdict in allowed:
        verdict.key = (
            condition.score(verdict.node),
            rack_room.score(verdict.node, verdict.estimate.watts),
            spread.score(verdict.node, replica.model, view),
            index,
        )
    if view.mode == "observe":
        order = list(candidates)
    else:
        order = [v.node.node for _, v in sorted(allowed, key=lambda item: item[1].key)]
    return Decision(view.mode, verdicts, order, missing(view, verdicts), tally)


def missing(view: View, verdicts: list[Verdict]) -> list[str]:
    """The view's missing parts, and what was unknown about these candidates."""
    notes = list(view.missing)
    unknown = [v.node.node for v in verdicts if not v.node.domains]
    if unknown and "membership" in view.fresh:
        notes.append(
            f"membership unknown for {_some(unknown)} (no llmgw:node_domain:membership): "
            "no domain limits them"
        )
    gaps: dict[str, list[str]] = {}
    for verdict in verdicts:
        for gap in verdict.estimate.gaps:
            gaps.setdefault(gap, []).append(verdict.node.node)
    for gap, nodes in gaps.items():
        notes.append(_GAPS[gap].format(nodes=_some(nodes), limit=view.site_gpu_limit_watts or 0))
    return notes


def _some(nodes: list[str], shown: int = 5) -> str:
    if len(nodes) <= shown:
        return f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"
    return f"{len(nodes)} nodes ({', '.join(nodes[:shown])}, …)"
