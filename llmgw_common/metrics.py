"""Every metric the exporter publishes: name, type, help and label names.

The names are a contract (DESIGN.md §2): rules, dashboards and the decider read
them. `node` is on every series and is not listed here. A source may only emit
metrics from this table; docs/metrics.md describes each one for operators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricType = Literal["gauge", "counter"]


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()


_SPECS = [
    # agent.yaml
    MetricSpec(
        "llmgw_node_info",
        "gauge",
        "The node's place in the location tree (agent.yaml labels); always 1.",
        ("site", "room", "row", "rack"),
    ),
    MetricSpec(
        "llmgw_node_pdu_info",
        "gauge",
        "One series per PDU feed the node draws from (agent.yaml); always 1.",
        ("pdu",),
    ),
    MetricSpec(
        "llmgw_node_power_overhead_watts",
        "gauge",
        "Declared draw that no sensor sees: fans, disks, PSU loss (agent.yaml).",
    ),
    # gpu (NVML)
    MetricSpec(
        "llmgw_gpu_info",
        "gauge",
        "One series per physical GPU; always 1.",
        ("gpu", "uuid", "model"),
    ),
    MetricSpec("llmgw_gpu_temperature_celsius", "gauge", "GPU die temperature.", ("gpu", "uuid")),
    MetricSpec(
        "llmgw_gpu_memory_temperature_celsius",
        "gauge",
        "GPU memory (HBM) temperature, where the card reports it.",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_slowdown_temperature_celsius",
        "gauge",
        "Temperature at which the card starts slowing its clocks down.",
        ("gpu", "uuid"),
    ),
    MetricSpec("llmgw_gpu_power_watts", "gauge", "GPU power draw.", ("gpu", "uuid")),
    MetricSpec(
        "llmgw_gpu_power_limit_watts",
        "gauge",
        "GPU power limit enforced after every limiter.",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_power_limit_min_watts",
        "gauge",
        "Lowest power limit the card accepts (its settable range's minimum).",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_power_limit_max_watts",
        "gauge",
        "Highest power limit the card accepts (its settable range's maximum).",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_energy_joules_total",
        "counter",
        "GPU energy consumed since the driver was loaded.",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_throttled",
        "gauge",
        "1 while the GPU holds its clocks down for this reason; reasons the card supports.",
        ("gpu", "uuid", "reason"),
    ),
    MetricSpec(
        "llmgw_gpu_thermally_throttled",
        "gauge",
        "1 while the GPU holds its clocks down for hw_thermal, sw_thermal or power_brake.",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_gpu_slowdown_headroom_celsius",
        "gauge",
        "Slowdown temperature minus die temperature; below 0 past the slowdown point.",
        ("gpu", "uuid"),
    ),
    MetricSpec("llmgw_node_gpus", "gauge", "GPUs the gpu source read in its last poll."),
    MetricSpec(
        "llmgw_node_gpus_thermally_throttled",
        "gauge",
        "GPUs thermally throttled (llmgw_gpu_thermally_throttled), of those that report it.",
    ),
    MetricSpec(
        "llmgw_node_gpu_power_watts",
        "gauge",
        "Power draw of the node's GPUs together (the sum of llmgw_gpu_power_watts).",
    ),
    # the capping agent (exporter/capping.py; agent.yaml `capping`, off by default)
    MetricSpec(
        "llmgw_gpu_power_cap_watts",
        "gauge",
        "Power limit the capping agent holds this GPU at (a lease's cap or the safe cap);"
        " absent where the agent leaves the GPU alone.",
        ("gpu", "uuid"),
    ),
    MetricSpec(
        "llmgw_capping_agent_state",
        "gauge",
        "The capping agent's state, one series per state, 1 for the current one: leased"
        " (a lease in force), safe (the safe cap: no lease renewed in time, or at start),"
        " off (no lease: the GPUs left alone).",
        ("state",),
    ),
    MetricSpec(
        "llmgw_capping_agent_up",
        "gauge",
        "1 if the capping agent's last lease request and its last setting of the GPUs'"
        " limits both worked, else 0.",
    ),
    MetricSpec(
        "llmgw_capping_agent_failing",
        "gauge",
        "1 while the capping agent fails, labelled why: decider (no lease: unreachable,"
        " refusing the token, an error or a body that is not a lease), refused (a limit"
        " outside a card's range), nvml (NVML could not set a limit: no permission...) or"
        " state (the state file, which carries the safe cap across a restart, unwritable).",
        ("reason",),
    ),
    MetricSpec(
        "llmgw_capping_lease_expiry_timestamp_seconds",
        "gauge",
        "Unix time the capping agent's lease runs out; past it without a renewal the agent"
        " applies the safe cap.",
    ),
    MetricSpec(
        "llmgw_capping_safe_gpu_limit_watts",
        "gauge",
        "The per-GPU safe cap of the capping agent's last lease, applied when it runs out.",
    ),
    MetricSpec(
        "llmgw_capping_last_renewal_timestamp_seconds",
        "gauge",
        "Unix time the capping agent last received a lease from the decider.",
    ),
    # cpuinfo
    MetricSpec(
        "llmgw_node_cpu_info",
        "gauge",
        "One series per CPU model on the node (/proc/cpuinfo); always 1.",
        ("model",),
    ),
    # hwmon
    MetricSpec(
        "llmgw_node_cpu_temperature_celsius",
        "gauge",
        "CPU package temperature, else the hottest core.",
        ("chip", "sensor"),
    ),
    MetricSpec(
        "llmgw_node_inlet_temperature_celsius",
        "gauge",
        "Board inlet or ambient air temperature.",
        ("chip", "sensor"),
    ),
    # whole-node power: ipmi, redfish, cray, hwmon_power
    MetricSpec(
        "llmgw_node_power_watts",
        "gauge",
        "The whole node's power, as its BMC, Cray PMC or hwmon meter measures it.",
        ("source",),
    ),
    MetricSpec(
        "llmgw_node_energy_joules_total",
        "counter",
        "The whole node's energy, where its meter counts it (Cray PMC, hwmon).",
        ("source",),
    ),
    MetricSpec(
        "llmgw_node_power_includes_gpus",
        "gauge",
        "1 if the node power from this source includes the GPUs, 0 if not (declared).",
        ("source",),
    ),
    MetricSpec(
        "llmgw_node_component_power_watts",
        "gauge",
        "Power of one part of the node (cpu, memory, accelN), from the Cray PMC.",
        ("component",),
    ),
    # rapl
    MetricSpec(
        "llmgw_node_cpu_power_watts",
        "gauge",
        "CPU package power: RAPL over the last poll interval, or Grace's CPU + SysIO rails.",
        ("package",),
    ),
    MetricSpec(
        "llmgw_node_cpu_energy_joules_total",
        "counter",
        "CPU package energy from RAPL since the exporter started, wraps corrected.",
        ("package",),
    ),
    MetricSpec(
        "llmgw_node_dram_power_watts",
        "gauge",
        "DRAM power: RAPL over the last poll interval, or Grace's socket less CPU + SysIO.",
        ("package",),
    ),
    MetricSpec(
        "llmgw_node_dram_energy_joules_total",
        "counter",
        "DRAM energy from RAPL since the exporter started, wraps corrected.",
        ("package",),
    ),
    # units (cgroup v2, NVML process lists, /proc)
    MetricSpec(
        "llmgw_unit_info",
        "gauge",
        "One series per compute unit (replica) on the node, from its cgroup; always 1.",
        ("unit", "model", "profile"),
    ),
    MetricSpec(
        "llmgw_unit_cpu_seconds_total",
        "counter",
        "CPU time the unit's cgroup used (cpu.stat usage_usec).",
        ("unit",),
    ),
    MetricSpec(
        "llmgw_unit_memory_bytes",
        "gauge",
        "Memory the unit's cgroup uses (memory.current).",
        ("unit",),
    ),
    MetricSpec(
        "llmgw_unit_gpu_share",
        "gauge",
        "The unit's share of a GPU: 1 whole, the SM fraction of a MIG instance, over N sharers.",
        ("unit", "uuid", "gpu_instance"),
    ),
    MetricSpec(
        "llmgw_node_cpu_seconds_total",
        "counter",
        "Non-idle CPU time of all the node's CPUs (/proc/stat: no idle, iowait or steal).",
    ),
    MetricSpec(
        "llmgw_node_memory_used_bytes",
        "gauge",
        "Memory in use on the node: MemTotal - MemAvailable (/proc/meminfo).",
    ),
    # the exporter itself
    MetricSpec(
        "llmgw_exporter_source_up",
        "gauge",
        "1 if the source's last poll succeeded (or found no such hardware), else 0.",
        ("source",),
    ),
    MetricSpec(
        "llmgw_exporter_source_duration_seconds",
        "gauge",
        "How long the source's last poll took.",
        ("source",),
    ),
    MetricSpec(
        "llmgw_exporter_source_last_success_timestamp_seconds",
        "gauge",
        "Unix time of the source's last successful poll.",
        ("source",),
    ),
    MetricSpec(
        "llmgw_exporter_source_failing",
        "gauge",
        "1 while the source is down, labelled why: hung (a poll passed its deadline and"
        " has not returned), error (the poll failed) or partial (some devices failed).",
        ("source", "reason"),
    ),
    MetricSpec(
        "llmgw_exporter_source_deadline_seconds",
        "gauge",
        "How long one poll of the source may take before it is abandoned (agent.yaml).",
        ("source",),
    ),
    MetricSpec(
        "llmgw_exporter_source_abandoned_polls_total",
        "counter",
        "Polls of the source abandoned past their deadline since the exporter started.",
        ("source",),
    ),
    MetricSpec(
        "llmgw_exporter_energy_resets_total",
        "counter",
        "Times an energy counter read by the source jumped by more than any device can"
        " draw, or went backwards: that interval has no power and adds no energy.",
        ("source", "metric"),
    ),
]

METRICS: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}

#: The throttle reasons that mean heat (DESIGN.md §3): a GPU held down by any of them is
#: thermally throttled (llmgw_gpu_thermally_throttled). `sw_power_cap` (normal under load)
#: and `hw_slowdown` alone are not.
THERMAL_REASONS = ("hw_thermal", "sw_thermal", "power_brake")
