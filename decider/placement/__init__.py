"""Placement decisions (DESIGN.md §5): filters that refuse a node, then scores that order the
rest. `judge` runs every filter on one node, `decide` judges the candidates and orders them.

The rules are modules of their own, registered once in decider.placement.rules (their
names are the reason codes in metrics; each says what it does with a node that has no
data), reading the plain figures of decider.placement.states that the View builds:

- filters on one domain or phase, no estimate needed: `held`, `hot`, `over_cap`
  (rules.DOMAIN_FILTERS): `judge` runs them on each of the node's domains and phases
  through rules.domain_refusals, which the View remembers per state (a speed layer beside
  the rules: decider.placement.refusal_memo, switched off with View.memo_refusals);
- the filters that need the replica's estimate: `power_cap`, which `judge` calls on each
  domain and phase of a node the replica would take past its least room, and
  `predicted_peak`, on each oversubscribed domain of the node on its predicted basis (it
  reads the replica's peak and the safe cap, which the least room does not show);
- the ordering scores, lower first (rules.ORDER): `condition`, `rack_room`, `spread`, then
  the scheduler's order;
- before them all, when a request offers alternative profiles, `profile_choice` picks the
  replica they judge (imported by the API, not here: it reads decider.profiles).

Modes are per concern (docs/decider.md "Observe and enforce"): a refusal of an observed
concern is reported in `would_refuse` and not applied, and an observed concern's score
orders nothing; with no concern enforced the scheduler's order stands. A hold is enforced
in every mode. The answer cache (decider.placement.answers) sits beside this module and
serves the same answers; nothing here knows of it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from decider.models import Replica
from decider.placement import predicted_peak, rules
from decider.placement.estimate import Estimate, estimate
from decider.placement.rules import ORDER_KEYS, RULES
from decider.placement.states import Ask, DomainState, NodeState, Refusal, some
from decider.placement.view import View

__all__ = [
    "ORDER_KEYS",
    "RULES",
    "Decision",
    "Verdict",
    "decide",
    "judge",
    "missing",
    "tallies",
]

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
    """One node's verdict: `refusals` (rule, reason) applied, `would_refuse` those of
    observed concerns, reported only."""

    node: NodeState
    estimate: Estimate
    refusals: list[Refusal]
    headroom_watts: float | None
    #: Its ordering scores (rules.ORDER), then its place among the candidates; empty: refused.
    key: tuple[float, ...] = ()
    would_refuse: list[Refusal] = field(default_factory=list)


@dataclass
class Decision:
    mode: str  # `enforce` where any concern is enforced (View.mode)
    verdicts: list[Verdict]
    order: list[str]
    missing: list[str]
    refusals_by_rule: Counter[str] = field(default_factory=Counter)
    #: The concerns enforced (View.enforced); every one unless said.
    enforced: frozenset[str] = frozenset({rules.ALWAYS, *rules.CONCERNS})

    def summary(self) -> str:
        """kube-scheduler's FitError shape: "6/8 nodes allowed: 1 rack r1 hot, …"."""
        refused = sum(1 for verdict in self.verdicts if verdict.refusals)
        flagged = sum(1 for verdict in self.verdicts if verdict.refusals or verdict.would_refuse)
        total = len(self.verdicts)
        head = f"{total - refused}/{total} nodes allowed"
        observed = [c for c in rules.CONCERNS if c not in self.enforced]
        if len(observed) == len(rules.CONCERNS):
            head = f"observe mode: {head}, {flagged - refused} would be refused"
        elif observed:
            would = sum(1 for verdict in self.verdicts if verdict.would_refuse)
            head += f", {would} would be refused ({' and '.join(observed)} observed)"
        if not flagged:
            return head
        counts = ", ".join(f"{count} {rule}" for rule, count in self.refusals_by_rule.most_common())
        return f"{head} ({counts})"

    def as_json(self) -> dict[str, Any]:
        observing = not self.enforced.issuperset(rules.CONCERNS)
        nodes = []
        append = nodes.append
        for verdict in self.verdicts:
            node = verdict.node
            reasons = [reason for _, reason in verdict.refusals] if verdict.refusals else []
            entry: dict[str, Any] = {
                "node": node.node,
                "allowed": not reasons,
                "estimate_watts": verdict.estimate.watts,
                "reasons": reasons,
                "condition": node.condition,
                "headroom_watts": verdict.headroom_watts,
            }
            if observing:
                entry["would_refuse"] = [reason for _, reason in verdict.would_refuse]
            if node.warm_evidence and not reasons:  # why it is placed after the ok nodes
                entry["condition_evidence"] = list(node.warm_evidence)
            if verdict.key:  # last: the answer cache fills in its scheduler_order
                entry["scores"] = dict(zip(ORDER_KEYS, verdict.key, strict=True))
            append(entry)
        return {
            "mode": self.mode,
            "order": self.order,
            "nodes": nodes,
            "missing": self.missing,
            "summary": self.summary(),
        }


