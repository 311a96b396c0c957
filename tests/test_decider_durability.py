"""The decider under load, under `kill -9`, and with Prometheus misbehaving, as a real
`llmgw-decider` process over real HTTP (tests/decider_harness.py).

- 200 concurrent reservations for a rack with room for exactly 10: exactly 10 accepted,
  and the rack's reserved watts are exactly 10 × the estimate.
- `kill -9` in the middle of a stream of reservations: after a restart on the same
  database, every reservation acknowledged with a 201 is there.
- Prometheus down, slower than the query timeout, answering garbage or HTTP 500: placement
  answers keep coming at their usual latency, never waiting for Prometheus, `missing` fills
  in as the parts go stale, and nothing is refused for lack of data.
"""

from __future__ import annotations

import signal
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.decider_harness import (
    SERIES,
    Decider,
    FakePrometheus,
    Readings,
    metric_value,
    poll,
    running,
    serving,
)

#: Racks r1…r5 of 8 nodes each; node n00…n39.
RACKS = {f"r{rack}": [f"n{8 * (rack - 1) + i:02d}" for i in range(8)] for rack in range(1, 6)}
NODES = [node for nodes in RACKS.values() for node in nodes]
#: Nodes in racks that are not hot.
COOL_NODES = [node for rack, nodes in RACKS.items() if rack != "r4" for node in nodes]


def site_readings() -> Readings:
    return Readings(
        membership={
            node: [f"rack/{rack}", "row/1"] for rack, nodes in RACKS.items() for node in nodes
        },
        inventory=[f"rack/{rack}" for rack in RACKS],
        # Rack r1 measures nothing: its load is what is reserved.
        measured={"rack/r1": 0, "rack/r2": 4000, "rack/r3": 1000, "rack/r4": 0, "rack/r5": 0},
        conditions={
            "rack/r1": "ok",
            "rack/r2": "ok",
            "rack/r3": "warm",
            "rack/r4": "hot",
            "rack/r5": "ok",
            "row/1": "ok",
        },
        ages={"rack/r4": 5.0},
        gpus=dict.fromkeys(NODES, 8),
        limits=dict.fromkeys(NODES, 700.0),
    )


#: Rack r1: cap 10,000 W, margin 10 %: 9,000 W for replicas, exactly 10 of 900 W.
FACILITY: dict[str, Any] = {
    "defaults": {"margin": 0.1},
    "domains": {f"rack/{rack}": {"cap_watts": 10000} for rack in RACKS},
    "mode": "enforce",
}
REPLICA = {"model": "llama", "profile": "tp1", "gpus": 1, "power_watts": 900}
R1_FULL = "rack r1: 9.0 of 10.0 kW reserved, replica needs ~0.9, margin 10%"


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    with serving(site_readings()) as server:
        yield server


@pytest.fixture
def decider(tmp_path: Path, fake: FakePrometheus) -> Iterator[Decider]:
    with running(tmp_path / "decider", fake.url, FACILITY) as started:
        yield started


def post_all(decider: Decider, bodies: list[dict[str, Any]]) -> list[requests.Response]:
    """POST every body to /v1/reservations at once, one thread and connection each."""
    barrier = threading.Barrier(len(bodies))
    responses: list[requests.Response | BaseException | None] = [None] * len(bodies)
    headers = decider.headers()

    def send(index: int) -> None:
        try:
            with requests.Session() as session:
                barrier.wait(timeout=60)
                responses[index] = session.post(
                    f"{decider.url}/v1/reservations",
                    json=bodies[index],
                    headers=headers,
                    timeout=60,
                )
        except BaseException as exc:  # reported below, not lost in a thread
            responses[index] = exc

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    failed = [r for r in responses if not isinstance(r, requests.Response)]
    assert not failed, failed[:3]
    return [r for r in responses if isinstance(r, requests.Response)]


# --- concurrency ---------------------------------------------------------------------------


