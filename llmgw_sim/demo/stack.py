"""The demo's servers: a real Prometheus, a real Alertmanager and the decider, each a
process on a loopback port picked at run time, with its files in the demo's directory.

Each is started, waited for (its readiness URL, polled with a deadline) and, when the
demo ends, stopped (SIGTERM, then SIGKILL after 10 s) and reaped. A free port found by
binding port 0 can be taken by someone else before the server binds it: a server that
exits saying its address is in use is started again on another port.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

STOP_TIMEOUT_S = 10.0
START_ATTEMPTS = 3
START_TIMEOUT_S = 60.0

#: The binaries the demo runs, and the Debian package each comes in.
BINARIES = {
    "prometheus": "prometheus",
    "promtool": "prometheus",
    "prometheus-alertmanager": "prometheus-alertmanager",
}


class DemoError(Exception):
    """Something the demo needs is missing or did not start; `str()` says what to do."""


def missing_binaries(which: Callable[[str], str | None] = shutil.which) -> dict[str, str]:
    """{binary: Debian package} for every binary the demo needs that is not on PATH."""
    return {name: package for name, package in BINARIES.items() if which(name) is None}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Service:
    """A running server: its name, base URL, process and log file."""

    name: str
    url: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_service(
    name: str,
    command: Callable[[int], list[str]],
    workdir: Path,
    ready: Callable[[str], bool],
    *,
    timeout_s: float = START_TIMEOUT_S,
) -> Service:
    """Run `command(port)` in `workdir` until `ready(base_url)`; DemoError if it never is."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"{name}.log"
    for attempt in range(1, START_ATTEMPTS + 1):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with log.open("w") as output:
            process = subprocess.Popen(
                command(port), cwd=workdir, stdout=output, stderr=subprocess.STDOUT
            )
        service = Service(name, url, port, process, log)
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            try:
                if ready(url):
                    return service
            except requests.RequestException:
                pass
            time.sleep(0.1)
        exited = process.poll() is not None
        service.stop()
        clash = exited and "address already in use" in log.read_text(errors="replace")
        if clash and attempt < START_ATTEMPTS:
            continue
        why = "exited" if exited else f"was not ready after {timeout_s:.0f} s"
        raise DemoError(f"{name} {why}; its log ({log}) ends:\n{service.log_tail()}")
    raise DemoError(f"{name} could not get a free port")  # pragma: no cover - loop returns


def _status_ok(path: str) -> Callable[[str], bool]:
    return lambda url: requests.get(url + path, timeout=2).status_code == 200


def write_yaml(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def start_alertmanager(workdir: Path) -> Service:
    """A single Alertmanager (no cluster) that routes every alert to a receiver with no
    notifier: the demo reads the alerts from its API."""
    config = write_yaml(
        workdir / "alertmanager.yml",
        {
            "route": {
                "receiver": "demo",
                "group_by": ["alertname", "kind", "domain"],
                "group_wait": "1s",
            },
            "receivers": [{"name": "demo"}],
        },
    )

    def command(port: int) -> list[str]:
        return [
            "prometheus-alertmanager",
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]

    return start_service("alertmanager", command, workdir, _status_ok("/-/ready"))


def start_prometheus(
    workdir: Path,
    *,
    rule_files: list[Path],
    scrape_configs: list[dict[str, Any]],
    alertmanager: str,
    interval: str,
    lookback: str,
) -> Service:
    """Prometheus scraping and evaluating every `interval` (groups with their own
    `interval:` keep it), sending alerts to `alertmanager` (host:port)."""
    config = write_yaml(
        workdir / "prometheus.yml",
        {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": scrape_configs,
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        },
    )

    def command(port: int) -> list[str]:
        return [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            f"--query.lookback-delta={lookback}",
            "--log.level=warn",
        ]

    return start_service("prometheus", command, workdir, _status_ok("/-/ready"))


def start_decider(workdir: Path, settings: Mapping[str, Any]) -> Service:
    """`llmgw-decider` (as `python -m decider.main`) with decider.yaml from `settings`,
    its `listen` set to the port picked."""

    def command(port: int) -> list[str]:
        config = write_yaml(workdir / "decider.yaml", {**settings, "listen": f"127.0.0.1:{port}"})
        return [sys.executable, "-m", "decider.main", "--config", str(config)]

    return start_service("decider", command, workdir, _status_ok("/readyz"))
