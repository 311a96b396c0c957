"""A real `llmgw-decider` for service-level tests, and a fake Prometheus for it to read.

- `FakePrometheus` serves `/api/v1/query` on a loopback port from a thread. It answers each
  of the decider's queries (decider/refresher.py `QUERIES`, matched on the series name
  inside the query) from `Readings`: membership, inventory, measured power, conditions,
  reading ages, GPU counts, GPU power limits, profiles' measured figures, how long hot
  domains have been hot, what each condition rests on (evidence) and, where a domain opts
  in to oversubscription, the peaks. A test changes the
  readings at any time, and can switch the whole server, or one part's query, to misbehave:
  `down` (nothing listens on the port), `slow` (answers after `slow_s`), `garbage` (200 with
  a body that is not JSON), `error` (HTTP 500), `held` (no answer until `release()`),
  `trickle` (200 and its headers at once, then one byte of the body every `trickle_s`, never
  the whole of it). `extra_series` adds raw series (a value such as "NaN") to a part's
  answer; `require_authorization` answers 401 to any other Authorization header, and `tls`
  serves HTTPS. Its error answers quote the Authorization header they were sent, as a
  careless proxy might: a test of redaction.
- `Decider` writes decider.yaml, facility.yaml and a token file into a directory, starts
  `python -m decider.main --config decider.yaml` as a subprocess on a free port, waits for
  `/healthz` (and, on request, for a snapshot matching a predicate), and stops it: SIGTERM,
  or SIGKILL for the durability tests. Its log is kept and shown when something fails.

Everything waits by polling with a deadline; nothing sleeps a fixed time to synchronise.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import requests
import yaml

from tests.promstack import free_port

REPO = Path(__file__).resolve().parents[1]
#: Deadline for anything awaited by polling: a start, a refresh, an expiry.
DEADLINE_S = 30.0
POLL_S = 0.02
STOP_TIMEOUT_S = 10.0
START_ATTEMPTS = 3
TOKEN = "test-token-0123456789abcdef"

#: The series each snapshot part's query reads (decider/refresher.py QUERIES).
SERIES: dict[str, str] = {
    "membership": "llmgw:node_domain:membership",
    "inventory": "llmgw_domain_info",
    "measured": "llmgw_domain_measured_watts",
    "conditions": "llmgw_domain_condition",
    "ages": "llmgw_domain_reading_age_seconds",
    "gpus": "llmgw:node_gpus:count",
    "limits": "llmgw_gpu_power_limit_watts",
    "min_limits": "llmgw_gpu_power_limit_min_watts",
    "profiles": "llmgw:model_profile_tokens_per_joule:ratio5m",
    "hot": "llmgw_domain_condition{condition='hot'} != 1)",  # its subquery's first
    "cpus": "llmgw_node_cpu_info",
    "evidence": "llmgw:domain_cooling_alarm",  # one of its figures' series
    # The optional part (decider/peaks.py), asked where a domain opts in to oversubscription:
    # its unit figure's series (its domain figures' selectors carry label matchers).
    "peaks": "llmgw:unit_power_watts",
}

BEHAVIOURS = ("ok", "down", "slow", "garbage", "error", "held", "trickle")


def poll(
    condition: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S, every: float = POLL_S
) -> Any:
    """`condition()`'s first truthy value, polled until `timeout_s`; AssertionError after."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        last = condition()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(every)


# --- the fake Prometheus -------------------------------------------------------------------


def _domain_labels(key: str) -> dict[str, str]:
    kind, _, name = key.partition("/")
    return {"kind": kind, "domain": name}


