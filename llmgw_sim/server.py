"""Serving a simulated site: each node its own scrape target, from one process.

- `GET /nodes/<node>/metrics`: that node's exporter exposition;
- `GET /site/metrics`: the site's own meters (cooling unit alarms, PDU meters);
- `GET /metrics`: the simulator's own state (`llmgw_simulator_*`);
- `GET /targets.json`: the file_sd target list, as written to `--targets-file`;
- `GET /`: the list of nodes and paths.

Three threads: the HTTP server (a thread per request, serving bytes rendered beforehand),
the ticker (advances the physics and renders every exposition once per `tick`), and,
with `load.from_decider`, the poller that reads the decider's reservations.

The target file lists every node as its own target: the simulator's address, with
`__metrics_path__` set to the node's path and `instance` set to the node's name (without
it every node would be `instance="127.0.0.1:PORT"` and their `up` series would collide).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import requests

from llmgw_sim.engine import Clock, Simulator
from llmgw_sim.exposition import CONTENT_TYPE, Renderer

log = logging.getLogger("llmgw.simulate")

OWN_METRICS = {
    "llmgw_simulator_nodes": ("gauge", "Nodes the simulator serves."),
    "llmgw_simulator_time_seconds": ("gauge", "Simulated seconds since the simulator started."),
    "llmgw_simulator_timeline_seconds": (
        "gauge",
        "Simulated seconds since the scenario's timeline started; absent before it has.",
    ),
    "llmgw_simulator_tick_seconds": ("gauge", "Real seconds the last step and render took."),
    "llmgw_simulator_reserved_gpus": ("gauge", "GPUs the decider has reserved, all nodes."),
    "llmgw_simulator_decider_up": (
        "gauge",
        "1 if the last read of the decider's reservations succeeded (load.from_decider).",
    ),
}


def node_path(node: str) -> str:
    return f"/nodes/{node}/metrics"


def targets(simulator: Simulator, address: str) -> list[dict[str, Any]]:
    """Prometheus file_sd groups: one per node, at `address` (host:port)."""
    return [
        {
            "targets": [address],
            "labels": {"__metrics_path__": node_path(node.name), "instance": node.name},
        }
        for node in simulator.nodes
    ]


def write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one step (Prometheus watches target files)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


class SimulatorServer:
    """The HTTP server, the ticker and the decider poller around one `Simulator`."""

    def __init__(
        self,
        simulator: Simulator,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        targets_file: Path | None = None,
        decider_url: str | None = None,
        clock: Clock = time.time,
    ) -> None:
        self.simulator = simulator
        self.renderer = Renderer(simulator)
        self.clock = clock
        self.targets_file = targets_file
        from_decider = simulator.scenario.load.from_decider
        self.decider_url = decider_url or (from_decider.url if from_decider else None)
        self.poll_interval = from_decider.interval if from_decider else 1.0
        self.decider_up: bool | None = None
        self.tick_seconds = 0.0
        self.ticks = 0
        self._nodes: Mapping[str, bytes] = {}
        self._site = b""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._tick()  # the first scrape finds readings
        self.http = ThreadingHTTPServer((host, port), self._handler())
        self.http.daemon_threads = True
        bound_host, bound_port = self.http.server_address[:2]
        self.address = f"{bound_host}:{bound_port}"
        self.url = f"http://{self.address}"

    # --- life ---------------------------------------------------------------------------------

    def start(self) -> SimulatorServer:
        if self.targets_file is not None:
            self.write_targets(self.targets_file)
        self._spawn("simulator-http", self.http.serve_forever)
        self._spawn("simulator-ticker", self._tick_loop)
        if self.decider_url is not None or self.simulator.scenario.load.from_decider is not None:
            self._spawn("simulator-decider", self._poll_loop)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.http.shutdown()
        self.http.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def __enter__(self) -> SimulatorServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _spawn(self, name: str, target: Any) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def write_targets(self, path: Path) -> None:
        write_atomically(path, json.dumps(targets(self.simulator, self.address), indent=1) + "\n")

    # --- ticking --------------------------------------------------------------------------------

    def _tick(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        self.simulator.advance(now)
        nodes = self.renderer.render_nodes(now)
        site = self.renderer.render_site()
        self._nodes, self._site = nodes, site
        self.tick_seconds = time.perf_counter() - started
        self.ticks += 1

    def _tick_loop(self) -> None:
        interval = self.simulator.scenario.tick
        deadline = time.monotonic() + interval
        while not self._stop.wait(max(0.0, deadline - time.monotonic())):
            try:
                self._tick()
            except Exception:  # a bug must not freeze every node's readings silently
                log.exception("simulation step failed")
            deadline = max(deadline + interval, time.monotonic())

    # --- the decider's reservations ---------------------------------------------------------

    def set_decider_url(self, url: str | None) -> None:
        """Where to read reservations from, from the next poll on; None stops reading (the
        last reservations stay)."""
        self.decider_url = None if url is None else url.rstrip("/")

    def poll_decider(self) -> None:
        """Read `GET /v1/reservations` once; on failure keep the last reservations."""
        url = self.decider_url
        if url is None:
            return
        try:
            response = requests.get(f"{url}/v1/reservations", timeout=2)
            response.raise_for_status()
            reserved: dict[str, int] = {}
            for reservation in response.json()["reservations"]:
                node = str(reservation["node"])
                reserved[node] = reserved.get(node, 0) + int(reservation.get("gpus") or 0)
        except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
            if self.decider_up is not False:
                log.warning(
                    "cannot read reservations from %s (keeping the last ones): %s", url, exc
                )
            self.decider_up = False
            return
        if self.decider_up is not True:
            log.info("reading reservations from %s", url)
        self.decider_up = True
        self.simulator.set_reserved_gpus(reserved)

    def _poll_loop(self) -> None:
        while True:
            self.poll_decider()
            if self._stop.wait(self.poll_interval):
                return

    # --- serving --------------------------------------------------------------------------

    def own_metrics(self) -> bytes:
        now = self.clock()
        values: dict[str, float | None] = {
            "llmgw_simulator_nodes": len(self.simulator.nodes),
            "llmgw_simulator_time_seconds": self.simulator.sim_time(now),
            "llmgw_simulator_timeline_seconds": self.simulator.timeline_time(now),
            "llmgw_simulator_tick_seconds": self.tick_seconds,
            "llmgw_simulator_reserved_gpus": sum(self.simulator.reserved_gpus.values()),
            "llmgw_simulator_decider_up": (
                None if self.decider_up is None else float(self.decider_up)
            ),
        }
        out = []
        for name, (kind, help_text) in OWN_METRICS.items():
            value = values[name]
            if value is not None:
                out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n{name} {value!r}\n")
        return "".join(out).encode()

    def index(self) -> bytes:
        lines = [
            f"llmgw-facility simulate: {len(self.simulator.nodes)} nodes, time scale "
            f"{self.simulator.scenario.time_scale:g}",
            "/site/metrics",
            "/metrics",
            "/targets.json",
            *(node_path(node.name) for node in self.simulator.nodes),
        ]
        return ("\n".join(lines) + "\n").encode()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path)
                body: bytes | None
                content_type = CONTENT_TYPE
                if path.startswith("/nodes/") and path.endswith("/metrics"):
                    body = server._nodes.get(path[len("/nodes/") : -len("/metrics")])
                elif path == "/site/metrics":
                    body = server._site
                elif path == "/metrics":
                    body = server.own_metrics()
                elif path == "/targets.json":
                    body = json.dumps(targets(server.simulator, server.address)).encode()
                    content_type = "application/json"
                elif path in ("/", "/-/healthy"):
                    body = server.index() if path == "/" else b"ok\n"
                    content_type = "text/plain; charset=utf-8"
                else:
                    body = None
                if body is None:
                    self._send(404, b"no such node or path; GET / lists them\n", "text/plain")
                    return
                self._send(200, body, content_type)

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every few seconds per node: too many lines to log

        return Handler
