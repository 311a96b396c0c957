"""The decider's snapshot refresher (decider/refresher.py, its reader and parser) over real HTTP.

- A fake Prometheus served here answers each query as a test says: correctly, slowly,
  with garbage, with an HTTP error, with JSON of the wrong shape or values that are not
  numbers, or one query failing while the others answer. Whatever it does, `refresh`
  returns within the query's bounded time, never raises, and keeps the previous data of
  every part whose query failed, saying which query failed and why.
- End to end, a real Prometheus and a real VictoriaMetrics (Debian's binaries, see
  tests/promstack.py) scrape a static exporter served here that publishes the rules'
  output series directly, and the refresher reads them back into the expected Snapshot,
  ignoring a sample older than its window that an instant query would still return.
- The `Refresher` thread: starts at once, refreshes every interval, stops promptly even
  mid-query, serves its last snapshot (which ages) while Prometheus is down, logs once per
  change of state.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import requests

from decider import promql
from decider.config import DeciderConfig
from decider.facility import DomainRef
from decider.giving_way import PAUSE_EVERY
from decider.prometheus_reader import PrometheusReader, QueryError
from decider.refresher import QUERIES, Refresher, queries, refresh
from decider.snapshot import INVENTORY_PARTS, PARTS, Part, ProfileFigures, Snapshot
from tests.promstack import Server, free_port, metrics_target, prometheus, victoria_metrics

TIMEOUT_S = 0.3
RETRIES = 1
WINDOW_S = 90.0
#: What a refresh may take on top of timeout × attempts: thread start-up, a loaded CI box.
MARGIN_S = 1.0
BOUND_S = TIMEOUT_S * (RETRIES + 1) + MARGIN_S
T0 = 1_700_000_000.0
#: Deadline for anything awaited by polling.
DEADLINE_S = 30.0

#: The series each part's query reads, as named in its error messages.
SERIES = {
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
}


def rack(name: str) -> DomainRef:
    return DomainRef("rack", name)


def pdu(name: str) -> DomainRef:
    return DomainRef("pdu", name)


def row(name: str) -> DomainRef:
    return DomainRef("row", name)


# --- the fake Prometheus -------------------------------------------------------------------


@dataclass
class Reply:
    """How the fake answers a query."""

    status: int = 200
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Hold the answer this long (or until the test ends).
    delay_s: float = 0.0
    #: Send the headers, then a byte every 0.1 s until the test ends: never a whole answer.
    trickle: bool = False


def vector(*series: tuple[Mapping[str, str], Any]) -> Reply:
    result = [{"metric": dict(labels), "value": [T0, value]} for labels, value in series]
    body = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return Reply(body=json.dumps(body).encode())


def json_reply(payload: Any, status: int = 200) -> Reply:
    return Reply(status=status, body=json.dumps(payload).encode())


class FakePrometheus:
    """`/api/v1/query` on a loopback port; `replies` picks the answer by the series queried
    (a list: one answer per query of that series, the last one repeated)."""

    def __init__(self) -> None:
        self.default = Reply(status=404, body=b"no reply set")
        self.replies: dict[str, Reply | list[Reply]] = {}
        self.queries: list[str] = []
        self.authorizations: list[str | None] = []  # each query's Authorization header
        self.asked = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query).get("query", [""])[0]
                with fake._lock:
                    fake.authorizations.append(self.headers.get("Authorization"))
                reply = fake.reply_for(query) if url.path == "/api/v1/query" else Reply(404)
                with contextlib.suppress(OSError):  # the client gave up: nobody to answer
                    self.answer(reply)

            def answer(self, reply: Reply) -> None:
                if reply.delay_s:
                    fake.release.wait(reply.delay_s)
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                if reply.trickle:
                    self.send_header("Content-Length", "100000")
                    self.end_headers()
                    while not fake.release.wait(0.1):
                        self.wfile.write(b" ")
                        self.wfile.flush()
                    return
                self.send_header("Content-Length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def reply_for(self, query: str) -> Reply:
        with self._lock:
            self.queries.append(query)
        self.asked.set()
        for series, reply in self.replies.items():
            if f"{series}[" in query:
                if not isinstance(reply, list):
                    return reply
                with self._lock:
                    return reply.pop(0) if len(reply) > 1 else reply[0]
        return self.default

    def answer(
        self, replies: Mapping[str, Reply | list[Reply]], default: Reply | None = None
    ) -> None:
        """Answer a query of `series` with `replies[series]`, any other with `default`."""
        self.replies = dict(replies)
        if default is not None:
            self.default = default

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def reader(fake: FakePrometheus) -> Iterator[PrometheusReader]:
    client = PrometheusReader(fake.url, TIMEOUT_S, RETRIES)
    yield client
    client.close()


# --- a correct answer ----------------------------------------------------------------------


def good_answers(watts: float = 5400.0) -> dict[str, Reply]:
    """Every series, as the rules would write them, `watts` for rack r1."""

    def domain(kind: str, name: str, **more: str) -> dict[str, str]:
        return {"kind": kind, "domain": name, **more}

    def condition(kind: str, name: str, state: str) -> tuple[dict[str, str], str]:
        return domain(kind, name, condition=state), "1"

    return {
        SERIES["membership"]: vector(
            ({"node": "n1", **domain("rack", "r1")}, "1"),
            ({"node": "n1", **domain("pdu", "r1-a")}, "1"),  # n1 is dual-fed
            ({"node": "n1", **domain("pdu", "r1-b")}, "1"),
            ({"node": "n1", **domain("row", "12")}, "1"),
            ({"node": "n2", **domain("rack", "r1")}, "1"),
            ({"node": "n2", **domain("pdu", "r1-a")}, "1"),
            ({"node": "n3", **domain("chassis", "c1")}, "1"),  # not a domain kind: ignored
            (domain("rack", "r9"), "1"),  # no node: ignored
        ),
        SERIES["inventory"]: vector(
            (domain("rack", "r1"), "1"), (domain("rack", "r2"), "1"), (domain("row", "12"), "1")
        ),
        SERIES["measured"]: vector(
            (domain("rack", "r1"), str(watts)), (domain("pdu", "r1-a"), "3000.5")
        ),
        SERIES["conditions"]: vector(
            condition("rack", "r1", "warm"),
            condition("rack", "r1", "hot"),  # two at once: the worse counts
            condition("rack", "r2", "unknown"),
            condition("rack", "r2", "ok"),
            condition("pdu", "r1-a", "ok"),
            condition("row", "12", "unknown"),
        ),
        SERIES["ages"]: vector((domain("rack", "r1"), "3.5"), (domain("row", "12"), "40")),
        SERIES["gpus"]: vector(({"node": "n1"}, "8"), ({"node": "n2"}, "4")),
        SERIES["limits"]: vector(({"node": "n1"}, "700"), ({"node": "n2"}, "350")),
        # n2's exporter publishes no range (an older one, or a card that cannot tell).
        SERIES["min_limits"]: vector(({"node": "n1"}, "200")),
        SERIES["profiles"]: vector(
            (profile("llama-70b", "tp4", "tokens_per_joule"), "2.86"),
            (profile("llama-70b", "tp4", "tokens_per_second"), "900"),
            (profile("llama-70b", "tp4", "watts"), "314.5"),
            (profile("llama-70b", "tp4", "units"), "2"),
            (profile("llama-70b", "tp8", "tokens_per_joule"), "2.34"),  # the sums not (yet) there
            (profile("llama-70b", "tp2", "watts"), "100"),  # no tokens per joule: no measurement
            (profile("", "", "tokens_per_joule"), "1.5"),  # units with no model: nobody's profile
        ),
        SERIES["hot"]: vector((domain("rack", "r1"), "630")),  # hot for 10.5 minutes
        SERIES["cpus"]: vector(
            ({"node": "n1", "model": "Intel(R) Xeon(R) Platinum 8480+"}, "1"),
            ({"node": "n2", "model": "AMD EPYC 9654 96-Core Processor"}, "1"),
            ({"node": "n2", "model": "AMD EPYC 9754 128-Core Processor"}, "1"),
        ),
        SERIES["evidence"]: vector(({**domain("rack", "r1"), "figure": "inlet_celsius"}, "33.1")),
    }


def profile(model: str, name: str, figure: str) -> dict[str, str]:
    return {"model": model, "profile": name, "figure": figure}


def assert_good(snapshot: Snapshot, watts: float = 5400.0) -> None:
    assert snapshot.membership == {
        "n1": (pdu("r1-a"), pdu("r1-b"), rack("r1"), row("12")),
        "n2": (pdu("r1-a"), rack("r1")),
    }
    assert snapshot.domains == {rack("r1"), rack("r2"), row("12"), pdu("r1-a"), pdu("r1-b")}
    assert snapshot.measured_watts == {rack("r1"): watts, pdu("r1-a"): 3000.5}
    assert snapshot.conditions == {
        rack("r1"): "hot",
        rack("r2"): "ok",
        pdu("r1-a"): "ok",
        row("12"): "unknown",
    }
    assert snapshot.reading_ages == {rack("r1"): 3.5, row("12"): 40.0}
    assert snapshot.node_gpus == {"n1": 8, "n2": 4}
    assert all(type(count) is int for count in snapshot.node_gpus.values())
    assert snapshot.gpu_limit_watts == {"n1": 700.0, "n2": 350.0}
    assert snapshot.gpu_min_limit_watts == {"n1": 200.0}
    read_at = snapshot.parts["profiles"].read_at
    assert read_at is not None
    assert snapshot.profiles == {
        ("llama-70b", "tp4"): ProfileFigures(2.86, 900.0, 314.5, 2, read_at),
        ("llama-70b", "tp8"): ProfileFigures(2.34, None, None, None, read_at),
    }
    assert snapshot.hot_seconds == {rack("r1"): 630.0}
    assert snapshot.cpu_models == {
        "n1": ("Intel(R) Xeon(R) Platinum 8480+",),
        "n2": ("AMD EPYC 9654 96-Core Processor", "AMD EPYC 9754 128-Core Processor"),
    }


def good_baseline(fake: FakePrometheus, reader: PrometheusReader) -> Snapshot:
    fake.answer(good_answers())
    baseline = refresh(Snapshot(), reader, WINDOW_S, T0)
    assert baseline.prometheus_up, baseline.parts
    return baseline


def same_data(snapshot: Snapshot, other: Snapshot) -> bool:
    names = ("membership", "domains", "measured_watts", "conditions", "reading_ages")
    names += ("node_gpus", "gpu_limit_watts", "gpu_min_limit_watts", "profiles", "hot_seconds")
    names += ("evidence",)
    names += ("cpu_models",)
    return all(getattr(snapshot, name) == getattr(other, name) for name in names)


def test_the_queries_read_only_fresh_samples_in_plain_promql():
    for part, text in queries(90).items():
        promql.check(text)
        assert "@" not in text and ":]" not in text  # no @ modifier, no open-ended subquery
        if part == "hot":  # how long: a subquery over the lookback, not the latest sample
            assert text.count("[15m:30s]") == 2, text
            continue
        assert f"last_over_time({SERIES[part]}[90s])" in text
    assert "[20m:30s]" in queries(90, hot_lookback_seconds=1200)["hot"]
    assert "[20s:1s]" in queries(90, hot_lookback_seconds=20)["hot"]  # the demo's, scaled
    assert queries(0.5)["gpus"] == "last_over_time(llmgw:node_gpus:count[500ms])"
    assert queries(120)["conditions"] == (
        "last_over_time(llmgw_domain_condition[2m]) == 1 or "
        "max by (kind, domain) (last_over_time(llmgw_domain_condition[2m])) < 1"
    )
    assert queries(60)["limits"] == (
        "max by (node) (last_over_time(llmgw_gpu_power_limit_watts[1m]))"
    )
    assert queries(60, inventory_window_seconds=3600)["cpus"] == (
        "max by (node, model) (last_over_time(llmgw_node_cpu_info[1h]))"
    )
    assert QUERIES.keys() == PARTS.keys()


def test_a_correct_answer_becomes_the_expected_snapshot(fake, reader):
    fake.answer(good_answers())
    snapshot = refresh(Snapshot(), reader, WINDOW_S, T0)

    assert sorted(fake.queries) == sorted(queries(WINDOW_S).values())
    assert snapshot.prometheus_up
    assert_good(snapshot)
    assert {name: part.read_at for name, part in snapshot.parts.items()} == dict.fromkeys(PARTS, T0)
    assert all(part.error is None for part in snapshot.parts.values())
    notes = {name: part.left_out for name, part in snapshot.parts.items() if part.left_out}
    assert notes.keys() == {"membership"}, notes
    assert "left out 2 bad series" in notes["membership"]
    assert "'chassis'" in notes["membership"] and '{domain="r9",kind="rack"}' in notes["membership"]
    assert snapshot.age_seconds(T0 + 5) == 5


def test_parsing_a_large_answer_gives_way_and_reads_the_same(fake, reader):
    """A refresh's parsing calls its pause (decider.giving_way) as it goes through the
    series, membership's twice; waiting there changes nothing in what it reads."""
    answers = good_answers()
    nodes = [f"n{index}" for index in range(3, 400)]
    answers[SERIES["membership"]] = vector(
        *[({"node": node, "kind": "rack", "domain": "r2"}, "1") for node in nodes]
    )
    fake.answer(answers)
    plain = refresh(Snapshot(), reader, WINDOW_S, T0)
    pauses: list[str] = []

    def pause() -> None:
        pauses.append(threading.current_thread().name)
        time.sleep(0.001)  # as a request in flight would make it

    paused = refresh(Snapshot(), reader, WINDOW_S, T0, pause=pause)
    assert same_data(paused, plain) and paused.parts == plain.parts
    assert set(paused.membership) == set(nodes)
    assert len(pauses) >= 2 * len(nodes) // PAUSE_EVERY
    assert all(name.startswith("prometheus-query") for name in pauses)