def judge(
    view: View,
    replica: Replica,
    node: NodeState,
    site_limit: float | None,
    guess: Estimate | None = None,
) -> Verdict:
    """Every filter on one node (`guess`: its estimate, when the caller has it already),
    each refusal applied or, of an observed concern, reported (`would_refuse`)."""
    if guess is None:
        guess = estimate(replica, node, view.facility, site_limit)
    # The filters that need no estimate, on each of its domains and phases: held, hot,
    # over_cap and any registered (rules.DOMAIN_FILTERS, through rules.domain_refusals,
    # which the View remembers per state: View.domain_refusals). Its rack's and pdus'
    # states are in its own; its row's, room's and site's are read as of this view.
    refuse = view.domain_refusals
    refusals: list[Refusal] = []
    for budgeted in node.domains:
        refusals += refuse(budgeted)
    for phase in node.phases:
        refusals += refuse(phase)
    room = node.room
    coarse: list[DomainState] = []
    if node.coarse:
        domains = view.domains
        for ref in node.coarse:
            shared = domains.get(ref) or view.domain(ref)
            coarse.append(shared)
            refusals += refuse(shared)
            if shared.room is not None and (room is None or shared.room < room):
                room = shared.room
    for ref, hold in node.last_known_holds:  # its membership unknown: its last known holds
        refusals.append((rules.held.name, rules.held.refuse_last_known(ref, hold)))
    # The filter that needs the estimate, on each domain and phase of a node the replica
    # would take past its least room: power_cap names each.
    headroom = None if room is None else room - guess.watts
    if headroom is not None and headroom < 0:
        for budgeted in (*node.domains, *coarse, *node.phases):
            reason = rules.power_cap.refuse(budgeted, guess.watts)
            if reason is not None:
                refusals.append((rules.power_cap.name, reason))
    if view.oversubscribed_refs:
        refusals += _predicted_refusals(view, replica, node, coarse, guess, site_limit)
    enforced = view.enforced
    if not refusals or len(enforced) > len(rules.CONCERNS):  # every concern enforced
        return Verdict(node, guess, refusals, headroom)
    applied = [r for r in refusals if rules.concern_of(r[0]) in enforced]
    observed = [r for r in refusals if rules.concern_of(r[0]) not in enforced]
    return Verdict(node, guess, applied, headroom, would_refuse=observed)


