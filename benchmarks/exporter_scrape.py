"""Scrape cost of llmgw-exporter against Debian's prometheus-node-exporter.

Both exporters read the same sysfs tree (node_exporter's own fixture,
sys.ttar, unpacked into a temporary directory); ours also serves eight fake
H100 GPUs through the fake NVML library of tests/fake_nvml. node_exporter runs
only its hwmon and rapl collectors. The two are scraped alternately (A, B, A,
B, ...) by the same client, one fresh connection per request, once ours has
its steady-state exposition (RAPL power needs a second reading), and for each
the script reports:

- wall latency of a `/metrics` scrape (median, p90, p99), and of an empty
  request (a path with no metrics: a 404 from ours, the small landing page
  from node_exporter) measured the same way in the same run, so the ratio
  ours / node_exporter is given both raw and net of the HTTP cost;
- CPU per scrape: the server process's user+system CPU over all its scrapes,
  less what it burns idle (background polling) over the same wall time,
  divided by the number of scrapes;
- the server's resident memory when ready and at the end (and its peak);
- whether our exposition passes `promtool check metrics`.

Usage (from the repository root; `make bench` runs the first line):

    .venv/bin/python benchmarks/exporter_scrape.py
    .venv/bin/python benchmarks/exporter_scrape.py --rounds 1000 --check

It prints a table, writes benchmarks/results/exporter_scrape.json, and with
`--check` exits 1 when a target (docs/benchmarks.md) is missed.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pynvml
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.shared_fixtures import SHARED_FIXTURES as FIXTURES  # noqa: E402 - root on sys.path now
from tests.ttar import extract  # noqa: E402

SYS_TTAR = FIXTURES / "node_exporter" / "sys.ttar"
RESULTS = REPO / "benchmarks" / "results" / "exporter_scrape.json"

#: Targets from the issue; docs/benchmarks.md says how each is measured.
MAX_LATENCY_RATIO = 1.0  # our median scrape / node_exporter's
MAX_CPU_MS_PER_SCRAPE = 5.0  # ours, net of idle polling, with 8 GPUs
MAX_RSS_MIB = 40.0  # ours, at the end of the run; MiB, as ps and top count

#: CPU (in cores) other processes may use during the run before the tails are suspect.
NOISY_LOAD_CORES = 0.25

EMPTY_PATH = "/benchmark-empty-request"  # 404 on ours; node_exporter's landing page
GPU_MODEL = "NVIDIA H100 80GB HBM3"
SOURCES = ("gpu", "hwmon", "rapl")
MIB = 1024 * 1024


# --- the setting: sysfs tree, fake GPUs, agent.yaml ------------------------------------


def build_sysfs(dest: Path) -> Path:
    """node_exporter's fixture tree, unpacked under dest; returns the sysfs root."""
    extract(SYS_TTAR, dest)
    return dest / "sys"


def fake_nvml_config(gpus: int) -> dict[str, Any]:
    """Eight busy H100s (by default): 59 °C, HBM 54 °C, 631.95 W of 700 W, slowdown 87 °C."""
    return {
        "driver_version": "550.54.15",
        "devices": [
            {
                "name": GPU_MODEL,
                "uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'llmgw-bench/{index}')}",
                "temperature_c": 59,
                "memory_temperature_c": 54,
                "slowdown_temperature_c": 87,
                "power_mw": 631_950,
                "enforced_power_limit_mw": 700_000,
                "total_energy_mj": 1_234_567_890 + index * 1_000_003,
                "clocks_event_reasons": pynvml.nvmlClocksEventReasonSwPowerCap,
                "supported_clocks_event_reasons": pynvml.nvmlClocksEventReasonAll,
                "mig_instances": [],
                "errors": {},
            }
            for index in range(gpus)
        ],
    }


def agent_config(port: int, library: Path) -> dict[str, Any]:
    return {
        "node": "bench-node",
        "labels": {
            "llmgw.io/site": "bench",
            "llmgw.io/room": "hall-a",
            "llmgw.io/row": "1",
            "llmgw.io/rack": "r1-01",
            "llmgw.io/pdu": "r1-01-a,r1-01-b",
        },
        "overhead_watts": 250,
        "listen": f"127.0.0.1:{port}",
        "sources": {"gpu": {"library": str(library)}},
    }


def fake_nvml_library() -> Path:
    """Build (once) and return tests/fake_nvml/libnvidia-ml.so.1."""
    from tests.fake_nvml.build import ensure_built

    return Path(ensure_built()).resolve()


