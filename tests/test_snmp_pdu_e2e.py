"""A metered PDU end to end, over its real protocol (issue 19, "PDUs over SNMP, phases measured").

Real processes on loopback ports the test picks:

    snmpsim (a recorded ServerTech Sentry4 unit, tests/fixtures/snmpsim/sentry4)
      → snmp_exporter 0.21.0 (Debian's, the stock `servertech_sentry4` module of
        tests/fixtures/snmp_exporter/snmp.yml), scraped by
      → Prometheus 2.42 (params/target scrape config, the PDU's name as target label `pdu`),
        evaluating rules/node.yml, rules/domain.yml, alerts/domain.yml and the site rules
        that `llmgw-facility rules render` makes from FACILITY_YAML below
      → llmgw-decider, whose pdu's measured power and phases come from the PDU itself.

The site: pdu r1-a feeds two racks, r1 (n1 on L1, n2 on L3) and r2 (n3 on L3); the nodes'
membership comes from a static exporter page (`llmgw_node_info`, `llmgw_node_pdu_info`), the
nodes publish no power. The recording's figures (the unit's own, not written here): input
cord 1 701 W; phases L1-L2 415 W, L2-L3 444 W, L3-L1 848 W (a delta unit: the query maps the
first line of each pair to the facility file's L1, L2, L3). Each phase's breaker 20 A at
208 V: rating 4 160 W, cap 3 328 W, limit 2 995.2 W at a 10 % margin.

1. The decider reads 1 701 W for the pdu and 415 / 444 / 848 W for its phases.
2. 500 W reserved on n1 (L1) and on n2 (L3): L1's load is its reservations (500 > 415),
   L3's what it draws (848 > 500). A 2 200 W replica is refused on n2 and n3 for L3,
   "0.8 of 3.3 kW measured", though its reservations alone (500 + 2 200 = 2 700) would fit;
   n1 is allowed. A reservation of it on n3 is refused (409) with the same reason.
3. The PDU's agent times out (snmpsim stopped): snmp_exporter's scrape fails, the site
   series end, and the decider reads no measured power for the pdu or its phases (`null`,
   basis reserved, `missing` names the three phases), while its measured part itself stays
   fresh; the same 2 200 W replica is allowed on every node: nothing is refused for the
   missing data. LlmgwSiteMeterMissing fires for pdu r1-a.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.decider_harness import Decider
from tests.decider_harness import running as running_decider
from tests.promstack import Server, binary, metrics_target, prometheus_with_config, running

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SNMP_YML = FIXTURES / "snmp_exporter" / "snmp.yml"
SENTRY4 = FIXTURES / "snmpsim" / "sentry4"
MODULE = "servertech_sentry4"
#: Anything awaited: the rules' groups run every 30 s, and the decider reads their output
#: over `last_over_time(…[1m])`, so a change takes up to about two minutes to arrive.
DEADLINE_S = 300.0
POLL_S = 0.5
SCRAPE = "2s"

PDU = "r1-a"
NODES = {"n1": ("r1", "L1"), "n2": ("r1", "L3"), "n3": ("r2", "L3")}
CORD_W = 1701.0
PHASE_W = {"L1": 415.0, "L2": 444.0, "L3": 848.0}
PHASE_CAP_W = 4160 * 0.8

#: The facility file, as a site writes it: the exact queries of docs/site-integration.md.
FACILITY_YAML = """\
mode: enforce
defaults: {margin: 0.10, derating: 0.80}
domains:
  rack/r1: {cap_watts: 20000}
  rack/r2: {cap_watts: 20000}
  pdu/r1-a:
    cap_watts: 8646                       # 30 A at 208 V three-phase, 10 807 VA × 0.8
    phases:                               # each line pair on a 20 A breaker at 208 V
      L1: {rating_watts: 4160}
      L2: {rating_watts: 4160}
      L3: {rating_watts: 4160}
nodes:
  n1: {phases: {r1-a: L1}}
  n2: {phases: {r1-a: L3}}
  n3: {phases: {r1-a: L3}}
signals:
  power_watts:
    query: 'sum by (pdu) (st4InputCordActivePower)'
    domain_label: pdu
    stale_after: 10s
  phase_power_watts:
    query: |
      sum by (pdu, phase) (
        label_replace(
          st4PhaseActivePower, "phase", "L$1", "st4PhaseLabel", "(?:.*:)?L([123])(?:-L[123])?"
        )
      )
    domain_label: pdu
    phase_label: phase
    stale_after: 10s
