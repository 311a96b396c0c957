"""`/bmc?target=NODE`: one exporter reads a rack of BMCs, each BMC its own Prometheus target.

The multi-target pattern of Prometheus' snmp_exporter (`/snmp?target=…`) and ipmi_exporter
(`/ipmi?target=…`): agent.yaml's `bmcs` lists the BMCs by the node each measures (its
`labels`, `bmc_includes_gpus`, and an out-of-band `ipmi` or `redfish` section:
exporter.config.BmcTarget), and Prometheus asks for one at a time. A probe reads that BMC
now, through the same source a node's own exporter would poll (`IpmiSource`,
`RedfishSource`, run by a `SourceRunner` with the source's deadline), and answers that
node's exposition only, as the node's own exporter would publish it for that BMC: its
`llmgw_node_info` (and `llmgw_node_pdu_info`), `llmgw_node_power_watts`, the inlet,
`llmgw_node_power_includes_gpus`, and `llmgw_exporter_source_up{source}` with its
`failing` reason, every series with `node` = the target. So each BMC has its own `up` and
its own source health, exactly as with a process per BMC, and one silent BMC reads only its
own target down.

Per target, across probes, the source is kept: its last reading (served through failed
reads until `stale_after`), `frozen_after`'s judgement, FreeIPMI's SDR cache, a Redfish
session. One BMC is never read twice at once: concurrent probes of one target wait for the
read in flight, and a probe that waited while a read *began after it asked* takes that
read's answer instead of starting another (the probes that arrive during one read share
the next: Prometheus' retries and two Prometheus servers scraping the same job at the same
moment cost the BMC at most one more read). A read stuck past the deadline is abandoned
(`hung`), and while it stays stuck no new one is started (exporter.deadline.HangGuard).

The exporter's own `/metrics` is unchanged: these BMCs are read only when probed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from exporter.collector import ExporterCollector
from exporter.config import AgentConfig, BmcTarget
from exporter.poller import SourceRunner, SourceState
from exporter.sources.bmc import BmcSource
from exporter.sources.ipmi import IpmiSource
from exporter.sources.redfish import RedfishSource
from exporter.web import Environ, StartResponse

log = logging.getLogger(__name__)

#: The path Prometheus' scrape job asks (`metrics_path`), with `?target=NODE`.
PATH = "/bmc"
#: The sources a target's section names (exporter.config.BmcTarget.source).
BMC_SOURCES: dict[str, type[BmcSource]] = {"ipmi": IpmiSource, "redfish": RedfishSource}


class TargetRunner(SourceRunner):
    """A BMC target's runner: its log lines name the node, as many BMCs share one log."""

    def __init__(self, node: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node = node

    def _log_change(self, before: SourceState, after: SourceState) -> None:
        if (before.up, before.reason) == (after.up, after.reason):
            return
        if not after.up:
            log.warning("BMC %s (%s) failing: %s", self.node, self.name, after.reason)
        elif after.reason:
            log.info("BMC %s (%s): %s", self.node, self.name, after.reason)
        elif before.up is not None:
            log.info("BMC %s (%s) recovered", self.node, self.name)


class ProbedBmc:
    """One BMC of `bmcs`: its source, kept across probes, and its node's exposition."""

    def __init__(
        self,
        node: str,
        target: BmcTarget,
        sysfs: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        name, source_config = target.source
        # `clock`: the source's, for its `stale_after` and `frozen_after` (tests move it).
        source = BMC_SOURCES[name](sysfs, source_config, clock)
        self.runner = TargetRunner(node, source, source_config.effective_interval)
        # The node as its own exporter declares it: the collector adds `node` and
        # `llmgw_node_info` from this, and `bmc_includes_gpus` beside the power.
        node_config = AgentConfig(
            node=node, labels=target.labels, bmc_includes_gpus=target.bmc_includes_gpus
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ExporterCollector(node_config, [self.runner]))
        self._lock = threading.Lock()
        #: When the last read began (monotonic): a probe that asked before then, and waited
        #: for it, takes its answer (a fresh one: begun after the probe asked).
        self._read_began: float | None = None

    def read(self) -> None:
        """Read the BMC now, unless a read that began after this call was made has just ended."""
        asked = time.monotonic()
        with self._lock:
            if self._read_began is not None and self._read_began >= asked:
                return
            self._read_began = time.monotonic()
            self.runner.poll_once()

    def close(self) -> None:
        if self.runner.in_flight:
            log.warning("BMC %s not closed: a read is still stuck in it", self.node)
            return
        self.runner.source.close()


class BmcProbes:
    """The `/bmc` route: a probe per request, for the targets agent.yaml lists."""

    def __init__(
        self,
        targets: Mapping[str, BmcTarget],
        sysfs: Path,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.targets = {
            node: ProbedBmc(node, target, sysfs, clock) for node, target in targets.items()
        }

    def app(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        query = environ.get("QUERY_STRING", "")
        asked = parse_qs(query if isinstance(query, str) else "").get("target", [])
        if len(asked) != 1 or not asked[0]:
            return _text(start_response, "400 Bad Request", f"ask for one BMC: {PATH}?target=NODE")
        probe = self.targets.get(asked[0])
        if probe is None:
            listed = ", ".join(sorted(self.targets))
            return _text(
                start_response,
                "404 Not Found",
                f"unknown target {asked[0]!r}: not a node of agent.yaml's bmcs ({listed})",
            )
        probe.read()
        accept = environ.get("HTTP_ACCEPT")
        encoder, content_type = choose_encoder(accept if isinstance(accept, str) else "")
        body = encoder(probe.registry)
        start_response(
            "200 OK", [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        return [body]

    def close(self) -> None:
        for probe in self.targets.values():
            probe.close()


def _text(start_response: StartResponse, status: str, message: str) -> list[bytes]:
    body = (message + "\n").encode()
    start_response(
        status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))]
    )
    return [body]
