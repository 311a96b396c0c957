"""Node power over IPMI DCMI, and the BMC's inlet sensor, through an IPMI tool.

Runs the first of FreeIPMI `ipmi-dcmi --get-system-power-statistics`,
`ipmitool dcmi power reading` or `ipmiutil dcmi power` found on PATH (or the
configured `tool`), in-band through the kernel's IPMI device, and parses its
report. The inlet temperature comes from the sensor repository (SDR) through
the same tool family: FreeIPMI `ipmi-sensors`, `ipmitool sdr type
Temperature`, or `ipmiutil sensor -g temp`.

Emits:

    llmgw_node_power_watts{source="ipmi"} 332
    llmgw_node_inlet_temperature_celsius{chip="ipmi",sensor="Inlet Temp"} 23

The inlet series is served only while the `hwmon` source has no inlet sensor
(`defer`). Whether the reading includes the GPUs is agent.yaml's
`bmc_includes_gpus` (published by the collector as
`llmgw_node_power_includes_gpus{source="ipmi"}`).

Missing data:
- no IPMI tool on PATH, or (with `tool` unset) no in-band IPMI device
  (`<sysfs>/class/ipmi/ipmi*`, made by `ipmi_devintf`) → `NoData`;
- the BMC says power measurement is not active ("Not Available",
  "deactivated") → the power series is absent, quietly (`NoData` when there is
  no inlet reading either); a reading of 0 W or above 50 kW → absent;
- the tool fails (non-zero exit, unparsable report) or hangs past `timeout`
  (its whole process group is killed) → the source is down; the last reading is
  served until `stale_after`, then absent;
- the inlet sensor absent, without a reading, or outside −20…80 °C → no inlet
  series; the SDR tool failing → the power is served and the source reads down.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from typing import ClassVar, Literal

from pydantic import model_validator

from exporter.samples import NoData, PartialReading, Sample
from exporter.sources.base import SourceConfig
from exporter.sources.bmc import (
    INLET_METRIC,
    NODE_POWER_METRIC,
    BmcConfig,
    BmcSource,
    inlet,
    is_inlet_name,
    node_power,
)

Format = Literal["freeipmi", "ipmitool", "ipmiutil"]

#: Searched on PATH in this order when `tool` is not set.
TOOLS: dict[str, Format] = {"ipmi-dcmi": "freeipmi", "ipmitool": "ipmitool", "ipmiutil": "ipmiutil"}
POWER_ARGS: dict[Format, list[str]] = {
    "freeipmi": ["--get-system-power-statistics"],
    "ipmitool": ["dcmi", "power", "reading"],
    "ipmiutil": ["dcmi", "power"],
}
#: The SDR tool of each family and its arguments.
SDR_TOOLS: dict[Format, tuple[str | None, list[str]]] = {
    "freeipmi": (
        "ipmi-sensors",
        ["--sensor-types=Temperature", "--comma-separated-output", "--no-header-output"],
    ),
    "ipmitool": (None, ["sdr", "type", "Temperature"]),  # None: the power tool itself
    "ipmiutil": (None, ["sensor", "-g", "temp"]),
}
#: An `ipmiutil sensor` line of a Full SDR (its isensor.c: "%04x SDR Full %02x %02x %02x
#: %c %02x snum %02x %s = %02x %s %.2f %s"): sensor type 01 is Temperature.
_IPMIUTIL_FULL = re.compile(
    r"[0-9a-f]{4} SDR Full (?:[0-9a-f]{2} ){3}[am] (?P<type>[0-9a-f]{2}) snum [0-9a-f]{2}"
    r" (?P<name>.*?)\s*= [0-9a-f]{2} (?P<status>\S+)\s+(?P<value>-?\d+(?:\.\d+)?) degrees C\s*",
    re.IGNORECASE,
)

_CURRENT_KEYS = ("current power", "instantaneous power reading")
_STATE_KEYS = ("power measurement", "power reading state is")
_ACTIVE = ("active", "activated")
_WATTS = re.compile(r"(\d+(?:\.\d+)?)\s*watts?\b", re.IGNORECASE)
_DEGREES = re.compile(r"(-?\d+(?:\.\d+)?)\s*degrees\s*C", re.IGNORECASE)


class IpmiToolError(RuntimeError):
    """The IPMI tool could not be run, failed, hung or said something unreadable."""


class PowerNotActive(Exception):
    """The BMC says its power measurement is off: no reading, and no failure."""


class IpmiConfig(BmcConfig):
    #: `ipmi-dcmi`, `ipmitool`, `ipmiutil`, or a path to one; unset: the first on PATH.
    tool: str | None = None
    #: The tool's output format; unset: from the tool's file name.
    format: Format | None = None
    #: The SDR name of the inlet sensor; unset: the first named Inlet, Ambient or Intake.
    inlet_sensor: str | None = None

    @model_validator(mode="after")
    def _format_is_known(self) -> IpmiConfig:
        if self.tool is not None and self.format is None and _format_of(self.tool) is None:
            raise ValueError(
                f"cannot tell the output format of {self.tool!r} from its name:"
                " set format to freeipmi, ipmitool or ipmiutil"
            )
        return self


def _format_of(tool: str) -> Format | None:
    return TOOLS.get(os.path.basename(tool))


def parse_power(report: str) -> float | None:
    """Watts from any of the three DCMI power reports; None when the BMC does not measure.

    Raises `PowerNotActive` when the report says measurement is off, and
    `IpmiToolError` when it has no current reading at all.
    """
    current: str | None = None
    state: str | None = None
    for line in report.splitlines():
        key, colon, value = line.partition(":")
        if not colon:
            continue
        key, value = key.strip().lower(), value.strip()
        if key in _CURRENT_KEYS and current is None:
            current = value
        elif key in _STATE_KEYS and state is None:
            state = value
    if state is not None and state.lower() not in _ACTIVE:
        raise PowerNotActive(f"the BMC's power measurement is not active ({state!r})")
    if current is None:
        raise IpmiToolError("no current power reading in the DCMI report")
    match = _WATTS.fullmatch(current)
    if match is None:
        raise IpmiToolError(f"unreadable current power in the DCMI report: {current!r}")
    return float(match[1])


def parse_sdr_temperatures(report: str, fmt: Format) -> list[tuple[str, float]]:
    """(sensor name, °C) of each temperature sensor with a reading."""
    readings = []
    for line in report.splitlines():
        if fmt == "freeipmi":  # ID,Name,Type,Reading,Units,Event
            fields = [field.strip() for field in line.split(",")]
            if len(fields) < 5 or fields[4] != "C":
                continue
            name, text = fields[1], fields[3]
            with contextlib.suppress(ValueError):
                readings.append((name, float(text)))
        elif (
            fmt == "ipmiutil"
        ):  # 000b SDR Full 01 01 20 a 01 snum 30 Name = 2e OK   46.00 degrees C
            match = _IPMIUTIL_FULL.fullmatch(line)
            # "Init": the sensor has no reading yet (its value is a placeholder).
            if match and match["type"] == "01" and match["status"].lower() != "init":
                readings.append((match["name"], float(match["value"])))
        else:  # Name | 04h | ok | 7.1 | 23 degrees C
            fields = [field.strip() for field in line.split("|")]
            if len(fields) < 5 or (match := _DEGREES.fullmatch(fields[4])) is None:
                continue
            readings.append((fields[0], float(match[1])))
    return readings


def run_tool(argv: list[str], timeout: float) -> str:
    """The tool's stdout; a tool that hangs is killed with its whole process group."""
    name = os.path.basename(argv[0])
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group, so a kill takes its children too
            env={**os.environ, "LC_ALL": "C"},
        )
    except OSError as exc:
        raise IpmiToolError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=5)
        raise IpmiToolError(f"{name} did not answer within {timeout:g}s and was killed") from None
    if process.returncode != 0:
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        raise IpmiToolError(
            f"{name} exited with status {process.returncode}" + (f": {last}" if last else "")
        )
    return stdout


