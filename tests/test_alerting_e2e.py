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
once for this module and every test shares that one wait. The rack's row, room
and site turn hot about 2.5 minutes later, each on its own evidence (the share
of its racks hot: r12-07 is all of them), never on the node's reading itself;
its PDUs have no thermal condition (no site signal speaks for them).

Portability (DESIGN.md §8, docs/rules.md "Running in vmalert"): in the same run a
VictoriaMetrics single-node server scrapes the same exporter every second (its own
`-promscrape.config`, same job), and vmalert evaluates the same unchanged rule
files against it, writing its results back, its alerts going to a second loopback
server. Its condition needs the same 2-minute hold but lags Prometheus by about two
evaluations of the 30 s groups: it reads an earlier rule's output only once that
output was written to VictoriaMetrics and read back, so the domain inlet appears one
evaluation after the membership it joins, and the state set one evaluation after
the level it reads (in Prometheus both are at the same evaluation). The vmalert
tests come last and wait for that lag (`VMALERT_LAG_LIMIT_S`) after Prometheus's
hot alert, not a second hold.
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
from tests.promstack import (
    Server,
    Webhook,
    alertmanager,
    exporter,
    prometheus,
    victoria_metrics,
    vmalert,
    webhook,
)
from tests.shared_fixtures import SHARED_FIXTURES
from tests.ttar import extract

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_ALERTMANAGER = ROOT / "examples" / "alertmanager.yml"
RULE_FILES = sorted(ROOT.glob("rules/*.yml")) + sorted(ROOT.glob("alerts/*.yml"))
RUNBOOKS = "https://github.com/llmgw/llmgw-facility/blob/main/docs/runbooks.md#"
NODE = "gpu-r12-07-03"
#: The domains that turn hot: the rack from its node's 40 °C inlet, and its row, room and
#: site, each on its own evidence: its racks' share (r12-07 is all of their racks, so more
#: than half of them is hot), 2 minutes after the rack (docs/rules.md "Kind, signals,
#: condition").
DOMAINS = {
    ("site", "sto1"),
    ("room", "hall-b"),
    ("row", "12"),
    ("rack", "r12-07"),
}
#: The node's PDUs: no site signal speaks for them, so no thermal condition (unknown).
PDUS = {("pdu", "r12-07-a"), ("pdu", "r12-07-b")}
#: After the rack's hot alert, its parents' own 2-minute hold on its share, read one
#: evaluation of the 30 s group late, and up to one evaluation more.
PARENTS_HOT_DEADLINE_S = 240.0
#: Generous: expected 2.5 to 3 minutes (module docstring).
HOT_ALERT_DEADLINE_S = 300.0
HOT_RACK_LABELS = {
    "alertname": "LlmgwDomainHot",
    "kind": "rack",
    "domain": "r12-07",
    "severity": "critical",
}
#: How long after Prometheus's hot alert vmalert may take to say the same: two
#: evaluations of the 30 s groups (module docstring), plus up to one interval each
#: for the phases of its two groups, which differ from Prometheus's.
VMALERT_LAG_LIMIT_S = 120.0
#: The same for the rack's parents: their shares read the racks' state set and their level
#: reads the shares, each of which vmalert sees only once written and read back (in
#: Prometheus, within the evaluation): three evaluations more than the rack's lag.
VMALERT_PARENTS_LAG_LIMIT_S = VMALERT_LAG_LIMIT_S + 90.0
#: Watts and °C: both servers read the same exporter, a scrape or two apart.
READING_TOLERANCE = 0.5


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


