"""Latency of the decider's `POST /v1/placements` at 100, 1,000 and 10,000 candidates.

The real `llmgw-decider` runs as a subprocess, on a free loopback port, in enforce mode,
over a generated site that a fake Prometheus (a child process answering `/api/v1/query`
for the decider's nine queries, `decider.refresher.QUERIES`) describes:

- N nodes (10,000 by default) of 8 GPUs at a 700 W enforced limit; racks of 8 nodes, each
  rack dual-fed from two PDUs (every node on both), rows of 10 racks, one room, one site;
- facility.yaml with a budget for every rack (two 57.5 kW feeds × 0.8), every PDU, row,
  the room and the site; racks follow a pattern of 16 so every rule has work: one hot, one
  warm, one too full for another replica (power_cap), one already over its cap
  (over_cap), twelve with loads between 33 % and 72 % of their cap; one rack is held;
- reservations for a quarter of the nodes (confirmed, of the replica's model), so the
  spread preference and the reserved loads are computed as in a busy site.

One client (http.client, one keep-alive connection) then sends, round after round, each
of: `GET /healthz` (the HTTP floor), `POST /v1/placements` with no candidates (the same
call with nothing to judge) and with 100, 1,000 and 10,000 candidates drawn at random
from the site (a replica of 4 GPUs), the order rotating each round so machine noise hits
every size alike. Two phases:

- **warm**: nothing changes between requests, so they read one View whose per-node
  figures earlier requests already worked out (the background refresh still replaces it
  every `refresh_interval`, as in production);
- **cold**: before every request the client makes or releases one reservation: the
  decider then serves a new View that no placement has read yet, as after every
  reservation the scheduler makes (and every hold and refresh). The reservations are
  timed too, as series of their own: the decider readies the next placement's parts in
  them (decider.placement.answers.prepare), and that cost must show.

Per size and phase: p50, p90, p99 latency (connect excluded: keep-alive; until the last
body byte), candidates judged per second, the serving thread's CPU per request (exact,
from /proc/<pid>/task/<pid>/schedstat), and ratios to both empty requests.

Usage (from the repository root; `make bench-decider` runs the first line):

    .venv/bin/python benchmarks/decider_placement.py
    .venv/bin/python benchmarks/decider_placement.py --check     # exit 1 if a target is missed
    .venv/bin/python benchmarks/decider_placement.py --quick     # seconds, for the smoke test

It prints a table, writes benchmarks/results/decider_placement.json and, with `--check`,
exits 1 when a target (docs/benchmarks.md) is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import importlib.metadata
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from decider.facility import DomainRef  # noqa: E402 - root on sys.path now
from decider.refresher import QUERIES, queries  # noqa: E402
from decider.store import Reservation, Store  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "decider_placement.json"

#: Targets from the issue; docs/benchmarks.md says how each is measured.
MAX_P99_MS_AT_10000 = 50.0
MAX_RATIO_AT_1000 = 3.0  # median latency at 1,000 candidates / GET /healthz's

#: CPU (in cores) other processes may use during a phase before the tails are suspect.
NOISY_LOAD_CORES = 0.25

SIZES = (100, 1000, 10_000)
NODES_PER_RACK = 8
RACKS_PER_ROW = 10
GPUS_PER_NODE = 8
GPU_LIMIT_WATTS = 700.0
FEED_RATING_WATTS = 57_500.0  # 415 V three-phase, 80 A
DERATING = 0.8
MARGIN = 0.10
RACK_OTHER_WATTS = 1_200.0
NODE_SHARE_WATTS = 350.0
RACK_CAP = FEED_RATING_WATTS * DERATING  # 46 kW: the smaller feed × derating
SITE, ROOM = "bench", "hall-a"
TOGGLE_ID = "bench-cold-view"  # the reservation made and released to rebuild the View
PROFILE = "llama-70b-tp4"
REPLICA = {"model": "llama-70b", "profile": PROFILE, "gpus": 4}
REPLICA_WATTS = 4 * GPU_LIMIT_WATTS + NODE_SHARE_WATTS * 4 / GPUS_PER_NODE  # 2,975 W
#: Racks follow this pattern (by index modulo 16); the rest are "ok".
RACK_SCENARIOS = {0: "hot", 1: "warm", 2: "full", 3: "over_cap"}
HELD_RACK_INDEX = 5
BASELINES = ("healthz", "empty")
PHASES = ("warm", "cold")
REFRESH_INTERVAL_S = 15  # decider.yaml's default


# --- the site ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rack:
    index: int
    name: str
    row: str
    scenario: str
    measured_watts: float

    @property
    def pdus(self) -> tuple[str, str]:
        return (f"{self.name}-a", f"{self.name}-b")


@dataclass(frozen=True)
class Site:
    nodes: tuple[str, ...]
    racks: tuple[Rack, ...]
    rack_of: dict[str, Rack]

    @property
    def rows(self) -> list[str]:
        return sorted({rack.row for rack in self.racks})

    def domains(self, node: str) -> list[DomainRef]:
        rack = self.rack_of[node]
        return [
            DomainRef("site", SITE),
            DomainRef("room", ROOM),
            DomainRef("row", rack.row),
            DomainRef("rack", rack.name),
            *(DomainRef("pdu", pdu) for pdu in rack.pdus),
        ]

    def all_domains(self) -> list[DomainRef]:
        refs = [DomainRef("site", SITE), DomainRef("room", ROOM)]
        refs += [DomainRef("row", row) for row in self.rows]
        for rack in self.racks:
            refs += [DomainRef("rack", rack.name), *(DomainRef("pdu", p) for p in rack.pdus)]
        return refs


def rack_load(index: int, scenario: str) -> float:
    """Measured watts of a rack: most between 33 % and 72 % of the cap, a few extremes."""
    limit = RACK_CAP * (1 - MARGIN) - RACK_OTHER_WATTS  # what measured may reach
    if scenario == "full":
        return limit - REPLICA_WATTS / 2  # room for half a replica: power_cap refuses
    if scenario == "over_cap":
        return RACK_CAP + 1_000.0  # over its cap whatever the replica: over_cap refuses
    return RACK_CAP * (0.33 + 0.03 * (index * 7 % 14))


def build_site(nodes: int) -> Site:
    names = tuple(f"n{index:05d}" for index in range(nodes))
    racks: list[Rack] = []
    rack_of: dict[str, Rack] = {}
    for index in range((nodes + NODES_PER_RACK - 1) // NODES_PER_RACK):
        row = index // RACKS_PER_ROW
        scenario = RACK_SCENARIOS.get(index % 16, "ok")
        rack = Rack(
            index=index,
            name=f"r{row:03d}-{index % RACKS_PER_ROW:02d}",
            row=f"{row:03d}",
            scenario=scenario,
            measured_watts=rack_load(index, scenario),
        )
        racks.append(rack)
        for node in names[index * NODES_PER_RACK : (index + 1) * NODES_PER_RACK]:
            rack_of[node] = rack
    return Site(names, tuple(racks), rack_of)


def measured_watts(site: Site) -> dict[DomainRef, float]:
    """Per domain: racks as generated, PDUs sharing their rack unevenly, the rest summed."""
    watts: dict[DomainRef, float] = {}
    for rack in site.racks:
        watts[DomainRef("rack", rack.name)] = rack.measured_watts
        a, b = rack.pdus
        watts[DomainRef("pdu", a)] = rack.measured_watts * 0.52
        watts[DomainRef("pdu", b)] = rack.measured_watts * 0.48
        row = DomainRef("row", rack.row)
        watts[row] = watts.get(row, 0.0) + rack.measured_watts
    total = sum(rack.measured_watts for rack in site.racks)
    watts[DomainRef("room", ROOM)] = total
    watts[DomainRef("site", SITE)] = total
    return watts


def conditions(site: Site) -> dict[DomainRef, str]:
    found = {ref: "ok" for ref in site.all_domains()}
    for rack in site.racks:
        if rack.scenario in ("hot", "warm"):
            found[DomainRef("rack", rack.name)] = rack.scenario
    return found


def facility_config(site: Site) -> dict[str, Any]:
    rack_caps = len(site.racks) * RACK_CAP
    domains: dict[str, Any] = {
        f"site/{SITE}": {"cap_watts": rack_caps * 0.8},
        f"room/{ROOM}": {"cap_watts": rack_caps * 0.8},
    }
    per_row = Counter(rack.row for rack in site.racks)
    for row in site.rows:
        domains[f"row/{row}"] = {"cap_watts": per_row[row] * RACK_CAP * 0.9}
    for rack in site.racks:
        domains[f"rack/{rack.name}"] = {
            "feeds": [{"pdu": pdu, "rating_watts": FEED_RATING_WATTS} for pdu in rack.pdus],
            "other_watts": RACK_OTHER_WATTS,
        }
        for pdu in rack.pdus:
            domains[f"pdu/{pdu}"] = {"cap_watts": RACK_CAP}
    return {
        "defaults": {"margin": MARGIN, "derating": DERATING},
        "domains": domains,
        "profiles": {PROFILE: {"gpus": 4}},  # derived: 4 × the node's limit + node share
        "node_share_watts": NODE_SHARE_WATTS,
        "mode": "enforce",
    }


def decider_config(port: int, prometheus_port: int) -> dict[str, Any]:
    return {
        "prometheus": {"url": f"http://127.0.0.1:{prometheus_port}", "timeout": "5s"},
        "facility": "facility.yaml",
        "listen": f"127.0.0.1:{port}",
        "database": "decider.db",
        "token_file": "decider.token",
        "refresh_interval": f"{REFRESH_INTERVAL_S}s",
    }


def add_reservations(database: Path, site: Site, count: int, seed: int) -> int:
    """`count` confirmed reservations of the replica's model on random nodes (at most one
    per node), written before the decider starts."""
    store = Store(database)
    try:
        now = time.time()
        chosen = random.Random(seed).sample(site.nodes, min(count, len(site.nodes)))
        for number, node in enumerate(chosen):
            store.add(
                Reservation(
                    id=f"bench-{number:05d}",
                    node=node,
                    replica=dict(REPLICA),
                    estimate_watts=REPLICA_WATTS,
                    gpus=4,
                    domains=tuple(site.domains(node)),
                    created_at=now,
                    expires_at=None,
                    confirmed_at=now,
                )
            )
        return len(chosen)
    finally:
        store.close()


# --- the fake Prometheus ------------------------------------------------------------------


def _vector(series: list[tuple[dict[str, str], float]]) -> bytes:
    now = time.time()
    result = [{"metric": labels, "value": [now, repr(float(value))]} for labels, value in series]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(body, separators=(",", ":")).encode()


def prometheus_answers(site: Site) -> dict[str, bytes]:
    """The body of each of the decider's queries (by part), as the rules would answer."""

    def labels(ref: DomainRef, **more: str) -> dict[str, str]:
        return {"kind": ref.kind, "domain": ref.name, **more}

    refs = site.all_domains()
    ages = {ref: 3.0 + (number % 25) for number, ref in enumerate(refs)}
    return {
        "membership": _vector(
            [
                ({"node": node, **labels(ref)}, 1.0)
                for node in site.nodes
                for ref in site.domains(node)
            ]
        ),
        "inventory": _vector([(labels(ref), 1.0) for ref in refs]),
        "measured": _vector([(labels(ref), w) for ref, w in measured_watts(site).items()]),
        "conditions": _vector(
            [(labels(ref, condition=state), 1.0) for ref, state in conditions(site).items()]
        ),
        "ages": _vector([(labels(ref), age) for ref, age in ages.items()]),
        "gpus": _vector([({"node": node}, GPUS_PER_NODE) for node in site.nodes]),
        "limits": _vector([({"node": node}, GPU_LIMIT_WATTS) for node in site.nodes]),
        "min_limits": _vector([({"node": node}, 200.0) for node in site.nodes]),  # an H100's
        "cpus": _vector([]),  # GPU replicas only: their estimate never reads the CPU model
        "profiles": _vector([]),  # placements without alternatives never read it
        "evidence": _vector([]),  # a refusal's words only: the figures change no decision
        # Hot for 15 minutes, the default lookback: past the default shedding.hot_for.
        "hot": _vector(
            [(labels(ref), 900.0) for ref, state in conditions(site).items() if state == "hot"]
        ),
    }


