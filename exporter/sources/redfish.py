"""Node power, and the inlet sensor, from the BMC's Redfish service (HTTPS, `requests`).

The chassis read is `chassis` (its `Id`) or, unset, the first member of the
Chassis collection that links `EnvironmentMetrics`, `PowerSubsystem` or `Power`.
Its power is the first of these whose reading is a node's (not null, 0 W or
above 50 kW; newest resources first, the chassis' own total before figures the
exporter would have to add up):

1. `EnvironmentMetrics` → `PowerWatts.Reading` (Redfish 2020.4 and later: the
   chassis' power, one request);
2. `Sensors` → the chassis' total power sensor: `ReadingType` `Power`,
   `PhysicalContext` `Chassis`, `ElectricalContext` `Total` or unset (DMTF's
   mockups call it `TotalPower`) → `Reading`;
3. `PowerSubsystem` → `PowerSupplies` → each present supply's `Metrics` →
   `InputPowerWatts.Reading`, summed (used only when every present supply
   answers);
4. the legacy `Power` resource → the first `PowerControl` entry with a
   `PowerConsumedWatts` (the first is the system's on every BMC we know; later
   entries are often sub-systems, CPU or memory, and are never added).

Its inlet is the first of these whose reading is within −20…80 °C:

1. `ThermalSubsystem` → `ThermalMetrics` → `TemperatureSummaryCelsius.Intake.Reading`
   (labelled `sensor="Intake"`);
2. `Sensors` → a temperature sensor (`ReadingUnits` `Cel`) whose
   `PhysicalContext` is `Intake` (labelled with its `Id`, e.g. `IntakeTemp`);
3. the legacy `Thermal` → `Temperatures` entry whose `PhysicalContext` is
   `Intake` or whose name has the word Inlet, Ambient or Intake (labelled with
   its `Name`).

The Sensors collection is looked through only when a resource before it gave
nothing, once per chassis found (again after a failed poll), and only the
members whose `Id` names what is sought: power (`Power`, `Pwr`; ids with
`Total` first) or the inlet (`Intake`, `Inlet`, then `Ambient`). A BMC can
list a hundred sensors, and fetching each would outlast a poll's deadline.

Emits:

    llmgw_node_power_watts{source="redfish"} 344
    llmgw_node_inlet_temperature_celsius{chip="redfish",sensor="Intake"} 22

The inlet series is served only while the `hwmon` source has no inlet sensor.

Authentication: `session` (POST to the service's Sessions collection before
the first request, then `X-Auth-Token`; a 401 — the BMC restarted and forgot the session — opens one
new session and retries once; the session is deleted at exit), `basic`, or
`none`. The credentials file holds the user name on its first line and the
password on its second; it is read at each login, and neither its content nor
the token is ever logged. A service that accepts the login POST without
handing out a token (sushy-tools' `sushy-static` answers any POST with 204)
has no session service: the source reads down saying so; use `basic`.

Missing data:
- no `url` configured → `NoData`; no chassis with a power resource → `NoData`;
- a reading that is null, 0 W or above 50 kW, an inlet outside −20…80 °C, a
  resource the chassis links but the service does not serve (404) → absent
  (the next resource in the order above is tried);
- the BMC not answering within `timeout`, refusing the login, answering an
  error (a 500) or something that is not JSON → the source is down; its last
  reading is served until `stale_after`, then absent;
- a certificate that `tls_verify` does not trust → the same, with OpenSSL's
  reason; it fails the first request, so no credentials are sent;
- the inlet failing while the power was read → the power is served, the
  source reads down;
- a configured `chassis` the service does not have → the source is down.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar
from urllib.parse import urljoin, urlsplit

from pydantic import field_validator, model_validator

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
from llmgw_common.yamlfile import FilePath

if TYPE_CHECKING:
    import requests

SERVICE_ROOT = "/redfish/v1/"
DEFAULT_SESSIONS = "/redfish/v1/SessionService/Sessions"
POWER_LINKS = ("EnvironmentMetrics", "PowerSubsystem", "Power")


@dataclass(frozen=True)
class SensorKind:
    """What one kind of sensor in a chassis' Sensors collection looks like."""

    #: Words of a member's `Id` (any case) that make it worth fetching.
    id_words: tuple[str, ...]
    #: Of those, the ids with one of these words are fetched first.
    preferred: tuple[str, ...]
    #: Whether the fetched Sensor document is this kind.
    matches: Callable[[dict[str, Any]], bool]