def test_the_snapshot_is_read_only(fake, reader):
    fake.answer(good_answers())
    snapshot = refresh(Snapshot(), reader, WINDOW_S, T0)
    for name in ("membership", "measured_watts", "conditions", "reading_ages", "node_gpus"):
        mapping = getattr(snapshot, name)
        assert isinstance(mapping, MappingProxyType), name
        with pytest.raises(TypeError):
            mapping["x"] = 1
    assert isinstance(snapshot.parts, MappingProxyType)
    assert isinstance(snapshot.domains, frozenset)


# --- misbehaving servers -------------------------------------------------------------------


def error_body(kind: str, error: str) -> dict[str, str]:
    return {"status": "error", "errorType": kind, "error": error}


def bad_values(value: Any) -> Reply:
    labels = {"node": "n1", "kind": "rack", "domain": "r1", "condition": "hot"}
    return vector((labels, value))


def bad_series(item: Any) -> Reply:
    return json_reply({"status": "success", "data": {"resultType": "vector", "result": [item]}})


#: mode → (how every query is answered, what the error says)
FAILURES: dict[str, tuple[Reply, str]] = {
    "slower than the timeout": (Reply(delay_s=DEADLINE_S), "no answer"),
    "garbage body": (Reply(body=b"<html>Bad Gateway</html>"), "not JSON"),
    "empty body": (Reply(body=b""), "not JSON"),
    "HTTP 500": (Reply(status=500, body=b"boom"), "HTTP error"),
    "HTTP 503 asking to retry in an hour": (
        Reply(status=503, headers={"Retry-After": "3600"}),
        "HTTP error",
    ),
    "HTTP 400 bad_data": (
        json_reply(error_body("bad_data", "parse error at char 3"), status=400),
        "answered HTTP 400: bad_data: parse error at char 3",
    ),
    "HTTP 422 execution": (
        json_reply(error_body("execution", "too many samples"), status=422),
        "too many samples",
    ),
    "JSON array": (json_reply([]), "not a Prometheus query response"),
    "JSON error status with 200": (
        json_reply(error_body("internal", "oops")),
        "not a Prometheus query response",
    ),
    "JSON string data": (json_reply({"status": "success", "data": "x"}), "not a Prometheus"),
    "result not a list": (
        json_reply({"status": "success", "data": {"resultType": "vector", "result": {}}}),
        "not an instant vector",
    ),
}

