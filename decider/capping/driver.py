"""The decider's side of the capping ladder (issue 20, docs/oversubscription.md): drives
`decider.capping.ladder` at each refresh for every domain with `oversubscribe: true`, keeps
each domain's state in memory, and answers the node agents' leases.

At each refresh, per oversubscribed domain:
- **power**: its measured power (the snapshot's `measured` part, fresh) plus its declared
  `other_watts`, as admission counts its load; **budget**: the limit admission uses
  (`DomainState.limit`: cap × (1 − margin), the cap being the smallest feed's rating ×
  derating where it has feeds);
- **GPUs by class**: each member node's GPUs under the class of the replicas reserved on it
  (the highest of them where it runs several: a node is capped as its most important
  replica), nodes with no reservation with the replicas of no class, ranked below every
  listed class (`Facility.class_rank`, as shedding ranks them): capped first;
- **each GPU's uncapped limit**: the enforced limit Prometheus reads (`limits` part), taken
  as the node's uncapped limit once the node has gone a whole lease without a cap from the
  decider (a capped card reads its cap); until then the largest read. Not the card's
  default limit (`nvmlDeviceGetPowerManagementDefaultLimit`): an operator's own lower
  limit (`nvidia-smi -pl`) is what the card draws up to, and a lease is never above the
  node's uncapped limit, so taking the default would let a cap raise such a limit;
- **each class's minimum**: the largest of its nodes' minimums, each node's being the
  largest minimum of its GPUs (`llmgw_gpu_power_limit_min_watts`, `min_limits` part: the
  agent refuses a limit below the card's range, so a cap below it would leave the domain
  above what the ladder counted on), or, for a node whose exporter publishes none,
  `MIN_LIMIT_FRACTION` (decider.card_minimum) of its uncapped limit, an estimate below the
  real minimum of some cards (a T4's is 86 % of its limit, an A10G's 33 %); the API says
  which (`min_limit_from`). `oversubscription.ladder.floor_gpu_watts` raises it;
- **what besides the GPUs**: `other_watts` plus `node_share_watts` per member node, the
  estimates' share (decider.placement.estimate);
- a **lost feed** (decider.capping.feeds).

Where the domain's measured power or its membership is not fresh, or no refresh has moved the
ladders for a whole lease, the ladder is not moved (`blind` says why), and its leases give
each node the lower of its cap and its safe limit:
the decider that cannot see a domain's power bounds it as an agent that cannot see the
decider does.

State is in memory. A restart starts every domain uncapped at its next refresh; that is safe
because every agent holds the safe limit of its last lease until the decider answers again,
and a domain still over its threshold is capped again at the first refresh (going up waits
for nothing).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from decider.capping import feeds
from decider.capping.ladder import (
    ClassGpus,
    LadderState,
    advance,
    initial,
    safe_gpu_limit,
    worst_case,
)
from decider.card_minimum import card_minimum
from decider.facility import DomainRef, Facility
from decider.placement.view import View
from decider.shedding.moves import class_of


def _kw(watts: float) -> str:
    return f"{watts / 1000:.1f}"


@dataclass(frozen=True, slots=True)
class DomainCapping:
    """One oversubscribed domain after a refresh."""

    ref: DomainRef
    state: LadderState
    budget_watts: float
    power_watts: float | None  # None: no fresh measured power
    other_watts: float  # besides the GPUs, at the estimates
    groups: tuple[ClassGpus, ...]
    node_class: Mapping[str, str]  # member node -> its class key in `groups`
    node_limit: Mapping[str, float]  # member node -> its GPUs' uncapped limit
    #: class key -> where its min_limit_watts comes from, in words (read or estimated)
    min_limit_from: Mapping[str, str]
    unknown_nodes: tuple[str, ...]  # members left out: GPU count or limit unknown
    safe_gpu_limit_watts: float
    safe_reason: str
    blind: str | None = None  # why the ladder was not moved at this refresh

    def node_cap(self, node: str) -> float | None:
        """The per-GPU cap the domain gives the node now; None: no cap."""
        cap = self.state.caps.get(self.node_class.get(node, ""))
        if self.blind is not None:
            cap = self.safe_gpu_limit_watts if cap is None else min(cap, self.safe_gpu_limit_watts)
        return cap

    def as_json(self) -> dict[str, Any]:
        state = self.state
        return {
            "kind": self.ref.kind,
            "domain": self.ref.name,
            "step": state.step,
            "caps": {klass: cap for klass, cap in sorted(state.caps.items())},
            "reason": state.reason if self.blind is None else f"{self.blind}; {state.reason}",
            "since": state.since,
            "calm_since": state.calm_since,
            "budget_watts": round(self.budget_watts, 1),
            "power_watts": None if self.power_watts is None else round(self.power_watts, 1),
            "worst_case_watts": round(worst_case(self.groups, state.caps, self.other_watts), 1),
            "other_watts": round(self.other_watts, 1),
            "classes": [
                {
                    "class": group.klass,
                    "rank": group.rank,
                    "gpus": group.gpus,
                    "limit_watts": group.limit_watts,
                    "min_limit_watts": group.min_limit_watts,
                    "min_limit_from": self.min_limit_from.get(group.klass),
                    "cap_watts": state.caps.get(group.klass),
                }
                for group in sorted(self.groups, key=lambda each: (each.rank, each.klass))
            ],
            "lost_feed": None
            if state.lost_feed is None
            else {
                "pdus": list(state.lost_feed.pdus),
                "survivor_watts": round(state.lost_feed.survivor_watts, 1),
            },
            "safe_gpu_limit_watts": self.safe_gpu_limit_watts,
            "safe_reason": self.safe_reason,
            "nodes": sorted(self.node_class),
            "unknown_nodes": list(self.unknown_nodes),
            "blind": self.blind,
        }


@dataclass(frozen=True, slots=True)
class Lease:
    """A node's lease (issue 20 §3); `as_json` is the answer of GET /v1/capping/leases/{node}."""

    node: str
    issued_at: float
    lease_seconds: float
    gpu_limit_watts: float | None
    safe_gpu_limit_watts: float
    reason: str
    domains: tuple[str, ...]

    def as_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "issued_at": self.issued_at,
            "lease_seconds": self.lease_seconds,
            "gpu_limit_watts": self.gpu_limit_watts,
            "safe_gpu_limit_watts": self.safe_gpu_limit_watts,
            "reason": self.reason,
            "domains": list(self.domains),
        }


