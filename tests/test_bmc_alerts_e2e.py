"""End to end: a rack's BMCs read by one exporter, each its own Prometheus target, and a BMC
that stops answering fires LlmgwExporterSourceDown for its node only (issue 19, "Tests").

Real processes on loopback ports the test picks:

    two OpenIPMI `ipmi_sim` BMCs (tests/ipmi_sim_helpers.py), read over RMCP+ by ipmitool
      → one llmgw exporter listing them in agent.yaml's `bmcs` (exporter/bmc_probe.py)
      → Prometheus, one job probing `/bmc?target=NODE` for each node, relabelled as
        docs/exporter.md shows (`__param_target`, `instance` = the node), evaluating every
        file of rules/ and alerts/ with every duration divided by FACTOR, as the demo runs
        them (llmgw_sim.demo.scale: LlmgwExporterSourceDown's 15 minutes become 45 s, its
        group's 1-minute interval 3 s).

The fault: one BMC's ipmi_sim is killed. Its target still answers (the exporter is up), and
its source reads down (`partial`: the last reading held until `stale_after`); the alert the
runbook names for a source down (docs/runbooks.md, LlmgwExporterSourceDown) fires for that
node, with the reason, and no alert fires for the other node, nor any other alert.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from exporter.sources import SOURCES
from llmgw_sim.demo.scale import scale_rules
from tests.exporter_helpers import serving_exporter
from tests.ipmi_sim_helpers import SimulatedBmc, running_bmc
from tests.promstack import Server, prometheus_with_config

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[1]
RULE_SOURCES = sorted((REPO / "rules").glob("*.yml")) + sorted((REPO / "alerts").glob("*.yml"))
#: The committed durations divided by this: the alert's 15 minutes are 45 s, its group's
#: interval 3 s, its "last success over 300 s ago" 15 s.
FACTOR = 20
#: A probe answers within the source's deadline (3 s: `timeout` 2 s, one ipmitool run),
#: inside the scrape timeout, so a silent BMC is a target that answers "down", never a
#: failed scrape.
SCRAPE_INTERVAL, SCRAPE_TIMEOUT = "5s", "4s"
#: Anything awaited: the alert needs its 45 s hold after the first evaluation that sees the
#: source down; a busy machine is given three times that and more.
DEADLINE_S = 240.0
SILENT, SPEAKING = "gpu-r12-07-01", "gpu-r12-07-02"
WATTS = {SILENT: 332, SPEAKING: 504}


def poll(condition: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(0.5)


def scaled_rules(directory: Path) -> list[Path]:
    """Every committed rule and alert file, its durations divided by FACTOR."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for source in RULE_SOURCES:
        copy = directory / f"{source.parent.name}-{source.name}"
        relative = str(source.relative_to(REPO))
        copy.write_text(scale_rules(source.read_text(), FACTOR, source=relative))
        written.append(copy)
    return written


def bmc_scrape_config(exporter: str, nodes: list[str]) -> dict[str, Any]:
    """The job docs/exporter.md gives a site: each node a target, probed on the exporter."""
    return {
        "job_name": "bmc",
        "scrape_interval": SCRAPE_INTERVAL,
        "scrape_timeout": SCRAPE_TIMEOUT,
        "metrics_path": "/bmc",
        "static_configs": [{"targets": nodes}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "target_label": "__param_target"},
            {"source_labels": ["__param_target"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": exporter},
        ],
    }


@contextmanager
def prometheus(workdir: Path, rules: list[Path], scrape: dict[str, Any]) -> Iterator[Server]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rules],
        "scrape_configs": [scrape],
    }
    with prometheus_with_config(workdir, config) as server:
        yield server


