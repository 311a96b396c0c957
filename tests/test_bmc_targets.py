"""One exporter for a rack of BMCs: `bmcs` in agent.yaml, each BMC probed as its own target
(`/bmc?target=NODE`, exporter/bmc_probe.py), the snmp_exporter / ipmi_exporter pattern.

Real BMCs on loopback: three OpenIPMI `ipmi_sim` simulators on UDP ports of their own, each
reading its own power and inlet (tests/ipmi_sim_helpers.py), read over RMCP+ by the real
ipmitool; and DMTF's rack-server mockup served by the real `sushy-static` over HTTPS with
this run's CA (tests/redfish_helpers.py), read by the redfish source. One real exporter
process lists the four of them in agent.yaml's `bmcs`, and its host's own sources are off.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter import config as agent_config
from exporter.bmc_probe import BmcProbes
from exporter.config import BmcTarget
from exporter.sources import SOURCES
from llmgw_common.yamlfile import ConfigError
from tests.exporter_helpers import serving_exporter
from tests.ipmi_sim_helpers import SimulatedBmc, binary, running_bmc
from tests.redfish_helpers import MOCKUP as REDFISH_MOCKUP
from tests.redfish_helpers import SushyStatic, make_pki, serving_sushy_static

pytestmark = pytest.mark.servers

HOST = "bmc-reader-r12"  # the exporter's own node: the host that reads the BMCs
#: node → (watts, °C, rack) each simulated BMC reads (the sensor's 4 W steps).
IPMI_NODES = {
    "gpu-r12-07-01": (332, 23, "r12-07"),
    "gpu-r12-07-02": (504, 25, "r12-07"),
    "gpu-r12-08-01": (1004, 27, "r12-08"),
}
REDFISH_NODE = "gpu-r12-08-02"
#: The mockup's own figures (tests/test_redfish_sushy.py MOCKUP_FIGURES): EnvironmentMetrics
#: PowerWatts 374 W, ThermalMetrics' intake 24.8 °C.
REDFISH_FIGURES = (374.0, 24.8)
IPMI_TIMEOUT = "3s"


def source_keys(bmc: SimulatedBmc, **keys: object) -> dict[str, object]:
    """`ipmi:` for this BMC through ipmitool, `keys` set over the helper's."""
    return {**bmc.source_keys("ipmitool", timeout=IPMI_TIMEOUT), **keys}


def agent_yaml(path: Path, bmcs: dict[str, dict[str, object]]) -> Path:
    """An exporter beside the BMCs: the host's own sources off, the BMCs in `bmcs`."""
    document = {
        "node": HOST,
        "sources": {name: {"enabled": False} for name in SOURCES},
        "bmcs": bmcs,
    }
    path.write_text(json.dumps(document, indent=2, default=str) + "\n")  # JSON is YAML
    return path


def ipmi_target(bmc: SimulatedBmc, rack: str, **keys: object) -> dict[str, object]:
    return {
        "labels": {"llmgw.io/site": "sto1", "llmgw.io/rack": rack},
        "bmc_includes_gpus": True,
        "ipmi": source_keys(bmc, **keys),
    }


