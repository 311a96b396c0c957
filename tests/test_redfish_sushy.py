"""redfish source against DMTF's mockup of a rack server, served by the real `sushy-static`.

`sushy-static` (sushy-tools, in the test extra) serves tests/fixtures/redfish/public-rackmount1
(DMTF's public-rackmount1, the parts listed in that folder's README) over HTTPS with this
run's own CA (tests/redfish_helpers.py), on a loopback port picked here. Each test serves its
own copy of the mockup, which it may cut down while the server runs: sushy-static reads a
file at each request, so a resource removed from the copy (and from the chassis' links) is one
this BMC does not have.

What sushy-static is (read in sushy_tools/static/main.py, 2.2.0, and checked here): a plain
`http.server` that answers GET with the files, any POST with 204 and nothing else, DELETE with
501, and checks no credentials; it cannot answer a 500. So session login, its re-login and its
DELETE, and a 500, are tested against tests/fake_redfish.py serving the same mockup documents
over the same TLS (the last tests); against sushy-static, a session login reads down, saying
the service has no session service.

The figures are the mockup's own (MOCKUP_FIGURES; `test_the_figures_are_the_mockups` reads
them back from the files).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.poller import SourceRunner
from exporter.sources.redfish import RedfishConfig, RedfishSource
from tests.exporter_helpers import serving_exporter
from tests.fake_redfish import PASSWORD, USER, FakeRedfish, mockup_documents
from tests.redfish_helpers import (
    INLET,
    MOCKUP,
    POWER,
    FakeClock,
    SushyStatic,
    make_pki,
    server_context,
    serving_sushy_static,
    values,
)

pytestmark = pytest.mark.servers

CHASSIS = "/redfish/v1/Chassis/1U"
SESSIONS = "/redfish/v1/SessionService/Sessions"  # the mockup's Links.Sessions

#: What the mockup says, resource by resource (file under Chassis/1U/ → its figure).
MOCKUP_FIGURES: dict[str, tuple[str, float]] = {
    "EnvironmentMetrics": ("EnvironmentMetrics/index.json PowerWatts.Reading", 374.0),
    "Sensors power": ("Sensors/TotalPower/index.json Reading", 374.0),
    "PowerSubsystem": ("PowerSubsystem/PowerSupplies/Bay1/Metrics InputPowerWatts", 937.4),
    "Power": ("Power/index.json PowerControl[0].PowerConsumedWatts", 344.0),
    "ThermalMetrics": ("ThermalSubsystem/ThermalMetrics Intake.Reading", 24.8),
    "Sensors inlet": ("Sensors/IntakeTemp/index.json Reading", 24.8),
    "Thermal": ("Thermal/index.json Temperatures[2] (Chassis Intake Temp)", 25.0),
}


def figure(name: str) -> float:
    return MOCKUP_FIGURES[name][1]


def read_mockup(relative: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((MOCKUP / "Chassis" / "1U" / relative).read_text())
    return document


def test_the_figures_are_the_mockups() -> None:
    """MOCKUP_FIGURES as the files say them (so no figure here is made up)."""
    supply = read_mockup("PowerSubsystem/PowerSupplies/Bay1/Metrics/index.json")
    absent = read_mockup("PowerSubsystem/PowerSupplies/Bay2/index.json")
    thermal = read_mockup("Thermal/index.json")["Temperatures"]
    intake = [t for t in thermal if t.get("PhysicalContext") == "Intake"]
    metrics = read_mockup("ThermalSubsystem/ThermalMetrics/index.json")
    assert {
        "EnvironmentMetrics": read_mockup("EnvironmentMetrics/index.json")["PowerWatts"]["Reading"],
        "Sensors power": read_mockup("Sensors/TotalPower/index.json")["Reading"],
        "PowerSubsystem": supply["InputPowerWatts"]["Reading"],
        "Power": read_mockup("Power/index.json")["PowerControl"][0]["PowerConsumedWatts"],
        "ThermalMetrics": metrics["TemperatureSummaryCelsius"]["Intake"]["Reading"],
        "Sensors inlet": read_mockup("Sensors/IntakeTemp/index.json")["Reading"],
        "Thermal": intake[0]["ReadingCelsius"],
    } == {name: value for name, (_, value) in MOCKUP_FIGURES.items()}
    assert absent["Status"]["State"] == "Absent"  # Bay2: not in the sum
    assert len(intake) == 1 and intake[0]["Name"] == "Chassis Intake Temp"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def mockup(tmp_path: Path) -> Path:
    """This test's own copy of the mockup, for it to cut down."""
    copy = tmp_path / "mockup"
    shutil.copytree(MOCKUP, copy)
    return copy