def _is_chassis_power(sensor: dict[str, Any]) -> bool:
    kind = sensor.get("ReadingType")
    is_power = kind == "Power" or (kind is None and sensor.get("ReadingUnits") == "W")
    return (
        is_power
        and sensor.get("PhysicalContext") == "Chassis"
        and sensor.get("ElectricalContext") in (None, "Total")
    )


def _is_intake_temperature(sensor: dict[str, Any]) -> bool:
    kind = sensor.get("ReadingType")
    is_temperature = kind == "Temperature" or (kind is None and sensor.get("ReadingUnits") == "Cel")
    return is_temperature and sensor.get("PhysicalContext") == "Intake"


#: The chassis' total power (DMTF's mockups: `TotalPower`; not a supply's, not a CPU's).
POWER_SENSOR = SensorKind(("power", "pwr"), ("total",), _is_chassis_power)
#: The air at the chassis' intake (DMTF's mockups: `IntakeTemp`; `AmbientTemp` is the room).
INLET_SENSOR = SensorKind(
    ("intake", "inlet", "ambient"), ("intake", "inlet"), _is_intake_temperature
)

log = logging.getLogger(__name__)
_E = TypeVar("_E", bound=BaseException)


class RedfishError(RuntimeError):
    """The BMC did not answer, refused us, or answered something unusable."""


class NotServed(RedfishError):
    """The service answered 404 for a resource it links to."""


class RedfishConfig(BmcConfig):
    #: The BMC's address: https://bmc.example:443 (a path is ignored).
    url: str | None = None
    #: The chassis `Id` whose power is the node's; unset: the first with a power resource.
    chassis: str | None = None
    auth: Literal["session", "basic", "none"] = "session"
    #: User name on the first line, password on the second.
    credentials_file: FilePath | None = None
    #: Verify the BMC's certificate; a path is a CA bundle to verify it with.
    tls_verify: bool | FilePath = True

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, url: str | None) -> str | None:
        if url is not None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an http:// or https:// address")
            if parts.username or parts.password:
                raise ValueError("put credentials in credentials_file, never in the url")
        return url

    @model_validator(mode="after")
    def _credentials_for_auth(self) -> RedfishConfig:
        if self.url is not None and self.auth != "none" and self.credentials_file is None:
            raise ValueError(f"auth {self.auth} needs a credentials_file")
        return self


