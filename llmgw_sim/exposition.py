"""What a simulated node's exporter would serve, and what the site's own meters would.

A node's exposition has the names, types, help texts and label names of the real
exporter (`llmgw_common/metrics.py`, and tests/golden/exporter-e2e.txt for its shape): families
in name order, labels in name order, `node` on every series. Each node gets a
`NodeRenderer` built once, with every label set already written out; a tick only formats
the numbers. Sensors read like the hardware they stand for: NVML temperatures in whole
degrees, power in milliwatts, energy in millijoules, coretemp in whole degrees.

From the exporter's BMC sources, for a node with a BMC: `llmgw_node_power_watts{source}`,
`llmgw_node_power_includes_gpus{source}` 1 and that source's health series, named `ipmi` or
`redfish` as the exporter names them. Beyond the real exporter's table:

- the site target: `crac_alarm{row,unit}` (one cooling unit per row, 0/1) and
  `pdu_outlet_power_watts{pdu}`, standing for what a DCIM and the SNMP exporter would
  publish (examples/facility.yaml's `signals` read these names).
"""

from __future__ import annotations

from collections.abc import Callable

from llmgw_common.metrics import METRICS, THERMAL_REASONS, MetricSpec
from llmgw_sim.engine import NodeState, Simulator
from llmgw_sim.scenario import REASONS

#: Positions in a GPU's `throttled` flags of the reasons that mean heat.
_THERMAL = tuple(REASONS.index(reason) for reason in THERMAL_REASONS)

SITE_METRICS = {
    spec.name: spec
    for spec in (
        MetricSpec(
            "crac_alarm",
            "gauge",
            "1 while the row's cooling unit is in alarm (simulated DCIM).",
            ("row", "unit"),
        ),
        MetricSpec(
            "pdu_outlet_power_watts",
            "gauge",
            "Power through the PDU, from its own meter (simulated SNMP exporter).",
            ("pdu",),
        ),
    )
}
#: Seconds each source's poll is said to take (assumed; an IPMI round trip is slow).
SOURCE_DURATION_S = {"gpu": 0.004, "hwmon": 0.001, "rapl": 0.0005}
BMC_DURATION_S = 0.25
INLET_CHIP = "platform_nct6775_656"
INLET_SENSOR = "SYSTIN"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def spec(name: str) -> MetricSpec:
    return SITE_METRICS.get(name) or METRICS[name]


def header(name: str) -> str:
    found = spec(name)
    return f"# HELP {name} {found.help}\n# TYPE {name} {found.type}\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def series(name: str, **labels: str) -> str:
    """`name{a="…",b="…"} ` (labels in name order), ready for a value."""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}} "


def _number(value: float) -> str:
    return repr(float(value))


def _whole(value: float) -> str:
    return repr(float(round(value)))


def _milli(value: float) -> str:
    return repr(round(value, 3))


Lines = Callable[[NodeState, float], list[str]]


def _thermally_throttled(flags: list[bool]) -> bool:
    return any(flags[i] for i in _THERMAL)


