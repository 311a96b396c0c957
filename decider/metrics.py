"""The decider's own /metrics (docs/rules.md, DESIGN.md §5): budgets, reservations, holds and
headroom per domain, decisions, and how fresh its view of Prometheus is.

Per-domain gauges come from a custom collector over the current View at scrape time, so
they are never out of step with the answers; counters count as decisions are made.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from decider.placement import RULES, phases
from decider.placement.view import View

CALLS = ("placement", "reservation")


class DecisionCounters:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decisions = Counter(
            "llmgw_decider_decisions",
            "Nodes judged, by call and outcome (observe mode allows every node).",
            ["call", "outcome"],
            registry=registry,
        )
        self.refusals = Counter(
            "llmgw_decider_refusals",
            "Nodes refused in enforce mode, by call and rule (a node refused by two rules "
            "counts under each).",
            ["call", "rule"],
            registry=registry,
        )
        self.would_refuse = Counter(
            "llmgw_decider_would_refuse",
            "Nodes observe mode allowed that enforce mode would have refused, by call and rule.",
            ["call", "rule"],
            registry=registry,
        )
        #: Each labelled child, looked up once: `labels()` takes a lock and builds its key
        #: on every call, and a placement counts under several (docs/benchmarks.md).
        self._children: dict[tuple[Counter, str, str], Counter] = {}
        for call in CALLS:
            for outcome in ("allowed", "refused"):
                self._child(self.decisions, call, outcome)
            for rule in RULES:
                self._child(self.refusals, call, rule)
                self._child(self.would_refuse, call, rule)

    def _child(self, counter: Counter, call: str, label: str) -> Counter:
        key = (counter, call, label)
        child = self._children.get(key)
        if child is None:  # a race makes the same child twice: labels() returns one
            child = self._children[key] = counter.labels(call, label)
        return child

    def count(
        self, call: str, mode: str, judged: int, refused_by_rule: Tally[str], refused: int
    ) -> None:
        observe = mode == "observe"
        self._child(self.decisions, call, "allowed").inc(judged if observe else judged - refused)
        if not observe and refused:
            self._child(self.decisions, call, "refused").inc(refused)
        counter = self.would_refuse if observe else self.refusals
        for rule, count in refused_by_rule.items():
            self._child(counter, call, rule).inc(count)


class DomainCollector(Collector):
    def __init__(self, view: Callable[[], View], clock: Callable[[], float] = time.time) -> None:
        self._view = view
        self._clock = clock

    def collect(self) -> Iterator[GaugeMetricFamily]:
        view = self._view()
        labels = ["kind", "domain"]
        budget = GaugeMetricFamily(
            "llmgw_domain_power_budget_watts",
            "The domain's cap from the facility file (smallest feed × derating, or cap_watts).",
            labels=labels,
        )
        reserved = GaugeMetricFamily(
            "llmgw_domain_reserved_watts",
            "Estimated draw of the replicas reserved in the domain.",
            labels=labels,
        )
        load = GaugeMetricFamily(
            "llmgw_domain_load_watts",
            "The load placement judges the domain by: the larger of reserved and measured, "
            "plus other_watts (what LlmgwDomainPowerOverCap and NearCap compare with the cap).",
            labels=labels,
        )
        headroom = GaugeMetricFamily(
            "llmgw_domain_headroom_watts",
            "Cap minus load (the larger of reserved and measured, plus other_watts).",
            labels=labels,
        )
        held = GaugeMetricFamily(
            "llmgw_domain_held", "1 while the facility team holds the domain.", labels=labels
        )
        overridden = GaugeMetricFamily(
            "llmgw_domain_condition_overridden",
            "1 while the facility team overrides the domain's condition (a sensor fault: "
            "placement reads it as ok until the override expires).",
            labels=labels,
        )
        override_ends = GaugeMetricFamily(
            "llmgw_domain_condition_override_expiry_timestamp_seconds",
            "When the override of the domain's condition ends (absent: none in force).",
            labels=labels,
        )
        for ref in sorted(view.domain_refs):
            domain = view.domain(ref)
            values = [ref.kind, ref.name]
            if domain.cap is not None:
                budget.add_metric(values, domain.cap)
                headroom.add_metric(values, domain.cap - domain.load)
            reserved.add_metric(values, domain.reserved)
            load.add_metric(values, domain.load)
            held.add_metric(values, 1.0 if domain.held else 0.0)
            override = view.overrides.get(ref)
            active = override is not None and override.active(view.now)
            overridden.add_metric(values, 1.0 if active else 0.0)
            if override is not None and active:
                override_ends.add_metric(values, override.expires_at)
        yield from (budget, reserved, load, headroom, held, overridden, override_ends)
        if view.phased_pdus:
            yield from phase_families(view)

        snapshot = view.snapshot
        up = GaugeMetricFamily(
            "llmgw_decider_prometheus_up",
            "1 while the decider's last refresh read every query from Prometheus.",
        )
        up.add_metric([], 1.0 if snapshot.prometheus_up else 0.0)
        yield up
        age = snapshot.age_seconds(self._clock())
        if age is not None:  # never read: absent, and LlmgwDeciderPrometheusUnreachable fires
            family = GaugeMetricFamily(
                "llmgw_decider_snapshot_age_seconds",
                "Seconds since the oldest part of the decider's snapshot was read.",
            )
            family.add_metric([], age)
            yield family
        parts = GaugeMetricFamily(
            "llmgw_decider_snapshot_part_read_timestamp_seconds",
            "When each part of the snapshot was last read (absent: never).",
            labels=["part"],
        )
        for name, part in snapshot.parts.items():
            if part.read_at is not None:
                parts.add_metric([name], part.read_at)
        yield parts
        left_out = GaugeMetricFamily(
            "llmgw_decider_series_left_out",
            "Series of each part's last read left out as bad (NaN, infinite, negative power, "
            "a fractional GPU count, bad labels); the rest of the part is used.",
            labels=["part"],
        )
        for name, part in snapshot.parts.items():
            if part.read_at is not None:
                left_out.add_metric([name], float(part.left_out_count))
        yield left_out
        reservations = GaugeMetricFamily(
            "llmgw_decider_reservations",
            "Reservations held, confirmed or waiting for confirmation.",
            labels=["state"],
        )
        confirmed = sum(1 for r in view.reservations.values() if r.confirmed_at is not None)
        reservations.add_metric(["confirmed"], confirmed)
        reservations.add_metric(["pending"], len(view.reservations) - confirmed)
        yield reservations


def phase_families(view: View) -> Iterator[GaugeMetricFamily]:
    """The phases of three-phase pdus (decider.placement.phases): budget, reserved, headroom."""
    labels = ["kind", "domain", "phase"]
    budget = GaugeMetricFamily(
        "llmgw_domain_phase_power_budget_watts",
        "A three-phase PDU's phase cap from the facility file (rating × derating).",
        labels=labels,
    )
    reserved = GaugeMetricFamily(
        "llmgw_domain_phase_reserved_watts",
        "Estimated draw of the replicas reserved on the phase (a node with no phase given "
        "counts on every phase).",
        labels=labels,
    )
    headroom = GaugeMetricFamily(
        "llmgw_domain_phase_headroom_watts",
        "Phase cap minus load (the larger of reserved and measured, plus other_watts).",
        labels=labels,
    )
    for pdu in sorted(view.phased_pdus):
        for state in phases.pdu_phases(view, pdu):
            values = ["pdu", pdu, state.phase]
            budget.add_metric(values, state.cap)
            reserved.add_metric(values, state.reserved)
            headroom.add_metric(values, state.headroom)
    yield from (budget, reserved, headroom)


class DatabaseCollector(Collector):
    """`llmgw_decider_database_ok`: whether the database the decider writes is the file the
    next start reads (decider.store), checked at each scrape, so that a database deleted
    under a running decider is seen before the next write fails."""

    def __init__(self, problem: Callable[[], str | None]) -> None:
        self._problem = problem

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "llmgw_decider_database_ok",
            "1 while the decider's database is the file at its path (0: deleted or replaced "
            "under it; every write is refused).",
        )
        family.add_metric([], 0.0 if self._problem() else 1.0)
        yield family
