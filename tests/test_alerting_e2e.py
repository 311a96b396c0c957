"""End to end: a node too hot → the exporter → Prometheus → Alertmanager → a webhook.

One node, `gpu-r12-07-03` in rack r12-07 (site sto1, room hall-b, row 12, fed
by PDUs r12-07-a and r12-07-b), runs the real exporter on node_exporter's sysfs
tree plus a Super-I/O chip whose SYSTIN sensor reads 40 °C, and one idle H100
through the fake NVML library. A real Prometheus scrapes it every second and
evaluates every file of rules/ and alerts/ unchanged; a real Alertmanager runs
examples/alertmanager.yml with its webhook URLs pointed at a loopback server
and its group_wait cut to 1 s.

Nothing is shortened: the rule files are loaded from the repository as they
are, their groups keep their own 30 s interval (the 1 s global interval only
sets the scrapes and the alert groups, which have none), and the condition
needs its inputs held for 2 minutes with the window's start covered by data.
So the hot alert arrives 2.5 to 3 minutes after the start: the exporter's
first scrape (a few seconds), the first domain evaluation (within 30 s), the
2-minute hold, the next condition evaluation (within 30 s, at a phase that
Prometheus derives from the group and file names), delivery (LlmgwDomainHot
has no `for` of its own, Alertmanager waits 1 s). The whole stack is started
once for this module and every test shares that one wait.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.fake_nvml.build import ensure_built
from tests.promstack import Server, Webhook, alertmanager, exporter, prometheus, webhook
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ALERTMANAGER = ROOT / "examples" / "alertmanager.yml"
RULE_FILES = sorted(ROOT.glob("rules/*.yml")) + sorted(ROOT.glob("alerts/*.yml"))
RUNBOOKS = "https://github.com/llmgw/llmgw-facility/blob/main/docs/runbooks.md#"
NODE = "gpu-r12-07-03"
#: Every domain the node is in: its 40 °C inlet is the hottest of each.
DOMAINS = {
    ("site", "sto1"),
    ("room", "hall-b"),
    ("row", "12"),
    ("rack", "r12-07"),
    ("pdu", "r12-07-a"),
    ("pdu", "r12-07-b"),
}
#: Generous: expected 2.5 to 3 minutes (module docstring).
HOT_ALERT_DEADLINE_S = 300.0
HOT_RACK_LABELS = {
    "alertname": "LlmgwDomainHot",
    "kind": "rack",
    "domain": "r12-07",
    "severity": "critical",
}


def hot_node_sysfs(root: Path) -> Path:
    """node_exporter's sysfs tree, plus an nct6775 chip whose SYSTIN reads 40 °C."""
    extract(SHARED_FIXTURES / "node_exporter" / "sys.ttar", root)
    sysfs = root / "sys"
    chip = sysfs / "devices" / "platform" / "nct6775.2592"
    hwmon = chip / "hwmon" / "hwmon11"
    hwmon.mkdir(parents=True)
    (hwmon / "name").write_text("nct6775\n")
    (hwmon / "temp1_label").write_text("SYSTIN\n")
    (hwmon / "temp1_input").write_text("40000\n")
    (hwmon / "device").symlink_to("../../../nct6775.2592")
    (sysfs / "class" / "hwmon" / "hwmon11").symlink_to(
        "../../devices/platform/nct6775.2592/hwmon/hwmon11"
    )
    return sysfs


def alertmanager_config(hook: Webhook) -> dict[str, Any]:
    """examples/alertmanager.yml, each receiver's webhook at `hook`/<receiver>, group_wait 1 s."""
    config = yaml.safe_load(EXAMPLE_ALERTMANAGER.read_text())
    for receiver in config["receivers"]:
        for webhook_config in receiver["webhook_configs"]:
            webhook_config["url"] = f"{hook.url}/{receiver['name']}"

    def shorten(route: dict[str, Any]) -> None:
        if "group_wait" in route:
            route["group_wait"] = "1s"
        for child in route.get("routes", []):
            shorten(child)

    shorten(config["route"])
    return config


@dataclass
class Stack:
    prometheus: Server
    alertmanager: Server
    exporter: Server
    webhook: Webhook
    hot_path: str
    hot_payload: dict[str, Any]
    hot_after_s: float

    def query(self, promql: str) -> list[dict[str, Any]]:
        answer = requests.get(
            f"{self.prometheus.url}/api/v1/query", params={"query": promql}, timeout=10
        )
        answer.raise_for_status()
        return answer.json()["data"]["result"]