@pytest.fixture
def sushy(mockup: Path, pki: dict[str, Path], tmp_path: Path) -> Iterator[SushyStatic]:
    with serving_sushy_static(mockup, pki, tmp_path) as server:
        yield server


def without(mockup: Path, *links: str) -> None:
    """The chassis no longer has these resources: unlinked, and no longer served (404)."""
    index = mockup / "Chassis" / "1U" / "index.json"
    chassis = json.loads(index.read_text())
    for link in links:
        del chassis[link]
        shutil.rmtree(mockup / "Chassis" / "1U" / link)
    index.write_text(json.dumps(chassis, indent=4))


def source(
    url: str, credentials: Path, tls_verify: Path | bool, clock: FakeClock, **keys: object
) -> SourceRunner:
    config = RedfishConfig.model_validate(
        {
            "url": url,
            "credentials_file": credentials,
            "tls_verify": tls_verify,
            "timeout": 5,
            "auth": "basic",
            **keys,
        }
    )
    return SourceRunner(RedfishSource(Path("/nonexistent"), config, clock), 30, monotonic=clock)


# --- each resource, in the documented order -------------------------------------------------


@pytest.mark.parametrize(
    ("removed", "power", "inlet", "inlet_sensor"),
    [
        ((), "EnvironmentMetrics", "ThermalMetrics", "Intake"),
        (
            ("EnvironmentMetrics", "ThermalSubsystem"),
            "Sensors power",
            "Sensors inlet",
            "IntakeTemp",
        ),
        (
            ("EnvironmentMetrics", "ThermalSubsystem", "Sensors"),
            "PowerSubsystem",
            "Thermal",
            "Chassis Intake Temp",
        ),
        (
            ("EnvironmentMetrics", "ThermalSubsystem", "Sensors", "PowerSubsystem"),
            "Power",
            "Thermal",
            "Chassis Intake Temp",
        ),
    ],
    ids=["newest", "sensors", "power-subsystem", "legacy"],
)
def test_each_resource_in_the_order_of_preference(
    sushy: SushyStatic,
    mockup: Path,
    pki: dict[str, Path],
    credentials: Path,
    removed: tuple[str, ...],
    power: str,
    inlet: str,
    inlet_sensor: str,
) -> None:
    without(mockup, *removed)
    state = source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == {
        (POWER, "redfish"): figure(power),
        (INLET, inlet_sensor): figure(inlet),
    }


def edit(mockup: Path, relative: str, change: dict[str, Any]) -> None:
    """Set keys (a dotted path: `PowerWatts.Reading`) of one of the copy's documents."""
    index = mockup / "Chassis" / "1U" / relative / "index.json"
    document = json.loads(index.read_text())
    for dotted, value in change.items():
        *parents, key = dotted.split(".")
        target = document
        for parent in parents:
            target = target[parent]
        target[key] = value
    index.write_text(json.dumps(document, indent=4))


def test_a_reading_that_is_not_a_node_s_falls_through_to_the_next_resource(
    sushy: SushyStatic, mockup: Path, pki: dict[str, Path], credentials: Path
) -> None:
    """A BMC without a meter answers 0 W, a disconnected sensor 127 °C: not readings, so the
    next resources are read (never a 0 W node, never no power while another resource has it)."""
    edit(mockup, "EnvironmentMetrics", {"PowerWatts.Reading": 0})
    edit(mockup, "Sensors/TotalPower", {"Reading": None})
    edit(
        mockup, "ThermalSubsystem/ThermalMetrics", {"TemperatureSummaryCelsius.Intake.Reading": 127}
    )
    state = source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == {
        (POWER, "redfish"): figure("PowerSubsystem"),
        (INLET, "IntakeTemp"): figure("Sensors inlet"),
    }


def test_the_sensors_are_found_by_their_ids_once(
    sushy: SushyStatic, mockup: Path, pki: dict[str, Path], credentials: Path
) -> None:
    """Of the mockup's 41 sensors, only TotalPower and IntakeTemp are fetched (their ids name
    what is sought, `Total` first), and the collection is read once for two polls."""
    without(mockup, "EnvironmentMetrics", "ThermalSubsystem")
    runner = source(sushy.url, credentials, pki["ca"], FakeClock())
    for _ in range(2):
        state = runner.poll_once()
        assert state.up, state.reason
        assert values(list(state.samples)) == {
            (POWER, "redfish"): 374.0,
            (INLET, "IntakeTemp"): 24.8,
        }
    sensors = [path for path in sushy.requested() if path.startswith(f"{CHASSIS}/Sensors")]
    assert sensors.count(f"{CHASSIS}/Sensors") == 1
    assert sorted(set(sensors) - {f"{CHASSIS}/Sensors"}) == [
        f"{CHASSIS}/Sensors/IntakeTemp",
        f"{CHASSIS}/Sensors/TotalPower",
    ]


