"""Real servers for end-to-end tests: Prometheus, Alertmanager, VictoriaMetrics, vmalert,
the exporter, a webhook, a static scrape target.

Each helper is a context manager that starts its server on a free 127.0.0.1 port
with its files in a directory the caller gives (a pytest tmp dir), waits until it
is ready, and at exit stops it and reaps it (SIGTERM, then SIGKILL after 10 s).
A server that exits or never gets ready fails the test with the end of its log.

    with webhook() as hook, alertmanager(tmp / "am", am_config(hook)) as am, ...:
        ...

The binaries are Debian's (`make debian-packages`): `prometheus`,
`prometheus-alertmanager`, `victoria-metrics` and `vmalert` (package victoria-metrics);
the exporter runs as `python -m exporter`, as tests/test_exporter_e2e.py runs it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

STOP_TIMEOUT_S = 10.0
#: Start attempts: a free port found by binding port 0 can be taken before the server binds it.
START_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: `make debian-packages` installs it")
    return path


@dataclass
class Server:
    """A running server: its base URL, process and log file."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextmanager
def running(
    name: str,
    command: Callable[[int], list[str]],
    workdir: Path,
    ready: Callable[[str], bool],
    *,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Iterator[Server]:
    """Run `command(port)` until the block ends, once `ready(base_url)` says so."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("w") as output:
            process = subprocess.Popen(
                command(port),
                cwd=workdir,
                env=dict(env) if env is not None else None,
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        server = Server(url, process, log)
        try:
            deadline = time.monotonic() + timeout_s
            while process.poll() is None and time.monotonic() < deadline:
                try:
                    if ready(url):
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
            else:
                exited = process.poll() is not None
                _stop(process)
                if (
                    exited
                    and "address already in use" in log.read_text()
                    and (attempt < START_ATTEMPTS)
                ):
                    continue
                why = "exited" if exited else f"was not ready after {timeout_s:.0f} s"
                pytest.fail(f"{name} {why}; its log ends:\n{server.log_tail()}")
            yield server
            return
        finally:
            _stop(process)


def _status_ok(path: str) -> Callable[[str], bool]:
    return lambda url: requests.get(url + path, timeout=2).status_code == 200


@contextmanager
def prometheus(
    workdir: Path,
    *,
    rule_files: list[Path],
    scrape_targets: Mapping[str, list[str]],
    alertmanagers: Sequence[str] = (),
    interval: str = "1s",
) -> Iterator[Server]:
    """Prometheus scraping `scrape_targets` ({job: [host:port]}) and evaluating
    `rule_files` every `interval` (groups with their own `interval:` keep it),
    sending alerts to `alertmanagers` (host:port)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": _scrape_configs(scrape_targets),
    }
    if alertmanagers:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]
        }
    with prometheus_with_config(workdir, config) as server:
        yield server