@dataclass
class Readings:
    """What the fake Prometheus says, as the rules would write it. Domains are `kind/name`."""

    membership: dict[str, list[str]] = field(default_factory=dict)  # node → its domains
    inventory: list[str] = field(default_factory=list)
    measured: dict[str, float] = field(default_factory=dict)
    conditions: dict[str, str] = field(default_factory=dict)  # ok | warm | hot | unknown
    ages: dict[str, float] = field(default_factory=dict)
    gpus: dict[str, int] = field(default_factory=dict)
    limits: dict[str, float] = field(default_factory=dict)  # node → GPU power limit, W
    min_limits: dict[str, float] = field(default_factory=dict)  # node → its cards' minimum, W
    #: (model, profile) → {figure: value}: tokens_per_joule, tokens_per_second, watts, units
    profiles: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    hot: dict[str, float] = field(default_factory=dict)  # domain → seconds hot (shedding)
    cpus: dict[str, list[str]] = field(default_factory=dict)  # node → its CPU models
    #: domain → {figure: value} (decider.snapshot.Evidence: inlet_celsius, warm_seconds, …)
    evidence: dict[str, dict[str, float]] = field(default_factory=dict)
    #: domain → {peak_watts, history_seconds}: the peaks part's (decider.snapshot.DomainPeak)
    peaks: dict[str, dict[str, float]] = field(default_factory=dict)
    #: (model, profile) → one replica's peak, W (the peaks part's unit_peak_watts)
    unit_peaks: dict[tuple[str, str], float] = field(default_factory=dict)

    def series(self, part: str) -> list[tuple[dict[str, str], str]]:
        """The instant vector of one part's query."""
        if part == "membership":
            return [
                ({"node": node, **_domain_labels(key)}, "1")
                for node, keys in self.membership.items()
                for key in keys
            ]
        if part == "inventory":
            return [(_domain_labels(key), "1") for key in self.inventory]
        if part == "conditions":  # `… == 1` keeps only the state in force
            return [
                ({**_domain_labels(key), "condition": state}, "1")
                for key, state in self.conditions.items()
            ]
        if part in ("measured", "ages", "hot"):
            values: Mapping[str, float] = getattr(self, part)
            return [(_domain_labels(key), repr(float(v))) for key, v in values.items()]
        if part in ("gpus", "limits", "min_limits"):
            values = getattr(self, part)
            return [({"node": node}, repr(float(v))) for node, v in values.items()]
        if part == "cpus":
            return [
                ({"node": node, "model": model}, "1")
                for node, models in self.cpus.items()
                for model in models
            ]
        if part == "evidence":
            return [
                ({**_domain_labels(key), "figure": figure}, repr(float(v)))
                for key, figures in self.evidence.items()
                for figure, v in figures.items()
            ]
        if part == "peaks":
            return [
                ({**_domain_labels(key), "figure": figure}, repr(float(v)))
                for key, figures in self.peaks.items()
                for figure, v in figures.items()
            ] + [
                ({"model": model, "profile": profile, "figure": "unit_peak_watts"}, repr(v))
                for (model, profile), v in self.unit_peaks.items()
            ]
        if part == "profiles":
            return [
                ({"model": model, "profile": profile, "figure": figure}, repr(float(v)))
                for (model, profile), figures in self.profiles.items()
                for figure, v in figures.items()
            ]
        raise AssertionError(f"no part {part!r}")


class _Server(ThreadingHTTPServer):
    #: Room for every query of a refresh connecting at once (socketserver's default is 5;
    #: Prometheus, a Go server, listens with the system's maximum).
    request_queue_size = 128