def test_a_supply_cpu_or_room_sensor_is_never_taken_for_the_node_or_its_inlet(
    sushy: SushyStatic, mockup: Path, pki: dict[str, Path], credentials: Path
) -> None:
    """Without TotalPower and IntakeTemp (still listed, no longer served), the sensors left
    in the collection whose ids name power or the inlet are the supplies' (PS1InputPower,
    374 W, and an absent one) and the room's (AmbientTemp, 22.5 °C): none is the node's
    total or its intake, and the next resources in the order are read."""
    without(mockup, "EnvironmentMetrics", "ThermalSubsystem")
    for sensor in ("TotalPower", "IntakeTemp"):
        shutil.rmtree(mockup / "Chassis" / "1U" / "Sensors" / sensor)
    state = source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == {
        (POWER, "redfish"): figure("PowerSubsystem"),
        (INLET, "Chassis Intake Temp"): figure("Thermal"),
    }
    fetched = {path.rsplit("/", 1)[-1] for path in sushy.requested() if "/Sensors/" in path}
    assert fetched == {"TotalPower", "PS1InputPower", "PS2InputPower", "IntakeTemp", "AmbientTemp"}


def test_the_newest_resources_are_read_and_no_other(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path
) -> None:
    state = source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once()
    assert state.up, state.reason
    asked = set(sushy.requested())
    assert {f"{CHASSIS}/EnvironmentMetrics", f"{CHASSIS}/ThermalSubsystem/ThermalMetrics"} < asked
    assert not {f"{CHASSIS}/Power", f"{CHASSIS}/Thermal", f"{CHASSIS}/Sensors"} & asked


# --- authentication -----------------------------------------------------------------------


@pytest.mark.parametrize("auth", ["basic", "none"])
def test_basic_auth_sends_the_credentials_with_each_request_and_none_sends_none(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path, auth: str
) -> None:
    state = source(sushy.url, credentials, pki["ca"], FakeClock(), auth=auth).poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == {(POWER, "redfish"): 374.0, (INLET, "Intake"): 24.8}
    # sushy-static checks no credentials, but prints every request's headers.
    expected = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    ours = len(sushy.requested()) - 1  # all but the readiness check
    sent = sushy.log.read_text().count(f"Authorization: Basic {expected}")
    assert sent == (ours if auth == "basic" else 0)
    assert sushy.requested("POST") == []  # no session was asked for


def test_session_login_to_sushy_static_reads_down_saying_it_has_no_session_service(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path
) -> None:
    state = source(sushy.url, credentials, pki["ca"], FakeClock(), auth="session").poll_once()
    assert (state.up, state.samples) == (False, ())
    assert sushy.requested("POST") == [SESSIONS]  # found from the service root's Links
    assert (
        f"the BMC answered the session login (POST {SESSIONS}) with HTTP 204 but no X-Auth-Token"
        in state.reason
    )
    assert "set auth: basic, or none" in state.reason


# --- faults -------------------------------------------------------------------------------


def test_a_stopped_bmc_reads_down_keeps_its_reading_until_stale_then_nothing(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path
) -> None:
    clock = FakeClock()
    runner = source(sushy.url, credentials, pki["ca"], clock)
    assert runner.poll_once().up
    sushy.stop()
    assert sushy.process.returncode is not None
    clock.now += 30
    state = runner.poll_once()
    assert not state.up
    assert f"cannot reach the BMC at {sushy.url} (ConnectionError)" in state.reason
    assert "serving the last reading until it is 90s old" in state.reason
    assert values(list(state.samples)) == {(POWER, "redfish"): 374.0, (INLET, "Intake"): 24.8}
    clock.now += 61  # 91 s after the last reading
    state = runner.poll_once()
    assert (state.up, state.samples) == (False, ())
    assert f"cannot reach the BMC at {sushy.url} (ConnectionError)" in state.reason