def query(engine: Server, promql: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{engine.url}/api/v1/query", params={"query": promql}, timeout=10)
    answer.raise_for_status()
    result: list[dict[str, Any]] = answer.json()["data"]["result"]
    return result


def by_node(engine: Server, promql: str) -> dict[str, float]:
    return {sample["metric"]["node"]: float(sample["value"][1]) for sample in query(engine, promql)}


def firing(engine: Server) -> list[dict[str, Any]]:
    alerts = requests.get(f"{engine.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    return [alert for alert in alerts if alert["state"] == "firing"]


@dataclass
class Rack:
    engine: Server
    bmcs: dict[str, SimulatedBmc]


@pytest.fixture
def rack(tmp_path: Path) -> Iterator[Rack]:
    with ExitStack() as stack:
        bmcs = {
            node: stack.enter_context(running_bmc(tmp_path / node, watts=watts))
            for node, watts in WATTS.items()
        }
        targets = {
            node: {
                "labels": {"llmgw.io/site": "sto1", "llmgw.io/rack": "r12-07"},
                "bmc_includes_gpus": True,
                "ipmi": {**bmc.source_keys("ipmitool"), "timeout": "2s", "deadline": "3s"},
            }
            for node, bmc in bmcs.items()
        }
        agent = tmp_path / "agent.yaml"
        document = {
            "node": "bmc-reader-r12",
            "sources": {name: {"enabled": False} for name in SOURCES},
            "bmcs": targets,
        }
        agent.write_text(json.dumps(document, indent=2))  # JSON is YAML
        sysfs = tmp_path / "sys"
        sysfs.mkdir()
        args = ["--config", str(agent), "--sysfs", str(sysfs)]
        log = tmp_path / "exporter.log"
        url = stack.enter_context(
            serving_exporter(args, os.environ, log, lambda body: "llmgw_node_info" in body)
        )
        scrape = bmc_scrape_config(url.removeprefix("http://"), list(WATTS))
        engine = stack.enter_context(
            prometheus(tmp_path / "prometheus", scaled_rules(tmp_path / "rules"), scrape)
        )
        yield Rack(engine, bmcs)


def test_a_bmc_that_stops_answering_fires_source_down_for_its_node_only(rack: Rack) -> None:
    engine = rack.engine

    # Each BMC its own target, each node its own figures and its own source up.
    poll(
        lambda: by_node(engine, 'llmgw_node_power_watts{job="bmc"}') == WATTS,
        "each node's power from its own BMC",
    )
    assert by_node(engine, 'llmgw_exporter_source_up{job="bmc"}') == dict.fromkeys(WATTS, 1.0)
    targets = {s["metric"]["instance"]: s["value"][1] for s in query(engine, 'up{job="bmc"}')}
    assert targets == dict.fromkeys(WATTS, "1")
    info = query(engine, 'llmgw_node_info{job="bmc"}')
    assert {(s["metric"]["node"], s["metric"]["rack"]) for s in info} == {
        (node, "r12-07") for node in WATTS
    }
    assert firing(engine) == []

    # The fault: one BMC stops answering.
    process = rack.bmcs[SILENT].process
    assert process is not None
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)

    poll(
        lambda: (
            by_node(engine, 'llmgw_exporter_source_up{job="bmc"}') == {SILENT: 0.0, SPEAKING: 1.0}
        ),
        f"{SILENT}'s source down, {SPEAKING}'s up",
    )

    def source_down() -> list[dict[str, Any]]:
        return [
            alert
            for alert in firing(engine)
            if alert["labels"]["alertname"] == "LlmgwExporterSourceDown"
        ]

    [alert] = poll(source_down, "LlmgwExporterSourceDown firing")
    assert alert["labels"] == {
        "alertname": "LlmgwExporterSourceDown",
        "instance": SILENT,
        "job": "bmc",
        "node": SILENT,
        "source": "ipmi",
        "severity": "warning",
    }
    assert "(partial)" in alert["annotations"]["description"]
    # Nothing else: no alert for the node whose BMC answers, nor any other.
    assert [a["labels"]["alertname"] for a in firing(engine)] == ["LlmgwExporterSourceDown"]
    assert by_node(engine, 'llmgw_exporter_source_up{job="bmc"}') == {SILENT: 0.0, SPEAKING: 1.0}
    assert by_node(engine, 'llmgw_node_power_watts{job="bmc", node="gpu-r12-07-02"}') == {
        SPEAKING: 504.0
    }
    # The silent BMC's target itself still answers: its exporter is up, its source is not.
    targets = {s["metric"]["instance"]: s["value"][1] for s in query(engine, 'up{job="bmc"}')}
    assert targets == dict.fromkeys(WATTS, "1")
    groups = requests.get(f"{engine.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
    broken = [
        (group["name"], rule.get("name"), rule["lastError"])
        for group in groups
        for rule in group["rules"]
        if rule.get("health") != "ok"
    ]
    assert broken == []
