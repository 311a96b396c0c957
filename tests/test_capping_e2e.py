"""The capping loop for real (issue 20, "The loop for real, briefly"): real processes on
127.0.0.1, nothing faked but the GPUs.

- Two exporters (`python -m exporter`), nodes n1 and n2 of rack r1 (fed by pdus r1-a and
  r1-b), each on two fake H100s (tests/fake_nvml: range 200-700 W, default limit 700 W) with
  its own config file, whose `power_mw` is what the GPU would draw uncapped: the fake
  answers min(draw, the limit set), re-reading the file when it is replaced. Each runs the
  capping agent against the decider with its token.
- A real Prometheus scraping them every second, with the committed rules/*.yml and the site
  rules rendered from the facility file, every duration divided by `TIME_SCALE` (as the
  demo does: llmgw_sim.demo.scale), and a meter of each feed (a static target the test
  serves, `signals.power_watts` of the facility file).
- A real decider (`python -m decider.main`, tests/decider_harness.py) reading that
  Prometheus, with rack r1 `oversubscribe: true`, the ladder's hold and the lease 5 s, and
  a reservation of each shedding class: n1 runs the lowest class (batch), n2 the other.

Then, in one run: the load pushed between the thresholds caps the lowest class's node (the
lease carries the cap, the agent sets it, the fake's power falls: seen in the exporter's
/metrics and in Prometheus), the other node stays uncapped; the load lowered, the ladder
releases after its hold and the limits lift; a feed's meter reading 0, the batch node is
capped so that the worst case fits the surviving feed, and released once it reads again;
the decider killed, each agent falls to its lease's safe limit once the lease runs out,
never back to uncapped. The thresholds are the facility defaults as the code has them
(decider.facility.Ladder), and the test works out the draws from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from decider import facility as facility_file
from decider import rules_render
from exporter.sources import SOURCES
from llmgw_sim.demo.scale import scale_duration, scale_rules
from tests.decider_harness import Decider
from tests.exporter_helpers import serving_exporter
from tests.fake_nvml.build import ensure_built
from tests.promstack import Server, metrics_target, prometheus_with_config

pytestmark = pytest.mark.servers

REPO = Path(__file__).resolve().parents[1]
#: The rules' durations divided by this (30 s groups every 2 s), as the demo scales them.
TIME_SCALE = 15
#: Generous: every wait is on a condition; two busy cores may stretch each step.
WAIT_S = 60.0
POLL_S = 0.2
LEASE_S = 5.0
HOLD_S = 5.0

RACK = "r1"
FEEDS = ("r1-a", "r1-b")
RATING_W = 3000.0
DERATING = 0.8
GPU_LIMIT_W = 700.0  # each fake card's default limit (its range: 200-700 W)
GPUS_PER_NODE = 2
#: node -> the model of its reservation; the facility file gives each model its class.
NODES = {"n1": "small", "n2": "large"}
CLASSES = ["batch", "interactive"]  # lowest first: batch is capped first
MODELS = {"small": {"class": "batch"}, "large": {"class": "interactive"}}

FACILITY: dict[str, Any] = {
    "mode": "observe",
    "defaults": {"margin": 0.0, "derating": DERATING},
    "node_share_watts": 0,
    "classes": CLASSES,
    "models": MODELS,
    "signals": {
        "power_watts": {
            "query": "sum by (pdu) (llmgw_test_feed_power_watts)",
            "domain_label": "pdu",
            "stale_after": "2m",
        }
    },
    "oversubscription": {"ladder": {"hold": f"{HOLD_S:g}s"}, "lease": f"{LEASE_S:g}s"},
    "domains": {
        f"rack/{RACK}": {
            "feeds": [{"pdu": pdu, "rating_watts": RATING_W} for pdu in FEEDS],
            "oversubscribe": True,
        },
    },
}


# --- the nodes ------------------------------------------------------------------------------


def uuids(node: str) -> list[str]:
    return [f"GPU-{node}-{index}" for index in range(GPUS_PER_NODE)]


@dataclass
class Node:
    """One node's files: its fake NVML config (rewritten to change the draw), the fake's
    driver state, the agent's config and state."""

    name: str
    root: Path
    draw_w: float = 300.0
    url: str = ""
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "sys").mkdir(exist_ok=True)
        self.log = self.root / "exporter.log"

    @property
    def nvml(self) -> Path:
        return self.root / "nvml.json"

    def set_draw(self, watts: float) -> None:
        """What each GPU draws uncapped; written atomically (the fake re-reads a replaced
        file at its next call)."""
        self.draw_w = watts
        devices = [
            {
                "name": "NVIDIA H100 80GB HBM3",
                "uuid": uuid,
                "temperature_c": 60,
                "power_mw": round(watts * 1000),
                "enforced_power_limit_mw": round(GPU_LIMIT_W * 1000),
                "default_power_limit_mw": round(GPU_LIMIT_W * 1000),
                "power_limit_constraints_mw": [200_000, round(GPU_LIMIT_W * 1000)],
                "total_energy_mj": 1_000_000_000,
            }
            for uuid in uuids(self.name)
        ]
        tmp = self.nvml.with_suffix(".tmp")
        tmp.write_text(json.dumps({"devices": devices}))
        os.replace(tmp, self.nvml)

    def agent_yaml(self, decider_url: str, token: str) -> Path:
        token_file = self.root / "token"
        token_file.write_text(token + "\n")
        sources: dict[str, Any] = {name: {"enabled": False} for name in SOURCES}
        sources["gpu"] = {"interval": "500ms", "library": str(ensure_built())}
        agent = self.root / "agent.yaml"
        agent.write_text(
            yaml.safe_dump(
                {
                    "node": self.name,
                    "labels": {"llmgw.io/rack": RACK, "llmgw.io/pdu": ",".join(FEEDS)},
                    "sources": sources,
                    "capping": {
                        "enabled": True,
                        "decider_url": decider_url,
                        "token_file": str(token_file),
                        "state_file": str(self.root / "capping-state.json"),
                        "timeout": "2s",
                        "retry": "1s",
                    },
                }
            )
        )
        return agent

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        return {
            (sample.name, frozenset((k, v) for k, v in sample.labels.items() if k != "node")): (
                sample.value
            )
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def gpus(self, metrics: dict, name: str) -> list[float | None]:
        return [
            metrics.get((name, frozenset({("gpu", str(index)), ("uuid", uuid)})))
            for index, uuid in enumerate(uuids(self.name))
        ]

    def state(self, metrics: dict) -> str | None:
        on = [
            state
            for state in ("leased", "safe", "off")
            if metrics.get(("llmgw_capping_agent_state", frozenset({("state", state)}))) == 1
        ]
        return on[0] if len(on) == 1 else None


@contextlib.contextmanager
def exporter(node: Node, decider_url: str, token: str) -> Iterator[Node]:
    env = {
        **os.environ,
        "FAKE_NVML_CONFIG": str(node.nvml),
        "FAKE_NVML_STATE": str(node.root / "nvml-state.json"),
    }
    args = ["--config", str(node.agent_yaml(decider_url, token)), "--sysfs", str(node.root / "sys")]
    with serving_exporter(
        args, env, node.log, lambda body: "llmgw_capping_agent_state" in body
    ) as url:
        node.url = url
        yield node


# --- the feeds' meters ----------------------------------------------------------------------


@dataclass
class Meters:
    """Each feed's reading, served as `llmgw_test_feed_power_watts{pdu}`."""

    watts: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def set(self, readings: dict[str, float]) -> None:
        with self.lock:
            self.watts.update(readings)

    def body(self) -> bytes:
        with self.lock:
            lines = [
                f'llmgw_test_feed_power_watts{{pdu="{pdu}"}} {watts:g}'
                for pdu, watts in sorted(self.watts.items())
            ]
        return ("\n".join(lines) + "\n").encode()


# --- Prometheus -----------------------------------------------------------------------------


def rule_files(directory: Path) -> list[Path]:
    """rules/*.yml and the site rules of FACILITY, every duration divided by TIME_SCALE."""
    directory.mkdir(parents=True, exist_ok=True)
    facility_path = directory / "facility.yaml"
    facility_path.write_text(yaml.safe_dump(FACILITY))
    written = []
    for source in sorted((REPO / "rules").glob("*.yml")):
        target = directory / source.name
        target.write_text(scale_rules(source.read_text(), TIME_SCALE, source=source.name))
        written.append(target)
    site = directory / "site.yml"
    rendered = rules_render.render(facility_file.load(facility_path), source="facility.yaml")
    site.write_text(scale_rules(rendered, TIME_SCALE, source="site"))
    written.append(site)
    return written


@contextlib.contextmanager
def prometheus(workdir: Path, meter: str) -> Iterator[tuple[Server, Path]]:
    """Prometheus scraping the meter, and the exporters named in a file_sd file (written
    once they run: they need the decider's URL, the decider needs Prometheus's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    targets = workdir / "exporters.json"
    targets.write_text("[]\n")
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files(workdir / "rules")],
        "scrape_configs": [
            {"job_name": "llmgw-exporter", "file_sd_configs": [{"files": [str(targets)]}]},
            {"job_name": "feeds", "static_configs": [{"targets": [meter]}]},
        ],
    }
    with prometheus_with_config(workdir, config) as server:
        yield server, targets


def query(server: Server, expr: str) -> dict[str, float]:
    """An instant query's answer: node/gpu label pairs -> value."""
    answer = requests.get(f"{server.url}/api/v1/query", params={"query": expr}, timeout=5)
    answer.raise_for_status()
    return {
        f"{item['metric'].get('node', '')}/{item['metric'].get('gpu', '')}": float(item["value"][1])
        for item in answer.json()["data"]["result"]
    }


# --- waiting --------------------------------------------------------------------------------


@dataclass
class Site:
    prometheus: Server
    decider: Decider
    nodes: dict[str, Node]
    meters: Meters
    started: float = field(default_factory=time.monotonic)

    def logs(self) -> str:
        parts = [f"--- decider\n{self.decider.log_tail(30)}"]
        for node in self.nodes.values():
            tail = "\n".join(node.log.read_text(errors="replace").splitlines()[-15:])
            parts.append(f"--- exporter {node.name}\n{tail}")
        parts.append(f"--- prometheus\n{self.prometheus.log_tail(10)}")
        return "\n".join(parts)

    def wait(self, condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
        """The first true value of `condition()`, polled until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            try:
                last = condition()
            except requests.RequestException as exc:
                last = exc
            if last and not isinstance(last, Exception):
                return last
            if time.monotonic() > deadline:
                pytest.fail(
                    f"never saw {what} in {timeout_s:g} s (last: {last!r}); "
                    f"GET /v1/capping: {self.capping_or_none()}\n{self.logs()}"
                )
            time.sleep(POLL_S)

    def capping_or_none(self) -> Any:
        with contextlib.suppress(requests.RequestException, ValueError):
            return self.decider.get("/v1/capping").json()
        return None

    def rack(self) -> dict[str, Any] | None:
        for domain in self.decider.get("/v1/capping").json()["domains"]:
            if (domain["kind"], domain["domain"]) == ("rack", RACK):
                return domain
        return None

    def lease(self, node: str) -> dict[str, Any] | None:
        answer = self.decider.get(
            f"/v1/capping/leases/{node}", headers=self.decider.headers(), timeout=5
        )
        return answer.json() if answer.status_code == 200 else None

    def set_load(self, draws: dict[str, float]) -> None:
        """Each node's GPUs' draw, and the feeds' meters reading half the rack each."""
        for name, watts in draws.items():
            self.nodes[name].set_draw(watts)
        total = sum(node.draw_w * GPUS_PER_NODE for node in self.nodes.values())
        self.meters.set(dict.fromkeys(FEEDS, total / 2))


def at_limit(node: Node, limit: float | None, state: str) -> Callable[[], dict | None]:
    """The node's /metrics once both its GPUs are held at `limit` by the agent (None: the
    card's default, no cap), in agent state `state`, and draw what the fake then gives."""

    def holds() -> dict | None:
        metrics = node.metrics()
        enforced = GPU_LIMIT_W if limit is None else limit
        if (
            node.state(metrics) == state
            and node.gpus(metrics, "llmgw_gpu_power_cap_watts") == [limit] * GPUS_PER_NODE
            and node.gpus(metrics, "llmgw_gpu_power_limit_watts") == [enforced] * GPUS_PER_NODE
            and node.gpus(metrics, "llmgw_gpu_power_watts")
            == [min(node.draw_w, enforced)] * GPUS_PER_NODE
        ):
            return metrics
        return None

    return holds


def in_prometheus(
    site: Site, node: Node, watts: float, series: str = "llmgw_gpu_power_watts"
) -> Callable[[], bool]:
    """Prometheus's latest sample of `series` for each of the node's GPUs is `watts`."""

    def holds() -> bool:
        seen = query(site.prometheus, f'{series}{{node="{node.name}"}}')
        return sorted(seen.values()) == [watts] * GPUS_PER_NODE

    return holds


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    meters = Meters()
    with contextlib.ExitStack() as stack:
        meter = stack.enter_context(metrics_target(meters.body))
        server, targets = stack.enter_context(prometheus(tmp_path / "prometheus", meter))
        decider = Decider(
            tmp_path / "decider",
            server.url,
            FACILITY,
            refresh_interval="500ms",
            readings=scale_duration("2m", TIME_SCALE),
            inventory=scale_duration("1h", TIME_SCALE),
        )
        stack.callback(decider.close)
        decider.start(wait_ready=True)
        assert decider.token is not None
        nodes = {name: Node(name, tmp_path / name) for name in NODES}
        site = Site(server, decider, nodes, meters)
        site.set_load(dict.fromkeys(NODES, 300.0))
        for node in nodes.values():
            stack.enter_context(exporter(node, decider.url, decider.token))
        targets.write_text(
            json.dumps([{"targets": [node.url.removeprefix("http://") for node in nodes.values()]}])
        )
        yield site


# --- the test -------------------------------------------------------------------------------


def test_the_ladder_caps_releases_and_the_agents_fall_to_the_safe_limit(site: Site):
    settings = facility_file.Ladder()  # the thresholds as the code has them now
    first, second, margin = (
        settings.first_threshold,
        settings.second_threshold,
        settings.release_margin,
    )
    facility = facility_file.Facility.model_validate(FACILITY)
    lowest = min(CLASSES, key=facility.class_rank)
    batch = next(node for node, model in NODES.items() if MODELS[model]["class"] == lowest)
    other = next(node for node in NODES if node != batch)
    figures: dict[str, float] = {}

    for rid, (node, model) in enumerate(NODES.items()):
        replica = {
            "model": model,
            "profile": "p",
            "gpus": GPUS_PER_NODE,
            "power_watts": GPUS_PER_NODE * GPU_LIMIT_W,
        }
        answer = site.decider.reserve(f"r{rid}", node, replica)
        assert answer.status_code == 201, answer.text

    # The decider sees the rack through Prometheus: its budget, both nodes, both classes.
    rack = site.wait(
        lambda: (
            (r := site.rack())
            and r["power_watts"] is not None
            and sorted(r["nodes"]) == sorted(NODES)
            and {c["class"] for c in r["classes"]} == set(CLASSES)
            and r
        ),
        "rack r1's ladder with both nodes and classes",
    )
    budget = rack["budget_watts"]
    assert budget == pytest.approx(RATING_W * DERATING)
    assert rack["step"] == 0, rack
    # Each card's minimum came the whole way (NVML's range, the exporter, Prometheus, the
    # decider's min_limits part): 200 W read, not the estimate, 30 % of 700 W = 210 W.
    rack = site.wait(
        lambda: (
            (r := site.rack())
            and all(c["min_limit_from"].startswith("read: ") for c in r["classes"])
            and r
        ),
        "the cards' minimum read",
    )
    assert {c["min_limit_watts"] for c in rack["classes"]} == {200.0}, rack
    gpus = GPUS_PER_NODE * len(NODES)
    # Past the first threshold, short of the second: the other class at its limit (so the
    # capped power stays above the release line: no release while the load lasts), the
    # lowest class drawing the rest.
    high_total = (first + second) / 2 * budget
    high_batch = (high_total - GPUS_PER_NODE * GPU_LIMIT_W) / GPUS_PER_NODE
    assert 0 < high_batch < GPU_LIMIT_W, f"the site cannot sit between {first} and {second}"
    high_total = GPUS_PER_NODE * (GPU_LIMIT_W + high_batch)
    assert first * budget < high_total < second * budget
    # Below the release line, with the lowest class drawing more than a lost feed allows it
    # (the survivor carries rating x derating: the worst case must fit that).
    feed_cap = (RATING_W * DERATING - GPUS_PER_NODE * GPU_LIMIT_W) / GPUS_PER_NODE
    low = {batch: min(GPU_LIMIT_W, feed_cap + 100.0), other: 250.0}
    assert sum(low.values()) * GPUS_PER_NODE < (first - margin) * budget

    # Both nodes hold an uncapped lease first.
    for node in site.nodes.values():
        site.wait(at_limit(node, None, "leased"), f"{node.name}'s first, uncapped lease")

    # 1. Load past the first threshold: the lowest class's node is capped, the other not.
    pushed = time.monotonic()
    site.set_load({batch: high_batch, other: GPU_LIMIT_W})
    capped = site.wait(
        lambda: (lease := site.lease(batch)) and lease["gpu_limit_watts"] is not None and lease,
        f"{batch}'s lease capped",
    )
    figures["overload to the lease's cap"] = time.monotonic() - pushed
    cap = capped["gpu_limit_watts"]
    assert cap < high_batch, capped  # the cap is under the draw: the power must fall
    rack = site.rack()
    assert rack is not None and rack["step"] == 1 and set(rack["caps"]) == {lowest}, rack
    site.wait(at_limit(site.nodes[batch], cap, "leased"), f"{batch}'s GPUs at {cap:g} W")
    figures["overload to the GPUs at the cap (exporter)"] = time.monotonic() - pushed
    site.wait(in_prometheus(site, site.nodes[batch], cap), f"Prometheus reading {cap:g} W")
    figures["overload to the cap in Prometheus"] = time.monotonic() - pushed
    lease = site.lease(other)
    assert lease is not None and lease["gpu_limit_watts"] is None, lease
    metrics = at_limit(site.nodes[other], None, "leased")()
    assert metrics is not None, site.nodes[other].metrics()
    assert site.nodes[other].gpus(metrics, "llmgw_gpu_power_watts") == [GPU_LIMIT_W] * 2

    # 2. Load lowered: the ladder releases after its hold; the caps lift.
    lowered = time.monotonic()
    site.set_load(low)
    site.wait(at_limit(site.nodes[batch], None, "leased"), f"{batch}'s cap lifted")
    figures["load lowered to the cap lifted"] = time.monotonic() - lowered
    # Never sooner than the hold: the power reads under the release line after the load fell.
    assert figures["load lowered to the cap lifted"] >= HOLD_S, figures
    rack = site.rack()
    assert rack is not None and rack["step"] == 0 and rack["caps"] == {}, rack
    site.wait(in_prometheus(site, site.nodes[batch], low[batch]), "Prometheus uncapped")

    # 3. A feed's meter reads 0: the lowest class capped so the worst case fits the survivor.
    lost = time.monotonic()
    site.meters.set({FEEDS[0]: 0.0})
    feed_caps: list[float] = []  # each cap the batch node's leases carried, in order

    def applied_the_leased_cap() -> float | None:
        lease = site.lease(batch)
        limit = None if lease is None else lease["gpu_limit_watts"]
        if limit is None:
            return None
        if not feed_caps or feed_caps[-1] != limit:
            feed_caps.append(limit)
        if at_limit(site.nodes[batch], limit, "leased")() is None:
            return None
        # The lease read again after: the agent holds the cap the decider gives now.
        again = site.lease(batch)
        return limit if again is not None and again["gpu_limit_watts"] == limit else None

    feed_limit = site.wait(applied_the_leased_cap, f"{batch} capped for the lost feed")
    figures["feed lost to the GPUs at the survivor's cap"] = time.monotonic() - lost
    assert feed_limit <= feed_cap < low[batch], feed_caps
    rack = site.rack()
    assert rack is not None and rack["lost_feed"] is not None, rack
    assert rack["lost_feed"]["pdus"] == [FEEDS[0]], rack
    assert set(rack["caps"]) == {lowest}, rack
    assert rack["worst_case_watts"] <= rack["lost_feed"]["survivor_watts"], rack
    assert site.lease(other)["gpu_limit_watts"] is None
    site.set_load(low)  # the meter reads again
    site.wait(at_limit(site.nodes[batch], None, "leased"), f"{batch} released, the feed back")

    # 4. The decider killed: once the lease runs out, each agent applies its safe limit.
    safe = {name: site.lease(name)["safe_gpu_limit_watts"] for name in site.nodes}
    for name, limit in safe.items():
        assert limit < GPU_LIMIT_W, f"{name}'s safe limit {limit} is no cap"
    killed = time.monotonic()
    site.decider.kill()  # reaped: no lease is renewed from here on
    expiry_key = ("llmgw_capping_lease_expiry_timestamp_seconds", frozenset())
    expiries = {name: node.metrics()[expiry_key] for name, node in site.nodes.items()}
    for name, node in site.nodes.items():
        site.wait(at_limit(node, safe[name], "safe"), f"{name} at its safe limit {safe[name]:g} W")
        # Kept its lease to the end: the safe limit came once it ran out, not before.
        assert time.time() >= expiries[name], (name, expiries[name])
    figures["decider killed to both at the safe limit"] = time.monotonic() - killed
    for name, node in site.nodes.items():
        site.wait(
            in_prometheus(site, node, safe[name], "llmgw_gpu_power_limit_watts"),
            f"Prometheus reading {name}'s GPUs limited to {safe[name]:g} W",
        )
        site.wait(
            in_prometheus(site, node, min(node.draw_w, safe[name])),
            f"Prometheus reading {name}'s power under its safe limit",
        )
        metrics = node.metrics()
        failing = ("llmgw_capping_agent_failing", frozenset({("reason", "decider")}))
        assert metrics.get(failing) == 1, metrics
    print(
        "\ncapping loop: "
        + "; ".join(f"{what} {seconds:.1f} s" for what, seconds in figures.items())
        + f" (cap {cap:g} W, feed caps {feed_caps} W, safe {safe}, budget {budget:g} W,"
        f" {gpus} GPUs, total run {time.monotonic() - site.started:.0f} s)"
    )
