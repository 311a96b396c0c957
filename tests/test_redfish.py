"""redfish source against a real HTTP service on loopback serving CEEMS' Redfish fixtures.

The fixtures (tests/fixtures/redfish, from ceems-dev/fake-energy-counters) are a
legacy `Power` service. The newer resources (EnvironmentMetrics,
PowerSubsystem, ThermalSubsystem) and `Thermal` are **synthetic** documents,
written here after DMTF's schema, added to the same service.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.poller import SourceRunner
from exporter.samples import NoData, PartialReading
from exporter.sources.redfish import RedfishConfig, RedfishSource
from tests.fake_redfish import PASSWORD, SESSIONS, USER, FakeRedfish
from tests.redfish_helpers import POWER, FakeClock, values

CHASSIS_1 = "/redfish/v1/Chassis/Chassis-1"
INLET = "llmgw_node_inlet_temperature_celsius"


@pytest.fixture
def bmc() -> Iterator[FakeRedfish]:
    service = FakeRedfish().start()
    yield service
    service.stop()


def make_source(
    url: str, credentials: Path | None, clock: FakeClock | None = None, **keys: object
) -> RedfishSource:
    keys.setdefault("timeout", 2)
    config = RedfishConfig.model_validate({"url": url, "credentials_file": credentials, **keys})
    return RedfishSource(Path("/nonexistent"), config, clock or FakeClock())


def chassis_with(bmc: FakeRedfish, **links: str) -> None:
    document = dict(bmc.documents[CHASSIS_1])
    for key, path in links.items():
        document[key] = {"@odata.id": path}
    bmc.set(CHASSIS_1, document)


# --- the fixtures as they are -------------------------------------------------------------


def test_legacy_power_of_the_first_chassis(bmc: FakeRedfish, credentials: Path) -> None:
    source = make_source(bmc.url, credentials)
    assert values(source.poll()) == {(POWER, "redfish"): 344.0}
    source.close()


def test_configured_chassis(bmc: FakeRedfish, credentials: Path) -> None:
    source = make_source(bmc.url, credentials, chassis="Chassis-2")
    assert values(source.poll()) == {(POWER, "redfish"): 1696.0}


def test_a_chassis_the_bmc_does_not_have_is_a_failure(bmc: FakeRedfish, credentials: Path) -> None:
    source = make_source(bmc.url, credentials, chassis="System.Embedded.1")
    with pytest.raises(Exception, match=r"no chassis 'System\.Embedded\.1'"):
        source.poll()


def test_the_fixture_thermal_link_is_not_served_so_no_inlet(
    bmc: FakeRedfish, credentials: Path
) -> None:
    source = make_source(bmc.url, credentials)
    assert INLET not in {s.metric for s in source.poll()}
    assert bmc.requests[("GET", f"{CHASSIS_1}/Thermal")] == 1


def test_the_first_power_control_entry_is_the_node(bmc: FakeRedfish, credentials: Path) -> None:
    power = dict(bmc.documents[f"{CHASSIS_1}/Power"])
    system = power["PowerControl"][0]
    cpu = {**system, "Name": "CPU Sub-system Power", "PowerConsumedWatts": 120}
    power["PowerControl"] = [system, cpu]
    bmc.set(f"{CHASSIS_1}/Power", power)
    assert values(make_source(bmc.url, credentials).poll()) == {(POWER, "redfish"): 344.0}


@pytest.mark.parametrize("reading", [None, 0, 60000, "344"])
def test_a_reading_that_is_not_a_node_is_absent(
    bmc: FakeRedfish, credentials: Path, reading: object
) -> None:
    power = dict(bmc.documents[f"{CHASSIS_1}/Power"])
    power["PowerControl"] = [{**power["PowerControl"][0], "PowerConsumedWatts": reading}]
    bmc.set(f"{CHASSIS_1}/Power", power)
    with pytest.raises(NoData, match="no power reading from /redfish/v1/Chassis/Chassis-1"):
        make_source(bmc.url, credentials).poll()


# --- newer resources (synthetic documents) ---------------------------------------------------


def test_environment_metrics_wins_over_legacy_power(bmc: FakeRedfish, credentials: Path) -> None:
    chassis_with(bmc, EnvironmentMetrics=f"{CHASSIS_1}/EnvironmentMetrics")
    bmc.set(f"{CHASSIS_1}/EnvironmentMetrics", {"PowerWatts": {"Reading": 512.5}})
    assert values(make_source(bmc.url, credentials).poll()) == {(POWER, "redfish"): 512.5}


def test_environment_metrics_without_power_falls_back(bmc: FakeRedfish, credentials: Path) -> None:
    chassis_with(bmc, EnvironmentMetrics=f"{CHASSIS_1}/EnvironmentMetrics")
    bmc.set(f"{CHASSIS_1}/EnvironmentMetrics", {"TemperatureCelsius": {"Reading": 30}})
    assert values(make_source(bmc.url, credentials).poll()) == {(POWER, "redfish"): 344.0}


def power_subsystem(bmc: FakeRedfish, *readings: float | None, absent: int = 0) -> None:
    base = f"{CHASSIS_1}/PowerSubsystem"
    chassis_with(bmc, PowerSubsystem=base)
    bmc.set(base, {"PowerSupplies": {"@odata.id": f"{base}/PowerSupplies"}})
    members = []
    for index, reading in enumerate([*readings, *([None] * absent)]):
        supply = f"{base}/PowerSupplies/PSU{index}"
        members.append({"@odata.id": supply})
        state = "Absent" if index >= len(readings) else "Enabled"
        bmc.set(supply, {"Status": {"State": state}, "Metrics": {"@odata.id": f"{supply}/Metrics"}})
        bmc.set(f"{supply}/Metrics", {"InputPowerWatts": {"Reading": reading}})
    bmc.set(f"{base}/PowerSupplies", {"Members": members})
    # Without the legacy resource, so that only the subsystem can answer.
    document = dict(bmc.documents[CHASSIS_1])
    del document["Power"]
    bmc.set(CHASSIS_1, document)


def test_power_subsystem_sums_present_supplies(bmc: FakeRedfish, credentials: Path) -> None:
    power_subsystem(bmc, 410.0, 395.5, absent=1)
    assert values(make_source(bmc.url, credentials).poll()) == {(POWER, "redfish"): 805.5}


def test_power_subsystem_with_a_silent_supply_gives_no_sum(
    bmc: FakeRedfish, credentials: Path
) -> None:
    power_subsystem(bmc, 410.0, None)
    with pytest.raises(NoData):
        make_source(bmc.url, credentials).poll()


def test_thermal_subsystem_intake_is_the_inlet(bmc: FakeRedfish, credentials: Path) -> None:
    chassis_with(bmc, ThermalSubsystem=f"{CHASSIS_1}/ThermalSubsystem")
    bmc.set(
        f"{CHASSIS_1}/ThermalSubsystem",
        {"ThermalMetrics": {"@odata.id": f"{CHASSIS_1}/ThermalSubsystem/ThermalMetrics"}},
    )
    bmc.set(
        f"{CHASSIS_1}/ThermalSubsystem/ThermalMetrics",
        {"TemperatureSummaryCelsius": {"Intake": {"Reading": 22.5}, "Exhaust": {"Reading": 41}}},
    )
    samples = make_source(bmc.url, credentials).poll()
    assert values(samples) == {(POWER, "redfish"): 344.0, (INLET, "Intake"): 22.5}
    assert [s.labels for s in samples if s.metric == INLET] == [
        {"chip": "redfish", "sensor": "Intake"}
    ]


def legacy_thermal(bmc: FakeRedfish, *sensors: dict[str, object]) -> None:
    bmc.set(f"{CHASSIS_1}/Thermal", {"Temperatures": list(sensors)})


def test_legacy_thermal_inlet_by_physical_context(bmc: FakeRedfish, credentials: Path) -> None:
    legacy_thermal(
        bmc,
        {"Name": "CPU1 Temp", "PhysicalContext": "CPU", "ReadingCelsius": 61},
        {"Name": "System Board Inlet Temp", "PhysicalContext": "Intake", "ReadingCelsius": 24},
    )
    samples = make_source(bmc.url, credentials).poll()
    assert values(samples)[(INLET, "System Board Inlet Temp")] == 24.0


@pytest.mark.parametrize(
    ("sensor", "published"),
    [
        ({"Name": "Ambient Temp", "ReadingCelsius": 23}, 23.0),
        ({"Name": "Inlet Temp", "ReadingCelsius": -62}, None),  # disconnected
        ({"Name": "Inlet Temp", "ReadingCelsius": None}, None),
        ({"Name": "Inlet Temp", "ReadingCelsius": 23, "Status": {"State": "Absent"}}, None),
        ({"Name": "Exhaust Temp", "ReadingCelsius": 40}, None),
    ],
)
def test_legacy_thermal_inlet_by_name(
    bmc: FakeRedfish, credentials: Path, sensor: dict[str, object], published: float | None
) -> None:
    legacy_thermal(bmc, sensor)
    inlets = [s.value for s in make_source(bmc.url, credentials).poll() if s.metric == INLET]
    assert inlets == ([] if published is None else [published])


def test_inlet_off_reads_no_thermal(bmc: FakeRedfish, credentials: Path) -> None:
    legacy_thermal(bmc, {"Name": "Inlet Temp", "ReadingCelsius": 23})
    make_source(bmc.url, credentials, inlet=False).poll()
    assert bmc.requests[("GET", f"{CHASSIS_1}/Thermal")] == 0


def test_no_url_is_no_data() -> None:
    with pytest.raises(NoData, match="no BMC address"):
        RedfishSource(Path("/nonexistent"), RedfishConfig()).poll()


# --- authentication -----------------------------------------------------------------------


def test_one_session_serves_every_poll(bmc: FakeRedfish, credentials: Path) -> None:
    source = make_source(bmc.url, credentials)
    for _ in range(3):
        source.poll()
    assert bmc.logins() == 1
    source.close()
    assert bmc.deleted and bmc.deleted[0].startswith(f"{SESSIONS}/")


def test_a_bmc_restart_expires_the_session_and_one_new_one_is_opened(
    bmc: FakeRedfish, credentials: Path
) -> None:
    source = make_source(bmc.url, credentials)
    source.poll()
    bmc.restart()
    assert values(source.poll()) == {(POWER, "redfish"): 344.0}
    assert bmc.logins() == 2


def test_a_session_refused_twice_fails_without_looping(
    bmc: FakeRedfish, credentials: Path, caplog: pytest.LogCaptureFixture
) -> None:
    credentials.write_text(f"{USER}\nwrong-password\n")
    runner = SourceRunner(make_source(bmc.url, credentials), 30)
    with caplog.at_level(logging.DEBUG):
        state = runner.poll_once()
    assert state.up is False
    assert "refused the session login (HTTP 401)" in state.reason
    assert bmc.logins() == 1
    assert "wrong-password" not in caplog.text + state.reason


def test_basic_auth(credentials: Path) -> None:
    service = FakeRedfish(auth="basic").start()
    try:
        source = make_source(service.url, credentials, auth="basic")
        assert values(source.poll()) == {(POWER, "redfish"): 344.0}
        assert service.logins() == 0
    finally:
        service.stop()


def test_credentials_never_reach_the_log_or_the_status(
    bmc: FakeRedfish, credentials: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = SourceRunner(make_source(bmc.url, credentials), 30)
    with caplog.at_level(logging.DEBUG):
        runner.poll_once()
        bmc.restart()
        runner.poll_once()
        bmc.stop()
        runner.poll_once()
    text = caplog.text + runner.state.reason + repr(runner.source.config)
    assert PASSWORD not in text
    assert not any(token in text for token in bmc.tokens)


def test_an_unreadable_credentials_file_names_the_file_only(bmc: FakeRedfish, tmp_path: Path):
    missing = tmp_path / "nope"
    runner = SourceRunner(make_source(bmc.url, missing), 30)
    assert "cannot read the credentials file" in runner.poll_once().reason


# --- a BMC that stops answering ------------------------------------------------------------


def test_a_hung_bmc_times_out(bmc: FakeRedfish, credentials: Path) -> None:
    source = make_source(bmc.url, credentials, clock=FakeClock(), timeout="500ms")
    source.poll()
    bmc.hang()
    started = time.monotonic()
    with pytest.raises(PartialReading, match=r"did not answer GET .* within 0\.5s"):
        source.poll()
    assert time.monotonic() - started < 5


def test_a_silent_bmc_keeps_its_reading_until_stale_then_none(
    bmc: FakeRedfish, credentials: Path
) -> None:
    clock = FakeClock()
    runner = SourceRunner(make_source(bmc.url, credentials, clock, stale_after="90s"), 30)
    assert runner.poll_once().up
    bmc.stop()  # connection refused from now on
    clock.now += 30
    held = runner.poll_once()
    assert held.up is False
    assert [(s.metric, s.value) for s in held.samples] == [(POWER, 344.0)]
    assert "cannot reach the BMC" in held.reason
    assert "serving the last reading until it is 90s old" in held.reason
    clock.now += 60  # 90 s old: still served
    assert runner.poll_once().samples
    clock.now += 1
    gone = runner.poll_once()
    assert (gone.up, gone.samples) == (False, ())
    assert "serving the last reading" not in gone.reason


def test_a_reason_that_does_not_change_is_logged_once(
    bmc: FakeRedfish, credentials: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = SourceRunner(make_source(bmc.url, credentials), 30)
    bmc.stop()
    with caplog.at_level(logging.INFO):
        for _ in range(3):
            runner.poll_once()
    assert caplog.text.count("source redfish failing") == 1


# --- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"url": "https://bmc", "interval": "10s"}, "shorter than 30s"),
        ({"url": "https://bmc"}, "auth session needs a credentials_file"),
        ({"url": "https://admin:pw@bmc", "auth": "none"}, "never in the url"),
        ({"url": "bmc.example", "auth": "none"}, "not an http"),
        ({"url": "https://bmc", "auth": "none", "timeout": "30s"}, "must be shorter"),
    ],
)
def test_config_refusals(keys: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RedfishConfig.model_validate(keys)
