"""Node power over IPMI, and the BMC's inlet sensor, through an IPMI tool.

In-band (no `host`): runs the first of FreeIPMI `ipmi-dcmi
--get-system-power-statistics`, `ipmitool dcmi power reading` or `ipmiutil
dcmi power` found on PATH (or the configured `tool`) through the kernel's IPMI
device, and parses its report. The inlet temperature comes from the sensor
repository (SDR) through the same tool family: FreeIPMI `ipmi-sensors`,
`ipmitool sdr type Temperature`, or `ipmiutil sensor -g temp`.

Out-of-band (`host` set): the same reads over the LAN (IPMI 2.0, RMCP+,
`lanplus`) from the BMC at `host:port`, as `user` with the password in
`password_file`, through ipmitool or FreeIPMI (ipmiutil is not used: it takes
its password on the command line). The password never appears in an argv:
ipmitool reads the file itself (`-f`), FreeIPMI gets it on its standard input
(`--password-prompt`, which reads stdin when there is no terminal, and the
tool runs in a session of its own, without one). The file is checked at each
poll (so a rotated password needs no restart); its content is never logged.

`power_sensor` names an SDR sensor in Watts to read instead of DCMI, for a BMC
that does not answer DCMI `Get Power Reading` (OpenIPMI's `ipmi_sim` among
them): one SDR listing then gives the power and the inlet.

Emits:

    llmgw_node_power_watts{source="ipmi"} 332
    llmgw_node_inlet_temperature_celsius{chip="ipmi",sensor="Inlet Temp"} 23

The inlet series is served only while the `hwmon` source has no inlet sensor
(`defer`). Whether the reading includes the GPUs is agent.yaml's
`bmc_includes_gpus` (published by the collector as
`llmgw_node_power_includes_gpus{source="ipmi"}`).

Missing data:
- in-band: no IPMI tool on PATH, or (with `tool` unset) no in-band IPMI
  device (`<sysfs>/class/ipmi/ipmi*`, made by `ipmi_devintf`) → `NoData`;
  out-of-band: no ipmitool or FreeIPMI on PATH → the source is down;
- the BMC says power measurement is not active ("Not Available",
  "deactivated"), or the `power_sensor` has no reading now → the power series
  is absent, quietly (`NoData` when there is no inlet reading either); a
  reading of 0 W or above 50 kW → absent;
- the tool fails (non-zero exit: the BMC refused the login, for one;
  unparsable report), hangs past `timeout` (its whole process group is
  killed: a BMC that does not answer), the password file cannot be read, or
  the `power_sensor` is not in the SDR → the source is down; the last reading
  is served until `stale_after`, then absent;
- the power reading the same for `frozen_after` (the BMC no longer updates
  it) → the source is down at once and serves nothing, not even the last
  reading, until the reading moves again;
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
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

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
from llmgw_common.yamlfile import Duration, FilePath

Format = Literal["freeipmi", "ipmitool", "ipmiutil"]
Privilege = Literal["user", "operator", "admin"]

#: Searched on PATH in this order when `tool` is not set.
TOOLS: dict[str, Format] = {"ipmi-dcmi": "freeipmi", "ipmitool": "ipmitool", "ipmiutil": "ipmiutil"}
#: The formats that read a BMC over the LAN without its password in their argv.
LAN_FORMATS: tuple[Format, ...] = ("freeipmi", "ipmitool")
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
#: Every full sensor of the SDR, for `power_sensor` (Watts) and the inlet (°C) in one run.
SDR_ALL_ARGS: dict[Format, list[str]] = {
    "freeipmi": ["--comma-separated-output", "--no-header-output"],
    "ipmitool": ["sdr", "elist", "full"],
}
#: ipmitool `-L` and FreeIPMI `--privilege-level` spell the levels differently.
IPMITOOL_PRIVILEGE: dict[Privilege, str] = {
    "user": "USER",
    "operator": "OPERATOR",
    "admin": "ADMINISTRATOR",
}
#: IPMI 2.0 passwords are at most 20 bytes (ipmitool's `-f` reads no more).
MAX_PASSWORD_BYTES = 20
#: What FreeIPMI writes to stderr before it reads the password (`--password-prompt`).
_PASSWORD_PROMPT = "Password: "
#: A host name, an IPv4 address or an IPv6 one: no scheme, no port, no credentials,
#: and no leading dash (an argv word a tool could take for an option).
_HOST = re.compile(r"[A-Za-z0-9_.:%-]+")
_WORKAROUND = re.compile(r"[a-z0-9]+")

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
#: ipmitool's SDR reading column: "23 degrees C", "332 Watts".
_IPMITOOL_READING = re.compile(
    r"(?P<value>-?\d+(?:\.\d+)?)\s*(?P<unit>degrees C|Watts)", re.IGNORECASE
)
#: FreeIPMI's and ipmitool's unit words, as the units `SdrReading` keeps.
_UNITS = {"c": "C", "degrees c": "C", "w": "W", "watts": "W"}


class IpmiToolError(RuntimeError):
    """The IPMI tool could not be run, failed, hung or said something unreadable."""


class PowerNotActive(Exception):
    """The BMC says its power measurement is off: no reading, and no failure."""


class FrozenReading(RuntimeError):
    """The BMC's power reading has not moved for `frozen_after`: it no longer updates it."""