def test_200_concurrent_reservations_for_room_for_10_accept_exactly_10(decider):
    rack = RACKS["r1"]
    bodies = [
        {"id": f"c-{i:03d}", "replica": REPLICA, "node": rack[i % len(rack)]} for i in range(200)
    ]
    responses = post_all(decider, bodies)

    statuses = Counter(r.status_code for r in responses)
    assert statuses == {201: 10, 409: 190}, statuses
    accepted = {r.json()["id"] for r in responses if r.status_code == 201}
    for response in responses:
        if response.status_code == 409:
            # Every refusal saw the rack full: no request judged a half-written state.
            assert response.json()["reasons"] == [R1_FULL], response.text

    listed = decider.get("/v1/reservations").json()["reservations"]
    assert {r["id"] for r in listed} == accepted
    assert len(listed) == 10
    r1 = decider.domain("rack/r1")
    assert r1["reserved_watts"] == 10 * 900.0
    assert r1["headroom_watts"] == 1000.0
    metrics = decider.metrics()
    assert metric_value(metrics, "llmgw_domain_reserved_watts", kind="rack", domain="r1") == 9000
    labels = {"call": "reservation"}
    assert metric_value(metrics, "llmgw_decider_decisions_total", **labels, outcome="allowed") == 10
    assert (
        metric_value(metrics, "llmgw_decider_decisions_total", **labels, outcome="refused") == 190
    )
    assert metric_value(metrics, "llmgw_decider_refusals_total", **labels, rule="power_cap") == 190
    # The placement answer agrees: rack r1 is full, r5 is not.
    answer = decider.place(REPLICA, [rack[0], RACKS["r5"][0]])
    assert [n["reasons"] for n in answer["nodes"]] == [[R1_FULL], []]


def test_concurrent_retries_of_one_reservation_create_it_once(decider):
    body = {"id": "same", "replica": REPLICA, "node": RACKS["r1"][0]}
    responses = post_all(decider, [body] * 50)
    assert Counter(r.status_code for r in responses) == {201: 1, 200: 49}
    created = next(r.json() for r in responses if r.status_code == 201)
    for response in responses:
        assert response.json()["created_at"] == created["created_at"]
    assert decider.domain("rack/r1")["reserved_watts"] == 900.0


# --- kill -9 -------------------------------------------------------------------------------


class Stream:
    """Clients sending reservations one after another until the server goes away; each
    records the ids acknowledged with a 201."""

    def __init__(self, decider: Decider, clients: int) -> None:
        self.url = f"{decider.url}/v1/reservations"
        self.headers = decider.headers()
        self.acked: list[str] = []
        self.other: list[str] = []
        self._lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._run, args=(client,), daemon=True)
            for client in range(clients)
        ]
        for thread in self.threads:
            thread.start()

    def _run(self, client: int) -> None:
        with requests.Session() as session:
            for index in range(100_000):
                rid = f"k{client}-{index:05d}"
                node = COOL_NODES[index % len(COOL_NODES)]
                body = {"id": rid, "replica": {**REPLICA, "power_watts": 1}, "node": node}
                try:
                    response = session.post(self.url, json=body, headers=self.headers, timeout=30)
                except requests.RequestException:
                    return  # killed: this one was never acknowledged
                with self._lock:
                    if response.status_code == 201:
                        self.acked.append(rid)
                    else:
                        self.other.append(f"{rid}: {response.status_code} {response.text}")

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=60)
            assert not thread.is_alive()


def test_kill_9_loses_no_acknowledged_reservation(tmp_path, fake):
    # No budgets: every reservation is accepted, as many as the stream sends.
    decider = Decider(tmp_path / "decider", fake.url, {"mode": "enforce"})
    try:
        decider.start(wait_ready=True)
        stream = Stream(decider, clients=4)
        poll(lambda: len(stream.acked) >= 200, "200 acknowledged reservations", every=0.005)
        assert decider.kill() == -signal.SIGKILL
        stream.join()
        acked = set(stream.acked)
        assert not stream.other, stream.other[:3]

        decider.start(wait_ready=True)
        listed = {r["id"] for r in decider.get("/v1/reservations").json()["reservations"]}
        lost = acked - listed
        assert not lost, f"{len(lost)} acknowledged reservations lost, e.g. {sorted(lost)[:5]}"
        # At most the requests in flight at the kill were written but not acknowledged.
        assert len(listed - acked) <= 4
        # A client that retries an acknowledged one gets it back, not a second reservation.
        for rid in sorted(acked)[:20]:
            _, index = rid[1:].split("-")
            node = COOL_NODES[int(index) % len(COOL_NODES)]
            again = decider.reserve(rid, node, {**REPLICA, "power_watts": 1})
            assert again.status_code == 200, again.text
        assert decider.get("/v1/domains/row/1").json()["reserved_watts"] == float(len(listed))
    finally:
        decider.close()