#: mode → (an answer whose every series is bad, what the left-out note says of it). Each is
#: left out alone (issue 16, item 3): the part is read, without it.
BAD_SERIES: dict[str, tuple[Reply, str]] = {
    "scalar result": (
        json_reply({"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}),
        "series 0 has no `metric`",
    ),
    "series without metric": (bad_series({"value": [T0, "1"]}), "no `metric`"),
    "labels not strings": (bad_series({"metric": {"node": 1}, "value": [T0, "1"]}), "`metric`"),
    "value not a pair": (bad_series({"metric": {"node": "n1"}, "value": "1"}), "`value`"),
    "NaN value": (bad_values("NaN"), "not a finite number"),
    "infinite value": (bad_values("+Inf"), "not a finite number"),
    "text value": (bad_values("lots"), "not a finite number"),
    "null value": (bad_values(None), "not a finite number"),
    "boolean value": (bad_values(True), "not a finite number"),
}


def assert_kept(snapshot: Snapshot, baseline: Snapshot, failed: set[str], fragment: str) -> None:
    assert not snapshot.prometheus_up
    for name, part in snapshot.parts.items():
        if name not in failed:
            continue
        assert part.read_at == baseline.parts[name].read_at, name
        assert part.error is not None, name
        assert part.error.startswith(f"{name} query `"), part.error
        assert SERIES[name] in part.error, part.error
        assert fragment in part.error, part.error
        assert "\n" not in part.error


@pytest.mark.parametrize("mode", FAILURES)
def test_a_misbehaving_prometheus_keeps_the_previous_data(fake, reader, mode):
    baseline = good_baseline(fake, reader)
    reply, fragment = FAILURES[mode]
    fake.answer({}, default=reply)
    fake.queries.clear()

    started = time.monotonic()
    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)
    elapsed = time.monotonic() - started

    assert elapsed < BOUND_S, f"{mode}: {elapsed:.2f}s"
    assert_kept(snapshot, baseline, set(PARTS), fragment)
    assert same_data(snapshot, baseline)
    assert snapshot.age_seconds(T0 + 60) == 60
    if reply.status >= 500:  # retried, and only as often as configured
        assert len(fake.queries) == len(PARTS) * (RETRIES + 1)


@pytest.mark.parametrize("mode", BAD_SERIES)
def test_a_bad_series_is_left_out_and_named_the_rest_read(fake, reader, mode):
    baseline = good_baseline(fake, reader)
    reply, fragment = BAD_SERIES[mode]
    fake.answer({}, default=reply)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert snapshot.prometheus_up
    for name, part in snapshot.parts.items():
        assert part.read_at == T0 + 60, name
        assert part.left_out is not None and fragment in part.left_out, (name, part)
    assert not snapshot.measured_watts and not snapshot.node_gpus and not snapshot.membership
    fresh, missing = snapshot.fresh_parts(T0 + 61, readings_limit=60, inventory_limit=3600)
    assert fresh == set(PARTS)
    assert any("domain measured power" in line and fragment in line for line in missing)


def test_a_refused_connection_keeps_the_previous_data(fake, reader):
    baseline = good_baseline(fake, reader)
    closed = PrometheusReader(f"http://127.0.0.1:{free_port()}", TIMEOUT_S, RETRIES)

    started = time.monotonic()
    snapshot = refresh(baseline, closed, WINDOW_S, T0 + 60)
    elapsed = time.monotonic() - started

    assert elapsed < BOUND_S
    assert_kept(snapshot, baseline, set(PARTS), "cannot reach")
    assert same_data(snapshot, baseline)


def test_an_answer_that_never_completes_is_given_up_on_within_the_budget(fake, reader):
    baseline = good_baseline(fake, reader)
    fake.answer({}, default=Reply(trickle=True))

    started = time.monotonic()
    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)
    elapsed = time.monotonic() - started

    assert elapsed < reader.budget_s + MARGIN_S
    assert_kept(snapshot, baseline, set(PARTS), "no complete answer from")
    assert same_data(snapshot, baseline)


