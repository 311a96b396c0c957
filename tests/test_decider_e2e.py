"""The decider end to end: a real `llmgw-decider` reading a real Prometheus, and the same
run against a real VictoriaMetrics (Debian's binaries, tests/promstack.py).

The engine scrapes, every second, a static exporter served here that publishes the rules'
output series (docs/rules.md) for a small site: one site, one row, two racks of two nodes,
each rack dual-fed by two PDUs. Rack r1 is `hot`; rack r2 is `ok` but measured close to its
cap, which comes from its smaller feed × derating. The decider, in enforce mode, then:

1. refuses r1's nodes for the heat and r2's for power, naming the measured figure, and
   allows a small replica on r2, ordered by the rack room it leaves; estimates use the GPU
   power limits the exporter published; /v1/domains, /v1/headroom and /metrics agree;
2. once the exporter answers 500, its readings leave the engine's window (the decider
   reads them over `last_over_time(…[staleness.readings])`, the layout and GPUs over
   staleness.inventory): conditions are `unknown`, nothing is refused for lack of data, the
   budgets hold on the known membership, and `missing` names the domains without readings;
3. once the exporter answers again, the decider reads the same state back;
4. once the engine itself is stopped, `prometheus_up` drops to 0 and, after
   staleness.readings, `missing` names the stale parts (measured power, conditions,
   reading ages, profiles' tokens per joule); conditions are `unknown` and nothing is
   refused for lack of data, while the budgets still hold on what is known (membership and
   GPU limits stay usable for staleness.inventory).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.promstack import Server, free_port, metrics_target, prometheus, victoria_metrics

REPO = Path(__file__).resolve().parents[1]
#: Deadline for anything awaited by polling: a start, a scrape, data leaving the window.
DEADLINE_S = 30.0
POLL_S = 0.1
STOP_TIMEOUT_S = 10.0
START_ATTEMPTS = 3
TOKEN = "e2e-token-0123456789abcdef"
#: staleness.readings: also the window of every query the decider makes.
READINGS_S = 10

# --- the site ------------------------------------------------------------------------------

RACKS = {"r1": ("n1", "n2"), "r2": ("n3", "n4")}
ROW, SITE = "row1", "site1"
GPUS_PER_NODE = 8
#: Enforced GPU power limits per node: n4's cards are capped lower, one of them lower still
#: (the node's largest counts).
GPU_LIMITS = {"n1": 700.0, "n2": 700.0, "n3": 700.0, "n4": 450.0}
N4_LOWEST = 400.0
MEASURED = {
    ("rack", "r1"): 5000.0,
    ("rack", "r2"): 9000.0,
    ("pdu", "r1-a"): 2600.0,
    ("pdu", "r1-b"): 2400.0,
    ("pdu", "r2-a"): 4600.0,
    ("pdu", "r2-b"): 4400.0,
    ("row", ROW): 14000.0,
    ("site", SITE): 14500.0,
}
CONDITIONS = {("rack", "r1"): "hot", ("pdu", "r2-b"): "warm"}  # every other domain: ok
AGES = {("rack", "r1"): 4.0, ("rack", "r2"): 2.0}
STATES = ("ok", "warm", "hot", "unknown")
NODE_SHARE_W = 400.0

FACILITY: dict[str, Any] = {
    "defaults": {"margin": 0.10, "derating": 0.80},
    "domains": {
        "rack/r1": {"cap_watts": 20000},
        # Dual-fed: the cap is the smaller feed × derating, 15000 × 0.8 = 12000 W, never the sum.
        "rack/r2": {
            "feeds": [
                {"pdu": "r2-a", "rating_watts": 17300},
                {"pdu": "r2-b", "rating_watts": 15000},
            ],
            "other_watts": 500,
        },
        f"row/{ROW}": {"cap_watts": 100000},
    },
    "profiles": {"big-tp4": {"gpus": 4}, "small-tp1": {"gpus": 1}},
    "node_share_watts": NODE_SHARE_W,
    "mode": "enforce",
}
R2_CAP = 12000.0
R2_LIMIT = R2_CAP * 0.9  # cap × (1 − margin)
R2_LOAD = 9000.0 + 500.0  # measured + other_watts
R1_LIMIT = 20000.0 * 0.9

BIG = {"model": "llama-70b", "profile": "big-tp4", "gpus": 4}
SMALL = {"model": "llama-8b", "profile": "small-tp1", "gpus": 1}


def derived(node: str, gpus: int) -> float:
    """The decider's derived estimate: GPUs × the node's enforced limit + the node share
    for those GPUs."""
    return gpus * GPU_LIMITS[node] + NODE_SHARE_W * gpus / GPUS_PER_NODE


def rack_of(node: str) -> str:
    return next(rack for rack, nodes in RACKS.items() if node in nodes)


def exposition() -> bytes:
    """The rules' output series for the site, as the exporter publishes them."""
    lines: list[str] = []
    domains: list[tuple[str, str]] = [("site", SITE), ("row", ROW)]
    for rack, nodes in RACKS.items():
        pdus = [("pdu", f"{rack}-a"), ("pdu", f"{rack}-b")]
        domains += [("rack", rack), *pdus]
        for node in nodes:
            for kind, name in [("rack", rack), *pdus, ("row", ROW), ("site", SITE)]:
                lines.append(
                    f'llmgw:node_domain:membership{{node="{node}",kind="{kind}",domain="{name}"}} 1'
                )
            lines.append(f'llmgw:node_gpus:count{{node="{node}"}} {GPUS_PER_NODE}')
            for gpu in range(GPUS_PER_NODE):
                limit = N4_LOWEST if node == "n4" and gpu == 0 else GPU_LIMITS[node]
                lines.append(
                    f'llmgw_gpu_power_limit_watts{{node="{node}",gpu="{gpu}",'
                    f'uuid="GPU-{node}-{gpu}"}} {limit:g}'
                )
    for kind, name in domains:
        labels = f'kind="{kind}",domain="{name}"'
        lines.append(f"llmgw_domain_info{{{labels}}} 1")
        lines.append(f"llmgw_domain_measured_watts{{{labels}}} {MEASURED[kind, name]:g}")
        lines.append(f"llmgw_domain_reading_age_seconds{{{labels}}} {AGES.get((kind, name), 2):g}")
        current = CONDITIONS.get((kind, name), "ok")
        for state in STATES:
            value = int(state == current)
            lines.append(f'llmgw_domain_condition{{{labels},condition="{state}"}} {value}')
    return ("\n".join(lines) + "\n").encode()


