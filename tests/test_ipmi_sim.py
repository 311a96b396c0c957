"""ipmi source, out-of-band, against a real BMC simulator: OpenIPMI's `ipmi_sim` on a
loopback UDP port, read over IPMI 2.0 (RMCP+, `lanplus`) by the real ipmitool and the real
FreeIPMI tools (tests/ipmi_sim_helpers.py).

ipmi_sim has no DCMI, so its node power is an SDR sensor in Watts (`power_sensor`); the
first tests say so. Faults come from the same simulator: stopped (a BMC that does not
answer), a wrong password, a reading that stops changing. Each reads the source down with
its reason; none ever gives a zero.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from exporter.poller import SourceRunner, SourceState
from exporter.sources import ipmi
from exporter.sources.ipmi import IpmiConfig, IpmiSource
from tests.exporter_helpers import serving_exporter
from tests.ipmi_sim_helpers import (
    INLET_SENSOR,
    PASSWORD,
    SimulatedBmc,
    binary,
    running_bmc,
)

pytestmark = pytest.mark.servers

POWER = "llmgw_node_power_watts"
INLET = "llmgw_node_inlet_temperature_celsius"
#: FreeIPMI's power tool names the family; its SDR tool, ipmi-sensors, is found beside it.
TOOLS = ("ipmitool", "ipmi-dcmi")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def bmc(tmp_path: Path) -> Iterator[SimulatedBmc]:
    with running_bmc(tmp_path / "bmc") as simulated:
        yield simulated


def runner(
    bmc: SimulatedBmc, tool: str, clock: FakeClock | None = None, **keys: object
) -> SourceRunner:
    config = IpmiConfig.model_validate(bmc.source_keys(tool, **keys))
    # No sysfs: out-of-band, the source never looks for an in-band device.
    source = IpmiSource(Path("/nonexistent-sysfs"), config, clock or FakeClock())
    return SourceRunner(source, config.effective_interval)


def values(state: SourceState) -> dict[str, float]:
    return {sample.metric: sample.value for sample in state.samples}


# --- readings ----------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_the_power_and_inlet_sensors_over_the_lan(bmc: SimulatedBmc, tool: str) -> None:
    poller = runner(bmc, tool)
    state = poller.poll_once()
    assert (state.up, state.reason) == (True, "")
    assert values(state) == {POWER: 332.0, INLET: 23.0}
    assert [s.labels for s in state.samples] == [
        {"source": "ipmi"},
        {"chip": "ipmi", "sensor": INLET_SENSOR},
    ]
    bmc.set_power(1004)  # the BMC's reading moves: the source follows it
    assert values(poller.poll_once()) == {POWER: 1004.0, INLET: 23.0}
    poller.source.close()


@pytest.mark.parametrize("tool", TOOLS)
def test_a_bmc_at_an_ipv6_address(tmp_path: Path, tool: str) -> None:
    with running_bmc(tmp_path / "bmc6", watts=996, address="::1") as bmc6:
        state = runner(bmc6, tool).poll_once()
    assert (state.up, values(state)) == (True, {POWER: 996.0, INLET: 23.0})


@pytest.mark.parametrize("tool", TOOLS)
def test_the_password_is_in_no_argv(
    bmc: SimulatedBmc, tool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    popen = subprocess.Popen

    def recording(argv: list[str], *args: object, **kwargs: object) -> subprocess.Popen[str]:
        started.append(list(argv))
        return popen(argv, *args, **kwargs)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(ipmi.subprocess, "Popen", recording)
    state = runner(bmc, tool).poll_once()
    assert values(state) == {POWER: 332.0, INLET: 23.0}
    assert started, "the tool was run"
    assert not [argv for argv in started if any(PASSWORD in word for word in argv)]


def test_freeipmi_keeps_its_sdr_cache_in_a_directory_of_its_own(bmc: SimulatedBmc) -> None:
    poller = runner(bmc, "ipmi-dcmi")
    assert poller.poll_once().up
    cache = poller.source._sdr_cache  # type: ignore[attr-defined]
    assert cache is not None and os.listdir(cache)
    poller.source.close()
    assert not os.path.exists(cache)


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        # ipmi_sim has no DCMI handler; below admin its privilege table answers first.
        ("ipmitool", "DCMI request failed because: Insufficient privilege level (d4)"),
        ("ipmi-dcmi", "ipmi_cmd_dcmi_get_power_reading: privilege level insufficient"),
    ],
)
def test_ipmi_sim_does_not_answer_dcmi_power(bmc: SimulatedBmc, tool: str, words: str) -> None:
    """Why the tests read a power sensor: DCMI `Get Power Reading` fails on ipmi_sim."""
    state = runner(bmc, tool, power_sensor=None, inlet=False).poll_once()
    assert (state.up, state.failure, state.samples) == (False, "error", ())
    assert state.reason.endswith(words)


@pytest.mark.parametrize("tool", TOOLS)
def test_a_sensor_the_bmc_does_not_have_reads_down(bmc: SimulatedBmc, tool: str) -> None:
    state = runner(bmc, tool, power_sensor="PSU1 Input Power").poll_once()
    assert (state.up, state.samples) == (False, ())
    assert state.reason == "IpmiToolError: the BMC's SDR has no sensor named 'PSU1 Input Power'"


# --- faults ------------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_a_bmc_that_stops_answering_reads_down_then_loses_its_series(
    bmc: SimulatedBmc, tool: str
) -> None:
    clock = FakeClock()
    poller = runner(bmc, tool, clock, timeout="3s")
    assert values(poller.poll_once()) == {POWER: 332.0, INLET: 23.0}
    bmc.stop()
    clock.now += 30
    held = poller.poll_once()
    name = "ipmitool" if tool == "ipmitool" else "ipmi-sensors"
    assert (held.up, held.failure) == (False, "partial")
    assert held.reason == (
        f"{name} did not answer within 3s and was killed;"
        " serving the last reading until it is 90s old"
    )
    assert values(held) == {POWER: 332.0, INLET: 23.0}  # the last reading, not a zero
    clock.now += 61  # 91 s after the reading
    gone = poller.poll_once()
    assert (gone.up, gone.failure, gone.samples) == (False, "error", ())
    assert gone.reason == f"IpmiToolError: {name} did not answer within 3s and was killed"


@pytest.mark.parametrize(
    ("tool", "words"),
    [
        (
            "ipmitool",
            "ipmitool exited with status 1: Error: Unable to establish IPMI v2 / RMCP+ session",
        ),
        # FreeIPMI names itself by its argv[0], the path the source found.
        (
            "ipmi-dcmi",
            f"ipmi-sensors exited with status 1: {binary('ipmi-sensors')}: password invalid",
        ),
    ],
)
def test_a_wrong_password_reads_down_with_no_series(
    bmc: SimulatedBmc, tool: str, words: str, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-password"
    bmc.password_file.write_text(wrong + "\n")
    with caplog.at_level(logging.INFO):
        state = runner(bmc, tool).poll_once()
    assert (state.up, state.failure, state.samples) == (False, "error", ())
    assert state.reason == f"IpmiToolError: {words}"
    assert wrong not in caplog.text and PASSWORD not in caplog.text


@pytest.mark.parametrize("tool", TOOLS)
def test_a_password_file_fixed_is_read_at_the_next_poll(bmc: SimulatedBmc, tool: str) -> None:
    bmc.password_file.unlink()
    poller = runner(bmc, tool)
    missing = poller.poll_once()
    assert (missing.up, missing.samples) == (False, ())
    assert missing.reason == (
        f"IpmiToolError: cannot read the password file {bmc.password_file}:"
        " No such file or directory"
    )
    bmc.password_file.write_text(PASSWORD + "\n")
    assert values(poller.poll_once()) == {POWER: 332.0, INLET: 23.0}


@pytest.mark.parametrize("tool", TOOLS)
def test_a_reading_that_stops_changing_reads_down_and_serves_nothing(
    bmc: SimulatedBmc, tool: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    poller = runner(bmc, tool, clock, frozen_after="60s")
    assert values(poller.poll_once()) == {POWER: 332.0, INLET: 23.0}
    clock.now += 30
    assert poller.poll_once().up  # the same for 30 s: an idle node may
    clock.now += 30
    with caplog.at_level(logging.INFO):
        frozen = poller.poll_once()
        clock.now += 30
        still = poller.poll_once()
    assert (frozen.up, frozen.failure, frozen.samples) == (False, "error", ())
    assert frozen.reason == (
        "FrozenReading: the power reading has stayed at 332 W for 60s (frozen_after):"
        " the BMC no longer updates it"
    )
    assert (still.up, still.samples, still.reason) == (False, (), frozen.reason)
    assert caplog.text.count("source ipmi failing") == 1  # once, not once a poll
    bmc.set_power(336)
    clock.now += 30
    moved = poller.poll_once()
    assert (moved.up, values(moved)) == (True, {POWER: 336.0, INLET: 23.0})


@pytest.mark.parametrize("tool", TOOLS)
def test_a_reading_that_keeps_changing_is_never_frozen(bmc: SimulatedBmc, tool: str) -> None:
    clock = FakeClock()
    poller = runner(bmc, tool, clock, frozen_after="60s")
    for watts in (332, 336, 332, 336, 332):
        bmc.set_power(watts)
        state = poller.poll_once()
        assert (state.up, values(state)[POWER]) == (True, float(watts))
        clock.now += 30


# --- the exporter process, end to end ----------------------------------------------------


#: The sources that read the machine the exporter runs on (`units` is off unless set).
HOST_SOURCES = ("gpu", "hwmon", "rapl", "cpuinfo", "redfish", "cray", "hwmon_power")


def agent_yaml(path: Path, bmc: SimulatedBmc) -> Path:
    keys = bmc.source_keys("ipmitool")
    lines = [
        "node: gpu-r12-07-03",
        "labels: {llmgw.io/rack: r12-07}",
        "bmc_includes_gpus: true",
        "sources:",
        "  ipmi:",
        *(f"    {key}: {json.dumps(value)}" for key, value in keys.items()),
        # An exporter beside the BMC, not on its node: the host's own sensors stay out.
        *(f"  {name}: {{enabled: false}}" for name in HOST_SOURCES),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_exporter_serves_the_bmcs_power_over_the_lan(bmc: SimulatedBmc, tmp_path: Path) -> None:
    agent = agent_yaml(tmp_path / "agent.yaml", bmc)
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    log = tmp_path / "exporter.log"
    args = ["--config", str(agent), "--sysfs", str(sysfs)]

    def ready(body: str) -> bool:
        return 'llmgw_exporter_source_up{node="gpu-r12-07-03",source="ipmi"}' in body

    with serving_exporter(args, os.environ, log, ready) as url:
        body = requests.get(f"{url}/metrics", timeout=10).text
    assert 'llmgw_node_power_watts{node="gpu-r12-07-03",source="ipmi"} 332.0' in body
    inlet = (
        'llmgw_node_inlet_temperature_celsius{chip="ipmi",node="gpu-r12-07-03",sensor="Inlet Temp"}'
    )
    assert f"{inlet} 23.0" in body
    assert 'llmgw_node_power_includes_gpus{node="gpu-r12-07-03",source="ipmi"} 1.0' in body
    assert 'llmgw_exporter_source_up{node="gpu-r12-07-03",source="ipmi"} 1.0' in body
    assert PASSWORD not in log.read_text()


def test_the_exporter_with_a_stopped_bmc_serves_no_power(bmc: SimulatedBmc, tmp_path: Path) -> None:
    agent = agent_yaml(tmp_path / "agent.yaml", bmc)
    bmc.stop()
    sysfs = tmp_path / "sys"
    sysfs.mkdir()
    log = tmp_path / "exporter.log"
    args = ["--config", str(agent), "--sysfs", str(sysfs)]

    def ready(body: str) -> bool:
        return 'llmgw_exporter_source_up{node="gpu-r12-07-03",source="ipmi"}' in body

    with serving_exporter(args, os.environ, log, ready) as url:
        body = requests.get(f"{url}/metrics", timeout=10).text
    assert 'llmgw_exporter_source_up{node="gpu-r12-07-03",source="ipmi"} 0.0' in body
    assert (
        'llmgw_exporter_source_failing{node="gpu-r12-07-03",reason="error",source="ipmi"} 1.0'
        in body
    )
    assert "llmgw_node_power_watts{" not in body
    assert (
        "source ipmi failing: IpmiToolError: ipmitool did not answer within 5s" in log.read_text()
    )


def test_no_sample_is_a_zero(bmc: SimulatedBmc) -> None:
    """The sensor reads 0 W (a BMC with the host off): absent, never a zero."""
    bmc.set_power(0)
    state = runner(bmc, "ipmitool").poll_once()
    assert state.up
    assert [s for s in state.samples if s.metric == POWER] == []
    assert values(state) == {INLET: 23.0}