def test_one_failing_query_ages_its_part_alone(fake, reader):
    baseline = good_baseline(fake, reader)
    answers = good_answers(watts=6100.0)
    answers[SERIES["conditions"]] = Reply(status=500, body=b"boom")
    answers[SERIES["gpus"]] = json_reply(
        {"status": "success", "data": {"resultType": "vector", "result": {}}}
    )
    fake.answer(answers)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert_kept(snapshot, baseline, {"conditions"}, "HTTP error")
    assert_kept(snapshot, baseline, {"gpus"}, "not an instant vector")
    assert snapshot.conditions == baseline.conditions
    assert snapshot.node_gpus == baseline.node_gpus
    assert snapshot.measured_watts[rack("r1")] == 6100.0
    for name in set(PARTS) - {"conditions", "gpus"}:
        assert snapshot.parts[name].read_at == T0 + 60, name
    assert snapshot.age_seconds(T0 + 60) == 60  # the oldest part
    fresh, missing = snapshot.fresh_parts(T0 + 150, readings_limit=60, inventory_limit=3600)
    assert "conditions" not in fresh and "gpus" in fresh
    assert any("domain conditions" in line and "HTTP error" in line for line in missing)


def test_one_bad_series_costs_its_own_domain_or_node_alone(fake, reader):
    """A NaN for one rack and 7.5 GPUs on one node (issue 16, item 3): the rest of each
    part is read and used; the bad series are named in the part's note and in `missing`."""
    baseline = good_baseline(fake, reader)
    answers = good_answers(watts=6100.0)
    answers[SERIES["measured"]] = vector(
        ({"kind": "rack", "domain": "r1"}, "6100"),
        ({"kind": "rack", "domain": "r2"}, "NaN"),  # a rack without a budget
        ({"kind": "pdu", "domain": "r1-a"}, "-5"),  # negative power
        ({"kind": "row", "domain": "12"}, "+Inf"),
    )
    answers[SERIES["gpus"]] = vector(({"node": "n1"}, "7.5"), ({"node": "n2"}, "4"))
    answers[SERIES["limits"]] = vector(({"node": "n1"}, "-Inf"), ({"node": "n2"}, "350"))
    fake.answer(answers)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert snapshot.prometheus_up
    assert snapshot.measured_watts == {rack("r1"): 6100.0}
    assert snapshot.node_gpus == {"n2": 4}
    assert snapshot.gpu_limit_watts == {"n2": 350.0}
    parts = snapshot.parts
    assert all(part.read_at == T0 + 60 and part.error is None for part in parts.values())
    measured = parts["measured"].left_out or ""
    assert measured.startswith("left out 3 bad series: "), measured
    assert '{domain="r2",kind="rack"} has value \'NaN\', not a finite number' in measured
    assert '{domain="r1-a",kind="pdu"}: -5 is negative' in measured
    assert '{domain="12",kind="row"}' in measured
    assert '{node="n1"}: 7.5 GPUs, not a whole number' in (parts["gpus"].left_out or "")
    assert "'-Inf'" in (parts["limits"].left_out or "")
    fresh, missing = snapshot.fresh_parts(T0 + 61, readings_limit=60, inventory_limit=3600)
    assert fresh == set(PARTS)
    named = [line.partition(": left out")[0] for line in missing if "left out" in line]
    assert named == [PARTS[name] for name in ("membership", "measured", "gpus", "limits")]