def _predicted_refusals(
    view: View,
    replica: Replica,
    node: NodeState,
    coarse: list[DomainState],
    guess: Estimate,
    site_limit: float | None,
) -> list[Refusal]:
    """predicted_peak on each of the node's oversubscribed domains on the predicted basis."""
    predicted = [
        domain
        for domain in (*node.domains, *coarse)
        if domain.prediction is not None and domain.prediction.predicted
    ]
    if not predicted:
        return []
    settings = view.facility.oversubscription
    units = view.snapshot.unit_peak_watts if "peaks" in view.fresh else {}
    peak, peak_from = predicted_peak.replica_peak(
        replica.model, replica.profile, guess.watts, units, settings
    )
    peak, peak_from = predicted_peak.first_on_node(
        peak, peak_from, replica.gpus, node.gpus, node.reserved_gpus, view.facility.node_share_watts
    )
    limit = node.gpu_limit_watts if node.gpu_limit_watts is not None else site_limit
    if limit is None:
        limit = view.facility.fallback_gpu_watts
    new = predicted_peak.NewReplica(
        peak_watts=peak,
        gpus=replica.gpus,
        non_gpu_watts=predicted_peak.non_gpu_watts(guess.watts, replica.gpus, limit),
        peak_from=peak_from,
    )
    found: list[Refusal] = []
    for domain in predicted:
        reason = predicted_peak.refuse(domain, new)
        if reason is not None:
            found.append((predicted_peak.name, reason))
    return found


def decide(view: View, replica: Replica, candidates: list[str]) -> Decision:
    site_limit = view.site_gpu_limit_watts
    facility = view.facility
    mask = view.ordering_mask
    counts = view.spread_counts(replica.model)
    # Nodes of one hardware kind share an estimate: work it out once per kind.
    estimates: dict[tuple[float | None, int | None, tuple[str, ...]], Estimate] = {}
    verdicts = []
    tally: Counter[str] = Counter()
    allowed: list[tuple[tuple[int, ...], int, Verdict]] = []
    for index, name in enumerate(candidates):
        node = view.node(name)
        kind = (node.gpu_limit_watts, node.gpus, node.cpu_models)
        guess = estimates.get(kind)
        if guess is None:
            guess = estimates[kind] = estimate(replica, node, facility, site_limit)
        verdict = judge(view, replica, node, site_limit, guess)
        verdicts.append(verdict)
        flagged = verdict.refusals + verdict.would_refuse
        if flagged:
            tally.update(dict.fromkeys((rule for rule, _ in flagged), 1))
        if not verdict.refusals:
            scored = rules.scores(node, Ask(guess.watts, counts))
            verdict.key = (*scored, index)
            allowed.append((rules.masked(scored, mask), index, verdict))
    allowed.sort(key=_by_key)
    order = [verdict.node.node for _, _, verdict in allowed]
    return Decision(
        view.mode, verdicts, order, missing(view, verdicts), tally, enforced=view.enforced
    )


def tallies(verdicts: Iterable[Verdict]) -> tuple[Counter[str], Counter[str]]:
    """Per rule, the nodes it refuses, and those it would refuse for an observed concern
    (what `llmgw_decider_refusals_total` and `…_would_refuse_total` count)."""
    applied: Counter[str] = Counter()
    observed: Counter[str] = Counter()
    for verdict in verdicts:
        if verdict.refusals:
            applied.update(dict.fromkeys((rule for rule, _ in verdict.refusals), 1))
        if verdict.would_refuse:
            observed.update(dict.fromkeys((rule for rule, _ in verdict.would_refuse), 1))
    return applied, observed


def _by_key(item: tuple[tuple[int, ...], int, Verdict]) -> tuple[tuple[int, ...], int]:
    return item[0], item[1]


def missing(view: View, verdicts: list[Verdict]) -> list[str]:
    """The view's missing parts, and what was unknown about these candidates."""
    notes = view.all_missing()
    unknown = [v.node.node for v in verdicts if not v.node.domains and not v.node.coarse]
    if unknown and "membership" in view.fresh:
        notes.append(
            f"membership unknown for {some(unknown)} (no llmgw:node_domain:membership): "
            "no domain limits them"
        )
    gaps: dict[str, list[str]] = {}
    for verdict in verdicts:
        for gap in verdict.estimate.gaps:
            gaps.setdefault(gap, []).append(verdict.node.node)
    for gap, nodes in gaps.items():
        notes.append(
            _GAPS[gap].format(
                nodes=some(nodes),
                limit=view.site_gpu_limit_watts or 0,
                fallback=view.facility.fallback_gpu_watts or 0,
            )
        )
    return notes