# --- the static exporter -------------------------------------------------------------------


@dataclass
class StaticExporter:
    """host:port of a /metrics serving `exposition()`, or HTTP 500 while `failing`."""

    target: str
    failing: bool = False


@contextmanager
def static_exporter() -> Iterator[StaticExporter]:
    body = exposition()
    exporter = StaticExporter(target="")
    with metrics_target(lambda: None if exporter.failing else body) as target:
        exporter.target = target
        yield exporter


@dataclass
class Backend:
    name: str
    engine: Server
    exporter: StaticExporter


@pytest.fixture(params=["prometheus", "victoria-metrics"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """The engine scraping its own static exporter every second."""
    with static_exporter() as exporter:
        targets = {"llmgw": [exporter.target]}
        workdir = tmp_path / request.param
        if request.param == "prometheus":
            engine = prometheus(workdir, rule_files=[], scrape_targets=targets)
        else:
            engine = victoria_metrics(workdir, scrape_targets=targets)
        with engine as server:
            yield Backend(request.param, server, exporter)


# --- the decider ---------------------------------------------------------------------------


class Decider:
    """`python -m decider.main --config decider.yaml` on a free port, its log kept."""

    def __init__(self, directory: Path, prometheus_url: str) -> None:
        self.directory = directory
        self.prometheus_url = prometheus_url
        self.log_path = directory / "decider.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.session = requests.Session()

    def write_files(self, port: int) -> Path:
        (self.directory / "facility.yaml").write_text(yaml.safe_dump(FACILITY, sort_keys=False))
        (self.directory / "decider.token").write_text(TOKEN + "\n")
        config = {
            "prometheus": {"url": self.prometheus_url, "timeout": "2s", "retries": 1},
            "facility": "facility.yaml",
            "listen": f"127.0.0.1:{port}",
            "database": "decider.db",
            "token_file": "decider.token",
            "refresh_interval": "1s",
            "staleness": {"readings": f"{READINGS_S}s", "inventory": "1h"},
        }
        path = self.directory / "decider.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    def start(self) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            port = free_port()
            self.url = f"http://127.0.0.1:{port}"
            config = self.write_files(port)
            with self.log_path.open("w") as log:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "decider.main", "--config", str(config)],
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._healthy():
                return
            self.stop()
            if "address already in use" not in self.log_tail().lower() or attempt == START_ATTEMPTS:
                pytest.fail(f"the decider did not start; its log ends:\n{self.log_tail()}")

    def _healthy(self) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + DEADLINE_S
        while self.process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(requests.RequestException):
                if self.session.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return True
            time.sleep(POLL_S)
        return False

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def get(self, path: str, **params: str) -> requests.Response:
        return self.session.get(self.url + path, params=params, timeout=10)

    def json(self, path: str, **params: str) -> Any:
        response = self.get(path, **params)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def place(self, replica: dict[str, Any], candidates: list[str]) -> dict[str, Any]:
        response = self.session.post(
            f"{self.url}/v1/placements",
            json={"replica": replica, "candidates": candidates},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return response.json()

    def domains(self) -> dict[str, dict[str, Any]]:
        """GET /v1/domains by `kind/name`, with `missing` under the key "missing"."""
        body = self.json("/v1/domains")
        found: dict[str, Any] = {f"{d['kind']}/{d['domain']}": d for d in body["domains"]}
        found["missing"] = body["missing"]
        return found

    def metric(self, name: str, **labels: str) -> float | None:
        text = self.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and sample.labels == labels:
                    return float(sample.value)
        return None


@pytest.fixture
def decider(backend: Backend, tmp_path: Path) -> Iterator[Decider]:
    directory = tmp_path / "decider"
    directory.mkdir()
    started = Decider(directory, backend.engine.url)
    try:
        started.start()
        yield started
    finally:
        started.stop()
        started.session.close()


def wait_for(decider: Decider, what: str, look: Callable[[], Any]) -> Any:
    """`look()`'s first truthy value, polled until DEADLINE_S; fails with the decider's log."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        found = look()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(
                f"no {what} within {DEADLINE_S:g}s; last seen: {found!r}\n"
                f"the decider's log ends:\n{decider.log_tail()}"
            )
        time.sleep(POLL_S)


def by_node(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {entry["node"]: entry for entry in answer["nodes"]}


def fits(headroom: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    return next(d for d in headroom["domains"] if (d["kind"], d["domain"]) == (kind, name))


# --- the scenario --------------------------------------------------------------------------

CANDIDATES = ["n1", "n3", "n2", "n4"]


def test_the_decider_against_a_real_engine(backend: Backend, decider: Decider):
    # 1. Every series read: r1 hot, r2 close to its cap.
    def loaded() -> dict[str, Any] | None:
        # The parts are queried in parallel: one refresh may straddle the first scrape.
        domains = decider.domains()
        r1, r2 = domains.get("rack/r1"), domains.get("rack/r2")
        read = (
            r1
            and r2
            and (r1["condition"], r1["reading_age_seconds"]) == ("hot", 4)
            and r2["measured_watts"] == 9000
            and f"site/{SITE}" in domains
            and decider.place(SMALL, CANDIDATES)["missing"] == []  # members, GPUs, limits
        )
        return domains if read else None

    domains = wait_for(decider, "snapshot with r1 hot and r2's measured power", loaded)
    ready = decider.json("/readyz")
    assert ready == {"ready": True, "prometheus_up": True, "missing": [], "database": "ok"}, ready
    assert domains["missing"] == []
    assert decider.metric("llmgw_decider_prometheus_up") == 1.0

    r1, r2, row = domains["rack/r1"], domains["rack/r2"], domains[f"row/{ROW}"]
    assert (r1["condition"], r1["measured_watts"], r1["reading_age_seconds"]) == ("hot", 5000, 4)
    assert r1["cap_watts"] == 20000 and r1["limit_watts"] == pytest.approx(R1_LIMIT)
    assert r2["cap_watts"] == pytest.approx(R2_CAP)  # the smaller feed × derating
    assert r2["limit_watts"] == pytest.approx(R2_LIMIT)
    assert (r2["condition"], r2["measured_watts"], r2["reading_age_seconds"]) == ("ok", 9000, 2)
    assert r2["other_watts"] == 500 and r2["load_watts"] == R2_LOAD
    assert r2["load_basis"] == "measured" and r2["headroom_watts"] == R2_CAP - R2_LOAD
    assert (row["cap_watts"], row["measured_watts"], row["condition"]) == (100000, 14000, "ok")
    assert domains["pdu/r2-b"]["condition"] == "warm"
    assert domains["pdu/r2-b"]["cap_watts"] is None and not domains["pdu/r2-b"]["declared"]
    assert domains[f"site/{SITE}"]["measured_watts"] == 14500
    assert {key for key in domains if key != "missing"} == {
        "rack/r1",
        "rack/r2",
        "pdu/r1-a",
        "pdu/r1-b",
        "pdu/r2-a",
        "pdu/r2-b",
        f"row/{ROW}",
        f"site/{SITE}",
    }

    # A big replica: r1 refused for the heat, r2 for power, with the measured figure.
    def refusals(rule: str) -> float | None:
        return decider.metric("llmgw_decider_refusals_total", call="placement", rule=rule)

    hot_before, power_before = refusals("hot"), refusals("power_cap")
    big = decider.place(BIG, CANDIDATES)
    nodes = by_node(big)
    assert big["mode"] == "enforce" and big["order"] == [] and big["missing"] == []
    assert big["summary"] == "0/4 nodes allowed (2 hot, 2 power_cap)"
    for node in ("n1", "n2"):
        assert nodes[node]["allowed"] is False
        assert nodes[node]["reasons"] == ["rack r1 hot (reading 4s old)"]
        assert nodes[node]["condition"] == "hot"
    for node in ("n3", "n4"):
        needs = derived(node, 4)
        assert nodes[node]["estimate_watts"] == needs  # the exporter's enforced limits
        assert nodes[node]["allowed"] is False
        assert nodes[node]["reasons"] == [
            f"rack r2: 9.5 of 12.0 kW measured (incl. 0.5 other), replica needs "
            f"~{needs / 1000:.1f}, margin 10%"
        ]
        assert nodes[node]["condition"] == "warm"  # the worst of its domains: pdu r2-b
        assert nodes[node]["headroom_watts"] == pytest.approx(R2_LIMIT - R2_LOAD - needs)
    assert nodes["n3"]["estimate_watts"] == 4 * 700 + 400 * 4 / 8
    assert nodes["n4"]["estimate_watts"] == 4 * 450 + 400 * 4 / 8  # its largest limit

    # A small replica fits in r2: n4 first, it leaves room for one more of its size.
    small = decider.place(SMALL, CANDIDATES)
    nodes = by_node(small)
    assert small["order"] == ["n4", "n3"], small
    assert small["summary"] == "2/4 nodes allowed (2 hot)"
    for node in ("n3", "n4"):
        assert nodes[node]["allowed"] is True and nodes[node]["reasons"] == []
        assert nodes[node]["estimate_watts"] == derived(node, 1)
        assert nodes[node]["headroom_watts"] == pytest.approx(R2_LIMIT - R2_LOAD - derived(node, 1))
    assert nodes["n4"]["scores"]["rack_room"] < nodes["n3"]["scores"]["rack_room"]
    assert [nodes[node]["allowed"] for node in ("n1", "n2")] == [False, False]

    # Headroom: r1 binds on heat, r2 on power.
    headroom = decider.json("/v1/headroom", profile="big-tp4")
    assert headroom["missing"] == []
    assert fits(headroom, "rack", "r1") == {
        "kind": "rack",
        "domain": "r1",
        "fits": 0,
        "binds": [{"reason": "rack r1 hot (reading 4s old)", "nodes": 2}],
    }
    r2_fit = fits(headroom, "rack", "r2")
    assert r2_fit["fits"] == 0
    assert sorted(bind["reason"] for bind in r2_fit["binds"]) == [
        "power: rack r2 has 1.3 kW left, a replica needs ~2.0",
        "power: rack r2 has 1.3 kW left, a replica needs ~3.0",
    ]
    # n3 takes one small replica (750 W of 1300), n4 one more (500 of the 550 left).
    assert fits(decider.json("/v1/headroom", profile="small-tp1"), "rack", "r2")["fits"] == 2

    assert decider.metric("llmgw_domain_power_budget_watts", kind="rack", domain="r2") == R2_CAP
    assert decider.metric("llmgw_domain_headroom_watts", kind="rack", domain="r2") == 2500
    assert (refusals("hot"), refusals("power_cap")) == (hot_before + 4, power_before + 2)

    # 2. The exporter fails: its readings leave the window (staleness.readings); its
    # membership, GPU counts and limits stay (read over staleness.inventory, 1h here).
    backend.exporter.failing = True

    def emptied() -> tuple[dict[str, Any], dict[str, Any]] | None:
        domains = decider.domains()
        keys = {key for key in domains if key != "missing"}
        if "pdu/r2-b" not in keys or not all(
            domains[key]["condition"] == "unknown" and domains[key]["measured_watts"] is None
            for key in keys
        ):
            return None
        return domains, decider.place(BIG, CANDIDATES)

    domains, unread = wait_for(decider, "every reading gone from the snapshot", emptied)
    assert domains["rack/r2"]["load_watts"] == 500  # other_watts alone: nothing reserved
    assert domains["rack/r1"]["reading_age_seconds"] is None
    assert decider.metric("llmgw_decider_prometheus_up") == 1.0  # the engine still answers
    # Nothing refused for lack of data; the budgets still hold on the known membership.
    assert all(entry["allowed"] for entry in unread["nodes"]), unread
    assert all(entry["condition"] == "unknown" for entry in unread["nodes"])
    assert unread["order"] == ["n1", "n2", "n4", "n3"]
    missing = " | ".join(unread["missing"])
    assert "no fresh measured power for 3 domains (rack/r1, rack/r2, row/row1)" in missing, missing
    assert "no fresh condition for " in missing, missing
    assert "membership unknown" not in missing, missing

    # 3. It answers again: the decider reads the same state back.
    backend.exporter.failing = False
    wait_for(decider, "r1 hot again", loaded)
    again = decider.place(BIG, CANDIDATES)
    assert again["order"] == [] and again["missing"] == []
    assert [entry["reasons"] for entry in again["nodes"]] == [
        entry["reasons"] for entry in big["nodes"]
    ]

    # 4. The engine stops: the readings go stale after staleness.readings and are named.
    backend.engine.process.terminate()
    backend.engine.process.wait(timeout=STOP_TIMEOUT_S)
    wait_for(
        decider,
        "llmgw_decider_prometheus_up 0",
        lambda: decider.metric("llmgw_decider_prometheus_up") == 0.0,
    )
    stale = (
        "domain measured power",
        "domain conditions",
        "domain reading ages",
        "measured tokens per joule per model and profile",
        "how long each hot domain has been hot",
        "what each domain's condition rests on",
    )

    def named() -> dict[str, Any] | None:
        domains = decider.domains()
        said = [
            line for line in domains["missing"] if f"older than its {READINGS_S}s limit" in line
        ]
        return domains if all(any(what in line for line in said) for what in stale) else None

    domains = wait_for(decider, "the stale readings named in missing", named)
    assert len(domains["missing"]) == len(stale), domains["missing"]  # inventory: usable 1h
    assert all("cannot reach" in line for line in domains["missing"]), domains["missing"]
    assert domains["rack/r1"]["condition"] == "unknown"
    assert domains["rack/r2"]["measured_watts"] is None
    assert domains["rack/r2"]["load_watts"] == 500
    assert "pdu/r2-b" in domains  # membership is inventory: still known

    ready = decider.json("/readyz")
    assert ready["ready"] is True and ready["prometheus_up"] is False
    assert ready["missing"] == domains["missing"]

    blind = decider.place(BIG, CANDIDATES)
    nodes = by_node(blind)
    assert all(entry["allowed"] for entry in blind["nodes"]), blind
    assert all(entry["condition"] == "unknown" for entry in blind["nodes"])
    assert blind["missing"] == domains["missing"]
    # The budgets still hold on what is known: the same estimates, the room of each rack.
    assert blind["order"] == ["n1", "n2", "n4", "n3"]
    for node in CANDIDATES:
        room = R1_LIMIT if rack_of(node) == "r1" else R2_LIMIT - 500
        assert nodes[node]["estimate_watts"] == derived(node, 4)
        assert nodes[node]["headroom_watts"] == pytest.approx(room - derived(node, 4))
    assert "Traceback" not in decider.log_path.read_text(), decider.log_tail()