class NodeRenderer:
    """One node's exposition: label sets written once, numbers formatted per call."""

    def __init__(self, node: NodeState) -> None:
        place = node.place
        name = place.name
        gpu_model = place.gpu_model
        self.bmc = place.node_type.bmc
        # The BMC's source is named as the exporter names it: ipmi or redfish.
        sources = ([self.bmc] if self.bmc else []) + ["gpu", "hwmon", "rapl"]
        families: dict[str, str | Lines] = {}

        def per_source(family: str) -> list[str]:
            return [series(family, node=name, source=source) for source in sources]

        duration = per_source("llmgw_exporter_source_duration_seconds")
        last = per_source("llmgw_exporter_source_last_success_timestamp_seconds")
        up = per_source("llmgw_exporter_source_up")
        durations = [_number(SOURCE_DURATION_S.get(source, BMC_DURATION_S)) for source in sources]
        bmc_first = self.bmc is not None

        def bmc_ok(node: NodeState, i: int) -> bool:
            return not (bmc_first and i == 0) or node.bmc_up

        def last_success(node: NodeState, i: int, now: float) -> str:
            if bmc_first and i == 0:
                return _number(node.bmc_last_success)
            return _number(now)

        families["llmgw_exporter_source_duration_seconds"] = lambda node, now: [
            f"{prefix}{value}\n" for prefix, value in zip(duration, durations, strict=True)
        ]
        families["llmgw_exporter_source_last_success_timestamp_seconds"] = lambda node, now: [
            f"{prefix}{last_success(node, i, now)}\n" for i, prefix in enumerate(last)
        ]
        families["llmgw_exporter_source_up"] = lambda node, now: [
            f"{prefix}{'1.0' if bmc_ok(node, i) else '0.0'}\n" for i, prefix in enumerate(up)
        ]
        # The exporter's poll deadlines (its defaults: BMCs 2 x 10 s + 5 s) and bookkeeping:
        # a simulated sensor never hangs, and its counters never reset.
        deadlines = {"gpu": 5.0, "hwmon": 3.0, "rapl": 2.0}
        families["llmgw_exporter_source_deadline_seconds"] = "".join(
            f"{prefix}{_number(deadlines.get(source, 25.0))}\n"
            for prefix, source in zip(
                per_source("llmgw_exporter_source_deadline_seconds"), sources, strict=True
            )
        )
        families["llmgw_exporter_source_abandoned_polls_total"] = "".join(
            f"{prefix}0.0\n" for prefix in per_source("llmgw_exporter_source_abandoned_polls_total")
        )
        resets = [("rapl", "llmgw_node_cpu_energy_joules_total")]
        resets += [("rapl", "llmgw_node_dram_energy_joules_total")]
        resets += [("gpu", "llmgw_gpu_energy_joules_total")] if node.gpus else []
        families["llmgw_exporter_energy_resets_total"] = "".join(
            f"{series('llmgw_exporter_energy_resets_total', metric=m, node=name, source=s)}0.0\n"
            for s, m in resets
        )

        gpus = [(gpu.index, gpu.uuid) for gpu in node.gpus]

        def per_gpu(family: str) -> list[str]:
            return [series(family, gpu=str(i), node=name, uuid=u) for i, u in gpus]

        if gpus:
            energy = per_gpu("llmgw_gpu_energy_joules_total")
            memory = per_gpu("llmgw_gpu_memory_temperature_celsius")
            power = per_gpu("llmgw_gpu_power_watts")
            temperature = per_gpu("llmgw_gpu_temperature_celsius")
            throttled = [
                [
                    series("llmgw_gpu_throttled", gpu=str(i), node=name, reason=reason, uuid=u)
                    for reason in REASONS
                ]
                for i, u in gpus
            ]
            families["llmgw_gpu_energy_joules_total"] = lambda node, now: [
                f"{energy[g.index]}{_milli(g.energy)}\n" for g in node.gpus
            ]
            model = gpu_model.product_name
            families["llmgw_gpu_info"] = "".join(
                f"{series('llmgw_gpu_info', gpu=str(i), model=model, node=name, uuid=u)}1.0\n"
                for i, u in gpus
            )
            if gpu_model.memory_offset_celsius is not None:
                families["llmgw_gpu_memory_temperature_celsius"] = lambda node, now: [
                    f"{memory[g.index]}{_whole(g.memory_temperature)}\n" for g in node.gpus
                ]
            families["llmgw_gpu_power_limit_watts"] = "".join(
                f"{prefix}{_number(gpu_model.power_limit_watts)}\n"
                for prefix in per_gpu("llmgw_gpu_power_limit_watts")
            )
            families["llmgw_gpu_power_watts"] = lambda node, now: [
                f"{power[g.index]}{_milli(g.power)}\n" for g in node.gpus
            ]
            families["llmgw_gpu_slowdown_temperature_celsius"] = "".join(
                f"{prefix}{_number(gpu_model.slowdown_celsius)}\n"
                for prefix in per_gpu("llmgw_gpu_slowdown_temperature_celsius")
            )
            families["llmgw_gpu_temperature_celsius"] = lambda node, now: [
                f"{temperature[g.index]}{_whole(g.temperature)}\n" for g in node.gpus
            ]
            families["llmgw_gpu_throttled"] = lambda node, now: [
                f"{prefix}{'1.0' if flag else '0.0'}\n"
                for g in node.gpus
                for prefix, flag in zip(throttled[g.index], g.throttled, strict=True)
            ]
            # The exporter's per-GPU and per-node figures (exporter/sources/gpu.py), from the
            # values as published: whole degrees, milliwatts.
            slowdown = gpu_model.slowdown_celsius
            headroom = per_gpu("llmgw_gpu_slowdown_headroom_celsius")
            thermally = per_gpu("llmgw_gpu_thermally_throttled")
            families["llmgw_gpu_slowdown_headroom_celsius"] = lambda node, now: [
                f"{headroom[g.index]}{_number(slowdown - round(g.temperature))}\n"
                for g in node.gpus
            ]
            families["llmgw_gpu_thermally_throttled"] = lambda node, now: [
                f"{thermally[g.index]}{'1.0' if _thermally_throttled(g.throttled) else '0.0'}\n"
                for g in node.gpus
            ]
            families["llmgw_node_gpus"] = f"{series('llmgw_node_gpus', node=name)}{len(gpus)}.0\n"
            node_throttled = series("llmgw_node_gpus_thermally_throttled", node=name)
            families["llmgw_node_gpus_thermally_throttled"] = lambda node, now: [
                f"{node_throttled}"
                f"{_number(sum(_thermally_throttled(g.throttled) for g in node.gpus))}\n"
            ]
            node_gpu_power = series("llmgw_node_gpu_power_watts", node=name)
            families["llmgw_node_gpu_power_watts"] = lambda node, now: [
                f"{node_gpu_power}{_milli(sum(round(g.power, 3) for g in node.gpus))}\n"
            ]

        packages = range(place.node_type.cpu_sockets)

        def per_package(family: str) -> list[str]:
            return [series(family, node=name, package=str(p)) for p in packages]

        cpu_energy = per_package("llmgw_node_cpu_energy_joules_total")
        cpu_power = per_package("llmgw_node_cpu_power_watts")
        dram_energy = per_package("llmgw_node_dram_energy_joules_total")
        dram_power = per_package("llmgw_node_dram_power_watts")
        cpu_temperature = [
            series(
                "llmgw_node_cpu_temperature_celsius",
                chip=f"platform_coretemp_{p}",
                node=name,
                sensor=f"Package id {p}",
            )
            for p in packages
        ]
        families["llmgw_node_cpu_energy_joules_total"] = lambda node, now: [
            f"{prefix}{_milli(value)}\n"
            for prefix, value in zip(cpu_energy, node.cpu_energy, strict=True)
        ]
        families["llmgw_node_cpu_power_watts"] = lambda node, now: [
            f"{prefix}{_milli(value)}\n"
            for prefix, value in zip(cpu_power, node.cpu_power, strict=True)
        ]
        families["llmgw_node_cpu_temperature_celsius"] = lambda node, now: [
            f"{prefix}{_whole(value)}\n"
            for prefix, value in zip(cpu_temperature, node.cpu_temperature, strict=True)
        ]
        families["llmgw_node_dram_energy_joules_total"] = lambda node, now: [
            f"{prefix}{_milli(value)}\n"
            for prefix, value in zip(dram_energy, node.dram_energy, strict=True)
        ]
        families["llmgw_node_dram_power_watts"] = lambda node, now: [
            f"{prefix}{_milli(value)}\n"
            for prefix, value in zip(dram_power, node.dram_power, strict=True)
        ]
        if place.cpu_model.product_name is not None:
            families["llmgw_node_cpu_info"] = (
                f"{series('llmgw_node_cpu_info', model=place.cpu_model.product_name, node=name)}"
                "1.0\n"
            )
        families["llmgw_node_info"] = (
            series(
                "llmgw_node_info",
                node=name,
                rack=place.rack,
                room=place.room,
                row=place.row,
                site=place.site,
            )
            + "1.0\n"
        )
        inlet = series(
            "llmgw_node_inlet_temperature_celsius", chip=INLET_CHIP, node=name, sensor=INLET_SENSOR
        )
        families["llmgw_node_inlet_temperature_celsius"] = lambda node, now: [
            f"{inlet}{round(node.inlet, 1)!r}\n"
        ]
        families["llmgw_node_pdu_info"] = "".join(
            f"{series('llmgw_node_pdu_info', node=name, pdu=pdu)}1.0\n" for pdu in place.pdus
        )
        if place.node_type.overhead_watts is not None:
            families["llmgw_node_power_overhead_watts"] = (
                f"{series('llmgw_node_power_overhead_watts', node=name)}"
                f"{_number(place.node_type.overhead_watts)}\n"
            )
        if self.bmc is not None:
            # The simulated BMC reads the whole node, GPUs included (agent.yaml
            # bmc_includes_gpus: true).
            node_power = series("llmgw_node_power_watts", node=name, source=self.bmc)
            includes = series("llmgw_node_power_includes_gpus", node=name, source=self.bmc)
            families["llmgw_node_power_watts"] = lambda node, now: (
                [f"{node_power}{_milli(node.power)}\n"] if node.bmc_up else []
            )
            families["llmgw_node_power_includes_gpus"] = lambda node, now: (
                [f"{includes}1\n"] if node.bmc_up else []
            )
        self._families = [(header(family), families[family]) for family in sorted(families)]

    def render(self, node: NodeState, now: float) -> bytes:
        out: list[str] = []
        for head, part in self._families:
            if isinstance(part, str):
                out.append(head)
                out.append(part)
                continue
            lines = part(node, now)
            if lines:
                out.append(head)
                out.extend(lines)
        return "".join(out).encode()