"""
REPLICA = {"model": "m", "profile": "p", "gpus": 1, "power_watts": 2200}
L3_MEASURED = f"pdu {PDU} phase L3: 0.8 of 3.3 kW measured, replica needs ~2.2, margin 10%"


def poll(condition: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        found = condition()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(POLL_S)


# --- the processes ---------------------------------------------------------------------------


@contextmanager
def snmpsim(workdir: Path, data: Path) -> Iterator[tuple[Server, str]]:
    """snmpsim serving `data` (its `public.snmprec` answers community `public`) on a UDP
    port of 127.0.0.1; (the server, host:port). snmpsim refuses to run as root unless told
    to stay so: a container's root is allowed with SNMPSIM_ALLOW_ROOT."""
    cache = workdir / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if os.geteuid() == 0:
        env["SNMPSIM_ALLOW_ROOT"] = "true"
    program = shutil.which("snmpsim-command-responder", path=str(Path(sys.executable).parent))
    if program is None:
        pytest.fail("snmpsim-command-responder is missing: the test extra installs snmpsim")
    ports: list[int] = []
    log = workdir / "snmpsim.log"

    def command(port: int) -> list[str]:
        ports.append(port)
        return [
            program,
            f"--data-dir={data}",
            f"--cache-dir={cache}",
            f"--agent-udpv4-endpoint=127.0.0.1:{port}",
        ]

    def ready(_url: str) -> bool:
        return "Listening at UDP/IPv4 endpoint" in log.read_text(errors="replace")

    with running("snmpsim", command, workdir, ready, env=env) as server:
        yield server, f"127.0.0.1:{ports[-1]}"


@contextmanager
def snmp_exporter(workdir: Path) -> Iterator[Server]:
    def command(port: int) -> list[str]:
        return [
            binary("prometheus-snmp-exporter"),
            f"--config.file={SNMP_YML}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    def ready(url: str) -> bool:
        return requests.get(f"{url}/metrics", timeout=2).status_code == 200

    with running("snmp_exporter", command, workdir, ready) as server:
        yield server


def snmp_scrape_config(
    exporter: str, agent: str, module: str = MODULE, pdu: str = PDU
) -> dict[str, Any]:
    """The scrape job a site writes for its PDUs: snmp_exporter asked for each PDU by
    `target`, with the stock module, the PDU's name as the `pdu` target label."""
    return {
        "job_name": "snmp-pdu",
        "scrape_interval": SCRAPE,
        "scrape_timeout": SCRAPE,
        "metrics_path": "/snmp",
        "params": {"module": [module]},
        "static_configs": [{"targets": [agent], "labels": {"pdu": pdu}}],
        "relabel_configs": [
            {"source_labels": ["__address__"], "target_label": "__param_target"},
            {"source_labels": ["__param_target"], "target_label": "instance"},
            {"target_label": "__address__", "replacement": exporter},
        ],
    }


@contextmanager
def prometheus(
    workdir: Path, rule_files: list[Path], scrape_configs: list[dict[str, Any]]
) -> Iterator[Server]:
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": scrape_configs,
    }
    with prometheus_with_config(workdir, config) as server:
        yield server


def node_page() -> bytes:
    """What the nodes' exporters say of their place: rack and pdu, nothing else."""
    lines = []
    for node, (rack, _) in NODES.items():
        lines.append(f'llmgw_node_info{{node="{node}",site="",room="",row="",rack="{rack}"}} 1')
        lines.append(f'llmgw_node_pdu_info{{node="{node}",pdu="{PDU}"}} 1')
    return ("\n".join(lines) + "\n").encode()