@contextmanager
def prometheus_with_config(workdir: Path, config: Mapping[str, Any]) -> Iterator[Server]:
    """Prometheus running the whole `config` (prometheus.yml as a dict) in `workdir`, on a
    port it picked, until the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def command(port: int) -> list[str]:
        return [
            binary("prometheus"),
            f"--config.file={config_file}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--web.enable-lifecycle",
        ]

    with running("prometheus", command, workdir, _status_ok("/-/ready")) as server:
        yield server


@contextmanager
def alertmanager(workdir: Path, config: Mapping[str, Any]) -> Iterator[Server]:
    """A single Alertmanager (no cluster) with `config`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config_file = workdir / "alertmanager.yml"
    config_file.write_text(yaml.safe_dump(dict(config), sort_keys=False))

    def command(port: int) -> list[str]:
        return [
            binary("prometheus-alertmanager"),
            f"--config.file={config_file}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]

    with running("alertmanager", command, workdir, _status_ok("/-/ready")) as server:
        yield server


def _scrape_configs(scrape_targets: Mapping[str, list[str]]) -> list[dict[str, Any]]:
    return [
        {"job_name": job, "static_configs": [{"targets": list(targets)}]}
        for job, targets in scrape_targets.items()
    ]


@contextmanager
def victoria_metrics(
    workdir: Path, *, scrape_targets: Mapping[str, list[str]], interval: str = "1s"
) -> Iterator[Server]:
    """VictoriaMetrics single-node scraping `scrape_targets` ({job: [host:port]}) every
    `interval` with its own `-promscrape.config` (same `job` and `instance` labels as a
    Prometheus job), its Prometheus API at the base URL.

    Samples are searchable as soon as they are stored (`-search.latencyOffset=0s`, default
    30 s, and no response cache), so a vmalert writing to it reads its own writes within
    one evaluation: the condition state machine needs that (docs/rules.md)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval},
        "scrape_configs": _scrape_configs(scrape_targets),
    }
    config_file = workdir / "promscrape.yml"
    config_file.write_text(yaml.safe_dump(config, sort_keys=False))

    def command(port: int) -> list[str]:
        return [
            binary("victoria-metrics"),
            f"-storageDataPath={workdir / 'data'}",
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-promscrape.config={config_file}",
            "-search.latencyOffset=0s",
            "-search.disableCache",
        ]

    with running("victoria-metrics", command, workdir, _status_ok("/health")) as server:
        yield server


@contextmanager
def vmalert(
    workdir: Path,
    *,
    rule_files: list[Path],
    datasource: str,
    notifiers: Sequence[str],
    interval: str = "1s",
    flush_interval: str = "1s",
) -> Iterator[Server]:
    """vmalert evaluating `rule_files` against the VictoriaMetrics at `datasource` (a base
    URL), writing recording rules and alert state back to it (flushed every
    `flush_interval`) and
    restoring alert state from it, sending alerts to `notifiers` (base URLs: vmalert
    refuses to start with alerting rules and none). Groups without their own `interval:`
    are evaluated every `interval`."""

    def command(port: int) -> list[str]:
        return [
            binary("vmalert"),
            *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={datasource}",
            f"-remoteWrite.url={datasource}",
            f"-remoteWrite.flushInterval={flush_interval}",
            f"-remoteRead.url={datasource}",
            *(f"-notifier.url={url}" for url in notifiers),
            f"-evaluationInterval={interval}",
            f"-httpListenAddr=127.0.0.1:{port}",
        ]

    with running("vmalert", command, workdir, _status_ok("/health")) as server:
        yield server


@contextmanager
def exporter(
    workdir: Path,
    *,
    agent: Path,
    sysfs: Path,
    nvml_config: Path,
    ready_text: str = "llmgw_exporter_source_up",
) -> Iterator[Server]:
    """`python -m exporter` on a fake sysfs tree and the fake NVML library (whose
    path agent.yaml names), ready once its /metrics contains `ready_text`."""
    env = {**os.environ, "FAKE_NVML_CONFIG": str(nvml_config)}

    def command(port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "exporter",
            "--config",
            str(agent),
            "--sysfs",
            str(sysfs),
            "--listen",
            f"127.0.0.1:{port}",
        ]

    def ready(url: str) -> bool:
        return ready_text in requests.get(f"{url}/metrics", timeout=2).text

    with running("exporter", command, workdir, ready, env=env) as server:
        yield server


@contextmanager
def metrics_target(body: Callable[[], bytes | None]) -> Iterator[str]:
    """host:port on 127.0.0.1 serving `body()`, a text exposition made at each scrape
    (None: HTTP 500, a target that is down)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            made = body()
            status, payload = (500, b"down\n") if made is None else (200, made)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@dataclass
class Webhook:
    """A loopback HTTP server that records every JSON body POSTed to it: Alertmanager's
    webhook messages (objects), or as a notifier for vmalert its `/api/v2/alerts` lists."""

    url: str
    received: list[tuple[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _arrived: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._arrived = threading.Condition(self._lock)

    def record(self, path: str, payload: Any) -> None:
        with self._arrived:
            self.received.append((path, payload))
            self._arrived.notify_all()

    def wait_for(self, match: Callable[[str, Any], bool], timeout_s: float) -> tuple[str, Any]:
        """The first (path, payload) received, before or within `timeout_s`, that matches."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            seen = 0
            while True:
                for path, payload in self.received[seen:]:
                    if match(path, payload):
                        return path, payload
                seen = len(self.received)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"no matching POST in {timeout_s:.0f} s; received: {self.received}"
                    )
                self._arrived.wait(left)


@contextmanager
def webhook() -> Iterator[Webhook]:
    """A `Webhook` listening on 127.0.0.1 until the block ends."""
    hook: Webhook

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            try:
                payload = json.loads(body)
            except ValueError:
                self.send_error(400, "not JSON")
                return
            hook.record(self.path, payload)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the test reports what it received

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hook = Webhook(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    try:
        yield hook
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=STOP_TIMEOUT_S)