def test_a_document_that_is_not_json_reads_down_never_zero(
    sushy: SushyStatic, mockup: Path, pki: dict[str, Path], credentials: Path
) -> None:
    (mockup / "Chassis" / "1U" / "EnvironmentMetrics" / "index.json").write_text('{"PowerWatts": ')
    state = source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once()
    assert (state.up, state.samples) == (False, ())
    assert f"the BMC answered GET {CHASSIS}/EnvironmentMetrics with something not JSON" in (
        state.reason
    )


@pytest.mark.parametrize("trusted", ["other_ca", "system"])
def test_a_certificate_from_another_ca_reads_down_and_sends_no_credentials(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path, trusted: str
) -> None:
    tls_verify = pki["other_ca"] if trusted == "other_ca" else True
    state = source(sushy.url, credentials, tls_verify, FakeClock()).poll_once()
    assert (state.up, state.samples) == (False, ())
    assert f"the BMC at {sushy.url} presented a certificate not trusted by" in state.reason
    assert "unable to get local issuer certificate" in state.reason
    assert sushy.requested() == ["/redfish/v1/"]  # the readiness check only: no request of ours
    assert "Authorization" not in sushy.log.read_text()
    # The server is still there: it was the client that refused it.
    assert source(sushy.url, credentials, pki["ca"], FakeClock()).poll_once().up


# --- session login and a 500, on the same mockup (sushy-static has neither) -----------------


@pytest.fixture
def bmc(pki: dict[str, Path]) -> Iterator[FakeRedfish]:
    service = FakeRedfish(
        tls=server_context(pki), documents=mockup_documents(MOCKUP), sessions=SESSIONS
    ).start()
    try:
        yield service
    finally:
        service.stop()


def test_session_login_on_the_mockup_reads_relogs_after_a_restart_and_deletes_at_close(
    bmc: FakeRedfish, pki: dict[str, Path], credentials: Path
) -> None:
    runner = source(bmc.url, credentials, pki["ca"], FakeClock(), auth="session")
    expected = {(POWER, "redfish"): 374.0, (INLET, "Intake"): 24.8}
    state = runner.poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == expected
    assert bmc.logins() == 1
    bmc.restart()  # every token forgotten: the next GET is a 401
    state = runner.poll_once()
    assert state.up, state.reason
    assert values(list(state.samples)) == expected
    assert bmc.logins() == 2
    runner.source.close()
    assert len(bmc.deleted) == 1 and bmc.deleted[0].startswith(f"{SESSIONS}/")


def test_a_500_reads_down_serves_the_last_reading_until_stale_never_zero(
    bmc: FakeRedfish, pki: dict[str, Path], credentials: Path
) -> None:
    clock = FakeClock()
    runner = source(bmc.url, credentials, pki["ca"], clock, auth="session")
    assert runner.poll_once().up
    bmc.fail(f"{CHASSIS}/EnvironmentMetrics", 500)
    clock.now += 30
    state = runner.poll_once()
    assert not state.up
    assert f"the BMC answered GET {CHASSIS}/EnvironmentMetrics with HTTP 500" in state.reason
    assert values(list(state.samples)) == {(POWER, "redfish"): 374.0, (INLET, "Intake"): 24.8}
    clock.now += 61
    state = runner.poll_once()
    assert (state.up, state.samples) == (False, ())
    assert "HTTP 500" in state.reason


# --- the exporter process, end to end -----------------------------------------------------


def test_the_exporter_serves_the_mockups_power_and_inlet(
    sushy: SushyStatic, pki: dict[str, Path], credentials: Path, tmp_path: Path
) -> None:
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        "node: rf-node-1\n"
        "sources:\n"
        "  redfish:\n"
        f"    url: {sushy.url}\n"
        "    auth: basic\n"
        f"    credentials_file: {credentials}\n"
        f"    tls_verify: {pki['ca']}\n"
        "  gpu: {enabled: false}\n"
        "  ipmi: {enabled: false}\n"
    )
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    args = ["--config", str(agent), "--sysfs", str(sysfs)]

    def ready(body: str) -> bool:
        return 'llmgw_node_power_watts{node="rf-node-1",source="redfish"}' in body

    with serving_exporter(args, os.environ, tmp_path / "exporter.log", ready) as url:
        body = requests.get(f"{url}/metrics", timeout=10).text
    assert 'llmgw_node_power_watts{node="rf-node-1",source="redfish"} 374.0' in body
    inlet = 'llmgw_node_inlet_temperature_celsius{chip="redfish",node="rf-node-1",sensor="Intake"}'
    assert f"{inlet} 24.8" in body
    assert 'llmgw_exporter_source_up{node="rf-node-1",source="redfish"} 1.0' in body
    assert PASSWORD not in (tmp_path / "exporter.log").read_text()