def test_phase_readings_come_with_the_measured_part_and_a_bad_one_costs_itself(fake, reader):
    """The measured query reads each domain's power and each phase's of a three-phase pdu
    (the series with a `phase` label); a phase reading on something not a pdu, of a phase
    that is not L1-L3, or negative is left out alone and named."""
    baseline = good_baseline(fake, reader)
    answers = good_answers(watts=6100.0)
    answers[SERIES["measured"]] = vector(
        ({"kind": "rack", "domain": "r1"}, "6100"),
        ({"kind": "pdu", "domain": "r1-a", "phase": "L1"}, "415"),
        ({"kind": "pdu", "domain": "r1-a", "phase": "L3"}, "848"),
        ({"kind": "pdu", "domain": "r1-b", "phase": "L2"}, "-1"),
        ({"kind": "pdu", "domain": "r1-b", "phase": "AA:L1-L2"}, "415"),
        ({"kind": "rack", "domain": "r1", "phase": "L1"}, "100"),
    )
    fake.answer(answers)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert snapshot.measured_watts == {rack("r1"): 6100.0}
    assert snapshot.phase_measured_watts == {("r1-a", "L1"): 415.0, ("r1-a", "L3"): 848.0}
    measured = snapshot.parts["measured"].left_out or ""
    assert measured.startswith("left out 3 bad series: "), measured
    assert "-1 is negative" in measured
    assert "phase 'AA:L1-L2' is not one of L1, L2, L3" in measured
    assert "a rack has no phases: only a pdu has" in measured

    # The part failing keeps its phases with its domains, to age together.
    fake.answer({**answers, SERIES["measured"]: json_reply(error_body("internal", "x"), 500)})
    kept = refresh(snapshot, reader, WINDOW_S, T0 + 90)
    assert kept.phase_measured_watts == snapshot.phase_measured_watts
    assert kept.parts["measured"].read_at == T0 + 60


def half_written(*domains: DomainRef, whole: Mapping[DomainRef, str] | None = None) -> Reply:
    """A conditions answer as the query gives it: a domain at none of its conditions at 1
    (its state set read half written) as one series without a `condition` label."""
    marks = [({"kind": d.kind, "domain": d.name}, "0") for d in domains]
    read = [
        ({"kind": d.kind, "domain": d.name, "condition": c}, "1") for d, c in (whole or {}).items()
    ]
    return vector(*read, *marks)


def conditions_queries(fake: FakePrometheus) -> int:
    return sum(SERIES["conditions"] + "[" in query for query in fake.queries)


def test_a_state_set_read_half_written_is_read_again(fake, reader):
    baseline = good_baseline(fake, reader)
    answers: dict[str, Reply | list[Reply]] = dict(good_answers())
    answers[SERIES["conditions"]] = [
        half_written(rack("r1"), whole={rack("r2"): "ok"}),  # r1 between warm and hot
        half_written(whole={rack("r1"): "hot", rack("r2"): "ok"}),  # a moment later: whole
    ]
    fake.answer(answers)
    asked = conditions_queries(fake)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert conditions_queries(fake) - asked == 2
    assert snapshot.conditions == {rack("r1"): "hot", rack("r2"): "ok"}
    assert snapshot.parts["conditions"] == Part(read_at=T0 + 60)


def test_a_state_set_read_half_written_twice_keeps_the_previous_condition(fake, reader):
    baseline = good_baseline(fake, reader)  # rack r1 hot, rack r2 ok
    answers: dict[str, Reply | list[Reply]] = dict(good_answers())
    answers[SERIES["conditions"]] = half_written(rack("r1"), rack("r3"), whole={rack("r2"): "warm"})
    fake.answer(answers)
    asked = conditions_queries(fake)

    snapshot = refresh(baseline, reader, WINDOW_S, T0 + 60)

    assert conditions_queries(fake) - asked == 2  # read once more, no more
    # r1 keeps its hot; r3, never read before, is unknown (absent); r2 as read.
    assert snapshot.conditions == {rack("r1"): "hot", rack("r2"): "warm"}
    part = snapshot.parts["conditions"]
    assert part.read_at == T0 + 60  # read, so fresh: the note says what was made of it
    assert part.error is not None and "2 domain(s)" in part.error and "rack/r1" in part.error
    fresh, _ = snapshot.fresh_parts(T0 + 61, readings_limit=60, inventory_limit=3600)
    assert "conditions" in fresh


def test_a_profile_no_longer_measured_keeps_its_last_figures_and_their_time(fake, reader):
    baseline = good_baseline(fake, reader)
    answers = good_answers()
    answers[SERIES["profiles"]] = vector((profile("llama-70b", "tp8", "tokens_per_joule"), "2.5"))
    fake.answer(answers)

    later = refresh(baseline, reader, WINDOW_S, T0 + 60, inventory_window_seconds=600)

    assert later.profiles[("llama-70b", "tp8")] == ProfileFigures(2.5, None, None, None, T0 + 60)
    assert later.profiles[("llama-70b", "tp4")] == baseline.profiles[("llama-70b", "tp4")]
    assert later.profiles[("llama-70b", "tp4")].read_at == T0
    # Forgotten once older than staleness.inventory.
    forgotten = refresh(later, reader, WINDOW_S, T0 + 601, inventory_window_seconds=600)
    assert set(forgotten.profiles) == {("llama-70b", "tp8")}


def test_a_part_never_read_stays_unread_when_its_query_fails(fake, reader):
    answers = good_answers()
    answers[SERIES["limits"]] = Reply(status=500)
    fake.answer(answers)

    snapshot = refresh(Snapshot(), reader, WINDOW_S, T0)

    assert snapshot.parts["limits"].read_at is None
    assert snapshot.gpu_limit_watts == {}
    assert snapshot.node_gpus == {"n1": 8, "n2": 4}
    assert snapshot.age_seconds(T0) is None
    _, missing = snapshot.fresh_parts(T0, readings_limit=60, inventory_limit=3600)
    missing = tuple(line for line in missing if "left out" not in line)  # membership's note
    assert len(missing) == 1 and "never read" in missing[0] and "limits query" in missing[0]


def test_refresh_never_raises_even_when_no_query_can_be_made(fake, reader):
    baseline = good_baseline(fake, reader)
    snapshot = refresh(baseline, reader, 0.0001, T0 + 60)  # not a PromQL duration
    assert_kept(snapshot, baseline, set(), "")
    assert same_data(snapshot, baseline)
    assert all(
        "shorter than a millisecond" in (part.error or "") for part in snapshot.parts.values()
    )


# --- the Refresher -------------------------------------------------------------------------