def carries_hot_rack(_path: str, payload: dict[str, Any]) -> bool:
    return any(alert["labels"] == HOT_RACK_LABELS for alert in payload.get("alerts", []))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("alerting")
    sysfs = hot_node_sysfs(root / "node")
    nvml = root / "node" / "nvml.json"
    nvml.write_text((ROOT / "tests" / "fixtures" / "nvml" / "h100.json").read_text())
    agent = root / "node" / "agent.yaml"
    agent.write_text(
        f"node: {NODE}\n"
        "labels:\n"
        "  llmgw.io/site: sto1\n  llmgw.io/room: hall-b\n  llmgw.io/row: '12'\n"
        "  llmgw.io/rack: r12-07\n  llmgw.io/pdu: r12-07-a,r12-07-b\n"
        "overhead_watts: 250\n"
        "sources:\n"
        f"  gpu: {{interval: 1s, library: {ensure_built()}}}\n"
        "  hwmon: {interval: 1s}\n"
        "  rapl: {interval: 1s}\n"
    )
    with ExitStack() as servers:
        hook = servers.enter_context(webhook())
        node = servers.enter_context(
            exporter(
                root / "exporter",
                agent=agent,
                sysfs=sysfs,
                nvml_config=nvml,
                ready_text='sensor="SYSTIN"} 40.0',
            )
        )
        am = servers.enter_context(alertmanager(root / "alertmanager", alertmanager_config(hook)))
        started = time.monotonic()
        prom = servers.enter_context(
            prometheus(
                root / "prometheus",
                rule_files=RULE_FILES,
                scrape_targets={"llmgw-exporter": [node.url.removeprefix("http://")]},
                alertmanagers=[am.url.removeprefix("http://")],
            )
        )
        try:
            path, payload = hook.wait_for(carries_hot_rack, HOT_ALERT_DEADLINE_S)
        except TimeoutError as exc:
            state = requests.get(
                f"{prom.url}/api/v1/query",
                params={"query": '{__name__=~"llmgw_domain_condition|ALERTS"} == 1'},
                timeout=10,
            ).text
            pytest.fail(
                f"{exc}\nPrometheus says: {state}\n"
                f"Prometheus log:\n{prom.log_tail()}\nAlertmanager log:\n{am.log_tail()}"
            )
        yield Stack(prom, am, node, hook, path, payload, time.monotonic() - started)


def test_prometheus_answers_that_the_rack_is_hot(stack: Stack):
    result = stack.query('llmgw_domain_condition{kind="rack",domain="r12-07"}')
    assert {sample["metric"]["condition"]: sample["value"][1] for sample in result} == {
        "ok": "0",
        "warm": "0",
        "hot": "1",
        "unknown": "0",
    }
    inlet = stack.query('llmgw_domain_inlet_temperature_celsius{kind="rack",domain="r12-07"}')
    assert [sample["value"][1] for sample in inlet] == ["40"]


def test_the_webhook_received_the_hot_rack_with_its_figures(stack: Stack):
    assert stack.hot_path == "/llmgw-pager"  # critical: the pager receiver
    # Not before the condition's 2-minute hold: nothing was shortened.
    assert stack.hot_after_s >= 120
    payload = stack.hot_payload
    assert payload["receiver"] == "llmgw-pager"
    assert payload["status"] == "firing"
    assert payload["groupLabels"] == {"kind": "rack", "domain": "r12-07"}
    [alert] = payload["alerts"]
    assert alert["status"] == "firing"
    assert alert["labels"] == HOT_RACK_LABELS
    assert alert["annotations"] == {
        "summary": "rack r12-07 is hot",
        "description": (
            "rack r12-07 is in the hot condition: inlet 40.0 °C (hot threshold 32.0 °C), "
            "0 of 1 GPUs thermally throttled. "
            "The decider refuses new replicas there (enforce mode)."
        ),
        "runbook_url": RUNBOOKS + "llmgwdomainhot",
    }


def test_every_domain_of_the_node_is_hot_and_no_other_alert_fires(stack: Stack):
    firing = stack.query('ALERTS{alertstate="firing"}')
    assert {
        (
            sample["metric"]["alertname"],
            sample["metric"].get("kind"),
            sample["metric"].get("domain"),
        )
        for sample in firing
    } == {("LlmgwDomainHot", kind, domain) for kind, domain in DOMAINS}


def test_every_rule_group_loads_and_evaluates_without_error(stack: Stack):
    answer = requests.get(f"{stack.prometheus.url}/api/v1/rules", timeout=10)
    groups = answer.json()["data"]["groups"]
    assert {group["file"] for group in groups} == {str(path) for path in RULE_FILES}
    broken = [
        (group["name"], rule["name"], rule["lastError"])
        for group in groups
        for rule in group["rules"]
        if rule["health"] != "ok"
    ]
    assert broken == []


