"""Power capping instead of moving: the GPU power limit that would bring a domain back under
its budget, and what it would cost (docs/power-capping.md). A recommendation only: the
decider never sets a limit, nothing is actuated.

A domain needs one when it is
- **over budget**: its load (the larger of reserved and measured, plus `other_watts`:
  decider.placement.view) is past cap × (1 − margin); the target is cap × (1 − margin);
- **warm** or **hot**: its target is its load less THERMAL_REDUCTION (10 %), a first step
  that lowers the heat its GPUs put into the air; a budget, where it has one and is lower,
  still wins.

The limit: one per-GPU power limit L for every GPU of the domain's member nodes, the
highest that saves enough, assuming each GPU draws up to its current enforced limit
(`llmgw_gpu_power_limit_watts`, the largest per node), so capping it to L saves
(current − L) on each GPU whose limit is above L. A GPU that draws less than its limit
saves less: the figure is the most a cap can save, and the measured power after setting
it is the check. Nodes whose GPU count or limit the snapshot lacks are left out and named.
Below a card's minimum limit the card refuses it: the largest minimum of the counted
nodes' cards, each node's as published (`llmgw_gpu_power_limit_min_watts`, the `min_limits`
part) or, where it publishes none, MIN_LIMIT_FRACTION of its current limit (an H100 SXM
takes 200 W of its 700 W at least; a T4 60 of 70 W: an estimate, and said to be one), as
the capping ladder takes it (decider.card_minimum). Such a recommendation says that
moving replicas is the way instead.

The throughput it costs comes only from measurements: each replica reserved in the domain
whose profile declares `tokens_per_second_at_gpu_limit` (a power-limit sweep) costs its
throughput at the current limit less its throughput at L, interpolated linearly between
the two measured points around each limit, never past the first or the last; any other
replica's cost is unknown, and said so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Literal

from decider.card_minimum import MIN_LIMIT_FRACTION, card_minimum
from decider.facility import DomainRef
from decider.placement.view import DomainState, View

#: A warm or hot domain's target: its load less this share.
THERMAL_REDUCTION = 0.10

Why = Literal["over_budget", "warm", "hot"]


@dataclass(frozen=True, slots=True)
class ThroughputCost:
    """One reserved replica's throughput at its current limit and at the recommended one."""

    reservation: str
    profile: str
    node: str
    tokens_per_second_now: float | None
    tokens_per_second_capped: float | None
    note: str | None = None  # why the cost is unknown

    @property
    def cost(self) -> float | None:
        if self.tokens_per_second_now is None or self.tokens_per_second_capped is None:
            return None
        return self.tokens_per_second_now - self.tokens_per_second_capped


@dataclass(frozen=True, slots=True)
class Recommendation:
    """A power cap for one domain; `gpu_limit_watts` None: no cap can reach the target."""

    domain: DomainRef
    why: tuple[Why, ...]
    load_watts: float
    load_basis: str
    other_watts: float  # in the load: what no node reports
    target_watts: float
    reduce_watts: float
    gpus: int  # GPUs counted
    nodes: tuple[str, ...]  # member nodes counted
    unknown_nodes: tuple[str, ...]  # members left out: GPU count or limit unknown
    current_limit_watts: float | None  # the largest enforced limit among them
    gpu_limit_watts: float | None
    saving_watts: float  # at most, at that limit (GPUs drawing their current limit)
    below_card_minimum: bool
    #: The minimum compared: the largest the nodes publish, else the estimate; and which.
    card_minimum_watts: float | None = None
    card_minimum_read: bool = False
    throughput: tuple[ThroughputCost, ...] = field(default=())
    reason: str = ""

    @property
    def throughput_cost(self) -> float | None:
        """Tokens per second lost over the replicas whose cost is known; None: none is."""
        known = [cost.cost for cost in self.throughput if cost.cost is not None]
        return sum(known) if known else None

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.domain.kind,
            "domain": self.domain.name,
            "why": list(self.why),
            "load_watts": round(self.load_watts, 1),
            "load_basis": self.load_basis,
            "other_watts": self.other_watts,
            "target_watts": round(self.target_watts, 1),
            "reduce_watts": round(self.reduce_watts, 1),
            "gpus": self.gpus,
            "nodes": list(self.nodes),
            "unknown_nodes": list(self.unknown_nodes),
            "current_gpu_limit_watts": self.current_limit_watts,
            "gpu_limit_watts": self.gpu_limit_watts,
            "saving_watts": round(self.saving_watts, 1),
            "below_card_minimum": self.below_card_minimum,
            "card_minimum_watts": None
            if self.card_minimum_watts is None
            else round(self.card_minimum_watts, 1),
            "card_minimum_read": self.card_minimum_read,
            "throughput_cost_tokens_per_second": None
            if self.throughput_cost is None
            else round(self.throughput_cost, 1),
            "throughput": [
                {
                    "reservation": cost.reservation,
                    "profile": cost.profile,
                    "node": cost.node,
                    "tokens_per_second_now": cost.tokens_per_second_now,
                    "tokens_per_second_capped": None
                    if cost.tokens_per_second_capped is None
                    else round(cost.tokens_per_second_capped, 1),
                    "note": cost.note,
                }
                for cost in self.throughput
            ],
            "reason": self.reason,
            "actuated": False,
        }