def render_site_rules(directory: Path, facility_yaml: str = FACILITY_YAML) -> Path:
    """`llmgw-facility rules render`, as an operator runs it."""
    facility = directory / "facility.yaml"
    facility.write_text(facility_yaml)
    output = directory / "llmgw-site.yml"
    command = [sys.executable, "-m", "llmgw_facility.cli", "rules", "render"]
    command += ["--facility", str(facility), "--output", str(output)]
    rendered = subprocess.run(
        command,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    return output


def query(engine: Server, promql: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{engine.url}/api/v1/query", params={"query": promql}, timeout=10)
    answer.raise_for_status()
    return answer.json()["data"]["result"]


# --- the stack -------------------------------------------------------------------------------


class Stack:
    def __init__(self, agent: Server, engine: Server, decider: Decider) -> None:
        self.agent = agent
        self.engine = engine
        self.decider = decider

    def pdu(self) -> dict[str, Any]:
        return self.decider.domain(f"pdu/{PDU}")

    def phases(self) -> dict[str, dict[str, Any]]:
        return {entry["phase"]: entry for entry in self.pdu()["phases"]}


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    site_rules = render_site_rules(tmp_path)
    rule_files = [
        REPO / "rules" / "node.yml",
        REPO / "rules" / "domain.yml",
        REPO / "alerts" / "domain.yml",
        site_rules,
    ]
    with (
        snmpsim(tmp_path / "snmpsim", SENTRY4) as (agent, address),
        snmp_exporter(tmp_path / "snmp_exporter") as exporter,
        metrics_target(node_page) as nodes,
    ):
        scrapes = [
            snmp_scrape_config(exporter.url.removeprefix("http://"), address),
            {"job_name": "llmgw-exporter", "static_configs": [{"targets": [nodes]}]},
        ]
        with (
            prometheus(tmp_path / "prometheus", rule_files, scrapes) as engine,
            running_decider(
                tmp_path / "decider",
                engine.url,
                yaml.safe_load(FACILITY_YAML),
                readings="1m",
            ) as decider,
        ):
            yield Stack(agent, engine, decider)


# --- the test ------------------------------------------------------------------------------


def test_a_sentry4_pdu_read_over_snmp_loads_its_phases_and_its_loss_refuses_nothing(
    stack: Stack,
) -> None:
    decider = stack.decider

    # 1. The PDU's own figures, through snmp_exporter, Prometheus and the site rules.
    site = poll(
        lambda: (
            {
                sample["metric"]["phase"]: float(sample["value"][1])
                for sample in query(stack.engine, "llmgw:domain_phase_site_power_watts")
            }
            or None
        ),
        "the rendered phase series in Prometheus",
    )
    assert site == PHASE_W
    [cord] = query(stack.engine, "llmgw:domain_site_power_watts")
    assert cord["metric"] == {
        "__name__": "llmgw:domain_site_power_watts",
        "kind": "pdu",
        "domain": PDU,
    }
    assert float(cord["value"][1]) == CORD_W

    def measured_everywhere() -> bool:
        pdu = stack.pdu()
        return pdu["measured_watts"] == CORD_W and all(
            entry["measured_watts"] is not None for entry in pdu["phases"]
        )

    poll(measured_everywhere, f"the decider reading pdu/{PDU} and its phases")

    def wired() -> bool:  # the nodes' membership, read less often (staleness.inventory)
        detail = decider.get(f"/v1/domains/pdu/{PDU}").json()
        return [(p["phase"], p["nodes"]) for p in detail["phases"]] == [
            ("L1", ["n1"]),
            ("L2", []),
            ("L3", ["n2", "n3"]),
        ]

    poll(wired, f"the decider knowing the nodes on pdu/{PDU}'s phases")
    assert {phase: entry["measured_watts"] for phase, entry in stack.phases().items()} == PHASE_W
    assert stack.pdu()["load_basis"] == "measured"
    missing = decider.place(REPLICA, list(NODES))["missing"]
    # The racks have budgets and no reading (the nodes report no power); the pdu has its own.
    assert [line for line in missing if "measured power" in line] == [
        "no fresh measured power for 2 domains (rack/r1, rack/r2): load counts what is reserved"
    ]

    # 2. Reservations on L1 and L3: L1 loads by what is reserved, L3 by what it draws.
    for rid, node in (("a", "n1"), ("b", "n2")):
        made = decider.reserve(rid, node, {**REPLICA, "power_watts": 500})
        assert made.status_code == 201, made.text
    phases = stack.phases()
    assert phases["L1"] | {"rating_watts": 0} == phases["L1"] | {
        "rating_watts": 0,
        "reserved_watts": 500,
        "measured_watts": 415,
        "load_watts": 500,
        "load_basis": "reserved",
    }
    assert (phases["L3"]["reserved_watts"], phases["L3"]["load_watts"]) == (500, 848)
    assert phases["L3"]["load_basis"] == "measured"
    assert phases["L3"]["room_watts"] == pytest.approx(PHASE_CAP_W * 0.9 - 848, abs=0.1)
    assert (phases["L2"]["load_watts"], phases["L2"]["load_basis"]) == (444, "measured")

    answer = decider.place(REPLICA, list(NODES))
    by_node = {entry["node"]: entry for entry in answer["nodes"]}
    assert by_node["n2"]["reasons"] == [L3_MEASURED]
    assert by_node["n3"]["reasons"] == [L3_MEASURED]  # rack r2, the same pdu's L3
    assert by_node["n1"]["reasons"] == []
    assert answer["order"] == ["n1"]
    refused = decider.reserve("c", "n3", REPLICA)
    assert refused.status_code == 409, refused.text
    assert refused.json()["reasons"] == [L3_MEASURED]

    # 3. The PDU's agent times out: its reading goes, nothing is refused for the loss.
    stack.agent.process.send_signal(signal.SIGTERM)
    stack.agent.process.wait(timeout=10)

    def nothing_measured() -> bool:
        pdu = stack.pdu()
        return pdu["measured_watts"] is None and all(
            entry["measured_watts"] is None for entry in pdu["phases"]
        )

    poll(nothing_measured, f"pdu/{PDU}'s readings gone from the decider")
    down = query(stack.engine, 'up{job="snmp-pdu"}')
    assert [float(sample["value"][1]) for sample in down] == [0.0]
    phases = stack.phases()
    assert {phase: entry["load_basis"] for phase, entry in phases.items()} == dict.fromkeys(
        PHASE_W, "reserved"
    )
    assert phases["L3"]["load_watts"] == 500
    answer = decider.place(REPLICA, list(NODES))
    assert {entry["node"]: entry["reasons"] for entry in answer["nodes"]} == {
        node: [] for node in NODES
    }
    assert sorted(answer["order"]) == sorted(NODES)  # ordered by room: r2's n3 first
    assert (
        f"no fresh measured power for pdu phases {PDU} L1, {PDU} L2, {PDU} L3 "
        "(signals.phase_power_watts): their load counts what is reserved"
    ) in answer["missing"]
    assert (
        "no fresh measured power for 3 domains (pdu/r1-a, rack/r1, rack/r2): load counts what "
        "is reserved"
    ) in answer["missing"]
    # The part itself is read and fresh: the phases have no reading, not a stale one.
    assert not any(line.startswith("domain measured power") for line in answer["missing"])

    def meter_alert() -> dict[str, Any] | None:
        alerts = requests.get(f"{stack.engine.url}/api/v1/alerts", timeout=10).json()
        for alert in alerts["data"]["alerts"]:
            if (
                alert["labels"].get("alertname") == "LlmgwSiteMeterMissing"
                and alert["state"] == "firing"
            ):
                return alert
        return None

    alert = poll(meter_alert, "LlmgwSiteMeterMissing firing")
    assert alert["labels"] == {
        "alertname": "LlmgwSiteMeterMissing",
        "kind": "pdu",
        "domain": PDU,
        "severity": "warning",
    }
    assert "its last hour's highest was 1701 W" in alert["annotations"]["description"]


# --- a second make: a Raritan PX, its inlet through the `raritan` module --------------------

RARITAN = FIXTURES / "snmpsim" / "raritan-px"
RARITAN_PDU = "r2-b"
#: The recording's inlet: 580 W (`inletActivePower`), a single-phase 16 A unit at 230 V.
RARITAN_W = 580.0
RARITAN_FACILITY_YAML = """\
mode: enforce
domains:
  pdu/r2-b: {cap_watts: 2944}            # 16 A at 230 V, × 0.8
signals:
  power_watts:
    query: 'sum by (pdu) (inletActivePower)'
    domain_label: pdu
    stale_after: 10s
"""


def test_a_raritan_pdu_read_over_snmp_is_its_pdus_measured_power(tmp_path: Path) -> None:
    """The same chain for another make and module (no phases: the module reads the inlet):
    the PDU's 580 W is its pdu's measured power in the rules and in the decider, which
    loads the pdu by it (nothing reserved)."""
    site_rules = render_site_rules(tmp_path, RARITAN_FACILITY_YAML)
    rule_files = [REPO / "rules" / "node.yml", REPO / "rules" / "domain.yml", site_rules]
    with (
        snmpsim(tmp_path / "snmpsim", RARITAN) as (_, address),
        snmp_exporter(tmp_path / "snmp_exporter") as exporter,
    ):
        exporter_address = exporter.url.removeprefix("http://")
        scrape = snmp_scrape_config(exporter_address, address, "raritan", RARITAN_PDU)
        with (
            prometheus(tmp_path / "prometheus", rule_files, [scrape]) as engine,
            running_decider(
                tmp_path / "decider",
                engine.url,
                yaml.safe_load(RARITAN_FACILITY_YAML),
                readings="1m",
            ) as decider,
        ):
            measured = poll(
                lambda: query(engine, 'llmgw_domain_measured_watts{kind="pdu"}'),
                "the Raritan's inlet as its pdu's measured power",
            )
            assert [(m["metric"]["domain"], float(m["value"][1])) for m in measured] == [
                (RARITAN_PDU, RARITAN_W)
            ]
            entry = poll(
                lambda: (e := decider.domain(f"pdu/{RARITAN_PDU}"))["measured_watts"] and e,
                f"the decider reading pdu/{RARITAN_PDU}",
            )
            assert (entry["measured_watts"], entry["load_watts"]) == (RARITAN_W, RARITAN_W)
            assert entry["load_basis"] == "measured"
            assert "phases" not in entry