class FakePrometheus:
    """`/api/v1/query` on 127.0.0.1, answering from `readings` as `behaviour` says.

    `part_behaviour[part]` overrides `behaviour` for one part's query. `down()` closes the
    listening socket (connections are refused); `up()` listens again on the same port.
    """

    def __init__(
        self, readings: Readings | None = None, *, tls: ssl.SSLContext | None = None
    ) -> None:
        self.readings = readings or Readings()
        self.behaviour = "ok"
        self.part_behaviour: dict[str, str] = {}
        self.slow_s = 5.0
        self.trickle_s = 1.5
        #: part → raw series added to its answer: (labels, value as Prometheus writes it).
        self.extra_series: dict[str, list[tuple[dict[str, str], str]]] = {}
        #: The Authorization header every query must carry; None: none asked for.
        self.require_authorization: str | None = None
        self._tls = tls
        self.queries = 0
        #: Queries being held back now (`slow`, `held`).
        self.waiting = 0
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._connections: set[socket.socket] = set()
        self._closed = threading.Event()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self._listen()
        self.url = f"{'https' if tls is not None else 'http'}://127.0.0.1:{self.port}"

    # --- control ----------------------------------------------------------------------------

    def set(self, behaviour: str, *, part: str | None = None) -> None:
        """Answer every query (or only `part`'s) as `behaviour` says (BEHAVIOURS)."""
        assert behaviour in BEHAVIOURS, behaviour
        if part is not None:
            assert part in SERIES, part
            if behaviour == "ok":
                self.part_behaviour.pop(part, None)
            else:
                self.part_behaviour[part] = behaviour
            return
        if behaviour == "down":
            self.down()
        else:
            if self._server is None:
                self.up()
            if behaviour == "held":
                self._release.clear()
        self.behaviour = behaviour

    def release(self) -> None:
        """Let every `held` answer go (as `ok`)."""
        self._release.set()

    def down(self) -> None:
        """Stop listening and cut every open connection: kept-alive ones too."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        with self._lock:
            connections, self._connections = self._connections, set()
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.behaviour = "down"

    def up(self) -> None:
        if self._server is None:
            self._listen(self.port)
        self.behaviour = "ok"

    def close(self) -> None:
        self._closed.set()
        self._release.set()
        self.down()

    # --- serving ----------------------------------------------------------------------------

    def _listen(self, port: int = 0) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with fake._lock:
                    fake._connections.add(self.connection)

            def finish(self) -> None:
                with fake._lock:
                    fake._connections.discard(self.connection)
                with contextlib.suppress(OSError):
                    super().finish()

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query).get("query", [""])[0]
                with contextlib.suppress(OSError):  # the client gave up: nobody to answer
                    if url.path != "/api/v1/query":
                        self._send(404, b"not found", "text/plain")
                        return
                    fake._answer(self, query)

            do_POST = do_GET

            def _send(self, status: int, body: bytes, content_type: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        server = _Server(("127.0.0.1", port), Handler)
        server.daemon_threads = True
        if self._tls is not None:  # each handshake on accept; a failed one drops that client
            server.socket = self._tls.wrap_socket(server.socket, server_side=True)
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def _part_of(self, query: str) -> str | None:
        for part, series in SERIES.items():
            if f"{series}[" in query:
                return part
        return None

    def _answer(self, handler: Any, query: str) -> None:
        with self._lock:
            self.queries += 1
        part = self._part_of(query)
        if part is None:
            body = {"status": "error", "errorType": "bad_data", "error": f"unknown: {query}"}
            handler._send(400, json.dumps(body).encode(), "application/json")
            return
        sent = handler.headers.get("Authorization")
        if self.require_authorization is not None and sent != self.require_authorization:
            body = {"status": "error", "errorType": "auth", "error": f"not allowed: {sent}"}
            handler._send(401, json.dumps(body).encode(), "application/json")
            return
        behaviour = self.part_behaviour.get(part, self.behaviour)
        if behaviour in ("slow", "held"):
            with self._lock:
                self.waiting += 1
            try:
                if behaviour == "slow":
                    self._closed.wait(self.slow_s)
                else:
                    self._release.wait()
            finally:
                with self._lock:
                    self.waiting -= 1
        if self._closed.is_set():
            return
        if behaviour == "garbage":
            handler._send(200, b"<html>this is not Prometheus</html>", "text/html")
            return
        if behaviour == "error":
            error = f"the TSDB is on fire (Authorization: {sent})"
            body = {"status": "error", "errorType": "internal", "error": error}
            handler._send(500, json.dumps(body).encode(), "application/json")
            return
        if behaviour == "trickle":
            self._trickle(handler)
            return
        series = [*self.readings.series(part), *self.extra_series.get(part, [])]
        result = [{"metric": labels, "value": [time.time(), value]} for labels, value in series]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        handler._send(200, json.dumps(body).encode(), "application/json")

    def _trickle(self, handler: Any) -> None:
        """A 200 and its headers at once, then a byte every `trickle_s` until the client
        hangs up or the fake closes: an answer that never completes, never times out."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", "1000000")
        handler.end_headers()
        handler.wfile.flush()
        while not self._closed.wait(self.trickle_s):
            handler.wfile.write(b" ")  # OSError once the client closed: the handler ends
            handler.wfile.flush()