def _kw(watts: float) -> str:
    return f"{watts / 1000:.1f}"


def target(domain: DomainState) -> tuple[tuple[Why, ...], float] | None:
    """Why the domain needs a cap and the load to bring it to; None: it needs none."""
    why: list[Why] = []
    goals: list[float] = []
    if domain.limit is not None and domain.load > domain.limit:
        why.append("over_budget")
        goals.append(domain.limit)
    if domain.condition in ("warm", "hot") and domain.load > 0:
        why.append(domain.condition)  # type: ignore[arg-type]
        goal = domain.load * (1 - THERMAL_REDUCTION)
        goals.append(goal if domain.limit is None else min(goal, domain.limit))
    if not why:
        return None
    return tuple(why), min(goals)


def saving(gpus: list[tuple[int, float]], limit: float) -> float:
    """Watts saved by capping every GPU at `limit`: (count, current limit) per node."""
    return sum(count * max(0.0, current - limit) for count, current in gpus)


def limit_for(gpus: list[tuple[int, float]], reduce_watts: float) -> float | None:
    """The highest whole-watt limit saving at least `reduce_watts`; None: not even at 0 W."""
    if reduce_watts <= 0:
        return max((current for _, current in gpus), default=None)
    if saving(gpus, 0.0) < reduce_watts:
        return None
    # saving() falls as the limit rises, linearly between the nodes' current limits: solve
    # on the segment where it crosses reduce_watts.
    points = sorted({0.0, *(current for _, current in gpus)})
    for low, high in pairwise(points):
        if saving(gpus, high) < reduce_watts <= saving(gpus, low):
            slope = sum(count for count, current in gpus if current >= high)  # W per W
            exact = high - (reduce_watts - saving(gpus, high)) / slope
            return float(math.floor(exact + 1e-9))
    return 0.0


def interpolate(curve: dict[float, float], watts: float) -> float | None:
    """Tokens per second at a per-GPU limit, between the two measured points around it;
    None outside the measured range (never extrapolated)."""
    points = sorted(curve.items())
    if not points or watts < points[0][0] or watts > points[-1][0]:
        return None
    for (low_w, low_t), (high_w, high_t) in pairwise(points):
        if low_w <= watts <= high_w:
            return low_t + (high_t - low_t) * (watts - low_w) / (high_w - low_w)
    return points[0][1]  # a single point, exactly at it


def _costs(view: View, ref: DomainRef, limit: float) -> tuple[ThroughputCost, ...]:
    costs = []
    for reservation in sorted(view.reservations.values(), key=lambda r: r.id):
        if ref not in view.reservation_domains(reservation):
            continue
        profile = str(reservation.replica.get("profile", ""))
        node = view.node(reservation.node)
        declared = view.facility.profiles.get(profile)
        curve = declared.tokens_per_second_at_gpu_limit if declared is not None else {}
        current = node.gpu_limit_watts
        note = None
        now = capped = None
        if not reservation.gpus:
            now = capped = 0.0
            note = "no GPUs: a GPU cap costs it nothing"
        elif current is None:
            note = f"node {reservation.node}'s GPU limit unknown"
        elif not curve:
            note = f"no measured throughput at power limits for profile {profile}"
        else:
            now = interpolate(curve, current)
            capped = interpolate(curve, min(limit, current))
            if now is None or capped is None:
                span = f"{min(curve):g} to {max(curve):g} W"
                note = (
                    f"profile {profile} is measured at {span} per GPU, not at "
                    f"{current:g} and {min(limit, current):g} W"
                )
                now = capped = None
        costs.append(ThroughputCost(reservation.id, profile, reservation.node, now, capped, note))
    return tuple(costs)


