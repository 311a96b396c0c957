"""The physics of a simulated site, stepped in time (docs/simulation.md, "Physics").

Two clocks. *Real* time is the wall clock: Prometheus stamps samples with it, so the
exporter's timestamps and the energy counters follow it (`rate()` of an energy counter is
the power gauge, whatever the time scale). *Simulated* time runs `time_scale` times faster
and drives everything the scenario describes in time: the thermal lag, the PDU trace
replay (from the simulator's start) and the timeline's events (from the timeline's start,
which a caller may hold back: the demo starts it when its story gets there).

Per GPU, each step: a load in [0, 1] (the node's, a trace's, a reservation's); the power
between idle and the limit with that load, cut while thermally throttled; the die and HBM
temperatures moving towards inlet + offset + power × °C/W with a first-order lag; the
throttle reasons from the temperature (with hysteresis) or forced by an event; the energy
counter integrating the power. Per CPU package and its DRAM: the same with the host's
load. Node power = GPUs + CPUs + DRAM + the declared overhead, which is also what its BMC
reads, when it has one and it is not silent.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from llmgw_sim.hardware import (
    HOST_BASE_LOAD,
    HOST_GPU_SHARE,
    HW_THERMAL_POWER_FACTOR,
    POWER_CAP_LOAD,
    SW_THERMAL_POWER_FACTOR,
    THROTTLE_HYSTERESIS_C,
)
from llmgw_sim.scenario import (
    REASONS,
    THERMAL_REASONS,
    BmcSilent,
    CoolingFailure,
    GpuThrottle,
    InletChange,
    LoadChange,
    NodePlace,
    PduReadingLost,
    Scenario,
    Where,
)

#: Degrees past its slowdown temperature that an overheating card (a thermal
#: `gpu_throttle` event) heads for.
OVERHEAT_MARGIN_C = 2.0
#: A step longer than this many ticks (a suspended process, a wall-clock jump) is cut short.
MAX_STEP_TICKS = 10
_UUID_NAMESPACE = uuid.UUID("5b1f3c52-1d0e-4a8e-9a59-6c1d2f7e0b11")
_SW_POWER_CAP = REASONS.index("sw_power_cap")
_HW_SLOWDOWN = REASONS.index("hw_slowdown")
_SW_THERMAL = REASONS.index("sw_thermal")
_HW_THERMAL = REASONS.index("hw_thermal")
_POWER_BRAKE = REASONS.index("power_brake")


@dataclass(slots=True)
class GpuState:
    index: int
    uuid: str
    load: float = 0.0
    power: float = 0.0
    temperature: float = 0.0
    memory_temperature: float = 0.0
    energy: float = 0.0
    throttled: list[bool] = field(default_factory=lambda: [False] * len(REASONS))


@dataclass(slots=True)
class NodeState:
    place: NodePlace
    gpus: list[GpuState]
    inlet: float = 0.0
    base_load: float = 0.0
    cpu_load: float = 0.0
    cpu_power: list[float] = field(default_factory=list)
    cpu_temperature: list[float] = field(default_factory=list)
    cpu_energy: list[float] = field(default_factory=list)
    dram_power: list[float] = field(default_factory=list)
    dram_energy: list[float] = field(default_factory=list)
    power: float = 0.0
    """GPUs + CPUs + DRAM + declared overhead: what the BMC reads."""
    bmc_up: bool = True
    bmc_last_success: float = 0.0

    @property
    def name(self) -> str:
        return self.place.name


@dataclass(frozen=True, slots=True)
class Effects:
    """What the timeline does at one moment."""

    inlet_delta: Mapping[int, float]
    load: Mapping[int, float]
    overheat: frozenset[tuple[int, int]]
    forced: Mapping[tuple[int, int], frozenset[int]]
    bmc_silent: frozenset[int]
    pdu_lost: frozenset[str]
    alarms: frozenset[str]


NO_EFFECTS = Effects({}, {}, frozenset(), {}, frozenset(), frozenset(), frozenset())


def ramp(t: float, at: float, over: float, duration: float | None) -> float:
    """0 before `at`, rising linearly to 1 over `over`; after `duration` from `at`, falling
    back to 0 over `over` from where it had got to."""
    if t < at:
        return 0.0
    rise = 1.0 if over <= 0 else min(1.0, (t - at) / over)
    if duration is None or t < at + duration:
        return rise
    peak = 1.0 if over <= 0 else min(1.0, duration / over)
    fall = 1.0 if over <= 0 else min(1.0, (t - at - duration) / over)
    return peak * (1.0 - fall)


def active(t: float, at: float, duration: float | None) -> bool:
    return at <= t and (duration is None or t < at + duration)


def gpu_uuid(node: str, index: int) -> str:
    """A stable UUID per (node, GPU index), in NVML's `GPU-…` form."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