def free_ports(count: int) -> list[int]:
    """Loopback ports nobody listens on (held together so they differ)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


# --- the two servers --------------------------------------------------------------------


@dataclass
class Server:
    name: str
    argv: list[str]
    port: int
    env: dict[str, str] | None = None
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    ps: psutil.Process | None = None
    rss_at_ready_mib: float = 0.0

    def start(self) -> None:
        with ExitStack() as stack:
            out = (
                stack.enter_context(self.log.open("wb"))
                if self.log is not None
                else subprocess.DEVNULL
            )
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.ps = psutil.Process(self.proc.pid)

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def cpu_seconds(self) -> float:
        assert self.ps is not None
        times = self.ps.cpu_times()
        return times.user + times.system

    def rss_mib(self) -> tuple[float, float]:
        """(resident now, peak resident) in MiB."""
        assert self.ps is not None
        rss = self.ps.memory_info().rss / MIB
        peak = rss
        status = Path(f"/proc/{self.ps.pid}/status")
        if status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return rss, peak

    def unique_mib(self) -> dict[str, float | None]:
        """USS (pages only this process maps) and PSS, where /proc lets us read them."""
        assert self.ps is not None
        try:
            full = self.ps.memory_full_info()
        except (psutil.AccessDenied, AttributeError):
            return {"uss_mib": None, "pss_mib": None}
        pss = getattr(full, "pss", None)
        return {"uss_mib": full.uss / MIB, "pss_mib": None if pss is None else pss / MIB}

    def tail_log(self, lines: int = 20) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def ours(port: int, config: Path, sysfs: Path, nvml_config: Path, log: Path) -> Server:
    env = {**os.environ, "FAKE_NVML_CONFIG": str(nvml_config), "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "exporter", "--config", str(config), "--sysfs", str(sysfs)]
    return Server("llmgw-exporter", argv, port, env=env, log=log)


def node_exporter(binary: str, port: int, sysfs: Path, log: Path | None) -> Server:
    argv = [
        binary,
        "--collector.disable-defaults",
        "--collector.hwmon",
        "--collector.rapl",
        f"--path.sysfs={sysfs}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    return Server("node_exporter", argv, port, log=log)


# --- the client -----------------------------------------------------------------------


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
    """One plain GET on a fresh connection: (status, body, wall seconds).

    http.client asks for `Accept-Encoding: identity`, so neither server gzips.
    """
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    return response.status, body, time.perf_counter() - started


def series_lines(body: bytes) -> list[str]:
    return [line for line in body.decode().splitlines() if line and not line.startswith("#")]


def ours_ready(body: bytes, gpus: int, settled: bool = True) -> bool:
    """Every GPU served, every source polled and, if `settled`, RAPL's power series there.

    RAPL power needs two readings of the energy counter (one poll interval apart):
    until then the exposition lacks those series, and the run would not measure
    the steady state.
    """
    lines = series_lines(body)
    has_gpus = sum(line.startswith("llmgw_gpu_info{") for line in lines) == gpus
    up = {
        source
        for source in SOURCES
        for line in lines
        if line.startswith("llmgw_exporter_source_up{") and f'source="{source}"' in line
    }
    has_energy = any(line.startswith("llmgw_node_cpu_energy_joules_total{") for line in lines)
    has_power = any(line.startswith("llmgw_node_cpu_power_watts{") for line in lines)
    steady = has_power or not has_energy or not settled
    return has_gpus and up == set(SOURCES) and steady


def wait_ready(server: Server, ready: Callable[[bytes], bool], timeout: float) -> bytes:
    assert server.proc is not None
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(
                f"{server.name} exited with {server.proc.returncode}:\n{server.tail_log()}"
            )
        try:
            status, body, _ = get(server.port, "/metrics", timeout=2)
        except OSError as exc:
            last = str(exc)
        else:
            if status == 200 and ready(body):
                return body
            last = f"HTTP {status}, {len(series_lines(body))} series, not complete yet"
        time.sleep(0.1)
    raise RuntimeError(f"{server.name} not ready after {timeout:g}s ({last}):\n{server.tail_log()}")


@dataclass
class Phase:
    """Latencies and CPU of one server over one alternating phase."""

    latencies: list[float] = field(default_factory=list)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    statuses: set[int] = field(default_factory=set)
    body: bytes = b""
    other_load_cores: float = 0.0  # CPU used by every other process, in cores


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores) since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def _own_seconds() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def alternate(servers: list[Server], path: str, rounds: int) -> list[Phase]:
    """`rounds` rounds of one GET per server, in turn; CPU counted over the whole phase.

    Also measures what the rest of the machine used meanwhile (busy CPU, less
    both servers and this client): other load makes the tails noisy.
    """
    phases = [Phase() for _ in servers]
    cpu_before = [server.cpu_seconds() for server in servers]
    busy_before, own_before = _busy_seconds(), _own_seconds()
    started = time.monotonic()
    for _ in range(rounds):
        for server, phase in zip(servers, phases, strict=True):
            status, body, seconds = get(server.port, path)
            phase.latencies.append(seconds)
            phase.statuses.add(status)
            phase.body = body
    wall = time.monotonic() - started
    for server, phase, before in zip(servers, phases, cpu_before, strict=True):
        phase.cpu_seconds = server.cpu_seconds() - before
        phase.wall_seconds = wall
    ours_and_client = sum(phase.cpu_seconds for phase in phases) + _own_seconds() - own_before
    other = max(0.0, _busy_seconds() - busy_before - ours_and_client)
    for phase in phases:
        phase.other_load_cores = other / wall
    return phases


def idle_cpu_rates(servers: list[Server], seconds: float) -> list[float]:
    """CPU seconds per wall second each server burns with nobody scraping it."""
    before = [server.cpu_seconds() for server in servers]
    started = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - started
    return [(server.cpu_seconds() - b) / wall for server, b in zip(servers, before, strict=True)]


# --- figures --------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def latency_ms(values: list[float]) -> dict[str, float]:
    return {
        "median": percentile(values, 50) * 1e3,
        "p90": percentile(values, 90) * 1e3,
        "p99": percentile(values, 99) * 1e3,
        "mean": sum(values) / len(values) * 1e3,
        "min": min(values) * 1e3,
        "max": max(values) * 1e3,
    }


def promtool_check(body: bytes) -> dict[str, Any]:
    promtool = shutil.which("promtool")
    if promtool is None:
        return {"ran": False, "passed": None, "output": "promtool is not installed"}
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, timeout=30, check=False
    )
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    return {"ran": True, "passed": result.returncode == 0, "output": output}


def version_line(argv: list[str]) -> str:
    try:
        result = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except OSError as exc:
        return f"unknown ({exc})"
    text = (result.stdout + result.stderr).decode(errors="replace").strip()
    return text.splitlines()[0] if text else "unknown"


def machine(node_exporter_binary: str) -> dict[str, Any]:
    model = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "prometheus_client": importlib.metadata.version("prometheus-client"),
        "node_exporter": version_line([node_exporter_binary, "--version"]),
        "promtool": version_line(["promtool", "--version"]) if shutil.which("promtool") else None,
    }


def summarize(
    servers: list[Server],
    scrapes: list[Phase],
    empties: list[Phase],
    idle_rates: list[float],
    idle_seconds: float,
    rounds: int,
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for server, scrape, empty, idle in zip(servers, scrapes, empties, idle_rates, strict=True):
        rss, peak = server.rss_mib()
        net_cpu = scrape.cpu_seconds - idle * scrape.wall_seconds
        net_empty_cpu = empty.cpu_seconds - idle * empty.wall_seconds
        out[server.name] = {
            "scrape_ms": latency_ms(scrape.latencies),
            "empty_request_ms": latency_ms(empty.latencies),
            "scrape_statuses": sorted(scrape.statuses),
            "empty_request_statuses": sorted(empty.statuses),
            "cpu_ms_per_scrape_raw": scrape.cpu_seconds / rounds * 1e3,
            "cpu_ms_per_scrape": net_cpu / rounds * 1e3,
            "cpu_ms_per_empty_request": net_empty_cpu / rounds * 1e3,
            "idle_cpu_ms_per_s": idle * 1e3,
            "idle_window_s": idle_seconds,
            "rss_at_ready_mib": server.rss_at_ready_mib,
            "rss_mib": rss,
            "rss_mb_decimal": rss * MIB / 1e6,
            "peak_rss_mib": peak,
            **server.unique_mib(),
            "body_bytes": len(scrape.body),
            "series": len(series_lines(scrape.body)),
        }
    return out


def ratios(ours_: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    def net(figures: dict[str, Any], key: str) -> float:
        return float(figures["scrape_ms"][key] - figures["empty_request_ms"][key])

    out = {}
    for key in ("median", "p90", "p99"):
        out[f"{key}_raw"] = ours_["scrape_ms"][key] / theirs["scrape_ms"][key]
        theirs_net = net(theirs, key)
        out[f"{key}_net"] = net(ours_, key) / theirs_net if theirs_net > 0 else float("nan")
    return out


def targets(ours_: dict[str, Any], ratio: dict[str, float]) -> dict[str, dict[str, Any]]:
    checks = {
        "latency_ratio_median": (ratio["median_raw"], MAX_LATENCY_RATIO),
        "cpu_ms_per_scrape": (ours_["cpu_ms_per_scrape"], MAX_CPU_MS_PER_SCRAPE),
        "rss_mib": (ours_["rss_mib"], MAX_RSS_MIB),
    }
    return {
        name: {"value": value, "max": limit, "met": value <= limit}
        for name, (value, limit) in checks.items()
    }


def table(result: dict[str, Any]) -> str:
    a, b = result["exporters"]["llmgw-exporter"], result["exporters"]["node_exporter"]
    ratio = result["ratios"]
    rows: list[tuple[str, str, str, str]] = [("", "llmgw-exporter", "node_exporter", "ours/theirs")]

    def row(label: str, x: float, y: float, r: float | None = None, fmt: str = "{:.3f}") -> None:
        rows.append((label, fmt.format(x), fmt.format(y), "" if r is None else f"{r:.2f}"))

    for key in ("median", "p90", "p99"):
        row(f"scrape {key} (ms)", a["scrape_ms"][key], b["scrape_ms"][key], ratio[f"{key}_raw"])
    for key in ("median", "p90", "p99"):
        row(
            f"empty request {key} (ms)",
            a["empty_request_ms"][key],
            b["empty_request_ms"][key],
        )
    for key in ("median", "p90", "p99"):
        row(
            f"scrape {key} net of empty (ms)",
            a["scrape_ms"][key] - a["empty_request_ms"][key],
            b["scrape_ms"][key] - b["empty_request_ms"][key],
            ratio[f"{key}_net"],
        )
    row("CPU per scrape, raw (ms)", a["cpu_ms_per_scrape_raw"], b["cpu_ms_per_scrape_raw"])
    row("CPU per scrape, net of idle (ms)", a["cpu_ms_per_scrape"], b["cpu_ms_per_scrape"])
    row("CPU per empty request (ms)", a["cpu_ms_per_empty_request"], b["cpu_ms_per_empty_request"])
    row("idle CPU (ms per s)", a["idle_cpu_ms_per_s"], b["idle_cpu_ms_per_s"])
    row("RSS when ready (MiB)", a["rss_at_ready_mib"], b["rss_at_ready_mib"], fmt="{:.1f}")
    row("RSS at end (MiB)", a["rss_mib"], b["rss_mib"], fmt="{:.1f}")
    row("RSS at end (MB, 10^6 bytes)", a["rss_mb_decimal"], b["rss_mb_decimal"], fmt="{:.1f}")
    row("peak RSS (MiB)", a["peak_rss_mib"], b["peak_rss_mib"], fmt="{:.1f}")
    if a["uss_mib"] is not None and b["uss_mib"] is not None:
        row("USS at end (MiB)", a["uss_mib"], b["uss_mib"], fmt="{:.1f}")
    row("exposition (bytes)", a["body_bytes"], b["body_bytes"], fmt="{:.0f}")
    row("series", a["series"], b["series"], fmt="{:.0f}")
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:>{widths[3]}}"
        for r in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------


@contextmanager
def running(servers: list[Server]) -> Iterator[list[Server]]:
    try:
        for server in servers:
            server.start()
        yield servers
    finally:
        for server in servers:
            server.stop()


def run(args: argparse.Namespace) -> dict[str, Any]:
    library = Path(args.library).resolve() if args.library else fake_nvml_library()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp_name:
        tmp = Path(tmp_name)
        sysfs = build_sysfs(tmp / "tree")
        nvml_config = tmp / "fake_nvml.json"
        nvml_config.write_text(json.dumps(fake_nvml_config(args.gpus), indent=2))
        our_port, their_port = free_ports(2)
        agent_yaml = tmp / "agent.yaml"
        agent_yaml.write_text(yaml.safe_dump(agent_config(our_port, library), sort_keys=False))
        servers = [
            ours(our_port, agent_yaml, sysfs, nvml_config, tmp / "llmgw-exporter.log"),
            node_exporter(args.node_exporter, their_port, sysfs, None),
        ]
        with running(servers):
            our_body = wait_ready(
                servers[0], lambda body: ours_ready(body, args.gpus, not args.no_settle), 30
            )
            wait_ready(servers[1], lambda body: b"node_hwmon_temp_celsius" in body, 30)
            for server in servers:
                server.rss_at_ready_mib = server.rss_mib()[0]
            alternate(servers, "/metrics", args.warmup)
            alternate(servers, EMPTY_PATH, max(1, args.warmup // 4))
            scrapes = alternate(servers, "/metrics", args.rounds)
            empties = alternate(servers, EMPTY_PATH, args.rounds)
            idle_seconds = max(scrapes[0].wall_seconds, args.idle_min)
            idle_rates = idle_cpu_rates(servers, idle_seconds)
            exporters = summarize(servers, scrapes, empties, idle_rates, idle_seconds, args.rounds)
            our_body = scrapes[0].body or our_body
            still_running = {s.name: s.proc is not None and s.proc.poll() is None for s in servers}
    ours_, theirs = exporters["llmgw-exporter"], exporters["node_exporter"]
    ratio = ratios(ours_, theirs)
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": args.command,
        "machine": machine(args.node_exporter),
        "settings": {
            "rounds": args.rounds,
            "warmup": args.warmup,
            "gpus": args.gpus,
            "waited_for_steady_state": not args.no_settle,
            "gpu_model": GPU_MODEL,
            "sysfs": "node_exporter fixtures/sys.ttar",
            "node_exporter_flags": servers[1].argv[1:4],
            "empty_request_path": EMPTY_PATH,
            "fake_nvml_library": str(library),
        },
        "exporters": exporters,
        "ratios": ratio,
        "promtool_check_metrics": promtool_check(our_body),
        "other_load_cores": {
            "scrapes": scrapes[0].other_load_cores,
            "empty_requests": empties[0].other_load_cores,
        },
        "gpus_served": sum(line.startswith("llmgw_gpu_info{") for line in series_lines(our_body)),
        "servers_alive_at_end": still_running,
        "targets": targets(ours_, ratio),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1000, help="measured rounds (default 1000)")
    parser.add_argument("--warmup", type=int, default=50, help="unmeasured rounds (default 50)")
    parser.add_argument("--gpus", type=int, default=8, help="fake GPUs (default 8)")
    parser.add_argument(
        "--idle-min",
        type=float,
        default=10.0,
        help="shortest idle window for the background CPU rate, seconds (default 10)",
    )
    parser.add_argument(
        "--node-exporter",
        default=shutil.which("prometheus-node-exporter") or "/usr/bin/prometheus-node-exporter",
        help="node_exporter binary (default: prometheus-node-exporter on PATH)",
    )
    parser.add_argument("--library", help="fake libnvidia-ml.so.1 (default: build tests/fake_nvml)")
    parser.add_argument(
        "--no-settle",
        action="store_true",
        help="start before RAPL's second reading (steady state needs one poll interval, 5 s)",
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON (default {RESULTS})")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    script = Path(__file__).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    args.command = " ".join(
        [".venv/bin/python", str(shown), *(sys.argv[1:] if argv is None else argv)]
    )
    if args.rounds < 1 or args.warmup < 0 or args.gpus < 1:
        parser.error("--rounds and --gpus must be at least 1, --warmup at least 0")
    return args


def report(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, {m['memory_gib']} GiB;"
        f" {m['kernel']}; {m['python']}; {m['node_exporter']}",
        f"{result['settings']['rounds']} alternating rounds after"
        f" {result['settings']['warmup']} warm-up;"
        f" {result['gpus_served']} fake GPUs served; other processes used"
        f" {result['other_load_cores']['scrapes']:.2f} of {m['logical_cpus']} CPUs meanwhile",
        "",
        table(result),
        "",
    ]
    if result["other_load_cores"]["scrapes"] > NOISY_LOAD_CORES:
        lines.append(
            "warning: other processes were busy during the run; the p90/p99 figures"
            " reflect that contention: rerun on a quiet machine"
        )
    check = result["promtool_check_metrics"]
    if not check["ran"]:
        lines.append(f"promtool check metrics: not run ({check['output']})")
    else:
        verdict = "passes" if check["passed"] else "FAILS"
        lines.append(f"promtool check metrics on our exposition: {verdict}")
        if check["output"]:
            lines += ["  " + line for line in check["output"].splitlines()]
    for name, target in result["targets"].items():
        mark = "met" if target["met"] else "MISSED"
        lines.append(f"target {name}: {target['value']:.3f} <= {target['max']:g}: {mark}")
    return "\n".join(lines)


def missed_targets(result: dict[str, Any]) -> list[str]:
    """The targets the run missed, by name (`--check` exits 1 on any), a failing
    `promtool check metrics` among them."""
    missed = [name for name, target in result["targets"].items() if not target["met"]]
    if result["promtool_check_metrics"]["passed"] is False:
        missed.append("promtool_check_metrics")
    return missed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2, sort_keys=False) + "\n")
    print(report(result))
    print(f"\nwritten: {args.output}")
    missed = missed_targets(result)
    if args.check and missed:
        print(f"targets missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
