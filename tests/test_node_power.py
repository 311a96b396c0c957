"""What the whole-node power sources share: the collector's rules, agent.yaml's flag, the hold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter import config as agent_config
from exporter.collector import ExporterCollector
from exporter.config import AgentConfig
from exporter.poller import SourceRunner
from exporter.samples import PartialReading, Sample
from exporter.sources.base import Source, SourceConfig
from exporter.sources.bmc import LastReading
from llmgw_common.yamlfile import ConfigError

INLET = "llmgw_node_inlet_temperature_celsius"
POWER = "llmgw_node_power_watts"


class Fixed(Source):
    """A source that reads the same samples at every poll."""

    default_interval = 1.0

    def __init__(self, name: str, samples: list[Sample], defer: dict[str, str] | None = None):
        super().__init__(Path("/nonexistent"), SourceConfig())
        self.name = name  # type: ignore[misc]
        self.samples = samples
        if defer is not None:
            self.defer = defer  # type: ignore[misc]

    def poll(self) -> list[Sample]:
        return list(self.samples)


class Bmc(Fixed):
    defer: ClassVar[dict[str, str]] = {INLET: "hwmon"}


def scrape(config: AgentConfig, *sources: Source) -> list[str]:
    runners = [SourceRunner(source, 1) for source in sources]
    for runner in runners:
        runner.poll_once()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(config, runners))
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith(("llmgw_node_inlet", "llmgw_node_power"))
    ]


def inlet(chip: str, value: float) -> Sample:
    return Sample(INLET, value, {"chip": chip, "sensor": "Inlet Temp"})


def test_the_bmc_inlet_is_served_where_hwmon_has_none() -> None:
    lines = scrape(
        AgentConfig(node="n1"),
        Fixed("hwmon", [Sample("llmgw_node_cpu_temperature_celsius", 50, {"chip": "c"})]),
        Bmc("ipmi", [inlet("ipmi", 23)]),
    )
    assert lines == [
        'llmgw_node_inlet_temperature_celsius{chip="ipmi",node="n1",sensor="Inlet Temp"} 23.0'
    ]


def test_the_bmc_inlet_defers_to_hwmons() -> None:
    lines = scrape(
        AgentConfig(node="n1"),
        Bmc("ipmi", [inlet("ipmi", 23)]),
        Fixed("hwmon", [inlet("platform_nct6775_656", 25)]),
    )
    assert lines == [
        'llmgw_node_inlet_temperature_celsius{chip="platform_nct6775_656",node="n1",'
        'sensor="Inlet Temp"} 25.0'
    ]


def test_the_bmc_inlet_is_served_when_hwmon_is_disabled() -> None:
    assert len(scrape(AgentConfig(node="n1"), Bmc("redfish", [inlet("redfish", 23)]))) == 1


@pytest.mark.parametrize(("flag", "value"), [(True, "1.0"), (False, "0.0")])
def test_the_declared_flag_sits_beside_each_node_power(flag: bool, value: str) -> None:
    lines = scrape(
        AgentConfig(node="n1", bmc_includes_gpus=flag),
        Fixed("ipmi", [Sample(POWER, 410, {"source": "ipmi"})]),
        Fixed(
            "cray",
            [
                Sample(POWER, 1210, {"source": "cray"}),
                Sample("llmgw_node_power_includes_gpus", 1, {"source": "cray"}),
            ],
        ),
    )
    assert lines == [
        'llmgw_node_power_includes_gpus{node="n1",source="cray"} 1.0',  # the PMC says itself
        f'llmgw_node_power_includes_gpus{{node="n1",source="ipmi"}} {value}',
        'llmgw_node_power_watts{node="n1",source="ipmi"} 410.0',
        'llmgw_node_power_watts{node="n1",source="cray"} 1210.0',
    ]


def test_an_undeclared_flag_is_absent() -> None:
    lines = scrape(AgentConfig(node="n1"), Fixed("ipmi", [Sample(POWER, 410, {"source": "ipmi"})]))
    assert lines == ['llmgw_node_power_watts{node="n1",source="ipmi"} 410.0']


def test_no_node_power_no_flag() -> None:
    assert scrape(AgentConfig(node="n1", bmc_includes_gpus=True)) == []


def test_agent_yaml_flag(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("bmc_includes_gpus: false\n")
    assert agent_config.load(path).bmc_includes_gpus is False
    path.write_text("node: n1\nbmc_includes_gpus: sometimes\n")
    with pytest.raises(
        ConfigError, match=r":2: bmc_includes_gpus: Input should be a valid boolean"
    ):
        agent_config.load(path)


def test_bmc_sections_in_agent_yaml(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        "sources:\n"
        "  ipmi: {interval: 1m, timeout: 5s, tool: ipmitool, inlet_sensor: Inlet Temp}\n"
        "  redfish: {url: 'https://10.1.2.3', credentials_file: /etc/llmgw/bmc, chassis: '1'}\n"
        "  cray: {enabled: false}\n"
        "  hwmon_power: {sensors: ['power_meter:Module Power Socket 0']}\n"
    )
    config = agent_config.load(path)
    assert config.interval("ipmi") == 60
    assert config.interval("redfish") == 30
    assert not config.source("cray").enabled
    path.write_text("sources:\n  ipmi: {interval: 10s}\n  redfish: {url: bmc}\n")
    with pytest.raises(ConfigError) as caught:
        agent_config.load(path)
    assert ":2: sources.ipmi.interval: Value error, 10s is shorter than 30s" in str(caught.value)
    assert ":3: sources.redfish.url: Value error, 'bmc' is not an http" in str(caught.value)


def test_last_reading_is_served_up_to_its_limit_and_not_after() -> None:
    now = [0.0]
    last = LastReading(90, lambda: now[0])
    reading = [Sample(POWER, 410, {"source": "ipmi"})]
    last.fresh(reading)
    now[0] = 90
    with pytest.raises(PartialReading) as held:
        last.failed(RuntimeError("BMC gone"))
    assert held.value.samples == reading
    now[0] = 90.5
    with pytest.raises(RuntimeError, match=r"^BMC gone$"):
        last.failed(RuntimeError("BMC gone"))
    now[0] = 91  # a dropped reading does not come back
    with pytest.raises(RuntimeError, match=r"^BMC gone$"):
        last.failed(RuntimeError("BMC gone"))


# --- the exporter process, every whole-node source at once ---------------------------------


def test_the_exporter_serves_each_node_power_source(tmp_path: Path) -> None:
    """`llmgw-exporter --once` over a node with IPMI, a Redfish BMC, Cray counters and hwmon."""
    from tests.fake_redfish import PASSWORD, USER, FakeRedfish
    from tests.node_power_helpers import EX_NODE, OUTPUTS, acpi_meter, write_tree

    sysfs = tmp_path / "sys"
    (sysfs / "class" / "ipmi" / "ipmi0").mkdir(parents=True)
    write_tree(sysfs, EX_NODE)
    acpi_meter(sysfs, 0, 431_000_000, None)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool = bin_dir / "ipmitool"
    tool.write_text(f'#!/bin/sh\nexec /bin/cat "{OUTPUTS / "ipmitool.stdout.txt"}"\n')
    tool.chmod(0o755)
    credentials = tmp_path / "bmc"
    credentials.write_text(f"{USER}\n{PASSWORD}\n")
    bmc = FakeRedfish().start()
    bmc.set(
        "/redfish/v1/Chassis/Chassis-1/Thermal",
        {"Temperatures": [{"Name": "Inlet Temp", "ReadingCelsius": 22}]},
    )
    agent = tmp_path / "agent.yaml"
    agent.write_text(
        "node: n1\n"
        "bmc_includes_gpus: true\n"
        "sources:\n"
        "  gpu: {enabled: false}\n"
        "  hwmon: {enabled: false}\n"
        "  rapl: {enabled: false}\n"
        f"  redfish: {{url: '{bmc.url}', credentials_file: '{credentials}', timeout: 5s}}\n"
    )
    environment = {**os.environ, "PATH": f"{bin_dir}"}
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "exporter",
                "--config",
                str(agent),
                "--sysfs",
                str(sysfs),
                "--once",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=environment,
        )
    finally:
        bmc.stop()
    assert result.returncode == 0, result.stderr
    lines = set(result.stdout.splitlines())
    for line in (
        'llmgw_node_power_watts{node="n1",source="ipmi"} 2578.0',
        'llmgw_node_power_watts{node="n1",source="redfish"} 344.0',
        'llmgw_node_power_watts{node="n1",source="cray"} 1210.0',
        'llmgw_node_power_watts{node="n1",source="hwmon_power"} 431.0',
        'llmgw_node_power_includes_gpus{node="n1",source="ipmi"} 1.0',
        'llmgw_node_power_includes_gpus{node="n1",source="redfish"} 1.0',
        'llmgw_node_power_includes_gpus{node="n1",source="cray"} 1.0',
        'llmgw_node_power_includes_gpus{node="n1",source="hwmon_power"} 1.0',
        # Counted from 0 at the exporter's start (exporter/energy.py).
        'llmgw_node_energy_joules_total{node="n1",source="cray"} 0.0',
        'llmgw_node_component_power_watts{component="accel3",node="n1"} 244.0',
        'llmgw_node_inlet_temperature_celsius{chip="redfish",node="n1",sensor="Inlet Temp"} 22.0',
    ):
        assert line in lines, f"{line} missing from:\n{result.stdout}"
    for source in ("ipmi", "redfish", "cray", "hwmon_power"):
        assert f'llmgw_exporter_source_up{{node="n1",source="{source}"}} 1.0' in lines
    assert PASSWORD not in result.stdout + result.stderr
    promtool = shutil.which("promtool", path=os.environ.get("PATH"))
    if promtool is None:
        pytest.fail("promtool is missing: `make test` installs Debian's prometheus package")
    check = subprocess.run(
        [promtool, "check", "metrics"],
        input=result.stdout,
        text=True,
        capture_output=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