def test_kill_9_keeps_every_acknowledged_change(tmp_path, fake):
    decider = Decider(tmp_path / "decider", fake.url, FACILITY)
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        node = RACKS["r5"][0]
        for rid in ("kept", "confirmed", "deleted"):
            assert decider.reserve(rid, node, REPLICA).status_code == 201
        assert decider.post("/v1/reservations/confirmed/confirm").status_code == 200
        assert decider.delete("/v1/reservations/deleted").status_code == 204
        assert decider.post("/v1/domains/rack/r2/hold", {"reason": "breaker"}).status_code == 200
        assert decider.post("/v1/domains/rack/r3/hold", {"reason": "x"}).status_code == 200
        assert decider.post("/v1/domains/rack/r3/release").status_code == 200
        decider.kill()

        decider.start(wait_ready=True)
        decider.wait_fresh()
        listed = {r["id"]: r for r in decider.get("/v1/reservations").json()["reservations"]}
        assert sorted(listed) == ["confirmed", "kept"]
        assert listed["confirmed"]["confirmed"] is True
        assert listed["confirmed"]["expires_at"] is None
        assert listed["kept"]["confirmed"] is False
        assert decider.domain("rack/r2")["held"]["reason"] == "breaker"
        assert decider.domain("rack/r3")["held"] is None
        assert decider.domain("rack/r5")["reserved_watts"] == 1800.0
    finally:
        decider.close()


# --- Prometheus misbehaving ----------------------------------------------------------------

#: No placement answer may take this long: a quarter of the Prometheus timeout (2 s).
ANSWER_BOUND_S = 0.5
#: p95 with Prometheus misbehaving may exceed the healthy median by at most this.
P95_SLACK_S = 0.25
SAMPLES = 30
PROMETHEUS_TIMEOUT = "2s"
#: What `missing` says of each part, first words.
PART_NAMES = (
    "which domains each node belongs to",
    "the known domains",
    "domain measured power",
    "domain conditions",
    "domain reading ages",
    "each node's GPU count",
    "each node's enforced GPU power limit",
)