def settings(url: str, *, interval: float = 60.0, timeout: float = TIMEOUT_S) -> DeciderConfig:
    return DeciderConfig.model_validate(
        {
            "prometheus": {"url": url, "timeout": timeout, "retries": RETRIES},
            "refresh_interval": interval,
        }
    )


class Refreshes:
    """Every snapshot `on_refresh` gets, and a way to wait for the n-th."""

    def __init__(self) -> None:
        self.seen: list[Snapshot] = []
        self._arrived = threading.Condition()

    def __call__(self, snapshot: Snapshot) -> None:
        with self._arrived:
            self.seen.append(snapshot)
            self._arrived.notify_all()

    def wait_for(self, count: int, timeout_s: float = DEADLINE_S) -> Snapshot:
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.seen) >= count, timeout_s):
                raise TimeoutError(f"{len(self.seen)} of {count} refreshes in {timeout_s}s")
            return self.seen[count - 1]


@pytest.fixture
def refreshes() -> Refreshes:
    return Refreshes()


def test_the_refresher_starts_at_once_and_stops_promptly(fake, refreshes):
    fake.answer(good_answers())
    refresher = Refresher(settings(fake.url, interval=60), on_refresh=refreshes)
    refresher.start()
    try:
        first = refreshes.wait_for(1)
    finally:
        started = time.monotonic()
        refresher.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 1.0
    assert not refresher.running
    assert refresher.snapshot is first
    assert_good(first)


def test_the_refresher_refreshes_every_interval(fake, refreshes):
    fake.answer(good_answers())
    refresher = Refresher(settings(fake.url, interval=0.1), on_refresh=refreshes)
    refresher.start()
    try:
        refreshes.wait_for(3)
    finally:
        refresher.stop()
    assert all(snapshot.prometheus_up for snapshot in refreshes.seen)


def test_stop_cancels_a_refresh_in_flight(fake, refreshes):
    fake.answer({}, default=Reply(delay_s=DEADLINE_S))
    refresher = Refresher(settings(fake.url, timeout=20), on_refresh=refreshes)
    refresher.start()
    try:
        assert fake.asked.wait(DEADLINE_S)
    finally:
        started = time.monotonic()
        refresher.stop()
        stopped_in = time.monotonic() - started
    assert stopped_in < 1.0
    assert not refresher.running
    assert refreshes.seen == []  # a cancelled refresh is not published


def test_reconfigure_takes_a_new_url_and_interval(fake, refreshes):
    closed = f"http://127.0.0.1:{free_port()}"
    refresher = Refresher(settings(closed, interval=60), on_refresh=refreshes)
    refresher.start()
    try:
        assert not refreshes.wait_for(1).prometheus_up
        fake.answer(good_answers())
        # A shorter interval wakes the waiting thread: the next refreshes come at once.
        refresher.reconfigure(settings(fake.url, interval=0.1))
        assert refreshes.wait_for(3).prometheus_up
    finally:
        refresher.stop()
    assert refresher.settings.prometheus.url == fake.url


def test_a_down_prometheus_leaves_the_last_snapshot_serving_and_ageing(fake, caplog):
    now = [T0]
    fake.answer(good_answers())
    refresher = Refresher(settings(fake.url), clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="decider.refresher")

    def refresh() -> Snapshot:  # the background loop's own step, on the clock stepped here
        return refresher._refresh(cancel=None)

    good = refresh()
    assert good.prometheus_up and refresher.snapshot is good

    fake.answer({}, default=Reply(status=503))
    for step in (1, 2, 3):
        now[0] = T0 + 100 * step
        down = refresh()
        assert refresher.snapshot is down
        assert not down.prometheus_up
        assert same_data(down, good)
        assert down.age_seconds(now[0]) == 100 * step
    fresh, missing = down.fresh_parts(now[0], readings_limit=120, inventory_limit=3600)
    assert fresh == {"membership", "inventory", "gpus", "limits", "min_limits", "cpus"}
    missing = tuple(line for line in missing if "left out" not in line)  # membership's note
    assert len(missing) == len(PARTS) - len(INVENTORY_PARTS) and all(
        "HTTP error" in line for line in missing
    )

    fake.answer(good_answers(watts=7000.0))
    now[0] = T0 + 400
    back = refresh()
    assert back.prometheus_up and back.measured_watts[rack("r1")] == 7000.0

    messages = [
        (record.levelname, record.getMessage())
        for record in caplog.records
        if record.name == "decider.refresher"
    ]
    assert [level for level, _ in messages] == ["INFO", "WARNING", "INFO"], messages
    assert "HTTP error" in messages[1][1] and fake.url in messages[1][1]
    assert "again" in messages[2][1]


def test_a_failing_callback_does_not_stop_the_refresher(fake, caplog):
    def broken(snapshot: Snapshot) -> None:
        raise RuntimeError("callback broke")

    fake.answer(good_answers())
    refresher = Refresher(settings(fake.url), on_refresh=broken)
    assert refresher._refresh(cancel=None).prometheus_up
    assert refresher.snapshot.prometheus_up
    assert any("on_refresh" in record.getMessage() for record in caplog.records)


# --- end to end: real Prometheus and VictoriaMetrics ---------------------------------------

#: How old the one deliberately stale sample is when the exporter starts: inside
#: Prometheus's 5-minute instant lookback, outside the refresher's window.
STALE_AGE_S = 120
E2E_WINDOW_S = 30.0


