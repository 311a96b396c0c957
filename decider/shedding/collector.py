"""The shedding plan on /metrics: how many moves it proposes off each domain, and whether
shedding is enabled."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from decider.shedding.shedder import Shedder

log = logging.getLogger(__name__)


class SheddingCollector(Collector):
    """`llmgw_decider_shedding_moves{kind,domain}`: the moves proposed now off each domain
    (present only while a plan proposes some), and `llmgw_decider_shedding_enabled`."""

    def __init__(self, shedder: Shedder) -> None:
        self._shedder = shedder

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            result = self._shedder.plan()
        except Exception:  # a plan that fails (a full disk) must not fail the whole scrape
            log.exception("the shedding plan failed; /metrics goes on without its series")
            return
        enabled = GaugeMetricFamily(
            "llmgw_decider_shedding_enabled",
            "1 while the facility file enables shedding plans (shedding.enabled).",
        )
        enabled.add_metric([], 1.0 if result.enabled else 0.0)
        yield enabled
        moves = GaugeMetricFamily(
            "llmgw_decider_shedding_moves",
            "Replicas the shedding plan (GET /v1/shedding) proposes to move off the domain now.",
            labels=["kind", "domain"],
        )
        for entry in result.entries:
            if entry["moves"]:
                moves.add_metric([entry["kind"], entry["name"]], len(entry["moves"]))
        yield moves