def read_credentials(path: Path) -> tuple[str, str]:
    """(user, password) from the file; errors name the file, never its content."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise RedfishError(f"cannot read the credentials file {path}: {reason}") from None
    if len(lines) < 2 or not lines[0]:
        raise RedfishError(
            f"the credentials file {path} must hold the user name, then the password, on two lines"
        )
    return lines[0], lines[1]


def _link(document: dict[str, Any], key: str) -> str | None:
    value = document.get(key)
    if isinstance(value, dict) and isinstance(value.get("@odata.id"), str):
        return str(value["@odata.id"])
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class RedfishClient:
    """GETs JSON from one BMC, logging in (and in again, once, after a 401) as configured."""

    def __init__(self, config: RedfishConfig) -> None:
        assert config.url is not None
        parts = urlsplit(config.url)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.config = config
        # requests, with urllib3, idna, charset_normalizer and certifi, is 4.7 MiB of the
        # exporter's memory: loaded here, by a node whose agent.yaml names its BMC, not at start
        # (tests/test_exporter_memory.py).
        import requests
        import urllib3

        self.http = requests.Session()
        # Given with every request, never as `Session.verify`: requests lets
        # REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's own setting,
        # CA file and `False` alike (psf/requests#3829).
        self._verify: bool | str = (
            str(config.tls_verify) if isinstance(config.tls_verify, Path) else config.tls_verify
        )
        if config.tls_verify is False:
            # Chosen in agent.yaml: said once here, not warned at every request.
            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
            log.warning("redfish: the certificate of %s is not verified", self.base)
        self._token: str | None = None
        self._session_uri: str | None = None

    def get(self, path: str) -> dict[str, Any]:
        if self.config.auth == "session" and self._token is None:
            # Logged in before the first request, not after its 401: a service that
            # answers without one would otherwise never be asked for the session.
            self._login()
        response = self._send("GET", path)
        if response.status_code == 401 and self.config.auth == "session":
            self._login()
            response = self._send("GET", path)
        if response.status_code == 404:
            raise NotServed(f"the BMC does not serve {path}")
        if response.status_code != 200:
            raise RedfishError(f"the BMC answered GET {path} with HTTP {response.status_code}")
        try:
            document = response.json()
        except ValueError:
            raise RedfishError(f"the BMC answered GET {path} with something not JSON") from None
        if not isinstance(document, dict):
            raise RedfishError(f"the BMC answered GET {path} with JSON that is not an object")
        return document

    def close(self) -> None:
        """Delete our session: BMCs have few session slots."""
        if self._session_uri is not None:
            with contextlib.suppress(RedfishError):
                self._send("DELETE", self._session_uri)
            self._session_uri = self._token = None
        self.http.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        headers = {"Accept": "application/json"}
        auth = None
        if self.config.auth == "session" and self._token is not None:
            headers["X-Auth-Token"] = self._token
        elif self.config.auth == "basic" and self.config.credentials_file is not None:
            auth = read_credentials(self.config.credentials_file)
        import requests  # loaded by __init__: here a lookup in sys.modules

        try:
            return self.http.request(
                method,
                urljoin(self.base, path),
                headers=headers,
                auth=auth,
                timeout=self.config.timeout,
                verify=self._verify,
                allow_redirects=False,
                **kwargs,
            )
        except requests.Timeout:
            raise RedfishError(
                f"the BMC at {self.base} did not answer {method} {path} within"
                f" {self.config.timeout:g}s"
            ) from None
        except requests.exceptions.SSLError as exc:
            raise RedfishError(self._tls_failure(exc)) from None
        except requests.RequestException as exc:
            # The exception's text has object addresses that change at every poll.
            raise RedfishError(
                f"cannot reach the BMC at {self.base} ({type(exc).__name__})"
            ) from None

    def _tls_failure(self, exc: BaseException) -> str:
        """Why TLS failed, in words an operator can act on (the OpenSSL reason kept)."""
        verification = _find_cause(exc, ssl.SSLCertVerificationError)
        if verification is None:
            return f"TLS with the BMC at {self.base} failed ({type(exc).__name__})"
        reason = verification.verify_message or "certificate verify failed"
        trusted_by = (
            f"the CA file {self._verify}" if isinstance(self._verify, str) else "the system CAs"
        )
        return (
            f"the BMC at {self.base} presented a certificate not trusted by {trusted_by}"
            f" ({reason}): set tls_verify to the file of the CA that signed it"
            " (or false, not to verify it)"
        )

    def _login(self) -> None:
        assert self.config.credentials_file is not None
        user, password = read_credentials(self.config.credentials_file)
        self._token = None
        sessions = DEFAULT_SESSIONS
        root = self._send("GET", SERVICE_ROOT)
        if root.status_code == 200:
            try:
                links = root.json().get("Links", {})
                sessions = _link(links, "Sessions") or sessions
            except (ValueError, AttributeError):
                pass
        response = self._send("POST", sessions, json={"UserName": user, "Password": password})
        token = response.headers.get("X-Auth-Token")
        if response.status_code not in (200, 201, 204):
            raise RedfishError(f"the BMC refused the session login (HTTP {response.status_code})")
        if not token:
            # sushy-static answers every POST with 204 and nothing else: no session service.
            raise RedfishError(
                f"the BMC answered the session login (POST {sessions}) with HTTP"
                f" {response.status_code} but no X-Auth-Token: it has no session service"
                " (set auth: basic, or none)"
            )
        self._token = token
        self._session_uri = response.headers.get("Location")


class RedfishSource(BmcSource):
    name: ClassVar[str] = "redfish"
    Config: ClassVar[type[SourceConfig]] = RedfishConfig
    config: RedfishConfig

    def __init__(
        self,
        sysfs: Path,
        config: SourceConfig,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(sysfs, config, clock)
        self._client: RedfishClient | None = None
        self._chassis: dict[str, Any] | None = None  # the chassis document, found once
        # The chassis' Sensors collection and its sensor of each kind (None: it has none),
        # looked for once: a BMC can list a hundred sensors.
        self._sensor_members: list[str] | None = None
        self._sensors: dict[SensorKind, str | None] = {}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def _forget(self) -> None:
        self._chassis = None  # find it afresh: the BMC may have been reconfigured
        self._sensor_members, self._sensors = None, {}

    def _read(self) -> list[Sample]:
        if self.config.url is None:
            raise NoData("no BMC address configured (sources.redfish.url)")
        if self._client is None:
            self._client = RedfishClient(self.config)
        client = self._client
        if self._chassis is None:
            self._chassis = self._find_chassis(client)
        chassis = self._chassis
        samples: list[Sample] = []
        raw: float | None = None  # the first reading, shown when none was a node's
        for reading in self._power_readings(client, chassis):
            raw = reading if raw is None else raw
            if (watts := node_power(reading)) is not None:
                samples.append(Sample(NODE_POWER_METRIC, watts, {"source": self.name}))
                break
        if self.config.inlet:
            try:
                for sensor, reading in self._inlet_readings(client, chassis):
                    if (celsius := inlet(reading)) is not None:
                        labels = {"chip": self.name, "sensor": sensor}
                        samples.append(Sample(INLET_METRIC, celsius, labels))
                        break
            except RedfishError as exc:
                if samples:
                    raise PartialReading(samples, f"inlet sensor: {exc}") from exc
                raise
        if not samples:
            where = chassis.get("@odata.id", "the chassis")
            shown = "" if raw is None else f" ({raw:g} W)"
            raise NoData(f"no power reading from {where}{shown}")
        return samples

    def _find_chassis(self, client: RedfishClient) -> dict[str, Any]:
        root = client.get(SERVICE_ROOT)
        collection_path = _link(root, "Chassis")
        if collection_path is None:
            raise NoData("the Redfish service has no Chassis collection")
        members = client.get(collection_path).get("Members", [])
        paths = [path for member in members if (path := _link({"m": member}, "m"))]
        wanted = self.config.chassis
        for path in paths:
            if wanted is not None and path.rstrip("/").rsplit("/", 1)[-1] != wanted:
                continue
            document = client.get(path)
            if wanted is not None or any(_link(document, key) for key in POWER_LINKS):
                return document
        if wanted is not None:
            raise RedfishError(f"the BMC has no chassis {wanted!r} (it has {len(paths)})")
        raise NoData("no chassis with a power resource (EnvironmentMetrics, PowerSubsystem, Power)")

    def _power_readings(self, client: RedfishClient, chassis: dict[str, Any]) -> Iterator[float]:
        """Each power resource's reading, in the order of preference. A generator: a resource
        is fetched only when the readings before it were not a node's (null, 0 W, > 50 kW)."""
        if (path := _link(chassis, "EnvironmentMetrics")) is not None:
            reading = _optional(client, path)
            if reading is not None:
                watts = _number((reading.get("PowerWatts") or {}).get("Reading"))
                if watts is not None:
                    yield watts
        if (sensor := self._sensor_reading(client, chassis, POWER_SENSOR)) is not None:
            yield sensor[1]
        if (path := _link(chassis, "PowerSubsystem")) is not None:
            subsystem = _optional(client, path)
            if subsystem is not None and (watts := _supplies_input(client, subsystem)) is not None:
                yield watts
        if (path := _link(chassis, "Power")) is not None:
            power = _optional(client, path)
            for control in (power or {}).get("PowerControl") or []:
                if isinstance(control, dict):
                    watts = _number(control.get("PowerConsumedWatts"))
                    if watts is not None:
                        yield watts
                        return  # only the first entry is the system's (see the module's doc)

    def _inlet_readings(
        self, client: RedfishClient, chassis: dict[str, Any]
    ) -> Iterator[tuple[str, float]]:
        """(sensor, °C) of each inlet resource, in the order of preference; fetched only while
        the readings before were out of range (a disconnected sensor reads 127 °C)."""
        if (path := _link(chassis, "ThermalSubsystem")) is not None:
            subsystem = _optional(client, path)
            metrics_path = _link(subsystem or {}, "ThermalMetrics")
            metrics = _optional(client, metrics_path) if metrics_path else None
            if metrics is not None:
                summary = (metrics.get("TemperatureSummaryCelsius") or {}).get("Intake") or {}
                celsius = _number(summary.get("Reading"))
                if celsius is not None:
                    yield "Intake", celsius
        if (sensor := self._sensor_reading(client, chassis, INLET_SENSOR)) is not None:
            yield sensor
        if (path := _link(chassis, "Thermal")) is not None:
            thermal = _optional(client, path)
            for sensor in (thermal or {}).get("Temperatures") or []:
                if not isinstance(sensor, dict):
                    continue
                name = str(sensor.get("Name") or sensor.get("MemberId") or "")
                state = (sensor.get("Status") or {}).get("State", "Enabled")
                if state != "Enabled":
                    continue
                if sensor.get("PhysicalContext") == "Intake" or is_inlet_name(name):
                    celsius = _number(sensor.get("ReadingCelsius"))
                    if celsius is not None:
                        yield name or "Intake", celsius

    def _sensor_reading(
        self, client: RedfishClient, chassis: dict[str, Any], kind: SensorKind
    ) -> tuple[str, float] | None:
        """(the sensor's Id, its reading) from the chassis' sensor of this kind, if it has one."""
        if self._sensor_members is None:
            path = _link(chassis, "Sensors")
            collection = (_optional(client, path) if path else None) or {}
            members = collection.get("Members") or []
            self._sensor_members = [p for m in members if (p := _link({"m": m}, "m"))]
        if kind not in self._sensors:
            self._sensors[kind] = _find_sensor(client, self._sensor_members, kind)
        path = self._sensors[kind]
        if path is None:
            return None
        sensor = _optional(client, path)
        if sensor is None or (sensor.get("Status") or {}).get("State", "Enabled") != "Enabled":
            return None
        reading = _number(sensor.get("Reading"))
        if reading is None:
            return None
        return str(sensor.get("Id") or path.rstrip("/").rsplit("/", 1)[-1]), reading