def class_minimum(nodes: list[tuple[int, float, float | None]]) -> tuple[float, str]:
    """The lowest per-GPU limit every card of a class takes, from its nodes' (GPUs, uncapped
    limit, minimum read or None), and where it comes from (decider.card_minimum)."""
    found = card_minimum((limit, minimum) for _, limit, minimum in nodes)
    assert found is not None  # every node of a class has its limit
    return found.watts, found.basis()


class NotYetKnown(Exception):
    """The decider has not yet seen which domains the nodes are in (no refresh with a fresh
    membership since it started): it can say neither a lease nor that there is none."""


@dataclass
class _Memory:
    """What the capper keeps between refreshes (under its lock)."""

    states: dict[DomainRef, LadderState] = field(default_factory=dict)
    domains: dict[DomainRef, DomainCapping] = field(default_factory=dict)
    #: node -> its GPUs' uncapped limit, and when it last had a cap from the decider.
    uncapped: dict[str, float] = field(default_factory=dict)
    #: node -> the largest minimum limit of its GPUs, as last read (a card's, constant).
    minimum: dict[str, float] = field(default_factory=dict)
    capped_at: dict[str, float] = field(default_factory=dict)
    lease_seconds: float = 60.0
    known: bool = False  # a refresh with a fresh membership has run
    refreshed_at: float = 0.0  # the last refresh that moved the ladders