class Renderer:
    """Every node's exposition and the site's, rendered together once per tick."""

    def __init__(self, simulator: Simulator) -> None:
        self.simulator = simulator
        self._nodes = [NodeRenderer(node) for node in simulator.nodes]
        rows = list(simulator.scenario.row_racks)
        self._alarm = [(row, series("crac_alarm", row=row, unit=f"crac-{row}")) for row in rows]
        self._pdu = {
            pdu: series("pdu_outlet_power_watts", pdu=pdu) for pdu in simulator.scenario.pdus
        }

    def render_nodes(self, now: float) -> dict[str, bytes]:
        with self.simulator.lock:
            return {
                node.name: renderer.render(node, now)
                for node, renderer in zip(self.simulator.nodes, self._nodes, strict=True)
            }

    def render_site(self) -> bytes:
        with self.simulator.lock:
            alarms = self.simulator.effects.alarms
            watts = self.simulator.pdu_watts()
        out = [header("crac_alarm")]
        out.extend(f"{prefix}{'1.0' if row in alarms else '0.0'}\n" for row, prefix in self._alarm)
        if watts:
            out.append(header("pdu_outlet_power_watts"))
            out.extend(f"{self._pdu[pdu]}{_milli(value)}\n" for pdu, value in watts.items())
        return "".join(out).encode()
