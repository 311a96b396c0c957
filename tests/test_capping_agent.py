"""The capping agent (issue 20, item 3) in the real exporter process.

Each test runs `python -m exporter` with the fake NVML (tests/fake_nvml: two H100s that
draw 650 W, range 200-700 W, default limit 700 W) and a small lease server of its own on
127.0.0.1 (http.server, answering `GET /v1/capping/leases/{node}` as the contract says).
What the cards hold is read from outside twice: through the exporter's /metrics (its own
GPU readings and the agent's series), and from the fake's state file (FAKE_NVML_STATE),
which is also what the "driver" keeps across an exporter restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.sources import SOURCES
from tests.exporter_helpers import serving_exporter
from tests.fake_nvml.build import ensure_built

pytestmark = pytest.mark.servers

NODE = "gpu-r1-01"
TOKEN = "capping-test-token"
UUIDS = ("GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111")
#: Generous: the machine's two cores are shared by every test running now.
WAIT_S = 45.0


# --- the decider's side: a lease server ---------------------------------------------------------


@dataclass
class LeaseServer:
    """Serves leases for NODE; `mode` says how it answers the next request."""

    mode: str = "lease"  # lease | 404 | 500 | garbage | wrong-token | stuck
    gpu_limit_watts: float | None = 410.0
    safe_gpu_limit_watts: float = 450.0
    lease_seconds: float = 6.0
    requests: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    httpd: ThreadingHTTPServer | None = None
    #: Set at the end: lets a handler held in `stuck` mode go.
    released: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        assert self.httpd is not None
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, path: str, authorization: str | None) -> tuple[int, bytes]:
        with self.lock:
            self.requests += 1
            mode = self.mode
            lease = {
                "node": NODE,
                "issued_at": time.time(),
                "lease_seconds": self.lease_seconds,
                "gpu_limit_watts": self.gpu_limit_watts,
                "safe_gpu_limit_watts": self.safe_gpu_limit_watts,
                "reason": f"rack r1 at step 1 (test lease of {self.gpu_limit_watts} W)",
                "domains": ["rack/r1"],
            }
        if mode == "stuck":  # a decider that accepts the request and never answers
            self.released.wait(120)
        expected = TOKEN if mode != "wrong-token" else "another-token"
        if authorization != f"Bearer {expected}":
            return 401, json.dumps({"error": "a bearer token is needed"}).encode()
        if path != f"/v1/capping/leases/{NODE}":
            return 404, json.dumps({"detail": "Not Found"}).encode()
        if mode == "404":
            return 404, json.dumps(
                {"error": f"node {NODE} is in no oversubscribed domain"}
            ).encode()
        if mode == "500":
            return 500, b'{"error": "internal error"}'
        if mode == "garbage":
            return 200, b"<html>a proxy's error page</html>"
        return 200, json.dumps(lease).encode()

    def set(self, **changes: Any) -> None:
        with self.lock:
            for key, value in changes.items():
                setattr(self, key, value)


def handler_for(server: LeaseServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = server.answer(self.path, self.headers.get("Authorization"))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client gone
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            """Quiet: the test reads the exporter's log, not this one's."""

    return Handler


@contextlib.contextmanager
def lease_server(port: int = 0, **settings: Any) -> Iterator[LeaseServer]:
    server = LeaseServer(**settings)
    server.httpd = ThreadingHTTPServer(("127.0.0.1", port), handler_for(server))
    server.httpd.daemon_threads = True
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.released.set()
        server.httpd.shutdown()
        server.httpd.server_close()
        thread.join(10)


# --- the node's side: the exporter, the fake NVML -----------------------------------------------


def h100(uuid: str) -> dict[str, Any]:
    return {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": uuid,
        "temperature_c": 60,
        "power_mw": 650_000,
        "enforced_power_limit_mw": 700_000,
        "default_power_limit_mw": 700_000,
        "power_limit_constraints_mw": [200_000, 700_000],
        "total_energy_mj": 1_000_000_000,
    }


@dataclass
class Node:
    root: Path
    decider_url: str = "http://127.0.0.1:9"  # nothing listens: a decider that is down
    set_errors: dict[str, str] = field(default_factory=dict)
    name: str = NODE
    token: str = TOKEN

    @property
    def nvml_state(self) -> Path:
        return self.root / "nvml-state.json"

    @property
    def agent_state(self) -> Path:
        return self.root / "capping-state.json"

    def card_limits_w(self) -> dict[str, float]:
        """What the fake "driver" holds, by uuid (W): limits set by any process."""
        if not self.nvml_state.exists():
            return {}
        limits = json.loads(self.nvml_state.read_text())["power_limits_mw"]
        return {uuid: mw / 1000 for uuid, mw in limits.items()}

    def write(self) -> dict[str, Path]:
        devices = [h100(uuid) for uuid in UUIDS]
        for device in devices:
            device["errors"] = dict(self.set_errors)
        nvml = self.root / "nvml.json"
        nvml.write_text(json.dumps({"devices": devices}))
        token = self.root / "token"
        token.write_text(self.token + "\n")
        sources: dict[str, Any] = {name: {"enabled": False} for name in SOURCES}
        sources["gpu"] = {"interval": "500ms", "library": str(ensure_built())}
        agent = self.root / "agent.yaml"
        agent.write_text(
            yaml.safe_dump(
                {
                    "node": self.name,
                    "sources": sources,
                    "capping": {
                        "enabled": True,
                        "decider_url": self.decider_url,
                        "token_file": str(token),
                        "state_file": str(self.agent_state),
                        "timeout": "3s",
                        "retry": "1s",
                    },
                }
            )
        )
        (self.root / "sys").mkdir(exist_ok=True)
        return {"agent": agent, "nvml": nvml}


@dataclass
class Running:
    url: str
    log: Path

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        text = requests.get(f"{self.url}/metrics", timeout=5).text
        return {
            (sample.name, frozenset((k, v) for k, v in sample.labels.items() if k != "node")): (
                sample.value
            )
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def log_text(self) -> str:
        return self.log.read_text()


def value(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))


def gpu_watts(metrics: dict, name: str) -> list[float | None]:
    return [value(metrics, name, gpu=str(i), uuid=uuid) for i, uuid in enumerate(UUIDS)]


def state_of(metrics: dict) -> str | None:
    states = [
        s
        for s in ("leased", "safe", "off")
        if value(metrics, "llmgw_capping_agent_state", state=s) == 1
    ]
    return states[0] if len(states) == 1 else None


def wait_for(
    running: Running,
    holds: Callable[[dict], bool],
    what: str,
    watch: Callable[[dict], None] = lambda m: None,
) -> dict:
    """The first /metrics for which `holds`; `watch` sees every one read on the way."""
    deadline = time.monotonic() + WAIT_S
    while True:
        metrics = running.metrics()
        watch(metrics)
        if holds(metrics):
            return metrics
        if time.monotonic() > deadline:
            pytest.fail(
                f"never saw {what} in {WAIT_S:g} s; last /metrics:\n{metrics}\n"
                f"log:\n{running.log_text()}"
            )
        time.sleep(0.2)


@contextlib.contextmanager
def exporter(node: Node, log_name: str = "exporter.log") -> Iterator[Running]:
    paths = node.write()
    env = {
        **os.environ,
        "FAKE_NVML_CONFIG": str(paths["nvml"]),
        "FAKE_NVML_STATE": str(node.nvml_state),
    }
    args = ["--config", str(paths["agent"]), "--sysfs", str(node.root / "sys")]
    log = node.root / log_name
    with serving_exporter(args, env, log, lambda body: "llmgw_capping_agent_state" in body) as url:
        yield Running(url, log)


def leased_at(watts: float) -> Callable[[dict], bool]:
    def holds(metrics: dict) -> bool:
        return (
            state_of(metrics) == "leased"
            and gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [watts, watts]
            and gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [watts, watts]
        )

    return holds


def safe_at(watts: float) -> Callable[[dict], bool]:
    def holds(metrics: dict) -> bool:
        return (
            state_of(metrics) == "safe"
            and gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [watts, watts]
            and gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [watts, watts]
        )

    return holds


def never_uncapped(metrics: dict) -> None:
    limits = gpu_watts(metrics, "llmgw_gpu_power_limit_watts")
    assert 700.0 not in limits, f"a GPU went back to its 700 W default on its own: {limits}"


def change_lines(log: str) -> list[str]:
    return re.findall(r"capping: GPU \d \(\S+\) power limit .*", log)


# --- the tests ----------------------------------------------------------------------------------


def test_a_lease_caps_every_gpu_and_the_power_follows(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            metrics = wait_for(running, leased_at(410.0), "both GPUs leased at 410 W")
            assert gpu_watts(metrics, "llmgw_gpu_power_watts") == [410.0, 410.0]  # was 650
            assert value(metrics, "llmgw_capping_agent_up") == 1
            assert value(metrics, "llmgw_capping_safe_gpu_limit_watts") == 450.0
            expiry = value(metrics, "llmgw_capping_lease_expiry_timestamp_seconds")
            assert expiry is not None and time.time() < expiry <= time.time() + 6
            assert node.card_limits_w() == dict.fromkeys(UUIDS, 410.0)
            lines = change_lines(running.log_text())
            assert len(lines) == 2, lines
            for index, uuid in enumerate(UUIDS):
                assert any(
                    line.startswith(
                        f"capping: GPU {index} ({uuid}) power limit 700 W -> 410 W: lease until "
                    )
                    and "rack r1 at step 1" in line
                    for line in lines
                ), lines
            saved = json.loads(node.agent_state.read_text())
            assert saved["lease"]["safe_gpu_limit_watts"] == 450.0
            assert saved["capped"] == dict.fromkeys(UUIDS, 410.0)


def test_renewals_keep_the_lease_and_carry_a_new_cap(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0, lease_seconds=3.0) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
            first = server.requests
            first_expiry = value(running.metrics(), "llmgw_capping_lease_expiry_timestamp_seconds")
            # Renewed every lease_seconds / 3 = 1 s: several renewals, never the safe cap.
            wait_for(
                running,
                lambda m: server.requests >= first + 4 and state_of(m) == "leased",
                "four renewals",
                watch=lambda m: assert_not_safe(m),
            )
            later = value(running.metrics(), "llmgw_capping_lease_expiry_timestamp_seconds")
            assert later is not None and first_expiry is not None and later > first_expiry
            server.set(gpu_limit_watts=520.0)
            wait_for(running, leased_at(520.0), "the renewed lease's 520 W")
            assert node.card_limits_w() == dict.fromkeys(UUIDS, 520.0)
            assert "power limit 410 W -> 520 W: lease until" in running.log_text()


def assert_not_safe(metrics: dict) -> None:
    assert state_of(metrics) != "safe", "a lease renewed in time fell to the safe cap"


def test_the_decider_gone_the_safe_cap_follows_the_lease_never_uncapped(tmp_path: Path):
    with lease_server(
        gpu_limit_watts=410.0, safe_gpu_limit_watts=450.0, lease_seconds=3.0
    ) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
            server_stopped_at = time.time()
            expiry = value(running.metrics(), "llmgw_capping_lease_expiry_timestamp_seconds")
            server.httpd.shutdown()  # the decider is gone
            server.httpd.server_close()
            metrics = wait_for(running, safe_at(450.0), "the safe cap", watch=never_uncapped)
            assert expiry is not None and time.time() >= expiry > server_stopped_at - 6
            assert value(metrics, "llmgw_capping_agent_failing", reason="decider") == 1
            assert value(metrics, "llmgw_capping_agent_up") == 0
            assert gpu_watts(metrics, "llmgw_gpu_power_watts") == [450.0, 450.0]
            # Long after, still the safe cap: the agent never uncaps on its own.
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                metrics = running.metrics()
                never_uncapped(metrics)
                assert safe_at(450.0)(metrics), metrics
                time.sleep(0.3)
            log = running.log_text()
            assert "capping: no lease: cannot reach the decider" in log
            assert "power limit 410 W -> 450 W: safe cap: no lease renewed" in log


def test_a_restart_without_the_decider_applies_the_saved_safe_cap(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0, safe_gpu_limit_watts=450.0) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
    # The decider is gone; the driver still holds 410 W; a new exporter process starts.
    assert node.card_limits_w() == dict.fromkeys(UUIDS, 410.0)
    with exporter(node, "restarted.log") as running:
        # The safe cap is applied before the first lease is asked for, so a scrape may see it
        # before the decider's failure: wait for both.
        wait_for(
            running,
            lambda m: (
                safe_at(450.0)(m) and value(m, "llmgw_capping_agent_failing", reason="decider") == 1
            ),
            "the saved lease's safe cap, and the decider's failure",
            watch=never_uncapped,
        )
        assert node.card_limits_w() == dict.fromkeys(UUIDS, 450.0)
        assert "at start before the first lease" in running.log_text()


def test_a_first_start_without_a_lease_leaves_the_gpus_alone(tmp_path: Path):
    node = Node(tmp_path)  # no decider, no state file
    with exporter(node) as running:
        metrics = wait_for(
            running,
            lambda m: value(m, "llmgw_capping_agent_failing", reason="decider") == 1,
            "the decider's failure",
        )
        assert state_of(metrics) == "off"
        assert gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [None, None]
        assert gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [700.0, 700.0]
        assert node.card_limits_w() == {}


@pytest.mark.parametrize(
    ("mode", "logged"),
    [
        ("garbage", "the decider's answer is not a lease"),
        ("500", "the decider answered 500"),
        ("wrong-token", "the decider refused the token (401)"),
    ],
)
def test_a_bad_answer_keeps_the_lease_then_falls_to_the_safe_cap(
    tmp_path: Path, mode: str, logged: str
):
    with lease_server(
        gpu_limit_watts=410.0, safe_gpu_limit_watts=450.0, lease_seconds=6.0
    ) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
            server.set(mode=mode)
            metrics = wait_for(running, safe_at(450.0), "the safe cap", watch=never_uncapped)
            assert value(metrics, "llmgw_capping_agent_failing", reason="decider") == 1
            log = running.log_text()
            failure = log.index(f"capping: no lease: {logged}")
            to_safe = log.index("power limit 410 W -> 450 W: safe cap: no lease renewed")
            # Kept: the failure is seen first, and nothing changed until the lease ran out.
            assert failure < to_safe
            assert change_lines(log[failure:to_safe]) == []
            assert logged in log[to_safe:].splitlines()[0]
            # The decider answers again: the lease is back.
            server.set(mode="lease", gpu_limit_watts=420.0)
            wait_for(running, leased_at(420.0), "a lease again")


def test_a_cap_outside_the_cards_range_is_refused_and_logged(tmp_path: Path):
    with lease_server(gpu_limit_watts=150.0) as server:  # the cards' range is 200-700 W
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            metrics = wait_for(
                running,
                lambda m: value(m, "llmgw_capping_agent_failing", reason="refused") == 1,
                "the refusal",
            )
            assert gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [700.0, 700.0]
            assert gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [None, None]
            assert value(metrics, "llmgw_capping_agent_up") == 0
            assert node.card_limits_w() == {}
            refusal = (
                f"capping: GPU 0 ({UUIDS[0]}): refusing 150 W: outside the card's range"
                " 200 W to 700 W; keeping 700 W (the lease's cap)"
            )
            assert refusal in running.log_text()
            # Logged once, not at every renewal (every 2 s).
            renewals = server.requests
            wait_for(running, lambda m: server.requests >= renewals + 2, "two more renewals")
            assert running.log_text().count(refusal) == 1
            server.set(gpu_limit_watts=410.0)
            metrics = wait_for(running, leased_at(410.0), "the next lease, in range")
            assert value(metrics, "llmgw_capping_agent_failing", reason="refused") is None
            # Now capped, a refused cap keeps the 410 W the agent set.
            server.set(gpu_limit_watts=900.0)
            metrics = wait_for(
                running,
                lambda m: value(m, "llmgw_capping_agent_failing", reason="refused") == 1,
                "the second refusal",
            )
            assert gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [410.0, 410.0]
            assert gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [410.0, 410.0]
            assert "refusing 900 W: outside the card's range 200 W to 700 W; keeping 410 W" in (
                running.log_text()
            )


def test_no_permission_is_a_clear_error_never_a_crash(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0) as server:
        node = Node(tmp_path, server.url, {"nvmlDeviceSetPowerManagementLimit": "NO_PERMISSION"})
        with exporter(node) as running:
            metrics = wait_for(
                running,
                lambda m: value(m, "llmgw_capping_agent_failing", reason="nvml") == 1,
                "the NVML failure",
            )
            assert value(metrics, "llmgw_capping_agent_up") == 0
            assert gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [700.0, 700.0]
            assert gpu_watts(metrics, "llmgw_gpu_power_watts") == [650.0, 650.0]  # still read
            log = running.log_text()
            assert "GPU 0: NVML refused to set the power limit (Insufficient Permissions)" in log
            assert "needs root" in log
            # Logged once, not at every renewal.
            wait_for(running, lambda m: server.requests >= 4, "more renewals")
            assert running.log_text().count("GPU 0: NVML refused") == 1


def test_the_decider_saying_not_oversubscribed_restores_only_what_the_agent_capped(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0, lease_seconds=3.0) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
            server.set(mode="404")
            metrics = wait_for(
                running,
                lambda m: (
                    state_of(m) == "off"
                    and gpu_watts(m, "llmgw_gpu_power_limit_watts") == [700.0, 700.0]
                ),
                "the default limits restored",
            )
            assert gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [None, None]
            assert value(metrics, "llmgw_capping_agent_up") == 1
            assert "power limit 410 W -> 700 W: the decider: node gpu-r1-01 is in no" in (
                running.log_text()
            )
            assert json.loads(node.agent_state.read_text()) == {
                "node": NODE,
                "lease": None,
                "capped": {},
            }


def test_a_stuck_decider_blocks_neither_the_readings_nor_the_safe_cap(tmp_path: Path):
    with lease_server(
        gpu_limit_watts=410.0, safe_gpu_limit_watts=450.0, lease_seconds=6.0
    ) as server:
        node = Node(tmp_path, server.url)
        with exporter(node) as running:
            wait_for(running, leased_at(410.0), "leased at 410 W")
            server.set(mode="stuck")
            seen: list[float] = []

            def gpu_polls(metrics: dict) -> None:
                seen.append(
                    value(
                        metrics,
                        "llmgw_exporter_source_last_success_timestamp_seconds",
                        source="gpu",
                    )
                    or 0.0
                )
                never_uncapped(metrics)

            metrics = wait_for(running, safe_at(450.0), "the safe cap", watch=gpu_polls)
            assert value(metrics, "llmgw_capping_agent_failing", reason="decider") == 1
            # The GPU source went on polling (every 0.5 s) while the agent waited.
            assert len(set(seen)) >= 4, seen
            # Whichever gives up first: requests' read timeout, or the agent's deadline.
            assert re.search(
                r"capping: no lease: .*(Read timed out|did not return within its 3s deadline)",
                running.log_text(),
            ), running.log_text()


def test_a_state_file_that_cannot_be_written_is_a_failure_shown(tmp_path: Path):
    with lease_server(gpu_limit_watts=410.0) as server:
        node = Node(tmp_path, server.url)
        (tmp_path / "capping-state.json").mkdir()  # a directory where the file should be
        with exporter(node) as running:
            metrics = wait_for(
                running,
                lambda m: (
                    value(m, "llmgw_capping_agent_failing", reason="state") == 1
                    and leased_at(410.0)(m)
                ),  # the lease is applied all the same
                "the state file's failure, and the lease applied",
            )
            assert value(metrics, "llmgw_capping_agent_up") == 0
            assert "capping: cannot write the state file" in running.log_text()


def test_capping_is_off_by_default_and_refused_half_configured(tmp_path: Path):
    from exporter.config import AgentConfig

    assert AgentConfig().capping.enabled is False
    agent = tmp_path / "agent.yaml"
    agent.write_text("node: n1\ncapping:\n  enabled: true\n  decider_url: decider:9860\n")
    result = subprocess.run(
        [sys.executable, "-m", "exporter", "--config", str(agent), "--once"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr
    assert "capping.decider_url: Value error, 'decider:9860' is not an http:// or https:// URL" in (
        result.stderr
    )


# --- with the real decider (decider/api/capping.py, tests/decider_harness.py) -------------------

#: tests/test_capping_api.py's site with leases of 6 s: a rack of two 10 kW feeds x 0.9
#: derating (a 9 kW budget), four nodes of 4 GPUs at 700 W (11.2 kW at their limits:
#: oversubscribed), n1 and n2 running batch replicas, n3 and n4 interactive ones. The
#: exporter under test is n1's, on two fake GPUs: a lease's limit is per GPU.
DECIDER_FACILITY: dict[str, Any] = {
    "mode": "observe",
    "defaults": {"margin": 0.0, "derating": 0.9},
    "node_share_watts": 0,
    "classes": ["batch", "interactive"],
    "models": {"small": {"class": "batch"}, "large": {"class": "interactive"}},
    "oversubscription": {
        "ladder": {"first_threshold": 0.90, "second_threshold": 0.97, "hold": "60s"},
        "lease": "6s",
    },
    "domains": {
        "rack/r1": {
            "feeds": [
                {"pdu": "r1-a", "rating_watts": 10000},
                {"pdu": "r1-b", "rating_watts": 10000},
            ],
            "oversubscribe": True,
        },
    },
}
RACK_NODES = ("n1", "n2", "n3", "n4")


def test_the_real_deciders_lease_caps_the_node_and_its_loss_the_safe_cap(tmp_path: Path):
    from tests.decider_harness import Decider, FakePrometheus, Readings, poll

    rack = ["rack/r1", "pdu/r1-a", "pdu/r1-b"]
    fake = FakePrometheus(
        Readings(
            membership=dict.fromkeys(RACK_NODES, rack),
            inventory=["rack/r1", "pdu/r1-a", "pdu/r1-b"],
            conditions={"rack/r1": "ok"},
            measured={"rack/r1": 6000.0, "pdu/r1-a": 3000.0, "pdu/r1-b": 3000.0},
            gpus=dict.fromkeys(RACK_NODES, 4),
            limits=dict.fromkeys(RACK_NODES, 700.0),
        )
    )
    decider = Decider(tmp_path / "decider", fake.url, DECIDER_FACILITY)
    try:
        decider.start(wait_ready=True)
        for rid, node, model in (
            ("b1", "n1", "small"),
            ("b2", "n2", "small"),
            ("i1", "n3", "large"),
            ("i2", "n4", "large"),
        ):
            replica = {"model": model, "profile": "p", "gpus": 4, "power_watts": 2800}
            assert decider.reserve(rid, node, replica).status_code == 201

        def lease_of_n1() -> dict[str, Any] | None:
            answer = decider.get("/v1/capping/leases/n1", headers=decider.headers())
            return answer.json() if answer.status_code == 200 else None

        first = poll(lease_of_n1, "n1's first lease")
        assert first["gpu_limit_watts"] is None  # step 0: no cap
        node = Node(tmp_path / "n1", decider.url, name="n1", token=decider.token or "")
        node.root.mkdir()
        with exporter(node) as running:
            metrics = wait_for(running, lambda m: state_of(m) == "leased", "n1's lease")
            assert gpu_watts(metrics, "llmgw_gpu_power_cap_watts") == [None, None]
            assert gpu_watts(metrics, "llmgw_gpu_power_limit_watts") == [700.0, 700.0]
            assert (
                value(metrics, "llmgw_capping_safe_gpu_limit_watts")
                == first["safe_gpu_limit_watts"]
            )
            # Past the first threshold (8.1 kW of 9): the ladder caps the batch class.
            fake.readings.measured = {"rack/r1": 8300.0, "pdu/r1-a": 4150.0, "pdu/r1-b": 4150.0}
            capped = poll(
                lambda: (lease := lease_of_n1()) and lease["gpu_limit_watts"] and lease,
                "the batch class capped",
            )
            cap = capped["gpu_limit_watts"]
            assert 200.0 <= cap < 650.0, capped  # within the cards' range, under their draw
            metrics = wait_for(running, leased_at(cap), f"n1's GPUs at {cap:g} W")
            assert gpu_watts(metrics, "llmgw_gpu_power_watts") == [cap, cap]  # the fake's draw
            assert f"power limit 700 W -> {cap:g} W: lease until" in running.log_text()
            # The decider gone: the lease runs out, the node falls to the safe cap.
            decider.stop()
            safe = capped["safe_gpu_limit_watts"]
            wait_for(running, safe_at(safe), f"the safe cap {safe:g} W", watch=never_uncapped)
    finally:
        decider.close()
        fake.close()
