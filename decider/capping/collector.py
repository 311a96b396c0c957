"""The capping ladders on the decider's /metrics (docs/oversubscription.md "Metrics"):

    llmgw_decider_capping_step{kind,domain} 1
    llmgw_decider_capping_step_since_timestamp_seconds{kind,domain} 1764800000
    llmgw_decider_capping_gpu_limit_watts{kind,domain,class="batch"} 410
    llmgw_decider_capping_safe_gpu_limit_watts{kind,domain} 450
    llmgw_decider_capping_feed_lost{kind,domain} 0
    llmgw_decider_capping_blind{kind,domain} 0

One series per oversubscribed domain (none where no domain opts in); a class's cap only
while it is capped; `class=""` for the GPUs of no class (nodes with no reservation too).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from decider.capping.driver import Capper


class CappingCollector(Collector):
    def __init__(self, capper: Capper) -> None:
        self._capper = capper

    def collect(self) -> Iterator[GaugeMetricFamily]:
        labels = ["kind", "domain"]
        step = GaugeMetricFamily(
            "llmgw_decider_capping_step",
            "The capping ladder's step of an oversubscribed domain: 0 uncapped, 1 its lowest "
            "class capped, 2 every class capped.",
            labels=labels,
        )
        since = GaugeMetricFamily(
            "llmgw_decider_capping_step_since_timestamp_seconds",
            "Unix time the domain's capping ladder entered its current step.",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "llmgw_decider_capping_gpu_limit_watts",
            "Per-GPU power limit the ladder leases to the domain's GPUs of a class "
            "(present only while the class is capped).",
            labels=[*labels, "class"],
        )
        safe = GaugeMetricFamily(
            "llmgw_decider_capping_safe_gpu_limit_watts",
            "Per-GPU limit at which the domain fits its budget at the estimates: what each "
            "lease carries for the agent to fall to.",
            labels=labels,
        )
        lost = GaugeMetricFamily(
            "llmgw_decider_capping_feed_lost",
            "1 while a feed of the domain reads nothing and the ladder caps to its survivors.",
            labels=labels,
        )
        blind = GaugeMetricFamily(
            "llmgw_decider_capping_blind",
            "1 while the decider has no fresh measured power or membership for the domain: "
            "its ladder holds its step and its leases give the safe limit.",
            labels=labels,
        )
        for capping in self._capper.domains():
            key = [capping.ref.kind, capping.ref.name]
            state = capping.state
            step.add_metric(key, state.step)
            since.add_metric(key, state.since)
            for klass, cap in sorted(state.caps.items()):
                limit.add_metric([*key, klass], cap)
            safe.add_metric(key, capping.safe_gpu_limit_watts)
            lost.add_metric(key, 0.0 if state.lost_feed is None else 1.0)
            blind.add_metric(key, 0.0 if capping.blind is None else 1.0)
        yield from (step, since, limit, safe, lost, blind)
