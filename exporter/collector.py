"""Turns the agent's declarations and the sources' last readings into metric families."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporter.config import AgentConfig
from exporter.poller import SourceRunner
from exporter.samples import Sample
from llmgw_common.metrics import METRICS


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


def served_samples(runner: SourceRunner, served: dict[str, set[str]]) -> list[Sample]:
    """The runner's fresh samples, less those it defers to a source that serves that metric."""
    defer = runner.source.defer
    return [
        sample
        for sample in runner.fresh_samples()
        if sample.metric not in served.get(defer.get(sample.metric, ""), ())
    ]


def includes_gpus(config: AgentConfig, samples: list[Sample]) -> list[Sample]:
    """`bmc_includes_gpus` beside each node power reading whose source does not say itself."""
    if config.bmc_includes_gpus is None:
        return []
    said = {s.labels.get("source") for s in samples if s.metric == "llmgw_node_power_includes_gpus"}
    return [
        Sample(
            "llmgw_node_power_includes_gpus",
            1 if config.bmc_includes_gpus else 0,
            {"source": sample.labels.get("source", "")},
        )
        for sample in samples
        if sample.metric == "llmgw_node_power_watts" and sample.labels.get("source") not in said
    ]


def source_health(runner: SourceRunner) -> list[Sample]:
    state = runner.state
    if state.up is None:
        return []
    labels = {"source": runner.name}
    samples = [
        Sample("llmgw_exporter_source_up", 1 if state.up else 0, labels),
        Sample("llmgw_exporter_source_duration_seconds", state.duration_seconds, labels),
        Sample("llmgw_exporter_source_deadline_seconds", runner.deadline, labels),
        Sample("llmgw_exporter_source_abandoned_polls_total", runner.guard.abandoned, labels),
    ]
    if not state.up and state.failure:
        samples.append(
            Sample("llmgw_exporter_source_failing", 1, {**labels, "reason": state.failure})
        )
    if state.last_success is not None:
        samples.append(
            Sample(
                "llmgw_exporter_source_last_success_timestamp_seconds", state.last_success, labels
            )
        )
    return samples


class ExporterCollector(Collector):
    """Serves what the runners last read; never touches a sensor itself."""

    def __init__(
        self,
        config: AgentConfig,
        runners: Iterable[SourceRunner],
        extra: Iterable[Callable[[], list[Sample]]] = (),
    ) -> None:
        self.node = config.node
        self.config = config
        self.declared = declared_samples(config)
        self.runners = list(runners)
        #: What else the process publishes from state it keeps (the capping agent's view).
        self.extra = list(extra)

    def collect(self) -> Iterator[Metric]:
        samples = list(self.declared)
        served = {
            runner.name: {s.metric for s in runner.fresh_samples()} for runner in self.runners
        }
        for runner in self.runners:
            samples.extend(served_samples(runner, served))
            samples.extend(source_health(runner))
            samples.extend(runner.source.counter_resets())
        samples.extend(includes_gpus(self.config, samples))
        for more in self.extra:
            samples.extend(more())
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