def exposition(stale_ms: int) -> bytes:
    lines = [
        'llmgw:node_domain:membership{node="n1",kind="rack",domain="r1"} 1',
        'llmgw:node_domain:membership{node="n1",kind="pdu",domain="r1-a"} 1',
        'llmgw:node_domain:membership{node="n1",kind="pdu",domain="r1-b"} 1',
        'llmgw:node_domain:membership{node="n2",kind="rack",domain="r1"} 1',
        'llmgw:node_domain:membership{node="n2",kind="pdu",domain="r1-a"} 1',
        'llmgw_domain_info{kind="rack",domain="r1"} 1',
        'llmgw_domain_info{kind="rack",domain="r2"} 1',
        'llmgw_domain_measured_watts{kind="rack",domain="r1"} 5400',
        'llmgw_domain_measured_watts{kind="pdu",domain="r1-a"} 3000.5',
        # a three-phase pdu's phases, from the site's rendered phase signal
        'llmgw:domain_phase_site_power_watts{kind="pdu",domain="r1-a",phase="L1"} 415',
        'llmgw:domain_phase_site_power_watts{kind="pdu",domain="r1-a",phase="L3"} 848',
        'llmgw_domain_reading_age_seconds{kind="rack",domain="r1"} 3.5',
        'llmgw:node_gpus:count{node="n1"} 8',
        'llmgw:node_gpus:count{node="n2"} 4',
        f'llmgw:node_gpus:count{{node="n9"}} 2 {stale_ms}',
        'llmgw_gpu_power_limit_watts{node="n1",uuid="GPU-a"} 700',
        'llmgw_gpu_power_limit_watts{node="n1",uuid="GPU-b"} 600',
        'llmgw_gpu_power_limit_watts{node="n2",uuid="GPU-c"} 350',
    ]
    states = {("rack", "r1"): "warm", ("rack", "r2"): "unknown"}
    for (kind, name), current in states.items():
        for state in ("ok", "warm", "hot", "unknown"):
            value = int(state == current)
            labels = f'kind="{kind}",domain="{name}",condition="{state}"'
            lines.append(f"llmgw_domain_condition{{{labels}}} {value}")
    # pdu/r1-a mid-change, two states at 1: the worse one counts.
    for state in ("ok", "hot"):
        lines.append(f'llmgw_domain_condition{{kind="pdu",domain="r1-a",condition="{state}"}} 1')
    # pdu/r1-b read half written, none at 1: the query marks it, and it stays unknown.
    for state in ("ok", "warm", "hot", "unknown"):
        lines.append(f'llmgw_domain_condition{{kind="pdu",domain="r1-b",condition="{state}"}} 0')
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def static_exporter() -> Iterator[str]:
    """host:port of a /metrics that publishes the rules' output series as they are."""
    body = exposition(stale_ms=int((time.time() - STALE_AGE_S) * 1000))
    with metrics_target(lambda: body) as target:
        yield target