def _find_sensor(client: RedfishClient, members: list[str], kind: SensorKind) -> str | None:
    """The path of the first sensor of this kind among the members of a Sensors collection,
    fetching only those whose Id names it (the preferred words first), or None."""

    def named(member: str, words: tuple[str, ...]) -> bool:
        member_id = member.rstrip("/").rsplit("/", 1)[-1].lower()
        return any(word in member_id for word in words)

    candidates = [member for member in members if named(member, kind.id_words)]
    candidates.sort(key=lambda member: not named(member, kind.preferred))  # stable
    for member in candidates:
        sensor = _optional(client, member)
        if sensor is not None and kind.matches(sensor):
            return member
    return None


def _find_cause(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first `kind` among the exceptions that led to `exc` (requests wraps urllib3's)."""
    seen: set[int] = set()
    pending: list[object] = [exc]
    while pending:
        current = pending.pop()
        if not isinstance(current, BaseException) or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, kind):
            return current
        pending += [current.__cause__, current.__context__, getattr(current, "reason", None)]
        pending += list(current.args)
    return None


def _optional(client: RedfishClient, path: str) -> dict[str, Any] | None:
    """The document, or None when the service does not serve what it links to."""
    try:
        return client.get(path)
    except NotServed:
        return None


def _supplies_input(client: RedfishClient, subsystem: dict[str, Any]) -> float | None:
    """Sum of the present supplies' input power, or None unless every one of them tells."""
    path = _link(subsystem, "PowerSupplies")
    collection = _optional(client, path) if path else None
    total = 0.0
    found = False
    for member in (collection or {}).get("Members") or []:
        supply_path = _link({"m": member}, "m")
        supply = _optional(client, supply_path) if supply_path else None
        if supply is None:
            return None
        if (supply.get("Status") or {}).get("State") == "Absent":
            continue
        metrics_path = _link(supply, "Metrics")
        metrics = _optional(client, metrics_path) if metrics_path else None
        watts = _number(((metrics or {}).get("InputPowerWatts") or {}).get("Reading"))
        if watts is None:
            return None
        total += watts
        found = True
    return total if found else None