class Capper:
    """Every oversubscribed domain's ladder, driven by `refresh(view)` (Service._on_refresh),
    read by the API, the page and /metrics."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._refreshing = threading.Lock()
        self._memory = _Memory()

    @staticmethod
    def oversubscribed(facility: Facility) -> list[DomainRef]:
        return [ref for ref, declared in facility.declared() if declared.oversubscribe]

    def refresh(self, view: View) -> None:
        """Move each oversubscribed domain's ladder with `view`'s readings."""
        now = self._clock()
        facility = view.facility
        refs = self.oversubscribed(facility)
        # Worked out under `_refreshing` alone (one refresh at a time: the uncapped limits and
        # the states are the refresh's own), published under `_lock`, so that a lease waits
        # for a swap, never for a refresh.
        with self._refreshing:
            memory = self._memory
            memory.lease_seconds = facility.oversubscription.lease  # one float: atomic
            classes = self._node_classes(view)
            if "min_limits" in view.fresh:
                memory.minimum.update(view.snapshot.gpu_min_limit_watts)
            found: dict[DomainRef, DomainCapping] = {}
            for ref in refs:
                found[ref] = self._domain(view, ref, now, classes)
            for capping in found.values():
                for node in capping.node_class:
                    if capping.node_cap(node) is not None:
                        memory.capped_at[node] = now
            with self._lock:
                memory.known = memory.known or "membership" in view.fresh
                memory.domains = found
                memory.states = {ref: capping.state for ref, capping in found.items()}
                memory.refreshed_at = now

    def _node_classes(self, view: View) -> dict[str, tuple[int, str]]:
        """Each node with a reservation: (ladder rank, class key) of its highest class."""
        facility = view.facility
        found: dict[str, tuple[int, str]] = {}
        for reservation in view.reservations.values():
            name = class_of(view, reservation)
            rank = facility.class_rank(name)
            key = (rank + 1, name if rank >= 0 and name is not None else "")
            if key > found.get(reservation.node, (0, "")):
                found[reservation.node] = key
        return found

    def _uncapped_limit(self, node: str, read: float | None, now: float) -> float | None:
        memory = self._memory
        since_cap = now - memory.capped_at.setdefault(node, now)  # unseen: may hold a cap
        known = memory.uncapped.get(node)
        if read is not None:
            trusted = since_cap >= memory.lease_seconds or known is None
            memory.uncapped[node] = read if trusted else max(known or 0.0, read)
        return memory.uncapped.get(node)

    def _domain(
        self,
        view: View,
        ref: DomainRef,
        now: float,
        classes: Mapping[str, tuple[int, str]],
    ) -> DomainCapping:
        facility = view.facility
        settings = facility.oversubscription.ladder
        declared = facility.domain(ref.kind, ref.name)
        declared_other = declared.other_watts if declared is not None else 0.0
        domain = view.domain(ref)
        budget = domain.limit if domain.limit is not None else math.inf
        previous = self._memory.domains.get(ref)
        blind: str | None = None
        if "membership" in view.fresh:
            members = sorted(view.members.get(ref, ()))
        else:
            members = sorted(previous.node_class) if previous is not None else []
            blind = "no fresh membership: the ladder holds its step, leases their safe limits"
        gpus_of = view.snapshot.node_gpus if "gpus" in view.fresh else {}
        limits_read = view.snapshot.gpu_limit_watts if "limits" in view.fresh else {}
        by_class: dict[str, list[tuple[int, float, float | None]]] = {}
        ranks: dict[str, int] = {}
        node_class: dict[str, str] = {}
        node_limit: dict[str, float] = {}
        unknown: list[str] = []
        for node in members:
            rank, key = classes.get(node, (0, ""))
            node_class[node] = key
            gpus = gpus_of.get(node)
            limit = self._uncapped_limit(node, limits_read.get(node), now)
            if limit is None and previous is not None:
                limit = previous.node_limit.get(node)
            if gpus is None or limit is None:
                unknown.append(node)
                continue
            node_limit[node] = limit
            if gpus > 0:
                by_class.setdefault(key, []).append((gpus, limit, self._memory.minimum.get(node)))
                ranks[key] = rank
        floor = settings.floor_gpu_watts
        minimums = {key: class_minimum(nodes) for key, nodes in by_class.items()}
        groups = tuple(
            ClassGpus(
                klass=key,
                rank=ranks[key],
                gpus=sum(gpus for gpus, _, _ in nodes),
                limit_watts=max(limit for _, limit, _ in nodes),
                min_limit_watts=minimums[key][0],
            )
            for key, nodes in sorted(by_class.items())
        )
        counted_nodes = sum(len(nodes) for nodes in by_class.values())
        other = declared_other + facility.node_share_watts * counted_nodes
        total_gpus = sum(group.gpus for group in groups)
        lowest = max((group.lowest(floor) for group in groups), default=0.0)
        safe, safe_reason = safe_gpu_limit(budget, other, total_gpus, lowest)
        if safe is None:
            safe = lowest
            safe_reason += f": the safe limit is the lowest a card takes, {lowest:g} W"
        highest = max((group.limit_watts for group in groups), default=None)
        if highest is not None and safe > highest:  # fits uncapped: never above a card's limit
            safe = highest
            safe_reason += f": it fits at every GPU's limit, {highest:g} W"
        measured = domain.measured if "measured" in view.fresh else None
        power = None if measured is None else measured + declared_other
        state = self._memory.states.get(ref) or initial(now)
        if power is None and blind is None:
            blind = "no fresh measured power: the ladder holds its step, leases their safe limits"
        if blind is None and power is not None and math.isfinite(budget):
            state = advance(
                state,
                now,
                power,
                budget,
                groups,
                settings,
                other_watts=other,
                lost_feed=feeds.lost_feed(view, ref),
                label=f"{ref.kind} {ref.name}",
                ceiling_watts=domain.cap,  # rating x derating: no release lets it pass there
            )
        return DomainCapping(
            ref=ref,
            state=state,
            budget_watts=budget,
            power_watts=power,
            other_watts=other,
            groups=groups,
            node_class=node_class,
            node_limit=node_limit,
            min_limit_from={key: words for key, (_, words) in minimums.items()},
            unknown_nodes=tuple(unknown),
            safe_gpu_limit_watts=safe,
            safe_reason=safe_reason,
            blind=blind,
        )

    def domains(self) -> list[DomainCapping]:
        with self._lock:
            return sorted(self._memory.domains.values(), key=lambda each: each.ref)

    def lease(self, node: str) -> Lease | None:
        """The node's lease now; None: the node is in no oversubscribed domain. Raises
        NotYetKnown before the first refresh with a fresh membership."""
        with self._lock:
            memory = self._memory
            if not memory.known:
                raise NotYetKnown(
                    "the decider has not yet read which domains the nodes are in; "
                    "keep the last lease until it runs out"
                )
            mine = [d for _, d in sorted(memory.domains.items()) if node in d.node_class]
            lease_seconds = memory.lease_seconds
            now = self._clock()
            late = now - memory.refreshed_at
        if late > lease_seconds:  # no refresh has moved the ladders for a whole lease
            stale = (
                f"no refresh for {late:.0f} s: the ladder holds its step, leases their safe limits"
            )
            mine = [replace(capping, blind=capping.blind or stale) for capping in mine]
        if not mine:
            return None
        limit: float | None = None
        safe = math.inf
        reasons = []
        for capping in mine:
            cap = capping.node_cap(node)
            if cap is not None:
                limit = cap if limit is None else min(limit, cap)
            safe = min(safe, capping.safe_gpu_limit_watts)
            words = capping.state.reason if capping.blind is None else capping.blind
            reasons.append(f"{capping.ref} at step {capping.state.step} ({words})")
        own = [c.node_limit[node] for c in mine if node in c.node_limit]
        if own:  # never above what the card is at uncapped: the agent would refuse it
            ceiling = min(own)
            safe = min(safe, ceiling)
            if limit is not None and limit >= ceiling:
                limit = None
        return Lease(
            node=node,
            issued_at=now,
            lease_seconds=lease_seconds,
            gpu_limit_watts=limit,
            safe_gpu_limit_watts=safe,
            reason="; ".join(reasons),
            domains=tuple(str(capping.ref) for capping in mine),
        )
