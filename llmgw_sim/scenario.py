"""The scenario file: a site's layout, its load, PDU traces to replay and a timeline.

```yaml
site: sto1
time_scale: 30                 # simulated seconds per real second
tick: 1s                       # real time between two physics steps (and renders)
inlet_c: 24                    # supply air at the racks' inlets, before any event
node_types:
  dgx-h100: {gpus: 8, gpu_model: h100-sxm, cpu_sockets: 2, overhead_watts: 600, bmc: ipmi}
rooms:
  hall-b:
    rows:
      "12":
        racks:
          r12-01: {nodes: 4}                     # PDUs r12-01-a and r12-01-b: dual-fed
          r12-02: {nodes: 4, pdus: [r12-02-a]}   # single-fed
load:
  default: 0.1                 # each GPU's load, 0-1
  nodes: {gpu-r12-01-01: 0.8}
  from_decider: http://127.0.0.1:9851   # reserved GPUs run at replica_load
pdu_traces:
  - {pdu: r12-02-a, file: cella_pdu6.csv, rating_watts: 22170}
events:
  - at: 2m
    cooling_failure: {row: "12", rise_c: 10, over: 8m, alarm_after: 6m}
```

Every key is in docs/simulation.md. `load(path)` refuses a bad file whole with every
problem as `FILE:LINE: field: reason` (llmgw_common.yamlfile.load_model), names that refer
to nothing included. Relative trace paths are relative to the scenario file.
"""

from __future__ import annotations

import csv
import re
import string
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from llmgw_common.yamlfile import Duration, FilePath, load_model, parse_duration
from llmgw_sim.hardware import CPU_MODELS, GPU_MODELS, CpuModel, GpuModel

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
#: Throttle reasons, as the exporter's `reason` label (docs/metrics.md).
REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake")
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})
MAX_NODES = 100_000

#: The directory of the scenario file being loaded: trace paths are relative to it.
_BASE_DIR: ContextVar[Path | None] = ContextVar("scenario_base_dir", default=None)


def _text(value: Any) -> Any:
    # YAML reads `row: 12` as an int; a name is text either way.
    return str(value) if type(value) in (int, float) else value


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"{name!r} is not a name: letters, digits, '.', '_' and '-', starting with a "
            "letter or digit (it becomes a label value and part of a URL)"
        )
    return name


Name = Annotated[str, BeforeValidator(_text), AfterValidator(_check_name)]


def _text_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {_text(key): item for key, item in value.items()}
    return value


def _non_negative_duration(value: Any) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and value.strip() in ("0", "0s", "0m", "0h", "0ms"):
        return 0.0
    return parse_duration(value)


#: Seconds, zero allowed: `0`, `90s`, `2m`.
Offset = Annotated[float, BeforeValidator(_non_negative_duration)]
Load = Annotated[float, Field(ge=0, le=1)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, strict=True)


# --- layout ---------------------------------------------------------------------------------


class NodeType(_Model):
    gpus: int = Field(8, ge=0, le=64)
    gpu_model: str = "h100-sxm"
    cpu_sockets: int = Field(2, ge=1, le=8)
    cpu_model: str = "xeon-8480"
    overhead_watts: float | None = Field(600.0, ge=0)
    """Declared draw no sensor sees (fans, NICs, switches, PSU loss); None: not declared."""
    bmc: Literal["ipmi", "redfish"] | None = None
    """A BMC that reads the whole node's power (`llmgw_node_power_watts{source=…}`)."""


class Rack(_Model):
    nodes: int = Field(ge=0, le=MAX_NODES)
    node_type: str | None = None
    pdus: tuple[Name, ...] | None = Field(None, min_length=1, max_length=4, strict=False)
    """The PDUs that feed each of its nodes; default `<rack>-a` and `<rack>-b`."""
    inlet_c: float | None = Field(None, ge=-20, le=80)


class Row(_Model):
    racks: Annotated[dict[Name, Rack], BeforeValidator(_text_keys)] = Field(min_length=1)
    inlet_c: float | None = Field(None, ge=-20, le=80)