def post_alerts(am: Server, alerts: list[dict[str, str]]) -> None:
    body = [
        {"labels": labels, "annotations": {"summary": "posted by the test"}} for labels in alerts
    ]
    requests.post(f"{am.url}/api/v2/alerts", json=body, timeout=10).raise_for_status()


def alert_states(am: Server, alertname: str) -> dict[str | None, str]:
    answer = requests.get(
        f"{am.url}/api/v2/alerts", params={"filter": f'alertname="{alertname}"'}, timeout=10
    )
    answer.raise_for_status()
    return {alert["labels"].get("domain"): alert["status"]["state"] for alert in answer.json()}


def test_the_hot_rack_holds_back_its_gpus_throttling_alerts_only(stack: Stack):
    gpu = {"alertname": "LlmgwGpuThermalThrottling", "severity": "warning", "gpu": "0"}
    post_alerts(
        stack.alertmanager,
        [
            {**gpu, "node": NODE, "uuid": "GPU-0", "kind": "rack", "domain": "r12-07"},
            {**gpu, "node": "gpu-r12-08-01", "uuid": "GPU-1", "kind": "rack", "domain": "r12-08"},
            {**gpu, "node": "lab-01", "uuid": "GPU-2"},  # no rack known: never held back
        ],
    )
    assert alert_states(stack.alertmanager, "LlmgwGpuThermalThrottling") == {
        "r12-07": "suppressed",
        "r12-08": "active",
        None: "active",
    }


def test_over_the_cap_holds_back_near_the_cap_for_the_same_domain(stack: Stack):
    rack = {"severity": "warning", "kind": "rack"}
    post_alerts(
        stack.alertmanager,
        [
            {
                **rack,
                "alertname": "LlmgwDomainPowerOverCap",
                "severity": "critical",
                "domain": "r12-09",
            },
            {**rack, "alertname": "LlmgwDomainPowerNearCap", "domain": "r12-09"},
            {**rack, "alertname": "LlmgwDomainPowerNearCap", "domain": "r12-10"},
        ],
    )
    assert alert_states(stack.alertmanager, "LlmgwDomainPowerNearCap") == {
        "r12-09": "suppressed",
        "r12-10": "active",
    }


def amtool(*args: str) -> subprocess.CompletedProcess[str]:
    path = shutil.which("amtool")
    if path is None:
        pytest.fail("amtool is missing: `make debian-packages` installs prometheus-alertmanager")
    return subprocess.run([path, *args], capture_output=True, text=True, timeout=30, check=False)


def test_the_example_alertmanager_config_passes_amtool_check_config():
    result = amtool("check-config", str(EXAMPLE_ALERTMANAGER))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


@pytest.mark.parametrize(
    ("labels", "receiver"),
    [
        (
            {
                "alertname": "LlmgwDomainHot",
                "severity": "critical",
                "kind": "rack",
                "domain": "r12-07",
            },
            "llmgw-pager",
        ),
        (
            {
                "alertname": "LlmgwDomainPowerOverCap",
                "severity": "critical",
                "kind": "pdu",
                "domain": "a",
            },
            "llmgw-pager",
        ),
        (
            {
                "alertname": "LlmgwDomainPowerNearCap",
                "severity": "warning",
                "kind": "rack",
                "domain": "r12-07",
            },
            "llmgw-tickets",
        ),
        (
            {
                "alertname": "LlmgwExporterSourceDown",
                "severity": "warning",
                "node": NODE,
                "source": "gpu",
            },
            "llmgw-tickets",
        ),
        (
            {
                "alertname": "LlmgwDeciderPrometheusUnreachable",
                "severity": "warning",
                "instance": "d:9851",
            },
            "llmgw-tickets",
        ),
    ],
)
def test_the_example_routes_by_severity(labels: dict[str, str], receiver: str):
    result = amtool(
        "config",
        "routes",
        "test",
        f"--config.file={EXAMPLE_ALERTMANAGER}",
        f"--verify.receivers={receiver}",
        *(f"{name}={value}" for name, value in labels.items()),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_webhook_payloads_are_json_alertmanager_sends(stack: Stack):
    # Every POST the webhook got is an Alertmanager v4 webhook message.
    for path, payload in stack.webhook.received:
        assert path in {"/llmgw-pager", "/llmgw-tickets"}
        assert payload["version"] == "4", json.dumps(payload)
