"""The exporter under sensor faults (issue 16, items 1 and 2), as a node runs it.

Each test runs the real `llmgw-exporter` process over a sysfs tree made in
tmp_path (FIFOs for reads that never return, counters that reset), the fake
NVML with `delays_ms`, or a loopback BMC that trickles its answer, and reads
its `/metrics` over HTTP. What must hold: a hung read makes its source down
with the reason `hung` within its deadline, its series go once older than
`stale_after`, the other sources (and the other chips of one source) go on,
one log line per change, and the process' threads stay flat.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import requests

from tests.fake_nvml.build import ensure_built

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / ".venv" / "bin" / "llmgw-exporter"
H100 = json.loads((ROOT / "tests" / "fixtures" / "nvml" / "h100.json").read_text())
GPU_UUID = H100["devices"][0]["uuid"]
_SAMPLE = re.compile(r"^(?P<name>[a-z_:]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample by (name, labels less `node`)."""
    samples = {}
    for line in exposition.splitlines():
        if (match := _SAMPLE.match(line)) is not None:
            labels = frozenset(
                (key, value)
                for key, value in _LABEL.findall(match["labels"] or "")
                if key != "node"
            )
            samples[(match["name"], labels)] = float(match["value"])
    return samples


def value(metrics: dict, name: str, **labels: str) -> float | None:
    return metrics.get((name, frozenset(labels.items())))


def names(metrics: dict) -> set[str]:
    return {name for name, _ in metrics}


@dataclass
class Exporter:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def metrics(self) -> dict:
        return parse(requests.get(f"{self.url}/metrics", timeout=5).text)

    def wait_for(self, what: str, condition: Callable[[dict], bool], timeout: float = 15.0) -> dict:
        """The first scrape for which `condition` holds; fails naming `what`."""
        deadline = time.monotonic() + timeout
        while True:
            metrics = self.metrics()
            if condition(metrics):
                return metrics
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: not within {timeout:g}s\n{self.log.read_text()}")
            time.sleep(0.1)

    @property
    def threads(self) -> int:
        return psutil.Process(self.process.pid).num_threads()

    def log_lines(self, pattern: str) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if re.search(pattern, line)]


@pytest.fixture
def run_exporter(tmp_path: Path) -> Iterator[Callable[..., Exporter]]:
    started: list[Exporter] = []

    def start(agent_yaml: str, sysfs: Path, env: dict[str, str] | None = None) -> Exporter:
        agent = tmp_path / "agent.yaml"
        agent.write_text(agent_yaml)
        port = free_port()
        log = tmp_path / f"exporter-{len(started)}.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [
                    *(str(EXPORTER), "--config", str(agent), "--sysfs", str(sysfs)),
                    *("--listen", f"127.0.0.1:{port}"),
                ],
                env={**os.environ, **(env or {})},
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        exporter = Exporter(process, f"http://127.0.0.1:{port}", log)
        started.append(exporter)
        deadline = time.monotonic() + 20
        while True:
            try:
                requests.get(f"{exporter.url}/metrics", timeout=2)
                return exporter
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.fail(f"the exporter never came up:\n{log.read_text()}")
            time.sleep(0.1)

    yield start
    for exporter in started:
        exporter.process.send_signal(signal.SIGTERM)
        try:
            exporter.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            exporter.process.kill()
            exporter.process.wait()
            pytest.fail(f"the exporter ignored SIGTERM for 15 s:\n{exporter.log.read_text()}")


def only(*enabled: str, **settings: str) -> str:
    """The `sources:` section of agent.yaml: these sources on, with these settings."""
    lines = ["node: n1", "sources:"]
    for name in ("gpu", "hwmon", "rapl", "units", "ipmi", "redfish", "cray", "hwmon_power"):
        if name in enabled:
            lines.append(f"  {name}: {{{settings.get(name, '')}}}")
        else:
            lines.append(f"  {name}: {{enabled: false}}")
    return "\n".join(lines) + "\n"


def hwmon_chip(sysfs: Path, number: int, name: str, label: str, millidegrees: int) -> Path:
    chip = sysfs / "class" / "hwmon" / f"hwmon{number}"
    chip.mkdir(parents=True)
    (chip / "name").write_text(f"{name}\n")
    (chip / "temp1_label").write_text(f"{label}\n")
    write_atomically(chip / "temp1_input", f"{millidegrees}\n")
    return chip