@dataclass(frozen=True, slots=True)
class SdrReading:
    """One sensor of an SDR listing; `value` None: listed, without a reading now."""

    name: str
    value: float | None
    unit: str | None  # "C", "W", or None: another unit, or none shown


class IpmiConfig(BmcConfig):
    #: `ipmi-dcmi`, `ipmitool`, `ipmiutil`, or a path to one; unset: the first on PATH.
    tool: str | None = None
    #: The tool's output format; unset: from the tool's file name.
    format: Format | None = None
    #: The SDR name of the inlet sensor; unset: the first named Inlet, Ambient or Intake.
    inlet_sensor: str | None = None
    #: The SDR name of a sensor in Watts that is the node's power, read instead of DCMI.
    power_sensor: str | None = None
    #: A power reading unchanged for this long is frozen (the BMC no longer updates
    #: it): the source reads down and serves none. null: never judged frozen.
    frozen_after: Duration | None = 600.0
    #: The BMC's address, read out-of-band over the LAN; unset: in-band.
    host: str | None = None
    port: int = Field(623, ge=1, le=65535)
    user: str | None = None
    #: The password alone, on the file's first line; read by the tool at each poll.
    password_file: FilePath | None = None
    #: IPMI 2.0 (RMCP+) only: IPMI 1.5's `lan` guards the password with MD5 at best.
    interface: Literal["lanplus"] = "lanplus"
    #: The session's privilege: a read-only `user` account is enough.
    privilege: Privilege = "user"
    #: The RMCP+ cipher suite (ipmitool `-C`, FreeIPMI `-I`); unset: the tool's choice.
    cipher_suite: int | None = Field(None, ge=1, le=17)
    #: FreeIPMI `--workaround-flags` for a BMC's known deviations (`opensesspriv`, …).
    workarounds: list[str] = Field(default_factory=list)

    @field_validator("host")
    @classmethod
    def _host_is_an_address(cls, host: str | None) -> str | None:
        if host is not None and (not _HOST.fullmatch(host) or host.startswith("-")):
            raise ValueError(
                f"{host!r} is not a host name or an IP address (no scheme, port or user:"
                " the port is `port`, the user `user`)"
            )
        return host

    @field_validator("user")
    @classmethod
    def _user_is_a_name(cls, user: str | None) -> str | None:
        if user is not None and (not user or user.startswith("-") or len(user.encode()) > 16):
            raise ValueError(f"{user!r} is not an IPMI user name (1 to 16 bytes, no leading -)")
        return user

    @field_validator("workarounds")
    @classmethod
    def _workarounds_are_words(cls, workarounds: list[str]) -> list[str]:
        for flag in workarounds:
            if not _WORKAROUND.fullmatch(flag):
                raise ValueError(
                    f"{flag!r} is not a FreeIPMI workaround flag (lowercase, no spaces)"
                )
        return workarounds

    @model_validator(mode="after")
    def _format_is_known(self) -> IpmiConfig:
        if self.tool is not None and self.format is None and _format_of(self.tool) is None:
            raise ValueError(
                f"cannot tell the output format of {self.tool!r} from its name:"
                " set format to freeipmi, ipmitool or ipmiutil"
            )
        return self

    @model_validator(mode="after")
    def _out_of_band_is_whole(self) -> IpmiConfig:
        lan_keys = {"user": self.user, "password_file": self.password_file}
        if self.host is None:
            given = [key for key, value in lan_keys.items() if value is not None]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} without host: set host to read a BMC over the LAN"
                )
            return self
        missing = [key for key, value in lan_keys.items() if value is None]
        if missing:
            raise ValueError(f"host {self.host} needs {' and '.join(missing)}")
        fmt = self.format or (_format_of(self.tool) if self.tool else None)
        if fmt is not None and fmt not in LAN_FORMATS:
            raise ValueError(
                f"{fmt} cannot read a BMC over the LAN here (it takes the password in its"
                " argv): use ipmitool or FreeIPMI"
            )
        return self

    @model_validator(mode="after")
    def _power_sensor_format(self) -> IpmiConfig:
        fmt = self.format or (_format_of(self.tool) if self.tool else None)
        if self.power_sensor is not None and fmt == "ipmiutil":
            raise ValueError("power_sensor is read through ipmitool or FreeIPMI, not ipmiutil")
        return self

    @model_validator(mode="after")
    def _frozen_after_spans_polls(self) -> IpmiConfig:
        interval = self.effective_interval
        if self.frozen_after is not None and self.frozen_after < 2 * interval:
            raise ValueError(
                f"frozen_after {self.frozen_after:g}s is shorter than two intervals"
                f" ({2 * interval:g}s): a reading must be seen unchanged over two polls"
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


def parse_sdr(report: str, fmt: Format) -> list[SdrReading]:
    """Each sensor of an SDR listing: its name, its reading if it has one, and its unit.

    ipmiutil's listing gives temperatures only (the lines `_IPMIUTIL_FULL` reads).
    """
    readings = []
    for line in report.splitlines():
        if fmt == "freeipmi":  # ID,Name,Type,Reading,Units,Event
            fields = [field.strip() for field in line.split(",")]
            if len(fields) < 5:
                continue
            name, text, unit = fields[1], fields[3], _UNITS.get(fields[4].lower())
            try:
                value: float | None = float(text)
            except ValueError:  # N/A: listed, no reading now
                value = None
            readings.append(SdrReading(name, value, unit))
        elif (
            fmt == "ipmiutil"
        ):  # 000b SDR Full 01 01 20 a 01 snum 30 Name = 2e OK   46.00 degrees C
            match = _IPMIUTIL_FULL.fullmatch(line)
            if match and match["type"] == "01":
                # "Init": the sensor has no reading yet (its value is a placeholder).
                no_reading = match["status"].lower() == "init"
                readings.append(
                    SdrReading(match["name"], None if no_reading else float(match["value"]), "C")
                )
        else:  # Name | 04h | ok | 7.1 | 23 degrees C   (or `No Reading`, `Disabled`)
            fields = [field.strip() for field in line.split("|")]
            if len(fields) < 5:
                continue
            match = _IPMITOOL_READING.fullmatch(fields[4])
            if match is None:
                readings.append(SdrReading(fields[0], None, None))
            else:
                readings.append(
                    SdrReading(fields[0], float(match["value"]), _UNITS[match["unit"].lower()])
                )
    return readings


def parse_sdr_temperatures(report: str, fmt: Format) -> list[tuple[str, float]]:
    """(sensor name, °C) of each temperature sensor with a reading."""
    return [
        (reading.name, reading.value)
        for reading in parse_sdr(report, fmt)
        if reading.unit == "C" and reading.value is not None
    ]


def read_password(path: Path) -> str:
    """The password on the file's first line; errors name the file, never its content."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise IpmiToolError(f"cannot read the password file {path}: {reason}") from None
    lines = text.splitlines()
    if not lines or not lines[0]:
        raise IpmiToolError(
            f"the password file {path} is empty: the password goes on its first line"
        )
    if len(lines[0].encode()) > MAX_PASSWORD_BYTES:
        raise IpmiToolError(
            f"the password in {path} is longer than IPMI's {MAX_PASSWORD_BYTES} bytes"
        )
    return lines[0]


def run_tool(argv: list[str], timeout: float, stdin: str | None = None) -> str:
    """The tool's stdout; a tool that hangs is killed with its whole process group.

    `stdin`, when given, is written to the tool's standard input (a password the
    tool prompts for: never in its argv).
    """
    name = os.path.basename(argv[0])
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            # Its own process group, so a kill takes its children too; and no
            # controlling terminal, so a password prompt reads the stdin given here.
            start_new_session=True,
            env={**os.environ, "LC_ALL": "C"},
        )
    except OSError as exc:
        raise IpmiToolError(f"cannot run {argv[0]}: {exc.strerror}") from exc
    try:
        stdout, stderr = process.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.communicate(timeout=5)
        raise IpmiToolError(f"{name} did not answer within {timeout:g}s and was killed") from None
    if process.returncode != 0:
        last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
        last = last.removeprefix(_PASSWORD_PROMPT)
        raise IpmiToolError(
            f"{name} exited with status {process.returncode}" + (f": {last}" if last else "")
        )
    return stdout


class IpmiSource(BmcSource):
    name: ClassVar[str] = "ipmi"
    Config: ClassVar[type[SourceConfig]] = IpmiConfig
    config: IpmiConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config, clock)
        self._clock = clock
        #: The power reading last seen and when it was first seen so (frozen_after).
        self._watts: float | None = None
        self._watts_since = 0.0
        #: FreeIPMI's SDR cache for an out-of-band BMC: a directory of this source's
        #: own (made at the first SDR read, removed at close), never the service
        #: user's home.
        self._sdr_cache: str | None = None

    def _tool(self) -> tuple[str, Format]:
        configured = self.config.tool
        if configured is not None:
            path = configured if "/" in configured else shutil.which(configured)
            if path is None or not os.access(path, os.X_OK):
                raise IpmiToolError(f"the configured IPMI tool {configured!r} is not executable")
            fmt = self.config.format or _format_of(configured)
            assert fmt is not None  # the config refuses a tool whose format is unknown
            return path, fmt
        if self.config.host is not None:
            for tool, fmt in TOOLS.items():
                if fmt in LAN_FORMATS and (path := shutil.which(tool)) is not None:
                    return path, self.config.format or fmt
            raise IpmiToolError(
                f"no IPMI tool on PATH to read the BMC at {self.config.host}"
                " (ipmi-dcmi from FreeIPMI, or ipmitool)"
            )
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

    def _run(self, path: str, fmt: Format, args: list[str], sdr: bool = False) -> str:
        """`path ARGS`, in-band, or with the options that reach `host` over the LAN.

        `sdr`: the run reads the SDR (FreeIPMI then keeps its SDR cache in the
        source's own directory).
        """
        config = self.config
        if config.host is None:
            return run_tool([path, *args], config.timeout)
        assert config.user is not None and config.password_file is not None  # the config says
        password = read_password(config.password_file)  # checked at each poll: rotation works
        if fmt == "ipmitool":
            lan = ["-I", config.interface, "-H", config.host, "-p", str(config.port)]
            lan += ["-U", config.user, "-f", str(config.password_file)]
            lan += ["-L", IPMITOOL_PRIVILEGE[config.privilege]]
            if config.cipher_suite is not None:
                lan += ["-C", str(config.cipher_suite)]
            return run_tool([path, *lan, *args], config.timeout)
        # FreeIPMI: `host:port` unless the port is IPMI's own; an IPv6 address in brackets.
        host = f"[{config.host}]" if ":" in config.host else config.host
        target = config.host if config.port == 623 else f"{host}:{config.port}"
        lan = [
            "--driver-type=LAN_2_0",
            f"--hostname={target}",
            f"--username={config.user}",
            "--password-prompt",
            f"--privilege-level={config.privilege}",
        ]
        if config.cipher_suite is not None:
            lan.append(f"--cipher-suite-id={config.cipher_suite}")
        if config.workarounds:
            lan.append(f"--workaround-flags={','.join(config.workarounds)}")
        if sdr:
            if self._sdr_cache is None:
                self._sdr_cache = tempfile.mkdtemp(prefix="llmgw-ipmi-sdr-")
            lan += [
                f"--sdr-cache-directory={self._sdr_cache}",
                "--sdr-cache-recreate",
                "--quiet-cache",
            ]
        return run_tool([path, *lan, *args], config.timeout, stdin=password + "\n")

    def _sdr_tool(self, power_tool: str, fmt: Format) -> str | None:
        """The family's SDR tool: the power tool itself, or FreeIPMI's beside it."""
        tool = SDR_TOOLS[fmt][0]
        if tool is None:
            return power_tool
        beside = os.path.join(os.path.dirname(power_tool), tool)
        return beside if os.access(beside, os.X_OK) else shutil.which(tool)

    def _read(self) -> list[Sample]:
        path, fmt = self._tool()
        if self.config.power_sensor is not None:
            return self._read_sensors(path, fmt, self.config.power_sensor)
        samples: list[Sample] = []
        not_active: PowerNotActive | None = None
        try:
            report = self._run(path, fmt, POWER_ARGS[fmt])
            watts = self._not_frozen(node_power(parse_power(report)))
        except PowerNotActive as exc:
            not_active, watts = exc, None
            self._watts = None
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

    def _read_sensors(self, path: str, fmt: Format, power_sensor: str) -> list[Sample]:
        """The power from the named SDR sensor in Watts, and the inlet, in one SDR run."""
        if fmt not in SDR_ALL_ARGS:
            raise IpmiToolError(f"power_sensor is read through ipmitool or FreeIPMI, not {fmt}")
        tool = self._sdr_tool(path, fmt)
        if tool is None:
            raise IpmiToolError(f"no {SDR_TOOLS[fmt][0]} beside {path} or on PATH")
        readings = parse_sdr(self._run(tool, fmt, SDR_ALL_ARGS[fmt], sdr=True), fmt)
        sensor = next((r for r in readings if r.name.lower() == power_sensor.lower()), None)
        if sensor is None:
            raise IpmiToolError(f"the BMC's SDR has no sensor named {power_sensor!r}")
        if sensor.value is not None and sensor.unit != "W":
            raise IpmiToolError(f"the sensor {sensor.name!r} does not read in Watts")
        samples: list[Sample] = []
        if sensor.value is None:  # no reading now (the host is off, the sensor disabled)
            self._watts, absent = None, f"the sensor {sensor.name!r} has no reading now"
        elif (watts := self._not_frozen(node_power(sensor.value))) is None:
            absent = f"the sensor {sensor.name!r} reads {sensor.value:g} W, not a node's power"
        else:
            samples.append(Sample(NODE_POWER_METRIC, watts, {"source": self.name}))
        if self.config.inlet:
            samples += self._inlet_of(readings)
        if not samples:
            raise NoData(absent)
        return samples

    def _not_frozen(self, watts: float | None) -> float | None:
        """The reading, unless it has stayed the same for `frozen_after` (then: raises)."""
        now = self._clock()
        if watts is None or watts != self._watts:
            self._watts, self._watts_since = watts, now
            return watts
        limit = self.config.frozen_after
        if limit is not None and now - self._watts_since >= limit:
            # The last reading is this same frozen value: none of it is served.
            self._last.clear()
            raise FrozenReading(
                f"the power reading has stayed at {watts:g} W for {limit:g}s (frozen_after):"
                " the BMC no longer updates it"
            )
        return watts

    def _inlet(self, power_tool: str, fmt: Format) -> list[Sample]:
        path = self._sdr_tool(power_tool, fmt)
        if path is None:
            return []
        report = self._run(path, fmt, SDR_TOOLS[fmt][1], sdr=True)
        return self._inlet_of(parse_sdr(report, fmt))

    def _inlet_of(self, readings: list[SdrReading]) -> list[Sample]:
        wanted = self.config.inlet_sensor
        for reading in readings:
            if reading.unit != "C" or reading.value is None:
                continue
            matches = (
                reading.name.lower() == wanted.lower() if wanted else is_inlet_name(reading.name)
            )
            if matches:
                value = inlet(reading.value)
                if value is None:
                    return []
                return [Sample(INLET_METRIC, value, {"chip": self.name, "sensor": reading.name})]
        return []

    def close(self) -> None:
        if self._sdr_cache is not None:
            shutil.rmtree(self._sdr_cache, ignore_errors=True)
            self._sdr_cache = None
