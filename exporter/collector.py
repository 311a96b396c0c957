"""Turns the agent's declarations and the sources' last readings into metric families."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.config import AgentConfig
from exporter.metrics import METRICS
from exporter.poller import SourceRunner
from exporter.samples import Sample


def declared_samples(config: AgentConfig) -> list[Sample]:
    """What agent.yaml says about the node: its place, its feeds, its unseen draw."""
    labels = config.labels
    samples = [
        Sample(
            "llmgw_node_info",
            1,
            {"site": labels.site, "room": labels.room, "row": labels.row, "rack": labels.rack},
        )
    ]
    samples += [Sample("llmgw_node_pdu_info", 1, {"pdu": pdu}) for pdu in labels.pdus]
    if config.overhead_watts is not None:
        samples.append(Sample("llmgw_node_power_overhead_watts", config.overhead_watts))
    return samples


def source_health(runner: SourceRunner) -> list[Sample]:
    state = runner.state
    if state.up is None:
        return []
    labels = {"source": runner.name}
    samples = [
        Sample("llmgw_exporter_source_up", 1 if state.up else 0, labels),
        Sample("llmgw_exporter_source_duration_seconds", state.duration_seconds, labels),
    ]
    if state.last_success is not None:
        samples.append(
            Sample(
                "llmgw_exporter_source_last_success_timestamp_seconds", state.last_success, labels
            )
        )
    return samples


class ExporterCollector(Collector):
    """Serves what the runners last read; never touches a sensor itself."""

    def __init__(self, config: AgentConfig, runners: Iterable[SourceRunner]) -> None:
        self.node = config.node
        self.declared = declared_samples(config)
        self.runners = list(runners)

    def collect(self) -> Iterator[Metric]:
        samples = list(self.declared)
        for runner in self.runners:
            samples.extend(runner.state.samples)
            samples.extend(source_health(runner))
        yield from self.families(samples)

    def families(self, samples: Iterable[Sample]) -> Iterator[Metric]:
        families: dict[str, tuple[GaugeMetricFamily | CounterMetricFamily, tuple[str, ...]]] = {}
        for sample in samples:
            if sample.metric not in families:
                spec = METRICS[sample.metric]
                kind = CounterMetricFamily if spec.type == "counter" else GaugeMetricFamily
                families[sample.metric] = (
                    kind(spec.name, spec.help, labels=("node", *spec.labels)),
                    spec.labels,
                )
            family, label_names = families[sample.metric]
            family.add_metric(
                [self.node, *(sample.labels.get(name, "") for name in label_names)], sample.value
            )
        for name in sorted(families):
            yield families[name][0]