def write_atomically(path: Path, text: str) -> None:
    """A sensor's new value, never seen half written by the exporter's reader."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def fifo_in_place_of(path: Path) -> None:
    """A file whose open() blocks until a writer comes: a read that never returns."""
    path.unlink()
    os.mkfifo(path)


def rapl_zone(sysfs: Path, energy_uj: int) -> Path:
    zone = sysfs / "class" / "powercap" / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "name").write_text("package-0\n")
    (zone / "max_energy_range_uj").write_text("262143328850\n")
    write_atomically(zone / "energy_uj", f"{energy_uj}\n")
    return zone


def assert_threads_flat(exporter: Exporter, seconds: float) -> None:
    """No thread piles up behind a stuck call while the source's polls go by."""
    before = exporter.threads
    time.sleep(seconds)
    after = exporter.threads
    # One poll thread may be starting or ending at either moment.
    assert after <= before + 1, f"threads grew from {before} to {after}"


# --- item 1: reads that never return -------------------------------------------------------


def test_a_gpu_power_read_that_never_returns(tmp_path: Path, run_exporter) -> None:
    nvml = tmp_path / "nvml.json"
    nvml.write_text(json.dumps(H100))
    sysfs = tmp_path / "sys"
    cpu = hwmon_chip(sysfs, 0, "coretemp", "Package id 0", 50000)
    exporter = run_exporter(
        only(
            "gpu",
            "hwmon",
            gpu=f"interval: 0.5s, deadline: 1s, stale_after: 2s, library: {ensure_built()}",
            hwmon="interval: 0.5s",
        ),
        sysfs,
        {"FAKE_NVML_CONFIG": str(nvml)},
    )
    exporter.wait_for(
        "the GPU's power",
        lambda m: value(m, "llmgw_gpu_power_watts", gpu="0", uuid=GPU_UUID) == 69.85,
    )
    stuck = {**H100, "delays_ms": {"nvmlDeviceGetPowerUsage": 600_000}}
    tmp = nvml.with_name(".nvml.json.tmp")
    tmp.write_text(json.dumps(stuck))
    os.replace(tmp, nvml)  # the fake re-reads its file at the next call

    hung = exporter.wait_for(
        "gpu down as hung",
        lambda m: value(m, "llmgw_exporter_source_failing", source="gpu", reason="hung") == 1,
        timeout=5,
    )
    assert value(hung, "llmgw_exporter_source_up", source="gpu") == 0
    # Within stale_after of the last reading its series go: never a frozen value.
    gone = exporter.wait_for(
        "the GPU's series dropped",
        lambda m: "llmgw_gpu_power_watts" not in names(m),
        timeout=4,
    )
    assert not {"llmgw_gpu_temperature_celsius", "llmgw_node_gpu_power_watts"} & names(gone)
    # The other source goes on: a CPU going to 90 °C is seen.
    write_atomically(cpu / "temp1_input", "90000\n")
    exporter.wait_for(
        "the CPU at 90 °C",
        lambda m: (
            90.0 in {v for (n, _), v in m.items() if n == "llmgw_node_cpu_temperature_celsius"}
        ),
        timeout=3,
    )
    # No new call into the stuck source: one abandoned poll, threads flat, one log line.
    assert_threads_flat(exporter, 3.0)
    metrics = exporter.metrics()
    assert value(metrics, "llmgw_exporter_source_abandoned_polls_total", source="gpu") == 1
    assert value(metrics, "llmgw_exporter_source_up", source="hwmon") == 1
    failing = exporter.log_lines("source gpu failing")
    assert len(failing) == 1, failing
    assert "did not return within its 1s deadline" in failing[0]


def test_a_hwmon_file_that_never_returns(tmp_path: Path, run_exporter) -> None:
    sysfs = tmp_path / "sys"
    cpu = hwmon_chip(sysfs, 0, "coretemp", "Package id 0", 50000)
    board = hwmon_chip(sysfs, 1, "nct6775", "SYSTIN", 24000)
    exporter = run_exporter(
        only("hwmon", hwmon="interval: 0.5s, deadline: 1s, stale_after: 2s"), sysfs
    )
    exporter.wait_for(
        "the inlet",
        lambda m: "llmgw_node_inlet_temperature_celsius" in names(m),
    )
    fifo_in_place_of(board / "temp1_input")
    down = exporter.wait_for(
        "hwmon down naming the stuck chip",
        lambda m: value(m, "llmgw_exporter_source_up", source="hwmon") == 0,
        timeout=5,
    )
    # The stuck chip's inlet is gone at once (its chip gave nothing this poll) ...
    assert "llmgw_node_inlet_temperature_celsius" not in names(down)
    assert value(down, "llmgw_exporter_source_failing", source="hwmon", reason="partial") == 1
    # ... while the CPU chip, read on its own, is still seen going to 90 °C.
    write_atomically(cpu / "temp1_input", "90000\n")
    exporter.wait_for(
        "the CPU at 90 °C beside the stuck chip",
        lambda m: (
            90.0 in {v for (n, _), v in m.items() if n == "llmgw_node_cpu_temperature_celsius"}
        ),
        timeout=3,
    )
    assert_threads_flat(exporter, 3.0)
    failing = exporter.log_lines("source hwmon failing")
    assert len(failing) == 1, failing
    assert "hwmon chip nct6775" in failing[0] and "deadline" in failing[0]