class Room(_Model):
    rows: Annotated[dict[Name, Row], BeforeValidator(_text_keys)] = Field(min_length=1)
    inlet_c: float | None = Field(None, ge=-20, le=80)


# --- load -----------------------------------------------------------------------------------


class FromDecider(_Model):
    url: str | None = None
    """The decider's base URL; None: given at run time (`--decider URL`, or by the demo)."""
    replica_load: Load = 0.9
    """The load of each reserved GPU."""
    interval: Duration = 1.0
    """Real seconds between two reads of `GET /v1/reservations`."""

    @field_validator("url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is None:
            return None
        if not re.match(r"^https?://[^/\s]+", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
        return url.rstrip("/")


class LoadSettings(_Model):
    default: Load = 0.0
    nodes: Annotated[dict[Name, Load], BeforeValidator(_text_keys)] = {}
    from_decider: FromDecider | None = None

    @field_validator("from_decider", mode="before")
    @classmethod
    def _url_alone(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value


class PduTrace(_Model):
    """A PDU's recorded utilisation (a fraction of its rating), replayed onto its nodes."""

    pdu: Name
    file: FilePath
    rating_watts: float = Field(gt=0)
    column: str = "measured_power_util"
    interval: Duration = 300.0
    """Simulated seconds per row of the file (Google's PowerData 2019: 5-minute means)."""
    start: int = Field(0, ge=0)
    """The row the replay starts at; it loops at the end."""
    _values: tuple[float, ...] = PrivateAttr(default=())

    @field_validator("file")
    @classmethod
    def _relative_to_scenario(cls, file: Path) -> Path:
        base = _BASE_DIR.get()
        return file if file.is_absolute() or base is None else base / file

    @model_validator(mode="after")
    def _read(self) -> PduTrace:
        self._values = read_trace(self.file, self.column)
        if self.start >= len(self._values):
            raise ValueError(f"start {self.start} is past the trace's {len(self._values)} rows")
        return self

    @property
    def values(self) -> tuple[float, ...]:
        return self._values

    def utilisation(self, sim_seconds: float) -> float:
        """The trace's value `sim_seconds` into the replay, linear between rows, looping."""
        values = self._values
        position = self.start + max(sim_seconds, 0.0) / self.interval
        index = int(position)
        fraction = position - index
        first = values[index % len(values)]
        second = values[(index + 1) % len(values)]
        return first + (second - first) * fraction


def read_trace(path: Path, column: str) -> tuple[float, ...]:
    """The numbers of one column of a CSV file with a header line."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or column not in reader.fieldnames:
                columns = ", ".join(reader.fieldnames or [])
                raise ValueError(f"{path} has no column {column!r} (columns: {columns})")
            values = []
            for line, row in enumerate(reader, start=2):
                try:
                    value = float(row[column])
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"{path}:{line}: {row[column]!r} is not a number") from exc
                if not 0 <= value <= 2:
                    raise ValueError(f"{path}:{line}: {value:g} is not a utilisation (0-2)")
                values.append(value)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    if not values:
        raise ValueError(f"{path} has no rows")
    return tuple(values)


# --- the timeline ---------------------------------------------------------------------------


class Where(_Model):
    """Exactly one of node, rack, row, room: what an event acts on."""

    node: Name | None = None
    rack: Name | None = None
    row: Name | None = None
    room: Name | None = None

    @model_validator(mode="after")
    def _one(self) -> Where:
        given = [key for key in ("node", "rack", "row", "room") if getattr(self, key) is not None]
        if len(given) != 1:
            raise ValueError("name exactly one of node, rack, row, room")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("node", "rack", "row", "room") if getattr(self, k) is not None)

    @property
    def name(self) -> str:
        return str(getattr(self, self.kind))


class CoolingFailure(_Model):
    """A cooling unit serving a row fails: its inlet air rises, its alarm may go off."""

    row: Name
    rise_c: float = Field(gt=0, le=60)
    over: Offset = 0.0
    alarm_after: Offset | None = None
    """The unit's alarm (`crac_alarm`) goes off this long after the failure; None: never."""
    duration: Offset | None = Field(None, alias="for")
    """Repaired after this long: the air cools back over `over`; None: never."""


class InletChange(Where):
    delta_c: float = Field(ge=-40, le=60)
    over: Offset = 0.0
    duration: Offset | None = Field(None, alias="for")


class LoadChange(Where):
    load: Load
    duration: Offset | None = Field(None, alias="for")


class GpuThrottle(_Model):
    """A GPU holds its clocks down. Thermal reasons heat the card to past its slowdown
    temperature (a failed fan, a blocked heatsink) and the physics throttles it; the other
    reasons are forced on."""

    node: Name
    gpu: int | None = Field(None, ge=0)
    """The GPU's index; None: every GPU of the node."""
    reason: Literal["sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "power_brake"]
    duration: Offset | None = Field(None, alias="for")


class BmcSilent(_Model):
    node: Name
    duration: Offset | None = Field(None, alias="for")


class PduReadingLost(_Model):
    pdu: Name
    duration: Offset | None = Field(None, alias="for")


EVENT_KINDS = (
    "cooling_failure",
    "inlet_change",
    "load_change",
    "gpu_throttle",
    "bmc_silent",
    "pdu_reading_lost",
)


class Event(_Model):
    """`at` (scenario time from the timeline's start) and exactly one kind of event."""

    at: Offset
    cooling_failure: CoolingFailure | None = None
    inlet_change: InletChange | None = None
    load_change: LoadChange | None = None
    gpu_throttle: GpuThrottle | None = None
    bmc_silent: BmcSilent | None = None
    pdu_reading_lost: PduReadingLost | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Event:
        given = [kind for kind in EVENT_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"an event has `at` and exactly one of: {', '.join(EVENT_KINDS)}")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in EVENT_KINDS if getattr(self, kind) is not None)

    @property
    def body(self) -> Any:
        return getattr(self, self.kind)


# --- the scenario ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodePlace:
    """One node of the expanded layout."""

    name: str
    index: int  # 1-based within its rack
    site: str
    room: str
    row: str
    rack: str
    pdus: tuple[str, ...]
    node_type: NodeType
    gpu_model: GpuModel
    cpu_model: CpuModel
    inlet_c: float


_FORMAT_FIELDS = {"rack", "row", "room", "site", "index"}


class Scenario(_Model):
    site: Name = "site"
    time_scale: float = Field(1.0, gt=0, le=3600)
    tick: Duration = 1.0
    inlet_c: float = Field(24.0, ge=-20, le=80)
    node_name: str = "gpu-{rack}-{index:02d}"
    """How nodes are named: a format string over rack, row, room, site and index (from 1)."""
    gpu_models: Annotated[dict[Name, GpuModel], BeforeValidator(_text_keys)] = {}
    cpu_models: Annotated[dict[Name, CpuModel], BeforeValidator(_text_keys)] = {}
    node_types: Annotated[dict[Name, NodeType], BeforeValidator(_text_keys)] = {
        "default": NodeType()
    }
    rooms: Annotated[dict[Name, Room], BeforeValidator(_text_keys)] = Field(min_length=1)
    load: LoadSettings = LoadSettings()
    pdu_traces: tuple[PduTrace, ...] = Field((), strict=False)
    events: tuple[Event, ...] = Field((), strict=False)

    @field_validator("node_name")
    @classmethod
    def _format(cls, pattern: str) -> str:
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(pattern) if name}
        except ValueError as exc:
            raise ValueError(f"not a format string: {exc}") from exc
        unknown = fields - _FORMAT_FIELDS
        if unknown:
            raise ValueError(
                f"unknown field(s) {', '.join(sorted(unknown))}; "
                f"use {', '.join(sorted(_FORMAT_FIELDS))}"
            )
        if "index" not in fields:
            raise ValueError("the pattern needs {index}, or every node of a rack has one name")
        return pattern

    @model_validator(mode="after")
    def _references(self) -> Scenario:
        problems = list(_reference_problems(self))
        if problems:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("scenario", message),  # no context: not formatted
                        loc=loc,
                        input=None,
                    )
                    for loc, message in problems
                ],
            )
        return self

    def gpu_model(self, name: str) -> GpuModel | None:
        return self.gpu_models.get(name) or GPU_MODELS.get(name)

    def cpu_model(self, name: str) -> CpuModel | None:
        return self.cpu_models.get(name) or CPU_MODELS.get(name)

    @cached_property
    def nodes(self) -> tuple[NodePlace, ...]:
        """Every node, room by room, row by row, rack by rack, in file order."""
        return tuple(_expand(self))

    @cached_property
    def row_racks(self) -> dict[str, tuple[str, ...]]:
        return {
            row: tuple(racks)
            for room in self.rooms.values()
            for row, racks in ((name, r.racks) for name, r in room.rows.items())
        }

    @cached_property
    def pdus(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for node in self.nodes:
            seen.update(dict.fromkeys(node.pdus))
        return tuple(seen)


def _node_type_name(scenario: Scenario, rack: Rack) -> str | None:
    if rack.node_type is not None:
        return rack.node_type
    if len(scenario.node_types) == 1:
        return next(iter(scenario.node_types))
    return None


def _expand(scenario: Scenario) -> list[NodePlace]:
    nodes: list[NodePlace] = []
    for room_name, room in scenario.rooms.items():
        for row_name, row in room.rows.items():
            for rack_name, rack in row.racks.items():
                type_name = _node_type_name(scenario, rack)
                node_type = scenario.node_types.get(type_name or "")
                if node_type is None:
                    continue  # reported by _reference_problems
                gpu_model = scenario.gpu_model(node_type.gpu_model)
                cpu_model = scenario.cpu_model(node_type.cpu_model)
                if gpu_model is None or cpu_model is None:
                    continue
                inlet = next(
                    value
                    for value in (rack.inlet_c, row.inlet_c, room.inlet_c, scenario.inlet_c)
                    if value is not None
                )
                pdus = rack.pdus if rack.pdus is not None else (f"{rack_name}-a", f"{rack_name}-b")
                for index in range(1, rack.nodes + 1):
                    name = scenario.node_name.format(
                        rack=rack_name,
                        row=row_name,
                        room=room_name,
                        site=scenario.site,
                        index=index,
                    )
                    nodes.append(
                        NodePlace(
                            name=name,
                            index=index,
                            site=scenario.site,
                            room=room_name,
                            row=row_name,
                            rack=rack_name,
                            pdus=tuple(pdus),
                            node_type=node_type,
                            gpu_model=gpu_model,
                            cpu_model=cpu_model,
                            inlet_c=inlet,
                        )
                    )
    return nodes


Problem = tuple[tuple[str | int, ...], str]


def _reference_problems(scenario: Scenario) -> list[Problem]:
    problems: list[Problem] = []
    for name, node_type in scenario.node_types.items():
        if scenario.gpu_model(node_type.gpu_model) is None:
            known = sorted({*GPU_MODELS, *scenario.gpu_models})
            problems.append(
                (
                    ("node_types", name, "gpu_model"),
                    f"no GPU model {node_type.gpu_model!r} (known: {', '.join(known)})",
                )
            )
        if scenario.cpu_model(node_type.cpu_model) is None:
            known = sorted({*CPU_MODELS, *scenario.cpu_models})
            problems.append(
                (
                    ("node_types", name, "cpu_model"),
                    f"no CPU model {node_type.cpu_model!r} (known: {', '.join(known)})",
                )
            )
    rows: dict[str, str] = {}
    racks: dict[str, str] = {}
    for room_name, room in scenario.rooms.items():
        for row_name, row in room.rows.items():
            where: tuple[str | int, ...] = ("rooms", room_name, "rows", row_name)
            if row_name in rows:
                problems.append(
                    (
                        where,
                        f"row {row_name!r} is also in room {rows[row_name]!r}: rows are named "
                        "once per site (qualify them, e.g. hall-b.12)",
                    )
                )
            rows[row_name] = room_name
            for rack_name, rack in row.racks.items():
                at = (*where, "racks", rack_name)
                if rack_name in racks:
                    problems.append((at, f"rack {rack_name!r} is also in row {racks[rack_name]!r}"))
                racks[rack_name] = row_name
                type_name = _node_type_name(scenario, rack)
                if type_name is None:
                    problems.append(
                        (
                            (*at, "node_type"),
                            "several node types are defined: say which one this rack holds",
                        )
                    )
                elif type_name not in scenario.node_types:
                    problems.append(
                        (
                            (*at, "node_type"),
                            f"no node type {type_name!r} (defined: "
                            f"{', '.join(scenario.node_types) or 'none'})",
                        )
                    )
    if problems:
        return problems  # names below would only repeat these
    nodes = scenario.nodes
    if not nodes:
        problems.append((("rooms",), "the site has no nodes"))
    if len(nodes) > MAX_NODES:
        problems.append((("rooms",), f"{len(nodes)} nodes: at most {MAX_NODES}"))
    node_names: dict[str, NodePlace] = {}
    for node in nodes:
        if not _NAME.match(node.name):
            problems.append((("node_name",), f"gives {node.name!r}, which is not a name"))
            return problems
        if node.name in node_names:
            problems.append(
                (
                    ("node_name",),
                    f"gives {node.name!r} twice (racks {node_names[node.name].rack} "
                    f"and {node.rack}): put {{rack}} in it",
                )
            )
            return problems
        node_names[node.name] = node
    for name in scenario.load.nodes:
        if name not in node_names:
            problems.append((("load", "nodes", name), f"no node {name!r} in the site"))
    pdus = set(scenario.pdus)
    for index, trace in enumerate(scenario.pdu_traces):
        if trace.pdu not in pdus:
            problems.append((("pdu_traces", index, "pdu"), f"no PDU {trace.pdu!r} feeds a node"))
    traced = [trace.pdu for trace in scenario.pdu_traces]
    for index, pdu in enumerate(traced):
        if traced.index(pdu) != index:
            problems.append((("pdu_traces", index, "pdu"), f"PDU {pdu!r} has two traces"))
    names = {
        "node": set(node_names),
        "rack": set(racks),
        "row": set(rows),
        "room": set(scenario.rooms),
        "pdu": pdus,
    }
    for index, event in enumerate(scenario.events):
        body = event.body
        at: tuple[str | int, ...] = ("events", index, event.kind)
        if isinstance(body, Where):
            if body.name not in names[body.kind]:
                problems.append(((*at, body.kind), f"no {body.kind} {body.name!r} in the site"))
            continue
        for kind in ("node", "row", "pdu"):
            value = getattr(body, kind, None)
            if value is not None and value not in names[kind]:
                problems.append(((*at, kind), f"no {kind} {value!r} in the site"))
        if isinstance(body, GpuThrottle) and body.gpu is not None and body.node in node_names:
            gpus = node_names[body.node].node_type.gpus
            if body.gpu >= gpus:
                problems.append(((*at, "gpu"), f"node {body.node} has {gpus} GPUs (0-{gpus - 1})"))
        if (
            isinstance(body, BmcSilent)
            and body.node in node_names
            and node_names[body.node].node_type.bmc is None
        ):
            problems.append(((*at, "node"), f"node {body.node} has no BMC (its node type's bmc)"))
    return problems


def load(path: Path) -> Scenario:
    """Read and validate a scenario file; raise llmgw_common.yamlfile.ConfigError listing every
    problem with its line."""
    token = _BASE_DIR.set(path.resolve().parent)
    try:
        return load_model(path, Scenario)
    finally:
        _BASE_DIR.reset(token)


def validate(data: dict[str, Any], base_dir: Path | None = None) -> Scenario:
    """A scenario from plain data (tests, generated sites); trace paths relative to
    `base_dir`."""
    token = _BASE_DIR.set(base_dir)
    try:
        return Scenario.model_validate(data)
    finally:
        _BASE_DIR.reset(token)