def part_of(query: str) -> str | None:
    """Which part of decider.refresher.QUERIES a query string is, by its series name."""
    for part, text in queries(90).items():  # formatted: the `hot` query has braces
        if query.startswith(text.split("[", 1)[0] + "["):
            return part
    return None


def fake_prometheus(bodies: dict[str, bytes], port: int = 0) -> ThreadingHTTPServer:
    """A server answering each of the decider's queries with `bodies[part]` (not started).

    `GET /stats` says how many times each part was asked (refreshes during a phase)."""
    asked: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urlparse(self.path)
            if url.path == "/stats":
                self.reply(200, json.dumps(asked).encode())
                return
            query = parse_qs(url.query).get("query", [""])[0]
            part = part_of(query) if url.path == "/api/v1/query" else None
            if part is None:
                self.reply(404, b'{"status":"error","error":"unknown query"}')
                return
            asked[part] += 1
            self.reply(200, bodies[part])

        def reply(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            with contextlib.suppress(OSError):
                self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    return server


def serve_fake_prometheus(directory: Path, port: int) -> None:
    """The child process: answer from `directory/<part>.json` until killed."""
    bodies = {part: (directory / f"{part}.json").read_bytes() for part in QUERIES}
    fake_prometheus(bodies, port).serve_forever()


# --- processes ------------------------------------------------------------------------------


def free_ports(count: int) -> list[int]:
    """Loopback ports nobody listens on (held together so they differ)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def tail(self, lines: int = 20) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@contextlib.contextmanager
def running(children: list[Child]) -> Iterator[list[Child]]:
    try:
        for child in children:
            child.start()
        yield children
    finally:
        for child in reversed(children):
            child.stop()


class Client:
    """One keep-alive connection to the decider; reconnects if the server closed it."""

    def __init__(self, port: int, token: str, timeout: float = 60.0) -> None:
        self.port = port
        self.token = token
        self.timeout = timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: bytes | None = None, auth: bool = False
    ) -> tuple[int, bytes, float]:
        """(status, body, seconds from sending the request to its last body byte)."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        for attempt in (1, 2):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
                self.conn.connect()  # not part of the timed request
            started = time.perf_counter()
            try:
                self.conn.request(method, path, body=body, headers=headers)
                response = self.conn.getresponse()
                content = response.read()
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt == 2:
                    raise
                continue
            seconds = time.perf_counter() - started
            if response.will_close:
                self.close()
            return response.status, content, seconds
        raise AssertionError("unreachable")

    def call(
        self, method: str, path: str, body: Any = None, expect: int = 200, auth: bool = True
    ) -> Any:
        """A JSON call that must answer `expect`; its parsed body (None when empty)."""
        payload = None if body is None else json.dumps(body).encode()
        status, content, _ = self.request(method, path, payload, auth and method != "GET")
        if status != expect:
            raise RuntimeError(f"{method} {path}: HTTP {status}, not {expect}: {content[:300]!r}")
        return json.loads(content) if content else None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def wait_ready(client: Client, decider: Child, nodes: int, timeout: float) -> dict[str, Any]:
    """Until /readyz says ready with every part read, and the snapshot holds every node."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not decider.alive():
            raise RuntimeError(f"llmgw-decider exited:\n{decider.tail()}")
        try:
            status, content, _ = client.request("GET", "/readyz")
        except OSError as exc:
            client.close()
            last = str(exc)
        else:
            ready = json.loads(content) if content.startswith(b"{") else {}
            if status == 200 and ready.get("prometheus_up") and not ready.get("missing"):
                site = client.call("GET", f"/v1/domains/site/{SITE}")
                if len(site["nodes"]) == nodes:
                    return ready
                last = f"the site holds {len(site['nodes'])} of {nodes} nodes"
            else:
                last = f"HTTP {status}: {content[:200]!r}"
        time.sleep(0.2)
    raise RuntimeError(f"llmgw-decider not ready after {timeout:g}s ({last}):\n{decider.tail()}")


# --- measuring ------------------------------------------------------------------------------


def thread_cpu_ns(pid: int) -> int:
    """CPU time of the process's main thread (uvicorn's event loop, where every async
    endpoint runs), in ns: exact, unlike the 10 ms ticks of /proc/<pid>/stat."""
    with open(f"/proc/{pid}/task/{pid}/schedstat") as stat:
        return int(stat.read().split()[0])


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores) since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def process_cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass
class Series:
    """What one kind of request measured in one phase."""

    candidates: int
    latencies: list[float] = field(default_factory=list)
    server_cpu_ns: list[int] = field(default_factory=list)
    statuses: set[int] = field(default_factory=set)
    body_bytes: int = 0


@dataclass
class PhaseResult:
    series: dict[str, Series]
    wall_seconds: float
    server_cpu_seconds: float
    other_load_cores: float
    refreshes: int


@dataclass(frozen=True)
class Kind:
    name: str
    method: str
    path: str
    bodies: tuple[bytes, ...]  # cycled through; empty for a GET
    candidates: int


def request_kinds(site: Site, sizes: list[int], lists: int, seed: int) -> list[Kind]:
    rng = random.Random(seed)

    def placement(candidates: list[str]) -> bytes:
        return json.dumps({"replica": REPLICA, "candidates": candidates}).encode()

    kinds = [
        Kind("healthz", "GET", "/healthz", (), 0),
        Kind("empty", "POST", "/v1/placements", (placement([]),), 0),
    ]
    for size in sizes:
        bodies = tuple(placement(rng.sample(site.nodes, size)) for _ in range(lists))
        kinds.append(Kind(str(size), "POST", "/v1/placements", bodies, size))
    return kinds


#: The cold phase's reservation requests, timed as series of their own (not placements).
TOGGLES = ("reserve", "release")


def toggle_reservation(client: Client, node: str, made: bool) -> tuple[str, float, int]:
    """Make or release one reservation: after either, the decider serves a new View, as
    after every reservation the scheduler makes. Which it was, its latency (what the
    decider does for the next placement in it is the reservation's to pay) and its bytes."""
    if made:
        status, content, seconds = client.request(
            "DELETE", f"/v1/reservations/{TOGGLE_ID}", auth=True
        )
        expect, kind = 204, "release"
    else:
        body = {"id": TOGGLE_ID, "replica": REPLICA, "node": node}
        status, content, seconds = client.request(
            "POST", "/v1/reservations", json.dumps(body).encode(), auth=True
        )
        expect, kind = 201, "reserve"
    if status != expect:
        raise RuntimeError(f"{kind} {TOGGLE_ID}: HTTP {status}, not {expect}: {content[:300]!r}")
    return kind, seconds, len(content)


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of the process, in ns (a reservation runs in the thread
    pool, not on the event loop's thread)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        path = f"/proc/{pid}/task/{task}/schedstat"
        with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(path) as stat:
            total += int(stat.read().split()[0])
    return total


def prometheus_asked(port: int) -> int:
    """How many measured-power queries the fake Prometheus has answered: one per refresh
    (the inventory parts, membership among them, are read less often)."""
    with contextlib.closing(http.client.HTTPConnection("127.0.0.1", port, timeout=10)) as conn:
        conn.request("GET", "/stats")
        return int(json.loads(conn.getresponse().read()).get("measured", 0))


def measure(
    client: Client,
    server: psutil.Process,
    kinds: list[Kind],
    rounds: int,
    prometheus_port: int,
    cold_node: str | None = None,
) -> PhaseResult:
    """`rounds` rounds of one request of every kind, the order rotated each round; with a
    `cold_node`, a reservation on it made or released before every request."""
    series = {kind.name: Series(kind.candidates) for kind in kinds}
    if cold_node is not None:
        series.update({name: Series(0) for name in TOGGLES})
    made = False
    asked_before = prometheus_asked(prometheus_port)
    cpu_before, busy_before = process_cpu_seconds(server), busy_seconds()
    own = psutil.Process()
    own_before = process_cpu_seconds(own)
    started = time.monotonic()
    for number in range(rounds):
        shift = number % len(kinds)
        for kind in kinds[shift:] + kinds[:shift]:
            if cold_node is not None:
                cpu = process_cpu_ns(server.pid)
                toggled, seconds, size = toggle_reservation(client, cold_node, made)
                entry = series[toggled]
                entry.body_bytes = size
                entry.server_cpu_ns.append(process_cpu_ns(server.pid) - cpu)
                entry.latencies.append(seconds)
                entry.statuses.add(201 if toggled == "reserve" else 204)
                made = not made
            body = kind.bodies[number % len(kind.bodies)] if kind.bodies else None
            cpu = thread_cpu_ns(server.pid)
            status, content, seconds = client.request(kind.method, kind.path, body)
            cpu = thread_cpu_ns(server.pid) - cpu
            entry = series[kind.name]
            entry.latencies.append(seconds)
            entry.server_cpu_ns.append(cpu)
            entry.statuses.add(status)
            entry.body_bytes = len(content)
    wall = time.monotonic() - started
    if made:
        assert cold_node is not None
        toggle_reservation(client, cold_node, made)  # left as found, not counted
    server_cpu = process_cpu_seconds(server) - cpu_before
    ours = server_cpu + process_cpu_seconds(own) - own_before
    other = max(0.0, busy_seconds() - busy_before - ours)
    return PhaseResult(
        series=series,
        wall_seconds=wall,
        server_cpu_seconds=server_cpu,
        other_load_cores=other / wall,
        refreshes=prometheus_asked(prometheus_port) - asked_before,
    )


def check_answers(client: Client, kinds: list[Kind]) -> dict[str, Any]:
    """One answer per size, parsed: every candidate judged, and what the rules said."""
    out: dict[str, Any] = {}
    for kind in kinds:
        if kind.method != "POST":
            continue
        status, content, _ = client.request(kind.method, kind.path, kind.bodies[0])
        if status != 200:
            raise RuntimeError(f"placement of {kind.name} candidates: HTTP {status}: {content!r}")
        answer = json.loads(content)
        if len(answer["nodes"]) != kind.candidates:
            raise RuntimeError(f"{kind.name} candidates, {len(answer['nodes'])} verdicts")
        if answer["missing"]:
            raise RuntimeError(f"the decider misses data: {answer['missing']}")
        out[kind.name] = {
            "allowed": len(answer["order"]),
            "refused": kind.candidates - len(answer["order"]),
            "summary": answer["summary"],
            "body_bytes": len(content),
        }
    return out


# --- figures --------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def figures(entry: Series) -> dict[str, Any]:
    values = entry.latencies
    mean = sum(values) / len(values)
    cpu = [ns / 1e6 for ns in entry.server_cpu_ns]
    out: dict[str, Any] = {
        "requests": len(values),
        "candidates": entry.candidates,
        "statuses": sorted(entry.statuses),
        "latency_ms": {
            "p50": percentile(values, 50) * 1e3,
            "p90": percentile(values, 90) * 1e3,
            "p99": percentile(values, 99) * 1e3,
            "mean": mean * 1e3,
            "min": min(values) * 1e3,
            "max": max(values) * 1e3,
        },
        "server_cpu_ms": {
            "p50": percentile(cpu, 50),
            "p99": percentile(cpu, 99),
            "mean": sum(cpu) / len(cpu),
        },
        "body_bytes": entry.body_bytes,
    }
    if entry.candidates:
        # One client, one request at a time: candidates judged per second of waiting.
        out["decisions_per_s"] = entry.candidates / mean
        out["decisions_per_s_at_p50"] = entry.candidates / percentile(values, 50)
    return out


def summarize(phase: PhaseResult) -> dict[str, Any]:
    kinds = {name: figures(entry) for name, entry in phase.series.items()}
    for figure in kinds.values():
        figure["ratio"] = {
            f"{base}_{key}": figure["latency_ms"][key] / kinds[base]["latency_ms"][key]
            for base in BASELINES
            for key in ("p50", "p99")
        }
    return {
        "kinds": kinds,
        "wall_s": phase.wall_seconds,
        "server_cpu_cores": phase.server_cpu_seconds / phase.wall_seconds,
        "other_load_cores": phase.other_load_cores,
        "refreshes": phase.refreshes,
    }


def targets(phases: dict[str, dict[str, Any]], sizes: list[int]) -> dict[str, dict[str, Any]]:
    """Each target in each phase (a size not run is not checked).

    The empty request the ratio is held to is `GET /healthz`: the HTTP floor of the same
    server. The placement with no candidates is reported beside it, but it is not empty in
    every phase (on a new View it pays for the View's site-wide figures)."""
    out: dict[str, dict[str, Any]] = {}
    for name, phase in phases.items():
        kinds = phase["kinds"]
        checks = {}
        if 10_000 in sizes:
            checks[f"p99_ms_at_10000_{name}"] = (
                kinds["10000"]["latency_ms"]["p99"],
                MAX_P99_MS_AT_10000,
            )
        if 1000 in sizes:
            checks[f"p50_ratio_at_1000_to_healthz_{name}"] = (
                kinds["1000"]["ratio"]["healthz_p50"],
                MAX_RATIO_AT_1000,
            )
        for key, (value, limit) in checks.items():
            out[key] = {"value": value, "max": limit, "met": value <= limit}
    return out


def decider_sha256() -> str:
    """One hash over the decider's code, so figures can be matched to the version measured."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "decider").rglob("*.py")):
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def machine() -> dict[str, Any]:
    model = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    versions = {}
    for package in ("fastapi", "starlette", "uvicorn", "pydantic", "pydantic-core"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "kernel": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        **versions,
    }


LABELS = {
    "healthz": "GET /healthz",
    "empty": "placement, 0 candidates",
    "reserve": "POST /v1/reservations",
    "release": "DELETE /v1/reservations/{id}",
}


def table(phase: dict[str, Any]) -> str:
    header = (
        "request",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "p50/healthz",
        "p99/healthz",
        "p50/empty",
        "p99/empty",
        "decisions/s",
        "server CPU ms",
        "bytes",
    )
    rows = [header]
    for name, figure in phase["kinds"].items():
        latency, ratio = figure["latency_ms"], figure["ratio"]
        rows.append(
            (
                LABELS[name] if name in LABELS else f"placement, {int(name):,} candidates",
                f"{latency['p50']:.2f}",
                f"{latency['p90']:.2f}",
                f"{latency['p99']:.2f}",
                f"{ratio['healthz_p50']:.2f}",
                f"{ratio['healthz_p99']:.2f}",
                f"{ratio['empty_p50']:.2f}",
                f"{ratio['empty_p99']:.2f}",
                f"{figure['decisions_per_s']:,.0f}" if "decisions_per_s" in figure else "",
                f"{figure['server_cpu_ms']['mean']:.2f}",
                f"{figure['body_bytes']:,}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        )
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def report(result: dict[str, Any]) -> str:
    m, s = result["machine"], result["settings"]
    lines = [
        f"machine: {m['cpu_model']}, {m['logical_cpus']} logical CPUs, {m['memory_gib']} GiB;"
        f" {m['kernel']}; {m['python']}; fastapi {m['fastapi']}, uvicorn {m['uvicorn']},"
        f" pydantic {m['pydantic']}",
        f"site: {s['nodes']:,} nodes, {s['racks']:,} racks, {s['domains']:,} domains,"
        f" {s['reservations']:,} reservations; enforce mode; {s['rounds']} rounds per phase"
        f" after {s['warmup']} warm-up; server ready in {result['server']['ready_s']:.1f} s,"
        f" RSS {result['server']['rss_mib']:.0f} MiB",
    ]
    for name, phase in result["phases"].items():
        lines += [
            "",
            f"{name} view: {phase['wall_s']:.0f} s, {phase['refreshes']} refreshes, server"
            f" {phase['server_cpu_cores']:.2f} cores, other processes"
            f" {phase['other_load_cores']:.2f} cores",
            table(phase),
        ]
        if phase["other_load_cores"] > NOISY_LOAD_CORES:
            lines.append(
                "warning: other processes were busy during this phase; its p90/p99 reflect"
                " that contention: rerun on a quiet machine"
            )
    lines.append("")
    for name, target in result["targets"].items():
        mark = "met" if target["met"] else "MISSED"
        lines.append(f"target {name}: {target['value']:.2f} <= {target['max']:g}: {mark}")
    return "\n".join(lines)


# --- the run --------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    when = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    code = decider_sha256()  # before the run: the code the subprocess loads
    site = build_site(args.nodes)
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-decider-") as tmp_name:
        tmp = Path(tmp_name)
        answers = tmp / "prometheus"
        answers.mkdir()
        for part, body in prometheus_answers(site).items():
            (answers / f"{part}.json").write_bytes(body)
        port, prometheus_port = free_ports(2)
        (tmp / "facility.yaml").write_text(yaml.safe_dump(facility_config(site), sort_keys=False))
        (tmp / "decider.yaml").write_text(
            yaml.safe_dump(decider_config(port, prometheus_port), sort_keys=False)
        )
        token = "benchmark-token-" + os.urandom(8).hex()
        (tmp / "decider.token").write_text(token + "\n")
        reservations = add_reservations(tmp / "decider.db", site, args.reservations, args.seed)
        script = str(Path(__file__).resolve())
        prometheus = Child(
            "fake-prometheus",
            [sys.executable, script, "--serve-fake-prometheus", str(answers), str(prometheus_port)],
            tmp / "prometheus.log",
        )
        decider = Child(
            "llmgw-decider",
            [
                sys.executable,
                "-m",
                "decider.main",
                "--config",
                str(tmp / "decider.yaml"),
                "--log-level",
                "warning",
            ],
            tmp / "decider.log",
        )
        client = Client(port, token)
        with running([prometheus, decider]), contextlib.closing(client):
            started = time.monotonic()
            wait_ready(client, decider, args.nodes, args.ready_timeout)
            ready_s = time.monotonic() - started
            assert decider.proc is not None
            server = psutil.Process(decider.proc.pid)
            held_rack = site.racks[min(HELD_RACK_INDEX, len(site.racks) - 1)]
            client.call(
                "POST", f"/v1/domains/rack/{held_rack.name}/hold", {"reason": "benchmark: hold"}
            )
            kinds = request_kinds(site, args.sizes, args.lists, args.seed)
            answers_seen = check_answers(client, kinds)
            measure(client, server, kinds, args.warmup, prometheus_port)
            cold_node = next(r for r in site.racks if r.scenario == "ok" and r != held_rack)
            phases = {}
            for name in args.phases:
                node = site.nodes[cold_node.index * NODES_PER_RACK] if name == "cold" else None
                result = measure(client, server, kinds, args.rounds, prometheus_port, node)
                phases[name] = summarize(result)
            rss = server.memory_info().rss / 2**20
            alive = decider.alive()
        if not alive:
            raise RuntimeError(f"llmgw-decider died during the run:\n{decider.tail()}")
    return {
        "when": when,
        "command": args.command,
        "machine": machine(),
        "decider_sha256": code,
        "settings": {
            "nodes": args.nodes,
            "racks": len(site.racks),
            "rows": len(site.rows),
            "domains": len(site.all_domains()),
            "gpus_per_node": GPUS_PER_NODE,
            "gpu_limit_watts": GPU_LIMIT_WATTS,
            "replica": REPLICA,
            "replica_estimate_watts": REPLICA_WATTS,
            "reservations": reservations,
            "held_rack": held_rack.name,
            "sizes": args.sizes,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "candidate_lists_per_size": args.lists,
            "phases": args.phases,
            "seed": args.seed,
            "refresh_interval_s": REFRESH_INTERVAL_S,
        },
        "server": {"ready_s": ready_s, "rss_mib": rss, "pid_alive_at_end": alive},
        "answers": answers_seen,
        "phases": phases,
        "targets": targets(phases, args.sizes),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes",
        default=",".join(str(size) for size in SIZES),
        help="candidate counts, comma-separated (default 100,1000,10000)",
    )
    parser.add_argument("--nodes", type=int, help="nodes in the site (default: the largest size)")
    parser.add_argument("--rounds", type=int, default=200, help="rounds per phase (default 200)")
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured rounds (default 10)")
    parser.add_argument(
        "--phases", default="warm,cold", help="warm, cold or both (default warm,cold)"
    )
    parser.add_argument(
        "--reservations", type=int, help="confirmed reservations (default: a quarter of the nodes)"
    )
    parser.add_argument(
        "--lists", type=int, default=8, help="distinct candidate lists per size (default 8)"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds (default 120)")
    parser.add_argument(
        "--quick", action="store_true", help="64 nodes, sizes 8 and 32, 5 rounds: seconds"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON (default {RESULTS})")
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    script = Path(__file__).resolve()
    shown = script.relative_to(REPO) if script.is_relative_to(REPO) else script
    args.command = " ".join(
        [".venv/bin/python", str(shown), *(sys.argv[1:] if argv is None else argv)]
    )
    if args.quick:
        args.sizes, args.nodes, args.rounds, args.warmup, args.lists = "8,32", 64, 5, 1, 2
    try:
        args.sizes = sorted({int(size) for size in args.sizes.split(",")})
    except ValueError:
        parser.error(f"--sizes {args.sizes!r} is not a comma-separated list of numbers")
    args.phases = [phase.strip() for phase in args.phases.split(",") if phase.strip()]
    if not args.phases or not set(args.phases) <= set(PHASES):
        parser.error(f"--phases must name warm, cold or both, not {args.phases!r}")
    args.nodes = args.nodes or max(args.sizes)
    if args.reservations is None:
        args.reservations = args.nodes // 4
    if min(args.sizes) < 1 or max(args.sizes) > args.nodes:
        parser.error(f"sizes must be between 1 and the site's {args.nodes} nodes")
    if args.rounds < 1 or args.warmup < 0 or args.lists < 1:
        parser.error("--rounds and --lists must be at least 1, --warmup at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if arguments[:1] == ["--serve-fake-prometheus"]:
        serve_fake_prometheus(Path(arguments[1]), int(arguments[2]))
        return 0
    args = parse_args(argv)
    result = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"\nwritten: {args.output}")
    missed = [name for name, target in result["targets"].items() if not target["met"]]
    if args.check and missed:
        print(f"targets missed: {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # A plain `kill` ends the run through its `finally` blocks, so no server is left behind.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    sys.exit(main())