class Simulator:
    """The state of every node, advanced by `advance(now)` (real seconds, Unix time).

    `advance` is called by one thread (the ticker); `set_reserved_gpus` may be called from
    another (the decider poller): it replaces a dict, which readers see whole.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        now: float,
        start_timeline: bool = True,
    ) -> None:
        self.scenario = scenario
        self.start = now
        self.timeline_start: float | None = now if start_timeline else None
        self.last = now
        self.effects = NO_EFFECTS
        self.reserved_gpus: Mapping[str, int] = {}
        self.replica_load = (
            scenario.load.from_decider.replica_load if scenario.load.from_decider else 0.9
        )
        self.lock = threading.Lock()
        self.nodes = [
            NodeState(
                place=place,
                gpus=[
                    GpuState(index=i, uuid=gpu_uuid(place.name, i))
                    for i in range(place.node_type.gpus)
                ],
                cpu_power=[0.0] * place.node_type.cpu_sockets,
                cpu_temperature=[0.0] * place.node_type.cpu_sockets,
                cpu_energy=[0.0] * place.node_type.cpu_sockets,
                dram_power=[0.0] * place.node_type.cpu_sockets,
                dram_energy=[0.0] * place.node_type.cpu_sockets,
                bmc_last_success=now,
            )
            for place in scenario.nodes
        ]
        self.by_name = {node.name: i for i, node in enumerate(self.nodes)}
        self._targets = self._event_targets()
        self._traced = self._trace_nodes()
        self._step(now, dt_real=0.0, dt_sim=math.inf)  # start at the steady state

    # --- clocks ---------------------------------------------------------------------------

    def sim_time(self, now: float) -> float:
        """Simulated seconds since the simulator started."""
        return (now - self.start) * self.scenario.time_scale

    def timeline_time(self, now: float) -> float | None:
        """Simulated seconds since the timeline started; None before it has."""
        if self.timeline_start is None:
            return None
        return (now - self.timeline_start) * self.scenario.time_scale

    def start_timeline(self, now: float) -> None:
        """Start the scenario's timeline now (it counts its events' `at` from here)."""
        if self.timeline_start is None:
            self.timeline_start = now

    def set_reserved_gpus(self, reserved: Mapping[str, int]) -> None:
        """The decider's reservations: reserved GPUs per node (`load.from_decider`)."""
        self.reserved_gpus = dict(reserved)

    # --- stepping ---------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Step every node from the last call to `now`."""
        with self.lock:
            dt_real = min(max(now - self.last, 0.0), MAX_STEP_TICKS * self.scenario.tick)
            self._step(now, dt_real=dt_real, dt_sim=dt_real * self.scenario.time_scale)
            self.last = now

    def _step(self, now: float, *, dt_real: float, dt_sim: float) -> None:
        t = self.timeline_time(now)
        self.effects = NO_EFFECTS if t is None else self._effects(t)
        trace_loads = self._trace_loads(self.sim_time(now))
        reserved = self.reserved_gpus
        defaults = self.scenario.load
        for index, node in enumerate(self.nodes):
            base = trace_loads.get(index, defaults.nodes.get(node.name, defaults.default))
            base = self.effects.load.get(index, base)
            node.base_load = base
            node.inlet = node.place.inlet_c + self.effects.inlet_delta.get(index, 0.0)
            _step_node(
                node,
                index,
                reserved=reserved.get(node.name, 0),
                replica_load=self.replica_load,
                effects=self.effects,
                dt_real=dt_real,
                dt_sim=dt_sim,
            )
            if node.place.node_type.bmc is not None:
                silent = index in self.effects.bmc_silent
                node.bmc_up = not silent
                if not silent:
                    node.bmc_last_success = now

    # --- what the timeline does --------------------------------------------------------------

    def _nodes_where(self, where: Where) -> list[int]:
        kind, name = where.kind, where.name
        if kind == "node":
            return [self.by_name[name]]
        return [i for i, node in enumerate(self.nodes) if getattr(node.place, kind) == name]

    def _event_targets(self) -> list[list[int]]:
        targets: list[list[int]] = []
        for event in self.scenario.events:
            body = event.body
            if isinstance(body, Where):
                targets.append(self._nodes_where(body))
            elif isinstance(body, CoolingFailure):
                targets.append([i for i, n in enumerate(self.nodes) if n.place.row == body.row])
            elif isinstance(body, GpuThrottle | BmcSilent):
                targets.append([self.by_name[body.node]])
            else:
                targets.append([])
        return targets

    def _effects(self, t: float) -> Effects:
        inlet: dict[int, float] = {}
        load: dict[int, tuple[float, float]] = {}  # node -> (at, load): the latest event wins
        overheat: set[tuple[int, int]] = set()
        forced: dict[tuple[int, int], set[int]] = {}
        silent: set[int] = set()
        lost: set[str] = set()
        alarms: set[str] = set()
        for event, nodes in zip(self.scenario.events, self._targets, strict=True):
            body = event.body
            if isinstance(body, CoolingFailure | InletChange):
                rise = body.rise_c if isinstance(body, CoolingFailure) else body.delta_c
                delta = rise * ramp(t, event.at, body.over, body.duration)
                if delta:
                    for i in nodes:
                        inlet[i] = inlet.get(i, 0.0) + delta
                if isinstance(body, CoolingFailure) and body.alarm_after is not None:
                    start = event.at + body.alarm_after
                    end = None if body.duration is None else event.at + body.duration
                    if start <= t and (end is None or t < end):
                        alarms.add(body.row)
            elif isinstance(body, LoadChange):
                if active(t, event.at, body.duration):
                    for i in nodes:
                        if i not in load or load[i][0] <= event.at:
                            load[i] = (event.at, body.load)
            elif isinstance(body, GpuThrottle):
                if active(t, event.at, body.duration):
                    node = nodes[0]
                    gpus = range(len(self.nodes[node].gpus)) if body.gpu is None else [body.gpu]
                    for gpu in gpus:
                        if body.reason in THERMAL_REASONS:
                            overheat.add((node, gpu))
                        else:
                            forced.setdefault((node, gpu), set()).add(REASONS.index(body.reason))
            elif isinstance(body, BmcSilent):
                if active(t, event.at, body.duration):
                    silent.update(nodes)
            elif isinstance(body, PduReadingLost) and active(t, event.at, body.duration):
                lost.add(body.pdu)
        return Effects(
            inlet_delta=inlet,
            load={i: value for i, (_, value) in load.items()},
            overheat=frozenset(overheat),
            forced={key: frozenset(value) for key, value in forced.items()},
            bmc_silent=frozenset(silent),
            pdu_lost=frozenset(lost),
            alarms=frozenset(alarms),
        )

    # --- PDU traces ----------------------------------------------------------------------------

    def _trace_nodes(self) -> list[tuple[int, list[int], float, float]]:
        """Per trace: its index, its nodes, and their power summed at load 0 and at load 1."""
        traced = []
        for index, trace in enumerate(self.scenario.pdu_traces):
            nodes = [i for i, n in enumerate(self.nodes) if trace.pdu in n.place.pdus]
            idle = sum(steady_node_power(self.nodes[i].place, 0.0) for i in nodes)
            full = sum(steady_node_power(self.nodes[i].place, 1.0) for i in nodes)
            traced.append((index, nodes, idle, full))
        return traced

    def _trace_loads(self, sim_seconds: float) -> dict[int, float]:
        """The base load of each node under a traced PDU, such that the nodes' power (without
        reservations or throttling) is the trace's utilisation × the PDU's rating."""
        loads: dict[int, float] = {}
        for index, nodes, idle, full in self._traced:
            trace = self.scenario.pdu_traces[index]
            target = trace.utilisation(sim_seconds) * trace.rating_watts
            value = 0.0 if full <= idle else (target - idle) / (full - idle)
            value = min(1.0, max(0.0, value))
            for i in nodes:
                loads[i] = value
        return loads

    # --- readings --------------------------------------------------------------------------

    def pdu_watts(self) -> dict[str, float]:
        """What each PDU's own meter reads: its share of each node it feeds (a node's load is
        shared evenly between its feeds), lost readings left out."""
        watts = dict.fromkeys(self.scenario.pdus, 0.0)
        for node in self.nodes:
            share = node.power / len(node.place.pdus)
            for pdu in node.place.pdus:
                watts[pdu] += share
        for pdu in self.effects.pdu_lost:
            watts.pop(pdu, None)
        return watts

    def rack_watts(self, rack: str) -> float:
        with self.lock:
            return sum(node.power for node in self.nodes if node.place.rack == rack)

    def node(self, name: str) -> NodeState:
        return self.nodes[self.by_name[name]]