@pytest.fixture(scope="module")
def engines(
    static_exporter: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """Prometheus and VictoriaMetrics scraping the static exporter, started together so that
    their first scrapes (5 to 10 s away: target discovery) are awaited once."""
    targets = {"llmgw": [static_exporter]}
    with ExitStack() as stack:
        yield {
            "prometheus": stack.enter_context(
                prometheus(
                    tmp_path_factory.mktemp("prometheus"), rule_files=[], scrape_targets=targets
                )
            ),
            "victoria-metrics": stack.enter_context(
                victoria_metrics(
                    tmp_path_factory.mktemp("victoria-metrics"), scrape_targets=targets
                )
            ),
        }


@pytest.fixture(params=["prometheus", "victoria-metrics"])
def engine(request: pytest.FixtureRequest, engines: dict[str, Server]) -> Server:
    return engines[request.param]


def poll(read: Callable[[], Snapshot], done: Callable[[Snapshot], bool]) -> Snapshot:
    deadline = time.monotonic() + DEADLINE_S
    snapshot = read()
    while not done(snapshot) and time.monotonic() < deadline:
        time.sleep(0.2)
        snapshot = read()
    return snapshot


def test_the_refresher_reads_a_real_server(engine: Server):
    reader = PrometheusReader(engine.url, timeout=5.0, retries=1)
    try:
        snapshot = poll(
            lambda: refresh(Snapshot(), reader, E2E_WINDOW_S, time.time()),
            lambda snapshot: (
                snapshot.prometheus_up
                and len(snapshot.conditions) == 3
                and all(len(getattr(snapshot, name)) == 2 for name in ("membership", "node_gpus"))
                and len(snapshot.gpu_limit_watts) == 2
                and snapshot.measured_watts.keys() == {rack("r1"), pdu("r1-a")}
                and snapshot.reading_ages
                and rack("r2") in snapshot.domains
            ),
        )
    finally:
        reader.close()

    assert snapshot.prometheus_up, {name: part.error for name, part in snapshot.parts.items()}
    notes = {name: part.error for name, part in snapshot.parts.items() if part.error}
    assert notes.keys() == {"conditions"}, notes
    assert "1 domain(s) read with no condition at 1 twice" in notes["conditions"]
    assert "pdu/r1-b" in notes["conditions"]
    assert snapshot.membership == {
        "n1": (pdu("r1-a"), pdu("r1-b"), rack("r1")),
        "n2": (pdu("r1-a"), rack("r1")),
    }
    assert snapshot.domains == {rack("r1"), rack("r2"), pdu("r1-a"), pdu("r1-b")}
    assert snapshot.measured_watts == {rack("r1"): 5400.0, pdu("r1-a"): 3000.5}
    assert snapshot.phase_measured_watts == {("r1-a", "L1"): 415.0, ("r1-a", "L3"): 848.0}
    assert snapshot.conditions == {rack("r1"): "warm", rack("r2"): "unknown", pdu("r1-a"): "hot"}
    assert snapshot.reading_ages == {rack("r1"): 3.5}
    assert snapshot.node_gpus == {"n1": 8, "n2": 4}  # not n9: its sample is too old
    assert snapshot.gpu_limit_watts == {"n1": 700.0, "n2": 350.0}
    assert all(not math.isnan(value) for value in snapshot.measured_watts.values())


def test_an_instant_query_would_have_served_the_stale_sample(engine: Server):
    """Why the window: the plain selector still returns n9's two-minute-old sample."""
    answer = requests.get(
        f"{engine.url}/api/v1/query",
        params={"query": 'llmgw:node_gpus:count{node="n9"}'},
        timeout=5,
    ).json()
    assert [item["value"][1] for item in answer["data"]["result"]] == ["2"], answer


# --- the inventory parts' cadence ------------------------------------------------------------


def test_background_refreshes_read_the_inventory_parts_every_half_readings_limit(fake):
    """Membership, inventory, GPU counts and limits change rarely (and membership is the
    largest answer by far): a background refresh reads them again once their last read is
    staleness.readings / 2 old, at once after a failed attempt, and after a reconfigure.
    Read times stay each part's own."""
    clock = [T0]
    fake.answer(good_answers())
    refresher = Refresher(
        settings(fake.url, interval=15), window_seconds=120.0, clock=lambda: clock[0]
    )
    assert refresher.inventory_every_seconds == 60.0

    def background(at: float) -> Snapshot:
        clock[0] = at
        return refresher._refresh(cancel=None)

    def read_at(snapshot: Snapshot) -> dict[str, float | None]:
        return {name: part.read_at for name, part in snapshot.parts.items()}

    readings = set(PARTS) - INVENTORY_PARTS
    first = background(T0)  # the first reads every part
    assert set(read_at(first).values()) == {T0}
    kept = background(T0 + 45)
    assert {name for name, at in read_at(kept).items() if at == T0} == INVENTORY_PARTS
    assert all(read_at(kept)[name] == T0 + 45 for name in readings)
    assert kept.membership == first.membership and kept.prometheus_up
    assert kept.age_seconds(T0 + 45) == 45  # the oldest part, truthfully
    assert set(read_at(background(T0 + 60)).values()) == {T0 + 60}  # 60 s old: read again

    # A failed read of an inventory part is tried again at the next refresh, not a minute on.
    broken = good_answers()
    broken[SERIES["membership"]] = Reply(status=500, body=b"boom")
    fake.answer(broken)
    failed = background(T0 + 120)
    assert failed.parts["membership"].read_at == T0 + 60
    assert "HTTP error" in (failed.parts["membership"].error or "")
    assert failed.parts["gpus"].read_at == T0 + 120
    fake.answer(good_answers())
    again = background(T0 + 135)
    assert again.parts["membership"].read_at == T0 + 135
    assert "HTTP error" not in (again.parts["membership"].error or "")  # the note alone
    assert again.parts["gpus"].read_at == T0 + 120  # read 15 s ago: kept

    # An empty answer (the rules not evaluated yet) is read again at the next refresh.
    empty = good_answers()
    empty[SERIES["gpus"]] = vector()
    fake.answer(empty)
    assert background(T0 + 181).node_gpus == {}  # gpus last read at T0 + 120: read again
    fake.answer(good_answers())
    assert background(T0 + 196).parts["gpus"].read_at == T0 + 196
    assert background(T0 + 211).parts["gpus"].read_at == T0 + 196  # not empty: kept

    # A reconfigure (a reload) reads every part at the next refresh.
    refresher.reconfigure(settings(fake.url, interval=15))
    assert set(read_at(background(T0 + 226)).values()) == {T0 + 226}


# --- decider.yaml's prometheus section -----------------------------------------------------


def load_prometheus(tmp_path: Path, section: dict[str, Any]) -> Any:
    from decider.config import load

    path = tmp_path / "decider.yaml"
    path.write_text(json.dumps({"prometheus": section}))  # JSON is YAML
    return load(path).prometheus


def test_the_prometheus_section_reads_its_files_relative_to_decider_yaml(tmp_path):
    settings = load_prometheus(
        tmp_path,
        {
            "url": "https://prom.example:9090/prometheus/",
            "basic_auth": {"username": "decider", "password_file": "secrets/password"},
            "tls_config": {"ca_file": "/etc/ca.pem", "cert_file": "c.pem", "key_file": "c.key"},
        },
    )
    assert settings.url == "https://prom.example:9090/prometheus"
    assert settings.basic_auth.password_file == tmp_path / "secrets" / "password"
    assert settings.tls_config.ca_file == Path("/etc/ca.pem")
    assert settings.tls_config.cert_file == tmp_path / "c.pem"
    assert settings.tls_config.key_file == tmp_path / "c.key"
    reader = PrometheusReader.from_settings(settings)
    assert reader.url == "https://prom.example:9090/prometheus"


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"url": "http://decider:s3cret@prom:9090"}, "prometheus.basic_auth.password_file"),
        ({"url": "http://:s3cret@prom:9090"}, "carries a user and password"),
        ({"url": "http://prom:9090/?token=s3cret"}, "query string"),
        (
            {"basic_auth": {"username": "decider", "password": "s3cret"}},
            "name it in prometheus.basic_auth.password_file",
        ),
        ({"authorization": {"credentials": "s3cret"}}, "credentials_file"),
        (
            {
                "basic_auth": {"username": "u", "password_file": "p"},
                "authorization": {"credentials_file": "t"},
            },
            "exclusive",
        ),
        ({"tls_config": {"cert_file": "c.pem"}}, "cert_file and key_file go together"),
        ({"authorization": {"type": "Bearer token", "credentials_file": "t"}}, "type"),
    ],
)
def test_a_bad_prometheus_section_is_refused_without_repeating_a_secret(tmp_path, section, says):
    from llmgw_common.yamlfile import ConfigError

    with pytest.raises(ConfigError) as refused:
        load_prometheus(tmp_path, section)
    assert says in str(refused.value)
    assert "s3cret" not in str(refused.value)
    assert f"{tmp_path / 'decider.yaml'}:1: prometheus" in str(refused.value)


def test_the_reader_sends_the_credentials_read_from_their_file_at_each_query(fake, tmp_path):
    """A rotated password counts from the next query; an unreadable file is that query's
    error, naming the file."""
    from decider.config import BasicAuthSettings

    password = tmp_path / "password"
    password.write_text("first\n")
    reader = PrometheusReader(
        fake.url, TIMEOUT_S, 0, basic_auth=BasicAuthSettings(username="u", password_file=password)
    )
    fake.answer({}, default=vector())
    try:
        reader.query("up")
        password.write_text("second")
        reader.query("up")
        assert fake.authorizations[-2:] == [
            "Basic " + base64.b64encode(b"u:first").decode(),
            "Basic " + base64.b64encode(b"u:second").decode(),
        ]
        password.unlink()
        with pytest.raises(
            QueryError, match=f"cannot read prometheus.basic_auth.password_file {password}"
        ):
            reader.query("up")
    finally:
        reader.close()