class IpmiSource(BmcSource):
    name: ClassVar[str] = "ipmi"
    Config: ClassVar[type[SourceConfig]] = IpmiConfig
    config: IpmiConfig

    def _tool(self) -> tuple[str, Format]:
        configured = self.config.tool
        if configured is not None:
            path = configured if "/" in configured else shutil.which(configured)
            if path is None or not os.access(path, os.X_OK):
                raise IpmiToolError(f"the configured IPMI tool {configured!r} is not executable")
            fmt = self.config.format or _format_of(configured)
            assert fmt is not None  # the config refuses a tool whose format is unknown
            return path, fmt
        devices = self.sysfs / "class" / "ipmi"
        try:
            has_device = any(entry.startswith("ipmi") for entry in os.listdir(devices))
        except OSError:
            has_device = False
        if not has_device:
            raise NoData(f"no in-band IPMI device under {devices} (ipmi_si, ipmi_devintf)")
        for tool, fmt in TOOLS.items():
            if (path := shutil.which(tool)) is not None:
                return path, self.config.format or fmt
        raise NoData(f"no IPMI tool on PATH ({', '.join(TOOLS)})")

    def _read(self) -> list[Sample]:
        path, fmt = self._tool()
        samples: list[Sample] = []
        not_active: PowerNotActive | None = None
        try:
            watts = node_power(parse_power(run_tool([path, *POWER_ARGS[fmt]], self.config.timeout)))
        except PowerNotActive as exc:
            not_active, watts = exc, None
        if watts is not None:
            samples.append(Sample(NODE_POWER_METRIC, watts, {"source": self.name}))
        if self.config.inlet and fmt in SDR_TOOLS:
            try:
                samples += self._inlet(path, fmt)
            except IpmiToolError as exc:
                if samples:
                    raise PartialReading(samples, f"inlet sensor: {exc}") from exc
                if not_active is None:
                    raise
        if not samples and not_active is not None:
            raise NoData(str(not_active))
        return samples

    def _inlet(self, power_tool: str, fmt: Format) -> list[Sample]:
        tool, args = SDR_TOOLS[fmt]
        if tool is None:
            path: str | None = power_tool
        else:
            beside = os.path.join(os.path.dirname(power_tool), tool)
            path = beside if os.access(beside, os.X_OK) else shutil.which(tool)
        if path is None:
            return []
        wanted = self.config.inlet_sensor
        report = run_tool([path, *args], self.config.timeout)
        for name, celsius in parse_sdr_temperatures(report, fmt):
            matches = name.lower() == wanted.lower() if wanted else is_inlet_name(name)
            if matches:
                value = inlet(celsius)
                if value is None:
                    return []
                return [Sample(INLET_METRIC, value, {"chip": self.name, "sensor": name})]
        return []