@dataclass
class Rack:
    url: str  # the exporter's
    bmcs: dict[str, SimulatedBmc]
    sushy: SushyStatic
    log: Path

    def probe(self, target: str) -> requests.Response:
        return requests.get(f"{self.url}/bmc", params={"target": target}, timeout=30)


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(metric, sorted labels): value} of an exposition."""
    out = {}
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(body: str, metric: str, **labels: str) -> float | None:
    found = samples(body).get((metric, tuple(sorted(labels.items()))))
    return found


@pytest.fixture(scope="module")
def rack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rack]:
    tmp = tmp_path_factory.mktemp("rack")
    pki = make_pki(tmp)
    credentials = tmp / "redfish-credentials"
    credentials.write_text("llmgw\nsecret\n")
    with ExitStack() as stack:
        bmcs = {
            node: stack.enter_context(running_bmc(tmp / node, watts=watts, celsius=celsius))
            for node, (watts, celsius, _) in IPMI_NODES.items()
        }
        sushy = stack.enter_context(serving_sushy_static(REDFISH_MOCKUP, pki, tmp))
        targets: dict[str, dict[str, object]] = {
            node: ipmi_target(bmcs[node], rack) for node, (_, _, rack) in IPMI_NODES.items()
        }
        targets[REDFISH_NODE] = {
            "labels": {"llmgw.io/site": "sto1", "llmgw.io/rack": "r12-08"},
            "bmc_includes_gpus": False,
            "redfish": {
                "url": sushy.url,
                "auth": "basic",
                "credentials_file": str(credentials),
                "tls_verify": str(pki["ca"]),
                "timeout": "5s",
            },
        }
        agent = agent_yaml(tmp / "agent.yaml", targets)
        sysfs = tmp / "sys"
        sysfs.mkdir()
        log = tmp / "exporter.log"
        args = ["--config", str(agent), "--sysfs", str(sysfs)]
        url = stack.enter_context(
            serving_exporter(args, os.environ, log, lambda body: "llmgw_node_info" in body)
        )
        yield Rack(url, bmcs, sushy, log)


# --- each BMC its own target -------------------------------------------------------------


def test_each_target_answers_its_own_bmcs_figures_as_its_node(rack: Rack) -> None:
    for node, (watts, celsius, rack_name) in IPMI_NODES.items():
        answer = rack.probe(node)
        assert answer.status_code == 200, answer.text
        assert answer.headers["Content-Type"].startswith("text/plain")
        body = answer.text
        assert samples(body)[("llmgw_node_power_watts", (("node", node), ("source", "ipmi")))] == (
            watts
        )
        inlet = (("chip", "ipmi"), ("node", node), ("sensor", "Inlet Temp"))
        assert samples(body)[("llmgw_node_inlet_temperature_celsius", inlet)] == celsius
        info = (("node", node), ("rack", rack_name), ("room", ""), ("row", ""), ("site", "sto1"))
        assert samples(body)[("llmgw_node_info", info)] == 1
        includes = (("node", node), ("source", "ipmi"))
        assert samples(body)[("llmgw_node_power_includes_gpus", includes)] == 1
        assert value(body, "llmgw_exporter_source_up", node=node, source="ipmi") == 1
        # That node's exposition only: no other node, no other source, not the host.
        assert {dict(labels)["node"] for _, labels in samples(body)} == {node}
        assert {
            dict(labels).get("source") for _, labels in samples(body) if dict(labels).get("source")
        } == {"ipmi"}


def test_a_redfish_target_answers_the_mockups_figures(rack: Rack) -> None:
    body = rack.probe(REDFISH_NODE).text
    power, intake = REDFISH_FIGURES
    assert value(body, "llmgw_node_power_watts", node=REDFISH_NODE, source="redfish") == power
    assert (
        value(
            body,
            "llmgw_node_inlet_temperature_celsius",
            chip="redfish",
            node=REDFISH_NODE,
            sensor="Intake",
        )
        == intake
    )
    assert value(body, "llmgw_node_power_includes_gpus", node=REDFISH_NODE, source="redfish") == 0
    assert value(body, "llmgw_exporter_source_up", node=REDFISH_NODE, source="redfish") == 1
    assert {dict(labels)["node"] for _, labels in samples(body)} == {REDFISH_NODE}


def test_the_exporters_own_metrics_carry_no_bmc(rack: Rack) -> None:
    body = requests.get(f"{rack.url}/metrics", timeout=10).text
    nodes = {dict(labels).get("node") for _, labels in samples(body)} - {None}
    assert nodes == {HOST}
    assert value(body, "llmgw_node_power_watts", node=HOST, source="ipmi") is None


def test_an_unknown_target_is_404_with_the_known_ones_and_no_target_400(rack: Rack) -> None:
    unknown = rack.probe("gpu-r99-01-01")
    assert unknown.status_code == 404
    listed = ", ".join(sorted([*IPMI_NODES, REDFISH_NODE]))
    assert unknown.text == (
        f"unknown target 'gpu-r99-01-01': not a node of agent.yaml's bmcs ({listed})\n"
    )
    missing = requests.get(f"{rack.url}/bmc", timeout=10)
    assert (missing.status_code, missing.text) == (400, "ask for one BMC: /bmc?target=NODE\n")
    assert rack.probe(next(iter(IPMI_NODES))).status_code == 200  # the process is fine


# --- one BMC stopped ---------------------------------------------------------------------


def test_a_stopped_bmc_reads_only_its_own_target_down(rack: Rack) -> None:
    silent, *others = IPMI_NODES
    for node in IPMI_NODES:
        assert value(rack.probe(node).text, "llmgw_exporter_source_up", node=node, source="ipmi")
    rack.bmcs[silent].stop()
    try:
        body = rack.probe(silent).text
        assert value(body, "llmgw_exporter_source_up", node=silent, source="ipmi") == 0
        failing = value(
            body, "llmgw_exporter_source_failing", node=silent, reason="partial", source="ipmi"
        )
        assert failing == 1  # down, its last reading held until stale_after: never a zero
        assert value(body, "llmgw_node_power_watts", node=silent, source="ipmi") == 332
        for node in others:
            other = rack.probe(node).text
            assert value(other, "llmgw_exporter_source_up", node=node, source="ipmi") == 1
            assert value(other, "llmgw_exporter_source_failing", node=node, source="ipmi") is None
        redfish = rack.probe(REDFISH_NODE).text
        assert value(redfish, "llmgw_exporter_source_up", node=REDFISH_NODE, source="redfish") == 1
        rack.bmcs[silent].start()
        back = rack.probe(silent).text
        assert value(back, "llmgw_exporter_source_up", node=silent, source="ipmi") == 1
    finally:
        if rack.bmcs[silent].process is None:  # left stopped by a failed check
            rack.bmcs[silent].start()
    # Many BMCs share the exporter's log: each line names the node.
    log = rack.log.read_text()
    assert (
        f"BMC {silent} (ipmi) failing: ipmitool did not answer within 3s and was killed;"
        " serving the last reading until it is 90s old"
    ) in log
    assert f"BMC {silent} (ipmi) recovered" in log


# --- never two reads of one BMC at once -------------------------------------------------


SLOW_TOOL = """\
#!/bin/sh
# ipmitool, logged: when each run began and ended, and a second's wait inside it.
echo "begin $(date +%s.%N)" >> {log}
sleep 1
{ipmitool} "$@"
status=$?
echo "end $(date +%s.%N)" >> {log}
exit $status
"""


def test_concurrent_probes_of_one_target_never_read_it_twice_at_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs.log"
    tool = tmp_path / "slow-ipmitool"
    tool.write_text(SLOW_TOOL.format(log=runs, ipmitool=binary("ipmitool")))
    tool.chmod(0o755)
    with running_bmc(tmp_path / "bmc") as bmc:
        target = ipmi_target(bmc, "r12-07", tool=str(tool), format="ipmitool")
        agent = agent_yaml(tmp_path / "agent.yaml", {"gpu-r12-07-01": target})
        sysfs = tmp_path / "sys"
        sysfs.mkdir()
        args = ["--config", str(agent), "--sysfs", str(sysfs)]
        log = tmp_path / "exporter.log"
        with serving_exporter(args, os.environ, log, lambda body: "llmgw_node_info" in body) as url:
            answers: list[requests.Response] = []
            start = threading.Barrier(6)

            def probe() -> None:
                start.wait()
                answer = requests.get(f"{url}/bmc", params={"target": "gpu-r12-07-01"}, timeout=60)
                answers.append(answer)

            threads = [threading.Thread(target=probe) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=90)
    assert [answer.status_code for answer in answers] == [200] * 6
    for answer in answers:
        assert value(answer.text, "llmgw_node_power_watts", node="gpu-r12-07-01", source="ipmi")
    events = [line.split() for line in runs.read_text().splitlines()]
    # One run at a time: each begins after the one before it ended.
    assert [kind for kind, _ in events] == ["begin", "end"] * (len(events) // 2)
    times = [float(at) for _, at in events]
    assert times == sorted(times)
    # Six probes at once: the first one's read, and at most one more, which every probe
    # that asked while the first ran waited for and shares; never one each.
    assert 1 <= len(events) // 2 <= 2


# --- frozen_after, judged per target across probes ---------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def wsgi_probe(probes: BmcProbes, target: str) -> str:
    """The body of `/bmc?target=TARGET`, asked of the WSGI app in this process."""
    statuses: list[str] = []
    environ: dict[str, object] = {"QUERY_STRING": urlencode({"target": target})}
    body = b"".join(probes.app(environ, lambda status, headers: statuses.append(status)))
    assert statuses == ["200 OK"], body
    return body.decode()


def test_a_frozen_reading_is_judged_per_target_across_probes(tmp_path: Path) -> None:
    """Each target keeps its source between probes: a reading the same for `frozen_after`
    over several probes reads that target down, and only that one (the clock is the
    sources', moved by the test; the BMCs are real)."""
    clock = FakeClock()
    with running_bmc(tmp_path / "a") as first, running_bmc(tmp_path / "b") as second:
        targets = {
            node: BmcTarget.model_validate(ipmi_target(bmc, "r12-07", frozen_after="60s"))
            for node, bmc in (("gpu-a", first), ("gpu-b", second))
        }
        probes = BmcProbes(targets, Path("/nonexistent-sysfs"), clock)
        try:
            for _ in range(2):  # 332 W at 0 s and at 30 s: an idle node may
                body = wsgi_probe(probes, "gpu-a")
                assert value(body, "llmgw_node_power_watts", node="gpu-a", source="ipmi") == 332
                assert value(body, "llmgw_exporter_source_up", node="gpu-a", source="ipmi") == 1
                clock.now += 30
            frozen = wsgi_probe(probes, "gpu-a")  # 60 s the same: frozen
            assert value(frozen, "llmgw_exporter_source_up", node="gpu-a", source="ipmi") == 0
            assert value(frozen, "llmgw_node_power_watts", node="gpu-a", source="ipmi") is None
            # The other BMC reads the same 332 W, first read now: its own judgement.
            other = wsgi_probe(probes, "gpu-b")
            assert value(other, "llmgw_exporter_source_up", node="gpu-b", source="ipmi") == 1
            assert value(other, "llmgw_node_power_watts", node="gpu-b", source="ipmi") == 332
            first.set_power(336)
            clock.now += 30
            moved = wsgi_probe(probes, "gpu-a")
            assert value(moved, "llmgw_exporter_source_up", node="gpu-a", source="ipmi") == 1
            assert value(moved, "llmgw_node_power_watts", node="gpu-a", source="ipmi") == 336
        finally:
            probes.close()


# --- agent.yaml's bmcs -------------------------------------------------------------------


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_bmcs_are_checked_as_the_sources_are_each_at_its_line(tmp_path: Path) -> None:
    password = write(tmp_path / "pw", "secret\n")
    agent = write(
        tmp_path / "agent.yaml",
        f"""\
node: {HOST}
bmcs:
  gpu-1:
    ipmi: {{port: 623, user: llmgw, password_file: {password}}}
  gpu-2:
    ipmi: {{host: 10.0.0.2, user: llmgw, password_file: {password}, interval: 10s}}
  gpu-3:
    labels: {{llmgw.io/rack: r1}}
  gpu-4:
    redfish: {{url: "https://10.0.0.4", auth: none}}
    ipmi: {{host: 10.0.0.4, user: llmgw, password_file: {password}}}
  gpu-5:
    redfish: {{url: "https://10.0.0.5", auth: none, typo: 1}}
  gpu-6:
    ipmi: {{port: 623}}
""",
    )
    with pytest.raises(ConfigError) as refused:
        agent_config.load(agent)
    one_of = "Value error, set one of ipmi (with host) or redfish (with url): the BMC's way in"
    assert str(refused.value).splitlines() == [
        f"{agent}:4: bmcs.gpu-1.ipmi: Value error, user and password_file without host:"
        " set host to read a BMC over the LAN",
        f"{agent}:6: bmcs.gpu-2.ipmi.interval: Value error, 10s is shorter than 30s: a BMC"
        " polled faster answers late or not at all",
        f"{agent}:8: bmcs.gpu-3: {one_of}",
        f"{agent}:10: bmcs.gpu-4: {one_of}",
        f"{agent}:13: bmcs.gpu-5.redfish.typo: Extra inputs are not permitted",
        f"{agent}:15: bmcs.gpu-6: Value error, ipmi needs host: a BMC target is read over the"
        " LAN, not in-band",
    ]


def test_bmcs_in_a_file_of_their_own(tmp_path: Path) -> None:
    password = write(tmp_path / "pw", "secret\n")
    write(
        tmp_path / "bmcs.yaml",
        f"""\
bmcs:
  gpu-1:
    labels: {{llmgw.io/rack: r1}}
    bmc_includes_gpus: true
    ipmi: {{host: 10.0.0.1, user: llmgw, password_file: {password}, power_sensor: Pwr}}
""",
    )
    agent = write(tmp_path / "agent.yaml", f"node: {HOST}\nbmcs_file: bmcs.yaml\n")
    loaded = agent_config.load(agent)
    assert isinstance(loaded.bmcs, dict)
    target = loaded.bmcs["gpu-1"]
    assert (target.labels.rack, target.bmc_includes_gpus) == ("r1", True)
    name, section = target.source
    assert (name, getattr(section, "host", None)) == ("ipmi", "10.0.0.1")
    write(tmp_path / "bmcs.yaml", "bmcs:\n  gpu-1: {}\n")
    with pytest.raises(ConfigError) as refused:
        agent_config.load(agent)
    assert "bmcs.yaml" in str(refused.value)