def _lag(value: float, target: float, dt: float, tau: float) -> float:
    if dt == math.inf or tau <= 0:
        return target
    return target + (value - target) * math.exp(-dt / tau)


def host_load(gpu_loads: list[float], base: float) -> float:
    """CPU and DRAM load: a base plus a share of the GPUs' mean load; a node without GPUs
    runs its own load."""
    if not gpu_loads:
        return max(HOST_BASE_LOAD, base)
    return min(1.0, HOST_BASE_LOAD + HOST_GPU_SHARE * sum(gpu_loads) / len(gpu_loads))


def steady_node_power(place: NodePlace, load: float) -> float:
    """The node's power with every GPU at `load`, unthrottled."""
    gpu = place.gpu_model
    cpu = place.cpu_model
    gpus = place.node_type.gpus
    host = host_load([load] * gpus, load)
    return (
        gpus * (gpu.idle_watts + load * (gpu.power_limit_watts - gpu.idle_watts))
        + place.node_type.cpu_sockets
        * (
            cpu.idle_watts
            + host * (cpu.tdp_watts - cpu.idle_watts)
            + cpu.dram_idle_watts
            + host * (cpu.dram_max_watts - cpu.dram_idle_watts)
        )
        + (place.node_type.overhead_watts or 0.0)
    )