def instant_query(server: Server, promql: str) -> list[dict[str, Any]]:
    """`promql` at now, from Prometheus or VictoriaMetrics (the same API)."""
    answer = requests.get(f"{server.url}/api/v1/query", params={"query": promql}, timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


@dataclass
class Stack:
    prometheus: Server
    alertmanager: Server
    exporter: Server
    webhook: Webhook
    hot_path: str
    hot_payload: dict[str, Any]
    hot_after_s: float
    #: Monotonic time the hot alert reached the webhook.
    hot_at: float
    victoria_metrics: Server
    vmalert: Server
    #: What vmalert POSTed to its notifier: (path, list of alerts).
    vmalert_notified: Webhook
    workdir: Path

    def query(self, promql: str) -> list[dict[str, Any]]:
        return instant_query(self.prometheus, promql)


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
        notified = servers.enter_context(webhook())
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
        targets = {"llmgw-exporter": [node.url.removeprefix("http://")]}
        vm = servers.enter_context(
            victoria_metrics(root / "victoria-metrics", scrape_targets=targets)
        )
        vma = servers.enter_context(
            vmalert(
                root / "vmalert", rule_files=RULE_FILES, datasource=vm.url, notifiers=[notified.url]
            )
        )
        started = time.monotonic()
        prom = servers.enter_context(
            prometheus(
                root / "prometheus",
                rule_files=RULE_FILES,
                scrape_targets=targets,
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
        hot_at = time.monotonic()
        yield Stack(
            prom, am, node, hook, path, payload, hot_at - started, hot_at, vm, vma, notified, root
        )


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


def hot_domains_firing(stack: Stack) -> set[tuple[str, str | None, str | None]]:
    return {
        (
            sample["metric"]["alertname"],
            sample["metric"].get("kind"),
            sample["metric"].get("domain"),
        )
        for sample in stack.query('ALERTS{alertstate="firing"}')
    }


@pytest.fixture(scope="module")
def parents_hot(stack: Stack) -> float:
    """Waits until Prometheus fires LlmgwDomainHot for the rack's row, room and site too
    (their share of hot racks held 2 minutes); the monotonic time it saw them."""
    deadline = stack.hot_at + PARENTS_HOT_DEADLINE_S
    expected = {("LlmgwDomainHot", kind, domain) for kind, domain in DOMAINS}
    while not expected <= hot_domains_firing(stack):
        if time.monotonic() > deadline:
            pytest.fail(
                f"the rack's parents not hot {PARENTS_HOT_DEADLINE_S:.0f} s after it: "
                f"{stack.query('llmgw_domain_condition == 1')}"
            )
        time.sleep(1)
    return time.monotonic()


def test_the_racks_parents_turn_hot_on_their_own_evidence_and_no_other_alert_fires(
    stack: Stack, parents_hot: float
):
    firing = stack.query('ALERTS{alertstate="firing"}')
    assert {
        (
            sample["metric"]["alertname"],
            sample["metric"].get("kind"),
            sample["metric"].get("domain"),
        )
        for sample in firing
    } == {("LlmgwDomainHot", kind, domain) for kind, domain in DOMAINS}
    # Not at once: a parent holds its racks' share 2 minutes, never the rack's own reading.
    assert parents_hot - stack.hot_at >= 60
    conditions = {
        (sample["metric"]["kind"], sample["metric"]["domain"]): sample["metric"]["condition"]
        for sample in stack.query("llmgw_domain_condition == 1")
    }
    assert {domain: conditions[domain] for domain in PDUS} == dict.fromkeys(PDUS, "unknown")


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


# ---------------------------------------------------------------- the same rules in vmalert
# Last in the module: they wait (at most VMALERT_LAG_LIMIT_S after Prometheus's hot
# alert) for vmalert to catch up, which the tests above need not do.


def vmalert_api(stack: Stack, path: str) -> dict[str, Any]:
    answer = requests.get(f"{stack.vmalert.url}/api/v1/{path}", timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]


def firing_in_vmalert(stack: Stack) -> list[dict[str, Any]]:
    alerts = vmalert_api(stack, "alerts")["alerts"] or []  # null, not [], while none is active
    return [alert for alert in alerts if alert["state"] == "firing"]


def hot_domains(server: Server) -> set[tuple[str, str]]:
    result = instant_query(server, 'llmgw_domain_condition{condition="hot"} == 1')
    return {(sample["metric"]["kind"], sample["metric"]["domain"]) for sample in result}


def state_sets(server: Server) -> dict[tuple[str, str], dict[str, float]]:
    """{(kind, domain): {condition: value}} of every domain."""
    sets: dict[tuple[str, str], dict[str, float]] = {}
    for sample in instant_query(server, "llmgw_domain_condition"):
        labels = sample["metric"]
        sets.setdefault((labels["kind"], labels["domain"]), {})[labels["condition"]] = float(
            sample["value"][1]
        )
    return sets


@dataclass
class VmalertCaughtUp:
    #: Seconds after Prometheus's hot alert reached the webhook (negative: before).
    lag_s: float


@pytest.fixture(scope="module")
def vmalert_hot(stack: Stack, parents_hot: float) -> VmalertCaughtUp:
    """Waits until VictoriaMetrics says the rack and its parents are hot and vmalert fires
    LlmgwDomainHot for each: at most VMALERT_LAG_LIMIT_S after Prometheus says so."""
    deadline = parents_hot + VMALERT_PARENTS_LAG_LIMIT_S
    while True:
        fired = {
            (alert["labels"].get("kind"), alert["labels"].get("domain"))
            for alert in firing_in_vmalert(stack)
            if alert["name"] == "LlmgwDomainHot"
        }
        if hot_domains(stack.victoria_metrics) == DOMAINS and fired == DOMAINS:
            caught_up = VmalertCaughtUp(time.monotonic() - parents_hot)
            (stack.workdir / "vmalert-lag.txt").write_text(
                f"Prometheus hot alert {stack.hot_after_s:.1f} s after its start; "
                f"vmalert {caught_up.lag_s:+.1f} s after that\n"
            )
            return caught_up
        if time.monotonic() > deadline:
            state = instant_query(
                stack.victoria_metrics,
                '{__name__=~"llmgw_domain_condition|ALERTS"} == 1'
                ' or {__name__=~"llmgw:domain_racks_hot:ratio|llmgw:domain_condition:level"}',
            )
            pytest.fail(
                f"vmalert not hot {VMALERT_PARENTS_LAG_LIMIT_S:.0f} s after Prometheus: "
                f"VictoriaMetrics says {state}; vmalert fires {sorted(fired)}\n"
                f"vmalert log:\n{stack.vmalert.log_tail()}\n"
                f"VictoriaMetrics log:\n{stack.victoria_metrics.log_tail()}"
            )
        time.sleep(1)


def test_victoria_metrics_scrapes_the_exporter_as_prometheus_does(stack: Stack):
    # Same job and instance labels: the rules' `max without (instance, job)` see the same.
    def node_info(server: Server) -> list[dict[str, str]]:
        return [sample["metric"] for sample in instant_query(server, "llmgw_node_info")]

    assert node_info(stack.victoria_metrics) == node_info(stack.prometheus)
    assert len(node_info(stack.prometheus)) == 1


def test_vmalert_loads_every_rule_group_as_prometheus_does_and_none_errs(stack: Stack):
    def rules_by_group(groups: list[dict[str, Any]]) -> dict[tuple[str, str], list[Any]]:
        return {
            (group["file"], group["name"]): [
                (rule["type"], rule["name"], rule.get("labels") or {}) for rule in group["rules"]
            ]
            for group in groups
        }

    vm_groups = vmalert_api(stack, "rules")["groups"]
    prom_groups = requests.get(f"{stack.prometheus.url}/api/v1/rules", timeout=10).json()["data"][
        "groups"
    ]
    assert {group["file"] for group in vm_groups} == {str(path) for path in RULE_FILES}
    assert rules_by_group(vm_groups) == rules_by_group(prom_groups)
    broken = [
        (group["name"], rule["name"], rule["health"], rule["lastError"])
        for group in vm_groups
        for rule in group["rules"]
        if rule["health"] != "ok" or rule["lastError"]
    ]
    assert broken == []


def test_victoria_metrics_says_every_domain_is_hot_as_prometheus_does(
    stack: Stack, vmalert_hot: VmalertCaughtUp
):
    hot = {"ok": 0.0, "warm": 0.0, "hot": 1.0, "unknown": 0.0}
    unknown = {"ok": 0.0, "warm": 0.0, "hot": 0.0, "unknown": 1.0}
    in_prometheus = state_sets(stack.prometheus)
    in_victoria_metrics = state_sets(stack.victoria_metrics)
    assert in_prometheus == {domain: hot for domain in DOMAINS} | dict.fromkeys(PDUS, unknown)
    assert in_victoria_metrics == in_prometheus, f"vmalert lag {vmalert_hot.lag_s:.1f} s"


@pytest.mark.parametrize(
    "series", ["llmgw_domain_measured_watts", "llmgw_domain_inlet_temperature_celsius"]
)
def test_victoria_metrics_reads_the_same_rack_figures(
    stack: Stack, vmalert_hot: VmalertCaughtUp, series: str
):
    def value(server: Server) -> float:
        [sample] = instant_query(server, f'{series}{{kind="rack",domain="r12-07"}}')
        return float(sample["value"][1])

    assert value(stack.victoria_metrics) == pytest.approx(
        value(stack.prometheus), abs=READING_TOLERANCE
    )


def test_vmalert_fires_the_hot_alert_for_every_domain_and_nothing_else(
    stack: Stack, vmalert_hot: VmalertCaughtUp
):
    firing = firing_in_vmalert(stack)
    assert {
        (alert["name"], alert["labels"].get("kind"), alert["labels"].get("domain"))
        for alert in firing
    } == {("LlmgwDomainHot", kind, domain) for kind, domain in DOMAINS}
    [rack] = [alert for alert in firing if alert["labels"]["domain"] == "r12-07"]
    # vmalert adds the group's name (-disableAlertgroupLabel would not); the rest, the
    # annotations' templates and their queries included, renders as in Prometheus.
    assert rack["labels"] == {**HOT_RACK_LABELS, "alertgroup": "llmgw-domain.alerts"}
    [prometheus_alert] = stack.hot_payload["alerts"]
    assert rack["annotations"] == prometheus_alert["annotations"]
    # And it sent them to its notifier.
    stack.vmalert_notified.wait_for(
        lambda path, alerts: (
            path == "/api/v2/alerts" and any(alert["labels"] == rack["labels"] for alert in alerts)
        ),
        timeout_s=10,
    )