# --- the decider ---------------------------------------------------------------------------


def decider_yaml(
    prometheus_url: str,
    *,
    listen: str,
    token: bool = True,
    timeout: str = "2s",
    retries: int = 0,
    refresh_interval: str = "200ms",
    reservation_ttl: str = "5m",
    readings: str = "1m",
    inventory: str = "1h",
    database: str = "decider.db",
    prometheus_http: Mapping[str, Any] | None = None,
    placement_cache: bool = True,
) -> dict[str, Any]:
    """decider.yaml's keys; `prometheus_http`: more of its prometheus section (basic_auth,
    authorization, tls_config)."""
    prometheus = {"url": prometheus_url, "timeout": timeout, "retries": retries}
    config: dict[str, Any] = {
        "prometheus": {**prometheus, **(prometheus_http or {})},
        "facility": "facility.yaml",
        "listen": listen,
        "database": database,
        "refresh_interval": refresh_interval,
        "reservation_ttl": reservation_ttl,
        "staleness": {"readings": readings, "inventory": inventory},
    }
    if token:
        config["token_file"] = "decider.token"
    if not placement_cache:
        config["placement_cache"] = False
    return config


class Decider:
    """One `llmgw-decider` process with its files in `directory`.

    `config` holds decider.yaml's keys except `listen` (a free port is picked at each start);
    `facility` is facility.yaml as a dict. Both can be changed and rewritten between starts
    (and for reloads: `write_facility`).
    """

    def __init__(
        self,
        directory: Path,
        prometheus_url: str,
        facility: Mapping[str, Any],
        **config: Any,
    ) -> None:
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.prometheus_url = prometheus_url
        self.facility = dict(facility)
        self.config = dict(config)
        self.token = TOKEN if config.get("token", True) else None
        self.config_path = directory / "decider.yaml"
        self.facility_path = directory / "facility.yaml"
        self.log_path = directory / "decider.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.url = ""
        self.session = requests.Session()
        self.starts = 0

    # --- files ------------------------------------------------------------------------------

    def write_facility(self, facility: Mapping[str, Any] | str | None = None) -> None:
        """facility.yaml from a dict, or raw text (to test a bad file)."""
        if facility is None:
            facility = self.facility
        text = facility if isinstance(facility, str) else yaml.safe_dump(dict(facility))
        tmp = self.facility_path.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, self.facility_path)

    def write_config(self) -> None:
        config = decider_yaml(self.prometheus_url, listen=f"127.0.0.1:{self.port}", **self.config)
        self.config_path.write_text(yaml.safe_dump(config))
        if self.token is not None:
            (self.directory / "decider.token").write_text(self.token + "\n")

    # --- process ----------------------------------------------------------------------------

    def start(self, wait_ready: bool = False) -> Decider:
        """Start on a free port and wait for /healthz (and /readyz, if asked)."""
        assert self.process is None, "already running"
        self.write_facility()
        for attempt in range(START_ATTEMPTS):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}"
            self.write_config()
            self.starts += 1
            with self.log_path.open("ab") as log:
                log.write(f"--- start {self.starts} on port {self.port}\n".encode())
                log.flush()
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "decider.main", "--config", str(self.config_path)],
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_healthy():
                break
            in_use = "address already in use" in self.log().lower()
            self._reap()
            if not in_use or attempt == START_ATTEMPTS - 1:
                raise AssertionError(f"the decider did not start:\n{self.log_tail()}")
        if wait_ready:
            self.wait_ready()
        return self

    def _wait_healthy(self) -> bool:
        deadline = time.monotonic() + DEADLINE_S
        assert self.process is not None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return True
            time.sleep(POLL_S)
        raise AssertionError(f"no /healthz within {DEADLINE_S:g}s:\n{self.log_tail()}")

    def wait_ready(self) -> dict[str, Any]:
        """Wait until the first refresh was attempted; /readyz's body."""
        return poll(
            lambda: (r := self.get("/readyz")).status_code == 200 and r.json(),
            f"/readyz\n{self.log_tail()}",
        )

    def wait_domains(self, check: Callable[[dict[str, Any]], bool], what: str) -> dict[str, Any]:
        """Poll GET /v1/domains until `check(body)`; the body."""

        def look() -> dict[str, Any] | None:
            body = self.get("/v1/domains").json()
            return body if check(body) else None

        return poll(look, f"/v1/domains: {what}\n{self.log_tail()}")

    def wait_fresh(self) -> dict[str, Any]:
        """Wait until every part of the snapshot is read and fresh (`missing` empty)."""
        return self.wait_domains(lambda body: not body["missing"], "no part missing")

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        assert self.process is not None
        self.process.send_signal(signum)

    def stop(self) -> int | None:
        """SIGTERM and wait; SIGKILL past STOP_TIMEOUT_S. The exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self._reap()

    def kill(self) -> int | None:
        """SIGKILL: no shutdown code runs, as in a crash or an OOM kill."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
        return self._reap()

    def _reap(self) -> int | None:
        process, self.process = self.process, None
        if process is None:
            return None
        try:
            return process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait(timeout=STOP_TIMEOUT_S)

    def close(self) -> None:
        self.stop()
        self.session.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    # --- HTTP -------------------------------------------------------------------------------

    def headers(self, token: str | None = "default") -> dict[str, str]:
        if token == "default":
            token = self.token
        return {} if token is None else {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        return self.session.get(self.url + path, **kwargs)

    def post(
        self, path: str, body: Any = None, *, token: str | None = "default", **kwargs: Any
    ) -> requests.Response:
        kwargs.setdefault("timeout", 10)
        if body is not None:
            kwargs["json"] = body
        headers = {**self.headers(token), **kwargs.pop("headers", {})}
        return self.session.post(self.url + path, headers=headers, **kwargs)

    def delete(self, path: str, *, token: str | None = "default") -> requests.Response:
        return self.session.delete(self.url + path, headers=self.headers(token), timeout=10)

    def place(self, replica: Mapping[str, Any], candidates: Iterable[str]) -> dict[str, Any]:
        """POST /v1/placements; the body of its 200."""
        response = self.post(
            "/v1/placements", {"replica": dict(replica), "candidates": list(candidates)}
        )
        assert response.status_code == 200, response.text
        return response.json()

    def reserve(
        self, rid: str, node: str, replica: Mapping[str, Any], **kwargs: Any
    ) -> requests.Response:
        return self.post(
            "/v1/reservations", {"id": rid, "replica": dict(replica), "node": node}, **kwargs
        )

    def domain(self, key: str) -> dict[str, Any]:
        """One domain's entry in GET /v1/domains."""
        kind, _, name = key.partition("/")
        for entry in self.get("/v1/domains").json()["domains"]:
            if (entry["kind"], entry["domain"]) == (kind, name):
                return entry
        raise AssertionError(f"no domain {key} in /v1/domains")

    def metrics(self) -> str:
        response = self.get("/metrics")
        assert response.status_code == 200, response.text
        return response.text


@contextlib.contextmanager
def serving(readings: Readings) -> Iterator[FakePrometheus]:
    """A fake Prometheus answering `readings`, closed at the end."""
    server = FakePrometheus(readings)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def running(
    directory: Path, prometheus_url: str, facility: Mapping[str, Any], **config: Any
) -> Iterator[Decider]:
    """A decider started, ready and holding a fresh snapshot; closed at the end."""
    decider = Decider(directory, prometheus_url, facility, **config)
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        yield decider
    finally:
        decider.close()


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the sample `name{labels}` in a Prometheus text exposition; None: absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return None