def _step_node(
    node: NodeState,
    index: int,
    *,
    reserved: int,
    replica_load: float,
    effects: Effects,
    dt_real: float,
    dt_sim: float,
) -> None:
    place = node.place
    model = place.gpu_model
    idle, limit = model.idle_watts, model.power_limit_watts
    slowdown, max_operating = model.slowdown_celsius, model.max_operating_celsius
    inlet = node.inlet
    total = 0.0
    loads = []
    for gpu in node.gpus:
        load = max(node.base_load, replica_load) if gpu.index < reserved else node.base_load
        loads.append(load)
        gpu.load = load
        flags = gpu.throttled
        temperature = gpu.temperature
        forced = effects.forced.get((index, gpu.index), frozenset())
        if dt_sim == math.inf:  # the first, steady-state step: no throttling history
            hw = sw = False
        else:
            hw = temperature >= slowdown or (
                flags[_HW_THERMAL] and temperature > slowdown - THROTTLE_HYSTERESIS_C
            )
            sw = temperature >= max_operating or (
                flags[_SW_THERMAL] and temperature > max_operating - THROTTLE_HYSTERESIS_C
            )
        brake = _POWER_BRAKE in forced
        factor = 1.0
        if hw or brake:
            factor = HW_THERMAL_POWER_FACTOR
        elif sw:
            factor = SW_THERMAL_POWER_FACTOR
        power = idle + load * (limit - idle) * factor
        flags[_HW_THERMAL] = hw
        flags[_SW_THERMAL] = sw
        flags[_POWER_BRAKE] = brake
        flags[_HW_SLOWDOWN] = hw or brake or _HW_SLOWDOWN in forced
        flags[_SW_POWER_CAP] = (load >= POWER_CAP_LOAD and factor == 1.0) or (
            _SW_POWER_CAP in forced
        )
        target = inlet + model.die_offset_celsius + model.die_celsius_per_watt * power
        if (index, gpu.index) in effects.overheat:
            target = max(target, slowdown + OVERHEAT_MARGIN_C)
        gpu.temperature = _lag(temperature, target, dt_sim, model.time_constant)
        if model.memory_offset_celsius is not None:
            memory_target = (
                inlet + model.memory_offset_celsius + model.memory_celsius_per_watt * power
            )
            gpu.memory_temperature = _lag(
                gpu.memory_temperature, memory_target, dt_sim, model.time_constant
            )
        gpu.power = power
        gpu.energy += power * dt_real
        total += power
    cpu = place.cpu_model
    host = host_load(loads, node.base_load)
    node.cpu_load = host
    cpu_power = cpu.idle_watts + host * (cpu.tdp_watts - cpu.idle_watts)
    dram_power = cpu.dram_idle_watts + host * (cpu.dram_max_watts - cpu.dram_idle_watts)
    cpu_target = inlet + cpu.die_offset_celsius + cpu.die_celsius_per_watt * cpu_power
    for socket in range(place.node_type.cpu_sockets):
        node.cpu_power[socket] = cpu_power
        node.cpu_temperature[socket] = _lag(
            node.cpu_temperature[socket], cpu_target, dt_sim, cpu.time_constant
        )
        node.cpu_energy[socket] += cpu_power * dt_real
        node.dram_power[socket] = dram_power
        node.dram_energy[socket] += dram_power * dt_real
        total += cpu_power + dram_power
    node.power = total + (place.node_type.overhead_watts or 0.0)


#: A function returning Unix time; injected so tests drive the clock.
Clock = Callable[[], float]