def test_a_rapl_counter_that_never_returns(tmp_path: Path, run_exporter) -> None:
    sysfs = tmp_path / "sys"
    zone = rapl_zone(sysfs, 100_000_000)
    exporter = run_exporter(
        only("rapl", rapl="interval: 0.5s, deadline: 1s, stale_after: 2s"), sysfs
    )
    exporter.wait_for("RAPL's energy", lambda m: "llmgw_node_cpu_energy_joules_total" in names(m))
    fifo_in_place_of(zone / "energy_uj")
    hung = exporter.wait_for(
        "rapl down as hung",
        lambda m: value(m, "llmgw_exporter_source_failing", source="rapl", reason="hung") == 1,
        timeout=5,
    )
    assert value(hung, "llmgw_exporter_source_up", source="rapl") == 0
    exporter.wait_for(
        "RAPL's series dropped",
        lambda m: "llmgw_node_cpu_energy_joules_total" not in names(m),
        timeout=4,
    )
    assert_threads_flat(exporter, 3.0)
    assert (
        value(exporter.metrics(), "llmgw_exporter_source_abandoned_polls_total", source="rapl") == 1
    )
    assert len(exporter.log_lines("source rapl failing")) == 1


class TricklingBmc:
    """A loopback 'BMC' that answers 200 at once, then one byte every 0.5 s, forever.

    Each byte comes well inside the request's read timeout, so only a deadline
    on the whole poll ends it.
    """

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stop = threading.Event()
        self.requests = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.server.settimeout(0.2)
        while not self.stop.is_set():
            try:
                connection, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by close()
                return
            self.requests += 1
            threading.Thread(target=self._trickle, args=(connection,), daemon=True).start()

    def _trickle(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(65536)
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n{"
                )
                while not self.stop.wait(0.5):
                    connection.sendall(b" ")
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.server.close()


def test_a_redfish_bmc_that_trickles_its_answer(tmp_path: Path, run_exporter) -> None:
    bmc = TricklingBmc()
    try:
        exporter = run_exporter(
            only(
                "redfish",
                redfish=f"url: 'http://127.0.0.1:{bmc.port}', auth: none,"
                " timeout: 2s, deadline: 3s",
            ),
            tmp_path / "sys",
        )
        hung = exporter.wait_for(
            "redfish down as hung",
            lambda m: (
                value(m, "llmgw_exporter_source_failing", source="redfish", reason="hung") == 1
            ),
            timeout=8,
        )
        assert value(hung, "llmgw_exporter_source_up", source="redfish") == 0
        assert value(hung, "llmgw_exporter_source_deadline_seconds", source="redfish") == 3
        assert_threads_flat(exporter, 2.0)
        assert bmc.requests == 1  # no second request while the first is stuck
        assert len(exporter.log_lines("source redfish failing")) == 1
    finally:
        bmc.close()


# --- item 2: counter resets ----------------------------------------------------------------


def test_a_rapl_counter_reset_is_not_read_as_a_wrap(tmp_path: Path, run_exporter) -> None:
    sysfs = tmp_path / "sys"
    zone = rapl_zone(sysfs, 200_000_500_000)
    exporter = run_exporter(only("rapl", rapl="interval: 0.5s"), sysfs)
    exporter.wait_for("RAPL's power", lambda m: "llmgw_node_cpu_power_watts" in names(m))
    write_atomically(zone / "energy_uj", "1000000\n")  # reset, lower: looks like a wrap
    exporter.wait_for(
        "the reset counted",
        lambda m: (
            value(
                m,
                "llmgw_exporter_energy_resets_total",
                source="rapl",
                metric="llmgw_node_cpu_energy_joules_total",
            )
            == 1
        ),
        timeout=5,
    )
    # From the new reading on: 100 J a poll is counted again, never the 62 kJ "wrap".
    for step in range(1, 4):
        write_atomically(zone / "energy_uj", f"{1_000_000 + step * 100_000_000}\n")
        time.sleep(0.6)
        metrics = exporter.metrics()
        watts = value(metrics, "llmgw_node_cpu_power_watts", package="0")
        assert watts is None or watts < 1000, watts
        energy = value(metrics, "llmgw_node_cpu_energy_joules_total", package="0")
        assert energy is not None and energy <= step * 100, energy
    assert len(exporter.log_lines("a counter reset")) == 1
