"""Placement decisions (DESIGN.md §5): filters that refuse a node, then keys that order the rest.

Each rule is one module with a `name` (its reason code in metrics) and says what it does
with a node that has no data:

- filters on one domain, no estimate needed: `held`, `hot`, `over_cap` (STATIC_FILTERS);
- the filter that needs the replica's estimate: `power_cap`;
- ordering keys, lower first: `condition`, `rack_room`, `spread`, then the scheduler's order;
- before them all, when a request offers alternative profiles, `profile_choice` picks the
  replica they judge (imported by the API, not here: it reads decider.profiles).

`observe` mode runs every rule, refuses nothing, keeps the scheduler's order and reports
what it would have refused (`would_refuse`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from decider.models import Replica
from decider.placement import (
    condition,
    held,
    hot,
    over_cap,
    phases,
    power_cap,
    rack_room,
    spread,
)
from decider.placement.estimate import Estimate, estimate
from decider.placement.view import NodeState, View

STATIC_FILTERS = (held, hot, over_cap)
RULES = (*(rule.name for rule in STATIC_FILTERS), power_cap.name)

_GAPS = {
    "limit": "GPU power limit unknown for {nodes}: estimated at the site's largest, {limit:g} W",
    "fallback": "GPU power limit unknown for {nodes}, and for every node: estimated at the "
    "facility file's fallback_gpu_watts, {fallback:g} W per GPU",
    "no-limit": "GPU power limit unknown for {nodes}, and for every node: estimated from the "
    "node share alone (too low; set fallback_gpu_watts in the facility file)",
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
        append = nodes.append
        for verdict in self.verdicts:
            node = verdict.node
            reasons = [reason for _, reason in verdict.refusals] if verdict.refusals else []
            headroom = verdict.headroom_watts
            entry: dict[str, Any] = {
                "node": node.node,
                "allowed": observe or not reasons,
                "estimate_watts": verdict.estimate.watts,
                "reasons": [] if observe else reasons,
                "condition": node.condition,
                "headroom_watts": headroom,
            }
            if observe:
                entry["would_refuse"] = reasons
            key = verdict.key
            if key:
                entry["scores"] = {
                    "condition": key[0],
                    "rack_room": key[1],
                    "spread": key[2],
                    "scheduler_order": key[3],
                }
            append(entry)
        return {
            "mode": self.mode,
            "order": self.order,
            "nodes": nodes,
            "missing": self.missing,
            "summary": self.summary(),
        }


ORDER_KEYS = (condition.name, rack_room.name, spread.name, "scheduler_order")


def judge(
    view: View,
    replica: Replica,
    node: NodeState,
    site_limit: float | None,
    guess: Estimate | None = None,
) -> Verdict:
    """Every filter on one node (`guess`: its estimate, when the caller has it already)."""
    if guess is None:
        guess = estimate(replica, node, view.facility, site_limit)
    refusals = list(node.refusals)
    room = node.room
    if node.coarse:  # the node's row, room and site, as of this view
        domains = view.domains
        for ref in node.coarse:
            shared = domains.get(ref) or view.domain(ref)
            if shared.refusals:
                refusals.extend(shared.refusals)
            if shared.room is not None and (room is None or shared.room < room):
                room = shared.room
    headroom = None if room is None else room - guess.watts
    if headroom is not None and headroom < 0:
        margin = view.facility.defaults.margin
        for domain in view.all_domains(node):
            reason = power_cap.refuse(domain, guess.watts, margin)
            if reason is not None:
                refusals.append((power_cap.name, reason))
        for phase in node.phases:  # a three-phase pdu's phases: budgets of their own
            reason = phases.refuse(phase, guess.watts, margin)
            if reason is not None:
                refusals.append((power_cap.name, reason))
    return Verdict(node, guess, refusals, headroom)


def decide(view: View, replica: Replica, candidates: list[str]) -> Decision:
    site_limit = view.site_gpu_limit_watts
    facility = view.facility
    # Nodes of one hardware kind share an estimate: work it out once per kind.
    estimates: dict[tuple[float | None, int | None], Estimate] = {}
    verdicts = []
    tally: Counter[str] = Counter()
    allowed: list[Verdict] = []
    for index, name in enumerate(candidates):
        node = view.node(name)
        kind = (node.gpu_limit_watts, node.gpus)
        guess = estimates.get(kind)
        if guess is None:
            guess = estimates[kind] = estimate(replica, node, facility, site_limit)
        verdict = judge(view, replica, node, site_limit, guess)
        verdicts.append(verdict)
        if verdict.refusals:
            tally.update(dict.fromkeys((rule for rule, _ in verdict.refusals), 1))
        else:
            verdict.key = (
                condition.score(node),
                rack_room.score(node, guess.watts),
                spread.score(node, replica.model, view),
                index,
            )
            allowed.append(verdict)
    if view.mode == "observe":
        order = list(candidates)
    else:
        allowed.sort(key=_by_key)
        order = [verdict.node.node for verdict in allowed]
    return Decision(view.mode, verdicts, order, missing(view, verdicts), tally)


def _by_key(verdict: Verdict) -> tuple[float, ...]:
    return verdict.key


def missing(view: View, verdicts: list[Verdict]) -> list[str]:
    """The view's missing parts, and what was unknown about these candidates."""
    notes = view.all_missing()
    unknown = [v.node.node for v in verdicts if not v.node.domains and not v.node.coarse]
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
        notes.append(
            _GAPS[gap].format(
                nodes=_some(nodes),
                limit=view.site_gpu_limit_watts or 0,
                fallback=view.facility.fallback_gpu_watts or 0,
            )
        )
    return notes


def _some(nodes: list[str], shown: int = 5) -> str:
    if len(nodes) <= shown:
        return f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"
    return f"{len(nodes)} nodes ({', '.join(nodes[:shown])}, …)"