def recommend(view: View, ref: DomainRef) -> Recommendation | None:
    """The domain's power cap recommendation; None: neither over budget nor warm or hot."""
    domain = view.domain(ref)
    goal = target(domain)
    if goal is None:
        return None
    why, target_watts = goal
    reduce_watts = domain.load - target_watts
    counted: list[tuple[int, float]] = []
    nodes: list[str] = []
    unknown: list[str] = []
    for name in sorted(view.members.get(ref, ())):
        node = view.node(name)
        if node.gpus is None or node.gpu_limit_watts is None:
            unknown.append(name)
        elif node.gpus > 0:
            counted.append((node.gpus, node.gpu_limit_watts))
            nodes.append(name)
    gpus = sum(count for count, _ in counted)
    current = max((limit for _, limit in counted), default=None)
    limit = limit_for(counted, reduce_watts) if counted else None
    saved = saving(counted, limit) if limit is not None else saving(counted, 0.0)
    published = view.snapshot.gpu_min_limit_watts if "min_limits" in view.fresh else {}
    cards = card_minimum((view.node(name).gpu_limit_watts, published.get(name)) for name in nodes)
    below = limit is not None and cards is not None and limit < cards.watts
    costs = _costs(view, ref, limit) if limit is not None else ()
    recommendation = Recommendation(
        domain=ref,
        why=why,
        load_watts=domain.load,
        load_basis=domain.load_basis,
        other_watts=domain.other_watts,
        target_watts=target_watts,
        reduce_watts=reduce_watts,
        gpus=gpus,
        nodes=tuple(nodes),
        unknown_nodes=tuple(unknown),
        current_limit_watts=current,
        gpu_limit_watts=limit,
        saving_watts=saved,
        below_card_minimum=below,
        card_minimum_watts=None if cards is None else cards.watts,
        card_minimum_read=cards is not None and cards.read,
        throughput=costs,
    )
    return _with_reason(recommendation)


def _with_reason(rec: Recommendation) -> Recommendation:
    ref = rec.domain
    causes = {
        "over_budget": "over its budget",
        "warm": "warm",
        "hot": "hot",
    }
    other = f" (incl. {_kw(rec.other_watts)} other)" if rec.other_watts else ""
    head = (
        f"{ref.kind} {ref.name} {' and '.join(causes[w] for w in rec.why)}: "
        f"{_kw(rec.load_watts)} kW {rec.load_basis}{other}, target {_kw(rec.target_watts)} kW "
        f"(−{_kw(rec.reduce_watts)})"
    )
    unknown = (
        f"; {len(rec.unknown_nodes)} node(s) left out, GPU count or limit unknown: "
        f"{', '.join(rec.unknown_nodes)}"
        if rec.unknown_nodes
        else ""
    )
    if not rec.gpus:
        return _replace(rec, f"{head}: no member node with known GPUs to cap{unknown}; move load")
    if rec.gpu_limit_watts is None:
        return _replace(
            rec,
            f"{head}: capping its {rec.gpus} GPUs cannot save that much (at most "
            f"{_kw(rec.saving_watts)} kW even at 0 W){unknown}; move load",
        )
    text = (
        f"{head}: cap its {rec.gpus} GPUs at {rec.gpu_limit_watts:g} W (now up to "
        f"{rec.current_limit_watts:g} W), saving up to {_kw(rec.saving_watts)} kW{unknown}"
    )
    if rec.below_card_minimum and rec.card_minimum_read:
        text += (
            f"; below the cards' minimum limit, {rec.card_minimum_watts:g} W, the cards "
            "refuse it: move load instead"
        )
    elif rec.below_card_minimum:
        text += (
            f"; below {MIN_LIMIT_FRACTION:.0%} of the current limit, most cards refuse it: "
            "move load instead"
        )
    known = [cost for cost in rec.throughput if cost.cost is not None]
    if rec.throughput_cost is not None:
        text += (
            f"; costs {rec.throughput_cost:.0f} tokens/s over {len(known)} of "
            f"{len(rec.throughput)} reserved replicas"
        )
    if len(known) < len(rec.throughput):
        text += f"; throughput cost unknown for {len(rec.throughput) - len(known)} replica(s)"
    elif not rec.throughput:
        text += "; throughput cost unknown: no replica reserved in it"
    return _replace(rec, text)


def _replace(rec: Recommendation, reason: str) -> Recommendation:
    fields = {name: getattr(rec, name) for name in Recommendation.__slots__}
    return Recommendation(**{**fields, "reason": reason})


def recommendations(view: View) -> list[Recommendation]:
    """Every domain that needs one, in name order."""
    found = []
    for ref in sorted(view.domain_refs):
        recommendation = recommend(view, ref)
        if recommendation is not None:
            found.append(recommendation)
    return found