def timed_place(decider: Decider, candidates: list[str]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    answer = decider.place(REPLICA, candidates)
    return time.perf_counter() - start, answer


def stale_parts(missing: list[str]) -> set[str]:
    return {name for name in PART_NAMES for line in missing if line.startswith(name)}


@pytest.mark.parametrize("behaviour", ["down", "slow", "garbage", "error"])
def test_answers_keep_their_latency_while_prometheus_misbehaves(tmp_path, fake, behaviour):
    fake.slow_s = 30.0  # far past the timeout; released when the test ends
    decider = Decider(
        tmp_path / "decider",
        fake.url,
        FACILITY,
        timeout=PROMETHEUS_TIMEOUT,
        retries=1,
        refresh_interval="200ms",
        readings="1s",
        inventory="2s",
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        candidates = NODES
        hot = RACKS["r4"][0]

        healthy = []
        for _ in range(SAMPLES):
            seconds, answer = timed_place(decider, candidates)
            healthy.append(seconds)
        assert answer["missing"] == []
        verdicts = {n["node"]: n for n in answer["nodes"]}
        assert verdicts[hot]["reasons"] == ["rack r4 hot (reading 5s old)"]
        median = statistics.median(healthy)

        fake.set(behaviour)
        latencies: list[float] = []
        seen_stale: set[str] = set()
        deadline = time.monotonic() + 30
        while len(seen_stale) < len(PART_NAMES) or len(latencies) < SAMPLES:
            assert time.monotonic() < deadline, f"parts stale so far: {seen_stale}"
            seconds, answer = timed_place(decider, candidates)
            latencies.append(seconds)
            assert any(n["allowed"] for n in answer["nodes"]), "every candidate refused"
            seen_stale |= stale_parts(answer["missing"])

        # Everything stale: every part named, why it failed said, nothing refused for it.
        assert stale_parts(answer["missing"]) == set(PART_NAMES), answer["missing"]
        assert all("older than its" in line for line in answer["missing"]), answer["missing"]
        assert all(n["allowed"] and n["reasons"] == [] for n in answer["nodes"]), answer
        assert answer["order"] == candidates  # no data to order by: the scheduler's order
        assert {n["condition"] for n in answer["nodes"]} == {"unknown"}

        slowest = max(latencies)
        p95 = statistics.quantiles(latencies, n=20)[-1]
        assert slowest < ANSWER_BOUND_S, (slowest, sorted(latencies)[-5:])
        assert p95 < median + P95_SLACK_S, (p95, median)
        assert decider.get("/readyz").status_code == 200
        # Down once a refresh has failed: for `slow`, when its query gives up (the budget).
        poll(
            lambda: decider.get("/readyz").json()["prometheus_up"] is False,
            "/readyz to say Prometheus is down",
        )
        metrics = decider.metrics()
        assert metric_value(metrics, "llmgw_decider_prometheus_up") == 0.0
        assert (metric_value(metrics, "llmgw_decider_snapshot_age_seconds") or 0) > 2.0

        # Prometheus back: the data returns, and with it the refusals.
        fake.set("ok")
        decider.wait_fresh()
        answer = decider.place(REPLICA, candidates)
        assert answer["missing"] == []
        verdicts = {n["node"]: n for n in answer["nodes"]}
        assert verdicts[hot]["reasons"] == ["rack r4 hot (reading 5s old)"]
    finally:
        decider.close()


def test_one_failing_query_leaves_the_rest_in_use(tmp_path, fake):
    decider = Decider(
        tmp_path / "decider", fake.url, FACILITY, refresh_interval="200ms", readings="1s"
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        fake.set("error", part="conditions")
        body = decider.wait_domains(
            lambda body: stale_parts(body["missing"]) == {"domain conditions"},
            "the conditions to go stale",
        )
        assert body["missing"][0].startswith(
            f"domain conditions ({SERIES['conditions']}): last read "
        )
        answer = decider.place({**REPLICA, "power_watts": 5500}, [RACKS["r4"][0], "n08"])
        verdicts = {n["node"]: n for n in answer["nodes"]}
        # Rack r4's `hot` is no longer known; rack r2's power still is (4 kW measured).
        assert verdicts[RACKS["r4"][0]]["allowed"] is True
        assert verdicts["n08"]["reasons"] == [
            "rack r2: 4.0 of 10.0 kW measured, replica needs ~5.5, margin 10%"
        ]
    finally:
        decider.close()


def test_a_reload_during_a_hanging_refresh_does_not_stall_answers(tmp_path, fake):
    decider = Decider(
        tmp_path / "decider", fake.url, FACILITY, timeout="5s", refresh_interval="200ms"
    )
    try:
        decider.start(wait_ready=True)
        decider.wait_fresh()
        fake.set("held")
        poll(lambda: fake.waiting >= 1, "a refresh to hang")
        decider.write_facility({**FACILITY, "mode": "observe"})
        decider.signal(signal.SIGHUP)
        latencies = []

        def observed() -> bool:
            seconds, answer = timed_place(decider, NODES[:8])
            latencies.append(seconds)
            return answer["mode"] == "observe"

        poll(observed, "the reload to apply")
        # Keep asking for a while: the reload waits for the hanging refresh to end.
        for _ in range(SAMPLES):
            observed()
        assert max(latencies) < ANSWER_BOUND_S, sorted(latencies)[-5:]
        assert fake.waiting >= 1, "the refresh stopped hanging: the test proves nothing"
        # POST /-/reload answers once the refresh gives up; answers meanwhile still flow.
        fake.release()
        assert decider.post("/-/reload").status_code == 200
    finally:
        fake.release()
        decider.close()


def test_sigterm_during_a_hanging_refresh_stops_promptly_and_cleanly(tmp_path, fake):
    decider = Decider(tmp_path / "decider", fake.url, FACILITY, timeout="20s")
    try:
        decider.start(wait_ready=True)
        fake.set("held")
        poll(lambda: fake.waiting >= 1, "a refresh to hang")
        assert decider.reserve("before-stop", COOL_NODES[0], REPLICA).status_code == 201
        start = time.monotonic()
        # A clean shutdown, exit 0 as documented (not the signal uvicorn re-raises after it).
        assert decider.stop() == 0, decider.log_tail()
        # The refresh is cancelled, not waited for (it would take 2 × 20 s).
        assert time.monotonic() - start < 8.0
        # …and the decider's own clean-up ran before that.
        assert "stopped; " in decider.log(), decider.log_tail()
        fake.release()
        fake.set("ok")
        decider.start(wait_ready=True)
        listed = decider.get("/v1/reservations").json()["reservations"]
        assert [r["id"] for r in listed] == ["before-stop"]
    finally:
        fake.release()
        decider.close()
